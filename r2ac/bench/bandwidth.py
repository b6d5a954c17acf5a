"""Memory bandwidth figures for `r2ac bench core`: the device's copy bandwidth, and the eLSTM's
history term + in-place carry (the learner's path, by the candidate r2ac.rtrl.elstm.gpu_carry
selects on CUDA) as a fraction of it.

The carry must read the sensitivities FZ (B, 2, N, D) once and write them once: 2 * |FZ| bytes,
the traffic of a copy of FZ, so `carry GB/s / copy GB/s` is how close it comes to the memory
bound. For T = 1 that is the per-step carry; for longer segments the T rank-1 updates add
arithmetic (B * 2N * D * T multiply-adds) and the fraction falls below 1 by design.
The history term alone reads FZ once (|FZ| bytes); a pure read can pass the copy's rate.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

import torch

from r2ac.perf import time_alternating
from r2ac.rtrl import ELSTMSensitivity
from r2ac.rtrl.elstm import gpu_carry
from r2ac.rtrl.elstm import math as em


@dataclass(frozen=True)
class CarryRow:
    """One shape's history + in-place carry: median time, bandwidth, and who ran it."""

    ms: float  # one segment's history term and carry
    ms_per_step: float  # ms / T
    gbs: float  # 2 * |FZ| bytes / time
    copy_gbs: float  # the device's copy bandwidth (read + write), measured once per run
    fraction: float  # gbs / copy_gbs
    candidate: str  # the GPU carry candidate chosen (CUDA), or the CPU path
    history_ms: float  # the history term alone (an R2AC learner's only pass)
    history_gbs: float  # |FZ| bytes read / history_ms
    history_fraction: float  # history_gbs / copy_gbs
    history_candidate: str


def copy_bandwidth_gbs(device: str, mib: int, repeats: int, warmup: int) -> float:
    """GB/s of a device-to-device copy of `mib` MiB (bytes read plus bytes written)."""
    src = torch.empty(mib * 2**20 // 4, device=device).uniform_()  # not zeros: real traffic
    dst = torch.empty_like(src)
    ms = _median_ms(lambda: dst.copy_(src), repeats, warmup, device)
    return 2 * src.numel() * src.element_size() / ms / 1e6


def carry_operands(shape, dtype, device, seed=0):
    """d_hat (B, N), the sensitivities in the layer's layout, a trace and x for one segment.
    a in [0.9, 1): cells that remember, so repeated carries keep FZ away from denormals."""
    T, B, N, D = shape
    gen = torch.Generator(device=device).manual_seed(seed)
    kw = {"device": device, "dtype": dtype}

    def rand(*size, low=-1.0, high=1.0):
        return torch.empty(*size, **kw).uniform_(low, high, generator=gen)

    sens = ELSTMSensitivity(em.zero_FZ(B, N, D, **kw).uniform_(-0.1, 0.1), rand(B, 4, N))
    fh, zh, cp = (rand(T, B, N, low=-0.1, high=0.1) for _ in range(3))
    trace = em.RecurrenceTrace(fh, zh, rand(T, B, N, low=0.9), cp)
    return rand(B, N), sens, trace, rand(T, B, D)


def carry_row(shape, dtype, device, repeats, warmup, copy_gbs) -> CarryRow:
    """Time `gpu_carry.history_and_carry_in_place` at `shape` (T, B, N, D), in place, over and
    over on one set of operands (the selection, on CUDA, happens in the warm-up)."""
    T, B, N, D = shape
    d_hat, sens, trace, x = carry_operands(shape, dtype, device)

    def run():
        gpu_carry.history_and_carry_in_place(d_hat, sens, trace, x)

    ms = _median_ms(run, repeats, max(warmup, 1), device)
    fz_bytes = B * 2 * N * D * sens.FZ.element_size()
    gbs = 2 * fz_bytes / ms / 1e6
    # The history term alone reads FZ once: what an R2AC learner (carry=False) runs per pass.
    h_ms = _median_ms(lambda: gpu_carry.history(d_hat, sens), repeats, max(warmup, 1), device)
    h_gbs = fz_bytes / h_ms / 1e6
    return CarryRow(
        ms, ms / T, gbs, copy_gbs, gbs / copy_gbs, _candidate(shape, device, "carry"),
        h_ms, h_gbs, h_gbs / copy_gbs, _candidate(shape, device, "history"),
    )  # fmt: skip


def _median_ms(fn, repeats, warmup, device) -> float:
    return time_alternating({"fn": fn}, repeats, warmup, device)["fn"]


def _candidate(shape, device, op: str) -> str:
    """Who ran `op` ("carry" or "history") at this shape: the CUDA selection, or the CPU."""
    if not str(device).startswith("cuda"):
        return "cpu"
    T, B, N, D = shape
    chosen = [
        s.name
        for s in gpu_carry.selections()
        if s.op == op and s.shapes[0] == (B, D, 2, N) and (op == "history" or s.shapes[6][0] == T)
    ]
    return chosen[-1] if chosen else "?"


def gpu_line(device: str) -> str:
    """The GPU, its memory and SM count, CUDA and driver versions (for the results page)."""
    props = torch.cuda.get_device_properties(device)
    driver = "?"
    if shutil.which("nvidia-smi"):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        driver = out.stdout.strip().splitlines()[0] if out.stdout.strip() else "?"
    return (
        f"gpu: {props.name}, {props.total_memory / 2**30:.1f} GiB, {props.multi_processor_count}"
        f" SMs, CUDA {torch.version.cuda}, driver {driver}, tf32 matmul"
        f" {'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'},"
        f" GPU carry {gpu_carry.requested()}"
    )
