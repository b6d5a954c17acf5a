"""The compiled step's hot part, compiled against hand-written: ObGD over the (2, K, P) buffers.

The streaming step spends most of its time passing over the weights and traces (docs/rules/
stream.md, "The compiled step"): z = gamma lambda z + g, the L1 norm of z per network, the
bounded step theta += alpha delta z / max(1, ...), theta_log's bound, the traces' reset at an
episode's end. This times that part alone, on the preset's network at K agents, two ways:

- compiled: `r2ac.rl.stream.compiled_math.obgd` (what the loop runs) under torch.compile with
  the loop's inductor options;
- native: the same update in plain C (built here with the system compiler, `-O3
  -march=native`), one row at a time, so that the second pass reads the traces it has just
  written from the cache.

Both get the same inputs; their outputs are compared (float32). Each is timed over `--calls`
calls, `--repeats` times, alternated, CPU seconds of the process; the medians, their ratio and
the bandwidth by the least traffic (read theta, z, g; write theta, z) are printed. Per-call
overhead (the compiled call's Python entry, ~20-30 us) is part of the compiled figure: use K >= 16
to see the kernels. The compiled function returns new buffers (as the compiled loop's body
does: a while_loop's body may not write its inputs); the native one updates in place. Nothing of r2ac depends on this script or its C code.

    python scripts/bench_obgd_native.py --ks 16 64 --repeats 5
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

C_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>

/* ObGD over (2K, P) rows (actor's K rows, then the critic's), in place. */
void obgd(float *params, float *traces, const float *g, const float *delta,
          const uint8_t *done, int64_t k, int64_t width, float decay, float lr,
          float lr_kappa_actor, float lr_kappa_critic, int64_t lo, int64_t hi,
          float bound, float *step) {
    for (int64_t r = 0; r < 2 * k; r++) {
        const int64_t a = r % k;
        float *p = params + r * width, *t = traces + r * width;
        const float *gr = g + r * width;
        float l1 = 0.f;
#pragma omp simd reduction(+ : l1)
        for (int64_t j = 0; j < width; j++) {
            const float z = gr[j] + decay * t[j];
            t[j] = z;
            l1 += fabsf(z);
        }
        const float d = delta[a], dbar = fabsf(d) > 1.f ? fabsf(d) : 1.f;
        const float b = (r < k ? lr_kappa_actor : lr_kappa_critic) * dbar * l1;
        const float s = lr / (b > 1.f ? b : 1.f), c = s * d;
        step[r] = s;
#pragma omp simd
        for (int64_t j = 0; j < width; j++) p[j] += c * t[j];
        for (int64_t j = lo; j < hi; j++) p[j] = p[j] > bound ? bound : p[j];
        if (done[a]) memset(t, 0, (size_t)width * sizeof(float));
    }
}
"""


def build_native(folder: Path) -> ctypes.CDLL:
    src, lib = folder / "obgd.c", folder / "obgd.so"
    src.write_text(C_SOURCE)
    flags = ["-O3", "-march=native", "-ffp-contract=fast", "-fopenmp-simd", "-shared", "-fPIC"]
    subprocess.run(["cc", *flags, str(src), "-o", str(lib), "-lm"], check=True)
    so = ctypes.CDLL(str(lib))
    f, i64, ptr = ctypes.c_float, ctypes.c_int64, ctypes.c_void_p
    so.obgd.argtypes = [ptr, ptr, ptr, ptr, ptr, i64, i64, f, f, f, f, i64, i64, f, ptr]
    so.obgd.restype = None
    return so


def subject(k: int):
    """The preset's network at K agents: its StepSpec and random buffers."""
    from r2ac.bench.stream import _runtime
    from r2ac.rl.stream.compiled_spec import spec_of

    spec = spec_of(_runtime("rtu-rtrl", k, {"length": 32}).agent)
    gen = torch.Generator().manual_seed(0)
    shape = (2, k, spec.width)
    params = torch.randn(shape, generator=gen) * 0.1
    traces = torch.randn(shape, generator=gen) * 0.1
    g = torch.randn(shape, generator=gen) * 0.01
    delta = torch.randn(k, generator=gen)
    done = torch.rand(k, generator=gen) < 0.25
    return spec, params, traces, g, delta, done


def pieces_of(spec, g: torch.Tensor) -> list[torch.Tensor]:
    """g (2, K, P) as grad_columns gives it: one (2K, size) piece per body slot, then the heads."""
    rows = g.reshape(2 * spec.k, spec.width)
    cuts = [sl.offset for sl in spec.body] + [spec.p_body, spec.width]
    return [rows[:, lo:hi].contiguous() for lo, hi in zip(cuts[:-1], cuts[1:], strict=True)]


def compiled_obgd(spec):
    from r2ac.rl.stream.compiled import compile_options
    from r2ac.rl.stream.compiled_math import obgd

    def fn(params, traces, pieces, delta, done):
        return obgd(spec, params, traces, pieces, delta, done)

    return torch.compile(fn, **compile_options())


def native_call(so, spec, params, traces, g, delta, done, step):
    sl = spec.phase
    lr = spec.lr
    so.obgd(
        params.data_ptr(), traces.data_ptr(), g.data_ptr(), delta.data_ptr(),
        done.data_ptr(), spec.k, spec.width, spec.discount * spec.trace_lambda, lr,
        lr * spec.kappa_actor, lr * spec.kappa_critic, sl.offset, sl.offset + sl.size,
        spec.phase_bound, step.data_ptr(),
    )  # fmt: skip


def cpu_seconds(fn, calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        fn()
    return time.process_time() - start


def measure(so, k: int, calls: int, repeats: int) -> dict:
    spec, params, traces, g, delta, done = subject(k)
    pieces = pieces_of(spec, g)
    fn = compiled_obgd(spec)
    start = time.perf_counter()
    out_p, out_t, out_s = fn(params, traces, pieces, delta, done)
    compile_s = time.perf_counter() - start
    p, t, step = params.clone(), traces.clone(), torch.empty(2 * k)
    native_call(so, spec, p, t, g, delta, done.to(torch.uint8), step)
    errors = {
        "params": float((p - out_p).abs().max() / out_p.abs().max()),
        "traces": float((t - out_t).abs().max() / out_t.abs().max()),
        "step": float((step.view(2, k) - out_s).abs().max() / out_s.abs().max()),
    }
    done8 = done.to(torch.uint8)
    subjects = {
        "compiled": lambda: fn(params, traces, pieces, delta, done),
        "native": lambda: native_call(so, spec, p, t, g, delta, done8, step),
    }
    for f in subjects.values():  # warm-up
        cpu_seconds(f, max(1, calls // 10))
    seconds = {name: [] for name in subjects}
    for _ in range(repeats):
        for name, f in subjects.items():
            seconds[name].append(cpu_seconds(f, calls) / calls)
    med = {name: statistics.median(s) for name, s in seconds.items()}
    traffic = 5 * 4 * 2 * k * spec.width  # read theta, z, g; write theta, z (float32)
    return {"k": k, "width": spec.width, "compile_s": compile_s, "errors": errors,
            "us": {n: 1e6 * s for n, s in med.items()},
            "gb_s": {n: traffic / s / 1e9 for n, s in med.items()},
            "native_speedup": med["compiled"] / med["native"]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    if min(args.ks) < 1 or args.calls < 1 or args.repeats < 1:
        ap.error("--ks, --calls and --repeats must be >= 1")
    torch.set_num_threads(1)
    from r2ac.rl.stream.compiled_loop import keep_allocations_on_the_heap

    keep_allocations_on_the_heap()  # as the compiled loop runs: fresh buffers from the heap
    with tempfile.TemporaryDirectory() as folder:
        so = build_native(Path(folder))
        print(
            "K   P per row  compiled us  native us  compiled GB/s  native GB/s  native speedup  max rel. error"
        )
        for k in args.ks:
            r = measure(so, k, args.calls, args.repeats)
            print(f"{k:<3} {r['width']:>9} {r['us']['compiled']:>12.1f} {r['us']['native']:>10.1f} "
                  f"{r['gb_s']['compiled']:>14.1f} {r['gb_s']['native']:>12.1f} "
                  f"{r['native_speedup']:>14.2f}x {max(r['errors'].values()):>15.1e}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
