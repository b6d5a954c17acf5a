"""`r2ac bench cores`: every core and rule, time and memory per step against N, and exactness.

Three parts, all printed as markdown tables:

1. Exactness: each core's gradient over several segments with random resets against a slow
   reference (r2ac.rtrl.reference) in float64: full BPTT through the history for the exact
   rules (rtrl; snap1 on the eLSTM and on a feLSTM with diagonal W_f, W_z), BPTT truncated at
   segment starts for "bptt". For the feLSTM with dense W_f, W_z, SnAp-1 is an approximation:
   the cosine of its recurrent-parameter gradient with the exact one (and truncated BPTT's).
2. Scaling: per core, the time of one step (a T = 1 segment: forward, backward and the
   sensitivity carry, i.e. fully online learning) and its memory, against N at fixed D and B:
   the carried state per stream (analytic) and the peak memory growth of the step (measured:
   r2ac.perf.peak_memory_mib, in a fresh process on CPU).
   A log-log plot shows Elman/RTRL's N^4 against the O(N D) per-step cost of the others.
3. Hybrid vs per-step full RTRL for the Elman RNN: one segment of T steps with the hybrid
   BPTT-RTRL carry (one O(N^4) product per segment) against T online steps (one per step).
4. Segments, rtrl against bptt: for each core kind with both rules (by default the eLSTM, RTU
   and LRU), one segment of T steps (forward, backward, carry) at the eLSTM's R2AC shapes,
   both rules timed alternately in one loop; the ratio is time_bptt / time_rtrl.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field

import torch
import tyro
from torch.utils import _pytree as pytree

from r2ac.bench.core import DTYPES, machine_line, segment_fn, time_alternating
from r2ac.bench.options import MAX_REPEATS, MAX_THREADS, check_count
from r2ac.bench.probe import ProbeError, run_fresh_rows
from r2ac.errors import ConfigError, check_writable
from r2ac.perf import keep_freed_memory, peak_memory_mib, return_freed_memory_at_once
from r2ac.rtrl import core_names, make_core
from r2ac.rtrl import elman as el
from r2ac.rtrl.gradcheck import check_gradients, layer_gradients, make_problem, reference_gradients
from r2ac.rtrl.reference import (
    elman_reference,
    elstm_reference,
    felstm_reference,
    fwp_reference,
    gru_reference,
    lru_reference,
    lstm_reference,
    mingru_reference,
    rtu_reference,
)

REFERENCES = {
    "elstm": elstm_reference,
    "felstm": felstm_reference,
    "fwp": fwp_reference,
    "elman": elman_reference,
    "lstm": lstm_reference,
}
REFERENCES.update(rtu=rtu_reference, lru=lru_reference, mingru=mingru_reference, gru=gru_reference)
RECURRENT = ("F", "Z", "W_f", "W_z", "b_f", "b_z")  # the feLSTM parameters SnAp-1 approximates


@dataclass(frozen=True)
class BenchCoresConfig:
    """Options of `r2ac bench cores`."""

    cores: tuple[str, ...] = tuple(core_names())
    """Core names (see r2ac.rtrl.core_names())."""
    sizes: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    """Hidden sizes N for the scaling part."""
    input_size: int = 64
    """Input size D for the scaling part."""
    batch_size: int = 16
    """Streams B for the scaling part."""
    elman_rtrl_max_n: int = 128
    """Largest N timed for elman-rtrl (its step is O(N^4))."""
    hybrid_sizes: tuple[int, ...] = (32, 64)
    """N for the hybrid vs per-step Elman comparison (D = input_size // 2, B = batch_size // 2)."""
    hybrid_lengths: tuple[int, ...] = (10, 50)
    """Segment lengths T for the hybrid vs per-step Elman comparison."""
    segment_shapes: tuple[str, ...] = ("50,32,256,257",)
    """Shapes T,B,N,D of the rtrl-vs-bptt segment part (empty: skip it)."""
    segment_kinds: tuple[str, ...] = ("elstm", "rtu", "lru", "mingru")
    """Core kinds timed in the segment part (each needs both `-rtrl` and `-bptt` in cores)."""
    repeats: int = 5
    """Timed repeats (medians are reported)."""
    warmup: int = 2
    """Untimed repeats before timing."""
    dtype: str = "float32"
    """float32 or float64 (the exactness part is always float64)."""
    device: str = "cpu"
    """cpu or cuda."""
    threads: int = 1
    """torch CPU threads (0: torch's default). One thread by default: a T = 1 step is a string of
    small ops, and on a shared machine extra threads mostly add synchronisation waits."""
    memory: bool = True
    """Measure the peak memory of a step (CPU: in one fresh child process)."""
    exactness: bool = True
    """Run the exactness part."""
    plot: str | None = "docs/img/cores_scaling.png"
    """Write the log-log scaling plot here (None: no plot)."""
    json_out: str | None = None
    """Write all rows as JSON to this file."""


@dataclass
class ScaleRow:
    core: str
    n: int
    ms_per_step: float
    state_kib_per_stream: float
    peak_mib: float | None = None


@dataclass
class HybridRow:
    n: int
    t: int
    ms: dict[str, float] = field(
        default_factory=dict
    )  # hybrid, per_step, carry_hybrid, carry_per_step


# ----------------------------------------------------------------------------- exactness


def exactness(names: list[str]) -> dict[str, float]:
    """Max relative gradient error per core against its reference (float64, 4 segments, resets)."""
    out = {}
    for name in names:
        kind, rule = name.split("-")
        torch.manual_seed(0)
        layer = make_core(name, 5, 4, dtype=torch.float64)
        if kind == "felstm":  # diagonal recurrence: SnAp-1 must be exact
            with torch.no_grad():
                layer.W_f.copy_(torch.diag(layer.W_f.diagonal()))
                layer.W_z.copy_(torch.diag(layer.W_z.diagonal()))
        result = check_gradients(
            layer,
            REFERENCES[kind],
            (3, 1, 7, 5),
            3,
            truncated=rule == "bptt",
            reset_prob=0.15,
            seed=1,
        )
        out[name] = result.max_rel_error
    return out


def snap1_cosine(
    segment_length: int, N: int = 32, D: int = 8, B: int = 4, steps: int = 100, seed: int = 0
):
    """Cosine of dense-feLSTM gradients (recurrent parameters) with the exact one: (snap1, bptt)."""
    grads = {}
    for rule in ("snap1", "bptt"):
        torch.manual_seed(seed)
        layer = make_core(f"felstm-{rule}", D, N, dtype=torch.float64)
        problem = make_problem(
            D, N, (segment_length,) * (steps // segment_length), B, reset_prob=0.0, seed=seed
        )
        grads[rule] = layer_gradients(layer, problem)
    exact = reference_gradients(
        felstm_reference, dict(layer.named_parameters()), problem, truncated=False
    )

    def flat(g):
        return torch.cat([g[k].flatten() for k in RECURRENT])

    def cos(a, b):
        return float(a @ b / (a.norm() * b.norm()))

    return cos(flat(grads["snap1"]), flat(exact)), cos(flat(grads["bptt"]), flat(exact))


# ----------------------------------------------------------------------------- timing


def _setup(name, N, D, B, T, dtype, device, seed=0):
    torch.manual_seed(seed)
    layer = make_core(name, D, N, dtype=dtype, device=device)
    x = torch.randn(T, B, D, dtype=dtype, device=device)
    readout = torch.randn(T, B, N, dtype=dtype, device=device)
    _, state = layer(x, layer.initial_state(B))  # a realistic, non-zero carried state
    layer.zero_grad(set_to_none=True)
    return layer, x, readout, state


def state_bytes(state) -> int:
    return sum(t.numel() * t.element_size() for t in pytree.tree_leaves(state) if t is not None)


@dataclass(frozen=True)
class PeakRow:
    """Peak memory growth of one T = 1 step of one core at one N (`peaks_probe`)."""

    core: str
    n: int
    peak_mib: float | None


def peaks_probe(points: list[list], D: int, B: int, dtype: str) -> list[PeakRow]:
    """Run in one fresh process by `peaks` (CPU): a row per (core, N) of `points`."""
    return_freed_memory_at_once()
    torch.set_num_threads(1)
    rows = []
    for name, N in points:
        setup = _setup(name, N, D, B, 1, DTYPES[dtype], "cpu")
        run = segment_fn(*setup)
        run()  # the first call allocates the autograd machinery's caches
        rows.append(PeakRow(name, N, peak_memory_mib(run, "cpu")))
        del setup, run
    return rows


def peaks(
    points: list[tuple[str, int]], cfg: BenchCoresConfig
) -> dict[tuple[str, int], float | None]:
    """Peak memory growth of one step per (core, N); on CPU in one fresh child process."""
    dtype, D, B = DTYPES[cfg.dtype], cfg.input_size, cfg.batch_size
    if cfg.device.startswith("cuda"):
        return {
            (n, N): peak_memory_mib(
                segment_fn(*_setup(n, N, D, B, 1, dtype, cfg.device)), cfg.device
            )
            for n, N in points
        }
    try:
        rows = run_fresh_rows(
            peaks_probe, PeakRow, points=[list(p) for p in points], D=D, B=B, dtype=cfg.dtype
        )
    except ProbeError as exc:
        print(f"r2ac bench cores: memory probe failed: {exc}", file=sys.stderr)
        return {}
    if [(r.core, r.n) for r in rows] != [tuple(p) for p in points]:
        raise ProbeError(f"peaks_probe answered {[(r.core, r.n) for r in rows]} for {points}")
    return {(r.core, r.n): r.peak_mib for r in rows}


def scaling(cfg: BenchCoresConfig) -> list[ScaleRow]:
    dtype, D, B = DTYPES[cfg.dtype], cfg.input_size, cfg.batch_size
    rows = []
    for name in cfg.cores:
        for N in cfg.sizes:
            if name == "elman-rtrl" and N > cfg.elman_rtrl_max_n:
                continue
            layer, x, readout, state = _setup(name, N, D, B, 1, dtype, cfg.device)
            run = segment_fn(layer, x, readout, state)
            ms = time_alternating({name: run}, cfg.repeats, cfg.warmup, cfg.device)[name]
            row = ScaleRow(name, N, ms, state_bytes(state) / B / 2**10)
            rows.append(row)
            print(
                f"  {name:<13} N={N:<4} {ms:9.3f} ms/step  state {row.state_kib_per_stream:,.1f} KiB/stream",
                file=sys.stderr,
                flush=True,
            )
            del layer, x, readout, state, run
    if cfg.memory:
        measured = peaks([(r.core, r.n) for r in rows], cfg)
        for r in rows:
            r.peak_mib = measured.get((r.core, r.n))
    return rows


def hybrid_vs_step(cfg: BenchCoresConfig) -> list[HybridRow]:
    """Elman/RTRL: one T-step segment (hybrid carry) vs T one-step segments (per-step carry)."""
    dtype, D, B = DTYPES[cfg.dtype], max(cfg.input_size // 2, 1), max(cfg.batch_size // 2, 1)
    rows = []
    for N in cfg.hybrid_sizes:
        for T in cfg.hybrid_lengths:
            layer, x, readout, state = _setup("elman-rtrl", N, D, B, T, dtype, cfg.device)

            def per_step(layer=layer, x=x, readout=readout, state=state, T=T):
                s = state
                for t in range(T):
                    y, s = layer(x[t : t + 1], s)
                    (y * readout[t : t + 1]).sum().backward()
                layer.zero_grad(set_to_none=True)

            with torch.no_grad():
                hs, hps, h = [], [], state.h  # h(t), u(t) of the segment, for the carry-only timing
                for t in range(T):
                    hps.append(h)
                    h = torch.sigmoid(x[t] @ layer.W.T + h @ layer.R.T + layer.b)
                    hs.append(h)
                h_all, u_all, R = (
                    torch.stack(hs),
                    el.inputs_u(x, torch.stack(hps)),
                    layer.R.detach(),
                )

            def carry_step_loop(sens=state.sens, h_all=h_all, u_all=u_all, R=R, T=T):
                for t in range(T):
                    sens = el.carry_step(sens, h_all[t], u_all[t], None, R)

            fns = {
                "hybrid": segment_fn(layer, x, readout, state),
                "per_step": per_step,
                "carry_hybrid": lambda s=state.sens, h=h_all, u=u_all, R=R: el.carry_segment(
                    s, h, u, None, R
                ),
                "carry_per_step": carry_step_loop,
            }
            row = HybridRow(N, T, time_alternating(fns, cfg.repeats, cfg.warmup, cfg.device))
            rows.append(row)
            print(
                f"  elman-rtrl N={N} T={T}: "
                + ", ".join(f"{k} {v:.1f} ms" for k, v in row.ms.items()),
                file=sys.stderr,
                flush=True,
            )
    return rows


def segments_rtrl_vs_bptt(cfg: BenchCoresConfig) -> list[dict]:
    """Part 4: per shape and core kind, median ms of one segment under rtrl and bptt, alternated."""
    rows = []
    for text in cfg.segment_shapes:
        T, B, N, D = (int(p) for p in text.split(","))
        for kind in cfg.segment_kinds:
            names = {rule: f"{kind}-{rule}" for rule in ("bptt", "rtrl")}
            if not set(names.values()) <= set(cfg.cores):
                continue
            fns = {
                rule: segment_fn(*_setup(name, N, D, B, T, DTYPES[cfg.dtype], cfg.device))
                for rule, name in names.items()
            }
            ms = time_alternating(fns, cfg.repeats, cfg.warmup, cfg.device)
            rows.append(
                {"core": kind, "shape": (T, B, N, D), "bptt_ms": ms["bptt"], "rtrl_ms": ms["rtrl"]}
            )
            print(
                f"  {kind} T,B,N,D={text}: bptt {ms['bptt']:.1f} ms, rtrl {ms['rtrl']:.1f} ms",
                file=sys.stderr,
                flush=True,
            )
            del fns
    return rows


def format_segments(rows: list[dict]) -> str:
    lines = [
        "| core | T, B, N, D | bptt ms | rtrl ms | rtrl/bptt speed (bptt ms / rtrl ms) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['core']} | {', '.join(map(str, r['shape']))} | {r['bptt_ms']:.1f} "
            f"| {r['rtrl_ms']:.1f} | {r['bptt_ms'] / r['rtrl_ms']:.2f}x |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- output


def format_exactness(errors: dict[str, float], cosines: dict[int, tuple[float, float]]) -> str:
    lines = ["| core | compared with | max rel. error (float64) |", "|---|---|---|"]
    for name, err in errors.items():
        kind, rule = name.split("-")
        what = (
            "BPTT truncated at segment starts"
            if rule == "bptt"
            else "full BPTT through the history"
        )
        if name == "felstm-snap1":
            what += " (diagonal W_f, W_z)"
        lines.append(f"| {name} | {what} | {err:.1e} |")
    if cosines:
        lines += [
            "",
            "| feLSTM, dense W_f, W_z (N=32, D=8, B=4, 100 steps) | cosine with exact gradient |",
            "|---|---|",
        ]
        for T, (c_snap, c_bptt) in cosines.items():
            lines.append(f"| segments of T={T}: snap1 / bptt | {c_snap:.4f} / {c_bptt:.4f} |")
    return "\n".join(lines)


def format_scaling(rows: list[ScaleRow], sizes: tuple[int, ...]) -> str:
    by_core: dict[str, dict[int, ScaleRow]] = {}
    for r in rows:
        by_core.setdefault(r.core, {})[r.n] = r
    head = (
        "| core | "
        + " | ".join(f"N={n}" for n in sizes)
        + " | state/stream at largest N | slope (time) |"
    )
    lines = [head, "|" + "---|" * (len(sizes) + 3)]
    for core, cells in by_core.items():
        times = [f"{cells[n].ms_per_step:.2f}" if n in cells else "-" for n in sizes]
        last = cells[max(cells)]
        lines.append(
            f"| {core} | "
            + " | ".join(times)
            + f" | {last.state_kib_per_stream:,.0f} KiB (N={last.n})"
            f" | {_slope([(n, c.ms_per_step) for n, c in cells.items()]):.1f} |"
        )
    lines += [
        "",
        "| core | " + " | ".join(f"N={n}" for n in sizes) + " |",
        "|" + "---|" * (len(sizes) + 1),
    ]
    for core, cells in by_core.items():
        peaks = [
            f"{cells[n].peak_mib:.1f}" if n in cells and cells[n].peak_mib is not None else "-"
            for n in sizes
        ]
        lines.append(f"| {core} | " + " | ".join(peaks) + " |")
    return "\n".join(lines)


def _slope(points: list[tuple[int, float]]) -> float:
    """Log-log slope of the two largest sizes (the asymptotic exponent of time in N)."""
    import math

    (n0, t0), (n1, t1) = sorted(points)[-2:] if len(points) > 1 else (points[0], points[0])
    return math.log(t1 / t0) / math.log(n1 / n0) if n1 != n0 else float("nan")


def format_hybrid(rows: list[HybridRow]) -> str:
    lines = [
        "| N, T | hybrid segment ms | T per-step segments ms | speed-up | carry only: hybrid / per-step ms | speed-up |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        m = r.ms
        lines.append(
            f"| {r.n}, {r.t} | {m['hybrid']:.1f} | {m['per_step']:.1f} | {m['per_step'] / m['hybrid']:.1f}x "
            f"| {m['carry_hybrid']:.1f} / {m['carry_per_step']:.1f} | {m['carry_per_step'] / m['carry_hybrid']:.1f}x |"
        )
    return "\n".join(lines)


def plot_scaling(rows: list[ScaleRow], path: str, D: int, B: int) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_core: dict[str, list[ScaleRow]] = {}
    for r in rows:
        by_core.setdefault(r.core, []).append(r)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for core, rs in by_core.items():
        style = "-" if core.endswith(("rtrl", "snap1")) else "--"
        axes[0].loglog(
            [r.n for r in rs], [r.ms_per_step for r in rs], style, marker="o", ms=3, label=core
        )
        axes[1].loglog(
            [r.n for r in rs],
            [r.state_kib_per_stream for r in rs],
            style,
            marker="o",
            ms=3,
            label=core,
        )
    ns = sorted({r.n for r in rows})
    guides = [
        (0, "ms_per_step", "elman-rtrl", 4),
        (1, "state_kib_per_stream", "elman-rtrl", 3),
        (1, "state_kib_per_stream", "elstm-rtrl", 1),
    ]
    for i, key, core, p in guides:  # slope guides through the core's last point
        if by_core.get(core):
            last = by_core[core][-1]
            axes[i].loglog(
                ns,
                [getattr(last, key) * (n / last.n) ** p for n in ns],
                ":",
                color="grey",
                lw=1,
                label=f"~N^{p}" if p > 1 else "~N (N D)",
            )
    for ax in axes:
        ax.set_xticks(ns)
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("hidden size N")
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_ylabel(f"ms per step (T=1, B={B}, D={D}, fwd+bwd+carry)")
    axes[1].set_ylabel("carried state per stream (KiB)")
    axes[0].legend(fontsize=7, ncol=2)
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle("r2ac bench cores: cost per step against N")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


MAX_SIZE = 4096  # the largest hidden size measured (the RTRL sensitivities grow as N^3)


def main(argv: list[str] | None = None) -> int:
    cfg = tyro.cli(BenchCoresConfig, args=argv, prog="r2ac bench cores", description=__doc__)
    if cfg.dtype not in DTYPES:
        print(
            f"r2ac bench cores: unknown dtype {cfg.dtype!r}; choose float32 or float64",
            file=sys.stderr,
        )
        return 2
    unknown = sorted(set(cfg.cores) - set(core_names()))
    if unknown:
        print(
            f"r2ac bench cores: unknown core(s) {unknown}; choose from {core_names()}",
            file=sys.stderr,
        )
        return 2
    try:
        if cfg.repeats < 1 or cfg.warmup < 0:
            raise ConfigError(
                f"need --repeats >= 1 and --warmup >= 0, got {cfg.repeats}, {cfg.warmup}"
            )
        check_count(cfg.repeats, "--repeats", 1, MAX_REPEATS)
        check_count(cfg.warmup, "--warmup", 0, MAX_REPEATS)
        check_count(cfg.threads, "--threads", 0, MAX_THREADS)
        for option, sizes in (("--sizes", cfg.sizes), ("--hybrid-sizes", cfg.hybrid_sizes)):
            if not sizes or not all(1 <= n <= MAX_SIZE for n in sizes):
                raise ConfigError(f"{option} must be sizes in 1..{MAX_SIZE}, got {list(sizes)}")
        if cfg.threads < 0:
            raise ConfigError(f"--threads must be >= 0 (0: torch's default), got {cfg.threads}")
        for option, path in (("--json-out", cfg.json_out), ("--plot", cfg.plot)):
            if path:
                check_writable(path, option, is_file=True)
    except ConfigError as exc:
        print(f"r2ac bench cores: {exc}", file=sys.stderr)
        return 2
    threads = torch.get_num_threads()
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    try:
        return _run(cfg)
    finally:
        torch.set_num_threads(threads)


def _run(cfg: BenchCoresConfig) -> int:
    keep_freed_memory()  # fresh mmap'd pages for every new state tensor would dominate the timings
    print(machine_line(cfg.device), f"dtype {cfg.dtype}, {cfg.repeats} repeats (median)")
    result: dict = {}
    if cfg.exactness:
        errors = exactness(list(cfg.cores))
        cosines = (
            {T: snap1_cosine(T) for T in (1, 5, 10, 50)} if "felstm-snap1" in cfg.cores else {}
        )
        result.update(exactness=errors, snap1_cosine=cosines)
        print("\n" + format_exactness(errors, cosines), flush=True)
    rows = scaling(cfg)
    print(f"\nms per step (T=1, B={cfg.batch_size}, D={cfg.input_size}) and peak MiB per step:\n")
    print(format_scaling(rows, cfg.sizes), flush=True)
    hybrid = hybrid_vs_step(cfg) if "elman-rtrl" in cfg.cores else []
    if hybrid:
        print(
            f"\nElman/RTRL, hybrid vs per-step (D={max(cfg.input_size // 2, 1)}, B={max(cfg.batch_size // 2, 1)}):\n"
        )
        print(format_hybrid(hybrid))
    segments = segments_rtrl_vs_bptt(cfg) if cfg.segment_shapes else []
    if segments:
        print(f"\nOne segment, rtrl against bptt ({cfg.repeats} repeats, medians, alternated):\n")
        print(format_segments(segments), flush=True)
    if cfg.plot and rows:
        plot_scaling(rows, cfg.plot, cfg.input_size, cfg.batch_size)
        print(f"\nplot: {cfg.plot}")
    if cfg.json_out:
        result.update(
            scaling=[asdict(r) for r in rows], hybrid=[asdict(r) for r in hybrid], segments=segments
        )
        with open(cfg.json_out, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
