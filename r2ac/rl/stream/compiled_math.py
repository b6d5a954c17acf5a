"""The compiled streaming step's math: StreamAC's act and learn written as functions of
tensors in and out (no data-dependent Python branching, no numpy, no host sync), with the
RTU / LRU cores in real (re, im) arithmetic (the stacked cores' complex tensors and stride test
do not compile); r2ac/rtrl/stacked/pair.py's math, exact RTRL and TBPTT(1). compiled.py packs
and compiles it."""

from __future__ import annotations

import functools
import itertools

import torch

from r2ac.counter_hash import uniforms_torch
from r2ac.rl.running_stats import OBS_EPS, REWARD_EPS
from r2ac.rl.stream.ac import StepInfo, categorical_grads
from r2ac.rl.stream.compiled_pair import (
    pair_forward,
    pair_grads,
    pair_peek,
    rows_matmul,
)
from r2ac.rl.stream.compiled_spec import Pending, StepSpec, StepState
from r2ac.rl.stream.nets import LEAK, head_forward, mlp_forward

# ---------------------------------------------------------------- parameter views


def _views(flat: torch.Tensor, slots, rows: int) -> dict[str, torch.Tensor]:
    """name -> (rows, *shape) views of flat (rows, P')."""
    return {sl.name: flat[:, sl.offset : sl.offset + sl.size].view(rows, *sl.shape) for sl in slots}


def body_views(spec: StepSpec, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """Both bodies' parameters (2K, ...) (actor's agents, then the critic's) of flat (2, K, P)."""
    k2 = 2 * spec.k
    return _views(flat[:, :, : spec.p_body].reshape(k2, spec.p_body), spec.body, k2)


def head_views(spec: StepSpec, flat: torch.Tensor, net: int) -> dict[str, torch.Tensor]:
    """Net `net`'s head parameters (K, ...), head.b as (K, 1, O) rows."""
    p = _views(flat[net], spec.heads[net], spec.k)
    p["head.b"] = p["head.b"].unsqueeze(1)
    return p


def _layers(p: dict, prefix: str, n: int):
    return [p[f"{prefix}{i}.w"] for i in range(n)], [
        p[f"{prefix}{i}.b"].unsqueeze(1) for i in range(n)
    ]


def _core_params(spec: StepSpec, p: dict) -> dict[str, torch.Tensor]:
    return {sl.name[5:]: p[sl.name] for sl in spec.body if sl.name.startswith("core.")}


# ---------------------------------------------------------------- normalisers (float64)


def welford(count, mean, p, x):
    """Stats.update as a function: (count, mean, p) with sample x (K, ...) added."""
    count = count + 1.0
    diff = x - mean
    mean = mean + diff / count.view(-1, *([1] * (x.dim() - 1)))
    return count, mean, p + diff * (x - mean)


def variance(count, p):
    """Stats.var: p / max(count - 1, 1) from two samples on, else 1."""
    c = count.view(-1, *([1] * (p.dim() - 1)))
    return torch.where(c >= 2, p / torch.clamp(c - 1, min=1.0), torch.ones_like(p))


def normalise(count, mean, p, obs):
    """(obs - mean) / sqrt(var + eps), float64 (StreamAC._normalise)."""
    return (obs - mean) / torch.sqrt(variance(count, p) + OBS_EPS)


# ---------------------------------------------------------------- layers (gradients returned)


def mlp_grads(ws, saved, g: torch.Tensor, input_grad: bool):
    """mlp_backward's gradients returned instead of written: ([dL/dw (R, I, O)],
    [dL/db (R, 1, O)], dL/dinput (R, I) or None) for dL/dfeatures = g (R, F)."""
    if not ws:
        return [], [], (g if input_grad else None)
    n = len(ws)
    g_ws, g_bs = [None] * n, [None] * n
    g = g.unsqueeze(1)
    for i in reversed(range(n)):
        x, pre, mean, rstd, normed = saved[i]
        g = torch.ops.aten.leaky_relu_backward(g, normed, LEAK, False)
        g = torch.ops.aten.native_layer_norm_backward(
            g, pre, pre.shape[-1:], mean, rstd, None, None, [True, False, False]
        )[0]  # (R, 1, O)
        g_ws[i] = x.transpose(1, 2) * g
        g_bs[i] = g
        if i or input_grad:
            g = rows_matmul(g, ws[i].transpose(1, 2))  # (R, 1, I)
    return g_ws, g_bs, (g.squeeze(1) if input_grad else None)


def head_grads(p: dict, h: torch.Tensor, g: torch.Tensor):
    """head_backward's gradients returned: ({head.w: (K, H, O), head.b: (K, 1, O)}, dL/dh
    (K, 1, H)) for dL/dout = g (K, O) (no log_std: Discrete)."""
    g = g.unsqueeze(1)  # (K, 1, O)
    g_h = rows_matmul(g, p["head.w"].transpose(1, 2))
    return {"head.w": h.transpose(1, 2) * g, "head.b": g}, g_h


# ---------------------------------------------------------------- act, learn, step


def forward_bodies(spec: StepSpec, st: StepState):
    """Both networks at the current observation (PairAgent.forward_bodies): the heads'
    outputs (K, out) each, the (2K, 1, H') rows, the cores' next state and the layers' and
    the core's intermediates (mlp, top, core)."""
    k = spec.k
    body = body_views(spec, st.params)
    ws, bs = _layers(body, "mlp", spec.depth)
    x2 = torch.cat([st.x, st.x])  # (2K, O): both networks see the same observation
    feat, mlp_saved = mlp_forward(ws, bs, x2, rows_matmul)  # (2K, F)
    reset2 = torch.cat([st.reset, st.reset])
    h, core, saved = pair_forward(spec, _core_params(spec, body), feat, st.core, reset2)
    top_ws, top_bs = _layers(body, "top", spec.top)
    h, top_saved = mlp_forward(top_ws, top_bs, h, rows_matmul)  # (2K, H')
    h = h.unsqueeze(1)  # (2K, 1, H') rows
    outs = tuple(
        head_forward(head_views(spec, st.params, i), h[i * k : (i + 1) * k], rows_matmul)
        for i in (0, 1)
    )
    return outs, h, core, mlp_saved, top_saved, saved


def act(spec: StepSpec, st: StepState) -> tuple[torch.Tensor, Pending]:
    """StreamAC.act() (sampled): the actions (K,) and what learn needs."""
    (logits, value), h, core, mlp_saved, top_saved, saved = forward_bodies(spec, st)
    value = value.squeeze(-1)
    u = uniforms_torch(st.seeds, st.steps, 1)  # (K, 1) float64
    cdf = torch.softmax(logits, -1).cumsum(-1)  # sample_actions, Discrete
    action = (cdf < u.to(cdf.dtype)).sum(-1).clamp(max=spec.actions - 1)
    pending = Pending(
        logits, action, value, h, tuple(core), tuple(mlp_saved), tuple(top_saved), saved
    )
    return action, pending


def peek_value(spec: StepSpec, params: torch.Tensor, x: torch.Tensor, pend: Pending):
    """V(x) (K,) from the critic's next core state with this step's (pre-update) weights
    (StreamAC._peek_value)."""
    k = spec.k
    body = body_views(spec, params)
    critic = {n: v[k:] for n, v in body.items()}
    ws, bs = _layers(critic, "mlp", spec.depth)
    feat, _ = mlp_forward(ws, bs, x, rows_matmul)
    rows = slice(k, 2 * k)
    h = pair_peek(spec, _core_params(spec, critic), feat, pend.core[0][rows], pend.saved, rows)
    top_ws, top_bs = _layers(critic, "top", spec.top)
    h, _ = mlp_forward(top_ws, top_bs, h, rows_matmul)
    return head_forward(head_views(spec, params, 1), h.unsqueeze(1), rows_matmul).squeeze(-1)


def _head_columns(spec: StepSpec, heads: tuple[dict, ...], nets) -> list[torch.Tensor]:
    """Each net's head gradients (K, P - p_body), the shorter head zero-padded."""
    parts = []
    for net, head in zip(nets, heads, strict=True):
        g = torch.cat([head[sl.name].reshape(spec.k, sl.size) for sl in spec.heads[net]], 1)
        pad = spec.width - spec.p_body - g.shape[1]
        parts.append(torch.nn.functional.pad(g, (0, pad)) if pad else g)
    return parts


def grad_columns(spec: StepSpec, body: dict, heads: tuple[dict, dict]) -> list[torch.Tensor]:
    """Both networks' gradients by name as (2K, columns) pieces in the order of the (2, K, P)
    buffer's columns (the heads' last). Never concatenated: ObGD reads each piece where it is
    made (a flat copy would be written once and read twice more)."""
    pieces = [body[sl.name].reshape(2 * spec.k, sl.size) for sl in spec.body]  # actor, critic
    return [*pieces, torch.cat(_head_columns(spec, heads, (0, 1)))]


def flat_grads(spec: StepSpec, body: dict, heads: tuple[dict, ...], nets=(0, 1)) -> torch.Tensor:
    """The gradients by name packed as the (2, K, P) buffer (the shorter head zero-padded);
    with nets=(n,), net n's alone as (1, K, P) (body (K, ...), heads (net n's,))."""
    k, n = spec.k, len(nets)
    rows = torch.cat([body[sl.name].reshape(n * k, sl.size) for sl in spec.body], 1)
    parts = _head_columns(spec, heads, nets)
    return torch.cat([rows.view(n, k, spec.p_body), torch.stack(parts)], 2)  # (n, K, P)


def _clamp_phase(spec: StepSpec, params: torch.Tensor) -> torch.Tensor:
    """theta_log <= its bound in both networks (StreamAC._bounded) of a (2, K, P) buffer."""
    lo, hi = spec.phase.offset, spec.phase.offset + spec.phase.size
    mid = params[:, :, lo:hi].clamp(max=spec.phase_bound)
    return torch.cat([params[:, :, :lo], mid, params[:, :, hi:]], 2)


def obgd(spec: StepSpec, params, traces, grads: list[torch.Tensor], delta, done):
    """Traces and ObGD (StreamAC._update), each network with its own kappa: (params, traces,
    step sizes (2, K)); grads: `grad_columns`.

    Written per piece of columns over (2K, columns) rows with (2K, 1) factors, theta_log's
    bound on its own piece, the results concatenated: the compiler makes each piece's update,
    bound and trace reset one pass that reads its gradient where it is made and writes each
    column once (over (2, K, P) with (1, K, 1) factors it split them into passes of different
    loop shapes)."""
    k, width = spec.k, spec.width
    rows, trace_rows = params.view(2 * k, width), traces.view(2 * k, width)
    starts = list(itertools.accumulate([g.shape[1] for g in grads], initial=0))
    cols = [slice(lo, hi) for lo, hi in zip(starts[:-1], starts[1:], strict=True)]
    decay = spec.discount * spec.trace_lambda
    z = [torch.add(g, trace_rows[:, c], alpha=decay) for g, c in zip(grads, cols, strict=True)]
    l1 = functools.reduce(torch.add, [zi.abs().sum(1) for zi in z])  # (2K,)
    # the step's factors per row (actor's K, critic's K), (2K,): the update's loops then have
    # one shape. Each network's lr kappa as a Python number (no tensor constant: inductor's
    # C++ loop does not declare constants inside a while_loop's body).
    actor = torch.arange(2 * k, device=l1.device) < k
    lr_kappa = torch.full_like(l1, spec.lr * spec.kappa_actor).where(
        actor, spec.lr * spec.kappa_critic
    )
    delta2 = torch.cat([delta, delta])
    bound = lr_kappa * delta2.abs().clamp(min=1.0) * l1
    step_size = spec.lr / bound.clamp(min=1.0)  # (2K,)
    coef = (step_size * delta2).unsqueeze(1)
    ended = torch.cat([done, done]).view(2 * k, 1)  # traces reset at an end
    new_params, new_traces = [], []
    for zi, c in zip(z, cols, strict=True):
        new = torch.addcmul(rows[:, c], coef, zi)
        new_params.append(new.clamp(max=spec.phase_bound) if c.start == spec.phase.offset else new)
        new_traces.append(torch.where(ended, torch.zeros_like(zi), zi))
    params, z = torch.cat(new_params, 1), torch.cat(new_traces, 1)
    return params.view(2, k, width), z.view(2, k, width), step_size.view(2, k)


def observe(spec: StepSpec, st: StepState, reward, obs, final_obs, done):
    """The normalisers' step (float64; PairAgent._observe, _normalised, RewardScale.scale):
    the stats take obs, then normalise obs and final_obs; the reward scaled by the return's
    deviation, the return reset at an episode's end. ((obs count, mean, p), x_next, x_final,
    (reward count, mean, p, return), the scaled reward float64)."""
    k, f64, dt = spec.k, torch.float64, spec.dtype
    obs64, final64 = obs.to(f64).reshape(k, -1), final_obs.to(f64).reshape(k, -1)
    count, mean, p = welford(st.obs_count, st.obs_mean, st.obs_p, obs64)
    x_next = normalise(count, mean, p, obs64).to(dt)
    x_final = normalise(count, mean, p, final64).to(dt)
    reward64 = reward.to(f64)
    ret = spec.discount * st.ret + reward64
    r_count, r_mean, r_p = welford(st.rew_count, st.rew_mean, st.rew_p, ret)
    scaled = reward64 / torch.sqrt(variance(r_count, r_p) + REWARD_EPS)
    ret = torch.where(done, torch.zeros_like(ret), ret)
    return (count, mean, p), x_next, x_final, (r_count, r_mean, r_p, ret), scaled


def named_grads(g_core: dict, mlp: tuple, top: tuple) -> dict[str, torch.Tensor]:
    """The body's gradients by slot name: the core's, and (dw, db) lists of the layers below
    (`mlp`) and above (`top`) it."""
    named = {f"core.{n}": g for n, g in g_core.items()}
    for prefix, (gw, gb) in (("mlp", mlp), ("top", top)):
        for i, (w, b) in enumerate(zip(gw, gb, strict=True)):
            named[f"{prefix}{i}.w"], named[f"{prefix}{i}.b"] = w, b
    return named


def body_grads(spec: StepSpec, params, pend, g_first, g_second) -> tuple[dict, tuple]:
    """Both networks' gradients by name ((2K, ...) body, each head's) for dL/d(head outputs)
    g_first and g_second (K, out) each, through the intermediates act kept
    (PairAgent.backward_bodies)."""
    k = spec.k
    heads = (head_views(spec, params, 0), head_views(spec, params, 1))
    g_head_a, g_ha = head_grads(heads[0], pend.h[:k], g_first)
    g_head_c, g_hc = head_grads(heads[1], pend.h[k:], g_second)
    g_h = torch.cat([g_ha, g_hc]).squeeze(1)  # (2K, H')
    body = body_views(spec, params)
    top_ws, _ = _layers(body, "top", spec.top)
    g_top_w, g_top_b, g_h = mlp_grads(top_ws, pend.top, g_h, True)
    g_core, g_feat = pair_grads(spec, _core_params(spec, body), pend.saved, pend.core, g_h)
    ws, _ = _layers(body, "mlp", spec.depth)
    g_w, g_b, _ = mlp_grads(ws, pend.mlp, g_feat, False)
    return named_grads(g_core, (g_w, g_b), (g_top_w, g_top_b)), (g_head_a, g_head_c)


def pair_body_grads(spec: StepSpec, params, pend, g_first, g_second) -> torch.Tensor:
    """`body_grads` packed as the (2, K, P) buffer."""
    return flat_grads(spec, *body_grads(spec, params, pend, g_first, g_second))


def learn(
    spec: StepSpec, st: StepState, pend: Pending, reward, obs, final_obs, terminated, truncated
) -> tuple[StepState, StepInfo]:
    """StreamAC.learn(): one update from this step's TD error; the next observation becomes
    current. reward (K,), obs and final_obs (K, O) (any float dtype), terminated and
    truncated (K,) bool."""
    f64, dt = torch.float64, spec.dtype
    done = terminated | truncated
    obs_st, x_next, x_final, rew_st, scaled = observe(spec, st, reward, obs, final_obs, done)
    # delta = r + gamma (1 - terminated) V(s') - V(s), V(s') at the pre-update weights
    v_next = peek_value(spec, st.params, x_final, pend)
    bootstrap = ((~terminated).to(f64) * spec.discount).to(dt)
    delta = torch.addcmul(scaled.to(dt), bootstrap, v_next) - pend.value
    # gradients: actor of log pi(a) + c_H sign(delta) H, critic of V
    entropy, g_logp, g_ent = categorical_grads(pend.logits, pend.action)
    g_params = g_logp + (spec.entropy_cost * torch.sign(delta)).unsqueeze(1) * g_ent
    named, heads = body_grads(
        spec, st.params, pend, g_params, torch.ones_like(pend.value).unsqueeze(1)
    )
    g = grad_columns(spec, named, heads)
    params, z, step_size = obgd(spec, st.params, st.traces, g, delta, done)
    new = StepState(
        params, z, pend.core, *obs_st, *rew_st, x_next, done, st.steps + 1, st.seeds, st.extra
    )
    return new, StepInfo(delta, pend.value, entropy, step_size[0], step_size[1])
