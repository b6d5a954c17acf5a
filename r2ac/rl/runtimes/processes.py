"""Process plumbing of the parallel runtime: messages, shared weights, actor process start-up.

Messages between the learner and its actor processes are frozen dataclasses sent over one
duplex pipe per actor (`multiprocessing.Pipe`: a socket pair, no named semaphore, nothing in
/dev/shm):

    actor -> learner   SegmentReady(slot, actor, version, generation, seq, returns, lengths)
                       ActorFailed(actor, traceback)
    learner -> actor   SlotFree(slot), Stop()

Weights live in shared memory (`WeightBoard`) and are published without a lock: a sequence
counter (a seqlock) that the one writer makes odd while it writes and even when done; a
reader copies and keeps the copy only if the counter was even and unchanged around it and
the copy's CRC-32 equals the one the writer stored. An actor that dies mid-read therefore
blocks nobody, and the writer never waits. The checksum makes the protocol independent of
the CPU's memory ordering: Python issues no fences, so on a weakly ordered CPU (ARM), or
with the non-temporal stores memcpy uses for large copies on x86, a reader could see the
new counter before all of the new weights; a torn copy fails the checksum and is retried.

Actor processes start through multiprocessing's "spawn" (a fresh interpreter), placed by
`spawn_into_group` in a process group of their own with SIGINT blocked until they ignore it:
Ctrl-C on a terminal reaches only the learner (the foreground group), which stops the
actors itself. `die_with_parent` (Linux: prctl PR_SET_PDEATHSIG) makes the kernel kill an
actor when the learner dies, however it dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing.util
import os
import signal
import sys
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch

PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass(frozen=True)
class SegmentReady:
    """Actor `actor` wrote a whole segment into `slot`, acting with weight `version`."""

    slot: int
    actor: int
    version: int
    generation: int = 0  # the actor process's restarts: a new one starts its streams anew
    seq: int = 0  # segments of this process: 1, 2, ... (the learner carry's order check)
    returns: tuple[float, ...] = ()  # episodes that ended in the segment
    lengths: tuple[int, ...] = ()


@dataclass(frozen=True)
class ActorFailed:
    """Actor `actor` raised; `traceback` is its formatted traceback."""

    actor: int
    traceback: str


@dataclass(frozen=True)
class SlotFree:
    """The learner has copied `slot`: the actor may write into it again."""

    slot: int


@dataclass(frozen=True)
class Stop:
    """Finish: close the env and exit."""


@dataclass(frozen=True)
class ActorSpec:
    """What an actor process needs to know about itself (sent once, at its start)."""

    index: int
    generation: int  # 0 for the first process of this index, k after k restarts
    slots: tuple[int, ...]  # the slot numbers it owns, in the order of the tensors it gets
    parent_pid: int  # the learner


def crc32_of(tensors: Iterable[torch.Tensor]) -> int:
    """CRC-32 of the tensors' bytes, in order (CPU tensors)."""
    crc = 0
    for t in tensors:
        crc = zlib.crc32(t.detach().contiguous().view(-1).view(torch.uint8).numpy(), crc)
    return crc


@dataclass
class WeightBoard:
    """A state_dict in shared memory, one writer (the learner), many readers (actors)."""

    tensors: dict[str, torch.Tensor]
    # seq (odd while writing), version, CRC-32 of the tensors
    seq: torch.Tensor = field(default_factory=lambda: torch.zeros(3, dtype=torch.int64))

    @classmethod
    def create(cls, state: dict[str, torch.Tensor]) -> WeightBoard:
        tensors = {k: v.detach().cpu().clone().share_memory_() for k, v in state.items()}
        board = cls(tensors, torch.zeros(3, dtype=torch.int64).share_memory_())
        board.seq[2] = crc32_of(tensors.values())
        return board

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Write `state` (any device) as `version`; readers retry a copy that overlaps."""
        seq = int(self.seq[0])
        self.seq[0] = seq + 1  # odd: writing
        for k, v in state.items():
            self.tensors[k].copy_(v)
        self.seq[2] = crc32_of(self.tensors.values())
        self.seq[1] = version
        self.seq[0] = seq + 2

    @torch.no_grad()
    def read_into(self, module: torch.nn.Module, seen: int, timeout_s: float = 60.0) -> int:
        """Copy the newest weights into `module` unless their version is `seen`; return the
        version `module` now holds. TimeoutError if no consistent copy within `timeout_s`
        (a writer that died mid-write; `module` may then hold a torn copy)."""
        deadline = time.monotonic() + timeout_s
        dst = module.state_dict()
        while True:
            before = int(self.seq[0])
            if before % 2 == 0:
                version = int(self.seq[1])
                if version == seen:
                    return seen
                crc = int(self.seq[2])
                for k, v in self.tensors.items():
                    dst[k].copy_(v)
                if int(self.seq[0]) == before and crc32_of(dst[k] for k in self.tensors) == crc:
                    return version
            if time.monotonic() > deadline:
                raise TimeoutError(f"no consistent copy of the weights in {timeout_s:.0f} s")
            time.sleep(0.0005)


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux); exit now if the
    parent is gone already. Elsewhere a no-op: the actors also poll for their parent."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def ignore_interrupts() -> None:
    """SIGINT ignored from now on (it was blocked since the process started), then
    unblocked: a Ctrl-C meant for the learner never prints a traceback here."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


class _Group:
    pgid = 0  # the group the next process joins (0: a new one, led by that process)


def _spawner(group: _Group):
    """multiprocessing's `spawnv_passfds` with the child in `group` and SIGINT blocked."""

    def spawn(path, args, passfds):
        passfds = sorted({int(fd) for fd in passfds})
        was = [os.get_inheritable(fd) for fd in passfds]
        for fd in passfds:
            os.set_inheritable(fd, True)
        try:
            try:
                pid = os.posix_spawn(
                    path, args, os.environ, setpgroup=group.pgid, setsigmask={signal.SIGINT}
                )
            except OSError:  # the group's processes are all gone: start a new group
                pid = os.posix_spawn(
                    path, args, os.environ, setpgroup=0, setsigmask={signal.SIGINT}
                )
                group.pgid = 0
        finally:
            for fd, inheritable in zip(passfds, was):
                os.set_inheritable(fd, inheritable)
        group.pgid = group.pgid or pid
        return pid

    return spawn


@contextlib.contextmanager
def spawn_into_group(pgid: int) -> Iterator[_Group]:
    """While inside, processes that multiprocessing spawns join process group `pgid` (0:
    the first starts a new group); the group is `yield`ed, its `pgid` set once one started.
    Call from the main thread (PR_SET_PDEATHSIG follows the thread that starts a child)."""
    group = _Group()
    group.pgid = pgid
    original = multiprocessing.util.spawnv_passfds
    multiprocessing.util.spawnv_passfds = _spawner(group)
    try:
        yield group
    finally:
        multiprocessing.util.spawnv_passfds = original


def describe_exit(exitcode: int | None) -> str:
    """'killed by SIGKILL', 'exit code 1', 'still running'."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"
