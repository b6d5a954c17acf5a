"""Q(lambda) with intentional updates and Watkins's cut, for K independent agents in lockstep,
recurrent cores trained by exact RTRL or TBPTT(1) (`r2ac train stream-q --stream-optimizer
intentional`, `--preset stream-intentional-q`; docs/rules/intentional.md, "Q(lambda)").

Per agent and step t (s_t the normalised observation, r_t the scaled reward, a_t the
epsilon-greedy action, b_t = gamma (1 - terminated_t)):

    delta_t = r_t + b_t max_a Q(s'_t, a) - Q(s_t, a_t)   s'_t: the next observation (the final one
              of the episode when it was truncated); max_a Q(s'_t, a) a value only (semi-gradient),
              from the core state after s_t and the weights before this update
    z <- gamma lambda z + grad Q(s_t, a_t)              (K, P), grad through the core's whole past
    theta <- theta + step_t delta_t D^-1 z              the intentional step (intentional.py),
              one network, its delta clipped at 20 running RMS, not normalised (eta 0.5)
    then: z <- 0 where a_t was a non-greedy exploratory action (the core's state and its RTRL
    sensitivities are kept: they are the network's, not the return's), and where the episode
    ended (the core state and sensitivities reset too, at the next step).

One network (Q): there is no secondary estimate h and no gradient correction, as in the anchor's
recurrent Q(lambda) (Farr et al. 2026's `streamlet` RecurrentQLambda with its Intentional
optimiser). QRC's h network of the (2, K, P) pair buffer is allocated (StreamQRC's layout) but
never run or updated: only Q's K rows are computed, its core a K-row stacked core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from r2ac.counter_hash import uniforms
from r2ac.envs.spaces import ActionSpace
from r2ac.errors import ConfigError
from r2ac.rl.stream.intentional import Intentional
from r2ac.rl.stream.nets import (
    StackedNet,
    head_backward,
    head_forward,
    mlp_backward,
    mlp_forward,
    net_parts,
)
from r2ac.rl.stream.qrc import StreamQRC, epsilon_at, epsilon_greedy, q_td_error
from r2ac.runs.values import ValueMismatch


@dataclass(frozen=True)
class IntentionalQSettings:
    discount: float = 0.99
    trace_lambda: float = 0.8
    lr: float = 1.0  # multiplies eta (as stream AC's intentional)
    eta: float = 0.5  # the fraction of the (clipped) TD error an update removes
    epsilon_start: float = 1.0
    epsilon_end: float = 0.01
    epsilon_steps: int = 50_000


class IntentionalQInfo(NamedTuple):
    """What one lockstep step gives the loop (all (K,))."""

    delta: torch.Tensor
    value: torch.Tensor  # Q(s, a)
    epsilon: torch.Tensor
    step: torch.Tensor  # the intentional step size
    non_greedy: torch.Tensor  # 1.0 where the action was a non-greedy exploratory one


class StreamIntentionalQ(StreamQRC):
    """K Q(lambda) agents with intentional updates and Watkins's cut, in lockstep.

    Use as StreamQRC. `self.state` is the Q core's state (K rows); `z_q` the trace (K, P)."""

    metric_names = ("td_abs", "q_mean", "epsilon", "step_q", "non_greedy")

    def __init__(
        self,
        make_core,
        space: ActionSpace,
        obs_size: int,
        seeds: list[int],
        settings: IntentionalQSettings,
        mlp: tuple[int, ...] = (128,),
        dtype: torch.dtype = torch.float32,
        top: tuple[int, ...] = (),
    ):
        decay = settings.discount * settings.trace_lambda
        if not decay < 1.0:
            raise ConfigError(f"intentional updates need discount x lambda < 1, got {decay}")
        super().__init__(make_core, space, obs_size, seeds, settings, mlp, dtype, top)
        self.state = self.q_net.core.initial_state()  # (K, ...): Q's core only
        self.optimizer = Intentional(
            self.params.flat[:1], settings.lr, (settings.eta,), decay, (False,)
        )
        self._z = self.optimizer.traces[0]  # (K, P) (P: the pair buffer's, Q's own first)
        self._g_parts = net_parts(self.q_net, self.grads.first)
        self._bounded = [  # the Q core's bounded parameters (the RTU's / LRU's phase)
            (self._q_parts[0].core[name], bound)
            for name, bound in self.q_net.core.upper_bounds().items()
        ]

    @property
    def z_q(self) -> torch.Tensor:
        return self._z[:, : self.theta_q.shape[1]]

    @property
    def z_h(self) -> torch.Tensor:
        raise AttributeError("intentional Q(lambda) has no h network")

    @property
    def z_b(self) -> torch.Tensor:
        raise AttributeError("intentional Q(lambda) has no h network")

    def epsilon(self) -> float:
        s = self.settings
        return epsilon_at(self.steps, s.epsilon_start, s.epsilon_end, s.epsilon_steps)

    def nets(self) -> dict[str, tuple[StackedNet, torch.Tensor]]:
        return {"q": (self.q_net, self.theta_q)}

    def restart_episodes(self) -> None:
        self.optimizer.traces.zero_()

    def constant_metrics(self) -> dict[str, float]:
        return {"lr": self.settings.lr}

    # -- acting and learning

    @torch.no_grad()
    def act(self, greedy: bool = False) -> torch.Tensor:
        """Actions (K,): epsilon-greedy in Q (argmax with greedy); keeps what `learn` needs."""
        body, head = self._q_parts
        feat, mlp_saved = mlp_forward(body.ws, body.bs, self.x)
        hid, state, core_saved = self.q_net.core.forward_manual(
            body.core, feat, self.state, self.reset
        )
        hid, top_saved = mlp_forward(body.top_ws, body.top_bs, hid)
        hid = hid.unsqueeze(1)  # (K, 1, H') rows
        q = head_forward(head, hid)  # (K, A)
        eps = 0.0 if greedy else self.epsilon()
        u = torch.from_numpy(uniforms(self.seeds, self.steps, 2))
        action, non_greedy = epsilon_greedy(q, u, eps)
        self._pending = (q, action, non_greedy, eps, hid, state, (mlp_saved, core_saved, top_saved))
        return action

    @torch.no_grad()
    def learn(self, reward, obs, final_obs, terminated, truncated) -> IntentionalQInfo:
        """One intentional Q(lambda) update; then the cut; the next observation becomes current."""
        q, action, non_greedy, eps, hid, state, saved = self._pending
        self._pending = None
        s, k = self.settings, self.k
        terminated = torch.as_tensor(np.asarray(terminated, dtype=bool).reshape(k))
        done = terminated | torch.as_tensor(np.asarray(truncated, dtype=bool).reshape(k))
        x_next = self._observe(obs)
        x_final = self._normalised(final_obs)
        scaled = torch.from_numpy(self.rewards.scale(reward, done.numpy(), s.discount))
        onehot = torch.zeros_like(q).scatter_(1, action.view(-1, 1), 1.0)
        q_sa = (q * onehot).sum(1)
        q_next = self._q_next_value(x_final, state, saved[1])  # before the update
        self._backward_q(hid, onehot, saved)  # grad Q(s, a) into self.grads.first
        self.last_grads = (self.grads.first,)
        delta = q_td_error(scaled.to(self.dtype), q_sa, q_next, terminated, s.discount)
        step = self.optimizer.step(self.grads.flat[:1], delta, self.frozen)
        if not self.frozen:
            self.clamp_bounded()
        self.optimizer.reset_traces((done | non_greedy).numpy())  # Watkins's cut, after
        self.state = state
        self.x, self.reset = x_next, done
        self.steps += 1
        eps_t = torch.full((k,), eps, dtype=self.dtype)
        return IntentionalQInfo(delta, q_sa, eps_t, step[0], non_greedy.to(self.dtype))

    def _backward_q(self, hid, onehot, saved) -> None:
        mlp_saved, core_saved, top_saved = saved
        (body, head), (g_body, g_head) = self._q_parts, self._g_parts
        g_hid = head_backward(head, g_head, hid, onehot).squeeze(1)
        g_hid = mlp_backward(body.top_ws, top_saved, g_hid, g_body.top_ws, g_body.top_bs, True)
        g_feat = self.q_net.core.backward_manual(core_saved, g_hid, g_body.core)
        mlp_backward(body.ws, mlp_saved, g_feat, g_body.ws, g_body.bs)

    def _q_next_value(self, x: torch.Tensor, state, core_saved) -> torch.Tensor:
        """max_a Q(x, a) (K,) from the core state after s_t, no reset, no gradient."""
        body, head = self._q_parts
        feat, _ = mlp_forward(body.ws, body.bs, x)
        h = self.q_net.core.peek_manual(body.core, feat, state, core_saved, slice(0, self.k))
        h, _ = mlp_forward(body.top_ws, body.top_bs, h)
        return head_forward(head, h.unsqueeze(1)).max(-1).values

    # -- checkpoints

    def state_dict(self) -> dict[str, Any]:
        return {
            "theta_q": self.theta_q.clone(),
            "trace_q": self.z_q.clone(),
            "core_q": [t.clone() for t in self.state],
            "intentional": self.optimizer.state_dict(),
            **self.shared_state(),
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        if not isinstance(d.get("intentional"), dict):
            raise ValueMismatch("stream.state.intentional: missing (not an intentional run's)")
        self.theta_q.copy_(d["theta_q"])
        self.z_q.copy_(d["trace_q"])
        self.optimizer.load_state_dict(d["intentional"])
        self.state = type(self.state)(*(t.clone() for t in d["core_q"]))
        self.obs_stats.load(d["obs_stats"])
        self.rewards.stats.load(d["reward_stats"])
        self.rewards.ret[...] = torch.as_tensor(d["reward_return"]).numpy()
        self.x, self.reset, self.steps = d["x"], d["reset"], int(d["steps"])

    def weights(self) -> dict[str, torch.Tensor]:
        """The agents' Q weights and normaliser by name (agent.pt): (K, ...) tensors."""
        out = {f"q.{n}": v for n, v in self.q_net.layout.views(self.theta_q).items()}
        out.update(
            obs_mean=torch.from_numpy(self.obs_stats.mean),
            obs_var=torch.from_numpy(self.obs_stats.var()),
        )
        return {k: v.contiguous().clone() for k, v in out.items()}
