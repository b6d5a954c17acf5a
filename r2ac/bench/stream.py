"""`r2ac bench stream`: agent-steps/s of the streaming agent (stream AC(lambda), the preset's
networks unless --hidden-size, --stream-mlp, --prev-action say otherwise) for K agents in
lockstep and each core: with env stepping (MemoryChain, --length) and the learner alone (act +
learn on a fixed observation), exact RTRL beside TBPTT(1) of the same core. `--compile-step`:
the compiled loop (r2ac/rl/stream/compiled_loop.py), its env inside (no learner-alone column;
each core's compile before its warm-up, untimed; --cores among the rtu and lru ones).

Each (K, core) is timed `--repeats` times over `--steps` lockstep steps after `--warmup`
untimed ones, the cores' repeats interleaved; the median is reported (agent-steps/s = K x
steps / s of wall time, and per CPU-second of the process, which holds under load where wall
time does not), and exact RTRL over TBPTT(1) as the median of the repeats' ratios. One torch
thread (`--threads`), as the preset runs.

How close to the memory bound: per agent-step the update must at least read and write every
weight, every trace element and every sensitivity once (`min_traffic_bytes`; gradients and
activations left in cache). That traffic at the measured agent-steps/s is set beside the
copy bandwidth of one thread measured in the same run (`copy_bandwidth`: a buffer far beyond
the caches, read and written).

Options are checked before anything runs (r2ac/bench/options.py): --ks in 1..4,096,
--steps in 1..10,000,000, --warmup in 0..10,000,000, --repeats in 1..1,000, --threads in
1..4,096, --copy-mb in 1..65,536, --cores among CORES, a writable --json-out; the copy buffers must fit the memory available.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from r2ac.bench import options
from r2ac.errors import ConfigError

# each TBPTT(1) core before its exact-RTRL twin (the ratio column compares the two)
CORES = ("rtu-bptt", "rtu-rtrl", "elstm-bptt", "elstm-rtrl", "lru-bptt", "lru-rtrl",
         "mingru-bptt", "mingru-rtrl", "gru-bptt", "feedforward")  # fmt: skip
MAX_K = 4_096  # agents in lockstep


def _runtime(core: str, k: int, net: dict):
    """The streaming runtime of `core` at K agents; net: length, and hidden_size, stream_mlp,
    prev_action where given (the preset's otherwise)."""
    from r2ac.rl.presets import preset
    from r2ac.rl.stream.runtime import StreamRuntime

    sizes = {n: v for n, v in net.items() if n != "length" and v is not None}
    cfg = preset("stream").updated(
        core=core,
        num_agents=k,
        env_options=(f"length={net['length']}",),
        progress=False,
        total_frames=k * 10**12,
        **sizes,
    )  # fmt: skip  (no end in sight: a compiled chunk stops only at log / checkpoint cadences)
    return StreamRuntime(cfg)


class _Count:
    update = 0

    def record(self, *args, updates: int = 1, **kwargs):
        self.update += updates


def _seconds(fn, steps: int) -> float:
    return _times(fn, steps)[0]


def _times(fn, steps: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of `steps` calls of fn."""
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        fn()
    return time.perf_counter() - start, time.process_time() - cpu


def sensitivities(agent) -> int:
    """RTRL sensitivities one agent carries (both networks' cores)."""
    return agent.actor.core.sensitivity_numbers() + agent.critic.core.sensitivity_numbers()


def min_traffic_bytes(agent) -> int:
    """Bytes one agent-step must move at least: each weight and trace element of both networks
    read and written once (theta += c z, z <- gamma lambda z + g), each sensitivity too."""
    params = agent.actor.layout.size + agent.critic.layout.size
    return agent.params.flat.element_size() * (4 * params + 2 * sensitivities(agent))


def copy_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes/s one thread moves copying a buffer far beyond the caches (read + write counted)."""
    src = torch.ones(megabytes * 2**18)  # float32
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in
    seconds = statistics.median(_seconds(lambda: dst.copy_(src), 1) for _ in range(repeats))
    return 2 * src.numel() * src.element_size() / seconds


class _Subject:
    """One (core, K): its runtime, the two timed steps (with the env; the learner alone on a
    fixed observation) and the seconds of each repeat."""

    def __init__(self, core: str, k: int, net: dict | None = None):
        self.core, self.k = core, k
        self.runtime = _runtime(core, k, net or {"length": 32})
        agent, counter = self.runtime.agent, _Count()
        obs = np.zeros((k, agent.obs_size), dtype=np.float32)
        zeros, no = np.zeros(k, dtype=np.float32), np.zeros(k, dtype=bool)

        def learner(steps: int):
            for _ in range(steps):
                agent.act()
                agent.learn(zeros, obs, obs, no, no)

        def with_env(steps: int):  # the compiled loop runs many steps a call
            end = counter.update + steps
            while counter.update < end:
                self.runtime.step(counter)

        self.steps = {"with_env": with_env}
        if self.runtime.loop is None:  # compiled, the learner is the loop with its env
            self.steps["alone"] = learner
        self.seconds = {kind: [] for kind in self.steps}
        self.cpu_seconds: list[float] = []  # with the env

    def time(self, steps: int, record: bool = True) -> None:
        for kind, fn in self.steps.items():
            wall, cpu = _times(lambda fn=fn: fn(steps), 1)
            if record:
                self.seconds[kind].append(wall)
                if kind == "with_env":
                    self.cpu_seconds.append(cpu)

    def row(self, steps: int) -> dict:
        agent = self.runtime.agent
        per_s = {kind: self.k * steps / statistics.median(t) for kind, t in self.seconds.items()}
        compiled = self.runtime.loop or self.runtime.fused
        return {
            "core": self.core,
            "K": self.k,
            "agent_steps_per_s": per_s["with_env"],
            "agent_steps_per_cpu_s": self.k * steps / statistics.median(self.cpu_seconds),
            "learner_agent_steps_per_s": per_s.get("alone"),
            "compile_s": compiled and compiled.compile_seconds,
            "sensitivities_per_agent": sensitivities(agent),
            "min_traffic_bytes": min_traffic_bytes(agent),
        }


def measure_k(
    cores: list[str], k: int, steps: int, warmup: int, repeats: int, net: dict | None = None
) -> list[dict]:
    """Rows for every core at K agents, the cores' repeats interleaved (core after core, then
    again), so that a load that comes and goes falls on all of them alike. An exact-RTRL row's
    `rtrl_over_bptt` is the median over repeats of its TBPTT(1) twin's seconds over its own."""
    subjects = [_Subject(core, k, net) for core in cores]
    for subject in subjects:
        subject.time(warmup, record=False)
    for _ in range(repeats):
        for subject in subjects:
            subject.time(steps)
    rows, by_core = [], {}
    for subject in subjects:
        row = subject.row(steps)
        twin = by_core.get(subject.core.replace("-rtrl", "-bptt"))
        row["rtrl_over_bptt"] = None
        if subject.core.endswith("-rtrl") and twin is not None:
            pairs = zip(twin.seconds["with_env"], subject.seconds["with_env"])
            row["rtrl_over_bptt"] = statistics.median(b / r for b, r in pairs)
        by_core[subject.core] = subject
        subject.runtime.close()
        rows.append(row)
    return rows


def _blank(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def check_args(args: argparse.Namespace) -> None:
    """ConfigError for any option out of its range (module docstring), before any work."""
    options.check_counts(args.ks, "--ks", 1, MAX_K)
    options.check_names(args.cores, "--cores", CORES)
    if args.compile_step:
        from r2ac.rl.config import COMPILED_STEP_CORES

        options.check_names(args.cores, "--cores with --compile-step", COMPILED_STEP_CORES)
    options.check_count(args.steps, "--steps", 1, options.MAX_STEPS)
    options.check_count(args.warmup, "--warmup", 0, options.MAX_STEPS)
    options.check_count(args.repeats, "--repeats", 1, options.MAX_REPEATS)
    options.check_count(args.threads, "--threads", 1, options.MAX_THREADS)
    options.check_count(args.copy_mb, "--copy-mb", 1, options.MAX_COPY_MB)
    options.check_output(args.json_out, "--json-out")
    options.check_count(args.length, "--length", 2, 100_000)
    if args.hidden_size is not None:
        options.check_count(args.hidden_size, "--hidden-size", 1, 65_536)
    for width in args.stream_mlp or ():
        options.check_count(width, "--stream-mlp", 1, 65_536)
    _check_memory(args)


def _check_memory(args: argparse.Namespace) -> None:
    """The copy-bandwidth buffers (two of --copy-mb) must fit the memory available."""
    from r2ac.perf import check_memory

    check_memory({"copy buffers": (2 * args.copy_mb * 2**20, "--copy-mb")}, "r2ac bench stream")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="r2ac bench stream", description=__doc__.splitlines()[0])
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--cores", nargs="+", default=list(CORES))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json-out", help="write the rows here as JSON")
    parser.add_argument("--copy-mb", type=int, default=256, help="buffer of the copy bandwidth")
    parser.add_argument("--length", type=int, default=32, help="MemoryChain's length")
    parser.add_argument("--hidden-size", type=int, help="the core's size (default: the preset's)")
    parser.add_argument(
        "--stream-mlp", type=int, nargs="*", help="widths below the core (none: the observation)"
    )
    parser.add_argument(
        "--prev-action", action="store_true", help="the previous action in the observation"
    )
    parser.add_argument(
        "--compile-step", action="store_true",
        help="the compiled step (rtu and lru cores): the env inside its loop",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        check_args(args)
    except ConfigError as exc:
        print(f"r2ac bench stream: error: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    copy = copy_bandwidth(args.copy_mb)
    print(f"copy bandwidth, {args.threads} thread(s): {copy / 1e9:.1f} GB/s")
    rows = []
    print(f"{'core':<12} {'K':>4} {'agent-steps/s':>14} {'per CPU-s':>10} {'learner alone':>14} "
          f"{'vs bptt':>8} {'min MB/step':>12} {'of copy':>8}")  # fmt: skip
    net = {"length": args.length, "hidden_size": args.hidden_size}
    net["stream_mlp"] = None if args.stream_mlp is None else tuple(args.stream_mlp)
    net["prev_action"] = args.prev_action or None
    net["compile_step"] = args.compile_step or None
    for k in args.ks:
        for row in measure_k(args.cores, k, args.steps, args.warmup, args.repeats, net):
            row["of_copy_bandwidth"] = row["agent_steps_per_s"] * row["min_traffic_bytes"] / copy
            rows.append(row)
            ratio = row["rtrl_over_bptt"]
            print(f"{row['core']:<12} {k:>4} {row['agent_steps_per_s']:>14.0f} "
                  f"{row['agent_steps_per_cpu_s']:>10.0f} "
                  f"{_blank(row['learner_agent_steps_per_s']):>14} "
                  f"{'' if ratio is None else f'{ratio:.2f}x':>8} "
                  f"{row['min_traffic_bytes'] / 1e6:>12.2f} {row['of_copy_bandwidth']:>8.0%}",
                  flush=True)  # fmt: skip
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(
            {"threads": args.threads, "copy_bytes_per_s": copy, "network": net, "rows": rows},
            indent=1,
        ))  # fmt: skip
    return 0
