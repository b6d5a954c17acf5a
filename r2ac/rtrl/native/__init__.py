"""Optional native kernel for the eLSTM's in-place RTRL carry (float32, CPU).

`elstm_carry.c` fuses the three passes that the end of a segment's backward makes over the
O(B*N*D) sensitivities (history contraction, scale by G, the carry GEMM) into one, so the
tensor is read and written once instead of three times (docs/rules/rtrl.md, "Native kernel").

It is plain C, built on first use with the system C compiler (`cc -O3 -march=native
-fopenmp`, about a second) and cached under `~/.cache/r2ac/native` (or `$R2AC_NATIVE_CACHE`),
keyed by a hash of the source, the flags and the compiler's version. The library links
`libgomp.so.1`, which PyTorch has already loaded, so its OpenMP threads are PyTorch's own.

Nothing depends on it: without a compiler, on another OS, or with `R2AC_NATIVE=0`, `load()`
returns None and the layer keeps its PyTorch path (same numbers up to float32 rounding).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("elstm_carry.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11")
VECTOR = 16  # floats per vector in the kernel: the 2N columns must be a multiple of it

_lib: ctypes.CDLL | None = None
_tried = False


class NativeKernelError(RuntimeError):
    """The native kernel refused its arguments (a bug in the caller: shapes are checked first)."""


def cache_dir() -> Path:
    return Path(os.environ.get("R2AC_NATIVE_CACHE", Path.home() / ".cache" / "r2ac" / "native"))


def enabled() -> bool:
    return os.environ.get("R2AC_NATIVE", "1") != "0"


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def build(compiler: str, out_dir: Path) -> Path:
    """Compile the kernel into out_dir (atomically: temp file + rename) and return its path."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode() + version.encode()).hexdigest()
    target = out_dir / f"elstm_carry-{key[:16]}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, suffix=".so.tmp")
    os.close(fd)
    try:
        proc = subprocess.run(
            [compiler, *FLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True, timeout=300
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{compiler} failed:\n{proc.stderr.strip()}")
        os.replace(tmp, target)  # concurrent builders each write their own temp file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    for stale in out_dir.glob("elstm_carry-*.so"):  # builds of older sources or compilers
        if stale != target:
            stale.unlink(missing_ok=True)  # a process still using it keeps its mapping
    return target


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn = lib.r2ac_history_scale_gemm
    fn.restype = ctypes.c_int
    fn.argtypes = [i64] * 4 + [ptr] * 5 + [i64] * 2 + [ptr] + [i64] * 2
    fn = lib.r2ac_carry_inputs
    fn.restype = ctypes.c_int
    fn.argtypes = [i64] * 3 + [ptr] * 10
    return lib


def load() -> ctypes.CDLL | None:
    """The kernel library, built if needed; None (once with a warning) if it cannot be had."""
    global _lib, _tried
    if _tried or not enabled():
        return _lib if enabled() else None
    _tried = True
    compiler = _compiler()
    if not sys.platform.startswith("linux") or compiler is None:
        return None  # silent: the PyTorch path is the documented default there
    try:
        _lib = _declare(ctypes.CDLL(str(build(compiler, cache_dir()))))
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        warnings.warn(
            f"r2ac: the native eLSTM carry kernel could not be built ({err}); using the PyTorch"
            " path (same results, slower). Set R2AC_NATIVE=0 to silence this.",
            RuntimeWarning,
            stacklevel=2,
        )
    return _lib


def supports(stored: Tensor, x: Tensor) -> bool:
    """Whether the kernel takes these operands: float32 CPU, FZ blocks (B, D, 2, N) contiguous
    with 2N a multiple of 16, x with unit stride over its features."""
    return (
        stored.dtype == torch.float32
        and stored.device.type == "cpu"
        and x.dtype == torch.float32
        and stored.is_contiguous()
        and stored.shape[-1] % 8 == 0
        and x.stride(-1) == 1
    )


def _call(name: str, *args) -> None:
    if _lib is None:
        raise NativeKernelError("native kernel not loaded (call load() first)")
    rc = getattr(_lib, name)(*args)
    if rc != 0:
        raise NativeKernelError(f"{name} returned {rc}")


def carry_inputs(
    fh: Tensor, zh: Tensor, a: Tensor, cp: Tensor, d_hat: Tensor, wb: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One pass over a segment's trace (fh, zh, a, cp: (T, B, N)); see elstm_math._carry_inputs.

    Updates wb (B, 4, N) in place to G * wb + the segment's increment and returns
    u (T, B, 2, N), [G | G] (B, 2N), [d_hat | d_hat] (B, 2N) and the history gradient of the
    w/b vectors, d_wb (4, N) = sum_b d_hat[b] * wb_old[b].
    """
    T, B, N = fh.shape
    fh, zh, a, cp, d_hat = (v.contiguous() for v in (fh, zh, a, cp, d_hat))
    if not wb.is_contiguous():
        raise NativeKernelError("wb must be contiguous")
    u = fh.new_empty(T, B, 2, N)
    g2, d2 = fh.new_empty(B, 2 * N), fh.new_empty(B, 2 * N)
    d_wb = fh.new_empty(4, N)
    _call(
        "r2ac_carry_inputs", T, B, N,
        *(v.data_ptr() for v in (fh, zh, a, cp, d_hat, wb, u, g2, d2, d_wb)),
    )  # fmt: skip
    return u, g2, d2, d_wb


def history_scale_gemm(stored: Tensor, hist: Tensor, g2: Tensor, d2: Tensor, x: Tensor, u: Tensor) -> None:
    """In one pass per stream b: hist += d_hat[b] * FZ[b]; FZ[b] = G[b] * FZ[b] + x_b^T u_b.

    stored: (B, D, 2, N) the FZ blocks, overwritten; hist: (D, 2, N), zeroed by the caller;
    g2, d2: (B, 2N) G and d_hat repeated over the F and Z halves (from `carry_inputs`);
    x: (T, B, D); u: (T, B, 2, N) contiguous.
    """
    B, D, _, N = stored.shape
    T = x.shape[0]
    if not (hist.is_contiguous() and u.is_contiguous() and g2.is_contiguous() and d2.is_contiguous()):
        raise NativeKernelError("hist, u, g2 and d2 must be contiguous")
    if not supports(stored, x):
        raise NativeKernelError("operands not in the kernel's layout (see supports)")
    _call(
        "r2ac_history_scale_gemm", B, D, 2 * N, T,
        stored.data_ptr(), hist.data_ptr(), g2.data_ptr(), d2.data_ptr(),
        x.data_ptr(), x.stride(0), x.stride(1),
        u.data_ptr(), u.stride(0), u.stride(1),
    )  # fmt: skip
