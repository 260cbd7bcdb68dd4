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
 *   IQ4_NL, IQ4_XS w = ds v, v = IQ4_VALUES[q] (an int8 of ggml's table; ds: d, or d (ls - 32))
 * i.e. w = D w8 + M, with D per 32 weights (Q6_K: per 16) and M per 32 (the types with a
 * min; none for the others).
 *
 * Every output is this sequence, whatever M, the tile, the ISA and the thread count:
 *   for each unit u ascending: P = the exact integer sum of w8 q over the unit (Q6_K: P0
 *   over weights 0-15, P1 over 16-31); acc = fma((float) P, D * dx, acc) (Q6_K: with P0
 *   and D0, then P1 and D1); off = fma(M, sx, off) where the type has a min;
 *   then (acc + off), + bias[n] where there is one.
 * The integer sums are exact in every order, so the AVX2 code, the AVX512-VNNI code
 * (gemm_q8x_vnni.c) and the scalar reference (`dspark_gemm_q8x_ref`) give the same bits (tests/test_q8x_kernel.py), and a token's
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
 * The IQ4 types' panels hold their 4-bit q as Q4_0's do, and each group's values are looked
 * up (vpshufb) and multiplied with Q8_0's sign trick.
 * Products are summed in 16 bits for as many groups as cannot overflow (|w8 q| pairs:
 * 4-bit 8 groups, 5-bit 4, 6-bit 2, Q8_0 and the IQ4 types 1), then in 32.
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
#include "q8x_groups.h"


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

/* M rows' quantized activations in q (M K bytes) and f (4 M K / 32 floats: dx, sx, S). */
static acts act_view(int64_t M, int64_t K, int8_t *q, float *f) {
    const int64_t nq = K / 32;
    return (acts){q, f, f + M * nq, (int32_t *)(f + 2 * M * nq)};
}

/* Rows [m0, m1) of x quantized into a's buffers. */
static void quantize_span(const float *x, int64_t m0, int64_t m1, int64_t K, const acts *a) {
    const int64_t nq = K / 32;
    for (int64_t m = m0; m < m1; m++)
        dspark_q8x_quantize_row(x + m * K, K, a->q + m * K, a->dx + m * nq, a->sx + m * nq, a->S + 2 * m * nq);
}

/* The calling thread's buffers for M rows' quantized activations. */
static int act_buffers(int64_t M, int64_t K, acts *a) {
    static __thread void *qbuf, *fbuf;
    static __thread int64_t qcap, fcap;
    const int64_t nq = K / 32;
    int8_t *q = grow(&qbuf, &qcap, M * K);
    float *f = grow(&fbuf, &fcap, 4 * M * nq * 4);
    if (!q || !f) return -1;
    *a = act_view(M, K, q, f);
    return 0;
}

/* Groups [t0, t1) of the matrix (counted over all its segments) for all M rows. */
static void run_groups(const acts *a, const float *x, const int64_t *desc, const float *bias, float *y, int64_t M,
                       int64_t N, int64_t K, int64_t t0, int64_t t1, int vnni, float **w) {
    int64_t base = 0, gbase = 0;
    for (int64_t s = 0; s < desc[0] && gbase < t1; s++) {
        const int64_t *g = desc + 1 + 4 * s;
        const int64_t rows = g[1], ng = (rows + 7) / 8;
        const uint8_t *data = (const uint8_t *)(intptr_t)g[3];
        const int64_t lo = t0 > gbase ? t0 - gbase : 0, hi = t1 < gbase + ng ? t1 - gbase : ng;
        if (hi > lo && panel_type((int)g[0]) && vnni)
            dspark_q8x_groups_vnni(panel_type((int)g[0]), a->q, a->dx, a->sx, a->S, M, K, data, g[2], rows, lo, hi,
                                   y + base, N, bias ? bias + base : 0);
        else if (hi > lo && panel_type((int)g[0]))
            panel_groups(panel_type((int)g[0]), a->q, a->dx, a->sx, a->S, M, K, data, g[2], rows, lo, hi, y + base, N,
                         bias ? bias + base : 0);
        else if (hi > lo) {
            const int64_t c0 = 8 * lo, c1 = 8 * hi < rows ? 8 * hi : rows;
            if (!*w) *w = malloc((size_t)K * sizeof(float));
            if (*w) dspark_quant_ref_cols((int)g[0], data, g[2], c0, c1 - c0, x, M, K, y + base + c0, N,
                                          bias ? bias + base + c0 : 0, *w);
        }
        base += rows;
        gbase += ng;
    }
}

/* The fewest rows whose quantizing is split between the threads (a barrier costs about what
 * one thread quantizes of 8 rows of 576). */
#define SPLIT_QUANT_ROWS 8

void dspark_gemm_q8x(const float *x, const int64_t *desc, const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                     int threads) {
    acts a;
    if (act_buffers(M, K, &a)) return;
    int64_t G = 0;  /* groups of 8 columns over all segments */
    for (int64_t s = 0; s < desc[0]; s++) G += (desc[2 + 4 * s] + 7) / 8;
    if (G == 0) return;
    if (threads < 1) threads = 1;
    if (threads > G) threads = (int)G;
    static int has_vnni = -1;
    if (has_vnni < 0) has_vnni = dspark_q8x_vnni_available();
    const int vnni = has_vnni && dspark_gemm_bf16w_isa() == 512;
    const int split = M >= SPLIT_QUANT_ROWS && threads > 1;
    if (!split) quantize_span(x, 0, M, K, &a);
#pragma omp parallel num_threads(threads)
    {
#ifdef _OPENMP
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        const int t = 0, nt = 1;
#endif
        float *w = 0;
        if (split) {
            quantize_span(x, M * t / nt, M * (t + 1) / nt, K, &a);
#pragma omp barrier
        }
        run_groups(&a, x, desc, bias, y, M, N, K, G * t / nt, G * (t + 1) / nt, vnni, &w);
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
    const acts a = act_view(M, K, qbuf, f);
    quantize_span(x, 0, M, K, &a);
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
