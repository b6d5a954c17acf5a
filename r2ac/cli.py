"""The `r2ac` command.

Each subcommand lives in its own module and is imported only when it is used, so that
`r2ac envs` does not pay for torch.compile or matplotlib, and a missing optional package
only breaks the subcommand that needs it. A subcommand module exposes `main(argv) -> int`;
most of them build their CLI from a typed dataclass config with tyro.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys

from r2ac.runs import stop

# name -> (module, one-line help). Nested commands ("bench core") use "bench" and let the
# module dispatch on its own first argument.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("r2ac.demo", "gradient check and one benchmark row of the eLSTM layer"),
    "bench": (
        "r2ac.bench.cli",
        "benchmarks (bench core | cores | envs | runtime | cost | rtrl-e2e | stream"
        " | random-policy | peer)",
    ),
    "envs": ("r2ac.envs.cli", "list env families and whether they run on this machine"),
    "train": ("r2ac.rl.harness.train_cli", "train R2AC (--preset NAME, --resume RUN_DIR; --help)"),
    "eval": (
        "r2ac.rl.harness.evaluate",
        "evaluate a run: K sets of E episodes -> RUN_DIR/eval.json",
    ),
    "copy": (
        "r2ac.tasks.copy_cli",
        "the copy task: train an eLSTM by RTRL or BPTT, score every bit",
    ),
    "diagnose": (
        "r2ac.rl.harness.diagnose_cli",
        "a run's gradient split (in-segment vs history), critic",
    ),
    "plot": ("r2ac.experiments.plot", "metrics.csv columns of several runs, one panel each"),
    "experiment": (
        "r2ac.experiments.cli",
        "run a named grid (memory-m | ablation | reactive | popgym) or the cost study",
    ),
}


def _usage() -> str:
    lines = ["usage: r2ac <command> [options]", "", "commands:"]
    lines += [f"  {name:<12} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "`r2ac <command> --help` describes the options of a command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run a command (`_main`). A process that started a local Ray ends with os._exit once
    its command has returned and its output is flushed: a SIGTERM while Ray's core worker
    was still connecting otherwise made the interpreter's teardown abort (exit -6 after the
    one line, 1 in 14 trials at load 7); the Ray processes die with this one (ray_reaper)."""
    if argv is None:  # this process's command: jemalloc for the compiled step (r2ac.allocator)
        from r2ac.allocator import reexec_with_fast_allocator

        reexec_with_fast_allocator()
    code = _main(argv)
    ray_runtime = sys.modules.get("r2ac.rl.runtimes.ray")
    if argv is None and getattr(ray_runtime, "LOCAL_RAY_STARTED", False):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _main(argv: list[str] | None = None) -> int:
    """Run a command. SIGINT / SIGTERM are handled from this first line to the exit: one line
    and exit 130 / 143 (a command's own handling stops cleanly, r2ac.runs.stop); once the
    command has returned (everything written), a late signal leaves its exit code."""
    previous = stop.install_handlers()  # first: a signal during the imports is one line too
    entry, name = argv is None, "r2ac"
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        name = f"r2ac {argv[0]}" if argv and argv[0] in SUBCOMMANDS else name
        code = _dispatch(argv)
        swallowed = stop.take_unhonoured()
        if code == 0 and swallowed is not None:  # a library swallowed it; the work is done
            said = signal.Signals(swallowed).name
            print(
                f"{name}: stopped by {said} as it ended (everything was written)", file=sys.stderr
            )
            return 128 + swallowed
        return code
    except KeyboardInterrupt as exc:  # outside a command's own handling (Terminated: SIGTERM)
        print(f"{name}: stopped by {stop.signal_name(exc)}", file=sys.stderr)
        return stop.exit_code(exc)
    finally:
        if entry:  # this process's command: done; a signal now must not change its exit code
            stop.ignore_signals()
        else:  # called in-process (tests): leave the caller's handlers as they were
            stop.restore_handlers(previous)


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"r2ac: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
