/* Fused eLSTM RTRL carry (float32, CPU): r2ac/rtrl/native/__init__.py builds and loads it.
 *
 * Per stream b the sensitivities FZ are stored as one (D, 2N) row-major block (zero_FZ in
 * elstm_math.py). At the end of a segment's backward three passes touch that block:
 *
 *   history:  H[d, c]     += dh[b, c] * FZ[b, d, c]          (dL/d[F;Z] from before the segment)
 *   scale:    FZ[b, d, c]  = G[b, c]  * FZ[b, d, c]
 *   GEMM:     FZ[b, d, c] += sum_t x[t, b, d] * u[t, b, c]   (the segment's own contribution)
 *
 * with c indexing the 2N columns [f-part | z-part]. `history_scale_gemm` does all three in one
 * pass: each (6 x 64) tile of a block is loaded once, feeds the history sum, is scaled, gets its
 * T rank-1 updates in registers, and is stored once. `carry_inputs` computes u, G and the
 * w/b sensitivity update of the segment in one pass over the trace.
 *
 * Threads come from OpenMP; the library links the libgomp that PyTorch already loaded, so both
 * share one thread team. Written with GCC vector extensions: AVX-512 where -march=native has
 * it (one register per 16 floats), split into narrower registers elsewhere.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4))); /* unaligned access */

#define MR 6  /* rows (inputs d) per register tile */
#define NR 4  /* 16-float column vectors per register tile: 64 columns */
#define VL 16

static inline v16 load(const float *p) { return *(const v16u *)p; }
static inline void store(float *p, v16 v) { *(v16u *)p = v; }
static inline v16 splat(float s) { return (v16){s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s}; }

/* One tile of R rows x J vectors: FZ = G*FZ + A^T U, H += dh*FZ(old). R and J are constants
 * at every call site, so the loops unroll and acc stays in registers. */
static inline __attribute__((always_inline)) void tile(
    int R, int J, int64_t T, float *fz, int64_t ldfz, float *h, int64_t ldh,
    const float *g, const float *dh, const float *a_packed, const float *u, int64_t ldu,
    const float *next)
{
    v16 acc[MR][NR];
    /* Start fetching the same columns of the next row tile: it is used ~C/64 tiles later,
     * and FZ (tens of MB) comes from DRAM, not cache, in a training loop. */
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < J; j++) __builtin_prefetch(next + r * ldfz + j * VL, 1, 3);
    v16 gv[NR], dv[NR];
    for (int j = 0; j < J; j++) {
        gv[j] = load(g + j * VL);
        dv[j] = load(dh + j * VL);
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < J; j++) {
            v16 old = load(fz + r * ldfz + j * VL);
            store(h + r * ldh + j * VL, load(h + r * ldh + j * VL) + dv[j] * old);
            acc[r][j] = gv[j] * old;
        }
    for (int64_t t = 0; t < T; t++) {
        v16 bv[NR];
        for (int j = 0; j < J; j++) bv[j] = load(u + t * ldu + j * VL);
        for (int r = 0; r < R; r++) {
            v16 av = splat(a_packed[t * MR + r]);
            for (int j = 0; j < J; j++) acc[r][j] += av * bv[j];
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < J; j++) store(fz + r * ldfz + j * VL, acc[r][j]);
}

static void row_tile(int R, int64_t T, int64_t C, float *fz, float *h, const float *g,
                     const float *dh, const float *a_packed, const float *u, int64_t ldu,
                     const float *next)
{
    int64_t c = 0;
    for (; c + NR * VL <= C; c += NR * VL) {
        float *fzc = fz + c, *hc = h + c;
        const float *gc = g + c, *dhc = dh + c, *uc = u + c;
        switch (R) {
        case 6: tile(6, NR, T, fzc, C, hc, C, gc, dhc, a_packed, uc, ldu, next + c); break;
        case 5: tile(5, NR, T, fzc, C, hc, C, gc, dhc, a_packed, uc, ldu, next + c); break;
        case 4: tile(4, NR, T, fzc, C, hc, C, gc, dhc, a_packed, uc, ldu, next + c); break;
        case 3: tile(3, NR, T, fzc, C, hc, C, gc, dhc, a_packed, uc, ldu, next + c); break;
        case 2: tile(2, NR, T, fzc, C, hc, C, gc, dhc, a_packed, uc, ldu, next + c); break;
        default: tile(1, NR, T, fzc, C, hc, C, gc, dhc, a_packed, uc, ldu, next + c); break;
        }
    }
    for (; c + VL <= C; c += VL) { /* column tail, one vector at a time (C % 16 == 0) */
        float *fzc = fz + c, *hc = h + c;
        const float *gc = g + c, *dhc = dh + c, *uc = u + c;
        switch (R) {
        case 6: tile(6, 1, T, fzc, C, hc, C, gc, dhc, a_packed, uc, ldu, next + c); break;
        case 5: tile(5, 1, T, fzc, C, hc, C, gc, dhc, a_packed, uc, ldu, next + c); break;
        case 4: tile(4, 1, T, fzc, C, hc, C, gc, dhc, a_packed, uc, ldu, next + c); break;
        case 3: tile(3, 1, T, fzc, C, hc, C, gc, dhc, a_packed, uc, ldu, next + c); break;
        case 2: tile(2, 1, T, fzc, C, hc, C, gc, dhc, a_packed, uc, ldu, next + c); break;
        default: tile(1, 1, T, fzc, C, hc, C, gc, dhc, a_packed, uc, ldu, next + c); break;
        }
    }
}

/* fz: (B, D, C) contiguous, C = 2N, C % 16 == 0, overwritten with G*fz + x^T u per stream.
 * hist: (D, C) contiguous, accumulated into (caller zeroes it).
 * g, dh: (B, C) contiguous, the carry factor G and d_hat(t0), each repeated over [f | z].
 * x: x[t, b, d] at x + t*sxt + b*sxb + d (unit stride over d).
 * u: u[t, b, c] at u + t*sut + b*sub + c (unit stride over c).
 * Threads split the D rows, so each owns its rows of hist and no reduction is needed. */
int r2ac_history_scale_gemm(int64_t B, int64_t D, int64_t C, int64_t T, float *fz, float *hist,
                            const float *g, const float *dh, const float *x, int64_t sxt,
                            int64_t sxb, const float *u, int64_t sut, int64_t sub)
{
    if (C % VL != 0 || T < 1) return 1;
    int64_t n_tiles = (D + MR - 1) / MR;
    int failed = 0;
#pragma omp parallel
    {
        /* Each thread owns a contiguous range of row tiles (its rows of hist stay in its L2)
         * and walks the streams in order, so a stream's u (T x C) is reused across its tiles. */
        int64_t n_threads = omp_get_num_threads(), id = omp_get_thread_num();
        int64_t lo = n_tiles * id / n_threads, hi = n_tiles * (id + 1) / n_threads;
        int64_t d_lo = lo * MR, d_hi = hi * MR < D ? hi * MR : D;
        /* The thread's x rows, packed per (stream, tile) as [t][r]: the broadcast operand of
         * every tile is then one contiguous run instead of T rows 4*B*D bytes apart. */
        float *packed = malloc(sizeof(float) * (size_t)((hi - lo) * B * T * MR + 1));
        if (packed == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed) {
            for (int64_t b = 0; b < B; b++)
                for (int64_t t = 0; t < T; t++) {
                    const float *xr = x + t * sxt + b * sxb;
                    float *dst = packed + (b * (hi - lo) * T + t) * MR;
                    for (int64_t d0 = d_lo; d0 < hi * MR; d0 += MR, dst += T * MR)
                        for (int r = 0; r < MR; r++) dst[r] = d0 + r < d_hi ? xr[d0 + r] : 0.0f;
                }
            for (int64_t b = 0; b < B; b++) {
                for (int64_t tile_i = lo; tile_i < hi; tile_i++) {
                    int64_t d0 = tile_i * MR;
                    int R = (int)(D - d0 < MR ? D - d0 : MR);
                    /* the tile after this one: the next rows, or this thread's first rows of
                     * the next stream (a prefetch past the end is harmless: never faults) */
                    int64_t nb = tile_i + 1 < hi ? b : b + 1, nd = tile_i + 1 < hi ? d0 + MR : lo * MR;
                    row_tile(R, T, C, fz + (b * D + d0) * C, hist + d0 * C, g + b * C,
                             dh + b * C, packed + (b * (hi - lo) + tile_i - lo) * T * MR,
                             u + b * sub, sut, fz + (nb * D + nd) * C);
                }
            }
        }
        free(packed);
    }
    return failed ? 2 : 0;
}

/* The segment's carry inputs, in one pass over its trace (fh, zh, a, cp: (T, B, N) contiguous):
 *   g(t) = prod_{s > t} a(s),  u[t, b] = [g*fh | g*zh](t) (T, B, 2N),  G = prod_s a(s),
 * written as g2 (B, 2N) = [G | G] and d2 (B, 2N) = [d_hat | d_hat] for the GEMM kernel;
 * d_wb[k, n] = sum_b d_hat[b, n] * wb[b, k, n] (the history gradient of w_f, w_z, b_f, b_z,
 * read before the update), then wb[b] = G * wb[b] + sum_t [u_f*cp, u_z*cp, u_f, u_z].
 * N % 8 == 0. Threads split the units n in chunks of 8, so the sum over streams stays within
 * a thread; per chunk, g and the four sums live in registers through the backward sweep. */
typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));
#define LD8(p) (*(const v8u *)(p))
#define ST8(p, v) (*(v8u *)(p) = (v))

/* Units [n, n + 8*W) of every stream; W is a constant at each call site. */
static inline __attribute__((always_inline)) void carry_inputs_units(
    int W, int64_t n, int64_t T, int64_t B, int64_t N, const float *fh, const float *zh,
    const float *a, const float *cp, const float *d_hat, float *wb, float *u, float *g2,
    float *d2, float *d_wb)
{
    v8 zero = {0, 0, 0, 0, 0, 0, 0, 0}, one = {1, 1, 1, 1, 1, 1, 1, 1};
    v8 dwb[4][4];
    for (int k = 0; k < 4; k++)
        for (int w = 0; w < W; w++) dwb[k][w] = zero;
    for (int64_t b = 0; b < B; b++) {
        v8 g[4], s[4][4];
        for (int w = 0; w < W; w++) {
            g[w] = one;
            for (int k = 0; k < 4; k++) s[k][w] = zero;
        }
        for (int64_t t = T - 1; t >= 0; t--) {
            int64_t off = (t * B + b) * N + n;
            float *uf = u + (t * B + b) * 2 * N + n;
            for (int w = 0; w < W; w++) {
                v8 f_ = g[w] * LD8(fh + off + 8 * w), z_ = g[w] * LD8(zh + off + 8 * w);
                v8 c_ = LD8(cp + off + 8 * w);
                ST8(uf + 8 * w, f_);
                ST8(uf + N + 8 * w, z_);
                s[0][w] += f_ * c_;
                s[1][w] += z_ * c_;
                s[2][w] += f_;
                s[3][w] += z_;
                g[w] *= LD8(a + off + 8 * w);
            }
        }
        for (int w = 0; w < W; w++) {
            int64_t m = n + 8 * w;
            float *wb_b = wb + b * 4 * N + m;
            v8 dh = LD8(d_hat + b * N + m);
            for (int k = 0; k < 4; k++) {
                v8 old = LD8(wb_b + k * N);
                dwb[k][w] += dh * old;
                ST8(wb_b + k * N, g[w] * old + s[k][w]);
            }
            ST8(g2 + b * 2 * N + m, g[w]);
            ST8(g2 + b * 2 * N + N + m, g[w]);
            ST8(d2 + b * 2 * N + m, dh);
            ST8(d2 + b * 2 * N + N + m, dh);
        }
    }
    for (int k = 0; k < 4; k++)
        for (int w = 0; w < W; w++) ST8(d_wb + k * N + n + 8 * w, dwb[k][w]);
}

int r2ac_carry_inputs(int64_t T, int64_t B, int64_t N, const float *fh, const float *zh,
                      const float *a, const float *cp, const float *d_hat, float *wb,
                      float *u, float *g2, float *d2, float *d_wb)
{
    if (T < 1 || N % 8 != 0) return 1;
    /* Blocks of 32 units (whole cache lines), then a tail of 8-unit blocks. */
    int64_t n_wide = N / 32, n_tail = (N - 32 * n_wide) / 8;
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < n_wide + n_tail; blk++) {
        if (blk < n_wide)
            carry_inputs_units(4, 32 * blk, T, B, N, fh, zh, a, cp, d_hat, wb, u, g2, d2, d_wb);
        else
            carry_inputs_units(1, 32 * n_wide + 8 * (blk - n_wide), T, B, N, fh, zh, a, cp,
                               d_hat, wb, u, g2, d2, d_wb);
    }
    return 0;
}
