"""`r2ac bench cost` at tiny sizes: the rows' numbers, the report files and bad input."""

import dataclasses
import json
import shlex

import pytest
import tyro

from r2ac.bench import cost
from r2ac.errors import ConfigError

N, B, D = 16, 4, 9
TINY = cost.CostConfig(
    spans=(2, 6),
    hidden_size=N,
    batch_size=B,
    input_size=D,
    repeats=1,
    warmup=0,
    threads=1,
    memory=False,
)


@pytest.fixture(scope="module")
def rows():
    return cost.measure(TINY)


def by_key(rows):
    return {(r.core, r.M): r for r in rows}


def test_a_row_for_every_core_and_span(rows):
    table = by_key(rows)
    assert set(table) == {(c, M) for c in TINY.cores for M in TINY.spans}
    assert all(isinstance(r, cost.CostRow) for r in rows)
    for M in TINY.spans:
        assert table["elstm-bptt", M].gradient_span == M
        assert table["elstm-rtrl", M].gradient_span == "unbounded"
    assert all(r.update_ms > 0 and r.peak_mb is None for r in rows)  # memory=False


def test_held_for_backward_grows_linearly_with_M(rows):
    table = by_key(rows)
    held = {M: table["elstm-bptt", M].held_mb for M in TINY.spans}
    # Everything autograd keeps is per step (M or M+1 steps): 6/2 = 3 at most, 7/3 at least.
    assert 2.2 < held[6] / held[2] <= 3.0, held
    # Inside the segment RTRL backpropagates like BPTT and holds no more: its history enters
    # through the carried state, which is not a saved activation.
    for M in TINY.spans:
        assert table["elstm-rtrl", M].held_mb == held[M]


def test_state_of_rtrl_is_larger_and_independent_of_M(rows):
    table = by_key(rows)
    for M in TINY.spans:
        assert table["elstm-bptt", M].state_mb == B * N * 4 / 2**20  # c only, float32
        # c, d c / d (F, Z) and d c / d (w_f, w_z, b_f, b_z): B N (1 + 2D + 4) floats
        assert table["elstm-rtrl", M].state_mb == B * N * (1 + 2 * D + 4) * 4 / 2**20


def test_carried_start_state_is_non_zero():
    rtrl = cost.build_case(TINY, "elstm-rtrl", 2).segment.state
    assert rtrl.sens.FZ.shape == (B, 2, N, D) and rtrl.sens.FZ.abs().min() > 0
    assert rtrl.c.abs().min() > 0 and rtrl.sens.wb.abs().min() > 0
    assert cost.build_case(TINY, "elstm-bptt", 2).segment.state.sens is None


def test_peak_memory_in_a_fresh_process():
    cfg = dataclasses.replace(TINY, hidden_size=128, batch_size=16, input_size=65)
    case = cost.build_case(cfg, "elstm-bptt", 50)
    held = cost.saved_for_backward_mb(case.run, case.held_before())
    long, short = (
        cost.peak_update_mb(cfg, "elstm-bptt", 50),
        cost.peak_update_mb(cfg, "elstm-bptt", 5),
    )
    assert long >= held > 1.0  # the update's peak holds at least what autograd saved
    assert long > 3 * short, (long, short)


def _row(core, M, update_ms=1.0, peak_mb=None, state_mb=0.5):
    span = M if core.endswith("-bptt") else cost.UNBOUNDED
    return cost.CostRow(core, M, span, update_ms, peak_mb, 1.0, state_mb, 2.0)


def test_report_shows_each_rows_own_numbers():
    """The table and the summary read each (core, M) row's own cells: a table that showed
    one core's update time, peak or state on every row fails here."""
    rows = [
        _row("elstm-bptt", 2, 11.0, 101.0, 0.25),
        _row("lstm-bptt", 2, 22.0, 202.0, 0.5),
        _row("elstm-rtrl", 2, 33.0, 303.0, 7.0),
    ]
    table = cost.format_table(rows).splitlines()[2:]
    assert [ln.split(" | ")[3:6] for ln in table] == [
        ["11.0", "101", "1.00"],
        ["22.0", "202", "1.00"],
        ["33.0", "303", "1.00"],
    ]
    (rtrl,) = [ln for ln in cost.summary_lines(rows) if ln.startswith("- elstm-rtrl")]
    # against the first BPTT core at equal M: 303 + 7 vs 101 + 0.25
    assert "state of 7.00 MB" in rtrl and "M=2: 310 vs 101" in rtrl, rtrl


def test_linear_fit_recovers_the_papers_law():
    gb = [(10, 1.4), (50, 2.9), (100, 4.8), (300, 12.0)]  # paper App. B.3, TBPTT GB against M
    a, b = cost.linear_fit(gb)
    assert a == pytest.approx(0.038, abs=0.002) and b == pytest.approx(1.0, abs=0.1)
    assert cost.linear_fit([(10, 1.0), (10, 2.0)]) is None


def test_report_files(rows, tmp_path):
    with_peaks = [dataclasses.replace(r, peak_mb=10.0 * r.M + 5.0) for r in rows]
    paths = cost.write_report(with_peaks, TINY, str(tmp_path / "out"))
    saved = json.loads(open(paths["json"]).read())
    assert [cost.CostRow(**r) for r in saved["rows"]] == with_peaks
    assert saved["torch"] and saved["machine"].startswith("machine:")
    assert saved["bptt_fits"]["elstm-bptt"]["mb_at_1000"] == pytest.approx(10_005.0)
    md = open(paths["md"]).read()
    table_rows = [ln for ln in md.splitlines() if ln.startswith("| elstm-")]
    assert [ln.split(" | ")[:3] for ln in table_rows] == [
        ["| elstm-bptt", "2", "2"],
        ["| elstm-bptt", "6", "6"],
        ["| elstm-rtrl", "2", "unbounded"],
        ["| elstm-rtrl", "6", "unbounded"],
    ]
    assert "| 65.0 |" in table_rows[1]  # peak MB of bptt at M = 6
    assert "peak MB = 10.000*M + 5.0" in md and "about 10,005 MB" in md
    assert open(paths["png"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_command_line_reproduces_the_config():
    command = cost.command_line(TINY)
    assert command.startswith("r2ac bench cost --spans 2 6 ")
    assert tyro.cli(cost.CostConfig, args=shlex.split(command)[3:]) == TINY


@pytest.mark.parametrize(
    "bad",
    [{"cores": ("gru-rtrl",)}, {"spans": (0, 6)}, {"spans": ()}, {"input_size": 1}, {"cores": ()}],
)
def test_bad_config_raises(bad):
    with pytest.raises(ConfigError):
        cost.measure(dataclasses.replace(TINY, **bad))


@pytest.mark.parametrize("argv", [["--cores", "gru-rtrl"], ["--spans", "0", "10"]])
def test_cli_bad_input_exits_2_with_one_line(argv, tmp_path, capsys):
    out = tmp_path / "never"
    assert cost.main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("r2ac bench cost: ") and err.count("\n") == 1
    assert not out.exists()
