"""Process-level allocator settings, and the one reader of peak memory.

`peak_memory_mib(run, device)`: how much memory one call of `run` needs beyond what the process
holds when it starts (CUDA: the allocator's peak; CPU: the resident set's high-water mark,
reset through /proc/self/clear_refs). Every benchmark and study measures peaks with it,
in a fresh process on CPU (r2ac.bench.probe), since the resident set depends on everything
the process did before.

`time_alternating(fns, repeats, warmup, device)`: the one timing loop of the benchmarks
(median ms of each function, the functions called in turn so that a noisy machine's drift
falls on all of them alike), and `synchronize(device)`, which it calls around each call.

`keep_freed_memory()`: glibc serves allocations above ~32 MB with fresh mmap'd pages and
returns them on free, so every new sensitivity tensor of the RTRL carry (33 MB at N=512,
D=257, B=32) pays ~8000 page faults (measured: a 33 MB clone takes ~10 ms instead of ~1 ms).
Turning mmap off for the heap and never trimming it lets freed blocks be reused, as a caching
allocator would. The same effect can be had with jemalloc or tcmalloc via LD_PRELOAD.

`available_bytes()`: the memory available now (MemAvailable, capped by a cgroup limit);
`check_memory(parts, what, device)`: the one-line refusal of a job whose estimated memory
exceeds it (`r2ac copy`, `r2ac bench core`; `r2ac train` has its own model in
r2ac.rl.harness.resources).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import statistics
import sys
import time
from collections.abc import Callable

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4
_applied = False


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse. Returns True if it took effect."""
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(_M_MMAP_MAX, 0) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
    except (OSError, AttributeError):  # not glibc
        return False
    _applied = ok
    return ok


def return_freed_memory_at_once() -> None:
    """glibc: serve every allocation above 64 KiB with its own mmap, unmapped on free, so that
    the resident set follows live memory (the opposite of keep_freed_memory; for probes)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, 64 * 1024)  # also stops the threshold's dynamic growth
    except (OSError, AttributeError):
        pass


def release_freed_memory() -> None:
    """Give freed heap memory back to the OS now (malloc_trim), e.g. before measuring RSS."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def rss_bytes(field_name: str = "VmRSS") -> int:
    """A memory field of /proc/self/status in bytes: VmRSS (resident now) or VmHWM (peak)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"{field_name} not in /proc/self/status")


def reset_peak_rss() -> None:
    """Reset VmHWM to the current resident set (Linux >= 4.0); OSError where it cannot."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def peak_memory_mib(run: Callable[[], object], device: str = "cpu") -> float | None:
    """The peak memory growth of one call of `run` over what is held when it starts, in MiB.

    CUDA: torch's allocator peak during the call minus what was allocated before it. CPU:
    freed heap memory is given back first (malloc_trim), then the resident set's high-water
    mark is reset and read after the call, minus the resident set before it; None where
    /proc/self cannot tell (not Linux). Call it in a fresh process for numbers that do not
    depend on what ran before (r2ac.bench.probe.run_fresh).
    """
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        run()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    try:
        release_freed_memory()
        base = rss_bytes("VmRSS")
        reset_peak_rss()
        run()
        return max(rss_bytes("VmHWM") - base, 0) / 2**20
    except OSError:
        return None


def synchronize(device) -> None:
    """Wait for the work queued on `device` (CUDA); CPU work is done when a call returns."""
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def time_alternating(fns: dict, repeats: int, warmup: int, device) -> dict[str, float]:
    """Median ms per call of each function, calling them in turn in one loop (the first
    `warmup` rounds not counted)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for i in range(warmup + repeats):
        for name, fn in fns.items():
            synchronize(device)
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def available_bytes() -> int | None:
    """MemAvailable, capped by a cgroup (v2) limit; None where neither can be read."""
    values = []
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    values.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as fh, open("/sys/fs/cgroup/memory.current") as cur:
            limit = fh.read().strip()
            if limit != "max":
                values.append(int(limit) - int(cur.read().strip()))
    except (OSError, ValueError):
        pass
    return min(values) if values else None


GIB = 2**30


def device_available_bytes(device: str) -> int | None:
    """Free memory of `device` (cuda[:i]: the driver's free bytes), or the host's."""
    if str(device).startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info(torch.device(device))[0]
    return available_bytes()


def check_memory(parts: dict[str, tuple[int, str]], what: str, device: str = "cpu") -> None:
    """ConfigError (one line naming the largest part's option) if the parts, bytes each with
    the option that sizes it, exceed the memory available on `device`; called before a job
    allocates. R2AC_SKIP_MEMORY_CHECK=1 turns it off."""
    import os

    from r2ac.errors import ConfigError

    if os.environ.get("R2AC_SKIP_MEMORY_CHECK") == "1":
        return
    available = device_available_bytes(device)
    total = sum(b for b, _ in parts.values())
    if available is None or total <= available:
        return
    name, (size, option) = max(parts.items(), key=lambda kv: kv[1][0])
    raise ConfigError(
        f"{what} needs about {total / GIB:.1f} GiB ({name} {size / GIB:.1f} GiB) but "
        f"{available / GIB:.1f} GiB are available; lower {option} "
        "(R2AC_SKIP_MEMORY_CHECK=1 skips this check)"
    )
