"""The serial training loop of two cores, update by update in one process: their speed ratio.

    .venv/bin/python scripts/rtrl_bptt_ratio.py [UPDATES] [CORE_A CORE_B]

Builds a `SerialRuntime` of the default config (built-in delayed-cue, N = 64, M = 16, 32
streams, one thread) for each core (default elstm-rtrl and elstm-bptt) and runs one update
(collect + learner step) of each in turn, alternating which goes first, UPDATES times (default
300) after 20 warm-up updates. Interleaving at that grain puts both under the same load, which
on a shared machine drifts far more between separate runs than the ratio it measures. Prints
frames/s by wall clock and by CPU time (the median update), the ratio of the medians and the
median of the per-update ratios, and the median CPU ms of the collect, the learner step and,
for cores that have one, the actor's segment-end carry (`carry_traces`). Figures:
docs/results.md, "The actors stop repeating work".
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from r2ac.perf import keep_freed_memory
from r2ac.rl.config import TrainConfig
from r2ac.rl.runtime_serial import SerialRuntime


def timed_carry(core, store: list[float]) -> None:
    """Record the CPU time of every `carry_traces` call of `core` (if it has the method: the
    script also times code from before it)."""
    carry = getattr(core, "carry_traces", None)
    if carry is None:
        return

    def wrapped(*args):
        t0 = time.process_time()
        out = carry(*args)
        store.append(time.process_time() - t0)
        return out

    core.carry_traces = wrapped


def one_update(runtime: SerialRuntime) -> tuple[float, float, float]:
    """Wall and CPU seconds of one collect + update, and the CPU seconds of the collect."""
    w0, c0 = time.perf_counter(), time.process_time()
    seg, _ = runtime.actors[0].collect()
    c1 = time.process_time()
    runtime.learner.update(seg)
    return time.perf_counter() - w0, time.process_time() - c0, c1 - c0


def main(updates: int, cores: list[str]) -> None:
    keep_freed_memory()
    torch.set_num_threads(1)
    runtimes = {c: SerialRuntime(TrainConfig(core=c, total_frames=10**9)) for c in cores}
    frames = runtimes[cores[0]].cfg.unroll_length * runtimes[cores[0]].cfg.batch_size
    rows = {c: [] for c in cores}
    carries = {c: [] for c in cores}
    for c, runtime in runtimes.items():
        timed_carry(runtime.agent.core, carries[c])
    for i in range(updates + 20):
        for c in cores if i % 2 == 0 else cores[::-1]:
            row = one_update(runtimes[c])
            if i >= 20:
                rows[c].append(row)
    a, b = (list(zip(*rows[c], strict=True)) for c in cores)
    for k, clock in enumerate(("wall", "cpu")):
        ma, mb = statistics.median(a[k]), statistics.median(b[k])
        pairs = statistics.median(y / x for x, y in zip(a[k], b[k], strict=True))
        print(
            f"{clock}: {cores[0]} {frames / ma:.0f} frames/s, {cores[1]} {frames / mb:.0f}"
            f" frames/s, ratio of medians {mb / ma:.3f}, median per-update ratio {pairs:.3f}"
        )
    for c, (_, cpu, collect) in zip(cores, (a, b), strict=True):
        ms = [1e3 * statistics.median(v) for v in (collect, [t - s for t, s in zip(cpu, collect)])]
        carry = 1e3 * statistics.median(carries[c][20:]) if carries[c][20:] else 0.0
        print(f"{c}: collect {ms[0]:.2f} ms (carry_traces {carry:.2f}), learner {ms[1]:.2f} ms")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        int(args[0]) if args else 300, args[1:3] if len(args) >= 3 else ["elstm-rtrl", "elstm-bptt"]
    )
