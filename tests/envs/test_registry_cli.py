"""`available()`, option parsing and `r2ac envs`."""

from r2ac.cli import main as r2ac_main
from r2ac.envs import available, parse_options
from r2ac.envs.registry import FAMILIES


def test_available_lists_every_family_with_a_reason():
    statuses = {s.family: s for s in available()}
    assert set(statuses) == set(FAMILIES)
    assert statuses["builtin"].available
    assert all(s.reason for s in statuses.values())


def test_parse_options_types():
    assert parse_options(["delay=100", "variant=nonmatch", "x=0.5", "f=false"]) == {
        "delay": 100,
        "variant": "nonmatch",
        "x": 0.5,
        "f": False,
    }


def test_r2ac_envs_prints_a_row_per_family(capsys):
    assert r2ac_main(["envs"]) == 0
    out = capsys.readouterr().out
    for family in FAMILIES:
        assert f"\n{family} " in out
    assert "builtin/delayed-cue" in out
