"""Optional native kernel for the eLSTM's RTRL carry and history term (float32, CPU).

`elstm_carry.c` does, in one pass over the O(B*N*D) sensitivities, what the PyTorch path does
in several at the end of a segment's backward: the carry inputs (u, G), the history
contraction, the scale by G and the carry GEMM (docs/rules/rtrl.md, "Native kernel"); the
same pass without the history is an actor's carry into new buffers (`carry`), the history
alone is a learner's that does not carry (`history`), and `start_sum` is the first-order start
state's pass (docs/rules/passes.md).

It is plain C, built on first use with the system C compiler (`cc -O3 -march=native
-fopenmp`, about a second) and cached under `~/.cache/r2ac/native` (or `$R2AC_NATIVE_CACHE`),
keyed by a hash of the source, the flags, the compiler's version and the CPU. The cache folder
must be the user's own and writable by no one else (it is created with mode 0700; an existing
one of the user's is tightened to 0700), and the library's SHA-256, written beside it at build
time (`.so.sha256`), is checked before it is loaded: a library planted by someone else or a
damaged one is never loaded (a warning, and the PyTorch path). The library links
`libgomp.so.1`, which PyTorch has already loaded, so its OpenMP threads are PyTorch's own.

Nothing depends on it: without a compiler, on another OS, or with `R2AC_NATIVE=0`, `load()`
returns None and the layer keeps its PyTorch path (same numbers up to float32 rounding).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("elstm_carry.c")
# gnu11, not c11: ISO C mode turns off FMA contraction (-ffp-contract=off), ~25% slower here.
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11", "-ffp-contract=fast")

_lib: ctypes.CDLL | None = None
_tried = False


class NativeKernelError(RuntimeError):
    """The kernel was called without being loaded, or refused its arguments (a caller's bug:
    `supports` is checked first)."""


class UnsafeCacheError(RuntimeError):
    """The cache folder or the library in it could have been written by someone else."""


def cache_dir() -> Path:
    """$R2AC_NATIVE_CACHE, else ~/.cache/r2ac/native, else (home not writable) a temp folder."""
    if "R2AC_NATIVE_CACHE" in os.environ:
        return Path(os.environ["R2AC_NATIVE_CACHE"])
    home = Path.home() / ".cache" / "r2ac" / "native"
    try:
        home.mkdir(parents=True, exist_ok=True)
        if os.access(home, os.W_OK):
            return home
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / f"r2ac-native-{os.getuid()}"


def enabled() -> bool:
    return os.environ.get("R2AC_NATIVE", "1") != "0"


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _cpu_identity() -> str:
    """The CPU's model and instruction-set flags: -march=native code built on one machine must
    not be loaded on another (a cache folder shared over NFS would otherwise crash with SIGILL)."""
    try:
        with open("/proc/cpuinfo") as fh:
            lines = [ln for ln in fh if ln.startswith(("model name", "flags", "Features"))]
    except OSError:
        lines = []
    return platform.machine() + "".join(dict.fromkeys(lines))  # first occurrence of each line


MARKER = ".r2ac-native-cache"  # written into a cache folder r2ac created (or named itself)


def secure_dir(path: Path, own_name: bool = False) -> Path:
    """`path`, created with mode 0700 if absent; UnsafeCacheError unless it is a real folder
    of this user that nobody else can write to, and one r2ac created (it holds MARKER) or
    whose name is r2ac's own (`own_name`: the default cache folders). Only such a folder is
    tightened to 0700 and has its stale builds deleted: a folder of the user's, named by
    R2AC_NATIVE_CACHE, is never changed."""
    created = not os.path.lexists(path)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeCacheError(f"{path} is not a folder (a link?)")
    if st.st_uid != os.getuid():
        raise UnsafeCacheError(f"{path} belongs to uid {st.st_uid}, not to you ({os.getuid()})")
    if st.st_mode & 0o022:  # someone else may have put a library there already
        raise UnsafeCacheError(
            f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):o}); "
            f"remove it or run `chmod 700 {path}`"
        )
    marker = path / MARKER
    if not (created or own_name or marker.is_file()):
        raise UnsafeCacheError(
            f"R2AC_NATIVE_CACHE={path} is a folder r2ac did not create, and r2ac changes no "
            "folder of yours; name a folder that does not exist yet (r2ac creates it)"
        )
    if not marker.is_file():
        _write_private(marker, b"r2ac native kernel cache: r2ac may delete its old builds here\n")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sidecar(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")


def verify(library: Path) -> Path:
    """UnsafeCacheError unless `library` is this user's regular file, writable by nobody
    else, whose SHA-256 is the one recorded when it was built."""
    st = os.lstat(library)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise UnsafeCacheError(f"{library} is not a regular file of yours, private to you")
    try:
        expected = _sidecar(library).read_text().strip()
    except OSError as exc:
        raise UnsafeCacheError(f"{library} has no recorded hash") from exc
    if _sha256(library) != expected:
        raise UnsafeCacheError(f"{library} does not match the hash recorded at build time")
    return library


def _write_private(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def build(compiler: str, out_dir: Path) -> Path:
    """Compile the kernel into out_dir (atomically: temp file + rename) and return its path."""
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, timeout=60
    ).stdout
    parts = (
        SOURCE.read_bytes(),
        " ".join(FLAGS).encode(),
        version.encode(),
        _cpu_identity().encode(),
    )
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()
    target = out_dir / f"elstm_carry-{key[:16]}.so"
    if target.exists() and _sidecar(target).exists():
        return target  # load() verifies it against the recorded hash
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, suffix=".so.tmp")
    os.close(fd)
    try:
        proc = subprocess.run(
            [compiler, *FLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True, timeout=300
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{compiler} failed:\n{proc.stderr.strip()}")
        os.chmod(tmp, 0o700)  # whatever the umask: nobody else may rewrite it
        # The hash first: a library is never in place without the hash it must match.
        _write_private(_sidecar(target), (_sha256(Path(tmp)) + "\n").encode())
        os.replace(tmp, target)  # concurrent builders each write their own temp file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    for stale in [*out_dir.glob("elstm_carry-*.so"), *out_dir.glob("elstm_carry-*.so.sha256")]:
        if stale not in (target, _sidecar(target)):  # builds of older sources or compilers
            stale.unlink(missing_ok=True)  # a process still using it keeps its mapping
    return target


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn = lib.r2ac_carry_fused
    fn.restype = ctypes.c_int
    fn.argtypes = [i64] * 4 + [ptr] * 4 + [i64] * 2 + [ptr] * 8
    fn = lib.r2ac_history
    fn.restype = ctypes.c_int
    fn.argtypes = [i64] * 3 + [ptr] * 5
    fn = lib.r2ac_start
    fn.restype = ctypes.c_int
    fn.argtypes = [i64] * 3 + [ptr] * 3
    fn = lib.r2ac_carry_gates
    fn.restype = ctypes.c_int
    fn.argtypes = [i64] * 4 + [ptr] * 3 + [i64] * 2 + [ptr] * 8
    return lib


def load() -> ctypes.CDLL | None:
    """The kernel library, built if needed; None (once with a warning) if it cannot be had."""
    global _lib, _tried
    if not enabled():
        return None
    if _tried:
        return _lib
    _tried = True
    compiler = _compiler()
    if not sys.platform.startswith("linux") or compiler is None:
        return None  # silent: the PyTorch path is the documented default there
    try:
        own = "R2AC_NATIVE_CACHE" not in os.environ  # the default folders are r2ac's own
        library = verify(build(compiler, secure_dir(cache_dir(), own_name=own)))
        _lib = _declare(ctypes.CDLL(str(library)))
    except UnsafeCacheError as err:
        warnings.warn(
            f"r2ac: not loading the native eLSTM carry kernel: {err}; using the PyTorch path"
            " (same results, slower). Set R2AC_NATIVE_CACHE to a private folder, or"
            " R2AC_NATIVE=0 to silence this.",
            RuntimeWarning,
            stacklevel=2,
        )
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        warnings.warn(
            f"r2ac: the native eLSTM carry kernel could not be built ({err}); using the PyTorch"
            " path (same results, slower). Set R2AC_NATIVE=0 to silence this.",
            RuntimeWarning,
            stacklevel=2,
        )
    return _lib


def supports(stored: Tensor, x: Tensor | None = None) -> bool:
    """Whether the kernel takes these operands: float32 CPU, FZ blocks (B, D, 2, N) contiguous
    with N a multiple of 8, and x (if given) float32 with unit stride over its features."""
    return (
        stored.dtype == torch.float32
        and stored.device.type == "cpu"
        and stored.is_contiguous()
        and stored.shape[-1] % 8 == 0
        and (x is None or (x.dtype == torch.float32 and x.stride(-1) == 1))
    )


def _checked(stored: Tensor, wb: Tensor, x: Tensor | None = None) -> None:
    if _lib is None:
        raise NativeKernelError("native kernel not loaded (call load() first)")
    if not (supports(stored, x) and wb.is_contiguous() and wb.dtype == stored.dtype):
        raise NativeKernelError("operands not in the kernel's layout (see supports)")


def _run_carry(stored, out, wb, wb_out, trace, x, history):
    """r2ac_carry_fused over `trace` (fh, zh, a, cp) and x; history = (hist, d_hat, d_wb) or None."""
    B, D, _, N = stored.shape
    fh, zh, a, cp = (v.contiguous() for v in trace)
    hist, d_hat, d_wb = history if history is not None else (None, None, None)
    rc = _lib.r2ac_carry_fused(
        B, D, N, x.shape[0], stored.data_ptr(), out.data_ptr(),
        None if hist is None else hist.data_ptr(), x.data_ptr(), x.stride(0), x.stride(1),
        *(v.data_ptr() for v in (fh, zh, a, cp)),
        None if d_hat is None else d_hat.data_ptr(), wb.data_ptr(), wb_out.data_ptr(),
        None if d_wb is None else d_wb.data_ptr(),
    )  # fmt: skip
    if rc != 0:
        raise NativeKernelError(f"r2ac_carry_fused returned {rc}")


def carry_in_place(
    stored: Tensor,
    wb: Tensor,
    fh: Tensor,
    zh: Tensor,
    a: Tensor,
    cp: Tensor,
    x: Tensor,
    d_hat: Tensor,
) -> tuple[Tensor, Tensor]:
    """The in-place carry of one segment and its history gradient, in one pass over FZ.

    stored: (B, D, 2, N) the FZ blocks and wb: (B, 4, N), both overwritten with their values at
    the segment's end; fh, zh, a, cp: (T, B, N) the segment's trace; x: (T, B, D);
    d_hat: (B, N) = dL/dc(t0). Returns the history gradients dL/d[F; Z] as (2, N, D) and
    dL/d(w_f, w_z, b_f, b_z) as (4, N), both from the sensitivities at the segment's start.
    """
    _checked(stored, wb, x)
    B, D, _, N = stored.shape
    hist, d_wb = stored.new_empty(2, N, D), stored.new_zeros(4, N)  # the kernel writes all of hist
    _run_carry(stored, stored, wb, wb, (fh, zh, a, cp), x, (hist, d_hat.contiguous(), d_wb))
    return hist, d_wb


def carry(
    stored: Tensor, wb: Tensor, fh: Tensor, zh: Tensor, a: Tensor, cp: Tensor, x: Tensor
) -> tuple[Tensor, Tensor]:
    """The carry of one segment into new buffers, `stored` and `wb` left intact (as in
    `carry_in_place`, without the history). Returns the blocks (B, D, 2, N) and wb (B, 4, N)
    at the segment's end."""
    _checked(stored, wb, x)
    out, wb_out = torch.empty_like(stored), torch.empty_like(wb)
    _run_carry(stored, out, wb, wb_out, (fh, zh, a, cp), x, None)
    return out, wb_out


def carry_from_gates(
    stored: Tensor,
    wb: Tensor,
    gates: tuple[Tensor, Tensor, Tensor],
    keep: Tensor | None,
    w: tuple[Tensor, Tensor],
    x: Tensor,
    out: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """`carry` with the trace derived in the kernel from the steps' gates: f, z, cp (T, B, N),
    keep (T, B, 1) or None, w = (w_f, w_z) (N,) (elstm_math.local_derivatives). `out`:
    contiguous blocks and wb of the input's shapes to write into: the input's own (in place:
    each element is read before it is written) or not overlapping it."""
    _checked(stored, wb, x)
    B, D, _, N = stored.shape
    if out is None:
        out, wb_out = torch.empty_like(stored), torch.empty_like(wb)
    else:
        out, wb_out = out
        _checked(out, wb_out)
        if out.shape != stored.shape or wb_out.shape != wb.shape:
            raise NativeKernelError("output blocks of another shape than the input's")
    f, z, cp, w_f, w_z = (v.detach().contiguous() for v in (*gates, *w))
    keep = None if keep is None else keep.contiguous()
    rc = _lib.r2ac_carry_gates(
        B, D, N, x.shape[0], stored.data_ptr(), out.data_ptr(), x.data_ptr(), x.stride(0),
        x.stride(1), *(v.data_ptr() for v in (f, z, cp)),
        None if keep is None else keep.data_ptr(), w_f.data_ptr(), w_z.data_ptr(),
        wb.data_ptr(), wb_out.data_ptr(),
    )  # fmt: skip
    if rc != 0:
        raise NativeKernelError(f"r2ac_carry_gates returned {rc}")
    return out, wb_out


def history(stored: Tensor, wb: Tensor, d_hat: Tensor) -> tuple[Tensor, Tensor]:
    """The history gradients of `carry_in_place` alone: dL/d[F; Z] (2, N, D) and
    dL/d(w_f, w_z, b_f, b_z) (4, N) from the blocks (B, D, 2, N), wb (B, 4, N) and d_hat (B, N)."""
    _checked(stored, wb)
    B, D, _, N = stored.shape
    hist, d_wb = stored.new_empty(2, N, D), stored.new_zeros(4, N)
    d_hat = d_hat.contiguous()
    rc = _lib.r2ac_history(
        B, D, N, stored.data_ptr(), hist.data_ptr(), d_hat.data_ptr(), wb.data_ptr(),
        d_wb.data_ptr(),
    )  # fmt: skip
    if rc != 0:
        raise NativeKernelError(f"r2ac_history returned {rc}")
    return hist, d_wb


def start_sum(stored: Tensor, d_blocks: Tensor) -> Tensor:
    """sum_d stored[:, d] * d_blocks[d], (B, 2, N), from the blocks (B, D, 2, N) and the change
    of [F; Z] in their layout, d_blocks (D, 2, N): the first-order start state's FZ part."""
    d_blocks = d_blocks.contiguous()
    _checked(stored, d_blocks)  # the same layout and dtype checks as for wb
    B, D, _, N = stored.shape
    out = stored.new_empty(B, 2, N)
    rc = _lib.r2ac_start(B, D, N, stored.data_ptr(), d_blocks.data_ptr(), out.data_ptr())
    if rc != 0:
        raise NativeKernelError(f"r2ac_start returned {rc}")
    return out
