"""The Tracker's counters survive a checkpoint: the row that closes an interrupted interval is
the uninterrupted run's (the policy lags since the last row included)."""

from __future__ import annotations

import math

import pytest

from r2ac.rl.config import validate
from r2ac.rl.learning.actor import EpisodeLog
from r2ac.rl.presets import preset
from r2ac.rl.run.tracker import Tracker


def _cfg():
    return validate(preset("stream").updated(log_every=4, total_frames=100, progress=False))


def _rows(tracker: Tracker, updates: range, lags) -> list[dict]:
    rows = []
    tracker.log = type("Log", (), {"write": lambda self, row: rows.append(row)})()
    for u in updates:
        tracker.record(1, [EpisodeLog([float(u)], [u + 1])], {}, policy_lag=lags[u])
    return rows


def test_an_interrupted_interval_closes_with_the_uninterrupted_row():
    lags = [0.5, 2.0, 1.0, 4.0, 3.0, 7.0, 1.5, 2.5]
    whole = _rows(Tracker(_cfg(), None), range(8), lags)
    first = Tracker(_cfg(), None)
    _rows(first, range(6), lags)  # stopped mid-interval: 2 lags since the row at update 4
    resumed = Tracker(_cfg(), None, first.state())
    rest = _rows(resumed, range(6, 8), lags)
    assert [r["policy_lag"] for r in whole] == [1.875, 3.5]
    assert rest[0]["policy_lag"] == whole[1]["policy_lag"]
    assert rest[0]["return_mean"] == whole[1]["return_mean"] == pytest.approx(3.5)


def test_a_non_finite_lag_in_a_checkpoint_is_refused():
    from r2ac.rl.stream.checkpoint import check_counters
    from r2ac.runs.values import ValueMismatch

    cfg = _cfg()
    with pytest.raises(ValueMismatch, match=r"counters.lags\[1\]"):
        check_counters({"update": 3, "lags": [1.0, math.nan]}, 3, cfg, 1)
