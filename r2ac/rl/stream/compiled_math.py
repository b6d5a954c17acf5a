"""The compiled streaming step's math: StreamAC's act and learn written as functions of
tensors in and out (no data-dependent Python branching, no numpy, no host sync), with the
RTU / LRU cores in real (re, im) arithmetic (the stacked cores' complex tensors and stride test
do not compile); r2ac/rtrl/stacked/pair.py's math, exact RTRL and TBPTT(1). compiled.py packs
and compiles it."""

from __future__ import annotations

import torch

from r2ac.counter_hash import uniforms_torch
from r2ac.rl.running_stats import OBS_EPS, REWARD_EPS
from r2ac.rl.stream.ac import StepInfo, categorical_grads
from r2ac.rl.stream.compiled_spec import Pending, StepSpec, StepState
from r2ac.rl.stream.nets import LEAK, head_forward, mlp_forward
from r2ac.rtrl.stacked.base import HiddenState, PairRTRLState

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


def rows_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b per row, a (R, 1, I), b (R, I, O) -> (R, 1, O), as a product and a sum: inductor
    makes it a loop of its own kernels, where a bmm stays an ATen call (~5 us each at these
    sizes, ~30 a step)."""
    return (a.transpose(1, 2) * b).sum(1, keepdim=True)


def _matvec(W: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """W x per row: W (R, N, D), x (R, D) -> (R, N) (r2ac.rtrl.stacked.linear.matvec)."""
    return rows_matmul(x.unsqueeze(1), W.transpose(1, 2)).squeeze(1)


def _vecmat(g: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    return rows_matmul(g.unsqueeze(1), W).squeeze(1)


# ---------------------------------------------------------------- the RTU / LRU core, real planes
# s = lam cp + gamma u per unit (complex), stored as (re; im) planes; pair.py's derivation.


def pair_coefficients(spec: StepSpec, p: dict):
    """lam (re, im), gamma (R, U) and the per-unit factors of d s / d v: (nu, theta, dgamma)
    for the RTU (dgamma = d gamma / d nu_log), (nu, theta) for the LRU."""
    nu, theta = torch.exp(p["nu_log"]), torch.exp(p["theta_log"])
    r = torch.exp(-nu)
    lam_re, lam_im = r * torch.cos(theta), r * torch.sin(theta)  # torch.polar(r, theta)
    if spec.cell == "rtu":
        e = torch.expm1(-2.0 * nu)  # |lam|^2 - 1
        gamma = torch.sqrt(-e)
        return lam_re, lam_im, gamma, (nu, theta, nu * (1.0 + e) / gamma)
    return lam_re, lam_im, torch.exp(p["gamma_log"]), (nu, theta)


def _cmul(ar, ai, br, bi):
    """(ar + i ai)(br + i bi) as (re, im)."""
    return ar * br - ai * bi, ar * bi + ai * br


def _immediate_v(spec: StepSpec, aux, lc_r, lc_i, ur, ui, gamma):
    """This step's d s / d v_m, (R, M, U) re and im: dlam_m cp + dgamma_m u."""
    if spec.cell == "rtu":  # nu_log: dgamma u - nu lam cp; theta_log: i theta lam cp
        nu, theta, dgamma = aux
        re = [dgamma * ur - nu * lc_r, -(theta * lc_i)]
        im = [dgamma * ui - nu * lc_i, theta * lc_r]
    else:  # nu_log: -nu lam cp; theta_log: i theta lam cp; gamma_log: gamma u
        nu, theta = aux
        re = [-nu * lc_r, -(theta * lc_i), gamma * ur]
        im = [-nu * lc_i, theta * lc_r, gamma * ui]
    return torch.stack(re, 1), torch.stack(im, 1)


def _maps(spec: StepSpec, p: dict) -> torch.Tensor:
    a, b = spec.maps
    return torch.cat([p[a], p[b]], 1)  # (R, 2U, D): (W1; W2)


def _readout(spec: StepSpec, p: dict, s_pairs: torch.Tensor, x: torch.Tensor):
    """The core's output (R, N) and what its backward needs."""
    if spec.cell == "rtu":
        h = torch.tanh(s_pairs.reshape(s_pairs.shape[0], -1))  # [c1; c2]
        return h, (h,)
    y = _matvec(p["D"], x) + _matvec(p["C_re"], s_pairs[:, 0])
    return y - _matvec(p["C_im"], s_pairs[:, 1]), (x, s_pairs)  # Re(C s) + D x


def _readout_grads(spec: StepSpec, p: dict, read, g: torch.Tensor):
    """dL/ds in pairs (R, 2, U), the read-out's own gradients and dL/dx (or None)."""
    if spec.cell == "rtu":
        (h,) = read
        return torch.ops.aten.tanh_backward(g, h).view(g.shape[0], 2, -1), {}, None
    x, s_pairs = read
    gc = g.unsqueeze(2)
    grads = {
        "D": gc * x.unsqueeze(1),
        "C_re": gc * s_pairs[:, 0].unsqueeze(1),
        "C_im": gc * (-s_pairs[:, 1]).unsqueeze(1),
    }
    g_s = torch.stack([_vecmat(g, p["C_re"]), -_vecmat(g, p["C_im"])], 1)
    return g_s, grads, _vecmat(g, p["D"])


def pair_forward(spec: StepSpec, p: dict, x: torch.Tensor, state: tuple, reset: torch.Tensor):
    """StackedPairCore.forward_manual: h (R, N), the next state, what pair_grads needs.
    x (R, D); state (h (R, 2, U)[, sens_W (R, 2, U, D), sens_v (R, M, U, 2)]); reset (R,)."""
    R, U = x.shape[0], spec.units
    W = _maps(spec, p)
    keep = (~reset).to(x.dtype).unsqueeze(1)  # (R, 1)
    lam_re, lam_im, gamma, aux = pair_coefficients(spec, p)
    u = rows_matmul(x.unsqueeze(1), W.transpose(1, 2)).view(R, 2, U)  # (W1 x; W2 x)
    ur, ui = u[:, 0], u[:, 1]
    lc_r, lc_i = _cmul(lam_re, lam_im, state[0][:, 0] * keep, state[0][:, 1] * keep)  # lam cp
    s_pairs = torch.stack([lc_r + gamma * ur, lc_i + gamma * ui], 1)  # (R, 2, U)
    imm_r, imm_i = _immediate_v(spec, aux, lc_r, lc_i, ur, ui, gamma)  # (R, M, U)
    if spec.rule == "rtrl":
        lk_r, lk_i = lam_re * keep, lam_im * keep  # the step's Jacobian, reset folded in
        A, B = state[1][:, 0], state[1][:, 1]  # (R, U, D) d s / d W1, re and im planes
        lr, li = lk_r.unsqueeze(2), lk_i.unsqueeze(2)
        # pair.py's _carry_planes op for op (addcmul: a fused multiply-add on the CPU)
        re = torch.addcmul(A * lr, B, li, value=-1.0).addcmul(gamma.unsqueeze(2), x.unsqueeze(1))
        S_W = torch.stack([re, torch.addcmul(B * lr, A, li)], 1)  # (R, 2, U, D)
        pr, pi = state[2][..., 0], state[2][..., 1]  # (R, M, U)
        cr, ci = _cmul(lk_r.unsqueeze(1), lk_i.unsqueeze(1), pr, pi)
        S_v = torch.stack([imm_r + cr, imm_i + ci], -1)  # (R, M, U, 2)
        new_state, imm = PairRTRLState(s_pairs, S_W, S_v), ()  # sensitivities: the state
    else:
        new_state, imm = HiddenState(s_pairs), torch.stack([imm_r, imm_i], -1)  # (R, M, U, 2)
    h, read = _readout(spec, p, s_pairs, x)
    return h, new_state, (x, lam_re, lam_im, gamma, imm, read)


def pair_grads(spec: StepSpec, p: dict, saved, state: tuple, g_h: torch.Tensor):
    """StackedPairCore.backward_manual: the core's gradients by name (R, ...) and dL/dx (R, D)
    for dL/dh = g_h (R, N); `state`: the step's new state (its sensitivities under RTRL)."""
    x, _, _, gamma, imm, read = saved
    a, b = spec.maps
    g_s, grads, g_x = _readout_grads(spec, p, read, g_h)  # (R, 2, U)
    gg = g_s * gamma.unsqueeze(1)  # (R, 2, U): dL/du in pairs
    gr, gi = g_s[:, 0], g_s[:, 1]
    if spec.rule == "rtrl":  # dW1 = Re(conj(g) S_W), dW2 = -Im(conj(g) S_W)
        _, S_W, S_v = state
        A, B = S_W[:, 0], S_W[:, 1]
        grc, gic = gr.unsqueeze(2), gi.unsqueeze(2)
        grads[a] = torch.addcmul(A * grc, B, gic)
        grads[b] = torch.addcmul(A * gic, B, grc, value=-1.0)
    else:  # TBPTT(1): d s / d W1 = gamma x^T, d s / d W2 = i gamma x^T
        S_v, xr = imm, x.unsqueeze(1)
        grads[a], grads[b] = gg[:, 0].unsqueeze(2) * xr, gg[:, 1].unsqueeze(2) * xr
    # dL/dv_m = Re(conj(g) S_v[m]) = gr Re S_v + gi Im S_v
    g_v = gr.unsqueeze(1) * S_v[..., 0] + gi.unsqueeze(1) * S_v[..., 1]  # (R, M, U)
    for m, name in enumerate(spec.vectors):
        grads[name] = g_v[:, m]
    g_in = rows_matmul(gg.view(gg.shape[0], 1, -1), _maps(spec, p)).squeeze(1)  # (R, D)
    return grads, (g_in if g_x is None else g_in + g_x)


def pair_peek(spec: StepSpec, p: dict, x: torch.Tensor, h_state: torch.Tensor, saved, rows: slice):
    """StackedPairCore.peek_manual: the output from state h_state (R', 2, U) and input x
    without a reset, lam and gamma from rows `rows` of this step's forward (weights unchanged)."""
    _, lam_re, lam_im, gamma, _, _ = saved
    R, U = x.shape[0], spec.units
    u = rows_matmul(x.unsqueeze(1), _maps(spec, p).transpose(1, 2)).view(R, 2, U)
    lc_r, lc_i = _cmul(lam_re[rows], lam_im[rows], h_state[:, 0], h_state[:, 1])
    g = gamma[rows]
    s_pairs = torch.stack([u[:, 0] * g + lc_r, u[:, 1] * g + lc_i], 1)
    return _readout(spec, p, s_pairs, x)[0]


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


def flat_grads(spec: StepSpec, body: dict, heads: tuple[dict, ...], nets=(0, 1)) -> torch.Tensor:
    """The gradients by name packed as the (2, K, P) buffer (the shorter head zero-padded);
    with nets=(n,), net n's alone as (1, K, P) (body (K, ...), heads (net n's,))."""
    k, n = spec.k, len(nets)
    rows = torch.cat([body[sl.name].reshape(n * k, sl.size) for sl in spec.body], 1)
    parts = []
    for net, head in zip(nets, heads, strict=True):
        g = torch.cat([head[sl.name].reshape(k, sl.size) for sl in spec.heads[net]], 1)
        pad = spec.width - spec.p_body - g.shape[1]
        parts.append(torch.nn.functional.pad(g, (0, pad)) if pad else g)
    return torch.cat([rows.view(n, k, spec.p_body), torch.stack(parts)], 2)  # (n, K, P)


def _clamp_phase(spec: StepSpec, params: torch.Tensor) -> torch.Tensor:
    """theta_log <= its bound in both networks (StreamAC._bounded)."""
    (sl,) = [sl for sl in spec.body if sl.name == "core.theta_log"]
    lo, hi = sl.offset, sl.offset + sl.size
    mid = params[:, :, lo:hi].clamp(max=spec.phase_bound)
    return torch.cat([params[:, :, :lo], mid, params[:, :, hi:]], 2)


def obgd(spec: StepSpec, params, traces, g, delta, done):
    """Traces and ObGD (StreamAC._update), each network with its own kappa: (params, traces,
    step sizes (2, K))."""
    z = torch.add(g, traces, alpha=spec.discount * spec.trace_lambda)
    delta_bar = delta.abs().clamp(min=1.0)
    l1 = z.abs().sum(2)  # (2, K)
    # each network's lr kappa as a Python number (no tensor constant: inductor's C++ loop
    # does not declare constants inside a while_loop's body)
    lr_kappa = (spec.lr * spec.kappa_actor, spec.lr * spec.kappa_critic)
    bound = torch.stack([lr_kappa[i] * delta_bar * l1[i] for i in range(2)])  # (2, K)
    step_size = spec.lr / bound.clamp(min=1.0)  # (2, K)
    params = torch.addcmul(params, (step_size * delta).unsqueeze(2), z)
    params = _clamp_phase(spec, params)
    z = torch.where(done.view(1, spec.k, 1), torch.zeros_like(z), z)  # traces reset at an end
    return params, z, step_size


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


def pair_body_grads(spec: StepSpec, params, pend, g_first, g_second) -> torch.Tensor:
    """Both networks' gradients (2, K, P) for dL/d(head outputs) g_first and g_second (K, out)
    each, through the intermediates act kept (PairAgent.backward_bodies)."""
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
    named = named_grads(g_core, (g_w, g_b), (g_top_w, g_top_b))
    return flat_grads(spec, named, (g_head_a, g_head_c))


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
    g = pair_body_grads(
        spec, st.params, pend, g_params, torch.ones_like(pend.value).unsqueeze(1)
    )  # (2, K, P)
    params, z, step_size = obgd(spec, st.params, st.traces, g, delta, done)
    new = StepState(
        params, z, pend.core, *obs_st, *rew_st, x_next, done, st.steps + 1, st.seeds, st.extra
    )
    return new, StepInfo(delta, pend.value, entropy, step_size[0], step_size[1])


def step(
    spec: StepSpec, st: StepState, pend: Pending, reward, obs, final_obs, terminated, truncated
):
    """learn from the transition just taken, then act on the new observation: (state,
    pending, action (K,), StepInfo)."""
    st, info = learn(spec, st, pend, reward, obs, final_obs, terminated, truncated)
    action, pend = act(spec, st)
    return st, pend, action, info


# ---------------------------------------------------------------- packed: a few buffers in place
# A compiled call's cost grows with the tensors it takes and gives (~1.5 us each on a 2-core
# x86 CPU, ~30 us for one): the state and the pending intermediates travel as a few buffers
# updated in place, and the env's results as one (K, 3 + 2 O) float64 array.
