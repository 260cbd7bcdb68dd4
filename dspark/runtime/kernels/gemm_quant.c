/* y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) over a GGUF file's weights as stored:
 * the `gguf` precision. fp32 activations and accumulation; every weight is its exact
 * dequantized fp32 value (what ggml's dequantize_row_* and the `gguf` package give, and
 * so what transformers builds from the file).
 *
 * Block layouts (ggml-common.h), a row of K weights being K / block consecutive blocks:
 *   Q4_0  32: fp16 d, 16 bytes; low nibbles are weights 0-15, high 16-31; w = d (q - 8)
 *   Q4_1  32: fp16 d, fp16 m, 16 bytes as Q4_0;                        w = d q + m
 *   Q5_0  32: fp16 d, 32-bit mask of fifth bits, 16 bytes as Q4_0;       w = d (q - 16)
 *   Q5_1  32: fp16 d, fp16 m, mask, 16 bytes;                           w = d q + m
 *   Q8_0  32: fp16 d, 32 int8;                                          w = d q
 *   Q4_K 256: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes: eight
 *             sub-blocks of 32 (64 weights per 32 bytes: low nibbles then high);
 *             w = (d sc) q - (dmin m)
 *   Q5_K 256: as Q4_K plus 32 bytes of fifth bits (bit j of byte l: weight 32 j + l)
 *   Q6_K 256: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, fp16 d
 *             last; w = (d sc) (q - 32), sixteen sub-blocks of 16
 *   Q2_K 256: 16 bytes of 4-bit scales (low) and mins (high), 64 bytes of 2-bit quants,
 *             fp16 d, fp16 dmin; w = (d sc) q - (dmin m), sixteen sub-blocks of 16
 *   F32, F16, BF16: one weight per element (treated as blocks of 32 here).
 * Each product above is exact in fp32 (at most 11 + 7 + 6 significant bits), so the
 * only rounding is the one subtraction or addition of Q4_1, Q5_1, Q4_K and Q5_K, done
 * once in fp32 as ggml does.
 *
 * The matmul reads each row's blocks in a repacked layout (below: the scales in fp32,
 * the quants as stored; a Q4_K row streams 0.75 bytes a weight, Q5_0 0.75, Q8_0 1.125).
 * One or two rows of x (decode) take the dequantized weights straight into the dot
 * products; more rows dequantize a tile of W rows into a per-thread fp32 scratch once
 * and run every row of x against it. Every output element is the
 * same sequence whatever M, the tile it falls in, the ISA and the thread count:
 *   sixteen lane sums s[l] = FMA chain over k = l, l + 16, l + 32, ... ascending from 0;
 *   then t[l] = s[l] + s[l + 8] (l < 8), u[l] = t[l] + t[l + 4], v[l] = u[l] + u[l + 2],
 *   r = v[0] + v[1], and r + bias[n] where there is a bias.
 * A token's logits therefore do not depend on what shares its step. The AVX-512 and
 * AVX2 variants and the scalar reference (`dspark_gemm_quant_ref`, quant_repack.c)
 * compute exactly that, bit for bit (tests/test_quant_kernels.py).
 *
 * A matrix is a descriptor of int64s: [segments, then per segment: ggml type, rows,
 * bytes per row, address of its first row] (a fused q|k|v projection is three
 * segments, possibly of three types).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels.h"
#include "quant_units.h"

static inline float reduce256(__m256 lo, __m256 hi) {
    __m256 t = _mm256_add_ps(lo, hi);
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)));
}

/* ---- micro-kernels: MR rows of x against NC dequantized rows w [NC][K] ------------- */
static inline __attribute__((always_inline)) T512 void micro512(const float *x, int64_t ldx, const float *w,
                                                                 int64_t K, float *y, int64_t ldy,
                                                                 const float *bias, int MR, int NC) {
    __m512 acc[6][8];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NC; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
        __m512 wv[8];
#pragma GCC unroll 8
        for (int j = 0; j < NC; j++) wv[j] = _mm512_loadu_ps(w + j * K + k);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m512 xv = _mm512_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 8
            for (int j = 0; j < NC; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NC; j++) {
            float r = reduce256(_mm512_castps512_ps256(acc[i][j]), _mm512_extractf32x8_ps(acc[i][j], 1));
            y[i * ldy + j] = bias ? r + bias[j] : r;
        }
}

static inline __attribute__((always_inline)) void micro256(const float *x, int64_t ldx, const float *w, int64_t K,
                                                           float *y, int64_t ldy, const float *bias, int MR,
                                                           int NC) {
    __m256 acc[3][4][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NC; j++) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m256 x0 = _mm256_loadu_ps(x + i * ldx + k), x1 = _mm256_loadu_ps(x + i * ldx + k + 8);
#pragma GCC unroll 8
            for (int j = 0; j < NC; j++) {
                acc[i][j][0] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w + j * K + k), acc[i][j][0]);
                acc[i][j][1] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(w + j * K + k + 8), acc[i][j][1]);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NC; j++) {
            float r = reduce256(acc[i][j][0], acc[i][j][1]);
            y[i * ldy + j] = bias ? r + bias[j] : r;
        }
}

/* Every row of x against `nc` (<= 8) dequantized rows: tiles of rows by columns, their
 * shapes chosen for registers only (each output's sequence is the same in all). */
static T512 void tile512(const float *x, int64_t M, const float *w, int nc, int64_t K, float *y, int64_t ldy,
                         const float *bias) {
    for (int64_t m = 0; m < M;) {
        const int64_t r = M - m;
        const float *xm = x + m * K;
        float *ym = y + m * ldy;
        if (r <= 2) {  /* one or two rows: all 8 columns at once, 8 or 16 chains */
            for (int j = 0; j < nc;) {
                const int take = nc - j;
                const float *b = bias ? bias + j : 0;
#define C(mr, n) micro512(xm, K, w + j * K, K, ym + j, ldy, b, mr, n)
                if (r == 2) {
                    if (take >= 8) { C(2, 8); j += 8; } else if (take >= 4) { C(2, 4); j += 4; }
                    else if (take >= 2) { C(2, 2); j += 2; } else { C(2, 1); j += 1; }
                } else {
                    if (take >= 8) { C(1, 8); j += 8; } else if (take >= 4) { C(1, 4); j += 4; }
                    else if (take >= 2) { C(1, 2); j += 2; } else { C(1, 1); j += 1; }
                }
            }
            m += r;
            continue;
        }
        const int mr = r >= 6 ? 6 : (int)r;
        for (int j = 0; j < nc;) {
            const int take = nc - j;
            const float *b = bias ? bias + j : 0;
#define ROWS(n)                                              \
    switch (mr) {                                            \
        case 6: C(6, n); break;                              \
        case 5: C(5, n); break;                              \
        case 4: C(4, n); break;                              \
        default: C(3, n); break;                             \
    }
            if (take >= 4) { ROWS(4) j += 4; } else if (take >= 2) { ROWS(2) j += 2; } else { ROWS(1) j += 1; }
#undef ROWS
#undef C
        }
        m += mr;
    }
}

static void tile256(const float *x, int64_t M, const float *w, int nc, int64_t K, float *y, int64_t ldy,
                    const float *bias) {
    for (int64_t m = 0; m < M;) {
        const int64_t r = M - m;
        const int mr = r >= 3 ? 3 : (int)r;
        const float *xm = x + m * K;
        float *ym = y + m * ldy;
        for (int j = 0; j < nc;) {
            const int take = nc - j;
            const float *b = bias ? bias + j : 0;
#define C(mr_, n) micro256(xm, K, w + j * K, K, ym + j, ldy, b, mr_, n)
            if (mr == 1) {
                if (take >= 4) { C(1, 4); j += 4; } else if (take >= 2) { C(1, 2); j += 2; } else { C(1, 1); j += 1; }
            } else if (mr == 2) {
                if (take >= 2) { C(2, 2); j += 2; } else { C(2, 1); j += 1; }
            } else {
                if (take >= 2) { C(3, 2); j += 2; } else { C(3, 1); j += 1; }
            }
#undef C
        }
        m += mr;
    }
}

/* ---- decode (one or two rows): dequantization fused into the dot products --------- */

/* MR (1 or 2) rows of x against NC rows of W starting at `rows`, all of K. */
static inline __attribute__((always_inline)) T512 void fused512(int type, const float *x, int64_t K,
                                                                 const uint8_t *rows, int64_t rb, float *y,
                                                                 int64_t ldy, const float *bias, int MR, int NC) {
    __m512 acc[2][8];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NC; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t u = 0; u < K / 32; u++) {
#pragma GCC unroll 8
        for (int j = 0; j < NC; j++) {
            __m512 w0, w1;
            unit512(type, rows + j * rb, u, &w0, &w1);
#pragma GCC unroll 2
            for (int i = 0; i < MR; i++) {
                acc[i][j] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i * K + 32 * u), w0, acc[i][j]);
                acc[i][j] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i * K + 32 * u + 16), w1, acc[i][j]);
            }
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NC; j++) {
            float r = reduce256(_mm512_castps512_ps256(acc[i][j]), _mm512_extractf32x8_ps(acc[i][j], 1));
            y[i * ldy + j] = bias ? r + bias[j] : r;
        }
}

/* Whether a type has a fused path (the repacked ones). */
static int fused_type(int type) { return type > R_OFF; }

/* One call of a fused kernel (KERNEL: fused512 or fused256) with the type a compile-time
 * constant, so each type's unit is inlined into its own loop. */
#define FUSED_TYPES(KERNEL, mr, n)                                                                   \
    switch (type) {                                                                                 \
        case R_Q4_0: KERNEL(R_Q4_0, x, K, data + (c + j) * rb, rb, y + j, ldy, b, mr, n); break;     \
        case R_Q4_1: KERNEL(R_Q4_1, x, K, data + (c + j) * rb, rb, y + j, ldy, b, mr, n); break;     \
        case R_Q5_0: KERNEL(R_Q5_0, x, K, data + (c + j) * rb, rb, y + j, ldy, b, mr, n); break;     \
        case R_Q5_1: KERNEL(R_Q5_1, x, K, data + (c + j) * rb, rb, y + j, ldy, b, mr, n); break;     \
        case R_Q8_0: KERNEL(R_Q8_0, x, K, data + (c + j) * rb, rb, y + j, ldy, b, mr, n); break;     \
        case R_Q4_K: KERNEL(R_Q4_K, x, K, data + (c + j) * rb, rb, y + j, ldy, b, mr, n); break;     \
        case R_Q5_K: KERNEL(R_Q5_K, x, K, data + (c + j) * rb, rb, y + j, ldy, b, mr, n); break;     \
        FUSED_Q2K_##KERNEL(mr, n)                                                                  \
        default: KERNEL(R_Q6_K, x, K, data + (c + j) * rb, rb, y + j, ldy, b, mr, n); break;         \
    }
/* R_Q2_K has AVX2 units only (quant_units.h): the AVX-512 decode hands it to fused_cols256 */
#define FUSED_Q2K_fused512(mr, n)
#define FUSED_Q2K_fused256(mr, n) \
    case R_Q2_K: fused256(R_Q2_K, x, K, data + (c + j) * rb, rb, y + j, ldy, b, mr, n); break;

/* Columns [c, c + nc) of one segment for M (1 or 2) rows, `wide` columns at a time (the
 * widest the registers hold: AVX-512 8 for one row and 4 for two, AVX2 half that),
 * then one at a time. */
#define FUSED_COLS(KERNEL, W1, W2)                                                                  \
    const int wide = M == 1 ? W1 : W2;                                                              \
    int64_t j = 0;                                                                                  \
    for (; j + wide <= nc; j += wide) {                                                             \
        const float *b = bias ? bias + j : 0;                                                       \
        if (M == 1) { FUSED_TYPES(KERNEL, 1, W1) } else { FUSED_TYPES(KERNEL, 2, W2) }              \
    }                                                                                               \
    for (; j < nc; j++) {                                                                           \
        const float *b = bias ? bias + j : 0;                                                       \
        if (M == 1) { FUSED_TYPES(KERNEL, 1, 1) } else { FUSED_TYPES(KERNEL, 2, 1) }                \
    }

static T512 void fused_cols(int type, const float *x, int64_t M, int64_t K, const uint8_t *data, int64_t rb,
                            int64_t c, int64_t nc, float *y, int64_t ldy, const float *bias) {
    FUSED_COLS(fused512, 8, 4)
}

/* The AVX2 decode: MR (1 or 2) rows against NC rows of W, each output's lanes 0-7 and
 * 8-15 in two registers, in unit512's order (weights 0-7 and 8-15, then 16-23 and 24-31). */
static inline __attribute__((always_inline)) void fused256(int type, const float *x, int64_t K,
                                                           const uint8_t *rows, int64_t rb, float *y, int64_t ldy,
                                                           const float *bias, int MR, int NC) {
    __m256 acc[2][4][2];
#pragma GCC unroll 2
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NC; j++) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
    for (int64_t u = 0; u < K / 32; u++) {
#pragma GCC unroll 4
        for (int j = 0; j < NC; j++) {
            __m256 w[4];
            unit256(type, rows + j * rb, u, w);
#pragma GCC unroll 2
            for (int i = 0; i < MR; i++) {
                const float *xu = x + i * K + 32 * u;
                acc[i][j][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xu), w[0], acc[i][j][0]);
                acc[i][j][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xu + 8), w[1], acc[i][j][1]);
                acc[i][j][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xu + 16), w[2], acc[i][j][0]);
                acc[i][j][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xu + 24), w[3], acc[i][j][1]);
            }
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NC; j++) {
            const float r = reduce256(acc[i][j][0], acc[i][j][1]);
            y[i * ldy + j] = bias ? r + bias[j] : r;
        }
}

static void fused_cols256(int type, const float *x, int64_t M, int64_t K, const uint8_t *data, int64_t rb,
                          int64_t c, int64_t nc, float *y, int64_t ldy, const float *bias) {
    FUSED_COLS(fused256, 4, 2)
}

/* 512: the AVX-512 micro-kernels, 256: AVX2; follows the bf16w kernel's choice. */
static int quant_isa(void) { return dspark_gemm_bf16w_isa(); }

/* A thread's scratch of at least n floats, kept between calls (a fresh 150 KB block
 * per call would be an mmap and munmap for each matmul of a decode step). */
static float *scratch(int64_t n) {
    static __thread float *buf;
    static __thread int64_t cap;
    if (n > cap) {
        free(buf);
        cap = (n + 1023) / 1024 * 1024;
        buf = aligned_alloc(64, (size_t)cap * sizeof(float));
        if (!buf) cap = 0;
    }
    return buf;
}

/* Columns dequantized per tile: 8 rows of W (8 dot products for one row of x). */
#define NC_TILE 8

/* Checks a descriptor: every type readable, K a multiple of its block. Returns the
 * total rows, or -1. */
int64_t dspark_quant_rows(const int64_t *desc, int64_t K) {
    int64_t n = 0;
    for (int64_t s = 0; s < desc[0]; s++) {
        const int64_t *g = desc + 1 + 4 * s;
        int64_t bb;
        const int64_t bs = dspark_quant_block((int)g[0], &bb);
        if (!bs || K % bs || K % 16 || g[2] != K / bs * bb) return -1;
        n += g[1];
    }
    return n;
}

/* 0: decode through the scratch like any M (for tests: both give the same bits) */
static int fuse = 1;

void dspark_quant_set_fused(int on) { fuse = on; }

static void gemm_quant(const float *x, const int64_t *desc, const float *bias, float *y, int64_t M, int64_t N,
                       int64_t K, int threads, int isa) {
    const int64_t tiles_total = (N + NC_TILE - 1) / NC_TILE + desc[0];  /* an upper bound over segments */
    if (threads < 1) threads = 1;
    if (threads > tiles_total) threads = (int)tiles_total;
#pragma omp parallel num_threads(threads)
    {
#ifdef _OPENMP
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        const int t = 0, nt = 1;
#endif
        float *w = scratch(NC_TILE * K);
        /* this thread's columns: [N t / nt, N (t + 1) / nt), cut at NC_TILE multiples */
        const int64_t c0 = (N * t / nt) / NC_TILE * NC_TILE;
        const int64_t c1 = t == nt - 1 ? N : (N * (t + 1) / nt) / NC_TILE * NC_TILE;
        int64_t base = 0;
        for (int64_t s = 0; s < desc[0] && w; s++) {
            const int64_t *g = desc + 1 + 4 * s;
            const int type = (int)g[0];
            const int64_t rows = g[1], rb = g[2];
            const uint8_t *data = (const uint8_t *)(intptr_t)g[3];
            int64_t lo = c0 > base ? c0 : base, hi = c1 < base + rows ? c1 : base + rows;
            if (M <= 2 && fused_type(type) && fuse) {
                if (hi > lo && isa == 512 && type != R_Q2_K)
                    fused_cols(type, x, M, K, data, rb, lo - base, hi - lo, y + lo, N, bias ? bias + lo : 0);
                else if (hi > lo)
                    fused_cols256(type, x, M, K, data, rb, lo - base, hi - lo, y + lo, N, bias ? bias + lo : 0);
                base += rows;
                continue;
            }
            for (int64_t c = lo; c < hi; c += NC_TILE) {
                const int nc = (int)(hi - c < NC_TILE ? hi - c : NC_TILE);
                for (int j = 0; j < nc; j++) dspark_dequant_row(type, data + (c - base + j) * rb, K, w + j * K);
                const float *b = bias ? bias + c : 0;
                if (isa == 512) tile512(x, M, w, nc, K, y + c, N, b);
                else tile256(x, M, w, nc, K, y + c, N, b);
            }
            base += rows;
        }
    }
}

void dspark_gemm_quant(const float *x, const int64_t *desc, const float *bias, float *y, int64_t M, int64_t N,
                       int64_t K, int threads) {
    if (dspark_q8x_matrix(desc)) {
        dspark_gemm_q8x(x, desc, bias, y, M, N, K, threads);
        return;
    }
    gemm_quant(x, desc, bias, y, M, N, K, threads, quant_isa());
}
