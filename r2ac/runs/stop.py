"""A clean stop on SIGINT / SIGTERM: finish the update, write a checkpoint, exit non-zero.

`StopRequest` replaces the two handlers while training runs: a signal only records itself,
and the training loop asks `requested` between updates, so no update is cut in half and the
checkpoint written then holds everything done so far. A second SIGINT while the first is
being honoured raises KeyboardInterrupt (Ctrl-C twice: stop now); a repeated SIGTERM only
repeats the request (`timeout` and service managers may send it to the whole group, so a
process can receive it twice).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM outside a StopRequest (start-up, loading, evaluation): it unwinds as Ctrl-C
    does, so every `except KeyboardInterrupt` and cleanup on the way runs; exit 143."""

    signum = signal.SIGTERM


class Interrupted(KeyboardInterrupt):  # noqa: N818  (Ctrl-C, as KeyboardInterrupt is)
    """SIGINT outside a StopRequest. A subclass, not KeyboardInterrupt itself: CPython kills
    its own process with SIGINT at exit (status -2, whatever `main` returned) when a bare
    KeyboardInterrupt ever left code it ran through its eval entry points (e.g. a
    KeyboardInterrupt raised inside code run by `exec` during an import), and it tests for
    that type exactly."""

    signum = signal.SIGINT


# The signal the handlers below last raised for. Some libraries turn the exception into a
# bare KeyboardInterrupt on its way through them (Ray's `ray.get`: a SIGTERM while the
# actors started said "stopped by SIGINT", exit 130); that one is then named by this.
_last_signum: int | None = None
# The signal the handlers below raised for (or put off past an import, `_may_raise`) and
# nobody has turned into an exit yet. Python drops an exception raised in some places (an
# at-fork callback: logging's `_releaseLock` as Ray forks, printed as "Exception ignored"),
# and the command would run on as if no signal had come; the next StopRequest honours such
# a one (a clean stop at its first check).
_unhonoured: int | None = None


# A signal that came while an import ran is looked at again this much later (_may_raise).
_RETRY_S = 0.02
# The signal put off past an import and not raised since (SIGALRM answers it only if so).
_postponed: int | None = None
_IMPORTLIB = ("importlib._bootstrap", "importlib._bootstrap_external")


def _importing(frame) -> bool:
    """Whether `frame` runs inside an import: importlib's machinery is on the stack (it is
    there too when C code imports, and under a module body it executes)."""
    while frame is not None:
        if frame.f_globals.get("__name__") in _IMPORTLIB:
            return True
        frame = frame.f_back
    return False


def _answer_postponed(alarm, frame) -> None:
    """SIGALRM, _RETRY_S after a signal was put off: the handler now in place for that
    signal runs (it raises, or puts it off again while the import goes on). A kernel timer,
    not a thread: a thread runs when the main thread waits on I/O, so the signal it sent
    landed right after such a wait (between a print's text and its newline)."""
    signum = _postponed
    handler = signal.getsignal(signum) if signum is not None else None
    if callable(handler):
        handler(signum, frame)


def _may_raise(signum: int, frame) -> bool:
    """Whether a handler may raise for `signum` now. Not inside an import: native modules'
    start-up calls back into Python (torch's `_autograd_init` into importlib's module
    locks), and an exception raised there cannot unwind through their C++ frames: the
    process crashes (a segfault, or std::terminate's exit -6, seen in CI for a SIGTERM 0.34 s
    into `r2ac train`). Such a signal is recorded (a command that ends before it is raised
    still answers for it: `take_unhonoured`) and looked at again in 20 ms (SIGALRM), until
    the import has ended."""
    global _postponed, _last_signum, _unhonoured
    if not _importing(frame):
        _postponed = None
        return True
    _postponed = _last_signum = _unhonoured = signum
    signal.signal(signal.SIGALRM, _answer_postponed)
    signal.setitimer(signal.ITIMER_REAL, _RETRY_S)
    return False


def _raise_terminated(signum, frame) -> None:
    global _last_signum, _unhonoured
    if _may_raise(signal.SIGTERM, frame):
        _last_signum = _unhonoured = signal.SIGTERM
        raise Terminated()


def _raise_interrupted(signum, frame) -> None:
    global _last_signum, _unhonoured
    if _may_raise(signal.SIGINT, frame):
        _last_signum = _unhonoured = signal.SIGINT
        raise Interrupted()


def _signum(exc: BaseException) -> int:
    """The signal behind a KeyboardInterrupt: its own, else the last one the handlers saw
    (a bare KeyboardInterrupt made of ours by a library), else SIGINT."""
    return int(getattr(exc, "signum", None) or _last_signum or signal.SIGINT)


def exit_code(exc: BaseException) -> int:
    """130 for Ctrl-C (KeyboardInterrupt), 143 for SIGTERM (Terminated); the signal is then
    honoured (see `_unhonoured`)."""
    global _unhonoured, _postponed
    _unhonoured = _postponed = None
    return 128 + _signum(exc)


def take_unhonoured() -> int | None:
    """The signal raised for and never turned into an exit (None if none), cleared: what a
    command that returned normally must still answer for (a library swallowed the exception,
    e.g. Ray's shutdown)."""
    global _unhonoured, _postponed
    signum, _unhonoured, _postponed = _unhonoured, None, None
    return signum


def signal_name(exc: BaseException) -> str:
    return signal.Signals(_signum(exc)).name


def _quiet_unraisable(unraisable) -> None:
    """sys.unraisablehook: one of our own signal exceptions that Python could not raise (an
    at-fork callback, a __del__) is not printed as "Exception ignored ... Traceback": it is
    recorded (`_unhonoured`) and answered in one line later. Anything else goes on to the hook
    that was there before."""
    if isinstance(unraisable.exc_value, (Terminated, Interrupted)):
        return
    _next_unraisablehook(unraisable)


_next_unraisablehook = sys.unraisablehook


def install_handlers() -> dict[int, object]:
    """The handlers of a command from its first line: SIGINT raises Interrupted and SIGTERM
    Terminated (both KeyboardInterrupts) (StopRequest and raise_on_signal replace them while they are inside,
    and put them back), and `_quiet_unraisable`. Returns the handlers they replaced (main
    thread only)."""
    global _last_signum, _unhonoured, _postponed, _next_unraisablehook
    if threading.current_thread() is not threading.main_thread():
        return {}
    _last_signum = _unhonoured = _postponed = None
    if sys.unraisablehook is not _quiet_unraisable:
        _next_unraisablehook, sys.unraisablehook = sys.unraisablehook, _quiet_unraisable
    return {
        signal.SIGINT: signal.signal(signal.SIGINT, _raise_interrupted),
        signal.SIGTERM: signal.signal(signal.SIGTERM, _raise_terminated),
    }


def ignore_signals() -> None:
    """After a command has finished and written everything: a late signal changes nothing,
    the process exits with the command's code."""
    if threading.current_thread() is threading.main_thread():
        for signum in SIGNALS:
            signal.signal(signum, signal.SIG_IGN)


def restore_handlers(previous: dict[int, object]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


class TrainingInterrupted(Exception):  # noqa: N818  (a stop, not an error)
    """Training stopped on a signal after `update` updates, with a checkpoint written."""

    def __init__(self, signum: int, update: int, saved: bool):
        self.signum, self.update, self.saved = signum, update, saved
        super().__init__(f"{signal.Signals(signum).name} after update {update}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


def raise_for(signum: int) -> None:
    """Raise what the handlers raise for `signum` (Interrupted or Terminated), as if it had
    just come."""
    global _last_signum, _unhonoured
    _last_signum = _unhonoured = signum
    raise Interrupted() if signum == signal.SIGINT else Terminated()


class StopRequest:
    """Context manager: while inside, SIGINT and SIGTERM set `signum` instead of stopping.

    While `at_once` is true (set-up inside the guard: starting actors, waiting for their first
    segments, the first update, when nothing since the last checkpoint is there to save) a
    signal raises Interrupted / Terminated as outside the guard: the command stops at once, in
    one line, and the last checkpoint stays the run's."""

    def __init__(self):
        self.signum: int | None = None
        self.at_once = False
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        self.signum = signum  # also when raising: a library that swallows the exception
        if self.at_once:  # leaves the request, answered after the step (with a checkpoint)
            # raises, or puts the signal off past an import (then back here)
            (_raise_interrupted if signum == signal.SIGINT else _raise_terminated)(signum, frame)
            return
        if signum == signal.SIGINT:  # the next Ctrl-C stops at once; SIGTERM stays handled
            signal.signal(signum, _raise_interrupted)

    def __enter__(self) -> StopRequest:
        global _unhonoured, _postponed
        if threading.current_thread() is threading.main_thread():  # signals only go there
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        if _unhonoured is not None:  # dropped on its way, or put off past an import: stop now
            self.signum, _unhonoured, _postponed = _unhonoured, None, None
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def stop_at_once(self) -> None:
        """From now on a signal raises (`at_once`); one recorded already is raised now."""
        self.at_once = True
        if self.signum is not None:
            signum, self.signum = self.signum, None
            raise_for(signum)


@contextmanager
def raise_on_signal(update: int) -> Iterator[None]:
    """While inside, SIGINT / SIGTERM raise TrainingInterrupted at once: for the work after
    the last checkpoint (the final evaluation), which `--resume` redoes."""

    def handler(signum, frame):
        if _may_raise(signum, frame):
            raise TrainingInterrupted(signum, update, True)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {signum: signal.signal(signum, handler) for signum in SIGNALS}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """While inside, SIGINT / SIGTERM wait (a short step that must not be cut in half: a
    child process being handed its start-up data); on leaving, one that came is sent again,
    to the handler then in place (which stops at once, or records a stop request)."""
    with StopRequest() as inner:
        yield
    if inner.signum is not None:
        signal.raise_signal(inner.signum)
