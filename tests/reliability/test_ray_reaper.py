"""The Ray reaper on its own (no Ray): at the end of its pipe it SIGKILLs every process whose
environment holds its token, and only those; with R2AC_REAPER_LOG it says what it did."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from r2ac.rl.runtimes.ray_reaper import LOG_VAR, TOKEN_VAR, Reaper

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")


def _sleeper(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"], env=env)


def test_the_reaper_kills_the_marked_processes_only_and_logs_it(tmp_path, monkeypatch):
    log = tmp_path / "reaper.log"
    monkeypatch.setenv(LOG_VAR, str(log))
    reaper = Reaper.start()
    base = {k: v for k, v in os.environ.items() if k != TOKEN_VAR}
    marked = _sleeper({**base, TOKEN_VAR: reaper.token})
    other = _sleeper({**base, TOKEN_VAR: "another-run"})
    try:
        reaper.close()  # as the learner's exit does: the pipe ends, the sweep runs
        assert reaper.proc.returncode == 0
        assert marked.wait(timeout=5) == -9  # SIGKILL
        assert other.poll() is None  # another run's process is left alone
    finally:
        for proc in (marked, other):
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "waiting" in text and "stdin closed: sweeping" in text
    assert f"kill {marked.pid} sleep 60" in text and f"kill {other.pid}" not in text
    assert "sweep over: 1 killed" in text
