"""The streaming agents' section of a training checkpoint, and its checks.

    payload["stream"] = {"algorithm": "stream-ac" | "stream-q", "state": agent.state_dict(),
                         "sensitivity_layout": "planes",
                         "metric_sums": (M,) float64, "metric_count": int}

The metric sums are those of the steps since the last metrics.csv row: a run stopped between two
rows and resumed writes the row that closes the interval as the uninterrupted run does.

Older checkpoints are converted on reading: the state under learner.optimizer.state (stream
AC's and QRC's alike, with a top-level sensitivity_layout), QRC's state under stream AC's keys,
the RTU's and LRU's d s / d W1 as (K, U, D, 2) pairs rather than (K, 2, U, D) planes.
"""

from __future__ import annotations

import math

import torch

from r2ac.rl.config import TrainConfig
from r2ac.rl.stream.qrc import from_older_keys
from r2ac.runs.values import ValueMismatch, check_count, check_like

# The RTU's and LRU's d s / d W1 in a checkpoint: "planes" (K, 2, U, D), the real parts then
# the imaginary ones; checkpoints without the mark hold (K, U, D, 2) pairs.
SENSITIVITY_LAYOUT = "planes"
CORE_KEYS = ("core_actor", "core_critic", "core_q", "core_h")


def section(algorithm: str, state: dict, sums: torch.Tensor, count: int) -> dict:
    return {
        "algorithm": algorithm,
        "state": state,
        "sensitivity_layout": SENSITIVITY_LAYOUT,
        "metric_sums": sums.clone(),
        "metric_count": count,
    }


def metric_sums(payload: dict, like: torch.Tensor, log_every: int) -> tuple[torch.Tensor, int]:
    """The metric sums and their count since the last row (zeros for a checkpoint without
    them); ValueMismatch naming the field for values that do not fit."""
    sec = payload.get("stream") or {}
    if "metric_sums" not in sec:
        return torch.zeros_like(like), 0
    check_like(sec["metric_sums"], like, "stream.metric_sums")
    count = check_count(sec.get("metric_count"), "stream.metric_count", 0, log_every)
    return sec["metric_sums"].clone(), count


def _is_pairs(state) -> bool:
    """A pair core's state in the older layout: three tensors, the state (K, 2, U), then the
    (K, U, D, 2) pairs."""
    return (
        isinstance(state, (list, tuple))
        and len(state) == 3
        and all(isinstance(t, torch.Tensor) for t in state)
        and state[0].dim() == 3
        and state[1].dim() == 4
        and state[1].shape[3] == 2
    )


def pair_sensitivities_as_planes(saved: dict) -> dict:
    """`saved` (an agent's state_dict) with every exact-RTRL pair core's sensitivity of the
    input map moved from (K, U, D, 2) pairs to (K, 2, U, D) planes; other cores unchanged."""
    out = dict(saved)
    for key in CORE_KEYS:
        if _is_pairs(state := saved.get(key)):
            h, sens_w, sens_v = state
            out[key] = [h, sens_w.permute(0, 3, 1, 2).contiguous(), sens_v]
    return out


def agent_state(payload: dict, algorithm: str) -> dict:
    """The agents' state_dict in `payload`, in this version's form (ValueMismatch naming the
    field when there is none, or one of another algorithm)."""
    sec = payload.get("stream")
    if sec is None:  # older: the state where the batched trainer keeps its optimiser's
        try:
            state = payload["learner"]["optimizer"]["state"]
        except (KeyError, TypeError):
            raise ValueMismatch("stream: missing (not a streaming run's checkpoint)") from None
        sec = {
            "algorithm": None,
            "state": state,
            "sensitivity_layout": payload.get("sensitivity_layout"),
        }
    if not isinstance(sec, dict) or not isinstance(sec.get("state"), dict):
        raise ValueMismatch("stream.state: missing or not a dict")
    if sec.get("algorithm") not in (None, algorithm):
        raise ValueMismatch(f"stream.algorithm: {sec['algorithm']!r}, expected {algorithm!r}")
    state = sec["state"]
    if algorithm == "stream-q" and "theta_actor" in state:
        state = from_older_keys(state)
    if sec.get("sensitivity_layout") != SENSITIVITY_LAYOUT:
        state = pair_sensitivities_as_planes(state)
    return state


def check_counters(counters: dict, steps, cfg: TrainConfig, k: int) -> None:
    """The counters within the run's bounds and consistent with the agents' step count: the
    update count equals the agents' steps, the frames K per step (ValueMismatch otherwise)."""
    total = cfg.updates_total
    steps = check_count(steps, "stream.state.steps", 0, total)
    update = check_count(counters.get("update", 0), "counters.update", 0, total)
    if update != steps:
        raise ValueMismatch(f"counters.update: {update:,}, but the agents took {steps:,} steps")
    if "frames" in counters:
        frames = check_count(counters["frames"], "counters.frames", 0)
        if frames != update * k:
            raise ValueMismatch(
                f"counters.frames: {frames:,}, expected steps x agents = {update:,} x {k} = {update * k:,}"
            )
    if "episodes" in counters:
        check_count(counters["episodes"], "counters.episodes", 0)
    for i, lag in enumerate(counters.get("lags", ())):
        if not isinstance(lag, (int, float)) or not math.isfinite(lag):
            raise ValueMismatch(f"counters.lags[{i}]: {lag!r}, expected a finite number")
    if "elapsed" in counters:
        elapsed = counters["elapsed"]
        if not isinstance(elapsed, (int, float)) or not elapsed >= 0:
            raise ValueMismatch(f"counters.elapsed: {elapsed!r}, expected a number >= 0")
