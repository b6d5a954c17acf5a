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
 * each (MR x NR VL) register tile of the block is loaded once, feeds the history sum, is scaled, gets its T
 * rank-1 updates in registers, and is stored once (`tile`). It also runs without the history
 * (an actor's carry) and out of place (the carried block written to a second buffer);
 * `r2ac_carry_gates` first derives the trace from the gates an actor's steps kept, and
 * `r2ac_history` is the history alone (a learner that does not carry).
 * `r2ac_start` is the first-order start state's sum (docs/rules/passes.md).
 *
 * Threads come from OpenMP; the library links the libgomp that PyTorch already loaded, so both
 * share one thread team. With a history they split the 2N columns (each owns its columns of the
 * sum); without one (an actor's carry) and with at least as many streams as threads they split
 * the streams, and each sweeps its blocks row band by row band, reading and writing FZ in
 * order (`carry_streams`: 0.56-0.76x the time with 2 threads, docs/rules/rtrl.md).
 * Written with GCC vector extensions, VL floats a vector: 16 (one AVX-512 register) where
 * -march=native has AVX-512, else 8 (one AVX2 register), with a register tile to match.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

/* The register tile: MR rows x NR vectors of VL floats, sized to the vector registers
 * -march=native gives (acc takes MR * NR of them): 24 of AVX-512's 32; without AVX-512, 8-float
 * vectors in a tile of AVX2's 16 (wider tiles spill their accumulators to the stack). */
#if defined(__AVX512F__)
#define VL 16
#define MR 6  /* rows (inputs d) per register tile */
#define NR 4  /* VL-float column vectors per register tile: 64 columns */
#else
#define VL 8
#define MR 4
#define NR 2 /* 16 columns: 8 accumulators, 2 of G, 2 of u and a splat */
#endif
#define PS 8  /* packed slot per (tile, step): MR inputs, padded to 8 floats */
#define HISTORY_AHEAD 1024 /* floats: how far ahead r2ac_history prefetches FZ (4 KB) */

typedef float vec __attribute__((vector_size(VL * 4)));
typedef float vecu __attribute__((vector_size(VL * 4), aligned(4))); /* unaligned access */

static inline vec load(const float *p) { return *(const vecu *)p; }
static inline void store(float *p, vec v) { *(vecu *)p = v; }
static inline vec splat(float s) { return (vec){0} + s; }

/* One tile of R rows x J vectors: out = G*old + A^T U with old read at src (out may be src),
 * and with H, h += dh*old. R, J and H are constants at every call site, so the loops unroll,
 * acc stays in registers and the history code is compiled out where H is 0. */
static inline __attribute__((always_inline)) void tile(
    int R, int J, int H, int64_t T, const float *src, float *out, int64_t ldfz, float *h,
    int64_t ldh, const float *g, const float *dh, const float *a_packed, const float *u,
    int64_t ldu, const float *next)
{
    vec acc[MR][NR], gv[NR], dv[NR];
    for (int j = 0; j < J; j++) {
        gv[j] = load(g + j * VL);
        if (H) dv[j] = load(dh + j * VL);
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < J; j++) {
            vec old = load(src + r * ldfz + j * VL);
            if (H) store(h + r * ldh + j * VL, load(h + r * ldh + j * VL) + dv[j] * old);
            acc[r][j] = gv[j] * old;
        }
    for (int64_t t = 0; t < T; t++) {
        /* Fetch the next tile a line per step: in a training loop FZ (tens of MB) comes from
         * DRAM, and these loads are spread out instead of queued at once. A tile row holds
         * J * VL floats, `lines` 64-byte lines (at least one). */
        const int lines = J * VL >= 16 ? J * VL / 16 : 1;
        if (t < MR * lines) __builtin_prefetch(next + (t / lines) * ldfz + (t % lines) * 16, 1, 3);
        vec bv[NR];
        for (int j = 0; j < J; j++) bv[j] = load(u + t * ldu + j * VL);
        for (int r = 0; r < R; r++) {
            vec av = splat(a_packed[t * PS + r]);
            for (int j = 0; j < J; j++) acc[r][j] += av * bv[j];
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < J; j++) store(out + r * ldfz + j * VL, acc[r][j]);
}

/* tile() for R rows (1..MR) known only at run time: one case per R, so that each call is
 * tile() with constant R, J and H (all of its loops unrolled). */
static inline __attribute__((always_inline)) void tile_rows(
    int R, int J, int H, int64_t T, const float *src, float *out, int64_t ldfz, float *h,
    int64_t ldh, const float *g, const float *dh, const float *a_packed, const float *u,
    int64_t ldu, const float *next)
{
#define TILE(R_) tile(R_, J, H, T, src, out, ldfz, h, ldh, g, dh, a_packed, u, ldu, next)
    switch (R) {
    case 6: TILE(6); break;
    case 5: TILE(5); break;
    case 4: TILE(4); break;
    case 3: TILE(3); break;
    case 2: TILE(2); break;
    default: TILE(1); break;
    }
#undef TILE
}

/* One strip of J vectors (16 J columns) down all D rows, in tiles of MR rows; the strip's
 * u (T x 16 J floats) stays in L1 from tile to tile. src and out (leading dimension ldfz) are
 * the strip's old and new block (the same for an in-place carry), h (ldh) its history sum,
 * summed only with H; g, dh and u start at the strip's first column; `after` is prefetched
 * during the last tile. */
static void column_strip(int J, int H, int64_t T, int64_t D, const float *src, float *out,
                         int64_t ldfz, float *h, int64_t ldh, const float *g, const float *dh,
                         const float *packed, const float *u, int64_t ldu, const float *after)
{
    int64_t n_tiles = (D + MR - 1) / MR;
    for (int64_t tile_i = 0; tile_i < n_tiles; tile_i++) {
        int64_t d0 = tile_i * MR;
        int R = (int)(D - d0 < MR ? D - d0 : MR);
        const float *sr = src + d0 * ldfz;
        float *outr = out + d0 * ldfz, *hr = H ? h + d0 * ldh : h;
        const float *ap = packed + tile_i * T * PS;
        const float *next = tile_i + 1 < n_tiles ? sr + MR * ldfz : after;
#define TILE_ROWS(J_, H_) tile_rows(R, J_, H_, T, sr, outr, ldfz, hr, ldh, g, dh, ap, u, ldu, next)
        if (J == NR && H) {
            TILE_ROWS(NR, 1);
        } else if (J == NR) {
            TILE_ROWS(NR, 0);
        } else if (H) {
            TILE_ROWS(1, 1);
        } else {
            TILE_ROWS(1, 0);
        }
#undef TILE_ROWS
    }
}

typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));
#define LD8(p) (*(const v8u *)(p))
#define ST8(p, v) (*(v8u *)(p) = (v))

/* What the steps of a segment left for its carry, (T, B, N) contiguous each: either the trace
 * (fh, zh, a; f == NULL) or the gates f, z with keep (T, B) (NULL: no reset) and w_f, w_z (N,),
 * from which the trace is derived as elstm_math.local_derivatives does; cp in both. */
struct steps {
    const float *fh, *zh, *a, *cp, *f, *z, *keep, *w_f, *w_z;
};

/* Step t's (fh or zh) and a for the 8 units n.. of stream b, half k (0: f, 1: z). */
static inline void step_derivatives(const struct steps *s, int64_t B, int64_t N, int64_t t,
                                    int64_t b, int64_t k, int64_t n, v8 *v, v8 *a)
{
    int64_t off = (t * B + b) * N + n;
    if (s->f == NULL) {
        *v = LD8((k ? s->zh : s->fh) + off);
        *a = LD8(s->a + off);
        return;
    }
    v8 one = {1, 1, 1, 1, 1, 1, 1, 1};
    v8 f = LD8(s->f + off), z = LD8(s->z + off), omf = one - f;
    v8 fh = (LD8(s->cp + off) - z) * f * omf, zh = omf * (one - z * z);
    float keep = s->keep != NULL ? s->keep[t * B + b] : 1.0f;
    *v = k ? zh : fh;
    *a = (f + LD8(s->w_f + n) * fh + LD8(s->w_z + n) * zh) * keep;
}

/* Carry inputs of one stream b for the columns [c_lo, c_hi) of [f | z] (multiples of 8, so
 * 8 columns never straddle the halves): u[t][c - c_lo] = g(t) * (fh or zh)[t, b, n] with
 * g(t) = prod_{s > t} a(s, b, n); G[c - c_lo] = prod_s a(s); d2 = d_hat[b, n].
 * The owner of column (k, n) also carries wb rows k and k + 2 of unit n: with a history
 * (d_hat not NULL) d_wb gets d_hat * wb_old, then wb_out = G * wb + sum_t [u*cp, u]. */
static void stream_inputs(int64_t T, int64_t B, int64_t N, int64_t b, int64_t c_lo, int64_t c_hi,
                          const struct steps *st, const float *d_hat, const float *wb,
                          float *wb_out, float *d_wb, float *u, float *G, float *d2)
{
    int64_t width = c_hi - c_lo;
    for (int64_t c = c_lo; c < c_hi; c += 8) {
        int64_t k = c >= N, n = c - k * N, off0 = b * N + n;
        v8 zero = {0, 0, 0, 0, 0, 0, 0, 0}, one = {1, 1, 1, 1, 1, 1, 1, 1};
        v8 g = one, s_cp = zero, s = zero;
        float *uc = u + (c - c_lo);
        for (int64_t t = T - 1; t >= 0; t--) {
            v8 d, a;
            step_derivatives(st, B, N, t, b, k, n, &d, &a);
            v8 v = g * d;
            ST8(uc + t * width, v);
            s_cp += v * LD8(st->cp + t * B * N + off0);
            s += v;
            g *= a;
        }
        ST8(G + (c - c_lo), g);
        int64_t i_cp = (b * 4 + k) * N + n, i = (b * 4 + k + 2) * N + n;
        v8 old_cp = LD8(wb + i_cp), old = LD8(wb + i);
        if (d_hat != NULL) {
            v8 dh = LD8(d_hat + off0);
            ST8(d2 + (c - c_lo), dh);
            ST8(d_wb + k * N + n, LD8(d_wb + k * N + n) + dh * old_cp);
            ST8(d_wb + (k + 2) * N + n, LD8(d_wb + (k + 2) * N + n) + dh * old);
        }
        ST8(wb_out + i_cp, g * old_cp + s_cp);
        ST8(wb_out + i, g * old + s);
    }
}

/* This thread's columns [c_lo, c_hi) of 2N = C columns, in whole tiles of NR vectors (the last
 * thread also takes the columns after the last whole tile): every column is then swept in a
 * tile of the shape `block_by_rows` gives it, and so gets the same numbers (FMA contraction
 * may differ between tile shapes) whether the threads split the columns or the streams. */
static void thread_columns(int64_t C, int64_t *c_lo, int64_t *c_hi)
{
    int64_t n_threads = omp_get_num_threads(), id = omp_get_thread_num();
    int64_t W = NR * VL, n_chunks = C / W;
    *c_lo = W * (n_chunks * id / n_threads);
    *c_hi = id == n_threads - 1 ? C : W * (n_chunks * (id + 1) / n_threads);
}

/* The private history sum h (D, width) of columns [c_lo, c_hi) -> rows c_lo.. of hist (C, D). */
static void store_history(int64_t D, int64_t c_lo, int64_t width, const float *h, float *hist)
{
    for (int64_t c = 0; c < width; c++)
        for (int64_t d = 0; d < D; d++) hist[(c_lo + c) * D + d] = h[d * width + c];
}

/* This thread's streams [b_lo, b_hi) of B. */
static void thread_streams(int64_t B, int64_t *b_lo, int64_t *b_hi)
{
    int64_t n_threads = omp_get_num_threads(), id = omp_get_thread_num();
    *b_lo = B * id / n_threads;
    *b_hi = B * (id + 1) / n_threads;
}

/* x_b (T steps of D inputs at x + t*sxt + b*sxb) packed per row tile as [tile][t][r]. */
static void pack_inputs(int64_t T, int64_t D, const float *x, int64_t sxt, int64_t sxb,
                        int64_t b, float *packed)
{
    for (int64_t t = 0; t < T; t++) {
        const float *xr = x + t * sxt + b * sxb;
        float *dst = packed + t * PS;
        int64_t d0 = 0;
        for (; d0 + 8 <= D; d0 += MR, dst += T * PS) ST8(dst, LD8(xr + d0));
        for (; d0 < D; d0 += MR, dst += T * PS)
            for (int r = 0; r < MR; r++) dst[r] = d0 + r < D ? xr[d0 + r] : 0.0f;
    }
}

/* One stream's whole (D, C) block without a history, in tiles of MR rows x 64 columns taken
 * band by band (all columns of MR rows, then the next MR rows): FZ is read and written in
 * order. G and u (T, C) cover all C columns; `after` is prefetched during the last tile. */
static void block_by_rows(int64_t T, int64_t D, int64_t C, const float *src, float *out,
                          const float *G, const float *packed, const float *u, const float *after)
{
    int64_t n_tiles = (D + MR - 1) / MR;
    for (int64_t tile_i = 0; tile_i < n_tiles; tile_i++) {
        int64_t d0 = tile_i * MR;
        int R = (int)(D - d0 < MR ? D - d0 : MR);
        const float *ap = packed + tile_i * T * PS;
        for (int64_t c = 0; c < C;) {
            int J = c + NR * VL <= C ? NR : 1;
            int64_t c_next = c + J * VL;
            const float *sr = src + d0 * C + c;
            float *outr = out + d0 * C + c;
            const float *next = c_next < C ? sr + J * VL
                                : (tile_i + 1 < n_tiles ? src + (d0 + MR) * C : after);
            if (J == NR)
                tile_rows(R, NR, 0, T, sr, outr, C, NULL, 0, G + c, NULL, ap, u + c, C, next);
            else
                tile_rows(R, 1, 0, T, sr, outr, C, NULL, 0, G + c, NULL, ap, u + c, C, next);
            c = c_next;
        }
    }
}

/* `carry` without a history, the streams split between threads (B >= threads): per stream
 * the carry inputs of all C columns, then its block by `block_by_rows`. The same arithmetic
 * per element as `carry`, so the same numbers. */
static int carry_streams(int64_t B, int64_t D, int64_t N, int64_t T, const float *fz,
                         float *fz_out, const float *x, int64_t sxt, int64_t sxb,
                         const struct steps *st, const float *wb, float *wb_out)
{
    int64_t C = 2 * N;
    int64_t n_tiles = (D + MR - 1) / MR;
    int failed = 0;
#pragma omp parallel
    {
        int64_t b_lo, b_hi;
        thread_streams(B, &b_lo, &b_hi);
        float *buf = malloc(sizeof(float) * (size_t)(T * C + 2 * C + n_tiles * T * PS + 16));
        if (buf == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed) {
            float *u = buf, *G = u + T * C, *unused = G + C, *packed = unused + C;
            for (int64_t b = b_lo; b < b_hi; b++) {
                stream_inputs(T, B, N, b, 0, C, st, NULL, wb, wb_out, NULL, u, G, unused);
                pack_inputs(T, D, x, sxt, sxb, b, packed);
                const float *after = fz + (b + 1) * D * C; /* prefetch only: never faults */
                block_by_rows(T, D, C, fz + b * D * C, fz_out + b * D * C, G, packed, u, after);
            }
        }
        free(buf);
    }
    return failed ? 2 : 0;
}

/* The whole carry of a segment, with its history gradient, in one pass over FZ:
 *   fz: (B, D, C) contiguous, C = 2N, N % 8 == 0: per stream the (D, 2N) block of d c / d[F;Z]
 *       at the segment's start; fz_out (the same or another buffer, same layout) gets
 *       G * fz + x_b^T u_b.
 *   hist: (C, D) contiguous, written (no need to zero it): sum_b d_hat[b] * fz_old[b],
 *       transposed, i.e. dL/d[F; Z] in the parameters' own layout. NULL: no history (d_hat
 *       and d_wb are not read).
 *   x[t, b, d] at x + t*sxt + b*sxb + d; fh, zh, a, cp: (T, B, N) contiguous (the trace);
 *   d_hat: (B, N); wb: (B, 4, N) at the start, wb_out (the same or another buffer) at the end;
 *   d_wb: (4, N), zeroed by the caller.
 * Threads split the 2N columns: each computes u, G for its columns of one stream at a time
 * (in its cache), owns its columns of hist and d_wb, and sweeps its columns of every block
 * in strips of 64 columns, top to bottom. It sums hist in a private (D, width) buffer, in
 * the blocks' layout, and transposes it once at the end.
 * Returns 0, or 1 for arguments it does not take, 2 if a buffer could not be allocated. */
static int carry(int64_t B, int64_t D, int64_t N, int64_t T, const float *fz, float *fz_out,
                 float *hist, const float *x, int64_t sxt, int64_t sxb, const struct steps *st,
                 const float *d_hat, const float *wb, float *wb_out, float *d_wb)
{
    int64_t C = 2 * N; /* a multiple of 16: whole vectors */
    if (N % 8 != 0 || T < 1) return 1;
    if (hist == NULL && B >= omp_get_max_threads())
        return carry_streams(B, D, N, T, fz, fz_out, x, sxt, sxb, st, wb, wb_out);
    int64_t n_tiles = (D + MR - 1) / MR;
    int H = hist != NULL, failed = 0;
#pragma omp parallel
    {
        int64_t c_lo, c_hi;
        thread_columns(C, &c_lo, &c_hi);
        int64_t width = c_hi - c_lo;
        size_t n_buf = (size_t)(T * width + 2 * width + n_tiles * T * PS + H * D * width + 16);
        float *buf = malloc(sizeof(float) * n_buf);
        if (buf == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed && width > 0) {
            float *u = buf, *G = u + T * width, *d2 = G + width, *packed = d2 + width;
            float *h = packed + n_tiles * T * PS; /* (D, width): this thread's columns of hist */
            for (int64_t i = 0; i < H * D * width; i++) h[i] = 0.0f;
            for (int64_t b = 0; b < B; b++) {
                stream_inputs(T, B, N, b, c_lo, c_hi, st, H ? d_hat : NULL, wb, wb_out, d_wb,
                              u, G, d2);
                pack_inputs(T, D, x, sxt, sxb, b, packed);
                const float *fz_b = fz + b * D * C + c_lo;
                float *out_b = fz_out + b * D * C + c_lo;
                for (int64_t c = 0; c < width;) {
                    int J = c + NR * VL <= width ? NR : 1;
                    int64_t c_next = c + J * VL;
                    /* prefetched after this strip: the next strip's top, else the next stream's
                     * (prefetch only: an address past the end never faults) */
                    const float *after = c_next < width ? fz_b + c_next : fz_b + D * C;
                    column_strip(J, H, T, D, fz_b + c, out_b + c, C, h + c, width, G + c, d2 + c,
                                 packed, u + c, width, after);
                    c = c_next;
                }
            }
            if (H) store_history(D, c_lo, width, h, hist);
        }
        free(buf);
    }
    return failed ? 2 : 0;
}

int r2ac_carry_fused(int64_t B, int64_t D, int64_t N, int64_t T, const float *fz, float *fz_out,
                     float *hist, const float *x, int64_t sxt, int64_t sxb, const float *fh,
                     const float *zh, const float *a, const float *cp, const float *d_hat,
                     const float *wb, float *wb_out, float *d_wb)
{
    struct steps st = {fh, zh, a, cp, NULL, NULL, NULL, NULL, NULL};
    return carry(B, D, N, T, fz, fz_out, hist, x, sxt, sxb, &st, d_hat, wb, wb_out, d_wb);
}

/* Streams a pass of r2ac_history / r2ac_start reads at once: each vector of the cached
 * operand (h, or dw) is loaded once for SB streams' vectors of FZ instead of once for each,
 * so the pass is nearer a plain read of FZ (docs/rules/rtrl.md, "Native kernel": 0.81-0.86x
 * the time with FZ cold at the learner's shapes, one thread). Each stream's sum keeps its
 * order (h: stream by stream; out: input by input), so the numbers are the same to the bit
 * as one stream at a time. */
#define SB 4

/* h (D, width) += sum over the ns (<= SB) streams s of d2[s] * fz_s, d2 (ns, width) in cache,
 * fz_s = fz + s * sfz (rows of ldfz floats). ns is a constant at each call site. */
static inline __attribute__((always_inline)) void history_streams(
    int ns, int64_t D, int64_t width, const float *fz, int64_t sfz, int64_t ldfz,
    const float *d2, float *h)
{
    for (int64_t d = 0; d < D; d++)
        for (int64_t c = 0; c < width; c += VL) {
            float *hp = h + d * width + c;
            vec acc = load(hp);
            for (int s = 0; s < ns; s++) {
                const float *p = fz + s * sfz + d * ldfz + c;
                /* Into L2, 4 KB ahead: FZ comes from DRAM in a training loop, and one
                 * core's own misses alone keep too few lines in flight. */
                __builtin_prefetch(p + HISTORY_AHEAD, 0, 2);
                acc += load(d2 + s * width + c) * load(p);
            }
            store(hp, acc);
        }
}

/* The history gradient alone, for a segment whose carry is not needed:
 *   hist (C, D) = sum_b d_hat[b] * fz[b] transposed, d_wb (4, N) += sum_b d_hat[b] * wb[b],
 * with fz, hist, d_hat, wb, d_wb as in r2ac_carry_fused. One streaming pass over FZ, SB
 * streams at a time, the columns split between threads as there. Returns 0, 1 or 2 as
 * r2ac_carry_fused. */
int r2ac_history(int64_t B, int64_t D, int64_t N, const float *fz, float *hist,
                 const float *d_hat, const float *wb, float *d_wb)
{
    int64_t C = 2 * N;
    if (N % 8 != 0) return 1;
    int failed = 0;
#pragma omp parallel
    {
        int64_t c_lo, c_hi;
        thread_columns(C, &c_lo, &c_hi);
        int64_t width = c_hi - c_lo;
        float *h = calloc((size_t)(D * width + SB * width + 16), sizeof(float));
        if (h == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed && width > 0) {
            float *d2 = h + D * width; /* (SB, width): d_hat of the group's streams */
            for (int64_t b0 = 0; b0 < B; b0 += SB) {
                int ns = B - b0 < SB ? (int)(B - b0) : SB;
                for (int s = 0; s < ns; s++) {
                    int64_t b = b0 + s;
                    for (int64_t c = c_lo; c < c_hi; c += 8) {
                        int64_t k = c >= N, n = c - k * N;
                        v8 dh = LD8(d_hat + b * N + n);
                        ST8(d2 + s * width + (c - c_lo), dh);
                        for (int64_t row = k; row < 4; row += 2) {
                            float *dw = d_wb + row * N + n;
                            ST8(dw, LD8(dw) + dh * LD8(wb + (b * 4 + row) * N + n));
                        }
                    }
                }
                const float *fz_b = fz + b0 * D * C + c_lo;
                if (ns == SB)
                    history_streams(SB, D, width, fz_b, D * C, C, d2, h);
                else
                    for (int s = 0; s < ns; s++)
                        history_streams(1, D, width, fz_b + s * D * C, 0, C, d2 + s * width, h);
            }
            store_history(D, c_lo, width, h, hist);
        }
        free(h);
    }
    return failed ? 2 : 0;
}

/* out (ns, C) = sum_d fz_s[d, :] * dw[d, :] for the ns (<= SB) streams s, fz_s = fz + s * D * C.
 * ns is a constant at each call site. */
static inline __attribute__((always_inline)) void start_streams(
    int ns, int64_t D, int64_t C, const float *fz, const float *dw, float *out)
{
    for (int64_t c = 0; c < ns * C; c += VL) store(out + c, splat(0.0f));
    for (int64_t d = 0; d < D; d++)
        for (int64_t c = 0; c < C; c += VL) {
            vec w = load(dw + d * C + c);
            for (int s = 0; s < ns; s++) {
                const float *p = fz + s * D * C + d * C + c;
                __builtin_prefetch(p + HISTORY_AHEAD, 0, 2);
                store(out + s * C + c, load(out + s * C + c) + load(p) * w);
            }
        }
}

/* The first-order start state's sum over the inputs (docs/rules/passes.md):
 *   out (B, C) = sum_d fz[b, d, :] * dw[d, :],  C = 2N,
 * fz as in r2ac_history, dw (D, C) the change of [F; Z] in the same layout. One streaming pass
 * over FZ (dw and the group's rows of out stay in cache), SB streams at a time, the groups
 * split between threads. Returns 0, or 1 if N is not a multiple of 8. */
int r2ac_start(int64_t B, int64_t D, int64_t N, const float *fz, const float *dw, float *out)
{
    int64_t C = 2 * N;
    if (N % 8 != 0) return 1;
    int64_t groups = (B + SB - 1) / SB;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < groups; g++) {
        int64_t b0 = g * SB;
        const float *fz_b = fz + b0 * D * C;
        if (B - b0 >= SB)
            start_streams(SB, D, C, fz_b, dw, out + b0 * C);
        else
            for (int64_t b = b0; b < B; b++)
                start_streams(1, D, C, fz + b * D * C, dw, out + b * C);
    }
    return 0;
}

/* The carry of r2ac_carry_fused without a history, from the gates of the segment's steps
 * instead of its trace (`struct steps`; the trace is derived where it is read): f, z, cp
 * (T, B, N) contiguous; keep (T, B) contiguous or NULL; w_f, w_z (N,). Returns 0, 1 or 2 as
 * r2ac_carry_fused. */
int r2ac_carry_gates(int64_t B, int64_t D, int64_t N, int64_t T, const float *fz, float *fz_out,
                     const float *x, int64_t sxt, int64_t sxb, const float *f, const float *z,
                     const float *cp, const float *keep, const float *w_f, const float *w_z,
                     const float *wb, float *wb_out)
{
    struct steps st = {NULL, NULL, NULL, cp, f, z, keep, w_f, w_z};
    return carry(B, D, N, T, fz, fz_out, NULL, x, sxt, sxb, &st, NULL, wb, wb_out, NULL);
}
