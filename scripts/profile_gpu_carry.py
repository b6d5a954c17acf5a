"""Where the eLSTM's history term + in-place carry spends its time on CUDA (issue 39).

For each shape and each GPU-carry candidate (by default torch, compile, triton and
compile-graph): the wall time of one call (synchronised, median), the summed CUDA kernel time
of one call from torch.profiler, and the top kernels. Wall >> kernel time means the call is
bound by launches and Python (fix: one kernel, CUDA graphs); kernel time far above the bytes /
copy bandwidth means the kernels themselves are slow (fix: the kernel's access pattern, tf32
or a fused GEMM).

    python scripts/profile_gpu_carry.py [--shapes 50,32,256,257 100,256,1024,257]
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.profiler import ProfilerActivity, profile

from r2ac.bench import bandwidth
from r2ac.perf import time_alternating
from r2ac.rtrl.elstm import gpu_carry


def profile_one(shape, name: str, device: torch.device, calls: int, copy_gbs: float) -> None:
    """Time and profile `history_and_carry_in_place` at `shape` by candidate `name`."""
    T, B, N, D = shape
    os.environ[gpu_carry.ENV] = name
    gpu_carry.reset()
    d_hat, sens, trace, x = bandwidth.carry_operands(shape, torch.float32, device)

    def call():
        gpu_carry.history_and_carry_in_place(d_hat, sens, trace, x)

    try:
        for _ in range(3):
            call()
    except Exception as exc:  # noqa: BLE001 - report it and go on to the next candidate
        print(f"{shape} {name}: failed: {exc!r}", flush=True)
        return
    chosen = [s.name for s in gpu_carry.selections() if s.op == "carry"]
    ms = time_alternating({"call": call}, 20, 0, device)["call"]  # warmed up above
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(calls):
            call()
        if cuda:
            torch.cuda.synchronize()
    events = prof.key_averages()
    kernel_us = events.total_average().self_device_time_total  # "Self CUDA time total"
    ideal_ms = 2 * B * 2 * N * D * 4 / copy_gbs / 1e6  # FZ read once and written once: fused
    print(
        f"\n== {','.join(map(str, shape))} {name} (ran {chosen}): wall {ms:.3f} ms a call, CUDA"
        f" kernels {kernel_us / calls / 1e3:.3f} ms a call, FZ read + written at copy speed"
        f" {ideal_ms:.3f} ms",
        flush=True,
    )
    sort = "cuda_time_total" if cuda else "cpu_time_total"
    print(events.table(sort_by=sort, row_limit=10, max_name_column_width=60), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # the launch-bound shape the first lease found short of the bar, and a bandwidth-bound one
    parser.add_argument("--shapes", nargs="+", default=["50,32,256,257", "100,256,1024,257"])
    parser.add_argument(
        "--candidates", nargs="+", default=["torch", "compile", "triton", "compile-graph"]
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--calls", type=int, default=10, help="calls inside the profile")
    args = parser.parse_args()
    device = torch.device(args.device)
    copy_gbs = bandwidth.copy_bandwidth_gbs(args.device, 256, 10, 3)
    print(f"copy bandwidth (read + write, 256 MiB): {copy_gbs:.0f} GB/s", flush=True)
    for text in args.shapes:
        for name in args.candidates:
            profile_one(tuple(int(v) for v in text.split(",")), name, device, args.calls, copy_gbs)


if __name__ == "__main__":
    main()
