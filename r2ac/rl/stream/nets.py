"""The streaming agents' networks: K agents' parameters packed into one flat (K, P) tensor
(`Layout`, Elsayed et al.'s sparse init), the MLP and head forward passes with their
hand-written vector-Jacobian products (no autograd graph: a batch-1 step's cost on a CPU is
autograd's per-node overhead), `StackedNet` (MLP -> stacked core -> MLP -> linear head) and
`PairBuffers`, two networks of one body shape run as one stacked computation of 2K rows."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

SPARSITY = 0.9  # fraction of each unit's input weights zeroed at init


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


def mlp_forward(ws, bs, x: torch.Tensor, matmul=None) -> tuple[torch.Tensor, list[tuple]]:
    """x (R, I) through the layers (w (R, I, O), b (R, 1, O)): linear, LayerNorm, leaky ReLU,
    as (R, 1, width) rows (no reshapes between the ops). Returns the features (R, F) and per
    layer what `mlp_backward` needs. matmul: a per-row product in place of bmm (the compiled
    step's)."""
    if not ws:  # no layers (e.g. none above the core): nothing to run or keep
        return x, []
    saved, x = [], x.unsqueeze(1)
    for w, b in zip(ws, bs, strict=True):
        pre = torch.baddbmm(b, x, w) if matmul is None else b + matmul(x, w)  # (R, 1, O)
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


def head_forward(p: dict[str, torch.Tensor], h: torch.Tensor, matmul=None) -> torch.Tensor:
    """h (K, 1, H) rows @ head.w (K, H, O) + head.b (K, 1, O), then log_std appended where
    there is one: (K, out)."""
    w, b = p["head.w"], p["head.b"]
    y = (torch.baddbmm(b, h, w) if matmul is None else b + matmul(h, w)).squeeze(1)
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


class PairBuffers:
    """Two networks' flat parameters (or gradients, or traces) in one (2, K, P) tensor (AC:
    actor and critic; QRC: Q and h): row 0 the first's (K, P_1), row 1 the second's (K, P_2),
    P = max(P_1, P_2), the shorter zero-padded. Their bodies (MLP and core, laid out first and
    alike in both) are one (2K, P_body) computation: `body` maps each body name to a (2K, ...)
    view (the first's agents, then the second's), `heads` each net's head names to (K, ...)
    views. All views are of `flat`, taken once: in-place updates of `flat` are seen through
    them."""

    def __init__(self, flat: torch.Tensor, first: StackedNet, second: StackedNet):
        self.flat = flat  # (2, K, P)
        two, k, _ = flat.shape
        body_slots = [sl for sl in first.layout.slots if not _is_head(sl.name)]
        size = sum(sl.size for sl in body_slots)
        body = flat[:, :, :size].view(2 * k, size)  # (2K, P_body), rows strided by P
        self.body = {sl.name: _slot(body, sl) for sl in body_slots}
        self.heads = tuple(
            {sl.name: _slot(flat[i], sl) for sl in net.layout.slots if _is_head(sl.name)}
            for i, net in enumerate((first, second))
        )
        for head in self.heads:
            head["head.b"] = head["head.b"].unsqueeze(1)  # (K, 1, O) rows
        self.first = flat[0, :, : first.layout.size]  # (K, P_1)
        self.second = flat[1, :, : second.layout.size]  # (K, P_2)
        below, above = len(first.mlp), len(first.top)
        self.parts = _body_parts(self.body, below, above)  # both bodies (2K rows)
        self.first_parts = _body_parts({n: v[:k] for n, v in self.body.items()}, below, above)
        self.second_parts = _body_parts({n: v[k:] for n, v in self.body.items()}, below, above)


def net_parts(net: StackedNet, flat: torch.Tensor) -> tuple[BodyParts, dict[str, torch.Tensor]]:
    """One network's views of its flat (K, P) parameters (or gradients) in PairBuffers' form:
    the body's parts and the head's views (head.b as (K, 1, O) rows)."""
    views = net.layout.views(flat)
    head = {n: v for n, v in views.items() if _is_head(n)}
    head["head.b"] = head["head.b"].unsqueeze(1)
    return _body_parts(views, len(net.mlp), len(net.top)), head


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


def state_rows(state, lo: int, hi: int):
    """Rows lo:hi of every tensor of a core state (views)."""
    return type(state)(*(t[lo:hi] for t in state))


def cat_states(a, b):
    """Two core states of one type joined along the agents."""
    return type(a)(*(torch.cat([x, y]) for x, y in zip(a, b, strict=True)))


def detach_state(state):
    """A core state with every tensor detached (a NamedTuple of tensors, or None)."""
    if state is None:
        return None
    return type(state)(*(t.detach() if isinstance(t, torch.Tensor) else t for t in state))
