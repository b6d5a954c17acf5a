"""QRC(lambda) for K independent agents in lockstep, recurrent cores trained by exact RTRL.

The value-based streaming algorithm Farr et al. 2026 ran on MemoryChain: Q-learning with
gradient correction (QRC: TDC with a regularised secondary estimate h; Patterson, White and
White 2022, "A generalized projected Bellman error for off-policy value estimation in RL")
with eligibility traces, epsilon-greedy behaviour, and a recurrent core between the MLP and
the heads. One stream per agent, batch 1, an update every step, no replay
(docs/rules/stream.md, "QRC(lambda)").

Per agent and step t (s_t the normalised observation, r_t the scaled reward, a_t the action
taken, a* = argmax_a Q(s'_t, a), b_t = gamma (1 - terminated_t)):

    delta_t = r_t + b_t Q(s'_t, a*) - Q(s_t, a_t)     s'_t: the next observation (the final one
              of the episode when it was truncated: it bootstraps; a terminal step does not)
    z_q <- gamma lambda z_q + grad Q(s_t, a_t)         (K, Pq)
    z_h <- gamma lambda z_h + grad h(s_t, a_t)         (K, Ph)
    z_b <- gamma lambda z_b + h(s_t, a_t)              (K,)   the trace of h's values
    theta_q <- theta_q + alpha   [delta_t z_q - z_b grad delta_t - h(s_t, a_t) grad Q(s_t, a_t)]
               grad delta_t = b_t grad Q(s'_t, a*) - grad Q(s_t, a_t)
    theta_h <- theta_h + alpha_h [delta_t z_h - h(s_t, a_t) grad h(s_t, a_t) - beta theta_h]
    after the update, where the episode ended or a_t was a non-greedy exploratory action:
    z_q, z_h, z_b <- 0 (and at an episode's end the core states and the reward scaling's
    return reset).

With lambda = 0 this is QRC: theta_q += alpha [delta grad Q - gamma h grad Q(s', a*)],
theta_h += alpha_h [(delta - h) grad h - beta theta_h]. The form, the traces, the cut and the
optimiser (plain SGD, no step-size bound) are the anchor's (recurrent-streaming-rl,
src/algorithms/qrc/qrc.py `_update`; config/algorithm/qrc.yaml; its bsuite recipe
src/recipes/qrc_bsuite.py): the cut is applied after the update of the step whose action was
non-greedy (Elsayed et al.'s stream Q(lambda) cuts so too; Watkins' Q(lambda) would cut
before adding that step's gradient).

Networks (Q and h: separate, as the anchor's q_network and h_network): an MLP (sparse init,
LayerNorm without affine parameters, leaky ReLU) -> a stacked recurrent core -> a linear head
of |A| values. Through an exact-RTRL core grad Q(s_t, a_t), grad Q(s'_t, a*) and
grad h(s_t, a_t) carry through the stream's whole past; Q(s'_t, .) is a core step from the
state after s_t (the next step recomputes it with the updated weights).

Discrete actions only. All state is (K, ...) tensors, each network's parameters one flat
(K, P) leaf (r2ac/rl/learning/stream.py's StackedNet); the epsilon-greedy draws are the
counter hash of (agent seed, step), so K agents together equal K runs alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from r2ac.envs.spaces import ActionSpace
from r2ac.errors import ConfigError
from r2ac.rl.learning.stream import (
    RewardScaler,
    StackedNet,
    Welford,
    detach_state,
    normalise_obs,
    trace_update,
    uniforms,
)

# ---------------------------------------------------------------- pure functions


def epsilon_at(step: int, start: float, end: float, steps: int) -> float:
    """Linear decay from start to end over `steps` steps, then end (optax.linear_schedule)."""
    if step >= steps:
        return end
    return start + (end - start) * min(step / steps, 1.0)


def epsilon_greedy(q: torch.Tensor, u: torch.Tensor, epsilon: float):
    """(actions (K,), non_greedy (K,) bool) from q (K, A) and uniforms u (K, 2): with
    probability epsilon a uniformly random action (u[:, 1]), else argmax q (the first on
    ties); non_greedy: a random action that is not the greedy one."""
    n = q.shape[-1]
    greedy = q.argmax(-1)
    random = (u[:, 1] * n).long().clamp(max=n - 1)
    explore = u[:, 0] < epsilon
    action = torch.where(explore, random, greedy)
    return action, explore & (random != greedy)


def q_td_error(reward, q_sa, q_next_max, terminated, discount: float) -> torch.Tensor:
    """delta = r + gamma (1 - terminated) max_a Q(s', a) - Q(s, a): all (K,)."""
    return reward + discount * q_next_max * (~terminated).to(q_sa.dtype) - q_sa


class QRCTraces(NamedTuple):
    z_q: torch.Tensor  # (K, Pq)
    z_h: torch.Tensor  # (K, Ph)
    z_b: torch.Tensor  # (K,) the trace of h(s, a)


def qrc_traces(traces: QRCTraces, g_q, g_h, h_sa, decay: float) -> QRCTraces:
    """z <- decay z + g for the three traces, in place (decay = gamma lambda)."""
    trace_update(traces.z_q, g_q, decay)
    trace_update(traces.z_h, g_h, decay)
    traces.z_b.mul_(decay).add_(h_sa)
    return traces


def qrc_directions(delta, traces: QRCTraces, g_q, g_next, g_h, h_sa, bootstrap, theta_h, beta):
    """The ascent directions (K, Pq), (K, Ph) of QRC(lambda), for traces that already hold
    this step's gradients:

        d_q = delta z_q - z_b grad delta - h grad Q(s, a),  grad delta = bootstrap grad Q(s', a*) - grad Q(s, a)
        d_h = delta z_h - h grad h(s, a) - beta theta_h

    delta, h_sa, bootstrap (= gamma (1 - terminated)): (K,); g_q, g_next: (K, Pq); g_h,
    theta_h: (K, Ph)."""
    col = lambda v: v.unsqueeze(1)  # noqa: E731  (K,) -> (K, 1)
    grad_delta = col(bootstrap) * g_next - g_q
    d_q = col(delta) * traces.z_q - col(traces.z_b) * grad_delta - col(h_sa) * g_q
    d_h = col(delta) * traces.z_h - col(h_sa) * g_h - beta * theta_h
    return d_q, d_h


def cut_traces(traces: QRCTraces, cut: torch.Tensor) -> None:
    """Zero the traces of the agents where cut (K,) bool (an episode's end, a non-greedy action)."""
    keep = (~cut).to(traces.z_q.dtype)
    traces.z_q.mul_(keep.unsqueeze(1))
    traces.z_h.mul_(keep.unsqueeze(1))
    traces.z_b.mul_(keep)


# ---------------------------------------------------------------- the agents


@dataclass(frozen=True)
class QRCSettings:
    discount: float = 0.99
    trace_lambda: float = 0.95
    lr: float = 1e-4  # SGD step of the Q network
    h_lr: float = 1e-5  # SGD step of the h network
    beta: float = 1.0  # the regulariser of h
    epsilon_start: float = 1.0
    epsilon_end: float = 0.01
    epsilon_steps: int = 50_000  # steps of the linear decay


class QStepInfo(NamedTuple):
    """What one lockstep step gives the loop (all (K,))."""

    delta: torch.Tensor
    value: torch.Tensor  # Q(s, a)
    epsilon: torch.Tensor
    h: torch.Tensor  # h(s, a)
    non_greedy: torch.Tensor  # 1.0 where the action was a non-greedy exploratory one


class StreamQRC:
    """K QRC(lambda) agents in lockstep: Q and h networks, traces, normalisers, core states.

    Use as StreamAC: `agent.observe_first(raw_obs)`; then per step `action = agent.act()`,
    the env step, `agent.learn(reward, next_obs, final_obs, terminated, truncated)`."""

    def __init__(
        self,
        make_core,
        space: ActionSpace,
        obs_size: int,
        seeds: list[int],
        settings: QRCSettings,
        mlp: tuple[int, ...] = (128,),
        dtype: torch.dtype = torch.float32,
        top: tuple[int, ...] = (),
    ):
        """make_core(num_agents, input_size) -> a stacked core; `top`: the widths of the
        layers between the core and the heads."""
        check_q_space(space)
        self.space, self.settings, self.dtype = space, settings, dtype
        self.k, self.obs_size = len(seeds), obs_size
        self.num_actions = int(space.nvec[0])
        self.seeds = np.asarray(seeds, dtype=np.uint64)
        feat = mlp[-1] if mlp else obs_size
        self.q_net = StackedNet(make_core(self.k, feat), obs_size, mlp, self.num_actions, top=top)
        self.h_net = StackedNet(make_core(self.k, feat), obs_size, mlp, self.num_actions, top=top)
        generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.theta_q = self.q_net.init(generators, dtype).requires_grad_()
        self.theta_h = self.h_net.init(generators, dtype).requires_grad_()
        self.traces = QRCTraces(
            torch.zeros_like(self.theta_q, requires_grad=False),
            torch.zeros_like(self.theta_h, requires_grad=False),
            torch.zeros(self.k, dtype=dtype),
        )
        self.state_q = self.q_net.core.initial_state()
        self.state_h = self.h_net.core.initial_state()
        self.obs_stats = Welford.zeros(self.k, (obs_size,))
        self.rewards = RewardScaler.zeros(self.k)
        self.x = torch.zeros(self.k, obs_size, dtype=dtype)  # normalised current observation
        self.reset = torch.ones(self.k, dtype=torch.bool)
        self.steps = 0  # lockstep steps taken (the sampler's and epsilon's counter)
        self.frozen = False
        self._pending: tuple | None = None
        self.last_grads: tuple | None = None

    # -- the names the streaming runtime reads (StreamAC's: the acting net is "actor")

    @property
    def actor(self) -> StackedNet:
        return self.q_net

    @property
    def theta_a(self) -> torch.Tensor:
        return self.theta_q

    @property
    def critic(self) -> StackedNet:
        return self.h_net

    @property
    def theta_c(self) -> torch.Tensor:
        return self.theta_h

    @property
    def z_a(self) -> torch.Tensor:
        return self.traces.z_q

    @property
    def z_c(self) -> torch.Tensor:
        return self.traces.z_h

    @property
    def z_b(self) -> torch.Tensor:
        return self.traces.z_b

    def epsilon(self) -> float:
        s = self.settings
        return epsilon_at(self.steps, s.epsilon_start, s.epsilon_end, s.epsilon_steps)

    # -- observations

    def _observe(self, obs: torch.Tensor) -> torch.Tensor:
        obs = obs.to(torch.float64).reshape(self.k, -1)
        if not self.frozen:
            self.obs_stats = self.obs_stats.update(obs)
        return normalise_obs(self.obs_stats, obs).to(self.dtype)

    def observe_first(self, obs) -> None:
        self.x = self._observe(torch.as_tensor(obs))
        self.reset = torch.ones(self.k, dtype=torch.bool)

    # -- acting and learning

    def act(self, greedy: bool = False) -> torch.Tensor:
        """Actions (K,): epsilon-greedy in Q (argmax with greedy); keeps what `learn` needs
        (the graphs of Q(s_t, .) and h(s_t, .), the cores' next states)."""
        q, state_q = self.q_net.step(self.theta_q, self.x, self.state_q, self.reset)  # (K, A)
        h, state_h = self.h_net.step(self.theta_h, self.x, self.state_h, self.reset)  # (K, A)
        eps = 0.0 if greedy else self.epsilon()
        u = torch.from_numpy(uniforms(self.seeds, self.steps, 2))
        with torch.no_grad():
            action, non_greedy = epsilon_greedy(q.detach(), u, eps)
        self._pending = (q, h, action, non_greedy, eps, state_q, state_h)
        return action

    def learn(self, reward, obs, final_obs, terminated, truncated) -> QStepInfo:
        """One QRC(lambda) update from this step; then the next observation becomes current."""
        q, h, action, non_greedy, eps, state_q, state_h = self._pending
        self._pending = None
        s = self.settings
        terminated = torch.as_tensor(terminated, dtype=torch.bool)
        done = terminated | torch.as_tensor(truncated, dtype=torch.bool)
        x_next = self._observe(torch.as_tensor(obs))
        x_final = (
            normalise_obs(self.obs_stats, torch.as_tensor(final_obs).to(torch.float64))
            .reshape(self.k, -1)
            .to(self.dtype)
        )
        reward = torch.as_tensor(reward).to(torch.float64)
        scaled, self.rewards = self.rewards.scale(reward, done, s.discount)
        # Q(s', .) through the core from the state after s_t (its sensitivities included)
        no_reset = torch.zeros(self.k, dtype=torch.bool)
        q_next, _ = self.q_net.step(self.theta_q, x_final, state_q, no_reset)  # (K, A)
        idx = action.view(-1, 1)
        q_sa = q.gather(1, idx).squeeze(1)  # (K,)
        h_sa = h.gather(1, idx).squeeze(1)  # (K,)
        q_next_max = q_next.gather(1, q_next.detach().argmax(-1, keepdim=True)).squeeze(1)
        g_q, g_h = torch.autograd.grad((q_sa.sum(), h_sa.sum()), (self.theta_q, self.theta_h))
        (g_next,) = torch.autograd.grad(q_next_max.sum(), self.theta_q)
        self.last_grads = (g_q, g_h, g_next)  # this step's gradients (tests read them)
        with torch.no_grad():
            q_sa, h_sa, q_next_max = q_sa.detach(), h_sa.detach(), q_next_max.detach()
            delta = q_td_error(scaled.to(self.dtype), q_sa, q_next_max, terminated, s.discount)
            bootstrap = s.discount * (~terminated).to(self.dtype)
            qrc_traces(self.traces, g_q, g_h, h_sa, s.discount * s.trace_lambda)
            d_q, d_h = qrc_directions(
                delta, self.traces, g_q, g_next, g_h, h_sa, bootstrap, self.theta_h, s.beta
            )
            if not self.frozen:
                self.theta_q.add_(d_q, alpha=s.lr)
                self.theta_h.add_(d_h, alpha=s.h_lr)
                self.q_net.project_(self.theta_q)
                self.h_net.project_(self.theta_h)
            cut_traces(self.traces, done | non_greedy)
        self.state_q, self.state_h = detach_state(state_q), detach_state(state_h)
        self.x, self.reset = x_next, done
        self.steps += 1
        eps_t = torch.full((self.k,), eps, dtype=self.dtype)
        return QStepInfo(delta, q_sa, eps_t, h_sa, non_greedy.to(self.dtype))

    def advance(self, obs, done) -> None:
        """Evaluation: no learning; the next observation becomes current (stats frozen)."""
        self._pending = None
        self.x = normalise_obs(self.obs_stats, torch.as_tensor(obs).to(torch.float64)).to(
            self.dtype
        )
        self.reset = torch.as_tensor(done, dtype=torch.bool)

    # -- checkpoints (the keys of StreamAC's where they mean the same: actor = Q, critic = h)

    def state_dict(self) -> dict[str, Any]:
        return {
            "theta_actor": self.theta_q.detach().clone(),
            "theta_critic": self.theta_h.detach().clone(),
            "trace_actor": self.traces.z_q.clone(),
            "trace_critic": self.traces.z_h.clone(),
            "trace_h_value": self.traces.z_b.clone(),
            "core_actor": list(self.state_q),
            "core_critic": list(self.state_h),
            "obs_stats": list(self.obs_stats),
            "reward_stats": list(self.rewards.stats),
            "reward_return": self.rewards.ret.clone(),
            "x": self.x.clone(),
            "reset": self.reset.clone(),
            "steps": self.steps,
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        with torch.no_grad():
            self.theta_q.copy_(d["theta_actor"])
            self.theta_h.copy_(d["theta_critic"])
        self.traces.z_q.copy_(d["trace_actor"])
        self.traces.z_h.copy_(d["trace_critic"])
        self.traces.z_b.copy_(d["trace_h_value"])
        self.state_q = type(self.state_q)(*d["core_actor"])
        self.state_h = type(self.state_h)(*d["core_critic"])
        self.obs_stats = Welford(*d["obs_stats"])
        self.rewards = RewardScaler(Welford(*d["reward_stats"]), d["reward_return"])
        self.x, self.reset, self.steps = d["x"], d["reset"], int(d["steps"])

    def weights(self) -> dict[str, torch.Tensor]:
        """The agents' weights and normalisers by name (agent.pt): (K, ...) tensors."""
        out = {f"q.{n}": v.detach() for n, v in self.q_net.layout.views(self.theta_q).items()}
        out.update({f"h.{n}": v.detach() for n, v in self.h_net.layout.views(self.theta_h).items()})
        out.update(obs_mean=self.obs_stats.mean, obs_var=self.obs_stats.var())
        return {k: v.contiguous().clone() for k, v in out.items()}


def check_q_space(space: ActionSpace) -> None:
    if space.kind != "discrete":
        raise ConfigError(
            f"--streaming q (QRC(lambda)): action space {space.describe()} is not supported; "
            "Discrete actions only (use --streaming ac)"
        )


def settings_from(cfg) -> QRCSettings:
    """QRCSettings from a TrainConfig: --learning-rate is Q's SGD step; epsilon decays over
    epsilon_fraction x --total-frames (each agent's steps), as the anchor's schedule over its
    total_timesteps."""
    s = cfg.stream
    return QRCSettings(
        discount=cfg.loss.discount,
        trace_lambda=s.trace_lambda,
        lr=cfg.optim.learning_rate,
        h_lr=s.h_learning_rate,
        beta=s.qrc_beta,
        epsilon_start=s.epsilon_start,
        epsilon_end=s.epsilon_end,
        epsilon_steps=int(cfg.run.total_frames * s.epsilon_fraction),
    )


def check_q_settings(s) -> None:
    """One-line ConfigError for QRC's settings out of range (s: the StreamConfig)."""
    bad = [f"{n}={v}" for n, v in (("epsilon_start", s.epsilon_start),
                                   ("epsilon_end", s.epsilon_end),
                                   ("epsilon_fraction", s.epsilon_fraction)) if not 0 <= v <= 1]  # fmt: skip
    bad += [f"{n}={v}" for n, v in (("h_learning_rate", s.h_learning_rate),
                                    ("qrc_beta", s.qrc_beta)) if not v >= 0]  # fmt: skip
    if bad:
        raise ConfigError(
            f"out of range: {', '.join(bad)} (epsilons and epsilon_fraction in [0, 1], "
            "h_learning_rate and qrc_beta >= 0)"
        )
