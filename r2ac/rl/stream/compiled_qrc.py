"""QRC(lambda)'s step as pure functions of tensors (StreamQRC.act() and learn(),
r2ac/rl/stream/qrc.py), for the compiled paths (compiled.py one step a call, compiled_loop.py
many): the same state as stream AC's (StepState: the Q and h networks in the two rows of the
(2, K, P) buffers, z_q and z_h the two rows of `traces`, z_b in `extra`), the same layers,
core, normalisers and counter-hash draws (compiled_math.py), and QRC's own parts:

    act: epsilon at the step counter (a carried tensor: one graph for the whole decay), the
         epsilon-greedy action from the counter hash's two uniforms (qrc.epsilon_greedy)
    learn: Q(s'_t, a*) and its gradient (the Q network one step on from the core state after
           s_t, no reset), delta, the three traces, QRC's directions (qrc.qrc_directions),
           plain SGD on each network, the phase clamp, the cut of the traces after the update
           where the episode ended or the action was non-greedy

StreamQRC stays the reference: its operations in its order (tests/rl/test_stream_compiled_qrc.py).
Not covered: a frozen agent (greedy evaluation runs eagerly)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from r2ac.counter_hash import uniforms_torch
from r2ac.rl.stream.compiled_math import (
    _clamp_phase,
    _core_params,
    _layers,
    body_views,
    flat_grads,
    forward_bodies,
    head_grads,
    head_views,
    mlp_grads,
    named_grads,
    observe,
    pair_body_grads,
)
from r2ac.rl.stream.compiled_pair import pair_forward, pair_grads, rows_matmul
from r2ac.rl.stream.compiled_spec import StepSpec, StepState
from r2ac.rl.stream.nets import head_forward, mlp_forward
from r2ac.rl.stream.qrc import QRCTraces, QStepInfo, epsilon_greedy, q_td_error, qrc_directions


class QPending(NamedTuple):
    """What act keeps for learn (StreamQRC._pending)."""

    q: torch.Tensor  # (K, A) Q(s_t, .)
    values: torch.Tensor  # (K, A) h(s_t, .)
    action: torch.Tensor  # (K,) int64
    non_greedy: torch.Tensor  # (K,) bool
    epsilon: torch.Tensor  # (K,) this step's epsilon
    h: torch.Tensor  # (2K, 1, H') the heads' input rows
    core: tuple  # (2K, ...) the cores' next state
    mlp: tuple
    top: tuple
    saved: tuple


def epsilon_of(spec: StepSpec, steps: torch.Tensor) -> torch.Tensor:
    """qrc.epsilon_at at the step counter `steps` (a () int64 tensor): () float64."""
    start, end, n = spec.epsilon_start, spec.epsilon_end, spec.epsilon_steps
    decayed = start + (end - start) * (steps.to(torch.float64) / max(n, 1))
    return torch.where(steps >= n, torch.full_like(decayed, end), decayed)


def act(spec: StepSpec, st: StepState) -> tuple[torch.Tensor, QPending]:
    """StreamQRC.act() (epsilon-greedy): the actions (K,) and what learn needs."""
    (q, values), h, core, mlp_saved, top_saved, saved = forward_bodies(spec, st)
    eps = epsilon_of(spec, st.steps)
    u = uniforms_torch(st.seeds, st.steps, 2)  # (K, 2) float64
    action, non_greedy = epsilon_greedy(q, u, eps)
    epsilon = eps.to(spec.dtype).expand(spec.k)
    pend = QPending(
        q, values, action, non_greedy, epsilon, h, tuple(core), tuple(mlp_saved),
        tuple(top_saved), saved,
    )  # fmt: skip
    return action, pend


def q_next(spec: StepSpec, params: torch.Tensor, x: torch.Tensor, pend: QPending, no_reset):
    """(Q(s', a*) (K,), its gradient (K, P)), a* = argmax Q(s', .): the Q network one step
    from its core state after s_t, sensitivities included, no reset (StreamQRC._q_next)."""
    k = spec.k
    body = {n: v[:k] for n, v in body_views(spec, params).items()}
    ws, bs = _layers(body, "mlp", spec.depth)
    feat, mlp_saved = mlp_forward(ws, bs, x, rows_matmul)
    core_p = _core_params(spec, body)
    state = tuple(t[:k] for t in pend.core)
    hid, new_core, core_saved = pair_forward(spec, core_p, feat, state, no_reset)
    top_ws, top_bs = _layers(body, "top", spec.top)
    hid, top_saved = mlp_forward(top_ws, top_bs, hid, rows_matmul)
    hid = hid.unsqueeze(1)
    head = head_views(spec, params, 0)
    qn = head_forward(head, hid, rows_matmul)  # (K, A)
    onehot = torch.zeros_like(qn).scatter(1, qn.argmax(-1, keepdim=True), 1.0)
    g_head, g_hid = head_grads(head, hid, onehot)
    g_top_w, g_top_b, g_hid = mlp_grads(top_ws, top_saved, g_hid.squeeze(1), True)
    g_core, g_feat = pair_grads(spec, core_p, core_saved, new_core, g_hid)
    g_w, g_b, _ = mlp_grads(ws, mlp_saved, g_feat, False)
    named = named_grads(g_core, (g_w, g_b), (g_top_w, g_top_b))
    return (qn * onehot).sum(1), flat_grads(spec, named, (g_head,), nets=(0,))[0]


def learn(
    spec: StepSpec, st: StepState, pend: QPending, reward, obs, final_obs, terminated, truncated
) -> tuple[StepState, QStepInfo]:
    """StreamQRC.learn(): one QRC(lambda) update; the next observation becomes current.
    reward (K,), obs and final_obs (K, O) (any float dtype), terminated, truncated (K,) bool."""
    k, dt = spec.k, spec.dtype
    done = terminated | truncated
    obs_st, x_next, x_final, rew_st, scaled = observe(spec, st, reward, obs, final_obs, done)
    onehot = torch.zeros_like(pend.q).scatter(1, pend.action.view(-1, 1), 1.0)
    q_sa, h_sa = (pend.q * onehot).sum(1), (pend.values * onehot).sum(1)  # (K,)
    g = pair_body_grads(spec, st.params, pend, onehot, onehot)  # grad Q(s, a), grad h(s, a)
    q_nx, g_next = q_next(spec, st.params, x_final, pend, torch.zeros_like(terminated))
    delta = q_td_error(scaled.to(dt), q_sa, q_nx, terminated, spec.discount)
    bootstrap = spec.discount * (~terminated).to(dt)
    decay = spec.discount * spec.trace_lambda
    z = st.traces * decay + g  # z_q, z_h (qrc_traces)
    z_b = st.extra[0] * decay + h_sa
    d_q, d_h = qrc_directions(
        delta, QRCTraces(z[0], z[1], z_b), g[0], g_next, g[1], h_sa, bootstrap, st.params[1],
        spec.beta,
    )  # fmt: skip
    params = torch.stack(
        [torch.add(st.params[0], d_q, alpha=spec.lr), torch.add(st.params[1], d_h, alpha=spec.h_lr)]
    )
    params = _clamp_phase(spec, params)
    keep = (~(done | pend.non_greedy)).to(dt)  # the cut (qrc.cut_traces)
    z, z_b = z * keep.view(1, k, 1), z_b * keep
    new = StepState(
        params, z, pend.core, *obs_st, *rew_st, x_next, done, st.steps + 1, st.seeds, (z_b,)
    )
    return new, QStepInfo(delta, q_sa, pend.epsilon, h_sa, pend.non_greedy.to(dt))
