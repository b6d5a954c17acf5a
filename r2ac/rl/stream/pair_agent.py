"""What stream AC and QRC share: K agents in lockstep, each with two networks of one body shape
(AC: actor and critic; QRC: Q and h) whose parameters (and gradients) are the two rows of one
(2, K, P) buffer, their bodies (the layers below the core, the core, the layers above it) run
as one stacked computation of 2K rows with hand-written gradients, their heads apart; the
observation normaliser and reward scale per agent; the current observation, the reset flags and
the step counter."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from r2ac.rl.running_stats import RewardScale, RunningStats
from r2ac.rl.stream.nets import (
    PairBuffers,
    StackedNet,
    cat_states,
    head_backward,
    head_forward,
    mlp_backward,
    mlp_forward,
    state_rows,
)


def init_pair(first: StackedNet, second: StackedNet, seeds, dtype) -> torch.Tensor:
    """(2, K, P): both networks' initial weights, agent k's drawn from seeds[k] (the first's
    draws, then the second's), the shorter row zero-padded."""
    generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
    a, b = first.init(generators, dtype), second.init(generators, dtype)
    flat = torch.zeros(2, len(seeds), max(a.shape[1], b.shape[1]), dtype=dtype)
    flat[0, :, : a.shape[1]] = a
    flat[1, :, : b.shape[1]] = b
    return flat


class PairAgent:
    """The shared part of the two streaming agents; a subclass adds its heads' use, its
    update and its traces."""

    def __init__(self, first: StackedNet, second: StackedNet, body_core, seeds, obs_size, dtype):
        self.k, self.obs_size, self.dtype = len(seeds), obs_size, dtype
        self.seeds = np.asarray(seeds, dtype=np.uint64)
        self.body_core = body_core  # both bodies' cores, 2K rows: the first's, then the second's
        self.params = PairBuffers(init_pair(first, second, seeds, dtype), first, second)
        self.grads = PairBuffers(torch.zeros_like(self.params.flat), first, second)
        # the core's bounded parameters (the RTU's / LRU's phase), both nets' (2K, ...) views
        self._bounded = [
            (self.params.body[f"core.{name}"], bound)
            for name, bound in body_core.upper_bounds().items()
        ]
        self.state = body_core.initial_state()  # (2K, ...)
        self.obs_stats = RunningStats(self.k, (obs_size,))
        self.rewards = RewardScale(self.k)
        self._np_dtype = torch.empty((), dtype=dtype).numpy().dtype
        self.x = torch.zeros(self.k, obs_size, dtype=dtype)  # normalised current observation
        self.reset = torch.ones(self.k, dtype=torch.bool)
        self.steps = 0  # lockstep steps taken (the sampler's counter)
        self.frozen = False
        self._pending: tuple | None = None
        self.last_grads: tuple | None = None

    # -- observations

    def _normalised(self, obs) -> torch.Tensor:
        """The normalised observation (K, obs) at the agent's dtype (the stats as they are)."""
        obs = np.asarray(obs, dtype=np.float64).reshape(self.k, -1)
        return torch.from_numpy(self.obs_stats.normalise(obs).astype(self._np_dtype))

    def _observe(self, obs) -> torch.Tensor:
        if not self.frozen:
            self.obs_stats.update(np.asarray(obs, dtype=np.float64).reshape(self.k, -1))
        return self._normalised(obs)

    def observe_first(self, obs) -> None:
        self.x = self._observe(obs)
        self.reset = torch.ones(self.k, dtype=torch.bool)

    # -- both bodies, forward and backward

    def forward_bodies(self):
        """Both networks at the current observation: the heads' outputs (K, out) each, the
        bodies' features as (2K, 1, H') rows, the cores' next state and what the backward
        needs."""
        k, p = self.k, self.params
        body = p.parts
        x2 = torch.cat([self.x, self.x])  # (2K, obs): both networks see the same observation
        feat, mlp_saved = mlp_forward(body.ws, body.bs, x2)  # (2K, F)
        hid, state, core_saved = self.body_core.forward_manual(
            body.core, feat, self.state, torch.cat([self.reset, self.reset])
        )  # (2K, H)
        hid, top_saved = mlp_forward(body.top_ws, body.top_bs, hid)  # H' = H if no layers
        hid = hid.unsqueeze(1)  # (2K, 1, H') rows
        outs = head_forward(p.heads[0], hid[:k]), head_forward(p.heads[1], hid[k:])
        return outs, hid, state, (mlp_saved, core_saved, top_saved)

    def backward_bodies(self, hid, g_first, g_second, saved) -> None:
        """Both networks' gradients into self.grads, for dL/d(head outputs) g_first and
        g_second (K, out) each."""
        mlp_saved, core_saved, top_saved = saved
        k, p, g = self.k, self.params, self.grads
        g_hid = torch.cat(
            [
                head_backward(p.heads[0], g.heads[0], hid[:k], g_first),
                head_backward(p.heads[1], g.heads[1], hid[k:], g_second),
            ]
        ).squeeze(1)  # (2K, H')
        body, g_body = p.parts, g.parts
        g_hid = mlp_backward(body.top_ws, top_saved, g_hid, g_body.top_ws, g_body.top_bs, True)
        g_feat = self.body_core.backward_manual(core_saved, g_hid, g_body.core)
        mlp_backward(body.ws, mlp_saved, g_feat, g_body.ws, g_body.bs)

    def clamp_bounded(self) -> None:
        """The core's bounded parameters back in their domain (after an update)."""
        for view, bound in self._bounded:
            view.clamp_(max=bound)

    def finite(self) -> bool:
        return bool(torch.isfinite(self.params.flat).all())

    # -- checkpoints: the parts both agents keep alike

    def shared_state(self) -> dict[str, Any]:
        return {
            "obs_stats": [t.clone() for t in self.obs_stats.moments()],
            "reward_stats": [t.clone() for t in self.rewards.stats.moments()],
            "reward_return": torch.from_numpy(self.rewards.ret.copy()),
            "x": self.x.clone(),
            "reset": self.reset.clone(),
            "steps": self.steps,
        }

    def load_shared_state(self, d: dict[str, Any], cores: tuple[str, str]) -> None:
        """The normalisers, counters and both cores' states (saved under `cores`' keys)."""
        kind = type(self.state)
        self.state = cat_states(kind(*d[cores[0]]), kind(*d[cores[1]]))
        self.obs_stats.load(d["obs_stats"])
        self.rewards.stats.load(d["reward_stats"])
        self.rewards.ret[...] = torch.as_tensor(d["reward_return"]).numpy()
        self.x, self.reset, self.steps = d["x"], d["reset"], int(d["steps"])

    def core_states(self) -> tuple[list, list]:
        """Each network's core state (K, ...) as a list of tensors (copies)."""
        k = self.k
        return (
            [t.clone() for t in state_rows(self.state, 0, k)],
            [t.clone() for t in state_rows(self.state, k, 2 * k)],
        )

    def pair_weights(self, names: tuple[str, str], nets) -> dict[str, torch.Tensor]:
        """Both networks' weights by `name.slot` and the normaliser (agent.pt): (K, ...)."""
        out = {}
        for name, net, theta in zip(names, nets, (self.params.first, self.params.second)):
            out.update({f"{name}.{n}": v for n, v in net.layout.views(theta).items()})
        out.update(
            obs_mean=torch.from_numpy(self.obs_stats.mean),
            obs_var=torch.from_numpy(self.obs_stats.var()),
        )
        return {k: v.contiguous().clone() for k, v in out.items()}
