"""A copy run's checkpoint: what it holds, when it may be continued, how it is saved and read.

The file is written by `r2ac.runs.checkpoint` (atomic, fsynced, checksummed, read back
weights-only): config, model, optimiser, the training data's generator and the `Progress`
(curve, counters, and the training statistics since the last evaluation), so that a resumed
run continues bit-identically, whether it was saved at an evaluation or on Ctrl-C between two.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from r2ac.errors import ConfigError
from r2ac.runs import checkpoint
from r2ac.runs.schema import NUMBER, OPTIMIZER, STATE_DICT, ListOf, Opt
from r2ac.runs.values import (
    ValueMismatch,
    check_count,
    check_like,
    check_optimizer,
    check_weights,
)
from r2ac.tasks.copy.config import MAX_TRAIN_STEPS, CopyConfig
from r2ac.tasks.copy.curve import CURVE_FIELDS
from r2ac.tasks.copy.schedules import UpdateStats

CHECKPOINT_NAME = "checkpoint.pt"
# What `--resume` needs of the file (r2ac.runs.schema), checked before anything is used
COPY_CHECKPOINT = {
    "config": Opt((dict, type(None))),
    "model": STATE_DICT,
    "optimizer": OPTIMIZER,
    "generator": torch.Tensor,
    "progress": {
        "curve": ListOf(dict),
        "step": int,
        "updates": int,
        "seconds": NUMBER,
        "solved": Opt((int, type(None))),
        "window": Opt(ListOf(ListOf(NUMBER))),
    },
}
LOAD_ERRORS = (KeyError, TypeError, ValueError, IndexError, RuntimeError, AttributeError)

# Options a resumed run may change: how long and how fast it trains, and where it runs. Every
# other option defines the model, its gradient, the data stream or the test set, so changing
# it would splice two different experiments into one curve.
RESUMABLE_CHANGES = frozenset(
    {
        "train_steps",
        "lr",
        "lr_final",
        "clip",
        "eval_every",
        "stop_when_solved",
        "resume",
        "fused_step",
        "threads",
        "device",
        "out",
    }
)


@dataclass
class Progress:
    """Where a run is: the curve so far, its counters, and the batches since the last
    evaluation (whose mean the next curve row reports)."""

    curve: list[dict[str, float]] = field(default_factory=list)
    step: int = 0
    updates: int = 0
    seconds: float = 0.0
    solved: int | None = None
    window: list[UpdateStats] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {**asdict(self), "window": [list(s) for s in self.window]}

    @classmethod
    def from_dict(cls, saved: dict) -> Progress:
        """The inverse of to_dict; a checkpoint from before `window` was stored has none."""
        window = [UpdateStats(*s) for s in saved.get("window", [])]
        return cls(**{**saved, "window": window})


def resume_mismatch(saved: dict, cfg: CopyConfig) -> list[str]:
    """The options of `cfg` that differ from the checkpoint's config `saved` and may not.

    An option missing from `saved` (a checkpoint written before it existed) must be at its
    default value.
    """
    defaults = asdict(CopyConfig())
    return [
        f"--{name.replace('_', '-')} {saved.get(name, defaults[name])!r} -> {value!r}"
        for name, value in asdict(cfg).items()
        if name not in RESUMABLE_CHANGES and saved.get(name, defaults[name]) != value
    ]


def read(path: str, map_location=None) -> dict:
    """A copy-task checkpoint, its structure checked (ConfigError for anything else)."""
    try:
        return checkpoint.load(
            path, map_location=map_location, expect=COPY_CHECKPOINT, what="copy-task checkpoint"
        )
    except FileNotFoundError as exc:
        raise ConfigError(f"cannot read checkpoint {path}: {exc}") from exc


def checkpoint_config(path: str) -> dict | None:
    """The config dict stored in a copy-task checkpoint (None if it predates storing it)."""
    return read(path).get("config")


def check_resumable(saved: dict | None, cfg: CopyConfig, path: str) -> None:
    """Raise ConfigError if a checkpoint (at `path`, with config `saved`) cannot be continued
    under `cfg`. A checkpoint without a config predates storing it: only loading can tell."""
    bad = resume_mismatch(saved, cfg) if saved is not None else []
    if bad:
        raise ConfigError(
            f"--resume: {path} was trained with other options ({'; '.join(bad)}); "
            "use the same options or another --out"
        )


def save(
    path: str, cfg: CopyConfig, model, optimizer, gen: torch.Generator, progress: Progress
) -> None:
    """Write the run's state to `path` (atomic, fsynced, checksummed)."""
    state = {
        "config": asdict(cfg),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "generator": gen.get_state(),
        "progress": progress.to_dict(),
    }
    checkpoint.save_atomic(state, path)


def check_values(ck: dict, cfg: CopyConfig, model, optimizer, gen: torch.Generator) -> None:
    """ValueMismatch unless every value of a copy checkpoint fits the model and optimiser
    `cfg` builds: weights, optimiser state, generator, curve rows and counters."""
    check_weights(ck["model"], model.state_dict(), "model")
    check_optimizer(ck["optimizer"], optimizer, "optimizer")
    check_like(ck["generator"], gen.get_state(), "generator")
    p = ck["progress"]
    step = check_count(p["step"], "progress.step", 0, MAX_TRAIN_STEPS)
    check_count(p["updates"], "progress.updates", 0, MAX_TRAIN_STEPS * 2 * cfg.length)
    check_like(p["seconds"], 0.0, "progress.seconds")
    if p["seconds"] < 0:
        raise ValueMismatch(f"progress.seconds: {p['seconds']!r}, expected >= 0")
    if p.get("solved") is not None:
        check_count(p["solved"], "progress.solved", 1, step)
    for i, row in enumerate(p["curve"]):
        if set(row) != set(CURVE_FIELDS):
            raise ValueMismatch(
                f"progress.curve[{i}]: columns {sorted(map(str, row))[:10]}, expected "
                f"{', '.join(CURVE_FIELDS)}"
            )
        for key in CURVE_FIELDS:
            value = row[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueMismatch(f"progress.curve[{i}].{key}: {value!r}, expected a number")
    for i, stats in enumerate(p.get("window", [])):
        if len(stats) != len(UpdateStats._fields):
            raise ValueMismatch(
                f"progress.window[{i}]: {len(stats)} values, expected {len(UpdateStats._fields)}"
            )
    check_counters(p, cfg)
    check_adam_steps(ck["optimizer"], p["updates"])


def check_counters(p: dict, cfg: CopyConfig) -> None:
    """ValueMismatch unless the counters agree with each other: the curve's rows in order,
    the batches since its last row (the window) bringing it to `step`, and the optimiser
    steps a batch takes under the schedule (one per batch; online: 1..2 x length)."""
    steps = [check_count(r["step"], f"progress.curve[{i}].step", 0, MAX_TRAIN_STEPS)
             for i, r in enumerate(p["curve"])]  # fmt: skip
    updates = [check_count(r["updates"], f"progress.curve[{i}].updates", 0)
               for i, r in enumerate(p["curve"])]  # fmt: skip
    for name, values in (("step", steps), ("updates", updates)):
        back = [i for i in range(1, len(values)) if values[i] < values[i - 1]]
        if back:
            raise ValueMismatch(f"progress.curve[{back[0]}].{name}: below the row before it")
    step, total = p["step"], p["updates"]
    last_step, last_updates = (steps[-1], updates[-1]) if steps else (0, 0)
    if "window" in p:  # the batches since the last row: exactly those after its step
        window = p["window"]
        if step != last_step + len(window):
            raise ValueMismatch(
                f"progress.step: {step:,}, expected {last_step + len(window):,} (the last curve "
                f"row's step {last_step:,} and {len(window)} batches since)"
            )
        since = sum(
            check_count(s[2], f"progress.window[{i}].updates", 0, 2 * cfg.length)
            for i, s in enumerate(window)
        )
        if total != last_updates + since:
            raise ValueMismatch(
                f"progress.updates: {total:,}, expected {last_updates + since:,} (the last "
                f"curve row's {last_updates:,} and {since:,} since)"
            )
    elif step < last_step or total < last_updates:
        raise ValueMismatch(f"progress.step: {step:,} below the last curve row's {last_step:,}")
    low, high = (step, step * 2 * cfg.length) if cfg.online else (step, step)
    if not low <= total <= high:
        expected = f"{low:,}..{high:,}" if cfg.online else f"{step:,}, one a batch"
        raise ValueMismatch(
            f"progress.updates: {total:,} after {step:,} batches, expected {expected}"
        )


def check_adam_steps(saved: dict, updates: int) -> None:
    """ValueMismatch unless every parameter's Adam step count equals the run's updates."""
    for pid, entry in saved["state"].items():
        count = entry.get("step") if isinstance(entry, dict) else None
        if count is None:
            continue
        try:
            value = float(count)
        except (TypeError, ValueError, RuntimeError):
            raise ValueMismatch(f"optimizer.state[{pid!r}].step: not a number") from None
        if value != updates:
            raise ValueMismatch(
                f"optimizer.state[{pid!r}].step: {value:g}, expected {updates:,} (progress.updates)"
            )


def load(path: str, cfg: CopyConfig, model, optimizer, gen: torch.Generator, device) -> Progress:
    """Restore model, optimiser and generator from `path` (checked against `cfg`); the run's
    Progress. ConfigError for a foreign, damaged or code-carrying file, or one whose values
    do not fit (checked before anything is restored)."""
    ck = read(path, map_location=device)  # weights-only, checksum and structure checked
    check_resumable(ck.get("config"), cfg, path)
    try:
        check_values(ck, cfg, model, optimizer, gen)
    except ValueMismatch as exc:
        raise ConfigError(f"{path}: does not fit the run's options: {exc}") from exc
    try:
        model.load_state_dict(ck["model"])
    except RuntimeError as exc:  # a checkpoint from before the config was stored in it
        raise ConfigError(f"--resume: {path} holds another model: {exc}") from exc
    try:
        optimizer.load_state_dict(ck["optimizer"])
        gen.set_state(ck["generator"])
        return Progress.from_dict(ck["progress"])
    except LOAD_ERRORS as exc:
        detail = (str(exc).strip().splitlines() or [""])[0][:160]
        raise ConfigError(
            f"{path}: malformed copy-task checkpoint ({type(exc).__name__}: {detail})"
        ) from exc
