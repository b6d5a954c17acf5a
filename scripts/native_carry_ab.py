"""The actors' native carry (`r2ac_carry_gates`) of this tree against that of a git revision.

    .venv/bin/python scripts/native_carry_ab.py REVISION [--threads 1 2] [--shapes T,B,N,D ...]

Builds REVISION's r2ac/rtrl/elstm/native/elstm_carry.c with the same compiler and flags into a
temporary folder, loads it beside this tree's kernel, checks that both give the same numbers
bit for bit on random operands, then times them alternated in one process (the order swapped
every repeat; medians of 60 after 10 warm-up), once with FZ evicted from the caches before
every call (64 MB written in between: a training loop's situation) and once hot. Prints ms and
GB/s (FZ read + written) per shape, thread count and cache state. Figures: docs/rules/rtrl.md,
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


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    fn = lib.r2ac_carry_gates
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int64] * 4 + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [
        ctypes.c_void_p] * 8  # fmt: skip
    return lib


def operands(T, B, N, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    fz = 0.1 * torch.randn(B, D, 2 * N, generator=g)
    x = torch.randn(T, B, D, generator=g)
    f, z = torch.rand(T, B, N, generator=g), 2 * torch.rand(T, B, N, generator=g) - 1
    cp = torch.randn(T, B, N, generator=g)
    keep = (torch.rand(T, B, generator=g) > 0.1).float()  # some resets
    w_f, w_z, wb = torch.randn(N, generator=g), torch.randn(N, generator=g), torch.randn(B, 4, N)
    return fz, x, f, z, cp, keep, w_f, w_z, wb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--shapes", nargs="+", default=["4,32,128,69", "4,8,128,69",
                                                        "100,32,512,257"])  # fmt: skip
    args = parser.parse_args()
    keep_freed_memory()
    if native.load() is None:
        raise SystemExit("this tree's native kernel is not available (no C compiler?)")
    junk = torch.empty(64 * 2**20 // 4)
    with tempfile.TemporaryDirectory() as tmp:
        libs = {"base": declare(build_revision(args.revision, Path(tmp))), "this": native._lib}
        for threads in args.threads:
            torch.set_num_threads(threads)
            for text in args.shapes:
                T, B, N, D = (int(v) for v in text.split(","))
                fz, x, f, z, cp, keep, w_f, w_z, wb = operands(T, B, N, D)
                outs = {k: (torch.empty_like(fz), torch.empty_like(wb)) for k in libs}

                def run(name, T=T, B=B, N=N, D=D, fz=fz, x=x, f=f, z=z, cp=cp, keep=keep,
                        w_f=w_f, w_z=w_z, wb=wb, outs=outs):  # fmt: skip
                    out, wb_out = outs[name]
                    rc = libs[name].r2ac_carry_gates(
                        B, D, N, T, fz.data_ptr(), out.data_ptr(), x.data_ptr(), x.stride(0),
                        x.stride(1), f.data_ptr(), z.data_ptr(), cp.data_ptr(), keep.data_ptr(),
                        w_f.data_ptr(), w_z.data_ptr(), wb.data_ptr(), wb_out.data_ptr(),
                    )  # fmt: skip
                    assert rc == 0, rc

                for name in libs:
                    run(name)
                same = all(torch.equal(a, b) for a, b in zip(outs["base"], outs["this"]))
                gb = 2 * fz.numel() * fz.element_size() / 1e9
                for cold in (True, False):
                    ms = {k: [] for k in libs}
                    for i in range(REPEATS + WARMUP):
                        for name in list(libs) if i % 2 else list(libs)[::-1]:
                            if cold:
                                junk.add_(1.0)
                            t0 = time.perf_counter()
                            run(name)
                            if i >= WARMUP:
                                ms[name].append(1e3 * (time.perf_counter() - t0))
                    m = {k: statistics.median(v) for k, v in ms.items()}
                    print(
                        f"{threads} thread(s) {text:>15} {'cold' if cold else 'hot '}: "
                        f"{args.revision} {m['base']:.3f} ms ({gb / m['base'] * 1e3:.1f} GB/s), "
                        f"this {m['this']:.3f} ms ({gb / m['this'] * 1e3:.1f} GB/s), "
                        f"this/base time {m['this'] / m['base']:.2f}, same numbers {same}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
