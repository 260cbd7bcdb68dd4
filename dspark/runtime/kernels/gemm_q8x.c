/* y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) over a GGUF file's weights as stored,
 * with the activations quantized to int8: the `q8x` precision (as llama.cpp computes a
 * quantized model on a CPU; the weights are the file's, each exactly as in `gguf`).
 *
 * The weights are read in the repacked layouts of quant_units.h (the same bytes the
 * `gguf` precision reads); a descriptor's segment of type X_OFF + t is segment type
 * R_OFF + t read this way. F32, F16 and BF16 segments in a q8x matrix are computed as
 * the `gguf` precision computes them (fp32 activations, its order).
 *
 * Activations: each row of x, in blocks of 32, becomes
 *   a = max |x|,  dx = a / 127,  q = round-to-nearest-even(x * (127 / a))  (q = 0 if a = 0),
 *   sx = dx * sum(q)                                                   (fp32, rounded once each)
 * so |q| <= 127. A unit (32 weights) of a weight row is 32 small integers w8 with scales:
 *   Q4_0 w = d (q - 8)   Q4_1 w = d q + m   Q5_0 w = d (q - 16)   Q5_1 w = d q + m
 *   Q8_0 w = d q         Q4_K, Q5_K w = ds q - dm (ds, dm: the sub-block's d sc, dmin m)
 *   Q6_K w = ds (q - 32), ds one per 16 weights
 * i.e. w = D w8 + M, with D per 16 weights and M per 32 (zero for the symmetric types).
 *
 * Every output is this sequence, whatever M, the tile, the ISA and the thread count:
 *   for each unit u ascending: eight lane sums p[l] = sum of w8[b] q[b] over b = 4l .. 4l+3
 *     (exact integers); acc[l] = fma((float) p[l], D(l) * dx, acc[l]) with D(l) the scale of
 *     weights 4l .. 4l+3; and off = fma(M, sx, off) where the type has an M;
 *   then r = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7)), r + off,
 *   and + bias[n] where there is one.
 * The integer sums are exact (|w8| <= 128 and |q| <= 127: a pair's sum fits the 16 bits
 * vpmaddubsw keeps), so the AVX2 code and the scalar reference (`dspark_gemm_q8x_ref`)
 * give the same bits (tests/test_quant_kernels.py), and a token's logits do not depend
 * on what shares its step: speculative decoding in q8x gives exactly q8x's plain decoding.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels.h"
#include "quant_units.h"

/* ---- activations ------------------------------------------------------------------ */

/* One row of K (a multiple of 32) -> q [K], dx [K / 32], sx [K / 32]. */
static void quantize_row(const float *x, int64_t K, int8_t *q, float *dx, float *sx) {
    for (int64_t b = 0; b < K / 32; b++) {
        const float *xb = x + 32 * b;
        float a = 0.0f;
        for (int i = 0; i < 32; i++) a = fmaxf(a, fabsf(xb[i]));
        const float id = a > 0.0f ? 127.0f / a : 0.0f;
        int s = 0;
        for (int i = 0; i < 32; i++) {
            const int v = (int)nearbyintf(xb[i] * id);
            q[32 * b + i] = (int8_t)v;
            s += v;
        }
        dx[b] = a / 127.0f;
        sx[b] = dx[b] * (float)s;
    }
}

/* ---- one unit of a weight row ------------------------------------------------------ */

/* The scales of unit u: d0 for weights 0-15, d1 for 16-31, and m (0 where none). */
static inline __attribute__((always_inline)) void unit_scales(int type, const uint8_t *row, int64_t u, float *d0,
                                                               float *d1, float *m) {
    const int sub = (int)(u & 7);
    switch (type) {
        case R_Q4_0: *d0 = *d1 = f32at(row + u * 20); *m = 0.0f; return;
        case R_Q4_1: *d0 = *d1 = f32at(row + u * 24); *m = f32at(row + u * 24 + 4); return;
        case R_Q5_0: case R_Q8_0: *d0 = *d1 = f32at(row + u * 36); *m = 0.0f; return;
        case R_Q5_1: *d0 = *d1 = f32at(row + u * 40); *m = f32at(row + u * 40 + 4); return;
        case R_Q4_K: case R_Q5_K: {
            const uint8_t *blk = row + (u >> 3) * (type == R_Q4_K ? 192 : 320);
            *d0 = *d1 = f32at(blk + 4 * sub);
            *m = -f32at(blk + 32 + 4 * sub);
            return;
        }
        default: {  /* R_Q6_K */
            const uint8_t *blk = row + (u >> 3) * 320;
            *d0 = f32at(blk + 8 * sub);
            *d1 = f32at(blk + 8 * sub + 4);
            *m = 0.0f;
            return;
        }
    }
}

static inline int has_m(int type) { return type == R_Q4_1 || type == R_Q5_1 || type == R_Q4_K || type == R_Q5_K; }

/* The 32 small integers of unit u, scalar. */
static void unit_w8_ref(int type, const uint8_t *row, int64_t u, int w8[32]) {
    const int sub = (int)(u & 7);
    switch (type) {
        case R_Q4_0: case R_Q4_1: {
            const int one = type == R_Q4_1;
            const uint8_t *qs = row + u * (20 + 4 * one) + 4 + 4 * one;
            for (int j = 0; j < 16; j++) {
                w8[j] = (qs[j] & 15) - (one ? 0 : 8);
                w8[j + 16] = (qs[j] >> 4) - (one ? 0 : 8);
            }
            return;
        }
        case R_Q4_K: {
            const uint8_t *qs = row + (u >> 3) * 192 + 64 + 32 * (sub >> 1);
            for (int j = 0; j < 32; j++) w8[j] = sub & 1 ? qs[j] >> 4 : qs[j] & 15;
            return;
        }
        default: {  /* a byte a weight */
            const uint8_t *q;
            if (type == R_Q5_1) q = row + u * 40 + 8;
            else if (type == R_Q5_0 || type == R_Q8_0) q = row + u * 36 + 4;
            else q = row + (u >> 3) * 320 + 64 + 32 * sub;  /* Q5_K (unsigned), Q6_K */
            for (int j = 0; j < 32; j++) w8[j] = type == R_Q5_K ? (int)q[j] : (int)(int8_t)q[j];
            return;
        }
    }
}

/* The same 32 integers in a register (byte b = weight b). Unsigned types' bytes are
 * their values; the signed ones' are two's complement. */
static inline __attribute__((always_inline)) __m256i unit_w8(int type, const uint8_t *row, int64_t u) {
    const __m256i f15 = _mm256_set1_epi8(15);
    switch (type) {
        case R_Q4_0: case R_Q4_1: {
            const int one = type == R_Q4_1;
            const __m128i v = _mm_loadu_si128((const __m128i *)(row + u * (20 + 4 * one) + 4 + 4 * one));
            const __m256i w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), f15);
            return one ? w : _mm256_sub_epi8(w, _mm256_set1_epi8(8));
        }
        case R_Q4_K: {
            const int sub = (int)(u & 7);
            const __m256i v = _mm256_loadu_si256((const __m256i *)(row + (u >> 3) * 192 + 64 + 32 * (sub >> 1)));
            return _mm256_and_si256(sub & 1 ? _mm256_srli_epi16(v, 4) : v, f15);
        }
        case R_Q5_1: return _mm256_loadu_si256((const __m256i *)(row + u * 40 + 8));
        case R_Q5_0: case R_Q8_0: return _mm256_loadu_si256((const __m256i *)(row + u * 36 + 4));
        default: return _mm256_loadu_si256((const __m256i *)(row + (u >> 3) * 320 + 64 + 32 * (u & 7)));
    }
}

/* Whether a type's integers are all non-negative (then vpmaddubsw takes them as they are). */
static inline int unsigned_w8(int type) {
    return type == R_Q4_1 || type == R_Q4_K || type == R_Q5_1 || type == R_Q5_K;
}

static inline float reduce8(const float *a) {
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

static inline float reduce8v(__m256 v) {
    const __m128 u = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 w = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));
}

/* ---- the AVX2 kernel: MR rows of x against NC rows of W ---------------------------- */

static inline __attribute__((always_inline)) void fused(int type, const int8_t *q, const float *dx, const float *sx,
                                                        int64_t K, const uint8_t *rows, int64_t rb, float *y,
                                                        int64_t ldy, const float *bias, int MR, int NC) {
    __m256 acc[4][4];
    float off[4][4];
    const __m256i ones = _mm256_set1_epi16(1);
    const int64_t units = K / 32, nq = K / 32;
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NC; j++) {
            acc[i][j] = _mm256_setzero_ps();
            off[i][j] = 0.0f;
        }
    for (int64_t u = 0; u < units; u++) {
#pragma GCC unroll 4
        for (int j = 0; j < NC; j++) {
            const uint8_t *row = rows + j * rb;
            const __m256i w = unit_w8(type, row, u);
            const __m256i aw = unsigned_w8(type) ? w : _mm256_sign_epi8(w, w);
            float d0, d1, m;
            unit_scales(type, row, u, &d0, &d1, &m);
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++) {
                __m256i qv = _mm256_loadu_si256((const __m256i *)(q + i * K + 32 * u));
                if (!unsigned_w8(type)) qv = _mm256_sign_epi8(qv, w);
                const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(aw, qv), ones));
                const float e = dx[i * nq + u];
                const __m256 s = type == R_Q6_K ? _mm256_set_m128(_mm_set1_ps(d1 * e), _mm_set1_ps(d0 * e))
                                                : _mm256_set1_ps(d0 * e);
                acc[i][j] = _mm256_fmadd_ps(p, s, acc[i][j]);
                if (has_m(type)) off[i][j] = __builtin_fmaf(m, sx[i * nq + u], off[i][j]);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NC; j++) {
            const float r = reduce8v(acc[i][j]) + off[i][j];
            y[i * ldy + j] = bias ? r + bias[j] : r;
        }
}

#define Q8X_TYPES(mr, n)                                                                                       \
    switch (type) {                                                                                           \
        case R_Q4_0: fused(R_Q4_0, qm, dxm, sxm, K, data + (c + j) * rb, rb, ym + j, ldy, b, mr, n); break; \
        case R_Q4_1: fused(R_Q4_1, qm, dxm, sxm, K, data + (c + j) * rb, rb, ym + j, ldy, b, mr, n); break; \
        case R_Q5_0: fused(R_Q5_0, qm, dxm, sxm, K, data + (c + j) * rb, rb, ym + j, ldy, b, mr, n); break; \
        case R_Q5_1: fused(R_Q5_1, qm, dxm, sxm, K, data + (c + j) * rb, rb, ym + j, ldy, b, mr, n); break; \
        case R_Q8_0: fused(R_Q8_0, qm, dxm, sxm, K, data + (c + j) * rb, rb, ym + j, ldy, b, mr, n); break; \
        case R_Q4_K: fused(R_Q4_K, qm, dxm, sxm, K, data + (c + j) * rb, rb, ym + j, ldy, b, mr, n); break; \
        case R_Q5_K: fused(R_Q5_K, qm, dxm, sxm, K, data + (c + j) * rb, rb, ym + j, ldy, b, mr, n); break; \
        default: fused(R_Q6_K, qm, dxm, sxm, K, data + (c + j) * rb, rb, ym + j, ldy, b, mr, n); break;     \
    }

/* Columns [c, c + nc) of one segment (type: its R_ type) for all M rows. One row: four
 * columns at a time. More: two columns at a time, every row against them in tiles of up
 * to four (the two weight rows stay in L1 while the rows stream), so the weights are read
 * once per call. The shapes are for registers and caches only. */
static void q8x_cols(int type, const int8_t *q, const float *dx, const float *sx, int64_t M, int64_t K,
                     const uint8_t *data, int64_t rb, int64_t c, int64_t nc, float *y, int64_t ldy,
                     const float *bias) {
    const int64_t nq = K / 32;
    const int8_t *qm = q;
    const float *dxm = dx, *sxm = sx;
    float *ym = y;
    int64_t j = 0;
    if (M == 1) {
        for (; j + 4 <= nc; j += 4) { const float *b = bias ? bias + j : 0; Q8X_TYPES(1, 4) }
        for (; j < nc; j++) { const float *b = bias ? bias + j : 0; Q8X_TYPES(1, 1) }
        return;
    }
    for (; j < nc; j += 2) {
        const int two = nc - j >= 2;
        const float *b = bias ? bias + j : 0;
        for (int64_t m = 0; m < M;) {
            const int mr = M - m >= 4 ? 4 : (int)(M - m);
            qm = q + m * K;
            dxm = dx + m * nq;
            sxm = sx + m * nq;
            ym = y + m * ldy;
            if (two) {
                switch (mr) {
                    case 4: Q8X_TYPES(4, 2) break;
                    case 3: Q8X_TYPES(3, 2) break;
                    case 2: Q8X_TYPES(2, 2) break;
                    default: Q8X_TYPES(1, 2) break;
                }
            } else {
                switch (mr) {
                    case 4: Q8X_TYPES(4, 1) break;
                    case 3: Q8X_TYPES(3, 1) break;
                    case 2: Q8X_TYPES(2, 1) break;
                    default: Q8X_TYPES(1, 1) break;
                }
            }
            m += mr;
        }
    }
}
#undef Q8X_TYPES

/* A float segment (F32, F16, BF16) as the gguf precision computes it. */
static void float_cols(int type, const float *x, int64_t M, int64_t K, const uint8_t *data, int64_t rb, int64_t c,
                       int64_t nc, float *y, int64_t ldy, const float *bias, float *w) {
    for (int64_t j = 0; j < nc; j++) {
        dspark_dequant_row(type, data + (c + j) * rb, K, w);
        for (int64_t m = 0; m < M; m++) {
            float a[16] = {0};
            for (int64_t k = 0; k < K; k += 16)
                for (int l = 0; l < 16; l++) a[l] = __builtin_fmaf(x[m * K + k + l], w[k + l], a[l]);
            float t[8], u[4], v[2];
            for (int l = 0; l < 8; l++) t[l] = a[l] + a[l + 8];
            for (int l = 0; l < 4; l++) u[l] = t[l] + t[l + 4];
            for (int l = 0; l < 2; l++) v[l] = u[l] + u[l + 2];
            const float r = v[0] + v[1];
            y[m * ldy + j] = bias ? r + bias[j] : r;
        }
    }
}

/* A growing per-call buffer (kept: a decode step calls this some 200 times). */
static void *grow(void **buf, int64_t *cap, int64_t n) {
    if (n > *cap) {
        free(*buf);
        *cap = (n + 4095) / 4096 * 4096;
        *buf = aligned_alloc(64, (size_t)*cap);
        if (!*buf) *cap = 0;
    }
    return *buf;
}

/* The R_ type a q8x segment is read as (0: a float segment). */
static int read_as(int type) { return type > X_OFF ? type - X_OFF + R_OFF : 0; }

void dspark_gemm_q8x(const float *x, const int64_t *desc, const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                     int threads) {
    static __thread void *qbuf, *fbuf;
    static __thread int64_t qcap, fcap;
    const int64_t nq = K / 32;
    int8_t *q = grow(&qbuf, &qcap, M * K);
    float *dx = grow(&fbuf, &fcap, 2 * M * nq * (int64_t)sizeof(float)), *sx = dx ? dx + M * nq : 0;
    if (!q || !dx) return;
    for (int64_t m = 0; m < M; m++) quantize_row(x + m * K, K, q + m * K, dx + m * nq, sx + m * nq);
    if (threads < 1) threads = 1;
    if (threads > (N + 7) / 8) threads = (int)((N + 7) / 8);
#pragma omp parallel num_threads(threads)
    {
#ifdef _OPENMP
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        const int t = 0, nt = 1;
#endif
        const int64_t c0 = (N * t / nt) / 8 * 8, c1 = t == nt - 1 ? N : (N * (t + 1) / nt) / 8 * 8;
        float *w = 0;
        int64_t base = 0;
        for (int64_t s = 0; s < desc[0]; s++) {
            const int64_t *g = desc + 1 + 4 * s;
            const int64_t rows = g[1], rb = g[2];
            const uint8_t *data = (const uint8_t *)(intptr_t)g[3];
            const int64_t lo = c0 > base ? c0 : base, hi = c1 < base + rows ? c1 : base + rows;
            const float *b = bias ? bias + lo : 0;
            if (hi > lo && read_as((int)g[0]))
                q8x_cols(read_as((int)g[0]), q, dx, sx, M, K, data, rb, lo - base, hi - lo, y + lo, N, b);
            else if (hi > lo) {
                if (!w) w = malloc((size_t)K * sizeof(float));
                if (w) float_cols((int)g[0], x, M, K, data, rb, lo - base, hi - lo, y + lo, N, b, w);
            }
            base += rows;
        }
        free(w);
    }
}

/* The scalar reference: the same sequence per output, one element at a time. */
void dspark_gemm_q8x_ref(const float *x, const int64_t *desc, const float *bias, float *y, int64_t M, int64_t N,
                         int64_t K) {
    const int64_t nq = K / 32;
    int8_t *q = malloc((size_t)(M * K));
    float *dx = malloc((size_t)(2 * M * nq) * sizeof(float)), *w = malloc((size_t)K * sizeof(float));
    if (!q || !dx || !w) goto out;
    float *sx = dx + M * nq;
    for (int64_t m = 0; m < M; m++) quantize_row(x + m * K, K, q + m * K, dx + m * nq, sx + m * nq);
    int64_t n = 0;
    for (int64_t s = 0; s < desc[0]; s++) {
        const int64_t *g = desc + 1 + 4 * s;
        const int type = read_as((int)g[0]);
        const uint8_t *data = (const uint8_t *)(intptr_t)g[3];
        if (!type) {
            float_cols((int)g[0], x, M, K, data, g[2], 0, g[1], y + n, N, bias ? bias + n : 0, w);
            n += g[1];
            continue;
        }
        for (int64_t r = 0; r < g[1]; r++, n++) {
            const uint8_t *row = data + r * g[2];
            for (int64_t m = 0; m < M; m++) {
                float acc[8] = {0}, off = 0.0f;
                for (int64_t u = 0; u < nq; u++) {
                    int w8[32];
                    float d0, d1, mm;
                    unit_w8_ref(type, row, u, w8);
                    unit_scales(type, row, u, &d0, &d1, &mm);
                    const float e = dx[m * nq + u];
                    for (int l = 0; l < 8; l++) {
                        int p = 0;
                        for (int b = 4 * l; b < 4 * l + 4; b++) p += w8[b] * q[m * K + 32 * u + b];
                        acc[l] = __builtin_fmaf((float)p, (l < 4 ? d0 : d1) * e, acc[l]);
                    }
                    if (has_m(type)) off = __builtin_fmaf(mm, sx[m * nq + u], off);
                }
                const float v = reduce8(acc) + off;
                y[m * N + n] = bias ? v + bias[n] : v;
            }
        }
    }
out:
    free(q);
    free(dx);
    free(w);
}
