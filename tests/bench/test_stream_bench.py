"""`r2ac bench stream` runs and writes its rows."""

import json

from r2ac.bench import cli


def test_bench_stream_writes_rows(tmp_path):
    out = tmp_path / "b.json"
    argv = ["stream", "--ks", "2", "--cores", "rtu-bptt", "rtu-rtrl", "--steps", "2",
            "--warmup", "1", "--repeats", "1", "--copy-mb", "8", "--json-out", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert [(r["core"], r["K"]) for r in rows] == [("rtu-bptt", 2), ("rtu-rtrl", 2)]
    assert rows[1]["rtrl_over_bptt"] > 0 and rows[1]["sensitivities_per_agent"] > 0
    # the traffic model: float32 weights and traces read and written (16 B a parameter), the
    # sensitivities read and written (8 B each); the RTU's two rules share their parameters
    bptt, rtrl = rows
    assert bptt["sensitivities_per_agent"] == 0 and bptt["min_traffic_bytes"] % 16 == 0
    assert (
        rtrl["min_traffic_bytes"] - bptt["min_traffic_bytes"] == 8 * rtrl["sensitivities_per_agent"]
    )
    assert report["copy_bytes_per_s"] > 1e8 and rtrl["of_copy_bandwidth"] > 0


def test_bench_stream_takes_the_matched_network_and_reports_cpu_seconds(tmp_path):
    """--hidden-size, --stream-mlp with no width, --prev-action: the network of the JAX peer
    (an LRU of 32 on the observation and the previous action); steps per CPU-second beside
    wall."""
    out = tmp_path / "b.json"
    argv = ["stream", "--ks", "1", "--cores", "lru-rtrl", "--hidden-size", "32", "--stream-mlp",
            "--prev-action", "--steps", "3", "--warmup", "1", "--repeats", "1", "--copy-mb", "8",
            "--json-out", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    report = json.loads(out.read_text())
    (row,) = report["rows"]
    assert report["network"] == {"length": 32, "hidden_size": 32, "stream_mlp": [],
                                 "prev_action": True, "compile_step": None}  # fmt: skip
    assert row["agent_steps_per_cpu_s"] > 0 and row["agent_steps_per_s"] > 0
    # LRU of 32 on 3 + 2 inputs: sensitivities of B (2 x 32 x 5 x 2 planes) and the vectors
    assert 0 < row["sensitivities_per_agent"] < 2 * 2 * (2 * 32 * 5 + 3 * 32 * 2)
