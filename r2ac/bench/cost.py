"""`r2ac bench cost`: memory and time of one R2AC learner update, TBPTT against RTRL.

The paper (Irie et al. 2024, App. B.3) trains an eLSTM agent with N = 512, B = 32 and a
frozen vision module: TBPTT needs {1.4, 2.9, 4.8, 12} GB of GPU memory for segments of
M in {10, 50, 100, 300} steps (about 0.038 M + 1 GB), so an untruncated gradient through a
1000-step episode would need > 39 GB by TBPTT, while RTRL (5 GB at M = 100) gets it at a
constant cost. This study measures the same shape with the project's real learner:

- For every core and segment length M, one `Learner.update` (unroll the agent over the M+1
  steps from the segment's carried start state, V-trace, one backward, gradient clipping,
  RMSProp) on a `Segment` of M steps and B streams, with an agent built by `make_agent` from
  the DMLab preset (core input D = 256 stem features + the clipped last reward).
- The stem is a frozen MLP over vector observations. A frozen stem runs under no_grad, so its
  activations are not kept for backward: like the frozen conv stem of the paper's DMLab
  setup, it adds forward time but no held memory, and a cheap MLP stands in for it.
- The start state is a realistic carried one, as an actor hands it over mid-episode:
  non-zero cell states and, for RTRL cores, non-zero sensitivities.

Reported per (core, M): the median update time after warm-up (the cores alternate inside one
loop, so that the noise of a shared machine hits all alike); the peak memory growth of one
update over what is already held (parameters, optimiser state, segment, carried state),
measured in a fresh process per (core, M) (CPU: peak resident set; CUDA: allocator peak);
the memory autograd holds between forward and backward (saved tensors); the carried state;
and the gradient span: M for a BPTT core (truncated at segment starts), unbounded for an
RTRL core (its sensitivities carry the whole history since the episode began).

Inside a segment the RTRL core backpropagates too, so its held memory also grows with M.
What does not grow is the price of the span: RTRL has an unbounded span at every M, for the
carried sensitivities, B N (2D + 4) floats whatever the span. (The actor's once-per-segment
sensitivity carry is not part of the learner update and is not timed here.)
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch
import tyro
from torch.utils import _pytree as pytree

from r2ac.bench.core import machine_line, saved_for_backward_mb, time_alternating
from r2ac.bench.cores import state_bytes
from r2ac.bench.options import MAX_REPEATS, MAX_THREADS, check_count
from r2ac.bench.probe import ProbeError, run_fresh
from r2ac.errors import ConfigError, check_writable
from r2ac.perf import check_memory, keep_freed_memory, peak_memory_mib
from r2ac.rl.config import TrainConfig
from r2ac.rl.config import validate as validate_train
from r2ac.rl.learning.actor import Segment
from r2ac.rl.learning.learner import Learner
from r2ac.rl.model.build import make_agent
from r2ac.rl.presets import PRESETS
from r2ac.rtrl import core_names

PROG = "r2ac bench cost"
OBS_DIM = 64  # vector observations, so that the frozen stem is a cheap MLP
STEM_HIDDEN = (256,)
UNBOUNDED = "unbounded"
EPISODE_STEPS = 1000  # the paper's untruncated span: a 1000-step episode
PAPER_LAW = "0.038*M + 1 GB of GPU memory in total"


@dataclass(frozen=True)
class CostConfig:
    """Options of `r2ac bench cost`."""

    spans: tuple[int, ...] = (10, 50, 100, 300)
    """Segment lengths M: steps per learner update (TBPTT's gradient span)."""
    cores: tuple[str, ...] = ("elstm-bptt", "elstm-rtrl")
    """Core names (see r2ac.rtrl.core_names())."""
    hidden_size: int = 512
    """Core state size N."""
    batch_size: int = 32
    """Env streams B per update."""
    input_size: int = 257
    """Core input size D: stem features + the clipped last reward (256 + 1 in the DMLab preset)."""
    num_actions: int = 15
    """Actions A of the policy head."""
    repeats: int = 5
    """Timed updates per (core, M); medians are reported."""
    warmup: int = 2
    """Untimed updates before timing."""
    memory: bool = True
    """Measure the peak memory of an update (CPU: one fresh process per core and M, ~2 s each;
    CUDA: in this process, from the allocator's peak)."""
    out: str = "runs/experiments/cost"
    """Directory for cost.json, cost.md and cost.png."""
    threads: int = 1
    """torch intra-op threads (0: torch's default, one per core). 1 by default: on a shared
    2-core box two threads stalled single updates for up to 1.8 s."""
    device: str = "cpu"
    """cpu or cuda."""


# ----------------------------------------------------------------------------- checks


def validate(cfg: CostConfig) -> CostConfig:
    """Raise ConfigError for unknown cores, spans below 1 or bad sizes; return cfg unchanged."""
    unknown = [c for c in cfg.cores if c not in core_names()]
    if not cfg.cores or unknown:
        raise ConfigError(
            f"unknown core(s) {unknown or '(none given)'}; choose from {', '.join(core_names())}"
        )
    if not cfg.spans or min(cfg.spans) < 1:
        raise ConfigError(f"spans (segment lengths M) must all be >= 1, got {list(cfg.spans)}")
    if len(set(cfg.spans)) != len(cfg.spans) or len(set(cfg.cores)) != len(cfg.cores):
        raise ConfigError("spans and cores must not repeat")
    minimum = {
        "hidden_size": 1,
        "batch_size": 1,
        "input_size": 2,
        "num_actions": 1,
        "repeats": 1,
        "warmup": 0,
        "threads": 0,
    }
    bad = [f"{k}={getattr(cfg, k)} (< {m})" for k, m in minimum.items() if getattr(cfg, k) < m]
    if bad:
        raise ConfigError(f"bad sizes: {', '.join(bad)}")
    check_count(cfg.repeats, "--repeats", 1, MAX_REPEATS)
    check_count(cfg.warmup, "--warmup", 0, MAX_REPEATS)
    check_count(cfg.threads, "--threads", 0, MAX_THREADS)
    for kind in ("json", "md", "png"):  # the report's files, probed where they will go
        check_writable(os.path.join(cfg.out, f"cost.{kind}"), "--out", is_file=True)
    if cfg.device != "cpu" and not cfg.device.startswith("cuda"):
        raise ConfigError(f"unknown device {cfg.device!r}; choose cpu or cuda")
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device cuda requested but no CUDA device is available")
    check_memory(memory_parts(cfg), "this cost study", cfg.device)
    return cfg


def memory_parts(cfg: CostConfig) -> dict[str, tuple[int, str]]:
    """Rough bytes of the largest measured update (float32), before anything is allocated:
    the weights with their optimiser state and gradient, an exact-RTRL core's sensitivities
    (up to B x N x N x (N + D) for a dense one) and the activations of the longest span."""
    n, b, d, span = cfg.hidden_size, cfg.batch_size, cfg.input_size, max(cfg.spans)
    weights = 4 * n * (n + d + 1) * 4
    return {
        "weights": (4 * weights, "--hidden-size"),
        "sensitivities": (b * n * (n + d) * 4 * 4, "--hidden-size or --batch-size"),
        "activations": (span * b * (d + 16 * n) * 4, "--spans or --batch-size"),
    }


def gradient_span(core: str, M: int) -> int | str:
    """Steps back the gradient reaches: M for TBPTT (cut at segment starts), else unbounded."""
    return M if core.endswith("-bptt") else UNBOUNDED


# ----------------------------------------------------------------------------- one update


def train_config(cfg: CostConfig, core: str, M: int) -> TrainConfig:
    """The DMLab preset (the paper's hyper-parameters) at this study's sizes, stem frozen."""
    return PRESETS["dmlab"].updated(
        core=core,
        hidden_size=cfg.hidden_size,
        stem_features=cfg.input_size - 1,
        mlp_hidden=STEM_HIDDEN,
        freeze_stem=True,
        unroll_length=M,
        batch_size=cfg.batch_size,
        num_envs=cfg.batch_size,
    )


def carried_state(agent, batch_size: int, generator: torch.Generator):
    """A non-zero start state with the structure of `agent.initial_state` (for RTRL cores:
    with sensitivities), so that the history-gradient term does real work."""

    def fill(t):
        if t is None:
            return None
        noise = torch.randn(t.shape, generator=generator, dtype=t.dtype)
        return (0.1 * noise).to(t.device)

    return pytree.tree_map(fill, agent.initial_state(batch_size))


def random_segment(
    M: int, B: int, num_actions: int, state, generator: torch.Generator, device
) -> Segment:
    """A segment of M steps inside one long episode (no resets, no episode ends): the case
    where the gradient span matters. Layout as in r2ac.rl.learning.actor."""
    g = generator
    rewards = torch.randint(-1, 2, (M, B), generator=g).float()  # (M, B)
    first = torch.randint(-1, 2, (1, B), generator=g).float()  # (1, B)
    no_end = torch.zeros(M, B, dtype=torch.bool)  # (M, B)
    seg = Segment(
        obs=torch.randn(M + 1, B, OBS_DIM, generator=g),  # (M+1, B, OBS_DIM)
        last_reward=torch.cat([first, rewards]),  # (M+1, B): r(t-1) before obs[t]
        reset=torch.zeros(M + 1, B, dtype=torch.bool),  # (M+1, B)
        actions=torch.randint(0, num_actions, (M, B), generator=g),  # (M, B)
        rewards=rewards,
        terminated=no_end,
        truncated=no_end.clone(),
        behaviour_logits=torch.randn(M, B, num_actions, generator=g),  # (M, B, A)
        final_values=torch.zeros(M, B),  # (M, B)
        last_action=torch.randint(0, num_actions, (M + 1, B), generator=g),  # (M+1, B)
        state=None,
    )
    return Segment(*(t.to(device) for t in seg[:-1]), state)


@dataclass
class UpdateCase:
    """A learner and the segment it updates on; `run()` is one real learner update."""

    learner: Learner
    segment: Segment

    def run(self) -> None:
        self.learner.update(self.segment)

    def held_before(self) -> list[torch.Tensor]:
        """Tensors that exist before the update: parameters, the segment, the carried state."""
        leaves = pytree.tree_leaves(tuple(self.segment))
        return [*self.learner.agent.parameters(), *(t for t in leaves if t is not None)]


def build_case(cfg: CostConfig, core: str, M: int, seed: int = 0) -> UpdateCase:
    torch.manual_seed(seed)
    tcfg = validate_train(train_config(cfg, core, M))
    agent = make_agent(tcfg, (OBS_DIM,), torch.float32, cfg.num_actions, load_stem=False)
    agent = agent.to(cfg.device)
    generator = torch.Generator().manual_seed(seed)
    state = carried_state(agent, cfg.batch_size, generator)
    segment = random_segment(M, cfg.batch_size, cfg.num_actions, state, generator, cfg.device)
    return UpdateCase(Learner(agent, tcfg), segment)


# ----------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class PeakRow:
    """Peak memory growth of one learner update of one core at one M (`update_peak_probe`)."""

    core: str
    M: int
    peak_mb: float | None


def peak_update_mb(cfg: CostConfig, core: str, M: int) -> float | None:
    """Peak memory growth of one update, in a fresh process (None if it could not be read)."""
    try:
        return run_fresh(update_peak_probe, PeakRow, cfg=asdict(cfg), core=core, M=M).peak_mb
    except ProbeError as exc:
        print(f"{PROG}: memory probe {core} M={M} failed: {exc}", file=sys.stderr)
        return None


def update_peak_probe(cfg: dict, core: str, M: int) -> PeakRow:
    """Run in a fresh process by peak_update_mb: the peak MB of the second update."""
    keep_freed_memory()
    config = CostConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items()})
    if config.threads:
        torch.set_num_threads(config.threads)
    case = build_case(config, core, M)
    case.run()  # the first update allocates the optimiser state and autograd's caches
    return PeakRow(core, M, peak_memory_mib(case.run, config.device))


@dataclass(frozen=True)
class CostRow:
    """One (core, M) of the study: what one learner update costs and how far its gradient
    reaches. Written to cost.json as its fields (dataclasses.asdict)."""

    core: str
    M: int
    gradient_span: int | str  # M for a BPTT core, "unbounded" for an RTRL core
    update_ms: float  # median time of one update
    peak_mb: float | None  # peak memory growth of one update (None: not measured)
    held_mb: float  # saved for backward between forward and backward
    state_mb: float  # the carried state
    segment_mb: float  # the segment's tensors

    @property
    def total_mb(self) -> float | None:
        """What one update needs beyond the segment: its peak growth plus the carried state."""
        return None if self.peak_mb is None else self.peak_mb + self.state_mb


def tensors_mb(tensors: Iterable[torch.Tensor]) -> float:
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


# ----------------------------------------------------------------------------- measurement


@contextmanager
def torch_threads(n: int):
    """Use n intra-op threads inside the block (0: leave torch's setting), then restore."""
    before = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def measure_span(cfg: CostConfig, M: int) -> list[CostRow]:
    """Rows of every core at segment length M (timings alternate the cores in one loop)."""
    cases = {core: build_case(cfg, core, M) for core in cfg.cores}
    ms = time_alternating(
        {c: case.run for c, case in cases.items()}, cfg.repeats, cfg.warmup, cfg.device
    )
    rows = [
        CostRow(
            core=core,
            M=M,
            gradient_span=gradient_span(core, M),
            update_ms=ms[core],
            peak_mb=None,
            held_mb=saved_for_backward_mb(case.run, case.held_before()),
            state_mb=state_bytes(case.segment.state) / 2**20,
            segment_mb=tensors_mb(case.segment[:-1]),
        )
        for core, case in cases.items()
    ]
    if not cfg.memory:
        return rows
    if str(cfg.device).startswith("cuda"):
        # torch's allocator peak during an update over what it held before is the update's
        # alone, whatever ran before (unlike a CPU process's resident set): no fresh process
        # (~15 s of CUDA start each) is needed. The cases have run already (the timings).
        return [
            dataclasses.replace(r, peak_mb=peak_memory_mib(cases[r.core].run, cfg.device))
            for r in rows
        ]
    del cases  # the probes run alone
    return [dataclasses.replace(r, peak_mb=peak_update_mb(cfg, r.core, M)) for r in rows]


def measure(cfg: CostConfig, log: Callable[[str], None] | None = None) -> list[CostRow]:
    """One row per (core, M): update ms, peak MB, held-for-backward MB, state MB, span."""
    keep_freed_memory()  # else every large new tensor pays fresh page faults (see r2ac.perf)
    validate(cfg)
    rows: list[CostRow] = []
    with torch_threads(cfg.threads):
        for M in cfg.spans:
            rows += measure_span(cfg, M)
            if log:
                log("\n".join(format_table(rows[-len(cfg.cores) :]).splitlines()[2:]))
    return rows


# ----------------------------------------------------------------------------- report


def linear_fit(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares (a, b) of y = a x + b; None with fewer than two distinct x."""
    if len({x for x, _ in points}) < 2:
        return None
    fit = statistics.linear_regression([x for x, _ in points], [y for _, y in points])
    return fit.slope, fit.intercept


def bptt_fits(rows: list[CostRow]) -> dict[str, dict[str, float]]:
    """Per BPTT core: peak MB = a*M + b, and its value at a 1000-step span."""
    fits = {}
    for core in dict.fromkeys(r.core for r in rows if r.core.endswith("-bptt")):
        points = [(r.M, r.peak_mb) for r in rows if r.core == core and r.peak_mb is not None]
        fit = linear_fit(points)
        if fit:
            a, b = fit
            fits[core] = {
                "a_mb_per_step": a,
                "b_mb": b,
                f"mb_at_{EPISODE_STEPS}": a * EPISODE_STEPS + b,
            }
    return fits


def _ordered(rows: list[CostRow]) -> list[CostRow]:
    order = list(dict.fromkeys(r.core for r in rows))
    return sorted(rows, key=lambda r: (order.index(r.core), r.M))


def _num(value: float | None) -> str:
    """Three significant digits or so, without exponents (MB range from KB to GB)."""
    if value is None:
        return "-"
    digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2 if abs(value) >= 1 else 3
    return f"{value:,.{digits}f}"


def format_table(rows: list[CostRow]) -> str:
    lines = [
        "| core | M | gradient span | update ms | peak MB | held-for-backward MB | state MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in _ordered(rows):
        cells = [_num(v) for v in (r.update_ms, r.peak_mb, r.held_mb, r.state_mb)]
        lines.append(f"| {r.core} | {r.M} | {r.gradient_span} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_lines(rows: list[CostRow]) -> list[str]:
    """The linear law of the BPTT rows (the paper's analogue) and what RTRL pays instead."""
    lines = []
    for core, fit in bptt_fits(rows).items():
        lines.append(
            f"- {core}: peak MB = {fit['a_mb_per_step']:.3f}*M + {fit['b_mb']:.1f} "
            f"(paper: {PAPER_LAW}); an untruncated gradient through a {EPISODE_STEPS}-step "
            f"episode by TBPTT (M = {EPISODE_STEPS}) would need about "
            f"{fit[f'mb_at_{EPISODE_STEPS}']:,.0f} MB."
        )
    bptt = {r.M: r for r in reversed(rows) if r.core.endswith("-bptt")}  # the first BPTT core's
    for core in dict.fromkeys(r.core for r in rows if r.gradient_span == UNBOUNDED):
        rs = [r for r in _ordered(rows) if r.core == core]
        line = (
            f"- {core}: gradient span unbounded at every M, for a carried state of "
            f"{_num(rs[0].state_mb)} MB whatever the span"
        )
        pairs = [
            f"M={r.M}: {_num(r.total_mb)} vs {_num(bptt[r.M].total_mb)}" for r in rs if r.M in bptt
        ]
        if pairs:
            line += "; peak + state MB against TBPTT (span M) at equal M: " + ", ".join(pairs)
        lines.append(line + ".")
    return lines


def machine_description(device: str) -> str:
    """bench core's machine line, with the CPU model and the load (the box is shared)."""
    line = machine_line(device)
    if device == "cpu":
        model = ""
        try:
            with open("/proc/cpuinfo") as fh:
                model = next(
                    (ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), ""
                )
        except OSError:
            pass
        line += f", {model or '?'} x {os.cpu_count()}, load {os.getloadavg()[0]:.1f}"
    return line


def command_line(cfg: CostConfig) -> str:
    """The `r2ac bench cost` call that reproduces `cfg` (non-default options only)."""
    parts, default = ["r2ac", "bench", "cost"], CostConfig()
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if value == getattr(default, f.name):
            continue
        name = f.name.replace("_", "-")
        if isinstance(value, bool):
            parts.append(f"--{name}" if value else f"--no-{name}")
        elif isinstance(value, tuple):
            parts += [f"--{name}", *map(str, value)]
        else:
            parts += [f"--{name}", str(value)]
    return shlex.join(parts)


def _plot_core(mem_ax, time_ax, rs: list[CostRow], color: str, fit: dict | None) -> None:
    """One core's lines: peak (solid), held for backward (dashed), the carried state of an
    RTRL core, the fit of a BPTT core; its update time on the right."""
    core = rs[0].core
    unbounded = rs[0].gradient_span == UNBOUNDED
    span = "span unbounded" if unbounded else "span = M"
    Ms = [r.M for r in rs]
    peaks = [(r.M, r.peak_mb) for r in rs if r.peak_mb is not None]
    if peaks:
        mem_ax.plot(*zip(*peaks), "-o", color=color, label=f"{core}: peak ({span})")
    mem_ax.plot(Ms, [r.held_mb for r in rs], "--x", color=color, label=f"{core}: held for backward")
    if unbounded:
        mem_ax.axhline(
            rs[0].state_mb, color=color, ls=":", lw=1, label=f"{core}: carried state (any span)"
        )
    if fit is not None:
        a, b = fit["a_mb_per_step"], fit["b_mb"]
        xs = [0, max(Ms)]
        mem_ax.plot(
            xs,
            [a * x + b for x in xs],
            ":",
            color="grey",
            lw=1,
            label=f"fit {a:.2f}*M + {b:.0f} MB",
        )
    time_ax.plot(Ms, [r.update_ms for r in rs], "-o", color=color, label=f"{core} ({span})")


def plot(rows: list[CostRow], path: str, cfg: CostConfig) -> None:
    """Left: memory against M (peak solid, held for backward dashed); right: update time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (mem_ax, time_ax) = plt.subplots(1, 2, figsize=(11, 4.5))
    fits = bptt_fits(rows)
    for i, core in enumerate(dict.fromkeys(r.core for r in rows)):
        rs = [r for r in _ordered(rows) if r.core == core]
        _plot_core(mem_ax, time_ax, rs, f"C{i}", fits.get(core))
    note = ["RTRL: span unbounded at any M", "TBPTT: span = M"]
    note += [
        f"{core} at span {EPISODE_STEPS}:\n~{fit[f'mb_at_{EPISODE_STEPS}']:,.0f} MB (fit)"
        for core, fit in fits.items()
    ]
    box = {"facecolor": "white", "alpha": 0.8, "edgecolor": "none"}
    mem_ax.text(
        0.98, 0.34, "\n".join(note), transform=mem_ax.transAxes, ha="right", va="bottom",
        fontsize=8, bbox=box,
    )  # fmt: skip
    mem_ax.set_ylabel("MB (peak growth of one update / saved tensors)")
    time_ax.set_ylabel("ms per learner update (median)")
    for ax in (mem_ax, time_ax):
        ax.set_xlabel("segment length M (steps per update)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(
        f"R2AC learner update: N={cfg.hidden_size}, B={cfg.batch_size}, "
        f"D={cfg.input_size}, frozen stem"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(rows: list[CostRow], cfg: CostConfig, out_dir: str) -> dict[str, str]:
    """Write cost.json, cost.md and cost.png into out_dir; return their paths by kind."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {kind: os.path.join(out_dir, f"cost.{kind}") for kind in ("json", "md", "png")}
    with torch_threads(cfg.threads):  # the machine line names the threads the rows ran on
        machine = machine_description(cfg.device)
    meta = {
        "machine": machine,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": command_line(cfg),
        "config": asdict(cfg),
    }
    with open(paths["json"], "w") as fh:
        json.dump(
            {**meta, "rows": [asdict(r) for r in rows], "bptt_fits": bptt_fits(rows)}, fh, indent=1
        )
        fh.write("\n")
    md = [
        f"# Cost of one R2AC learner update: {', '.join(cfg.cores)}",
        "",
        f"Command: `{meta['command']}`  ",
        f"{machine}  ",
        f"date: {meta['date']}",
        "",
        f"N = {cfg.hidden_size}, B = {cfg.batch_size}, D = {cfg.input_size}, "
        f"A = {cfg.num_actions}, frozen MLP stem on {OBS_DIM}-dim observations; medians of "
        f"{cfg.repeats} updates after {cfg.warmup} warm-up; peak MB: growth of one update in "
        "a fresh process, over the parameters, optimiser state, segment and state it holds.",
        "",
        format_table(rows),
        "",
        *summary_lines(rows),
        "",
    ]
    with open(paths["md"], "w") as fh:
        fh.write("\n".join(md))
    plot(rows, paths["png"], cfg)
    return paths


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = tyro.cli(CostConfig, args=argv, prog=PROG, description=__doc__)
    try:
        validate(cfg)
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    with torch_threads(cfg.threads):
        print(machine_description(cfg.device), flush=True)
    print(format_table([]), flush=True)
    rows = measure(cfg, log=lambda text: print(text, flush=True))
    paths = write_report(rows, cfg, cfg.out)
    print("\n" + format_table(rows) + "\n\n" + "\n".join(summary_lines(rows)))
    print(f"\nwrote {', '.join(paths.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
