"""Stream AC(lambda) for K independent agents in lockstep, recurrent cores trained by exact RTRL.

The learning rule of Elsayed, Vasan and Mahmood 2024 ("Streaming deep RL finally works"),
with a recurrent core between the MLP and the head as Farr et al. 2026 put one there; one
stream per agent, batch 1, an update after every step, no replay (docs/rules/stream.md).

Per agent and step t (s_t the normalised observation, r_t the scaled reward):

    delta_t = r_t + gamma (1 - terminated_t) V(s'_t) - V(s_t)     s'_t: the next observation
              (the final one of the episode when it was truncated; no bootstrap on terminal)
    z_v  <- gamma lambda z_v  + grad V(s_t)
    z_pi <- gamma lambda z_pi + grad [log pi(a_t | s_t) + c_H sign(delta_t) H(pi(. | s_t))]
    ObGD, for each network with its own kappa:
        M = alpha kappa max(|delta_t|, 1) ||z||_1;  theta <- theta + alpha / max(M, 1) delta_t z
    at an episode's end (terminated or truncated): traces, core states and the discounted
    return of the reward scaling reset.

Each network (actor, critic: separate) is two 128-wide layers (sparse init, LayerNorm without
affine parameters, leaky ReLU) -> a stacked recurrent core (r2ac.rtrl.stacked) -> a linear
head. Exact RTRL gives the gradient of the core's parameters (and of the head's) through the
stream's whole past; the MLP below the core gets its current-step gradient only (the core's
output is differentiable w.r.t. its input at this step only).

All state is held as (K, ...) tensors. The actor's and the critic's flat parameters (and
gradients, and traces) share one (2, K, P) buffer (PairBuffers): their bodies (MLP and core,
alike in shape) run as one stacked computation of 2K rows, their heads apart, and the trace
and ObGD updates are a few whole-buffer operations. The learner's step builds no autograd
graph: the MLP, the heads and each stacked core compute their vector-Jacobian products by
hand (mlp_backward, head_backward, core.backward_manual; the cores' equal autograd of their
step(), tests/rtrl/test_stacked_manual.py), which is what a batch-1 step costs on a CPU
(autograd's per-node overhead was most of it). Each agent's row gets its own gradient;
nothing is shared across k. The normalisers are float64 numpy arrays updated in place.

Sampling uses a counter-based hash of (agent seed, step, draw): agent k's actions depend on
its own seed and step only (K agents together equal K runs alone), and the sampler's state
is the step counter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from r2ac.counter_hash import uniforms
from r2ac.envs.spaces import ActionSpace
from r2ac.errors import ConfigError
from r2ac.rl.model.distributions import distribution

SPARSITY = 0.9  # fraction of each unit's input weights zeroed at init
OBS_EPS = 1e-8
REWARD_EPS = 1e-8


# ---------------------------------------------------------------- pure functions


def obgd_step_size(delta: torch.Tensor, trace: torch.Tensor, lr: float, kappa: float):
    """ObGD's step size per agent (K,): alpha / max(alpha kappa max(|delta|, 1) ||z||_1, 1).

    delta (K,); trace (K, P)."""
    delta_bar = delta.abs().clamp(min=1.0)
    bound = lr * kappa * delta_bar * trace.abs().sum(1)
    return lr / bound.clamp(min=1.0)


def trace_update(trace: torch.Tensor, grad: torch.Tensor, decay: float) -> torch.Tensor:
    """z <- decay z + grad, in place (decay = gamma lambda)."""
    return trace.mul_(decay).add_(grad)


def td_error(reward, value, next_value, terminated, discount: float) -> torch.Tensor:
    """delta = r + gamma (1 - terminated) V(s') - V(s); a truncated step bootstraps (its V(s')
    is that of the episode's final observation)."""
    return reward + discount * next_value * (~terminated).to(value.dtype) - value


class Welford(NamedTuple):
    """Running mean and variance per agent: count (K,), mean (K, ...), p (K, ...) (the sum of
    squared deviations). The variance is p / (count - 1), 1 before two samples."""

    count: torch.Tensor
    mean: torch.Tensor
    p: torch.Tensor

    @staticmethod
    def zeros(k: int, shape=()) -> Welford:
        z = torch.zeros((k, *shape), dtype=torch.float64)
        return Welford(torch.zeros(k, dtype=torch.float64), z, z.clone())

    def update(self, x: torch.Tensor) -> Welford:
        """With sample x (K, ...) added."""
        count = self.count + 1.0
        diff = x - self.mean
        mean = self.mean + diff / count.view(-1, *([1] * (x.dim() - 1)))
        p = self.p + diff * (x - mean)
        return Welford(count, mean, p)

    def var(self) -> torch.Tensor:
        c = self.count.view(-1, *([1] * (self.mean.dim() - 1)))
        return torch.where(c >= 2, self.p / (c - 1).clamp(min=1.0), torch.ones_like(self.p))


def normalise_obs(stats: Welford, obs: torch.Tensor) -> torch.Tensor:
    return (obs - stats.mean) / torch.sqrt(stats.var() + OBS_EPS)


class RewardScaler(NamedTuple):
    """Reward scaling by the running std of the discounted return: u <- gamma u + r, the
    stats take u, r / sqrt(var(u) + eps), u reset after an episode's end."""

    stats: Welford
    ret: torch.Tensor  # (K,) the discounted return so far

    @staticmethod
    def zeros(k: int) -> RewardScaler:
        return RewardScaler(Welford.zeros(k), torch.zeros(k, dtype=torch.float64))

    def scale(self, reward: torch.Tensor, done: torch.Tensor, discount: float):
        """(scaled reward (K,), the new scaler)."""
        ret = discount * self.ret + reward
        stats = self.stats.update(ret)
        scaled = reward / torch.sqrt(stats.var() + REWARD_EPS)
        return scaled, RewardScaler(stats, ret.masked_fill(done, 0.0))


class Stats:
    """Welford's running mean and variance as float64 numpy arrays updated in place (the
    learner's path: a few numpy ops on (K, ...) arrays, the same arithmetic as `Welford`);
    `welford()` gives them as a Welford of tensors sharing the memory."""

    def __init__(self, k: int, shape=()):
        self.count, self.mean = np.zeros(k), np.zeros((k, *shape))
        self.p = np.zeros_like(self.mean)

    def _c(self) -> np.ndarray:
        return self.count.reshape(-1, *([1] * (self.mean.ndim - 1)))

    def update(self, x: np.ndarray) -> None:
        self.count += 1.0
        diff = x - self.mean
        self.mean += diff / self._c()
        self.p += diff * (x - self.mean)

    def var(self) -> np.ndarray:
        c = self._c()
        return np.where(c >= 2, self.p / np.maximum(c - 1, 1.0), 1.0)

    def welford(self) -> Welford:
        return Welford(*(torch.from_numpy(a) for a in (self.count, self.mean, self.p)))

    def load(self, w: Welford) -> None:
        for a, t in zip((self.count, self.mean, self.p), w, strict=True):
            a[...] = torch.as_tensor(t).numpy()


# ---------------------------------------------------------------- sampling (uniforms: r2ac.counter_hash)


def sample_actions(space: ActionSpace, params: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Actions (K, *action_shape) from the head's params (K, P) and uniforms u (K, n)
    (n = sample_draws(space)), by inverse CDF; Box by Box-Muller."""
    if space.kind == "discrete":
        cdf = torch.softmax(params, -1).cumsum(-1)
        return (cdf < u[:, :1].to(cdf.dtype)).sum(-1).clamp(max=space.nvec[0] - 1)
    if space.kind == "multi_discrete":
        parts = params.split(list(space.nvec), -1)
        acts = [
            (torch.softmax(p, -1).cumsum(-1) < u[:, i : i + 1].to(p.dtype)).sum(-1).clamp(max=n - 1)
            for i, (p, n) in enumerate(zip(parts, space.nvec, strict=True))
        ]
        return torch.stack(acts, -1)
    if space.kind == "multi_binary":
        return (u[:, : space.dims].to(params.dtype) < torch.sigmoid(params)).long()
    d = space.dims
    mean, log_std = params.chunk(2, -1)
    u1, u2 = u[:, :d], u[:, d : 2 * d]
    normal = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)
    return mean + torch.exp(log_std) * normal.to(mean.dtype)


def sample_draws(space: ActionSpace) -> int:
    return 2 * space.dims if space.kind == "box" else space.dims


# ---------------------------------------------------------------- stacked networks


@dataclass(frozen=True)
class Slot:
    name: str
    shape: tuple[int, ...]  # per agent
    offset: int
    size: int


class Layout:
    """Named per-agent parameter shapes packed into one flat (K, P) tensor."""

    def __init__(self, shapes: list[tuple[str, tuple[int, ...]]]):
        self.slots, offset = [], 0
        for name, shape in shapes:
            size = math.prod(shape)
            self.slots.append(Slot(name, tuple(shape), offset, size))
            offset += size
        self.size = offset
        self.sizes = [s.size for s in self.slots]

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """name -> (K, *shape) views of flat (K, P) (by one split: its backward is one cat)."""
        k = flat.shape[0]
        parts = flat.split(self.sizes, dim=1)
        return {s.name: t.view(k, *s.shape) for s, t in zip(self.slots, parts, strict=True)}

    def pack(self, named: dict[str, torch.Tensor], k: int, dtype) -> torch.Tensor:
        flat = torch.empty(k, self.size, dtype=dtype)
        for s in self.slots:
            flat[:, s.offset : s.offset + s.size] = named[s.name].reshape(k, s.size)
        return flat


def sparse_linear(generators, fan_in: int, fan_out: int, dtype) -> torch.Tensor:
    """(K, fan_in, fan_out): U(-1/sqrt(fan_in), 1/sqrt(fan_in)), then ceil(0.9 fan_in) of each
    output unit's inputs zeroed (Elsayed et al.'s sparse init), but never all of them: with
    fan_in <= 10 (MemoryChain's 3 inputs) their rule zeroes the whole layer, which then sees
    nothing of its input; here each unit keeps one. Agent k from generators[k]."""
    bound = 1.0 / math.sqrt(fan_in)
    zeros = min(math.ceil(SPARSITY * fan_in), fan_in - 1)
    out = []
    for g in generators:
        w = (torch.rand(fan_out, fan_in, generator=g, dtype=torch.float64) * 2 - 1) * bound
        order = torch.rand(fan_out, fan_in, generator=g).argsort(dim=1)[:, :zeros]
        w.scatter_(1, order, 0.0)
        out.append(w.t())
    return torch.stack(out).to(dtype)


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x (K, I) @ w (K, I, O) + b (K, O)."""
    return torch.baddbmm(b.unsqueeze(1), x.unsqueeze(1), w).squeeze(1)


# ---------------------------------------------------------------- the hand-written gradient
# The learner's step runs without autograd: the MLP, the head and the core each compute their
# forward and their vector-Jacobian product in a few whole-tensor ops (R rows: the actor's K
# agents and the critic's K stacked), which is what a batch-1 step costs on a CPU (autograd's
# per-node overhead was most of it).

LN_EPS = 1e-5  # F.layer_norm's default
LEAK = 0.01  # F.leaky_relu's default


def mlp_forward(ws, bs, x: torch.Tensor) -> tuple[torch.Tensor, list[tuple]]:
    """x (R, I) through the layers (w (R, I, O), b (R, 1, O)): linear, LayerNorm, leaky ReLU,
    as (R, 1, width) rows (no reshapes between the ops). Returns the features (R, F) and per
    layer what `mlp_backward` needs."""
    if not ws:  # no layers (e.g. none above the core): nothing to run or keep
        return x, []
    saved, x = [], x.unsqueeze(1)
    for w, b in zip(ws, bs, strict=True):
        pre = torch.baddbmm(b, x, w)  # (R, 1, O)
        normed, mean, rstd = torch.native_layer_norm(pre, pre.shape[-1:], None, None, LN_EPS)
        saved.append((x, pre, mean, rstd, normed))
        x = F.leaky_relu(normed, LEAK)
    return x.squeeze(1), saved


def mlp_backward(ws, saved, g: torch.Tensor, g_ws, g_bs, input_grad: bool = False):
    """Writes dL/dw (R, I, O) and dL/db (R, 1, O) of every layer into g_ws, g_bs for
    dL/dfeatures = g (R, F). Returns dL/dinput (R, I) where `input_grad` (the layers above the
    core pass it on to the core), else None (the observation needs no gradient)."""
    if not ws:
        return g if input_grad else None
    g = g.unsqueeze(1)
    for i in reversed(range(len(ws))):
        x, pre, mean, rstd, normed = saved[i]
        g = torch.ops.aten.leaky_relu_backward(g, normed, LEAK, False)
        g = torch.ops.aten.native_layer_norm_backward(
            g, pre, pre.shape[-1:], mean, rstd, None, None, [True, False, False]
        )[0]  # (R, 1, O)
        torch.mul(x.transpose(1, 2), g, out=g_ws[i])
        g_bs[i].copy_(g)
        if i or input_grad:
            g = torch.bmm(g, ws[i].transpose(1, 2))  # (R, 1, I)
    return g.squeeze(1) if input_grad else None


def head_forward(p: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
    """h (K, 1, H) rows @ head.w (K, H, O) + head.b (K, 1, O), then log_std appended where
    there is one: (K, out)."""
    y = torch.baddbmm(p["head.b"], h, p["head.w"]).squeeze(1)
    return torch.cat([y, p["log_std"]], -1) if "log_std" in p else y


def head_backward(p, g_p, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Writes the head's dL/dparams into g_p for dL/dout = g (K, out); returns dL/dh as
    (K, 1, H) rows."""
    w = p["head.w"]
    n = w.shape[2]
    if "log_std" in p:
        g_p["log_std"].copy_(g[:, n:])
        g = g[:, :n]
    g = g.unsqueeze(1)  # (K, 1, O)
    torch.mul(h.transpose(1, 2), g, out=g_p["head.w"])
    g_p["head.b"].copy_(g)
    return torch.bmm(g, w.transpose(1, 2))


def categorical_grads(logits: torch.Tensor, action: torch.Tensor):
    """Entropy (K,) and d log pi(a) / d logits, d H / d logits (K, A) in closed form:
    onehot(a) - pi and -pi (log pi + H)."""
    logp = torch.log_softmax(logits, -1)
    p = logp.exp()
    entropy = -(p * logp).sum(-1)
    g_logp = torch.neg(p).scatter_add_(1, action.view(-1, 1), torch.ones_like(p[:, :1]))
    return entropy, g_logp, -p * (logp + entropy.unsqueeze(1))


class StackedNet:
    """MLP (LayerNorm, leaky ReLU) -> stacked core -> MLP -> linear head, for K agents;
    parameters are views of one flat (K, P) tensor ('mlp{i}.w', 'mlp{i}.b' below the core,
    'core.<name>', 'top{i}.w', 'top{i}.b' above it, 'head.w', 'head.b', and 'log_std' for a
    Box policy). The layers above the core are not recurrent: their gradient is exact."""

    def __init__(
        self, core, input_size: int, mlp: tuple[int, ...], out: int, log_std: int = 0,
        top: tuple[int, ...] = (),
    ):  # fmt: skip
        self.core, self.input_size, self.mlp, self.out, self.log_std = (
            core, input_size, tuple(mlp), out, log_std,
        )  # fmt: skip
        self.top = tuple(top)
        self.layout: Layout | None = None

    def init(self, generators, dtype) -> torch.Tensor:
        k = len(generators)
        named: dict[str, torch.Tensor] = {}

        def layers(prefix: str, widths: list[int]) -> None:
            for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
                named[f"{prefix}{i}.w"] = sparse_linear(generators, a, b, dtype)
                named[f"{prefix}{i}.b"] = torch.zeros(k, b, dtype=dtype)

        # drawn in this order from each agent's generator: without layers above the core the
        # default network's weights are those it always had
        layers("mlp", [self.input_size, *self.mlp])
        for name, value in self.core.init_params(generators).items():
            named[f"core.{name}"] = value.to(dtype)
        top = [self.core.output_size, *self.top]
        layers("top", top)
        named["head.w"] = sparse_linear(generators, top[-1], self.out, dtype)
        named["head.b"] = torch.zeros(k, self.out, dtype=dtype)
        if self.log_std:
            named["log_std"] = torch.zeros(k, self.log_std, dtype=dtype)
        self.layout = Layout([(n, tuple(v.shape[1:])) for n, v in named.items()])
        return self.layout.pack(named, k, dtype)

    @staticmethod
    def _layers(p: dict[str, torch.Tensor], prefix: str, depth: int, x: torch.Tensor):
        for i in range(depth):
            x = linear(x, p[f"{prefix}{i}.w"], p[f"{prefix}{i}.b"])
            x = F.leaky_relu(F.layer_norm(x, x.shape[-1:]))
        return x

    def features(self, p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return self._layers(p, "mlp", len(self.mlp), x)

    def _head(self, p, h: torch.Tensor) -> torch.Tensor:
        """The layers above the core, then the head: (K, H) -> (K, out)."""
        h = self._layers(p, "top", len(self.top), h)
        y = linear(h, p["head.w"], p["head.b"])
        if self.log_std:
            y = torch.cat([y, p["log_std"]], -1)
        return y

    def resized(self, num_agents: int) -> StackedNet:
        """The same network for another number of agents (its layout kept; evaluation runs
        one agent's weights on B streams as B agents)."""
        from r2ac.rtrl.stacked import make_stacked_core

        c = self.core
        core = make_stacked_core(c.name, num_agents, c.input_size, c.hidden_size, c.dtype)
        net = StackedNet(core, self.input_size, self.mlp, self.out, self.log_std, self.top)
        net.layout = self.layout
        return net

    def _core_params(self, p):
        return {n[5:]: v for n, v in p.items() if n.startswith("core.")}

    @torch.no_grad()
    def project_(self, flat: torch.Tensor) -> None:
        """Clamp the core's bounded parameters in `flat` (K, P), in place (after an update)."""
        p = self.layout.views(flat)
        for name, bound in self.core.upper_bounds().items():
            p[f"core.{name}"].clamp_(max=bound)

    def step(self, flat, x, state, reset):
        """Head output (K, out) differentiable w.r.t. flat, and the core's next state."""
        p = self.layout.views(flat)
        h, state = self.core.step(self._core_params(p), self.features(p, x), state, reset)
        return self._head(p, h), state

    @torch.no_grad()
    def peek(self, flat, x, state, reset):
        p = self.layout.views(flat)
        h = self.core.peek(self._core_params(p), self.features(p, x), state, reset)
        return self._head(p, h)


@dataclass(frozen=True)
class StreamSettings:
    discount: float = 0.99
    trace_lambda: float = 0.8
    lr: float = 1.0
    kappa_actor: float = 3.0
    kappa_critic: float = 2.0
    entropy_cost: float = 0.01


class StepInfo(NamedTuple):
    """What one lockstep step gives the loop (all (K,))."""

    delta: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor
    step_actor: torch.Tensor
    step_critic: torch.Tensor


class PairBuffers:
    """The actor's and the critic's flat parameters (or gradients, or traces) in one (2, K, P)
    tensor: row 0 the actor's (K, P_a), row 1 the critic's (K, P_c), P = max(P_a, P_c), the
    shorter zero-padded. Their bodies (MLP and core, laid out first and alike in both) are one
    (2K, P_body) computation: `body` maps each body name to a (2K, ...) view (actor's agents,
    then the critic's), `heads` each net's head names to (K, ...) views. All views are of
    `flat`, taken once: in-place updates of `flat` are seen through them."""

    def __init__(self, flat: torch.Tensor, actor: StackedNet, critic: StackedNet):
        self.flat = flat  # (2, K, P)
        two, k, _ = flat.shape
        body_slots = [sl for sl in actor.layout.slots if not _is_head(sl.name)]
        size = sum(sl.size for sl in body_slots)
        body = flat[:, :, :size].view(2 * k, size)  # (2K, P_body), rows strided by P
        self.body = {sl.name: _slot(body, sl) for sl in body_slots}
        self.heads = tuple(
            {sl.name: _slot(flat[i], sl) for sl in net.layout.slots if _is_head(sl.name)}
            for i, net in enumerate((actor, critic))
        )
        for head in self.heads:
            head["head.b"] = head["head.b"].unsqueeze(1)  # (K, 1, O) rows
        self.actor = flat[0, :, : actor.layout.size]  # (K, P_a)
        self.critic = flat[1, :, : critic.layout.size]  # (K, P_c)
        below, above = len(actor.mlp), len(actor.top)
        self.parts = _body_parts(self.body, below, above)  # both bodies (2K rows)
        self.critic_parts = _body_parts({n: v[k:] for n, v in self.body.items()}, below, above)


def _is_head(name: str) -> bool:
    return name.startswith("head.") or name == "log_std"


def _slot(flat: torch.Tensor, sl: Slot) -> torch.Tensor:
    return flat[:, sl.offset : sl.offset + sl.size].view(flat.shape[0], *sl.shape)


class BodyParts(NamedTuple):
    """A body's views: the layers below the core (weights, biases as (R, 1, O) rows), the
    core's parameters by name, the layers above the core."""

    ws: list[torch.Tensor]
    bs: list[torch.Tensor]
    core: dict[str, torch.Tensor]
    top_ws: list[torch.Tensor]
    top_bs: list[torch.Tensor]


def _body_parts(views: dict[str, torch.Tensor], depth: int, top: int) -> BodyParts:
    return BodyParts(
        [views[f"mlp{i}.w"] for i in range(depth)],
        [views[f"mlp{i}.b"].unsqueeze(1) for i in range(depth)],
        {n[5:]: v for n, v in views.items() if n.startswith("core.")},
        [views[f"top{i}.w"] for i in range(top)],
        [views[f"top{i}.b"].unsqueeze(1) for i in range(top)],
    )


def _rows(state, lo: int, hi: int):
    return type(state)(*(t[lo:hi] for t in state))


def _cat_states(a, b):
    return type(a)(*(torch.cat([x, y]) for x, y in zip(a, b, strict=True)))


class StreamAC:
    """K stream AC(lambda) agents in lockstep: networks, traces, normalisers, core states.

    Use: `obs = agent.observe_first(raw_obs)`; then per step `action = agent.act()`, the env
    step, `agent.learn(reward, next_obs, final_obs, terminated, truncated)`.

    The actor and the critic (separate networks) run as one stacked computation of 2K rows
    (PairBuffers), with hand-written gradients (no autograd graph): `theta_a`, `theta_c`,
    `z_a`, `z_c` are (K, P) views of the (2, K, P) buffers."""

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
        """make_core(num_agents) -> a stacked core whose input is the MLP's output width;
        `top`: the widths of the layers between the core and the heads."""
        self.space, self.settings, self.dtype = space, settings, dtype
        self.k, self.obs_size = len(seeds), obs_size
        self.seeds = np.asarray(seeds, dtype=np.uint64)
        self.depth = len(mlp)
        feat = mlp[-1] if mlp else obs_size
        self.actor = StackedNet(
            make_core(self.k, feat), obs_size, mlp, space.head_size,
            log_std=space.dims if space.kind == "box" else 0, top=top,
        )  # fmt: skip
        self.critic = StackedNet(make_core(self.k, feat), obs_size, mlp, 1, top=top)
        self.body_core = make_core(2 * self.k, feat)  # both bodies' cores, 2K rows
        generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        theta_a = self.actor.init(generators, dtype)
        theta_c = self.critic.init(generators, dtype)
        width = max(theta_a.shape[1], theta_c.shape[1])
        flat = torch.zeros(2, self.k, width, dtype=dtype)
        flat[0, :, : theta_a.shape[1]] = theta_a
        flat[1, :, : theta_c.shape[1]] = theta_c
        self.params = PairBuffers(flat, self.actor, self.critic)
        self.grads = PairBuffers(torch.zeros_like(flat), self.actor, self.critic)
        self.traces = PairBuffers(torch.zeros_like(flat), self.actor, self.critic)
        self._ones = torch.ones(self.k, 1, dtype=dtype)  # dV/dV, the critic head's dL/dout
        self._scratch = torch.empty_like(flat)  # |z| for ObGD's norm, no fresh (2, K, P) a step
        # the core's bounded parameters (the RTU's / LRU's phase), both nets' (2K, ...) views
        self._bounded = [
            (self.params.body[f"core.{name}"], bound)
            for name, bound in self.body_core.upper_bounds().items()
        ]
        self.theta_a, self.theta_c = self.params.actor, self.params.critic
        self.z_a, self.z_c = self.traces.actor, self.traces.critic
        # ObGD's alpha kappa per network (2, 1)
        self._lr_kappa = torch.tensor(
            [[settings.lr * settings.kappa_actor], [settings.lr * settings.kappa_critic]],
            dtype=dtype,
        )
        self.state = self.body_core.initial_state()  # (2K, ...): actor's, then critic's
        self._obs_stats = Stats(self.k, (obs_size,))
        self._reward_stats, self._return = Stats(self.k), np.zeros(self.k)
        self._np_dtype = torch.empty((), dtype=dtype).numpy().dtype
        self.x = torch.zeros(self.k, obs_size, dtype=dtype)  # normalised current observation
        self.reset = torch.ones(self.k, dtype=torch.bool)
        self.steps = 0  # lockstep steps taken (the sampler's counter)
        self.frozen = False
        self._pending: tuple | None = None
        self.last_grads: tuple | None = None

    # -- each network's core state (K, ...), views of the stacked one

    @property
    def state_a(self):
        return _rows(self.state, 0, self.k)

    @state_a.setter
    def state_a(self, value):
        self.state = _cat_states(value, self.state_c)

    @property
    def state_c(self):
        return _rows(self.state, self.k, 2 * self.k)

    @state_c.setter
    def state_c(self, value):
        self.state = _cat_states(self.state_a, value)

    # -- observations and rewards

    @property
    def obs_stats(self) -> Welford:
        return self._obs_stats.welford()

    @property
    def rewards(self) -> RewardScaler:
        return RewardScaler(self._reward_stats.welford(), torch.from_numpy(self._return))

    def _normalise(self, obs) -> np.ndarray:
        """The normalised observation (K, obs) in float64 (the stats as they are)."""
        obs = np.asarray(obs, dtype=np.float64).reshape(self.k, -1)
        return (obs - self._obs_stats.mean) / np.sqrt(self._obs_stats.var() + OBS_EPS)

    def _observe(self, obs) -> torch.Tensor:
        if not self.frozen:
            self._obs_stats.update(np.asarray(obs, dtype=np.float64).reshape(self.k, -1))
        return torch.from_numpy(self._normalise(obs).astype(self._np_dtype))

    def _scale_reward(self, reward, done: np.ndarray) -> np.ndarray:
        """RewardScaler.scale in place: the scaled reward (K,) float64."""
        ret = self.settings.discount * self._return + np.asarray(reward, dtype=np.float64)
        self._reward_stats.update(ret)
        scaled = np.asarray(reward, dtype=np.float64) / np.sqrt(
            self._reward_stats.var() + REWARD_EPS
        )
        self._return[...] = np.where(done, 0.0, ret)
        return scaled

    def observe_first(self, obs) -> None:
        self.x = self._observe(obs)
        self.reset = torch.ones(self.k, dtype=torch.bool)

    # -- acting and learning

    @torch.no_grad()
    def act(self, greedy: bool = False) -> torch.Tensor:
        """The actions (K, *action_shape) at the current observation; keeps what `learn`
        needs (both networks' forward intermediates)."""
        k, p = self.k, self.params
        body = p.parts
        x2 = torch.cat([self.x, self.x])  # (2K, obs): both networks see the same observation
        feat, mlp_saved = mlp_forward(body.ws, body.bs, x2)  # (2K, F)
        h, state, core_saved = self.body_core.forward_manual(
            body.core, feat, self.state, torch.cat([self.reset, self.reset])
        )  # (2K, H)
        h, top_saved = mlp_forward(body.top_ws, body.top_bs, h)  # (2K, H'): H' = H if no layers
        h = h.unsqueeze(1)  # (2K, 1, H') rows
        params = head_forward(p.heads[0], h[:k])  # (K, head out)
        value = head_forward(p.heads[1], h[k:]).squeeze(-1)  # (K,)
        if greedy:
            action = distribution(self.space, params).mode()
        else:
            u = uniforms(self.seeds, self.steps, sample_draws(self.space))
            action = sample_actions(self.space, params, torch.from_numpy(u))
        self._pending = (params, action, value, h, state, mlp_saved, core_saved, top_saved)
        return action

    def _policy_grads(self, params: torch.Tensor, action: torch.Tensor):
        """Entropy (K,), d log pi(a) / d params and d H / d params (K, head out)."""
        if self.space.kind == "discrete":
            return categorical_grads(params, action)
        with torch.enable_grad():
            leaf = params.detach().requires_grad_()
            dist = distribution(self.space, leaf)
            logp, entropy = dist.log_prob(action), dist.entropy()
            (g_logp,) = torch.autograd.grad(logp.sum(), leaf, retain_graph=True)
            (g_ent,) = torch.autograd.grad(entropy.sum(), leaf)
        return entropy.detach(), g_logp, g_ent

    @torch.no_grad()
    def learn(self, reward, obs, final_obs, terminated, truncated) -> StepInfo:
        """One update from this step's TD error; then the next observation becomes current."""
        params, action, value, h, state, mlp_saved, core_saved, top_saved = self._pending
        self._pending = None
        s, k, p, g = self.settings, self.k, self.params, self.grads
        terminated = np.asarray(terminated, dtype=bool).reshape(k)
        done = terminated | np.asarray(truncated, dtype=bool).reshape(k)
        x_next = self._observe(obs)
        if final_obs is obs or np.array_equal(final_obs, obs):
            x_final = x_next
        else:
            x_final = torch.from_numpy(self._normalise(final_obs).astype(self._np_dtype))
        scaled = self._scale_reward(reward, done)
        v_next = self._peek_value(x_final, state, core_saved)
        # delta = r + gamma (1 - terminated) V(s') - V(s) (a truncated step bootstraps)
        bootstrap = torch.from_numpy((s.discount * ~terminated).astype(self._np_dtype))
        delta = torch.from_numpy(scaled.astype(self._np_dtype)).addcmul_(bootstrap, v_next)
        delta -= value
        # gradients: actor of log pi(a) + c_H sign(delta) H, critic of V
        entropy, g_logp, g_ent = self._policy_grads(params, action)
        g_params = g_logp + (s.entropy_cost * torch.sign(delta)).unsqueeze(1) * g_ent
        g_h = torch.cat(
            [
                head_backward(p.heads[0], g.heads[0], h[:k], g_params),
                head_backward(p.heads[1], g.heads[1], h[k:], self._ones),
            ]
        ).squeeze(1)  # (2K, H')
        body, g_body = p.parts, g.parts
        g_h = mlp_backward(body.top_ws, top_saved, g_h, g_body.top_ws, g_body.top_bs, True)
        g_feat = self.body_core.backward_manual(core_saved, g_h, g_body.core)
        mlp_backward(body.ws, mlp_saved, g_feat, g_body.ws, g_body.bs)
        self.last_grads = (g.actor, g.critic)  # this step's gradients (K, P) (tests read them)
        step = self._update(delta, done)
        self.state = state
        self.x, self.reset = x_next, torch.from_numpy(done)
        self.steps += 1
        return StepInfo(delta, value, entropy, step[0], step[1])

    def _peek_value(self, x: torch.Tensor, state, core_saved) -> torch.Tensor:
        """V(x) (K,) from the critic's next core state (no grad, no sensitivity update; the
        weights still those of this step's forward)."""
        k = self.k
        body = self.params.critic_parts
        feat, _ = mlp_forward(body.ws, body.bs, x)
        rows = slice(k, 2 * k)
        h = self.body_core.peek_manual(body.core, feat, _rows(state, k, 2 * k), core_saved, rows)
        h, _ = mlp_forward(body.top_ws, body.top_bs, h)
        return head_forward(self.params.heads[1], h.unsqueeze(1)).squeeze(-1)

    def _update(self, delta: torch.Tensor, done: np.ndarray) -> torch.Tensor:
        """Traces, ObGD (each network with its own kappa), the traces' reset at an episode's
        end: whole (2, K, P) tensor ops, no fresh (2, K, P) tensors. Returns the step sizes
        (2, K)."""
        s = self.settings
        z = self.traces.flat
        torch.add(self.grads.flat, z, alpha=s.discount * s.trace_lambda, out=z)  # z <- gl z + g
        delta_bar = delta.abs().clamp_(min=1.0)
        l1 = torch.abs(z, out=self._scratch).sum(2)  # (2, K) (linalg.vector_norm: 4x slower)
        bound = self._lr_kappa * delta_bar * l1
        step = s.lr / bound.clamp_(min=1.0)
        if not self.frozen:
            self.params.flat.addcmul_((step * delta).unsqueeze(2), z)
            for view, bound in self._bounded:
                view.clamp_(max=bound)
        if done.any():
            z[:, torch.from_numpy(done)] = 0.0
        return step

    def advance(self, obs, done) -> None:
        """Evaluation: no learning; the next observation becomes current (stats frozen)."""
        self._pending = None
        self.x = torch.from_numpy(self._normalise(obs).astype(self._np_dtype))
        self.reset = torch.as_tensor(done, dtype=torch.bool)

    # -- checkpoints

    def state_dict(self) -> dict[str, Any]:
        return {
            "theta_actor": self.theta_a.clone(),
            "theta_critic": self.theta_c.clone(),
            "trace_actor": self.z_a.clone(),
            "trace_critic": self.z_c.clone(),
            "core_actor": [t.clone() for t in self.state_a],
            "core_critic": [t.clone() for t in self.state_c],
            "obs_stats": [t.clone() for t in self.obs_stats],
            "reward_stats": [t.clone() for t in self.rewards.stats],
            "reward_return": self.rewards.ret.clone(),
            "x": self.x.clone(),
            "reset": self.reset.clone(),
            "steps": self.steps,
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.theta_a.copy_(d["theta_actor"])
        self.theta_c.copy_(d["theta_critic"])
        self.z_a.copy_(d["trace_actor"])
        self.z_c.copy_(d["trace_critic"])
        kind = type(self.state)
        self.state = _cat_states(kind(*d["core_actor"]), kind(*d["core_critic"]))
        self._obs_stats.load(Welford(*d["obs_stats"]))
        self._reward_stats.load(Welford(*d["reward_stats"]))
        self._return[...] = torch.as_tensor(d["reward_return"]).numpy()
        self.x, self.reset, self.steps = d["x"], d["reset"], int(d["steps"])

    def weights(self) -> dict[str, torch.Tensor]:
        """The agents' weights and normalisers by name (agent.pt): (K, ...) tensors."""
        out = {f"actor.{n}": v for n, v in self.actor.layout.views(self.theta_a).items()}
        out.update({f"critic.{n}": v for n, v in self.critic.layout.views(self.theta_c).items()})
        out.update(obs_mean=self.obs_stats.mean, obs_var=self.obs_stats.var())
        return {k: v.contiguous().clone() for k, v in out.items()}


def detach_state(state):
    """A core state with every tensor detached (a NamedTuple of tensors, or None)."""
    if state is None:
        return None
    return type(state)(*(t.detach() if isinstance(t, torch.Tensor) else t for t in state))


def check_space(space: ActionSpace) -> None:
    if space.kind not in ("discrete", "multi_discrete", "multi_binary", "box"):
        raise ConfigError(f"stream AC: action space {space.describe()} is not supported")
