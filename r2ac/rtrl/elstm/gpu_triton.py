"""The eLSTM's history term and in-place carry as one Triton kernel (a candidate of
r2ac.rtrl.elstm.gpu_carry; imported only where triton is).

Per stream b the sensitivities FZ are stored as one (D, C = 2N) row-major block (elstm_math's
`zero_FZ`). In `_history_carry_kernel` a program owns one (BLOCK_D, BLOCK_C) tile of that
block and a share of the streams (every S-th); for each of its streams it loads the tile once,
adds it, weighted by d_hat, to its partial history sum, and with CARRY writes back G * FZ +
sum_t outer(x(t), u(t)), accumulated in registers. FZ is read once and written once, against
five passes for the PyTorch path; the S partial sums (S * D * C, small next to B * D * C) are
added afterwards. On an H200 that loop over streams was latency-bound: with `stream_grid` (float32's default) the history is
that kernel without CARRY, FZ read only, and the carry is `_carry_tile_kernel`, one program per
(tile, stream): FZ read twice and written once, in 0.59x the time at (100, 256, 1024, 257),
and in 32 x 64 tiles of two warps (more programs in flight) 0.79x that again. (Loading the
FZ tile before the dots, or one program walking several C tiles, measured slower there.)

The sum over the segment's T steps is a small matrix product per stream, x_b^T (BLOCK_D, T)
times u_b (T, BLOCK_C). In float32 it runs as `tl.dot` over chunks of BLOCK_T steps on the
tensor cores in 3xTF32 (each operand split into a high and a low TF32 part, three products:
the one dropped, low x low, is ~2^-22 of the whole, where plain TF32 keeps ~2^-11), because
on an H200 the same sum as T rank-1 multiply-adds ran at ~5 TFLOP/s, 5.6x slower than
cuBLAS's float32 bmm. In float64 it stays T rank-1
multiply-adds (no float64 tensor-core path in every Triton build; float64 is for checking
exactness, not for speed).

The carry's inputs u (T, B, 2N) and G, and the update of wb, come from a second, small kernel
run first (`_carry_inputs_kernel`: one scan backwards over the steps per stream and unit).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from torch import Tensor

from r2ac.errors import ConfigError


@dataclass(frozen=True)
class KernelConfig:
    """How the kernels are launched: the tile, the steps a tl.dot takes at once, warps and
    pipeline stages, the dot's precision (None: rank-1 updates, no tl.dot), how many programs
    per SM the streams are split over in `_history_carry_kernel`, and whether the carry runs
    as `_carry_tile_kernel` on the stream grid. $R2AC_TRITON_CONFIG sets it (`parse`)."""

    block_d: int
    block_c: int
    block_t: int = 32
    warps: int = 4
    stages: int | None = None  # None: Triton's default
    precision: str | None = "tf32x3"
    programs_per_sm: int = 4
    stream_grid: bool = False  # carry: one program per (tile, stream), after a history pass

    def describe(self) -> str:
        """E.g. '64x64 t32 w4 s- tf32x3 p4' ('s-': default stages; 'rank1': no tl.dot; a
        last word 'streams': stream_grid), the form `parse` and $R2AC_TRITON_CONFIG take."""
        return (
            f"{self.block_d}x{self.block_c} t{self.block_t} w{self.warps} s{self.stages or '-'}"
            f" {self.precision or 'rank1'} p{self.programs_per_sm}"
            + (" streams" if self.stream_grid else "")
        )

    @staticmethod
    def parse(text: str) -> KernelConfig:
        try:
            tile, t, w, st, precision, p, *grid = text.split()
            block_d, block_c = tile.split("x")
            assert t[0] == "t" and w[0] == "w" and st[0] == "s" and p[0] == "p"
            assert precision in ("tf32x3", "tf32", "ieee", "rank1")
            assert grid in ([], ["streams"])
            return KernelConfig(
                int(block_d), int(block_c), int(t[1:]), int(w[1:]),
                None if st == "s-" else int(st[1:]),
                None if precision == "rank1" else precision, int(p[1:]), bool(grid),
            )  # fmt: skip
        except (ValueError, AssertionError):
            raise ConfigError(
                f"{CONFIG_ENV}={text!r}: expected e.g. '64x64 t32 w4 s- tf32x3 p4' (tile DxC,"
                " steps per dot, warps, stages or s-, tf32x3|tf32|ieee|rank1, programs per SM,"
                " optionally 'streams')"
            ) from None


MAX_GRID_Z = 65535  # CUDA's limit on a grid's third dimension: more streams, the stream loop
CONFIG_ENV = "R2AC_TRITON_CONFIG"  # the float32 launch, for measuring another one


# float32: tl.dot in 3xTF32 (float32 accuracy on the tensor cores), the carry on the stream
# grid in 32 x 64 tiles of two warps: the fastest launch measured on an
# H200 at three shapes (1.25-1.32 ms against
# 1.64-1.67 for 64 x 64 tiles of four warps and 2.8 for the one-pass kernel at (100, 256,
# 1024, 257)); float64: rank-1 updates on the stream loop (its launch was never swept)
DEFAULT_CONFIG = {
    torch.float32: KernelConfig(32, 64, 16, 2, None, "tf32x3", 4, stream_grid=True),
    torch.float64: KernelConfig(32, 64, 32, 4, None, None, 4),
}


@triton.jit
def _add_outer_sum(
    acc, x, sx_t, sx_b, sx_d, u, b, B, C, T, rd, rc, md, mc,
    DOT: tl.constexpr, BLOCK_T: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """acc (Dt, Ct) + sum_t outer(x_b(t), u_b(t)) over stream b's tile rows rd, columns rc:
    DOT, tl.dot over chunks of BLOCK_T steps; else T rank-1 multiply-adds."""
    if DOT:
        for t0 in range(0, T, BLOCK_T):
            rt = t0 + tl.arange(0, BLOCK_T)
            mt = rt < T
            x_ptr = x + b * sx_b + rd[:, None] * sx_d + rt[None, :] * sx_t
            xt = tl.load(x_ptr, mask=md[:, None] & mt[None, :], other=0.0)  # (Dt, Tt)
            u_ptr = u + (rt[:, None] * B + b) * C + rc[None, :]
            ut = tl.load(u_ptr, mask=mt[:, None] & mc[None, :], other=0.0)  # (Tt, Ct)
            acc = tl.dot(xt, ut, acc, input_precision=PRECISION)
    else:
        for t in range(T):
            xv = tl.load(x + t * sx_t + b * sx_b + rd * sx_d, mask=md, other=0.0)
            uv = tl.load(u + (t * B + b) * C + rc, mask=mc, other=0.0)
            acc += xv[:, None] * uv[None, :]
    return acc


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
            new = _add_outer_sum(
                old * scale[None, :], x, sx_t, sx_b, sx_d, u, b64, B, C, T, rd, rc, md, mc,
                DOT, BLOCK_T, PRECISION,
            )  # fmt: skip
            tl.store(block, new, mask=mask)
    tl.store(part + share.to(tl.int64) * D * C + tile, hist, mask=mask)


@triton.jit
def _carry_tile_kernel(
    fz, x, sx_t, sx_b, sx_d, u, g, B, D, C, T,
    BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr, DOT: tl.constexpr, BLOCK_T: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """The carry alone, one program per (tile, stream): fz[b] tile = g * fz[b] tile +
    x_b^T u_b over the tile, the sum over steps a small GEMM over chunks of steps. Programs
    of one stream are neighbours in the grid, so x_b and u_b are mostly read from L2.
    (_history_carry_kernel's stream loop serialises the loads of each stream's x and u behind
    its dot: on an H200 it measured latency-bound.)"""
    rd = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)
    rc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    b = tl.program_id(2).to(tl.int64)
    md, mc = rd < D, rc < C
    acc = _add_outer_sum(
        tl.zeros((BLOCK_D, BLOCK_C), dtype=fz.dtype.element_ty), x, sx_t, sx_b, sx_d, u, b, B,
        C, T, rd, rc, md, mc, DOT, BLOCK_T, PRECISION,
    )  # fmt: skip
    mask = md[:, None] & mc[None, :]
    block = fz + b * D * C + rd[:, None].to(tl.int64) * C + rc[None, :]
    scale = tl.load(g + b * C + rc, mask=mc, other=0.0)
    tl.store(block, tl.load(block, mask=mask, other=0.0) * scale[None, :] + acc, mask=mask)


@triton.jit
def _carry_inputs_kernel(fh, zh, a, cp, wb, u, g2, B, N, T, BLOCK: tl.constexpr):
    """Per (stream b, unit n), one scan backwards over the T steps of the trace fh, zh, a, cp
    (T, B, N): u[t, b] = g(t) * [fh; zh](t) into u (T, B, 2N), with g(t) = prod_{s > t} a(s);
    G = prod_s a(s) into both halves of g2 (B, 2N); and wb (B, 4, N) carried in place,
    wb = G * wb + sum_t [u_f cp, u_z cp, u_f, u_z]. What carry_inputs, wb_increment and the
    update of wb do in some fifteen PyTorch ops, in one launch."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # b * N + n
    m = i < B * N
    b = i // N
    n = i - b * N
    g = tl.full((BLOCK,), 1.0, dtype=fh.dtype.element_ty)
    s_fcp = tl.zeros((BLOCK,), dtype=fh.dtype.element_ty)
    s_zcp, s_f, s_z = s_fcp, s_fcp, s_fcp
    for k in range(T):
        t = T - 1 - k
        off = t * B * N + i
        u_f = g * tl.load(fh + off, mask=m, other=0.0)
        u_z = g * tl.load(zh + off, mask=m, other=0.0)
        row = (t * B + b).to(tl.int64) * (2 * N)
        tl.store(u + row + n, u_f, mask=m)
        tl.store(u + row + N + n, u_z, mask=m)
        c = tl.load(cp + off, mask=m, other=0.0)
        s_fcp += u_f * c
        s_zcp += u_z * c
        s_f += u_f
        s_z += u_z
        g *= tl.load(a + off, mask=m, other=0.0)
    tl.store(g2 + b * (2 * N) + n, g, mask=m)
    tl.store(g2 + b * (2 * N) + N + n, g, mask=m)
    w = wb + b * (4 * N) + n
    tl.store(w, g * tl.load(w, mask=m, other=0.0) + s_fcp, mask=m)
    tl.store(w + N, g * tl.load(w + N, mask=m, other=0.0) + s_zcp, mask=m)
    tl.store(w + 2 * N, g * tl.load(w + 2 * N, mask=m, other=0.0) + s_f, mask=m)
    tl.store(w + 3 * N, g * tl.load(w + 3 * N, mask=m, other=0.0) + s_z, mask=m)


INPUTS_BLOCK = 256


def _carry_inputs_and_wb(fh, zh, a, cp, wb) -> tuple[Tensor, Tensor]:
    """u (T, B, 2N) and G over both halves (B, 2N) of a segment, wb carried in place."""
    T, B, N = fh.shape
    u, g2 = fh.new_empty(T, B, 2 * N), fh.new_empty(B, 2 * N)
    fh, zh, a, cp = (v.contiguous() for v in (fh, zh, a, cp))
    w = wb.contiguous()  # the kernel writes (B, 4, N) row-major
    grid = (triton.cdiv(B * N, INPUTS_BLOCK),)
    _carry_inputs_kernel[grid](fh, zh, a, cp, w, u, g2, B, N, T, BLOCK=INPUTS_BLOCK)
    if w is not wb:
        wb.copy_(w)
    return u, g2


def _stream_shares(B: int, tiles: int, device: torch.device, programs_per_sm: int) -> int:
    """S: how many programs share the streams of one tile, so that the grid fills the GPU."""
    sms = (
        torch.cuda.get_device_properties(device).multi_processor_count
        if device.type == "cuda"
        else 1
    )
    return max(1, min(B, -(-programs_per_sm * sms // tiles)))


def float32_override(dtype: torch.dtype) -> KernelConfig | None:
    """$R2AC_TRITON_CONFIG's launch for float32 operands, if set."""
    text = os.environ.get(CONFIG_ENV)
    return _parse_once(text) if text and dtype == torch.float32 else None


_parse_once = functools.lru_cache(maxsize=8)(KernelConfig.parse)  # not on every call


def _launch(
    blocks: Tensor, dh: Tensor, x: Tensor | None = None, u: Tensor | None = None,
    g: Tensor | None = None, config: KernelConfig | None = None,
) -> Tensor:  # fmt: skip
    """The history sum (D, C) of blocks (B, D, C) weighted by dh (B, C); with x (T, B, D),
    u (T, B, C) and g (B, C), blocks are carried in place too. config: DEFAULT_CONFIG's."""
    B, D, C = blocks.shape
    cfg = config or float32_override(blocks.dtype) or DEFAULT_CONFIG[blocks.dtype]
    dot = cfg.precision is not None
    if dot and blocks.dtype != torch.float32:
        raise ValueError(f"tl.dot runs in float32 only, got {blocks.dtype}")
    grid_dc = (triton.cdiv(D, cfg.block_d), triton.cdiv(C, cfg.block_c))
    launch = {"num_warps": cfg.warps}
    if cfg.stages is not None:
        launch["num_stages"] = cfg.stages
    carry = x is not None
    if carry and cfg.stream_grid and B <= MAX_GRID_Z:  # history first: it reads FZ unchanged
        hist = _launch(blocks, dh, config=replace(cfg, stream_grid=False))
        _carry_tile_kernel[(*grid_dc, B)](
            blocks, x, *x.stride(), u, g, B, D, C, x.shape[0], BLOCK_D=cfg.block_d,
            BLOCK_C=cfg.block_c, DOT=dot, BLOCK_T=cfg.block_t,
            PRECISION=cfg.precision or "ieee", **launch,
        )  # fmt: skip
        return hist
    S = _stream_shares(B, grid_dc[0] * grid_dc[1], blocks.device, cfg.programs_per_sm)
    part = blocks.new_empty(S, D, C)
    if not carry:  # unused pointers: any tensor of the right dtype
        x, u, g, T, strides = blocks, blocks, blocks, 0, (0, 0, 0)
    else:
        T, strides = x.shape[0], x.stride()
    _history_carry_kernel[(*grid_dc, S)](
        blocks, part, x, *strides, u, g, dh, B, D, C, T, S,
        CARRY=carry, BLOCK_D=cfg.block_d, BLOCK_C=cfg.block_c, DOT=dot, BLOCK_T=cfg.block_t,
        PRECISION=cfg.precision or "ieee", **launch,
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
    """gpu_carry.fused_history_and_carry, FZ read and written once by the kernel; the carry
    inputs and wb's update by one small scan kernel before it (wb contiguous)."""
    T, B, N = fh.shape
    D = stored.shape[1]
    d_wb = torch.einsum("bn,bkn->kn", d_hat, wb)  # before wb changes
    u, g2 = _carry_inputs_and_wb(fh, zh, a, cp, wb)  # (T, B, 2N), (B, 2N)
    hist = _launch(stored.view(B, D, 2 * N), d_hat.repeat(1, 2), x, u, g2)
    return hist.view(D, 2, N).permute(1, 2, 0), d_wb
