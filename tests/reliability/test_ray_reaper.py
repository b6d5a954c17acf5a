"""The Ray reaper on its own (no Ray): at the end of its pipe it SIGKILLs every process whose
environment holds its token, and only those; with R2AC_REAPER_LOG it says what it did."""

from __future__ import annotations

import os
import subprocess
import sys
import time

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


def test_a_child_without_the_token_is_reaped_after_its_parent_died(tmp_path, monkeypatch):
    """Ray's agents can lose the token (setproctitle overwrites the start of their environ
    area) and outlive their parent, the raylet: the reaper records the run's process tree
    while it waits and kills what it recorded."""
    log = tmp_path / "reaper.log"
    monkeypatch.setenv(LOG_VAR, str(log))
    reaper = Reaper.start()
    base = {k: v for k, v in os.environ.items() if k != TOKEN_VAR}
    pid_file = tmp_path / "child.pid"
    # The marked parent starts a child without the token, then waits: raylet and agent.
    parent = subprocess.Popen(
        ["sh", "-c", f"env -u {TOKEN_VAR} sleep 60 & echo $! > {pid_file}; wait"],
        env={**base, TOKEN_VAR: reaper.token},
    )
    try:
        deadline = time.monotonic() + 10
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        child = int(pid_file.read_text())
        time.sleep(2.5)  # two of the reaper's looks at the process tree
        parent.kill()  # the raylet dies first (PR_SET_PDEATHSIG): the child is orphaned
        parent.wait()
        assert _alive(child)
        reaper.close()
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), log.read_text()
    finally:
        parent.kill()
        parent.wait()
    assert f"kill {child} sleep 60" in log.read_text()


def _alive(pid: int) -> bool:
    """A live process (not a zombie) with this pid."""
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
