"""The eLSTM's history term and in-place carry as one Triton kernel (a candidate of
r2ac.rtrl.elstm.gpu_carry; imported only where triton is).

Per stream b the sensitivities FZ are stored as one (D, C = 2N) row-major block (elstm_math's
`zero_FZ`). A program owns one (BLOCK_D, BLOCK_C) tile of that block and a share of the
streams (every S-th); for each of its streams it loads the tile once, adds it, weighted by
d_hat, to its partial history sum, and with CARRY writes back G * FZ + sum_t outer(x(t), u(t)),
accumulated in registers. FZ is read once and written once, against five passes for the
PyTorch path; the S partial sums (S * D * C, small next to B * D * C) are added afterwards.

The sum over the segment's T steps is a small matrix product per stream, x_b^T (BLOCK_D, T)
times u_b (T, BLOCK_C). In float32 it runs as `tl.dot` over chunks of BLOCK_T steps on the
tensor cores in 3xTF32 (each operand split into a high and a low TF32 part, three products:
the one dropped, low x low, is ~2^-22 of the whole, where plain TF32 keeps ~2^-11), because
on an H200 the same sum as T rank-1 multiply-adds ran at ~5 TFLOP/s, 5.6x slower than
cuBLAS's float32 bmm (docs/log/gpu.md, first lease). In float64 it stays T rank-1 multiply-adds (no float64
tensor-core path in every Triton build; float64 is for checking exactness, not for speed).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from r2ac.rtrl.elstm.carry_math import carry_inputs, wb_increment

BLOCK_D, BLOCK_C, NUM_WARPS = 32, 64, 4  # float64, rank-1 updates
DOT_BLOCK_D, DOT_BLOCK_C, DOT_BLOCK_T, DOT_WARPS = 64, 64, 32, 4  # float32, tl.dot
DOT_PRECISION = "tf32x3"  # float32 accuracy on the tensor cores
PROGRAMS_PER_SM = 4  # streams are split until the grid has about this many programs per SM


@triton.jit
def _history_carry_kernel(
    fz, part, x, sx_t, sx_b, sx_d, u, g, dh, B, D, C, T, S,
    CARRY: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr,
    DOT: tl.constexpr, BLOCK_T: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """fz (B, D, C) overwritten if CARRY; part (S, D, C) the partial history sums; x (T, B, D)
    with strides sx_*; u (T, B, C), g and dh (B, C): the carry inputs and d_hat per column.
    DOT: the sum over steps as tl.dot over chunks of BLOCK_T steps, else rank-1 updates."""
    rd = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)
    rc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    share = tl.program_id(2)
    md, mc = rd < D, rc < C
    mask = md[:, None] & mc[None, :]
    tile = rd[:, None].to(tl.int64) * C + rc[None, :]  # offsets inside one stream's block
    hist = tl.zeros((BLOCK_D, BLOCK_C), dtype=fz.dtype.element_ty)
    for b in range(share, B, S):
        b64 = tl.cast(b, tl.int64)  # 64-bit offsets: B * D * C may pass 2**31
        block = fz + b64 * D * C + tile
        old = tl.load(block, mask=mask, other=0.0)
        weight = tl.load(dh + b64 * C + rc, mask=mc, other=0.0)
        hist += old * weight[None, :]
        if CARRY:
            scale = tl.load(g + b64 * C + rc, mask=mc, other=0.0)
            new = old * scale[None, :]
            if DOT:
                for t0 in range(0, T, BLOCK_T):
                    rt = t0 + tl.arange(0, BLOCK_T)
                    mt = rt < T
                    x_ptr = x + b64 * sx_b + rd[:, None] * sx_d + rt[None, :] * sx_t
                    xt = tl.load(x_ptr, mask=md[:, None] & mt[None, :], other=0.0)  # (Dt, Tt)
                    u_ptr = u + (rt[:, None] * B + b64) * C + rc[None, :]
                    ut = tl.load(u_ptr, mask=mt[:, None] & mc[None, :], other=0.0)  # (Tt, Ct)
                    new = tl.dot(xt, ut, new, input_precision=PRECISION)
            else:
                for t in range(T):
                    xv = tl.load(x + t * sx_t + b64 * sx_b + rd * sx_d, mask=md, other=0.0)
                    uv = tl.load(u + (t * B + b64) * C + rc, mask=mc, other=0.0)
                    new += xv[:, None] * uv[None, :]
            tl.store(block, new, mask=mask)
    tl.store(part + share.to(tl.int64) * D * C + tile, hist, mask=mask)


def _stream_shares(B: int, tiles: int, device: torch.device) -> int:
    """S: how many programs share the streams of one tile, so that the grid fills the GPU."""
    sms = (
        torch.cuda.get_device_properties(device).multi_processor_count
        if device.type == "cuda"
        else 1
    )
    return max(1, min(B, -(-PROGRAMS_PER_SM * sms // tiles)))


def _launch(
    blocks: Tensor, dh: Tensor, x: Tensor | None = None, u: Tensor | None = None,
    g: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """The history sum (D, C) of blocks (B, D, C) weighted by dh (B, C); with x (T, B, D),
    u (T, B, C) and g (B, C), blocks are carried in place too."""
    B, D, C = blocks.shape
    dot = blocks.dtype == torch.float32
    block_d, block_c, warps = (DOT_BLOCK_D, DOT_BLOCK_C, DOT_WARPS) if dot else (
        BLOCK_D, BLOCK_C, NUM_WARPS)  # fmt: skip
    grid_dc = (triton.cdiv(D, block_d), triton.cdiv(C, block_c))
    S = _stream_shares(B, grid_dc[0] * grid_dc[1], blocks.device)
    part = blocks.new_empty(S, D, C)
    carry = x is not None
    if not carry:  # unused pointers: any tensor of the right dtype
        x, u, g, T, strides = blocks, blocks, blocks, 0, (0, 0, 0)
    else:
        T, strides = x.shape[0], x.stride()
    _history_carry_kernel[(*grid_dc, S)](
        blocks, part, x, *strides, u, g, dh, B, D, C, T, S,
        CARRY=carry, BLOCK_D=block_d, BLOCK_C=block_c, DOT=dot, BLOCK_T=DOT_BLOCK_T,
        PRECISION=DOT_PRECISION, num_warps=warps,
    )  # fmt: skip
    return part[0] if S == 1 else part.sum(0)


def history(stored: Tensor, wb: Tensor, d_hat: Tensor) -> tuple[Tensor, Tensor]:
    """gpu_carry.fused_history: stored (B, D, 2, N) contiguous, wb (B, 4, N), d_hat (B, N)."""
    B, D, _, N = stored.shape
    hist = _launch(stored.view(B, D, 2 * N), d_hat.repeat(1, 2))  # (D, 2N)
    return hist.view(D, 2, N).permute(1, 2, 0), torch.einsum("bn,bkn->kn", d_hat, wb)


def history_and_carry(
    stored: Tensor, wb: Tensor, fh: Tensor, zh: Tensor, a: Tensor, cp: Tensor, x: Tensor,
    d_hat: Tensor,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """gpu_carry.fused_history_and_carry, FZ read and written once by the kernel."""
    T, B, N = fh.shape
    D = stored.shape[1]
    u, G = carry_inputs(fh, zh, a)  # (T, B, 2, N), (B, N)
    d_wb = torch.einsum("bn,bkn->kn", d_hat, wb)  # before wb changes
    hist = _launch(
        stored.view(B, D, 2 * N), d_hat.repeat(1, 2), x, u.reshape(T, B, 2 * N), G.repeat(1, 2)
    )
    wb.mul_(G[:, None, :]).add_(wb_increment(u, cp))
    return hist.view(D, 2, N).permute(1, 2, 0), d_wb
