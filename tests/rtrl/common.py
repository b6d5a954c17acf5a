"""Constants and helpers shared by the core tests."""

import torch

F64 = torch.float64
# Segment patterns: mixed lengths with per-step (T = 1) segments in between, all T = 1, one long.
PATTERNS = [(3, 1, 5, 1, 1, 7, 4), (1,) * 12, (2, 9, 1, 6)]


def max_rel_error(got, want):
    """Largest entry-wise difference, relative to the largest entry of `want`."""
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-300))


# The calls of `act` in one segment (their lengths) and its resets: at the segment's first step,
# at a call's first step, inside a call; calls without a reset pass reset=None.
ACT_CALLS = (1, 1, 3, 1, 2)
ACT_RESETS = ((0, 0), (3, 1), (4, 2), (5, 0))


def act_segment(core, start, x, reset):
    """Act from light_state(start) call by call; returns the outputs and the traces."""
    light, ys, traces, t0 = core.light_state(start), [], [], 0
    for T in ACT_CALLS:
        r = reset[t0 : t0 + T]
        y, light, trace = core.act(x[t0 : t0 + T], light, reset=r if bool(r.any()) else None)
        ys.append(y)
        traces.append(trace)
        t0 += T
    return torch.cat(ys), light, traces
