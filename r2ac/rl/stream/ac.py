"""Stream AC(lambda) for K independent agents in lockstep, recurrent cores trained by exact RTRL.

The learning rule of Elsayed, Vasan and Mahmood 2024 ("Streaming deep RL finally works"),
with a recurrent core between the MLP and the head as Farr et al. 2026 put one there; one
stream per agent, batch 1, an update after every step, no replay (docs/rules/stream.md).

Per agent and step t (s_t the normalised observation, r_t the scaled reward):

    delta_t = r_t + gamma (1 - terminated_t) V(s'_t) - V(s_t)     s'_t: the next observation
              (the final one of the episode when it was truncated; no bootstrap on terminal)
    z_v  <- gamma lambda z_v  + grad V(s_t)
    z_pi <- gamma lambda z_pi + grad [log pi(a_t | s_t) + c_H sign(delta_t) H(pi(. | s_t))]
    ObGD (r2ac/rl/stream/obgd.py), each network with its own kappa; or intentional updates
    (r2ac/rl/stream/intentional.py, docs/rules/intentional.md), each with its own eta
    at an episode's end (terminated or truncated): traces, core states and the discounted
    return of the reward scaling reset.

Each network (actor, critic: separate) is an MLP -> a stacked recurrent core -> a linear head
(r2ac/rl/stream/nets.py). Exact RTRL gives the gradient of the core's parameters (and of the
head's) through the stream's whole past; the MLP below the core gets its current-step
gradient only. The actor's and the critic's flat parameters (and gradients, and traces) share
one (2, K, P) buffer (PairBuffers): their bodies run as one stacked computation of 2K rows,
their heads apart. No autograd graph: every part has its hand-written vector-Jacobian product.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from r2ac.counter_hash import uniforms
from r2ac.envs.spaces import ActionSpace
from r2ac.errors import ConfigError
from r2ac.rl.model.distributions import distribution
from r2ac.rl.stream.intentional import Intentional
from r2ac.rl.stream.nets import PairBuffers, StackedNet, head_forward, mlp_forward, state_rows
from r2ac.rl.stream.obgd import ObGD
from r2ac.rl.stream.pair_agent import PairAgent
from r2ac.rl.stream.sampling import sample_actions, sample_draws
from r2ac.runs.values import ValueMismatch


def td_error(reward, value, next_value, terminated, discount: float) -> torch.Tensor:
    """delta = r + gamma (1 - terminated) V(s') - V(s); a truncated step bootstraps (its V(s')
    is that of the episode's final observation). The reference form of `StreamAC.learn`'s."""
    return reward + discount * next_value * (~terminated).to(value.dtype) - value


def categorical_grads(logits: torch.Tensor, action: torch.Tensor):
    """Entropy (K,) and d log pi(a) / d logits, d H / d logits (K, A) in closed form:
    onehot(a) - pi and -pi (log pi + H)."""
    logp = torch.log_softmax(logits, -1)
    p = logp.exp()
    entropy = -(p * logp).sum(-1)
    g_logp = torch.neg(p).scatter_add_(1, action.view(-1, 1), torch.ones_like(p[:, :1]))
    return entropy, g_logp, -p * (logp + entropy.unsqueeze(1))


def policy_grads(space: ActionSpace, params: torch.Tensor, action: torch.Tensor):
    """Entropy (K,), d log pi(a) / d params and d H / d params (K, head out): closed forms for
    a Discrete policy, autograd of the distribution for the others."""
    if space.kind == "discrete":
        return categorical_grads(params, action)
    with torch.enable_grad():
        leaf = params.detach().requires_grad_()
        dist = distribution(space, leaf)
        logp, entropy = dist.log_prob(action), dist.entropy()
        (g_logp,) = torch.autograd.grad(logp.sum(), leaf, retain_graph=True)
        (g_ent,) = torch.autograd.grad(entropy.sum(), leaf)
    return entropy.detach(), g_logp, g_ent


def check_ac_space(space: ActionSpace) -> None:
    if space.kind not in ("discrete", "multi_discrete", "multi_binary", "box"):
        raise ConfigError(f"stream AC: action space {space.describe()} is not supported")


@dataclass(frozen=True)
class StreamSettings:
    discount: float = 0.99
    trace_lambda: float = 0.8
    lr: float = 1.0
    kappa_actor: float = 3.0
    kappa_critic: float = 2.0
    entropy_cost: float = 0.01
    optimizer: str = "obgd"  # or "intentional"
    eta_actor: float = 0.05
    eta_critic: float = 0.5


def make_optimizer(flat: torch.Tensor, s: StreamSettings) -> ObGD | Intentional:
    """The update rule of `s.optimizer` over the (2, K, P) parameters (actor, critic)."""
    decay = s.discount * s.trace_lambda
    if s.optimizer == "obgd":
        return ObGD(flat, s.lr, (s.kappa_actor, s.kappa_critic), decay)
    if s.optimizer == "intentional":
        if not decay < 1.0:
            raise ConfigError(f"intentional updates need discount x lambda < 1, got {decay}")
        return Intentional(flat, s.lr, (s.eta_actor, s.eta_critic), decay, (True, False))
    raise ConfigError(f"stream AC: unknown optimizer {s.optimizer!r} (obgd or intentional)")


class StepInfo(NamedTuple):
    """What one lockstep step gives the loop (all (K,))."""

    delta: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor
    step_actor: torch.Tensor
    step_critic: torch.Tensor


class StreamAC(PairAgent):
    """K stream AC(lambda) agents in lockstep: networks, traces, normalisers, core states.

    Use: `agent.observe_first(raw_obs)`; then per step `action = agent.act()`, the env step,
    `agent.learn(reward, next_obs, final_obs, terminated, truncated)`. `theta_a`, `theta_c`,
    `z_a`, `z_c` are (K, P) views of the (2, K, P) buffers."""

    metric_names = ("td_abs", "value_mean", "entropy", "step_actor", "step_critic")

    def __init__(
        self,
        make_core,
        space: ActionSpace,
        obs_size: int,
        seeds: list[int],
        settings: StreamSettings,
        mlp: tuple[int, ...] = (128, 128),
        dtype: torch.dtype = torch.float32,
        top: tuple[int, ...] = (),
    ):
        """make_core(num_agents, input_size) -> a stacked core; `top`: the widths of the
        layers between the core and the heads."""
        check_ac_space(space)
        self.space, self.settings = space, settings
        k, feat = len(seeds), mlp[-1] if mlp else obs_size
        self.actor = StackedNet(
            make_core(k, feat), obs_size, mlp, space.head_size,
            log_std=space.dims if space.kind == "box" else 0, top=top,
        )  # fmt: skip
        self.critic = StackedNet(make_core(k, feat), obs_size, mlp, 1, top=top)
        super().__init__(self.actor, self.critic, make_core(2 * k, feat), seeds, obs_size, dtype)
        self.optimizer = make_optimizer(self.params.flat, settings)
        self.traces = PairBuffers(self.optimizer.traces, self.actor, self.critic)
        self._ones = torch.ones(k, 1, dtype=dtype)  # dV/dV, the critic head's dL/dout
        self.theta_a, self.theta_c = self.params.first, self.params.second
        self.z_a, self.z_c = self.traces.first, self.traces.second

    # -- the agent protocol's views (r2ac/rl/stream/protocol.py)

    def acting_net(self) -> tuple[StackedNet, torch.Tensor]:
        return self.actor, self.theta_a

    def nets(self) -> dict[str, tuple[StackedNet, torch.Tensor]]:
        return {"actor": (self.actor, self.theta_a), "critic": (self.critic, self.theta_c)}

    def choose(self, params: torch.Tensor, u: torch.Tensor, greedy: bool) -> torch.Tensor:
        """Actions from the acting network's output (K, out) and uniforms u (K, n)."""
        if greedy:
            return distribution(self.space, params).mode()
        return sample_actions(self.space, params, u)

    def draws(self) -> int:
        return sample_draws(self.space)

    def restart_episodes(self) -> None:
        """Fresh episodes for every agent (a backend that cannot restore its envs): no trace
        reaches across."""
        self.traces.flat.zero_()

    def constant_metrics(self) -> dict[str, float]:
        return {"lr": self.settings.lr, "entropy_cost": self.settings.entropy_cost}

    # -- acting and learning

    @torch.no_grad()
    def act(self, greedy: bool = False) -> torch.Tensor:
        """The actions (K, *action_shape) at the current observation; keeps what `learn`
        needs (both networks' forward intermediates)."""
        (params, value), hid, state, saved = self.forward_bodies()
        value = value.squeeze(-1)  # (K,)
        u = None if greedy else torch.from_numpy(uniforms(self.seeds, self.steps, self.draws()))
        action = self.choose(params, u, greedy)
        self._pending = (params, action, value, hid, state, saved)
        return action

    @torch.no_grad()
    def learn(self, reward, obs, final_obs, terminated, truncated) -> StepInfo:
        """One update from this step's TD error; then the next observation becomes current."""
        params, action, value, hid, state, saved = self._pending
        self._pending = None
        s, k = self.settings, self.k
        terminated = np.asarray(terminated, dtype=bool).reshape(k)
        done = terminated | np.asarray(truncated, dtype=bool).reshape(k)
        x_next = self._observe(obs)
        same = final_obs is obs or np.array_equal(final_obs, obs)
        x_final = x_next if same else self._normalised(final_obs)
        scaled = self.rewards.scale(reward, done, s.discount)
        v_next = self._peek_value(x_final, state, saved[1])
        # delta = r + gamma (1 - terminated) V(s') - V(s) (a truncated step bootstraps)
        bootstrap = torch.from_numpy((s.discount * ~terminated).astype(self._np_dtype))
        delta = torch.from_numpy(scaled.astype(self._np_dtype)).addcmul_(bootstrap, v_next)
        delta -= value
        # gradients: actor of log pi(a) + c_H sign(delta) H, critic of V
        entropy, g_logp, g_ent = policy_grads(self.space, params, action)
        g_params = g_logp + (s.entropy_cost * torch.sign(delta)).unsqueeze(1) * g_ent
        self.backward_bodies(hid, g_params, self._ones, saved)
        self.last_grads = (self.grads.first, self.grads.second)  # (K, P) each (tests read them)
        step = self.optimizer.step(self.grads.flat, delta, self.frozen)
        if not self.frozen:
            self.clamp_bounded()
        self.optimizer.reset_traces(done)
        self.state = state
        self.x, self.reset = x_next, torch.from_numpy(done)
        self.steps += 1
        return StepInfo(delta, value, entropy, step[0], step[1])

    def _peek_value(self, x: torch.Tensor, state, core_saved) -> torch.Tensor:
        """V(x) (K,) from the critic's next core state (no grad, no sensitivity update; the
        weights still those of this step's forward)."""
        k = self.k
        body = self.params.second_parts
        feat, _ = mlp_forward(body.ws, body.bs, x)
        rows = slice(k, 2 * k)
        h = self.body_core.peek_manual(
            body.core, feat, state_rows(state, k, 2 * k), core_saved, rows
        )
        h, _ = mlp_forward(body.top_ws, body.top_bs, h)
        return head_forward(self.params.heads[1], h.unsqueeze(1)).squeeze(-1)

    # -- checkpoints

    def state_dict(self) -> dict[str, Any]:
        core_actor, core_critic = self.core_states()
        return {
            "theta_actor": self.theta_a.clone(),
            "theta_critic": self.theta_c.clone(),
            "trace_actor": self.z_a.clone(),
            "trace_critic": self.z_c.clone(),
            "core_actor": core_actor,
            "core_critic": core_critic,
            **self.shared_state(),
            **self._optimizer_state(),
        }

    def _optimizer_state(self) -> dict[str, Any]:
        if isinstance(self.optimizer, Intentional):
            return {"intentional": self.optimizer.state_dict()}
        return {}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.theta_a.copy_(d["theta_actor"])
        self.theta_c.copy_(d["theta_critic"])
        self.z_a.copy_(d["trace_actor"])
        self.z_c.copy_(d["trace_critic"])
        self.load_shared_state(d, ("core_actor", "core_critic"))
        if isinstance(self.optimizer, Intentional):
            if not isinstance(d.get("intentional"), dict):
                raise ValueMismatch("stream.state.intentional: missing (not an intentional run's)")
            self.optimizer.load_state_dict(d["intentional"])

    def weights(self) -> dict[str, torch.Tensor]:
        """The agents' weights and normaliser by name (agent.pt): (K, ...) tensors."""
        return self.pair_weights(("actor", "critic"), (self.actor, self.critic))
