"""End-to-end cost of exact RTRL against TBPTT, measured in one process.

The serial runtime's collect + update for elstm-bptt and elstm-rtrl at `--preset popgym`
(RepeatPreviousEasy), alternated iteration by iteration (the order swapped every iteration),
with timers around `next_batch` and `Learner.update`; medians after 10 warm-up iterations,
and a 95% bootstrap interval of the collect + update ratio (iterations resampled as pairs).
Less noisy on a shared box than `r2ac bench runtime`'s separate processes: both rules see the
same moments of the box. Needs popgym (the popgym extra).

    r2ac bench rtrl-e2e ITERATIONS [extra `r2ac train` flags, e.g. --device cuda]

ITERATIONS in 11..100,000; the flags are checked as `r2ac train` checks them, before any run.
"""

from __future__ import annotations

import random
import statistics
import sys
import time

from r2ac.bench.options import check_count, check_train_options
from r2ac.rl.config import validate
from r2ac.rl.harness.train_cli import parse_config
from r2ac.rl.harness.trainers import make_trainer

CORES = ("elstm-bptt", "elstm-rtrl")
WARMUP = 10
MAX_ITERATIONS = 100_000
RESAMPLES = 2000


def bootstrap_ratio(bptt: list[float], rtrl: list[float], seed: int = 0) -> tuple[float, float]:
    """95% interval of median(bptt) / median(rtrl), resampling the iterations (each a pair of
    one bptt and one rtrl time, measured back to back) with replacement."""
    rng = random.Random(seed)
    n = len(bptt)
    ratios = []
    for _ in range(RESAMPLES):
        idx = [rng.randrange(n) for _ in range(n)]
        ratios.append(
            statistics.median(bptt[i] for i in idx) / statistics.median(rtrl[i] for i in idx)
        )
    ratios.sort()
    return ratios[int(0.025 * RESAMPLES)], ratios[int(0.975 * RESAMPLES) - 1]


def build_args(core: str, extra: list[str]) -> list[str]:
    argv = ["--preset", "popgym", "--env", "gym/popgym-RepeatPreviousEasy-v0", "--core", core]
    return [*argv, "--num-threads", "1", *extra]


def build(core: str, extra: list[str]):
    runtime = make_trainer(validate(parse_config(build_args(core, extra))), None)
    runtime.start()
    return runtime


def main(argv: list[str]) -> int:
    if not argv or not argv[0].isdigit() or int(argv[0]) <= WARMUP:
        print(__doc__, file=sys.stderr)
        print(f"ITERATIONS: more than the {WARMUP} warm-up iterations", file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    iterations, extra = int(argv[0]), argv[1:]
    check_count(iterations, "ITERATIONS", WARMUP + 1, MAX_ITERATIONS)
    for core in CORES:  # every option checked before any runtime starts
        check_train_options(build_args(core, extra), f"{core} with {' '.join(extra) or 'defaults'}")
    runtimes = {core: build(core, extra) for core in CORES}
    ms = {core: {"collect": [], "update": [], "both": []} for core in CORES}
    for i in range(iterations):
        for core in CORES if i % 2 == 0 else CORES[::-1]:
            runtime = runtimes[core]
            t0 = time.perf_counter()
            batch = runtime.next_batch()
            t1 = time.perf_counter()
            runtime.learner.update(batch.segment)
            runtime.publish_weights()
            t2 = time.perf_counter()
            if i >= WARMUP:
                ms[core]["collect"].append(1e3 * (t1 - t0))
                ms[core]["update"].append(1e3 * (t2 - t1))
                ms[core]["both"].append(1e3 * (t2 - t0))
    med = {core: {k: statistics.median(v) for k, v in ms[core].items()} for core in CORES}
    for core in CORES:
        parts = ", ".join(f"{k} {v:.1f} ms" for k, v in med[core].items())
        print(f"{core}: medians {parts}; fastest collect + update {min(ms[core]['both']):.1f} ms")
    bptt, rtrl = med["elstm-bptt"], med["elstm-rtrl"]
    ratios = {k: bptt[k] / rtrl[k] for k in ("both", "update", "collect")}
    fastest = min(ms["elstm-bptt"]["both"]) / min(ms["elstm-rtrl"]["both"])
    low, high = bootstrap_ratio(ms["elstm-bptt"]["both"], ms["elstm-rtrl"]["both"])
    print(
        f"rtrl/bptt frames/s (bptt time / rtrl time): collect + update {ratios['both']:.3f} "
        f"(95% bootstrap {low:.3f}-{high:.3f}), update {ratios['update']:.3f}, "
        f"collect {ratios['collect']:.3f}; fastest {fastest:.3f}"
    )
    return 0
