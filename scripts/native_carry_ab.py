"""The actors' native carry (`r2ac_carry_gates`) of this tree against that of a git revision.

    .venv/bin/python scripts/native_carry_ab.py REVISION [--threads 1 2] [--shapes T,B,N,D ...]
        [--kernel carry|history|start]

`--kernel history` times the learner's history term alone (`r2ac_history`: one read of FZ, as
a PPO learner's every pass over a minibatch makes) instead of the actors' carry; `--kernel
start` the first-order start state's sum (`r2ac_start`: one more read of FZ a pass).

Builds REVISION's r2ac/rtrl/elstm/native/elstm_carry.c with the same compiler and flags into a
temporary folder, loads it beside this tree's kernel, checks that both give the same numbers
bit for bit on random operands, then times them alternated in one process (the order swapped
every repeat; medians of 60 after 10 warm-up), once with FZ evicted from the caches before
every call (64 MB written in between: a training loop's situation) and once hot. Prints ms and
GB/s (FZ read + written; read only for the history) per shape, thread count and cache state. Figures: docs/rules/rtrl.md,
"Native kernel".
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from r2ac.perf import keep_freed_memory
from r2ac.rtrl.elstm import native

REPEATS, WARMUP = 60, 10
SOURCE = "r2ac/rtrl/elstm/native/elstm_carry.c"


def build_revision(revision: str, out: Path) -> ctypes.CDLL:
    """REVISION's kernel source, compiled as native.build compiles this tree's."""
    source = out / "base.c"
    source.write_bytes(subprocess.run(["git", "show", f"{revision}:{SOURCE}"], check=True,
                                      capture_output=True).stdout)  # fmt: skip
    library = out / "base.so"
    compiler = shutil.which("cc") or shutil.which("gcc")
    subprocess.run([compiler, *native.FLAGS, "-o", str(library), str(source)], check=True)
    return ctypes.CDLL(str(library))


def operands(T, B, N, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    fz = 0.1 * torch.randn(B, D, 2 * N, generator=g)
    x = torch.randn(T, B, D, generator=g)
    f, z = torch.rand(T, B, N, generator=g), 2 * torch.rand(T, B, N, generator=g) - 1
    cp = torch.randn(T, B, N, generator=g)
    keep = (torch.rand(T, B, generator=g) > 0.1).float()  # some resets
    w_f, w_z, wb = torch.randn(N, generator=g), torch.randn(N, generator=g), torch.randn(B, 4, N)
    return fz, x, f, z, cp, keep, w_f, w_z, wb


def runner(kernel: str, libs: dict, T: int, B: int, N: int, D: int):
    """(run(name) calling library `name`'s kernel on fixed random operands, its outputs by name,
    GB that one call moves: FZ read and written by the carry, read by the history and start)."""
    fz, x, f, z, cp, keep, w_f, w_z, wb = operands(T, B, N, D)
    if kernel == "history":  # hist (C, D) and d_wb (4, N)
        d_hat = torch.randn(B, N, generator=torch.Generator().manual_seed(1))
        outs = {k: (fz.new_empty(2 * N, D), wb.new_empty(4, N)) for k in libs}
    elif kernel == "start":  # dw (D, C), the change of [F; Z]; out (B, C)
        dw = torch.randn(D, 2 * N, generator=torch.Generator().manual_seed(1))
        outs = {k: (fz.new_empty(B, 2 * N), None) for k in libs}
    else:
        outs = {k: (torch.empty_like(fz), torch.empty_like(wb)) for k in libs}

    def run(name: str) -> None:
        out, wb_out = outs[name]
        if kernel == "start":
            rc = libs[name].r2ac_start(B, D, N, fz.data_ptr(), dw.data_ptr(), out.data_ptr())
        elif kernel == "history":
            wb_out.zero_()  # the kernel sums into d_wb
            rc = libs[name].r2ac_history(
                B, D, N, fz.data_ptr(), out.data_ptr(), d_hat.data_ptr(), wb.data_ptr(),
                wb_out.data_ptr(),
            )  # fmt: skip
        else:
            rc = libs[name].r2ac_carry_gates(
                B, D, N, T, fz.data_ptr(), out.data_ptr(), x.data_ptr(), x.stride(0),
                x.stride(1), f.data_ptr(), z.data_ptr(), cp.data_ptr(), keep.data_ptr(),
                w_f.data_ptr(), w_z.data_ptr(), wb.data_ptr(), wb_out.data_ptr(),
            )  # fmt: skip
        assert rc == 0, rc

    reads = 2 if kernel == "carry" else 1
    return run, outs, reads * fz.numel() * fz.element_size() / 1e9


def alternated_ms(run, names: list[str], junk: torch.Tensor | None) -> dict[str, float]:
    """Median ms a call of each library, alternated (order swapped every repeat); with `junk`,
    written before every call to evict FZ from the caches."""
    ms = {k: [] for k in names}
    for i in range(REPEATS + WARMUP):
        for name in names if i % 2 else names[::-1]:
            if junk is not None:
                junk.add_(1.0)
            t0 = time.perf_counter()
            run(name)
            if i >= WARMUP:
                ms[name].append(1e3 * (time.perf_counter() - t0))
    return {k: statistics.median(v) for k, v in ms.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--shapes", nargs="+", default=["4,32,128,69", "4,8,128,69",
                                                        "100,32,512,257"])  # fmt: skip
    parser.add_argument("--kernel", choices=["carry", "history", "start"], default="carry")
    parser.add_argument("--evict-mb", type=int, default=64, help="MB written before cold calls")
    args = parser.parse_args()
    keep_freed_memory()
    if native.load() is None:
        raise SystemExit("this tree's native kernel is not available (no C compiler?)")
    junk = torch.empty(args.evict_mb * 2**20 // 4)
    with tempfile.TemporaryDirectory() as tmp:
        base = native._declare(build_revision(args.revision, Path(tmp)))  # as this tree's
        libs = {"base": base, "this": native._lib}
        for threads in args.threads:
            torch.set_num_threads(threads)
            for text in args.shapes:
                T, B, N, D = (int(v) for v in text.split(","))
                run, outs, gb = runner(args.kernel, libs, T, B, N, D)
                for name in libs:
                    run(name)
                pairs = zip(outs["base"], outs["this"])
                same = all(torch.equal(a, b) for a, b in pairs if a is not None)
                for cold in (True, False):
                    m = alternated_ms(run, list(libs), junk if cold else None)
                    print(
                        f"{threads} thread(s) {text:>15} {'cold' if cold else 'hot '}: "
                        f"{args.revision} {m['base']:.3f} ms ({gb / m['base'] * 1e3:.1f} GB/s), "
                        f"this {m['this']:.3f} ms ({gb / m['this'] * 1e3:.1f} GB/s), "
                        f"this/base time {m['this'] / m['base']:.2f}, same numbers {same}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
