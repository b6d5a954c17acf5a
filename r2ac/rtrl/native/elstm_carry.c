/* Fused eLSTM RTRL carry (float32, CPU): r2ac/rtrl/native/__init__.py builds and loads it.
 *
 * Per stream b the sensitivities FZ are stored as one (D, 2N) row-major block (zero_FZ in
 * elstm_math.py). At the end of a segment's backward the PyTorch path makes three passes over
 * that block, after computing the carry inputs u and G from the segment's trace:
 *
 *   history:  H[d, c]     += dh[b, c] * FZ[b, d, c]          (dL/d[F;Z] from before the segment)
 *   scale:    FZ[b, d, c]  = G[b, c]  * FZ[b, d, c]
 *   GEMM:     FZ[b, d, c] += sum_t x[t, b, d] * u[t, b, c]   (the segment's own contribution)
 *
 * with c indexing the 2N columns [f-part | z-part]. `r2ac_carry_fused` does it all in one pass:
 * per stream, u and G for a thread's columns are computed into its cache (`stream_inputs`), and
 * each (6 x 64) tile of the block is loaded once, feeds the history sum, is scaled, gets its T
 * rank-1 updates in registers, and is stored once (`tile`).
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
#define PS 8  /* packed slot per (tile, step): MR inputs, padded to 8 floats */

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
    v16 acc[MR][NR], gv[NR], dv[NR];
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
        /* Fetch the next tile a line per step: in a training loop FZ (tens of MB) comes from
         * DRAM, and these loads are spread out instead of queued at once. */
        if (t < MR * J) __builtin_prefetch(next + (t / J) * ldfz + (t % J) * VL, 1, 3);
        v16 bv[NR];
        for (int j = 0; j < J; j++) bv[j] = load(u + t * ldu + j * VL);
        for (int r = 0; r < R; r++) {
            v16 av = splat(a_packed[t * PS + r]);
            for (int j = 0; j < J; j++) acc[r][j] += av * bv[j];
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < J; j++) store(fz + r * ldfz + j * VL, acc[r][j]);
}

/* One strip of J vectors (16 J columns) down all D rows, in tiles of MR rows; the strip's
 * u (T x 16 J floats) stays in L1 from tile to tile. fz has leading dimension ldfz, h ldh;
 * g, dh and u start at the strip's first column; `after` is prefetched during the last tile. */
static void column_strip(int J, int64_t T, int64_t D, float *fz, int64_t ldfz, float *h,
                         int64_t ldh, const float *g, const float *dh, const float *packed,
                         const float *u, int64_t ldu, const float *after)
{
    int64_t n_tiles = (D + MR - 1) / MR;
    for (int64_t tile_i = 0; tile_i < n_tiles; tile_i++) {
        int64_t d0 = tile_i * MR;
        int R = (int)(D - d0 < MR ? D - d0 : MR);
        float *fzr = fz + d0 * ldfz, *hr = h + d0 * ldh;
        const float *ap = packed + tile_i * T * PS;
        const float *next = tile_i + 1 < n_tiles ? fzr + MR * ldfz : after;
#define TILE_J(J_)                                                                        \
        switch (R) {                                                                      \
        case 6: tile(6, J_, T, fzr, ldfz, hr, ldh, g, dh, ap, u, ldu, next); break;       \
        case 5: tile(5, J_, T, fzr, ldfz, hr, ldh, g, dh, ap, u, ldu, next); break;       \
        case 4: tile(4, J_, T, fzr, ldfz, hr, ldh, g, dh, ap, u, ldu, next); break;       \
        case 3: tile(3, J_, T, fzr, ldfz, hr, ldh, g, dh, ap, u, ldu, next); break;       \
        case 2: tile(2, J_, T, fzr, ldfz, hr, ldh, g, dh, ap, u, ldu, next); break;       \
        default: tile(1, J_, T, fzr, ldfz, hr, ldh, g, dh, ap, u, ldu, next); break;      \
        }
        if (J == NR) {
            TILE_J(NR)
        } else {
            TILE_J(1)
        }
#undef TILE_J
    }
}

typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));
#define LD8(p) (*(const v8u *)(p))
#define ST8(p, v) (*(v8u *)(p) = (v))

/* Carry inputs of one stream b for the columns [c_lo, c_hi) of [f | z] (multiples of 8, so
 * 8 columns never straddle the halves): u[t][c - c_lo] = g(t) * (fh or zh)[t, b, n] with
 * g(t) = prod_{s > t} a(s, b, n); G[c - c_lo] = prod_s a(s); d2 = d_hat[b, n].
 * The owner of column (k, n) also carries wb rows k and k + 2 of unit n: d_wb gets
 * d_hat * wb_old (the history term), then wb = G * wb + sum_t [u*cp, u]. */
static void stream_inputs(int64_t T, int64_t B, int64_t N, int64_t b, int64_t c_lo, int64_t c_hi,
                          const float *fh, const float *zh, const float *a, const float *cp,
                          const float *d_hat, float *wb, float *d_wb, float *u, float *G,
                          float *d2)
{
    int64_t width = c_hi - c_lo;
    for (int64_t c = c_lo; c < c_hi; c += 8) {
        int64_t k = c >= N, n = c - k * N, off0 = b * N + n;
        const float *src = k ? zh : fh;
        v8 zero = {0, 0, 0, 0, 0, 0, 0, 0}, one = {1, 1, 1, 1, 1, 1, 1, 1};
        v8 g = one, s_cp = zero, s = zero;
        float *uc = u + (c - c_lo);
        for (int64_t t = T - 1; t >= 0; t--) {
            int64_t off = t * B * N + off0;
            v8 v = g * LD8(src + off);
            ST8(uc + t * width, v);
            s_cp += v * LD8(cp + off);
            s += v;
            g *= LD8(a + off);
        }
        v8 dh = LD8(d_hat + off0);
        ST8(G + (c - c_lo), g);
        ST8(d2 + (c - c_lo), dh);
        float *w_cp = wb + (b * 4 + k) * N + n, *w = wb + (b * 4 + k + 2) * N + n;
        v8 old_cp = LD8(w_cp), old = LD8(w);
        ST8(d_wb + k * N + n, LD8(d_wb + k * N + n) + dh * old_cp);
        ST8(d_wb + (k + 2) * N + n, LD8(d_wb + (k + 2) * N + n) + dh * old);
        ST8(w_cp, g * old_cp + s_cp);
        ST8(w, g * old + s);
    }
}

/* The whole in-place carry of a segment, with its history gradient, in one pass over FZ:
 *   fz: (B, D, C) contiguous, C = 2N, N % 8 == 0: per stream the (D, 2N) block of d c / d[F;Z];
 *       overwritten with G * fz + x_b^T u_b.
 *   hist: (C, D) contiguous, written (no need to zero it): sum_b d_hat[b] * fz_old[b],
 *       transposed, i.e. dL/d[F; Z] in the parameters' own layout.
 *   x[t, b, d] at x + t*sxt + b*sxb + d; fh, zh, a, cp: (T, B, N) contiguous (the trace);
 *   d_hat: (B, N); wb: (B, 4, N), carried in place; d_wb: (4, N), zeroed by the caller.
 * Threads split the 2N columns: each computes u, G for its columns of one stream at a time
 * (in its cache), owns its columns of hist and d_wb, and sweeps its columns of every block
 * in strips of 64 columns, top to bottom. It sums hist in a private (D, width) buffer, in
 * the blocks' layout, and transposes it once at the end.
 * Returns 0, or 1 for arguments it does not take, 2 if a buffer could not be allocated. */
int r2ac_carry_fused(int64_t B, int64_t D, int64_t N, int64_t T, float *fz, float *hist,
                     const float *x, int64_t sxt, int64_t sxb, const float *fh, const float *zh,
                     const float *a, const float *cp, const float *d_hat, float *wb, float *d_wb)
{
    int64_t C = 2 * N; /* a multiple of 16: whole vectors */
    if (N % 8 != 0 || T < 1) return 1;
    int64_t n_tiles = (D + MR - 1) / MR, n_chunks = C / VL;
    int failed = 0;
#pragma omp parallel
    {
        int64_t n_threads = omp_get_num_threads(), id = omp_get_thread_num();
        int64_t c_lo = VL * (n_chunks * id / n_threads), c_hi = VL * (n_chunks * (id + 1) / n_threads);
        int64_t width = c_hi - c_lo;
        size_t n_buf = (size_t)(T * width + 2 * width + n_tiles * T * PS + D * width + 16);
        float *buf = malloc(sizeof(float) * n_buf);
        if (buf == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed && width > 0) {
            float *u = buf, *G = u + T * width, *d2 = G + width, *packed = d2 + width;
            float *h = packed + n_tiles * T * PS; /* (D, width): this thread's columns of hist */
            for (int64_t i = 0; i < D * width; i++) h[i] = 0.0f;
            for (int64_t b = 0; b < B; b++) {
                stream_inputs(T, B, N, b, c_lo, c_hi, fh, zh, a, cp, d_hat, wb, d_wb, u, G, d2);
                for (int64_t t = 0; t < T; t++) { /* x_b packed per row tile as [t][r] */
                    const float *xr = x + t * sxt + b * sxb;
                    float *dst = packed + t * PS;
                    int64_t d0 = 0;
                    for (; d0 + 8 <= D; d0 += MR, dst += T * PS) ST8(dst, LD8(xr + d0));
                    for (; d0 < D; d0 += MR, dst += T * PS)
                        for (int r = 0; r < MR; r++) dst[r] = d0 + r < D ? xr[d0 + r] : 0.0f;
                }
                float *fz_b = fz + b * D * C + c_lo;
                for (int64_t c = 0; c < width;) {
                    int J = c + NR * VL <= width ? NR : 1;
                    int64_t c_next = c + J * VL;
                    /* prefetched after this strip: the next strip's top, else the next stream's
                     * (prefetch only: an address past the end never faults) */
                    const float *after = c_next < width ? fz_b + c_next : fz_b + D * C;
                    column_strip(J, T, D, fz_b + c, C, h + c, width, G + c, d2 + c, packed, u + c,
                                 width, after);
                    c = c_next;
                }
            }
            for (int64_t c = 0; c < width; c++) /* (D, width) -> rows c_lo.. of (C, D) */
                for (int64_t d = 0; d < D; d++) hist[(c_lo + c) * D + d] = h[d * width + c];
        }
        free(buf);
    }
    return failed ? 2 : 0;
}
