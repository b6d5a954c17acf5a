"""`r2ac bench core`: eLSTM speed and memory, rule "bptt" against "rtrl", side by side.

For each (T, B, N, D) it times one segment (forward + backward from a carried state, the
RTRL carry included) for both rules alternated in one loop, so that the noise of a shared
machine hits both alike, and reports medians after warm-up. A straightforward autograd loop
over the same equations (r2ac.rtrl.reference) is timed too, as the bar the bptt path must
clear. Peak memory is measured per rule in a fresh process (CPU: growth of the resident set
over the state and inputs; CUDA: the allocator's peak). For T = 1 it also times the per-step
sensitivity update alone and compares its bandwidth with a plain memory copy of the same size.
Every shape also times the history term + in-place carry alone, and the history term by
itself (an R2AC learner's only pass over the sensitivities: it does not carry), on CUDA by
the candidates r2ac.rtrl.elstm.gpu_carry selects, against the device's measured copy
bandwidth (r2ac.bench.bandwidth). `--grid gpu` runs the GPU grid: N = 512, 1024, 2048;
B = 32, 64, 128, 256; T = 1, 50, 100; D = 257 (`gpu-512`, `gpu-1024`, `gpu-2048`: one N each).
"""

from __future__ import annotations

import itertools
import json
import platform
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

import torch
import tyro

from r2ac.bench import bandwidth
from r2ac.bench.options import MAX_COPY_MB, MAX_REPEATS, check_count
from r2ac.bench.probe import run_fresh
from r2ac.environ import environ
from r2ac.errors import ConfigError, check_writable
from r2ac.perf import check_memory, keep_freed_memory, peak_memory_mib, time_alternating
from r2ac.rtrl import ELSTM, ELSTMSensitivity, ELSTMState
from r2ac.rtrl.elstm import gpu_carry, native
from r2ac.rtrl.elstm import math as em
from r2ac.rtrl.reference import elstm_reference

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _grid(hidden_sizes: tuple[int, ...]) -> tuple[tuple[int, int, int, int], ...]:
    """(T, B, N, D) for T in 1, 50, 100, B in 32..256, the given N, D = 257 (the GPU grid)."""
    TBN = itertools.product((1, 50, 100), (32, 64, 128, 256), hidden_sizes)
    return tuple((T, B, N, 257) for T, B, N in TBN)


GRIDS = {"gpu": _grid((512, 1024, 2048))} | {f"gpu-{n}": _grid((n,)) for n in (512, 1024, 2048)}


@dataclass(frozen=True)
class BenchCoreConfig:
    """Options of `r2ac bench core`."""

    shapes: tuple[str, ...] = ("100,32,512,257", "50,32,256,257", "1,32,512,257")
    """Segment shapes as T,B,N,D (steps, streams, hidden units, inputs)."""
    repeats: int = 20
    """Timed repeats per rule (medians are reported)."""
    warmup: int = 3
    """Untimed repeats before timing."""
    dtype: str = "float32"
    """float32 or float64."""
    device: str = "cpu"
    """cpu or cuda."""
    memory: bool = True
    """Measure peak memory (CPU: one fresh process per rule and shape)."""
    naive: bool = True
    """Also time a plain autograd loop over the equations."""
    json_out: str | None = None
    """Write the rows as JSON to this file."""
    threads: int | None = None
    """Intra-op threads (default: PyTorch's choice, one per core)."""
    input_grad: bool = False
    """Let x require a gradient, as when the core sits on a trainable stem (R2AC): both rules
    then also compute dL/dx, one more GEMM of BPTT's size in every segment."""
    grid: str | None = None
    """A named grid of shapes instead of --shapes: gpu (N 512, 1024, 2048 x B 32, 64, 128,
    256 x T 1, 50, 100, D 257), or gpu-512, gpu-1024, gpu-2048 (one N each)."""
    gpu_carry: str | None = None
    """GPU carry candidate: auto, compile, triton or torch (default: $R2AC_GPU_CARRY, else
    auto, the fastest measured)."""
    copy_mib: int = 256
    """Size of the device-to-device copy that measures the copy bandwidth."""
    table_out: str | None = None
    """Write the final table (markdown, with the machine lines) to this file."""


@dataclass
class Row:
    shape: tuple[int, int, int, int]
    ms: dict[str, float] = field(default_factory=dict)
    peak_mb: dict[str, float] = field(default_factory=dict)
    held_mb: dict[str, float] = field(default_factory=dict)
    state_mb: float = 0.0
    gbs: dict[str, float] = field(default_factory=dict)  # T = 1: eager, fused carry and copy
    carry: dict[str, float | str] = field(default_factory=dict)  # bandwidth.CarryRow's fields

    @property
    def ratio(self) -> float:
        """Speed of rtrl relative to bptt (time_bptt / time_rtrl)."""
        return self.ms["bptt"] / self.ms["rtrl"]


def parse_shape(text: str) -> tuple[int, int, int, int]:
    parts = [int(p) for p in text.split(",")]
    if len(parts) != 4 or min(parts) < 1:
        raise ValueError(f"shape must be four positive integers T,B,N,D, got {text!r}")
    return tuple(parts)


def _setup(shape, rule, dtype, device, seed=0, input_grad=False):
    T, B, N, D = shape
    torch.manual_seed(seed)
    layer = ELSTM(D, N, rule, device=device, dtype=dtype)
    x = torch.randn(T, B, D, device=device, dtype=dtype, requires_grad=input_grad)
    readout = torch.randn(T, B, N, device=device, dtype=dtype)
    state = layer.initial_state(B)
    if rule == "rtrl":  # a realistic, non-zero carried state
        state = ELSTMState(
            torch.randn_like(state.c),
            ELSTMSensitivity(
                0.1 * torch.randn_like(state.sens.FZ), torch.randn_like(state.sens.wb)
            ),
        )
    return layer, x, readout, state


def segment_fn(layer, x, readout, state):
    """A callable doing one forward + backward of `layer` over x, each call starting from the
    state the previous call returned: the online-learning loop, in which rule "rtrl" carries
    its sensitivities in place at the end of each backward (r2ac.rtrl.elstm.deferred)."""
    current = [state]

    def run():
        h, current[0] = layer(x, current[0])
        (h * readout).sum().backward()
        layer.zero_grad(set_to_none=True)
        x.grad = None

    return run


def _naive_fn(layer, x, readout, state):
    params = dict(layer.named_parameters())
    reset = torch.zeros(x.shape[:2], dtype=torch.bool, device=x.device)

    def run():
        h, _ = elstm_reference(params, x, reset, state.c)
        (h * readout).sum().backward()
        layer.zero_grad(set_to_none=True)
        x.grad = None

    return run


def carry_bandwidth(shape, dtype, device, repeats, warmup) -> dict[str, float]:
    """GB/s of the per-step sensitivity update (eager and fused) and of a plain copy.

    The update must read FZ (B, 2, N, D) and write its successor: 2 * size bytes, the same
    traffic as a copy, so the two rates compare directly.
    """
    _, B, N, D = shape
    kw = {"device": device, "dtype": dtype}
    sens = ELSTMSensitivity(em.zero_FZ(B, N, D, **kw).normal_(), torch.randn(B, 4, N, **kw))
    trace = em.RecurrenceTrace(*(torch.rand(1, B, N, **kw) for _ in range(4)))
    x = torch.randn(1, B, D, **kw)
    dst = torch.empty_like(sens.FZ)
    fns = {
        "eager": lambda: em.carry_step(sens, trace, x),
        "fused": lambda: em.carry_step(sens, trace, x, fused=True),
        "copy": lambda: dst.copy_(sens.FZ),
    }
    ms = time_alternating(fns, repeats, warmup, device)
    nbytes = 2 * sens.FZ.numel() * sens.FZ.element_size()
    return {k: nbytes / v / 1e6 for k, v in ms.items()}


@dataclass(frozen=True)
class PeakRow:
    """Peak memory of one configuration, measured in a fresh process (`peak_probe`)."""

    shape: tuple[int, int, int, int]
    rule: str
    dtype: str
    peak_mb: float | None


def peak_memory_mb(shape, rule, dtype_name, device) -> float | None:
    """Peak extra memory of a forward + backward over the inputs and state already held
    (CUDA: of the second, after a warm-up; CPU: of the first two, in a fresh process)."""
    if str(device).startswith("cuda"):
        layer, x, readout, state = _setup(shape, rule, DTYPES[dtype_name], device)
        run = segment_fn(layer, x, readout, state)
        run()
        return peak_memory_mib(run, device)
    return run_fresh(peak_probe, PeakRow, shape=list(shape), rule=rule, dtype=dtype_name).peak_mb


def peak_probe(shape: list[int], rule: str, dtype: str) -> PeakRow:
    """Run in a fresh process by peak_memory_mb (CPU): the peak RSS growth of two segments."""
    keep_freed_memory()
    layer, x, readout, state = _setup(tuple(shape), rule, DTYPES[dtype], "cpu")
    run = segment_fn(layer, x, readout, state)
    return PeakRow(tuple(shape), rule, dtype, peak_memory_mib(lambda: (run(), run()), "cpu"))


def saved_for_backward_mb(run: Callable[[], object], exclude: Iterable[torch.Tensor]) -> float:
    """MB of the tensors autograd saves for backward during `run()`, each storage once, those
    of `exclude` (parameters, inputs, incoming state) left out. All of them are alive when
    backward starts, so this is what the forward leaves held: the part that grows with M."""
    known = {t.untyped_storage().data_ptr() for t in exclude}
    held: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in known:
            held[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(held.values()) / 2**20


def held_for_backward_mb(shape, rule, dtype, device) -> float:
    """Memory autograd holds between forward and backward, parameters, inputs and the
    incoming state excluded (each storage counted once). This is what grows with T."""
    layer, x, readout, state = _setup(shape, rule, dtype, device)
    exclude = [*layer.parameters(), x, readout]
    exclude += [t for t in torch.utils._pytree.tree_leaves(state) if t is not None]

    def forward_and_loss():
        h, _ = layer(x, state)
        return (h * readout).sum()

    losses = []
    mb = saved_for_backward_mb(lambda: losses.append(forward_and_loss()), exclude)
    losses[0].backward()
    return mb


def bench_shape(shape, cfg: BenchCoreConfig, copy_gbs: float | None = None) -> Row:
    dtype = DTYPES[cfg.dtype]
    row = Row(shape)
    fns = {}
    for rule in ("bptt", "rtrl"):
        fns[rule] = segment_fn(*_setup(shape, rule, dtype, cfg.device, input_grad=cfg.input_grad))
    if cfg.naive:
        fns["naive"] = _naive_fn(
            *_setup(shape, "bptt", dtype, cfg.device, input_grad=cfg.input_grad)
        )
    row.ms = time_alternating(fns, cfg.repeats, cfg.warmup, cfg.device)
    T, B, N, D = shape
    row.state_mb = B * N * (2 * D + 4) * torch.finfo(dtype).bits / 8 / 2**20
    row.held_mb = {r: held_for_backward_mb(shape, r, dtype, cfg.device) for r in ("bptt", "rtrl")}
    if cfg.memory:
        row.peak_mb = {r: peak_memory_mb(shape, r, cfg.dtype, cfg.device) for r in ("bptt", "rtrl")}
    if T == 1:
        row.gbs = carry_bandwidth(shape, dtype, cfg.device, 5 * cfg.repeats, cfg.warmup)
    if copy_gbs:
        carry = bandwidth.carry_row(shape, dtype, cfg.device, cfg.repeats, cfg.warmup, copy_gbs)
        row.carry = asdict(carry)
    return row


def format_rows(rows: list[Row]) -> str:
    head = (
        "| T, B, N, D | bptt ms | rtrl ms | naive ms | rtrl/bptt speed | steps/s bptt / rtrl "
        "| held for backward MB bptt / rtrl | peak MB bptt / rtrl | state MB "
        "| T=1 carry GB/s: eager / fused / copy | history + carry: by, ms, GB/s, of copy "
        "| history alone: by, ms, GB/s, of copy |"
    )
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        T, B, _, _ = r.shape
        naive = f"{r.ms['naive']:.1f}" if "naive" in r.ms else "-"
        peak = f"{r.peak_mb['bptt']:.0f} / {r.peak_mb['rtrl']:.0f}" if r.peak_mb else "-"
        bw = " / ".join(f"{r.gbs[k]:.1f}" for k in ("eager", "fused", "copy")) if r.gbs else "-"
        steps = " / ".join(f"{T * B / r.ms[k] * 1e3:,.0f}" for k in ("bptt", "rtrl"))
        c = r.carry
        carry = (
            f"{c['candidate']}, {c['ms']:.3f}, {c['gbs']:.0f}, {c['fraction']:.0%}" if c else "-"
        )
        hist = (
            f"{c['history_candidate']}, {c['history_ms']:.3f}, {c['history_gbs']:.0f},"
            f" {c['history_fraction']:.0%}"
            if c
            else "-"
        )
        lines.append(
            f"| {', '.join(map(str, r.shape))} | {r.ms['bptt']:.2f} | {r.ms['rtrl']:.2f} | {naive} "
            f"| {r.ratio:.2f}x | {steps} | {r.held_mb['bptt']:.1f} / {r.held_mb['rtrl']:.1f} "
            f"| {peak} | {r.state_mb:.1f} | {bw} | {carry} | {hist} |"
        )
    return "\n".join(lines)


def machine_line(device: str) -> str:
    name = (
        torch.cuda.get_device_name()
        if device.startswith("cuda")
        else platform.processor() or platform.machine()
    )
    kernel = "on" if native.load() is not None else "off (PyTorch path)"
    return (
        f"machine: {name}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"python {platform.python_version()}, native eLSTM carry kernel {kernel}"
    )


def check_device(device: str) -> None:
    """ConfigError unless `device` is cpu, or cuda[:i] with a CUDA device present."""
    if device != "cpu" and device != "cuda" and not device.startswith("cuda:"):
        raise ConfigError(f"--device must be cpu or cuda, got {device!r}")
    if device != "cpu" and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: torch sees no CUDA device here; use --device cpu")


def checked_shapes(cfg: BenchCoreConfig) -> list[tuple[int, int, int, int]]:
    """The shapes to run, after every option is checked (ConfigError or ValueError)."""
    if cfg.dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {cfg.dtype!r}; choose float32 or float64")
    check_device(cfg.device)
    if cfg.grid is not None and cfg.grid not in GRIDS:
        raise ConfigError(f"unknown --grid {cfg.grid!r}; choose one of {', '.join(GRIDS)}")
    if cfg.gpu_carry is not None and cfg.gpu_carry not in gpu_carry.CHOICES:
        choices = ", ".join(gpu_carry.CHOICES)
        raise ConfigError(f"unknown --gpu-carry {cfg.gpu_carry!r}; choose one of {choices}")
    if cfg.repeats < 1 or cfg.warmup < 0 or cfg.copy_mib < 1:
        raise ConfigError(
            f"need --repeats >= 1, --warmup >= 0 and --copy-mib >= 1, got {cfg.repeats},"
            f" {cfg.warmup}, {cfg.copy_mib}"
        )
    check_count(cfg.repeats, "--repeats", 1, MAX_REPEATS)
    check_count(cfg.warmup, "--warmup", 0, MAX_REPEATS)
    check_count(cfg.copy_mib, "--copy-mib", 1, MAX_COPY_MB)
    if cfg.threads is not None and not 1 <= cfg.threads <= 4096:
        raise ConfigError(f"--threads must be in 1..4096, got {cfg.threads}")
    for path, option in ((cfg.json_out, "--json-out"), (cfg.table_out, "--table-out")):
        if path:
            check_writable(path, option, is_file=True)
    shapes = list(GRIDS[cfg.grid]) if cfg.grid else [parse_shape(s) for s in cfg.shapes]
    item = DTYPES[cfg.dtype].itemsize
    for shape in shapes:  # one shape at a time is held: the largest decides
        check_memory(memory_parts(shape, item), f"shape {','.join(map(str, shape))}", cfg.device)
    return shapes


def memory_parts(shape: tuple[int, int, int, int], item: int) -> dict[str, tuple[int, str]]:
    """Rough bytes one shape T,B,N,D holds: the sensitivities (B x 2N x D, their successor
    and the carry benchmark's copy), inputs and readout, the activations of the backward."""
    T, B, N, D = shape
    return {
        "sensitivities": (3 * B * 2 * N * D * item, "N or D (or B) of --shapes"),
        "activations": (T * B * (D + 16 * N) * item, "T or B of --shapes"),
    }


def main(argv: list[str] | None = None) -> int:
    cfg = tyro.cli(BenchCoreConfig, args=argv, prog="r2ac bench core", description=__doc__)
    try:
        shapes = checked_shapes(cfg)
    except (ValueError, ConfigError) as exc:
        print(f"r2ac bench core: {exc}", file=sys.stderr)
        return 2
    keep_freed_memory()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    # the choice holds for this command only (main also runs inside tests)
    with environ(**({gpu_carry.ENV: cfg.gpu_carry} if cfg.gpu_carry else {})):
        _run(cfg, shapes)
    return 0


def _run(cfg: BenchCoreConfig, shapes: list[tuple[int, int, int, int]]) -> None:
    copy_gbs = bandwidth.copy_bandwidth_gbs(cfg.device, cfg.copy_mib, cfg.repeats, cfg.warmup)
    header = [
        machine_line(cfg.device),
        f"dtype {cfg.dtype}, {cfg.repeats} repeats (median), "
        + ("input requires grad" if cfg.input_grad else "input without grad"),
        f"copy bandwidth (read + write, {cfg.copy_mib} MiB): {copy_gbs:.0f} GB/s",
    ]
    if cfg.device.startswith("cuda"):
        header.insert(1, bandwidth.gpu_line(cfg.device))
    print("\n".join(header))
    rows = []
    for shape in shapes:
        rows.append(bench_shape(shape, cfg, copy_gbs))
        print(format_rows(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(format_rows(rows))
    if cfg.json_out:
        with open(cfg.json_out, "w") as fh:
            json.dump([asdict(r) | {"ratio": r.ratio} for r in rows], fh, indent=1)
    if cfg.table_out:
        with open(cfg.table_out, "w") as fh:
            fh.write("\n".join(header) + "\n\n" + format_rows(rows) + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
