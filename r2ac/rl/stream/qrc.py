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

Discrete actions only. All state is (K, ...) tensors, the Q and h networks' parameters the two
(K, P) rows of one (2, K, P) buffer (r2ac/rl/stream/nets.py's PairBuffers: their bodies run as
one computation of 2K rows, with hand-written vector-Jacobian products, no autograd graph); the epsilon-greedy draws are the
counter hash of (agent seed, step), so K agents together equal K runs alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from r2ac.counter_hash import uniforms
from r2ac.envs.spaces import ActionSpace
from r2ac.errors import ConfigError
from r2ac.rl.stream.nets import (
    PairBuffers,
    StackedNet,
    head_backward,
    head_forward,
    mlp_backward,
    mlp_forward,
    net_parts,
    state_rows,
)
from r2ac.rl.stream.pair_agent import PairAgent

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
    traces.z_q.mul_(decay).add_(g_q)
    traces.z_h.mul_(decay).add_(g_h)
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


# checkpoints written before QRC had names of its own kept its state under stream AC's keys
OLDER_KEYS = {
    "theta_actor": "theta_q",
    "theta_critic": "theta_h",
    "trace_actor": "trace_q",
    "trace_critic": "trace_h",
    "core_actor": "core_q",
    "core_critic": "core_h",
}


def from_older_keys(saved: dict) -> dict:
    """A QRC state saved under stream AC's keys, under QRC's own."""
    return {OLDER_KEYS.get(k, k): v for k, v in saved.items()}


class StreamQRC(PairAgent):
    """K QRC(lambda) agents in lockstep: Q and h networks, traces, normalisers, core states.

    Use as StreamAC: `agent.observe_first(raw_obs)`; then per step `action = agent.act()`,
    the env step, `agent.learn(reward, next_obs, final_obs, terminated, truncated)`."""

    metric_names = ("td_abs", "q_mean", "epsilon", "h_mean", "non_greedy")

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
        self.space, self.settings = space, settings
        k, feat = len(seeds), mlp[-1] if mlp else obs_size
        self.num_actions = int(space.nvec[0])
        self.q_net = StackedNet(make_core(k, feat), obs_size, mlp, self.num_actions, top=top)
        self.h_net = StackedNet(make_core(k, feat), obs_size, mlp, self.num_actions, top=top)
        super().__init__(self.q_net, self.h_net, make_core(2 * k, feat), seeds, obs_size, dtype)
        self.traces_flat = PairBuffers(torch.zeros_like(self.params.flat), self.q_net, self.h_net)
        self.theta_q, self.theta_h = self.params.first, self.params.second
        self.g_next = torch.zeros_like(self.theta_q)  # grad Q(s', a*) (K, Pq)
        # the Q network alone, views taken once (in-place updates are seen through them)
        self._q_parts = net_parts(self.q_net, self.theta_q)
        self._g_next_parts = net_parts(self.q_net, self.g_next)
        self.traces = QRCTraces(
            self.traces_flat.first, self.traces_flat.second, torch.zeros(k, dtype=dtype)
        )

    @property
    def z_q(self) -> torch.Tensor:
        return self.traces.z_q

    @property
    def z_h(self) -> torch.Tensor:
        return self.traces.z_h

    @property
    def z_b(self) -> torch.Tensor:
        return self.traces.z_b

    def epsilon(self) -> float:
        s = self.settings
        return epsilon_at(self.steps, s.epsilon_start, s.epsilon_end, s.epsilon_steps)

    # -- the agent protocol's views (r2ac/rl/stream/protocol.py)

    def acting_net(self) -> tuple[StackedNet, torch.Tensor]:
        return self.q_net, self.theta_q

    def nets(self) -> dict[str, tuple[StackedNet, torch.Tensor]]:
        return {"q": (self.q_net, self.theta_q), "h": (self.h_net, self.theta_h)}

    def choose(self, q: torch.Tensor, u: torch.Tensor | None, greedy: bool) -> torch.Tensor:
        """Greedy: argmax Q; else epsilon-greedy at this step's epsilon (u (K, 2))."""
        if greedy:
            return q.argmax(-1)
        return epsilon_greedy(q, u, self.epsilon())[0]

    def draws(self) -> int:
        return 2

    def restart_episodes(self) -> None:
        self.traces_flat.flat.zero_()
        self.traces.z_b.zero_()

    def constant_metrics(self) -> dict[str, float]:
        return {"lr": self.settings.lr}

    # -- acting and learning

    @torch.no_grad()
    def act(self, greedy: bool = False) -> torch.Tensor:
        """Actions (K,): epsilon-greedy in Q (argmax with greedy); keeps what `learn` needs
        (both networks' forward intermediates, the cores' next states)."""
        (q, h), hid, state, saved = self.forward_bodies()  # (K, A) each
        eps = 0.0 if greedy else self.epsilon()
        u = torch.from_numpy(uniforms(self.seeds, self.steps, 2))
        action, non_greedy = epsilon_greedy(q, u, eps)
        self._pending = (q, h, action, non_greedy, eps, hid, state, saved)
        return action

    @torch.no_grad()
    def learn(self, reward, obs, final_obs, terminated, truncated) -> QStepInfo:
        """One QRC(lambda) update from this step; then the next observation becomes current."""
        q, h, action, non_greedy, eps, hid, state, saved = self._pending
        self._pending = None
        s, k = self.settings, self.k
        terminated = torch.as_tensor(np.asarray(terminated, dtype=bool).reshape(k))
        done = terminated | torch.as_tensor(np.asarray(truncated, dtype=bool).reshape(k))
        x_next = self._observe(obs)
        x_final = self._normalised(final_obs)
        scaled = torch.from_numpy(self.rewards.scale(reward, done.numpy(), s.discount))
        onehot = torch.zeros_like(q).scatter_(1, action.view(-1, 1), 1.0)  # dQ(s,a)/dQ(s,.)
        q_sa, h_sa = (q * onehot).sum(1), (h * onehot).sum(1)  # (K,)
        self.backward_bodies(hid, onehot, onehot, saved)  # grad Q(s, a), grad h(s, a)
        q_next = self._q_next(x_final, state_rows(state, 0, k))  # (K,) grad into g_next
        g_q, g_h = self.grads.first, self.grads.second
        self.last_grads = (g_q, g_h, self.g_next)  # this step's gradients (tests read them)
        delta = q_td_error(scaled.to(self.dtype), q_sa, q_next, terminated, s.discount)
        bootstrap = s.discount * (~terminated).to(self.dtype)
        qrc_traces(self.traces, g_q, g_h, h_sa, s.discount * s.trace_lambda)
        d_q, d_h = qrc_directions(
            delta, self.traces, g_q, self.g_next, g_h, h_sa, bootstrap, self.theta_h, s.beta
        )
        if not self.frozen:
            self.theta_q.add_(d_q, alpha=s.lr)
            self.theta_h.add_(d_h, alpha=s.h_lr)
            self.clamp_bounded()
        cut_traces(self.traces, done | non_greedy)
        self.state = state
        self.x, self.reset = x_next, done
        self.steps += 1
        eps_t = torch.full((k,), eps, dtype=self.dtype)
        return QStepInfo(delta, q_sa, eps_t, h_sa, non_greedy.to(self.dtype))

    def _q_next(self, x: torch.Tensor, state) -> torch.Tensor:
        """Q(s', a*) (K,), a* = argmax Q(s', .), one step of the Q network from the core state
        after s_t (its sensitivities included, no reset); its gradient into self.g_next."""
        (body, head), (g_body, g_head) = self._q_parts, self._g_next_parts
        feat, mlp_saved = mlp_forward(body.ws, body.bs, x)
        no_reset = torch.zeros(self.k, dtype=torch.bool)
        hid, _, core_saved = self.q_net.core.forward_manual(body.core, feat, state, no_reset)
        hid, top_saved = mlp_forward(body.top_ws, body.top_bs, hid)
        hid = hid.unsqueeze(1)
        q_next = head_forward(head, hid)  # (K, A)
        onehot = torch.zeros_like(q_next).scatter_(1, q_next.argmax(-1, keepdim=True), 1.0)
        g_hid = head_backward(head, g_head, hid, onehot).squeeze(1)
        g_hid = mlp_backward(body.top_ws, top_saved, g_hid, g_body.top_ws, g_body.top_bs, True)
        g_feat = self.q_net.core.backward_manual(core_saved, g_hid, g_body.core)
        mlp_backward(body.ws, mlp_saved, g_feat, g_body.ws, g_body.bs)
        return (q_next * onehot).sum(1)

    # -- checkpoints

    def state_dict(self) -> dict[str, Any]:
        core_q, core_h = self.core_states()
        return {
            "theta_q": self.theta_q.clone(),
            "theta_h": self.theta_h.clone(),
            "trace_q": self.traces.z_q.clone(),
            "trace_h": self.traces.z_h.clone(),
            "trace_h_value": self.traces.z_b.clone(),
            "core_q": core_q,
            "core_h": core_h,
            **self.shared_state(),
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.theta_q.copy_(d["theta_q"])
        self.theta_h.copy_(d["theta_h"])
        self.traces.z_q.copy_(d["trace_q"])
        self.traces.z_h.copy_(d["trace_h"])
        self.traces.z_b.copy_(d["trace_h_value"])
        self.load_shared_state(d, ("core_q", "core_h"))

    def weights(self) -> dict[str, torch.Tensor]:
        """The agents' weights and normaliser by name (agent.pt): (K, ...) tensors."""
        return self.pair_weights(("q", "h"), (self.q_net, self.h_net))


def check_q_space(space: ActionSpace) -> None:
    if space.kind != "discrete":
        raise ConfigError(
            f"stream-q (QRC(lambda)): action space {space.describe()} is not supported; "
            "Discrete actions only (use stream-ac)"
        )
