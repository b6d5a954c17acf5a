"""Fresh-process measurements return typed rows, and every row carries its own configuration's
numbers (r2ac.bench.probe, used by bench core, bench cores and the cost study)."""

import dataclasses

import pytest

from r2ac.bench import core, cores, cost, probe


@dataclasses.dataclass(frozen=True)
class Row:
    core: str
    n: int
    value: float


def test_a_row_for_another_configuration_is_refused():
    probe.check_row(Row("a", 4, 1.0), {"core": "a", "n": 4, "other": 7})
    with pytest.raises(probe.ProbeError, match="another configuration.*n: asked 8, got 4"):
        probe.check_row(Row("a", 4, 1.0), {"core": "a", "n": 8})


def test_rows_are_rebuilt_with_their_declared_fields():
    assert probe.row_from_json(
        core.PeakRow, {"shape": [1, 2, 3, 4], "rule": "r", "dtype": "d", "peak_mb": 1.5}
    ) == (core.PeakRow((1, 2, 3, 4), "r", "d", 1.5))
    with pytest.raises(probe.ProbeError, match="expected"):
        probe.row_from_json(Row, {"core": "a", "n": 4})


def test_bench_core_peak_in_a_fresh_process():
    row = probe.run_fresh(
        core.peak_probe, core.PeakRow, shape=[3, 2, 8, 5], rule="rtrl", dtype="float64"
    )
    assert isinstance(row, core.PeakRow) and row.shape == (3, 2, 8, 5) and row.rule == "rtrl"
    assert row.peak_mb >= 0
    with pytest.raises(probe.ProbeError, match="(?s)failed.*unknown rule 'gru'"):
        probe.run_fresh(
            core.peak_probe, core.PeakRow, shape=[3, 2, 8, 5], rule="gru", dtype="float64"
        )


def test_bench_cores_peaks_one_row_per_point():
    cfg = cores.BenchCoresConfig(input_size=4, batch_size=2, dtype="float64")
    points = [("elstm-rtrl", 8), ("lstm-bptt", 4)]
    got = cores.peaks(points, cfg)
    assert list(got) == points and all(v is None or v >= 0 for v in got.values())


def fake_times(calls):
    """time_alternating that gives each function its own number, by its position."""

    def fake(fns, repeats, warmup, device):
        calls.append(list(fns))
        return {name: 100.0 * (i + 1) for i, name in enumerate(fns)}

    return fake


def test_bench_core_row_carries_each_rules_numbers(monkeypatch):
    calls = []
    monkeypatch.setattr(core, "time_alternating", fake_times(calls))
    monkeypatch.setattr(
        core, "peak_memory_mb", lambda shape, rule, dtype, device: {"bptt": 1.0, "rtrl": 2.0}[rule]
    )
    cfg = core.BenchCoreConfig(repeats=1, warmup=0)
    row = core.bench_shape((3, 2, 8, 5), cfg)
    assert calls[0] == ["bptt", "rtrl", "naive"]
    assert row.ms == {"bptt": 100.0, "rtrl": 200.0, "naive": 300.0} and row.ratio == 0.5
    assert row.peak_mb == {"bptt": 1.0, "rtrl": 2.0}


def test_bench_cores_rows_carry_their_own_numbers(monkeypatch):
    monkeypatch.setattr(cores, "time_alternating", lambda fns, *a: {k: 10.0 * len(k) for k in fns})
    monkeypatch.setattr(
        cores, "peaks", lambda points, cfg: {(c, n): float(n) + len(c) for c, n in points}
    )
    cfg = cores.BenchCoresConfig(
        cores=("elstm-rtrl", "lstm-bptt"), sizes=(4, 8), input_size=4, batch_size=2
    )
    rows = cores.scaling(cfg)
    assert [(r.core, r.n) for r in rows] == [
        ("elstm-rtrl", 4),
        ("elstm-rtrl", 8),
        ("lstm-bptt", 4),
        ("lstm-bptt", 8),
    ]
    for r in rows:
        assert r.ms_per_step == 10.0 * len(r.core) and r.peak_mib == r.n + len(r.core)


def test_cost_rows_carry_their_own_cores_numbers(monkeypatch):
    """Each (core, M) row has its own update time and peak, not the first core's."""
    monkeypatch.setattr(cost, "time_alternating", fake_times([]))
    monkeypatch.setattr(cost, "peak_update_mb", lambda cfg, c, M: 1000.0 * M + cfg.cores.index(c))
    cfg = cost.CostConfig(
        spans=(2,), hidden_size=8, batch_size=2, input_size=5, repeats=1, warmup=0
    )
    rows = cost.measure_span(cfg, 2)
    assert all(isinstance(r, cost.CostRow) for r in rows)
    assert [(r.core, r.M, r.update_ms, r.peak_mb) for r in rows] == [
        ("elstm-bptt", 2, 100.0, 2000.0),
        ("elstm-rtrl", 2, 200.0, 2001.0),
    ]
    assert rows[1].state_mb > rows[0].state_mb  # sensitivities: the rtrl row's own state
    assert [r.gradient_span for r in rows] == [2, cost.UNBOUNDED]
