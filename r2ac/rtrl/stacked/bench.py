"""`bench_stacked`: the time of one stacked core step with its backward (for `r2ac bench stream`)."""

from __future__ import annotations

import statistics
import time

import torch

DEFAULT_CORES = (
    "rtu-rtrl", "rtu-bptt", "lru-rtrl", "lru-bptt", "elstm-rtrl", "elstm-bptt", "mingru-rtrl",
    "mingru-bptt", "gru-bptt", "feedforward",
)  # fmt: skip


def bench_stacked(
    cores=DEFAULT_CORES,
    ks=(1, 16, 64),
    input_size: int = 128,
    hidden_size: int = 64,
    dtype: torch.dtype = torch.float32,
    steps: int = 300,
    warmup: int = 30,
    threads: int | None = 1,
    seed: int = 0,
) -> list[dict]:
    """Median microseconds of `step()` + the backward of sum(h) (w.r.t. every parameter and x),
    per core and K; one row per (core, K): name, K, us_per_step (median), us_p10 (the 10th
    percentile: closer to the unloaded cost on a shared box), agent_steps_per_s, and
    rtrl_over_bptt (the time ratio of `X-rtrl` to `X-bptt` at that K, on the rtrl rows).
    Resets: every 50th step of each agent. `threads`: torch.set_num_threads for the run
    (restored after; None leaves it)."""
    from r2ac.rtrl.stacked import make_stacked_core

    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    rows = []
    try:
        for K in ks:
            for name in cores:
                core = make_stacked_core(name, K, input_size, hidden_size, dtype)
                g = torch.Generator().manual_seed(seed)
                params = {n: p.requires_grad_() for n, p in core.init_params(g).items()}
                leaves = list(params.values())
                xs = torch.randn(64, K, input_size, generator=g, dtype=dtype)
                state, times = core.initial_state(), []
                for t in range(warmup + steps):
                    x = xs[t % 64].clone().requires_grad_()
                    reset = torch.zeros(K, dtype=torch.bool)
                    reset[t % 50 :: 50] = True
                    t0 = time.perf_counter()
                    h, state = core.step(params, x, state, reset)
                    torch.autograd.grad(h.sum(), [*leaves, x], allow_unused=True)
                    if t >= warmup:
                        times.append(time.perf_counter() - t0)
                us = 1e6 * statistics.median(times)
                p10 = 1e6 * sorted(times)[len(times) // 10]
                rows.append({"name": name, "K": K, "us_per_step": us, "us_p10": p10,
                             "agent_steps_per_s": K / us * 1e6})  # fmt: skip
    finally:
        torch.set_num_threads(old_threads)
    by = {(r["name"], r["K"]): r["us_per_step"] for r in rows}
    for r in rows:
        if r["name"].endswith("-rtrl"):
            bptt = by.get((r["name"][: -len("-rtrl")] + "-bptt", r["K"]))
            r["rtrl_over_bptt"] = None if bptt is None else r["us_per_step"] / bptt
    return rows


def format_bench(rows: list[dict]) -> str:
    """The rows as a plain table."""
    lines = [
        f"{'core':<12} {'K':>3} {'us/step':>9} {'p10 us':>8} {'agent-steps/s':>14} {'rtrl/bptt':>9}"
    ]
    for r in rows:
        ratio = r.get("rtrl_over_bptt")
        lines.append(
            f"{r['name']:<12} {r['K']:>3} {r['us_per_step']:>9.1f} {r['us_p10']:>8.1f} "
            f"{r['agent_steps_per_s']:>14.0f} {'' if ratio is None else f'{ratio:.2f}x':>9}"
        )
    return "\n".join(lines)
