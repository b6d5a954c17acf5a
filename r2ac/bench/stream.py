"""`r2ac bench stream`: agent-steps/s of the streaming agent (stream AC(lambda), the preset's
networks) for K agents in lockstep and each core: with env stepping (MemoryChain) and the
learner alone (act + learn on a fixed observation), exact RTRL beside TBPTT(1) of the same core.

Each (K, core) is timed `--repeats` times over `--steps` lockstep steps after `--warmup`
untimed ones; the median is reported (agent-steps/s = K x steps / s). One torch thread
(`--threads`), as the preset runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

# each TBPTT(1) core before its exact-RTRL twin (the ratio column compares the two)
CORES = ("rtu-bptt", "rtu-rtrl", "elstm-bptt", "elstm-rtrl", "lru-bptt", "lru-rtrl",
         "gru-bptt", "feedforward")  # fmt: skip


def _runtime(core: str, k: int, length: int):
    from r2ac.rl.presets import preset
    from r2ac.rl.runtimes.stream import StreamRuntime

    cfg = preset("stream").updated(
        core=core, num_agents=k, env_options=(f"length={length}",), progress=False
    )
    return StreamRuntime(cfg)


class _Count:
    update = 0

    def record(self, *args, **kwargs):
        self.update += 1


def _time(fn, steps: int, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(core: str, k: int, steps: int, warmup: int, repeats: int, length: int = 32) -> dict:
    rt = _runtime(core, k, length)
    counter = _Count()
    with_env = _time(lambda: rt._step(counter), steps, warmup, repeats)
    agent = rt.agent
    obs = np.zeros((k, agent.obs_size), dtype=np.float32)
    zeros, no = np.zeros(k, dtype=np.float32), np.zeros(k, dtype=bool)

    def learner():
        agent.act()
        agent.learn(zeros, obs, obs, no, no)

    alone = _time(learner, steps, warmup, repeats)
    rt.close()
    return {
        "core": core,
        "K": k,
        "agent_steps_per_s": k * steps / with_env,
        "learner_agent_steps_per_s": k * steps / alone,
        "sensitivities_per_agent": agent.actor.core.sensitivity_numbers()
        + agent.critic.core.sensitivity_numbers(),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="r2ac bench stream", description=__doc__.splitlines()[0])
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--cores", nargs="+", default=list(CORES))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json-out", help="write the rows here as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    print(f"{'core':<12} {'K':>4} {'agent-steps/s':>14} {'learner alone':>14} {'vs bptt':>8}")
    for k in args.ks:
        by_core = {}
        for core in args.cores:
            row = measure(core, k, args.steps, args.warmup, args.repeats)
            by_core[core] = row
            base = by_core.get(core.replace("-rtrl", "-bptt"))
            ratio = row["agent_steps_per_s"] / base["agent_steps_per_s"] if base else None
            row["rtrl_over_bptt"] = ratio if core.endswith("-rtrl") else None
            rows.append(row)
            print(f"{core:<12} {k:>4} {row['agent_steps_per_s']:>14.0f} "
                  f"{row['learner_agent_steps_per_s']:>14.0f} "
                  f"{'' if row['rtrl_over_bptt'] is None else f'{ratio:.2f}x':>8}", flush=True)  # fmt: skip
    if args.json_out:
        Path(args.json_out).write_text(
            json.dumps({"threads": args.threads, "rows": rows}, indent=1)
        )
    return 0
