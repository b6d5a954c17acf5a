"""Process-level performance settings, applied by the command-line entry points.

`keep_freed_memory()`: glibc serves allocations above ~32 MB with fresh mmap'd pages and
returns them on free, so every new sensitivity tensor of the RTRL carry (33 MB at N=512,
D=257, B=32) pays ~8000 page faults (measured: a 33 MB clone takes ~10 ms instead of ~1 ms).
Turning mmap off for the heap and never trimming it lets freed blocks be reused, as a caching
allocator would. The same effect can be had with jemalloc or tcmalloc via LD_PRELOAD.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
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
