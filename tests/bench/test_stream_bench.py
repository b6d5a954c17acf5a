"""`r2ac bench stream` runs and writes its rows."""

import json

from r2ac.bench import cli


def test_bench_stream_writes_rows(tmp_path):
    out = tmp_path / "b.json"
    argv = ["stream", "--ks", "2", "--cores", "rtu-bptt", "rtu-rtrl", "--steps", "2",
            "--warmup", "1", "--repeats", "1", "--json-out", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["core"], r["K"]) for r in rows] == [("rtu-bptt", 2), ("rtu-rtrl", 2)]
    assert rows[1]["rtrl_over_bptt"] > 0 and rows[1]["sensitivities_per_agent"] > 0
