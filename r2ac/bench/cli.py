"""`r2ac bench <what>`: dispatch to the benchmark modules (imported lazily)."""

from __future__ import annotations

import importlib
import sys

from r2ac.errors import ConfigError, write_failure_line

BENCHES = {
    "core": ("r2ac.bench.core", "eLSTM bptt vs rtrl: time, memory, carry bandwidth"),
    "cores": ("r2ac.bench.cores", "every core and rule: time and memory per step against N"),
    "envs": ("r2ac.bench.envs", "environment steps/s per family and batch size"),
    "runtime": ("r2ac.bench.runtime", "`r2ac train` frames/s per runtime/core, alternated runs"),
    "cost": ("r2ac.bench.cost", "one R2AC learner update: memory and time, TBPTT vs RTRL, vs M"),
    "rtrl-e2e": (
        "r2ac.bench.rtrl_e2e",
        "exact RTRL vs TBPTT end to end: serial collect + update, alternated in one process",
    ),
    "stream": (
        "r2ac.bench.stream",
        "streaming agent: agent-steps/s for K agents x core, env included and learner alone",
    ),
    "random-policy": ("r2ac.bench.random_policy", "the uniform random policy's score on an env"),
    "peer": ("r2ac.bench.peer", "r2ac beside Sample Factory 2.1.1 over seeds: success, frames/s"),
    "peer-rtrrl": (
        "r2ac.bench.peer_rtrrl",
        "streaming agent beside RTRRL (JAX) on one CPU: steps/s wall and per CPU-second",
    ),
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHES:
        lines = [f"  {k:<14} {h}" for k, (_, h) in BENCHES.items()]
        print("usage: r2ac bench <what> [options]\n\n" + "\n".join(lines), file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    prog = f"r2ac bench {argv[0]}"
    module = importlib.import_module(BENCHES[argv[0]][0])
    try:
        return int(module.main(argv[1:]) or 0)
    except ConfigError as exc:  # a bench's own check, raised rather than printed
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk (or file size limit) after the up-front checks
        line = write_failure_line(exc)
        if line is None and exc.filename is None:
            raise
        line = line or f"cannot write {exc.filename}: {exc.strerror}"
        print(f"{prog}: error: {line}", file=sys.stderr)
        return 1
