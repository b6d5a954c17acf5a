"""`r2ac bench random-policy`: the uniform random policy's score by the evaluation protocol."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

COMMAND = [sys.executable, "-m", "r2ac.cli", "bench", "random-policy"]
needs_popgym = pytest.mark.skipif(importlib.util.find_spec("popgym") is None, reason="popgym")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=300)


@needs_popgym
def test_uniform_play_of_repeat_previous_scores_its_expectation():
    # RepeatPrevious pays +1/n for the right suit of 4 and -1/n otherwise: E = (1 - 3) / 4.
    done = _run("gym/popgym-RepeatPreviousEasy-v0", "--sets", "2", "--episodes", "40")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["actions"] == "uniform" and result["episodes_per_set"] == 40
    assert abs(result["mean"] + 0.5) < 0.03, result["mean"]


@needs_popgym
def test_box_actions_are_refused():
    done = _run("gym/popgym-PositionOnlyPendulumEasy-v0")
    assert done.returncode == 2 and "Box actions" in done.stderr
