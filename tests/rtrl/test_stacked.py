"""Stacked cores (r2ac.rtrl.stacked): exactness against references written from the equations.

1. rule rtrl: every step's autograd gradient == full BPTT through the whole stream (resets inside)
2. rule bptt: == BPTT truncated at one step
3. K agents together == K runs alone (1,000 steps, weights updated every step)
4. K = 1 == the batched module of the same name (r2ac.rtrl.registry), outputs and gradients
5. bad names / sizes -> ConfigError

All in float64. In float32 the rtrl gradients agree with the float64 ones to ~5e-6 (RTU),
~1e-6 (eLSTM) relative to the largest entry (40 steps, K = 3; test_float32_tolerance).
"""

import math

import pytest
import torch

from r2ac.errors import ConfigError
from r2ac.rtrl.registry import make_core
from r2ac.rtrl.stacked import (
    MODULE_NAMES,
    STACKED_CORES,
    make_stacked_core,
    params_from_modules,
    stacked_core_names,
)
from r2ac.rtrl.stacked.bench import bench_stacked, format_bench

F64 = torch.float64
RTRL = [n for n in STACKED_CORES if n.endswith("-rtrl")]
TRUNCATED = [n for n in STACKED_CORES if not n.endswith("-rtrl")]
K, D, N, T = 3, 5, 6, 40


# ----------------------------------------------------------------------------- reference


def _rotation(p, h, u1, u2, gamma):
    """One complex-diagonal step in real pairs: h (K, 2, U) -> (K, 2, U)."""
    r = torch.exp(-torch.exp(p["nu_log"]))
    th = torch.exp(p["theta_log"])
    g, phi = r * torch.cos(th), r * torch.sin(th)
    a1 = g * h[:, 0] - phi * h[:, 1] + gamma * u1
    a2 = g * h[:, 1] + phi * h[:, 0] + gamma * u2
    return torch.stack([a1, a2], 1)


def reference_step(name, p, x, h):
    """Straight from the modules' equations: (output, new state); h already reset-masked."""
    mv = lambda W, v: torch.einsum("kij,kj->ki", W, v)  # noqa: E731
    if name.startswith("rtu"):
        r = torch.exp(-torch.exp(p["nu_log"]))
        s = _rotation(p, h, mv(p["W1"], x), mv(p["W2"], x), torch.sqrt(1 - r * r))
        return torch.tanh(torch.cat([s[:, 0], s[:, 1]], 1)), s
    if name.startswith("lru"):
        gamma = torch.exp(p["gamma_log"])
        s = _rotation(p, h, mv(p["B_re"], x), mv(p["B_im"], x), gamma)
        return mv(p["C_re"], s[:, 0]) - mv(p["C_im"], s[:, 1]) + mv(p["D"], x), s
    if name.startswith("elstm"):
        f = torch.sigmoid(mv(p["F"], x) + p["b_f"] + p["w_f"] * h)
        z = torch.tanh(mv(p["Z"], x) + p["b_z"] + p["w_z"] * h)
        c = f * h + (1 - f) * z
        o = torch.sigmoid(mv(p["O"], x) + p["b_o"] + mv(p["W_o"], c))
        return o * c, c
    if name.startswith("mingru"):
        z = torch.sigmoid(mv(p["W_z"], x) + p["b_z"])
        pre = mv(p["W_h"], x) + p["b_h"]
        c = torch.where(pre >= 0, pre + 0.5, torch.sigmoid(pre))
        hn = (1 - z) * h + z * c
        return torch.tanh(hn), hn
    if name.startswith("gru"):
        n_ = h.shape[1]
        gi, gh = mv(p["W_ih"], x) + p["b_ih"], mv(p["W_hh"], h) + p["b_hh"]
        r = torch.sigmoid(gi[:, :n_] + gh[:, :n_])
        z = torch.sigmoid(gi[:, n_ : 2 * n_] + gh[:, n_ : 2 * n_])
        n = torch.tanh(gi[:, 2 * n_ :] + r * gh[:, 2 * n_ :])
        hn = (1 - z) * n + z * h
        return hn, hn
    return torch.relu(mv(p["weight"], x) + p["bias"]), h


def zero_state(name, core):
    if name.startswith("rtu"):
        return torch.zeros(core.num_agents, 2, core.hidden_size // 2, dtype=F64)
    if name.startswith("lru"):
        return torch.zeros(core.num_agents, 2, core.hidden_size, dtype=F64)
    return torch.zeros(core.num_agents, core.hidden_size, dtype=F64)


def mask(h, reset):
    keep = (~reset).to(h.dtype)
    return h * keep.view(-1, *([1] * (h.dim() - 1)))


# ----------------------------------------------------------------------------- fixtures


def make_params(core, seed):
    """The module's initialisation, then every tensor nudged (so zero biases etc. take part)."""
    gens = [torch.Generator().manual_seed(seed + k) for k in range(core.num_agents)]
    params = core.init_params(gens)
    g = torch.Generator().manual_seed(seed + 100)
    for p in params.values():
        p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return params


def stream(K_, T_, D_, seed, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(T_, K_, D_, generator=g, dtype=dtype)
    resets = torch.rand(T_, K_, generator=g) < 0.12
    resets[0] = True
    return xs, resets


def leaves(params):
    return {n: p.detach().clone().requires_grad_() for n, p in params.items()}


def max_err(a, b):
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def stacked_gradients(name, params, xs, resets, vs, dtype=F64):
    """Per step: (h, grads w.r.t. params then x) from step()."""
    core = make_stacked_core(name, xs.shape[1], xs.shape[2], N, dtype)
    p = leaves(params)
    state, out = core.initial_state(), []
    for t in range(xs.shape[0]):
        x = xs[t].clone().requires_grad_()
        h, state = core.step(p, x, state, resets[t])
        grads = torch.autograd.grad((vs[t] * h).sum(), [*p.values(), x])
        out.append((h.detach(), grads))
    return out


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", list(STACKED_CORES))
def test_against_bptt_reference(name):
    """rtrl: == full BPTT from step 0 (resets inside); others: == BPTT truncated at one step."""
    core = make_stacked_core(name, K, D, N, F64)
    params = make_params(core, 7)
    xs, resets = stream(K, T, D, 1)
    vs = torch.randn(T, K, core.output_size, generator=torch.Generator().manual_seed(2), dtype=F64)
    got = stacked_gradients(name, params, xs, resets, vs)
    truncate = not name.endswith("-rtrl")
    p = leaves(params)
    x_leaves = [xs[t].clone().requires_grad_() for t in range(T)]
    h = zero_state(name, core)
    worst_out = worst_grad = 0.0
    for t in range(T):
        prev = h.detach() if truncate else h
        y, h = reference_step(name, p, x_leaves[t], mask(prev, resets[t]))
        want = torch.autograd.grad((vs[t] * y).sum(), [*p.values(), x_leaves[t]], retain_graph=True)
        worst_out = max(worst_out, max_err([got[t][0]], [y.detach()]))
        worst_grad = max(worst_grad, max_err(got[t][1], want))
    assert worst_out < 1e-12, worst_out
    assert worst_grad < 1e-10, worst_grad  # observed: ~1e-15


@pytest.mark.parametrize("name", list(STACKED_CORES))
def test_lockstep_equals_alone(name):
    """K agents in lockstep == each agent alone (K = 1, its own generator), 1,000 steps with an
    SGD update of every agent's weights after every step: outputs and gradients to 1e-10.

    Not bit-exact: element-wise kernels take vectorised or scalar paths depending on the
    tensor size (K), so results differ in the last bit, and the updates carry that on."""
    steps, lr, K_ = 1000, 1e-4, 3
    xs, resets = stream(K_, steps, D, 3)
    vs = torch.randn(steps, K_, N, generator=torch.Generator().manual_seed(4), dtype=F64)

    def run(k_slice):
        k0 = k_slice.start
        core = make_stacked_core(name, k_slice.stop - k0, D, N, F64)
        gens = [torch.Generator().manual_seed(10 + k) for k in range(k0, k_slice.stop)]
        p = {n: t.requires_grad_() for n, t in core.init_params(gens).items()}
        state, hs, gs = core.initial_state(), [], []
        for t in range(steps):
            x = xs[t, k_slice].clone().requires_grad_()
            h, state = core.step(p, x, state, resets[t, k_slice])
            grads = torch.autograd.grad((vs[t, k_slice] * h).sum(), [*p.values(), x])
            with torch.no_grad():
                for w, g in zip(p.values(), grads):
                    w -= lr * g
            hs.append(h.detach())
            gs.append(torch.cat([g.reshape(g.shape[0], -1) for g in grads], 1))
        return torch.stack(hs), torch.stack(gs)

    h_all, g_all = run(slice(0, K_))
    for k in range(K_):
        h_k, g_k = run(slice(k, k + 1))
        err_h = float((h_all[:, k] - h_k[:, 0]).abs().max())
        # gradients relative to their largest entry at that step (RTU/LRU theta_log's reach ~1e3)
        scale = g_all[:, k].abs().amax(1, keepdim=True).clamp_min(1.0)
        err_g = float(((g_all[:, k] - g_k[:, 0]).abs() / scale).max())
        print(
            f"{name} agent {k}: outputs {err_h:.1e}, gradients {err_g:.1e} (max |g| {float(scale.max()):.0f})"
        )
        assert err_h < 1e-10 and err_g < 1e-10, (err_h, err_g)


@pytest.mark.parametrize("name", list(STACKED_CORES))
def test_same_as_batched_module(name):
    """K = 1 and the module's weights: the module's outputs step by step (B = 1, T = 1) to
    1e-12, and its gradients (its exact RTRL / truncation at every one-step segment) too; and
    init_params(generator seeded s) draws the module's initial weights under torch.manual_seed(s)."""
    torch.manual_seed(5)
    module = make_core(name, D, N, dtype=F64)
    core = make_stacked_core(name, 1, D, N, F64)
    drawn = core.init_params(torch.Generator().manual_seed(5))
    params = params_from_modules(core, [module])
    for n in params:
        assert torch.equal(drawn[n], params[n]), n
    xs, resets = stream(1, 30, D, 6)
    p = leaves(params)
    names = MODULE_NAMES.get(name, {})
    m_params = [dict(module.named_parameters())[names.get(n, n)] for n in p]
    state, m_state = core.initial_state(), module.initial_state(1)
    worst_out = worst_grad = 0.0
    for t in range(30):
        x = xs[t].clone().requires_grad_()
        h, state = core.step(p, x, state, resets[t])
        xm = xs[t].clone().view(1, 1, D).requires_grad_()
        y, m_state = module(xm, m_state, reset=resets[t].view(1, 1))
        worst_out = max(worst_out, float((h - y[0]).detach().abs().max()))
        g = torch.autograd.grad(h.sum(), [*p.values(), x])
        gm = torch.autograd.grad(y.sum(), [*m_params, xm])
        worst_grad = max(worst_grad, max_err([a.reshape(b.shape) for a, b in zip(g, gm)], gm))
    assert worst_out < 1e-12, worst_out
    assert worst_grad < 1e-10, worst_grad


@pytest.mark.parametrize("name", list(STACKED_CORES))
def test_peek_and_state(name):
    """peek == step's output without changing anything; the state is (K, ...) tensors, detached."""
    core = make_stacked_core(name, K, D, N, F64)
    params = {n: t.requires_grad_() for n, t in make_params(core, 1).items()}
    xs, resets = stream(K, 5, D, 2)
    state = core.initial_state()
    for t in range(5):
        before = [s.clone() for s in state]
        peek = core.peek(params, xs[t], state, resets[t])
        assert not peek.requires_grad
        assert all(torch.equal(a, b) for a, b in zip(before, state))
        h, state = core.step(params, xs[t], state, resets[t])
        assert h.shape == (K, core.output_size) and h.requires_grad
        assert torch.allclose(peek, h.detach(), rtol=0, atol=1e-14)
        assert all(s.shape[0] == K and not s.requires_grad for s in state)
    if name.endswith("-rtrl"):
        assert None not in state
        assert core.sensitivity_numbers() == sum(s[0].numel() for s in state[1:])


def test_bad_names_and_sizes():
    with pytest.raises(ConfigError, match="rtu-rtrl"):
        make_stacked_core("lstm-rtrl", 1, D, N)
    for kw in ({"num_agents": 0}, {"input_size": 0}, {"hidden_size": -1}, {"num_agents": 1.5}):
        with pytest.raises(ConfigError):
            make_stacked_core("elstm-rtrl", **{"num_agents": 1, "input_size": 3} | kw)
    with pytest.raises(ConfigError, match="even"):
        make_stacked_core("rtu-rtrl", 1, D, 5)
    with pytest.raises(ConfigError):
        make_stacked_core("gru-bptt", 2, D, N).init_params([torch.Generator()])
    assert stacked_core_names() == list(STACKED_CORES)


@pytest.mark.parametrize("name", RTRL)
def test_float32_tolerance(name):
    """float32 rtrl gradients against the float64 ones: relative error < 1e-4 (observed <= 5e-6)."""
    core = make_stacked_core(name, K, D, N, F64)
    params = make_params(core, 7)
    xs, resets = stream(K, T, D, 1)
    vs = torch.randn(T, K, core.output_size, generator=torch.Generator().manual_seed(2), dtype=F64)
    g64 = stacked_gradients(name, params, xs, resets, vs)
    p32 = {n: t.float() for n, t in params.items()}
    g32 = stacked_gradients(name, p32, xs.float(), resets, vs.float(), torch.float32)
    worst = 0.0
    for (_, a), (_, b) in zip(g64, g32):
        for x, y in zip(a, b):
            worst = max(worst, float((x - y.double()).abs().max() / x.abs().max().clamp_min(1e-30)))
    assert worst < 1e-4, worst
    assert math.isfinite(worst)


def test_bench_smoke():
    rows = bench_stacked(("rtu-rtrl", "rtu-bptt"), ks=(2,), input_size=4, hidden_size=4,
                         steps=3, warmup=1)  # fmt: skip
    assert [(r["name"], r["K"]) for r in rows] == [("rtu-rtrl", 2), ("rtu-bptt", 2)]
    assert rows[0]["rtrl_over_bptt"] > 0 and "rtu-rtrl" in format_bench(rows)
