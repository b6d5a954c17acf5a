"""`r2ac bench cores` segment part: rtrl against bptt per core kind, on a tiny shape."""

from r2ac.bench import cores


def test_segment_part_times_both_rules_of_each_kind():
    cfg = cores.BenchCoresConfig(
        cores=(
            "rtu-rtrl",
            "rtu-bptt",
            "lru-rtrl",
            "lru-bptt",
            "elstm-rtrl",
            "mingru-rtrl",
            "mingru-bptt",
        ),  # elstm lacks -bptt here
        segment_shapes=("3,2,4,5",),
        repeats=1,
        warmup=0,
    )
    rows = cores.segments_rtrl_vs_bptt(cfg)
    assert [r["core"] for r in rows] == ["rtu", "lru", "mingru"]
    assert all(r["shape"] == (3, 2, 4, 5) and r["bptt_ms"] > 0 and r["rtrl_ms"] > 0 for r in rows)
    table = cores.format_segments(rows)
    assert table.count("\n") == 4 and "| rtu | 3, 2, 4, 5 |" in table
