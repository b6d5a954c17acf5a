"""Up-front checks of the benchmarks' options, shared by `r2ac bench *`.

Every bench checks its options before any work (a bad count, an unknown name, an output
file that cannot be written): one line and exit 2, never a traceback after minutes of
measuring. Counts have documented upper limits, so that a typo (`--steps 10**12`) is refused
rather than run for ever:

    MAX_REPEATS   1,000        timed repeats (and warm-up repeats)
    MAX_STEPS     10,000,000   steps of one timed repeat
    MAX_THREADS   4,096        torch threads
    MAX_COPY_MB   65,536       the copy-bandwidth buffer, MB (also bounded by the memory free)
"""

from __future__ import annotations

from collections.abc import Iterable

from r2ac.errors import ConfigError, check_writable

MAX_REPEATS = 1_000
MAX_STEPS = 10_000_000
MAX_THREADS = 4_096
MAX_COPY_MB = 65_536


def check_count(value: int | float, option: str, low: int, high: int) -> None:
    """ConfigError unless low <= value <= high."""
    if not low <= value <= high:
        raise ConfigError(f"{option} must be in {low:,}..{high:,}, got {value:,}")


def check_counts(values: Iterable[int], option: str, low: int, high: int) -> None:
    """ConfigError unless at least one value is given and each lies in low..high."""
    values = list(values)
    if not values:
        raise ConfigError(f"{option} needs at least one value")
    bad = [v for v in values if not low <= v <= high]
    if bad:
        raise ConfigError(f"{option} must be in {low:,}..{high:,}, got {bad[0]:,}")


def check_names(names: Iterable[str], option: str, known: Iterable[str]) -> None:
    """ConfigError unless at least one name is given and each is known."""
    names, known = list(names), list(known)
    if not names:
        raise ConfigError(f"{option} needs at least one value")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"{option}: unknown {unknown[0]!r}; choose from {', '.join(known)}")


def check_output(path, option: str) -> None:
    """ConfigError unless the result file `path` (if given) can be written: checked before
    the run, so that hours of measuring are not lost to a typo in the path."""
    if path:
        check_writable(path, option, is_file=True)


def check_train_options(argv: list[str], what: str) -> None:
    """ConfigError (one line) unless `r2ac train ARGV` parses and validates."""
    import contextlib
    import io

    from r2ac.rl.config import validate
    from r2ac.rl.harness.train_cli import parse_config

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
            validate(parse_config(argv))
    except SystemExit:  # tyro's usage error, printed as a box: its first line of words
        lines = [ln.strip(" │╭╮╰╯─-") for ln in said.getvalue().splitlines()]
        text = " ".join(ln for ln in lines[1:] if ln and not ln.startswith("For full helptext"))
        reason = " ".join(text.split())[:200] or "a bad option"
        raise ConfigError(f"{what}: r2ac train refuses its options: {reason}") from None
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None
