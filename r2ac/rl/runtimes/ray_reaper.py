"""Reaper of a local Ray: its processes die with the learner that started it, however it ends.

Ray ties the processes its driver starts (gcs_server, raylet, monitors) to the driver with
PR_SET_PDEATHSIG, but not the raylet's own children: `ray::DashboardAgent` and
`ray::RuntimeEnvAgent` notice their raylet's death and then wait to report it to a GCS that
died too, re-parented to 1 for 60-90 s (measured: after 2 of 4 SIGTERMs during start-up and 1 of 2
SIGKILLs of the learner; 60 s after a SIGKILL).

`Reaper.start` runs this file as a script (the standard library only: no torch, no Ray) in a
process group of its own (setsid), so that a signal to the learner's group does not reach it. It
reads its stdin, a pipe whose only writer is the learner (the write end is not inheritable,
and Ray starts its processes without inherited descriptors), until end of file: the learner
closed it after `ray.shutdown()`, or died, even by SIGKILL. Then it kills, with SIGKILL,
every process of the run, until none was found for QUIET_S (at most SWEEP_S), then exits.

A process of the run: one whose environment holds R2AC_RAY_RUN=<token> (`init_local_ray` sets
it for `ray.init`, and Ray hands it on), or a descendant of one. The environment alone is not
enough: Ray's Python processes rename themselves with setproctitle, which overwrites the
start of their /proc environ area, and the raylet hands its agents an environment sorted by
name, so in about 1 run in 5 on a loaded box `ray::DashboardAgent` and `ray::RuntimeEnvAgent`
showed no token (R2AC_RAY_RUN sorts early) and outlived the learner. So while it waits the
reaper looks every POLL_S at the marked processes and records their descendants (pid and
start time); the agents are the raylet's children until the raylet dies.
Linux only (/proc); elsewhere no reaper is started. With R2AC_REAPER_LOG=<file> in the
learner's environment the reaper appends what it found and killed, with times, to that file.
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

TOKEN_VAR = "R2AC_RAY_RUN"
SWEEP_S = 10.0  # a sweep gives up after this long (processes that will not die: not ours)
QUIET_S = 2.0  # and ends once none was found for this long (a loaded box forks slowly)
CLOSE_S = 15.0  # the learner waits this long for the reaper's sweep after a clean close
POLL_S = 1.0  # while waiting, record the run's process tree this often
LOG_VAR = "R2AC_REAPER_LOG"


def note(message: str) -> None:
    """Append a line to the file named by LOG_VAR, if set (a diagnosis aid; errors ignored)."""
    path = os.environ.get(LOG_VAR)
    if not path:
        return
    try:
        with open(path, "a") as log:
            log.write(f"{time.time():.3f} reaper {os.getpid()}: {message}\n")
    except OSError:
        pass


def command_of(pid: int) -> str:
    try:
        return (
            (Path("/proc") / str(pid) / "cmdline")
            .read_bytes()
            .replace(b"\0", b" ")[:80]
            .decode(errors="replace")
        )
    except OSError:
        return "?"


def marked_pids(token: str, skip: frozenset[int] = frozenset()) -> list[int]:
    """Processes whose environment holds TOKEN_VAR=token (those readable: this user's)."""
    needle = f"{TOKEN_VAR}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone, or another user's
            continue
    return found


def process_table() -> dict[int, tuple[int, str]]:
    """Every live process: pid -> (parent pid, start time in clock ticks since boot). Zombies
    (killed, not yet reaped by their parent) are left out: nothing more to kill there."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # gone
            continue
        if fields[0] not in ("Z", "X"):  # state
            table[int(entry.name)] = (int(fields[1]), fields[19])  # ppid, starttime
    return table


def run_processes(token: str, known: dict[int, str], skip: frozenset[int]) -> list[int]:
    """The run's live processes: the marked ones, their descendants, and those recorded in
    `known` (pid -> start time; a pid now taken by another process is dropped). Records
    every one found in `known`."""
    table = process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = set(), [p for p in marked_pids(token, skip) if p in table]
    stack += [p for p, start in known.items() if p in table and table[p][1] == start]
    while stack:
        pid = stack.pop()
        if pid in found or pid in skip:
            continue
        found.add(pid)
        known[pid] = table[pid][1]
        stack += children.get(pid, [])
    for pid in [p for p in known if p not in found]:
        del known[pid]
    return sorted(found)


def sweep(token: str, known: dict[int, str] | None = None, seconds: float = SWEEP_S) -> int:
    """SIGKILL every process of the run until none was found for QUIET_S (an agent the dying
    raylet was still starting appears late: seen once at load 7 with a 0.2 s quiet spell);
    how many were killed. A killed process is a zombie until reaped, and a zombie's environ
    is empty and its children are re-parented."""
    skip = frozenset({os.getpid(), os.getppid()})
    known = {} if known is None else known
    deadline, killed, last_seen = time.monotonic() + seconds, 0, time.monotonic()
    while time.monotonic() - last_seen < QUIET_S and time.monotonic() < deadline:
        pids = run_processes(token, known, skip)
        last_seen = time.monotonic() if pids else last_seen
        for pid in pids:
            note(f"kill {pid} {command_of(pid)}")
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError as exc:
                note(f"kill {pid} failed: {exc}")
        time.sleep(0.1)
    note(f"sweep over: {killed} killed, none found for {time.monotonic() - last_seen:.1f} s")
    return killed


class Reaper:
    """The learner's side: a reaper process and the write end of its pipe."""

    def __init__(self, proc: subprocess.Popen, token: str):
        self.proc, self.token = proc, token

    @classmethod
    def start(cls) -> Reaper | None:
        """A reaper with a new token (None where /proc is missing: not Linux)."""
        if not sys.platform.startswith("linux"):
            return None
        token = secrets.token_hex(16)
        env = {k: v for k, v in os.environ.items() if k != TOKEN_VAR}
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", __file__, token],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        return cls(proc, token)

    def close(self, timeout: float = CLOSE_S) -> None:
        """End the reaper's wait: it kills what is left of the Ray and exits; wait for it."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass  # it goes on alone, and exits by SWEEP_S


def main(token: str) -> None:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)  # only the end of its stdin starts the sweep
    note("waiting")
    skip, known = frozenset({os.getpid(), os.getppid()}), {}
    stdin = sys.stdin.buffer.fileno()
    while True:
        ready, _, _ = select.select([stdin], [], [], POLL_S)
        if ready and not os.read(stdin, 4096):
            break
        if not ready:
            run_processes(token, known, skip)
    note(f"stdin closed: sweeping ({len(known)} processes recorded)")
    sweep(token, known)


if __name__ == "__main__":
    main(sys.argv[1])
