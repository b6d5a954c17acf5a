"""Time the native eLSTM carry kernel alone, against the cores' peak arithmetic rate.

    .venv/bin/python scripts/native_kernel_timing.py [T,B,N,D ...]

For each shape (default: the two of issue 2) it runs `r2ac.rtrl.elstm.native.carry_in_place` on
random operands, 40 times after 5 warm-up calls, once with FZ evicted from the caches before
every call (64 MB written in between: a training loop's situation) and once hot, and prints
min / median ms and the achieved GFLOP/s of the carry GEMM (2 T B 2N D flops). Figures:
docs/rules/rtrl.md, "Native kernel".
"""

import statistics
import sys
import time

import torch

from r2ac.perf import keep_freed_memory
from r2ac.rtrl.elstm import math as em
from r2ac.rtrl.elstm import native


def operands(T, B, N, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    stored = em._stored_blocks(em.zero_FZ(B, N, D))
    stored.copy_(0.1 * torch.randn(stored.shape, generator=g))
    wb = torch.randn(B, 4, N, generator=g)
    fh, zh, cp = (torch.randn(T, B, N, generator=g) for _ in range(3))
    a = torch.rand(T, B, N, generator=g)  # d c(t) / d c(t-1) is in [0, 1) for most units
    x = torch.randn(T, B, D, generator=g)
    d_hat = torch.randn(B, N, generator=g)
    return stored, wb, (fh, zh, a, cp), x, d_hat


def main(shapes):
    keep_freed_memory()
    if native.load() is None:
        sys.exit("the native kernel is not available here (no C compiler, or R2AC_NATIVE=0)")
    junk = torch.empty(64 * 2**20 // 4)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for T, B, N, D in shapes:
        stored, wb, trace, x, d_hat = operands(T, B, N, D)
        gflop = 2 * T * B * 2 * N * D / 1e9
        for label, evict in (("FZ from memory", True), ("FZ hot", False)):
            times = []
            for i in range(45):
                if evict:
                    junk.fill_(1.0)
                t0 = time.perf_counter()
                native.carry_in_place(stored, wb, *trace, x, d_hat)
                if i >= 5:
                    times.append(time.perf_counter() - t0)
            best, med = min(times), statistics.median(times)
            print(
                f"({T}, {B}, {N}, {D}) {label:15s} min {1e3 * best:.3f} ms, median {1e3 * med:.3f} ms,"
                f" {gflop / med:.0f} GFLOP/s (median)"
            )


if __name__ == "__main__":
    args = sys.argv[1:] or ["50,32,256,257", "100,32,512,257"]
    main([tuple(int(v) for v in s.split(",")) for s in args])
