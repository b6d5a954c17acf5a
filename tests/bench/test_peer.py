"""`r2ac bench peer` without Sample Factory: seeds, the progress logs of both systems, the
success count, the table, and a whole command with the two systems' runs stood in for."""

from __future__ import annotations

import json

import pytest

from r2ac.bench import peer

SF_LOG = """\
[2026-11-26 10:00:00,000][123] Fps is (10 sec: nan). Total num frames: 0. Throughput: 0
[2026-11-26 10:00:05,000][123] Fps is (10 sec: 100). Total num frames: 1000. Throughput: 0
[2026-11-26 10:00:10,000][123] Fps is (10 sec: 100). Total num frames: 6000. Throughput: 0
[2026-11-26 10:00:15,000][123] Fps is (10 sec: 100). Total num frames: 11000. Throughput: 0
[2026-11-26 10:00:20,000][123] Fps is (10 sec: 100). Total num frames: 16000. Throughput: 0
[2026-11-26 10:00:25,000][123] Fps is (10 sec: 100). Total num frames: 21000. Throughput: 0
[2026-11-26 10:00:26,000][123] Collected {0: 21504}, FPS: 812.5
"""


def test_seeds_are_a_range_a_list_or_a_count():
    assert peer.parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert peer.parse_seeds("3") == [0, 1, 2]
    assert peer.parse_seeds("3,7,10-11") == [3, 7, 10, 11]


def test_env_names():
    assert peer.env_id("RepeatPreviousEasy") == "popgym-RepeatPreviousEasy-v0"
    assert peer.env_id("gym/popgym-CountRecallEasy-v0") == "popgym-CountRecallEasy-v0"
    assert peer.short("popgym-CountRecallEasy-v0") == "CountRecallEasy"


def test_sf_progress_leaves_out_start_up_and_reads_the_end_to_end_figure():
    points, e2e = peer.sf_progress(SF_LOG)
    assert [p[0] for p in points] == [1000, 6000, 11000, 16000, 21000]  # frames > 0 only
    assert e2e == 812.5
    # from the point at 20 % (the second of five) to the last: 15000 frames in 15 s
    assert peer.frames_per_second(points, e2e) == (1000.0, "steady")
    assert peer.frames_per_second(points[:1], e2e) == (812.5, "e2e")


def test_r2ac_progress_reads_metrics_and_the_final_line(tmp_path):
    metrics = tmp_path / "metrics.csv"
    metrics.write_text("update,frames,time_s\n1,100,1\n2,200,2\n3,400,3\n")
    log = "done: 4096 frames, 32 updates in 3.1 s (1321.3 frames/s)\n"
    points, e2e = peer.r2ac_progress(metrics, log)
    assert points == [(100.0, 1.0), (200.0, 2.0), (400.0, 3.0)] and e2e == 1321.3
    assert peer.steady_fps(points) == 150.0  # 3 points: none left out


def test_successes_count_runs_at_the_threshold_and_failed_runs_as_none():
    assert peer.successes([0.993, 0.8, 0.79, None, -0.176], 0.8) == 2


def records():
    greedy = {"r2ac": [0.493, 0.960, -0.176, 0.964, 1.0], "sf": [0.993, 0.918, 0.904, None, 0.971]}
    fps = {"r2ac": [9900, 13380, 12000, 11000, 10000], "sf": [4975, 7980, 6000, None, 5000]}
    return [
        {"system": s, "env": "RepeatPreviousEasy", "seed": i, "rc": 0 if g is not None else 1,
         "greedy": g, "fps": f, "fps_kind": "steady"}
        for s in ("r2ac", "sf") for i, (g, f) in enumerate(zip(greedy[s], fps[s]))
    ]  # fmt: skip


def test_the_summary_and_the_table():
    rows = [peer.summary(records(), s, "RepeatPreviousEasy", 0.8) for s in ("r2ac", "sf")]
    r2ac, sf = rows
    assert (r2ac["successes"], r2ac["n"], sf["successes"], sf["n"]) == (3, 5, 4, 5)
    assert r2ac["mean"] == pytest.approx(0.6482) and sf["mean"] == pytest.approx(0.9465)
    assert r2ac["fps"] == 11000 and sf["fps"] == 5500
    text = peer.table(rows, {"r2ac": "r2ac", "sf": "SF"}, 0.8)
    lines = text.splitlines()
    assert "successes (>= 0.8)" in lines[0] and len(lines) == 4
    assert lines[2].startswith("| r2ac | RepeatPreviousEasy | 0: 0.493, 1: 0.960, 2: -0.176,")
    assert "| 3/5 | 0.648 +- " in lines[2] and lines[2].endswith("| 11000 | 2.00x |")
    assert "3: failed" in lines[3] and lines[3].endswith("| 5500 | 1.00x |")


def test_the_command_alternates_the_systems_and_writes_its_json(tmp_path, monkeypatch, capsys):
    calls = []

    def fake(system):
        def run(args, env, seed, out):
            calls.append((system, env, seed, args.peer_mode, args.r2ac_args))
            return {"rc": 0, "wall_s": 1.0, "greedy": 0.9 if seed else 0.5, "fps": 100.0,
                    "fps_kind": "steady"}  # fmt: skip

        return run

    monkeypatch.setattr(peer, "run_r2ac", fake("r2ac"))
    monkeypatch.setattr(peer, "run_sf", fake("sf"))
    monkeypatch.setattr(peer, "setup_peer", lambda venv: venv / "bin" / "python")
    out = tmp_path / "peer.json"
    argv = ["--seeds", "0-1", "--peer-mode", "serial", "--out-root", str(tmp_path / "runs"),
            "--json-out", str(out), "--", "--num-threads", "1"]  # fmt: skip
    assert peer.main(argv) == 0
    assert [c[:3] for c in calls] == [
        ("r2ac", "RepeatPreviousEasy", 0), ("sf", "RepeatPreviousEasy", 0),
        ("r2ac", "RepeatPreviousEasy", 1), ("sf", "RepeatPreviousEasy", 1),
    ]  # fmt: skip
    assert all(c[3] == "serial" and c[4] == ["--num-threads", "1"] for c in calls)
    printed = capsys.readouterr().out
    assert "(serial)" in printed and "| 1/2 | 0.700 +- 0.283 | 100 | 1.00x |" in printed
    doc = json.loads(out.read_text())
    assert doc["peer_mode"] == "serial" and len(doc["runs"]) == 4 and doc["success"] == 0.8


def test_the_peer_side_imports_nothing_of_r2ac():
    text = peer.SF_SIDE.read_text()
    assert "import r2ac" not in text and "from r2ac" not in text
    assert 'MODES = {\n    "async"' in text
