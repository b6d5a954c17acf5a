"""Slow reference implementations, written straight from the equations, for gradient checks.

Each reference is a plain step-by-step loop of differentiable torch ops: autograd through it
is full BPTT over whatever history it is given. They take parameters as a dict so that the
gradient-check harness can compare them with any layer that uses the same parameter names.

    reference(params, x (T, B, D), reset (T, B) bool, state0 | None) -> (y (T, B, N), state_T)

Kept in the package (not in tests/) because later cores, the demo command and users who add
their own cores all check against them.
"""

from __future__ import annotations

import torch
from torch import Tensor


def elstm_reference(
    params: dict[str, Tensor], x: Tensor, reset: Tensor, c0: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """eLSTM of docs/design.md ("The eLSTM layer"), one step at a time."""
    F, Z, O, W_o = params["F"], params["Z"], params["O"], params["W_o"]
    w_f, w_z, b_f, b_z, b_o = (params[k] for k in ("w_f", "w_z", "b_f", "b_z", "b_o"))
    T, B, _ = x.shape
    c = x.new_zeros(B, F.shape[0]) if c0 is None else c0
    hs = []
    for t in range(T):
        c = torch.where(reset[t, :, None], torch.zeros_like(c), c)
        f = torch.sigmoid(x[t] @ F.T + w_f * c + b_f)
        z = torch.tanh(x[t] @ Z.T + w_z * c + b_z)
        c = f * c + (1 - f) * z
        o = torch.sigmoid(x[t] @ O.T + c @ W_o.T + b_o)
        hs.append(o * c)
    return torch.stack(hs), c


def elman_reference(
    params: dict[str, Tensor], x: Tensor, reset: Tensor, h0: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Elman RNN, h(t) = sigmoid(W x(t) + R h(t-1) + b), one step at a time."""
    W, R, b = params["W"], params["R"], params["b"]
    T, B, _ = x.shape
    h = x.new_zeros(B, W.shape[0]) if h0 is None else h0
    hs = []
    for t in range(T):
        h = torch.where(reset[t, :, None], torch.zeros_like(h), h)
        h = torch.sigmoid(x[t] @ W.T + h @ R.T + b)
        hs.append(h)
    return torch.stack(hs), h


def fwp_reference(
    params: dict[str, Tensor], x: Tensor, reset: Tensor, W0: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """One-layer fast weight programmer: W(t) = W(t-1) + outer(v, k), y = W(t) sigmoid(q)."""
    K, V, Q = params["K"], params["V"], params["Q"]
    T, B, _ = x.shape
    N = K.shape[0]
    W = x.new_zeros(B, N, N) if W0 is None else W0
    ys = []
    for t in range(T):
        W = torch.where(reset[t, :, None, None], torch.zeros_like(W), W)
        k, v, q = x[t] @ K.T, x[t] @ V.T, x[t] @ Q.T
        W = W + v[:, :, None] * k[:, None, :]
        ys.append((W @ torch.sigmoid(q)[:, :, None])[:, :, 0])
    return torch.stack(ys), W


def felstm_reference(
    params: dict[str, Tensor], x: Tensor, reset: Tensor, c0: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """feLSTM (A.5): the eLSTM with full recurrent matrices W_f, W_z, one step at a time."""
    F, Z, O, W_o = params["F"], params["Z"], params["O"], params["W_o"]
    W_f, W_z, b_f, b_z, b_o = (params[k] for k in ("W_f", "W_z", "b_f", "b_z", "b_o"))
    T, B, _ = x.shape
    c = x.new_zeros(B, F.shape[0]) if c0 is None else c0
    hs = []
    for t in range(T):
        c = torch.where(reset[t, :, None], torch.zeros_like(c), c)
        f = torch.sigmoid(x[t] @ F.T + c @ W_f.T + b_f)
        z = torch.tanh(x[t] @ Z.T + c @ W_z.T + b_z)
        c = f * c + (1 - f) * z
        o = torch.sigmoid(x[t] @ O.T + c @ W_o.T + b_o)
        hs.append(o * c)
    return torch.stack(hs), c


def lstm_reference(
    params: dict[str, Tensor],
    x: Tensor,
    reset: Tensor,
    state0: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Standard LSTM, gates stacked (i, f, g, o) in W_ih (4N, D), W_hh (4N, N), b (4N,)."""
    W_ih, W_hh, b = params["W_ih"], params["W_hh"], params["b"]
    T, B, _ = x.shape
    N = W_hh.shape[1]
    h, c = (x.new_zeros(B, N), x.new_zeros(B, N)) if state0 is None else state0
    hs = []
    for t in range(T):
        h = torch.where(reset[t, :, None], torch.zeros_like(h), h)
        c = torch.where(reset[t, :, None], torch.zeros_like(c), c)
        i, f, g, o = (x[t] @ W_ih.T + h @ W_hh.T + b).chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        hs.append(h)
    return torch.stack(hs), (h, c)


def gru_reference(
    params: dict[str, Tensor],
    x: Tensor,
    reset: Tensor,
    state0: tuple[Tensor] | None = None,
) -> tuple[Tensor, tuple[Tensor]]:
    """GRU (PyTorch's form), gates stacked (r, z, n) in W_ih (3N, D), W_hh (3N, N), b_ih, b_hh."""
    W_ih, W_hh, b_ih, b_hh = params["W_ih"], params["W_hh"], params["b_ih"], params["b_hh"]
    T, B, _ = x.shape
    N = W_hh.shape[1]
    h = x.new_zeros(B, N) if state0 is None else state0[0]
    hs = []
    for t in range(T):
        h = torch.where(reset[t, :, None], torch.zeros_like(h), h)
        r_x, z_x, n_x = (x[t] @ W_ih.T + b_ih).chunk(3, -1)
        r_h, z_h, n_h = (h @ W_hh.T + b_hh).chunk(3, -1)
        r, z = torch.sigmoid(r_x + r_h), torch.sigmoid(z_x + z_h)
        n = torch.tanh(n_x + r * n_h)
        h = (1 - z) * n + z * h
        hs.append(h)
    return torch.stack(hs), (h,)


def rtu_reference(
    params: dict[str, Tensor],
    x: Tensor,
    reset: Tensor,
    c0: tuple[Tensor, Tensor] | None = None,
    nonlinear: bool = False,
    activation: str = "tanh",
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Recurrent trace units (Elelimy et al. 2024, Sec. 4), real form, one step at a time.

    Linear: c <- rotation, h = act([c1; c2]); non-linear: c <- act(rotation), h = [c1; c2].
    """
    nu_log, theta_log, W1, W2 = params["nu_log"], params["theta_log"], params["W1"], params["W2"]
    act = torch.tanh if activation == "tanh" else torch.relu
    r = torch.exp(-torch.exp(nu_log))
    theta = torch.exp(theta_log)
    g, phi, gamma = r * torch.cos(theta), r * torch.sin(theta), torch.sqrt(1 - r**2)
    T, B, _ = x.shape
    c1, c2 = (x.new_zeros(B, W1.shape[0]), x.new_zeros(B, W1.shape[0])) if c0 is None else c0
    hs = []
    for t in range(T):
        c1 = torch.where(reset[t, :, None], torch.zeros_like(c1), c1)
        c2 = torch.where(reset[t, :, None], torch.zeros_like(c2), c2)
        a1 = g * c1 - phi * c2 + gamma * (x[t] @ W1.T)
        a2 = g * c2 + phi * c1 + gamma * (x[t] @ W2.T)
        c1, c2 = (act(a1), act(a2)) if nonlinear else (a1, a2)
        hs.append(torch.cat([c1, c2], -1) if nonlinear else act(torch.cat([c1, c2], -1)))
    return torch.stack(hs), (c1, c2)


def lru_reference(
    params: dict[str, Tensor], x: Tensor, reset: Tensor, h0: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Linear recurrent unit (Orvieto et al. 2023), in complex arithmetic, one step at a time.

    h <- Lambda h + exp(gamma_log) (B x), Lambda = exp(-exp(nu_log) + i exp(theta_log));
    y = Re(C h) + D x. The state is a complex tensor (the layer under test uses real pairs).
    """
    lam = torch.exp(torch.complex(-torch.exp(params["nu_log"]), torch.exp(params["theta_log"])))
    Bc = torch.complex(params["B_re"], params["B_im"])
    C = torch.complex(params["C_re"], params["C_im"])
    gamma = torch.exp(params["gamma_log"])
    T, B, _ = x.shape
    xc = x.to(Bc.dtype)
    h = torch.zeros(B, Bc.shape[0], dtype=Bc.dtype, device=x.device) if h0 is None else h0
    ys = []
    for t in range(T):
        h = torch.where(reset[t, :, None], torch.zeros_like(h), h)
        h = lam * h + gamma * (xc[t] @ Bc.T)
        ys.append((h @ C.T).real + x[t] @ params["D"].T)
    return torch.stack(ys), h


def mingru_reference(
    params: dict[str, Tensor],
    x: Tensor,
    reset: Tensor,
    h0: Tensor | None = None,
    candidate: str = "g",
    output: str = "tanh",
) -> tuple[Tensor, Tensor]:
    """minGRU (Feng et al. 2024), one step at a time: z = sigmoid(W_z x + b_z),
    c = g(W_h x + b_h) (g(a) = a + 1/2 for a >= 0, sigmoid(a) below; or c = W_h x + b_h for
    candidate "linear"), h <- (1 - z) h + z c, y = tanh(h) (or h for output "identity")."""
    W_z, W_h, b_z, b_h = params["W_z"], params["W_h"], params["b_z"], params["b_h"]
    T, B, _ = x.shape
    h = x.new_zeros(B, W_z.shape[0]) if h0 is None else h0
    ys = []
    for t in range(T):
        h = torch.where(reset[t, :, None], torch.zeros_like(h), h)
        z = torch.sigmoid(x[t] @ W_z.T + b_z)
        pre = x[t] @ W_h.T + b_h
        if candidate == "linear":
            c = pre
        else:
            c = torch.where(pre >= 0, pre + 0.5, torch.sigmoid(pre))
        h = (1 - z) * h + z * c
        ys.append(torch.tanh(h) if output == "tanh" else h)
    return torch.stack(ys), h
