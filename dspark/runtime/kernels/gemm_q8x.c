/* y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) over a GGUF file's weights as stored,
 * with the activations quantized to int8: the `q8x` precision (as llama.cpp computes a
 * quantized model on a CPU; the weights are the file's, each exactly as in `gguf`).
 *
 * Activations: each row of x, in blocks (units) of 32, becomes
 *   a = max |x|,  dx = a / 127,  q = round-to-nearest-even(x * (127 / a))  (q = 0 if a = 0),
 *   sx = dx * sum(q)                                             (fp32, each rounded once)
 * so |q| <= 127. A unit of a weight row is 32 small integers w8 and its scales:
 *   Q4_0 w = d (q - 8)   Q4_1 w = d q + m   Q5_0 w = d (q - 16)   Q5_1 w = d q + m
 *   Q8_0 w = d q         Q4_K, Q5_K w = ds q - dm (ds, dm: the sub-block's d sc, dmin m)
 *   Q6_K w = ds (q - 32), ds one per 16 weights
 * i.e. w = D w8 + M, with D per 32 weights (Q6_K: per 16) and M per 32 (the types with a
 * min; none for the others).
 *
 * Every output is this sequence, whatever M, the tile, the ISA and the thread count:
 *   for each unit u ascending: P = the exact integer sum of w8 q over the unit (Q6_K: P0
 *   over weights 0-15, P1 over 16-31); acc = fma((float) P, D * dx, acc) (Q6_K: with P0
 *   and D0, then P1 and D1); off = fma(M, sx, off) where the type has a min;
 *   then (acc + off), + bias[n] where there is one.
 * The integer sums are exact in every order, so the AVX2 code and the scalar reference
 * (`dspark_gemm_q8x_ref`) give the same bits (tests/test_q8x_kernel.py), and a token's
 * logits do not depend on what shares its step: speculative decoding in q8x gives
 * exactly q8x's plain decoding.
 *
 * The weights are packed at load (`dspark_q8x_pack`, from the repacked rows of
 * quant_units.h) into panels of 8 columns, so one register holds 4 consecutive weights
 * of 8 columns and each lane sums one output (llama.cpp packs its AVX2 GEMM likewise):
 * per group of 8 columns and unit, D[8] (Q6_K D0[8], D1[8]), M[8] (types with a min), fp16
 * where they are the file's fp16 values (Q4_0/1, Q5_0/1, Q8_0: 16 bytes each) and fp32 where
 * they are products (the K types' d sc, dmin m: 32 bytes), then the quants as unsigned
 * bytes (q, the types' offset added back: Q4_0 q, Q5_0 q, Q6_K q; Q8_0 as int8): four
 * weights 4g .. 4g + 3 of column c at byte 32 g + 4 c; the 4-bit types two to a byte
 * (chunk h at 32 h: low nibbles weights 4h .. of group h, high nibbles weights 16 + 4h ..
 * of group h + 4), the 5-bit types likewise plus a plane of
 * their fifth bits (byte 128 + 4c + b: bit 2h for weight 4h + b, bit 2h + 1 for 16 + 4h + b).
 * Columns past the segment's last are zero.
 * Products are summed in 16 bits for as many groups as cannot overflow (|w8 q| pairs:
 * 4-bit 8 groups, 5-bit 4, 6-bit 2, Q8_0 1), then in 32.
 *
 * A descriptor segment of type X_OFF + t (t a file's ggml type) is such a panel: rows =
 * the segment's columns, bytes = one group's bytes. F32, F16 and BF16 segments in a q8x
 * matrix are computed as the `gguf` precision computes them (fp32 activations, its order).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels.h"
#include "q8x_panels.h"

/* ---- the AVX2 kernel: MR rows of x against NG groups of 8 columns ---------------------- */

#define BCAST4(p) _mm256_set1_epi32(*(const int32_t *)(p))

/* x shifted left by s bits (right by -s) in each 16-bit lane; s a constant in -3 .. 4. */
static inline __attribute__((always_inline)) __m256i shift_bits(__m256i x, int s) {
    return s > 0 ? _mm256_slli_epi16(x, s) : s < 0 ? _mm256_srli_epi16(x, -s) : x;
}

static inline __attribute__((always_inline)) void panel_tile(int type, const int8_t *q, const float *dx,
                                                             const float *sx, const int32_t *S, int64_t K,
                                                             const uint8_t *grp, int64_t gb, __m256 *out,
                                                             int MR, int NG) {
    const xtype t = xinfo(type);
    const int64_t nq = K / 32, ub = unit_bytes(t);
    const __m256i ones = _mm256_set1_epi16(1), f15 = _mm256_set1_epi8(15);
    __m256 acc[4][4], off[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) acc[i][g] = off[i][g] = _mm256_setzero_ps();
    for (int64_t u = 0; u < nq; u++) {
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) {
            const uint8_t *unit = grp + g * gb + u * ub, *qb = unit_quants(t, unit);
            __m256i P[4], P0[4];
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++) P[i] = P0[i] = _mm256_setzero_si256();
            if (t.four) {
                __m256i a[4];
                const __m256i plane = t.five ? _mm256_loadu_si256((const __m256i *)(qb + 128)) : ones;
                const __m256i b4 = _mm256_set1_epi8(16);
#pragma GCC unroll 4
                for (int i = 0; i < MR; i++) a[i] = _mm256_setzero_si256();
#pragma GCC unroll 4
                for (int h = 0; h < 4; h++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(qb + 32 * h));
                    __m256i lo = _mm256_and_si256(v, f15), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), f15);
                    if (t.five) {  /* bit 2h (2h + 1) of each plane byte to bit 4: 16-bit shifts of at
                                    * most 4 keep it within its byte */
                        lo = _mm256_or_si256(lo, _mm256_and_si256(shift_bits(plane, 4 - 2 * h), b4));
                        hi = _mm256_or_si256(hi, _mm256_and_si256(shift_bits(plane, 3 - 2 * h), b4));
                    }
#pragma GCC unroll 4
                    for (int i = 0; i < MR; i++) {
                        const int8_t *qu = q + i * K + 32 * u;
                        a[i] = _mm256_add_epi16(a[i], _mm256_maddubs_epi16(lo, BCAST4(qu + 4 * h)));
                        a[i] = _mm256_add_epi16(a[i], _mm256_maddubs_epi16(hi, BCAST4(qu + 16 + 4 * h)));
                    }
                    if (t.five && h == 1) {  /* four groups of 5-bit products: as many as 16 bits hold */
#pragma GCC unroll 4
                        for (int i = 0; i < MR; i++) {
                            P[i] = _mm256_madd_epi16(a[i], ones);
                            a[i] = _mm256_setzero_si256();
                        }
                    }
                }
#pragma GCC unroll 4
                for (int i = 0; i < MR; i++) P[i] = _mm256_add_epi32(P[i], _mm256_madd_epi16(a[i], ones));
            } else {
                __m256i a[4];
#pragma GCC unroll 4
                for (int i = 0; i < MR; i++) a[i] = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int gq = 0; gq < 8; gq++) {
                    const __m256i w = _mm256_loadu_si256((const __m256i *)(qb + 32 * gq));
                    const __m256i aw = t.sgn ? _mm256_sign_epi8(w, w) : w;
#pragma GCC unroll 4
                    for (int i = 0; i < MR; i++) {
                        __m256i xb = BCAST4(q + i * K + 32 * u + 4 * gq);
                        if (t.sgn) xb = _mm256_sign_epi8(xb, w);
                        a[i] = _mm256_add_epi16(a[i], _mm256_maddubs_epi16(aw, xb));
                    }
                    if ((gq + 1) % t.g16 == 0) {
#pragma GCC unroll 4
                        for (int i = 0; i < MR; i++) {
                            P[i] = _mm256_add_epi32(P[i], _mm256_madd_epi16(a[i], ones));
                            a[i] = _mm256_setzero_si256();
                        }
                    }
                    if (t.nd == 2 && gq == 3) {
#pragma GCC unroll 4
                        for (int i = 0; i < MR; i++) {
                            P0[i] = P[i];
                            P[i] = _mm256_setzero_si256();
                        }
                    }
                }
            }
            const __m256 D0 = unit_scales8(t, unit, 0);
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++) {
                const __m256 e = _mm256_set1_ps(dx[i * nq + u]);
                const int32_t *Su = S + (i * nq + u) * 2;
                if (t.nd == 2) {
                    const __m256 D1 = unit_scales8(t, unit, 1);
                    const __m256i p0 = _mm256_sub_epi32(P0[i], _mm256_set1_epi32(t.o * Su[0]));
                    const __m256i p1 = _mm256_sub_epi32(P[i], _mm256_set1_epi32(t.o * Su[1]));
                    acc[i][g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_mul_ps(D0, e), acc[i][g]);
                    acc[i][g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_mul_ps(D1, e), acc[i][g]);
                } else {
                    const __m256i p = t.o ? _mm256_sub_epi32(P[i], _mm256_set1_epi32(t.o * (Su[0] + Su[1]))) : P[i];
                    acc[i][g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(D0, e), acc[i][g]);
                }
                if (t.nm)
                    off[i][g] = _mm256_fmadd_ps(unit_scales8(t, unit, t.nd),
                                                _mm256_set1_ps(sx[i * nq + u]), off[i][g]);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) out[i * NG + g] = t.nm ? _mm256_add_ps(acc[i][g], off[i][g]) : acc[i][g];
}

/* Outputs of a tile -> y, the valid columns only, plus the bias. */
static inline void store_tile(const __m256 *out, int MR, int NG, float *y, int64_t ldy, int64_t ncols,
                              const float *bias) {
    for (int i = 0; i < MR; i++)
        for (int g = 0; g < NG; g++) {
            float v[8];
            _mm256_storeu_ps(v, out[i * NG + g]);
            for (int c = 0; c < 8 && 8 * g + c < ncols; c++)
                y[i * ldy + 8 * g + c] = bias ? v[c] + bias[8 * g + c] : v[c];
        }
}

#define PANEL_TYPES(mr, ng)                                                                             \
    switch (type) {                                                                                    \
        case R_Q4_0: panel_tile(R_Q4_0, qm, dxm, sxm, Sm, K, grp, gb, out, mr, ng); break;             \
        case R_Q4_1: panel_tile(R_Q4_1, qm, dxm, sxm, Sm, K, grp, gb, out, mr, ng); break;             \
        case R_Q5_0: panel_tile(R_Q5_0, qm, dxm, sxm, Sm, K, grp, gb, out, mr, ng); break;             \
        case R_Q5_1: panel_tile(R_Q5_1, qm, dxm, sxm, Sm, K, grp, gb, out, mr, ng); break;             \
        case R_Q8_0: panel_tile(R_Q8_0, qm, dxm, sxm, Sm, K, grp, gb, out, mr, ng); break;             \
        case R_Q4_K: panel_tile(R_Q4_K, qm, dxm, sxm, Sm, K, grp, gb, out, mr, ng); break;             \
        case R_Q5_K: panel_tile(R_Q5_K, qm, dxm, sxm, Sm, K, grp, gb, out, mr, ng); break;             \
        default: panel_tile(R_Q6_K, qm, dxm, sxm, Sm, K, grp, gb, out, mr, ng); break;                 \
    }

/* Groups [g0, g1) of a panel segment of `rows` columns, for all M rows: one row four
 * groups at a time; more rows one group at a time, every row against it in tiles of up
 * to four (the group's weights stay in L1 while the rows stream). */
static void panel_groups(int type, const int8_t *q, const float *dx, const float *sx, const int32_t *S, int64_t M,
                         int64_t K, const uint8_t *data, int64_t gb, int64_t rows, int64_t g0, int64_t g1, float *y,
                         int64_t ldy, const float *bias) {
    const int64_t nq = K / 32;
    __m256 out[16];
    for (int64_t gi = g0; gi < g1;) {
        const int ng = M == 1 && g1 - gi >= 4 ? 4 : 1;
        const uint8_t *grp = data + gi * gb;
        const int64_t col = 8 * gi, ncols = rows - col < 8 * ng ? rows - col : 8 * ng;
        for (int64_t m = 0; m < M;) {
            const int mr = M - m >= 4 ? 4 : (int)(M - m);
            const int8_t *qm = q + m * K;
            const float *dxm = dx + m * nq, *sxm = sx + m * nq;
            const int32_t *Sm = S + m * nq * 2;
            if (ng == 4) {
                PANEL_TYPES(1, 4)
            } else {
                switch (mr) {
                    case 4: PANEL_TYPES(4, 1) break;
                    case 3: PANEL_TYPES(3, 1) break;
                    case 2: PANEL_TYPES(2, 1) break;
                    default: PANEL_TYPES(1, 1) break;
                }
            }
            store_tile(out, mr, ng, y + m * ldy + col, ldy, ncols, bias ? bias + col : 0);
            m += mr;
        }
        gi += ng;
    }
}
#undef PANEL_TYPES

/* A buffer of at least n bytes, kept and grown between calls. */
static void *grow(void **buf, int64_t *cap, int64_t n) {
    if (n > *cap) {
        free(*buf);
        *cap = (n + 4095) / 4096 * 4096;
        *buf = aligned_alloc(64, (size_t)*cap);
        if (!*buf) *cap = 0;
    }
    return *buf;
}


/* The R_ type a panel segment is of (0: a float segment). */
static int panel_type(int type) { return type > X_OFF ? type - X_OFF + R_OFF : 0; }

/* Quantized activations, kept per thread between calls (a decode step makes ~200). */
typedef struct {
    int8_t *q;
    float *dx, *sx;
    int32_t *S;
} acts;

/* M rows of x quantized into q (M K bytes) and f (4 M K / 32 floats: dx, sx, S). */
static acts quantize_rows(const float *x, int64_t M, int64_t K, int8_t *q, float *f) {
    const int64_t nq = K / 32;
    acts a = {q, f, f + M * nq, (int32_t *)(f + 2 * M * nq)};
    for (int64_t m = 0; m < M; m++)
        dspark_q8x_quantize_row(x + m * K, K, a.q + m * K, a.dx + m * nq, a.sx + m * nq, a.S + 2 * m * nq);
    return a;
}

/* quantize_rows into this thread's buffers. */
static int quantize(const float *x, int64_t M, int64_t K, acts *a) {
    static __thread void *qbuf, *fbuf;
    static __thread int64_t qcap, fcap;
    int8_t *q = grow(&qbuf, &qcap, M * K);
    float *f = grow(&fbuf, &fcap, 4 * M * (K / 32) * 4);
    if (!q || !f) return -1;
    *a = quantize_rows(x, M, K, q, f);
    return 0;
}

void dspark_gemm_q8x(const float *x, const int64_t *desc, const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                     int threads) {
    acts a;
    if (quantize(x, M, K, &a)) return;
    int64_t G = 0;  /* groups of 8 columns over all segments */
    for (int64_t s = 0; s < desc[0]; s++) G += (desc[2 + 4 * s] + 7) / 8;
    if (G == 0) return;
    if (threads < 1) threads = 1;
    if (threads > G) threads = (int)G;
#pragma omp parallel num_threads(threads)
    {
#ifdef _OPENMP
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        const int t = 0, nt = 1;
#endif
        const int64_t t0 = G * t / nt, t1 = G * (t + 1) / nt;
        float *w = 0;
        int64_t base = 0, gbase = 0;
        for (int64_t s = 0; s < desc[0]; s++) {
            const int64_t *g = desc + 1 + 4 * s;
            const int64_t rows = g[1], ng = (rows + 7) / 8;
            const uint8_t *data = (const uint8_t *)(intptr_t)g[3];
            const int64_t lo = t0 > gbase ? t0 - gbase : 0, hi = t1 < gbase + ng ? t1 - gbase : ng;
            if (hi > lo && panel_type((int)g[0]))
                panel_groups(panel_type((int)g[0]), a.q, a.dx, a.sx, a.S, M, K, data, g[2], rows, lo, hi, y + base,
                             N, bias ? bias + base : 0);
            else if (hi > lo) {
                const int64_t c0 = 8 * lo, c1 = 8 * hi < rows ? 8 * hi : rows;
                if (!w) w = malloc((size_t)K * sizeof(float));
                if (w) dspark_quant_ref_cols((int)g[0], data, g[2], c0, c1 - c0, x, M, K, y + base + c0, N,
                                  bias ? bias + base + c0 : 0, w);
            }
            base += rows;
            gbase += ng;
        }
        free(w);
    }
}

/* The scalar reference: the same sequence per output, one element at a time. */
void dspark_gemm_q8x_ref(const float *x, const int64_t *desc, const float *bias, float *y, int64_t M, int64_t N,
                         int64_t K) {
    const int64_t nq = K / 32;
    int8_t *qbuf = malloc((size_t)(M * K));
    float *f = malloc((size_t)(4 * M * nq) * sizeof(float)), *w = malloc((size_t)K * sizeof(float));
    if (!qbuf || !f || !w) goto out;
    const acts a = quantize_rows(x, M, K, qbuf, f);
    const int8_t *q = a.q;
    const float *dx = a.dx, *sx = a.sx;
    int64_t n = 0;
    for (int64_t s = 0; s < desc[0]; s++) {
        const int64_t *g = desc + 1 + 4 * s;
        const int type = panel_type((int)g[0]);
        const uint8_t *data = (const uint8_t *)(intptr_t)g[3];
        if (!type) {
            dspark_quant_ref_cols((int)g[0], data, g[2], 0, g[1], x, M, K, y + n, N, bias ? bias + n : 0, w);
            n += g[1];
            continue;
        }
        const xtype t = xinfo(type);
        const int64_t ub = unit_bytes(t);
        for (int64_t r = 0; r < g[1]; r++, n++) {
            const int c = (int)(r & 7);
            for (int64_t m = 0; m < M; m++) {
                float acc = 0.0f, off = 0.0f;
                for (int64_t u = 0; u < nq; u++) {
                    const uint8_t *unit = data + (r >> 3) * g[2] + u * ub, *qb = unit_quants(t, unit);
                    const int8_t *qu = q + m * K + 32 * u;
                    const float e = dx[m * nq + u];
                    int p[2] = {0, 0};
                    for (int k = 0; k < 32; k++) p[k >> 4] += panel_w8(t, qb, c, k) * qu[k];
                    if (t.nd == 2) {
                        acc = __builtin_fmaf((float)p[0], unit_scale(t, unit, 0, c) * e, acc);
                        acc = __builtin_fmaf((float)p[1], unit_scale(t, unit, 1, c) * e, acc);
                    } else {
                        acc = __builtin_fmaf((float)(p[0] + p[1]), unit_scale(t, unit, 0, c) * e, acc);
                    }
                    if (t.nm) off = __builtin_fmaf(unit_scale(t, unit, t.nd, c), sx[m * nq + u], off);
                }
                const float v = t.nm ? acc + off : acc;
                y[m * N + n] = bias ? v + bias[n] : v;
            }
        }
    }
out:
    free(qbuf);
    free(f);
    free(w);
}
