/* A measurement, not a kernel of the product: what fp32 activations would cost if they
 * read the q8x precision's panels (q8x_panels.h) instead of the gguf precision's repacked
 * rows. Each weight stays the file's exact value (w = D w8 + M), the activations stay fp32,
 * and each output is one fixed sequence (per unit: two FMA chains of x w8 over the unit's
 * halves, their sum times D, plus M times the unit's sum of x): the arithmetic of an exact
 * precision that the lanes of 8 columns make cheap (a weight byte is widened and converted
 * once per unit and serves every row of x). Only the timing is checked: the weights and
 * scales are random bytes, and the sums of x are not computed.
 *
 * Build and run from the repository root (ggml type: 12 Q4_K, 8 Q8_0; a matrix of N x K,
 * COPIES copies streamed from memory, PASSES passes of REPS timed calls per row count):
 *   K=dspark/runtime/kernels
 *   gcc -O3 -mavx2 -mfma -mf16c -ffp-contract=off -fopenmp -I$K scripts/dev/proto_f32_panels.c \
 *       $K/gemm_q8x.c $K/q8x_panels.c $K/quant_repack.c $K/gemm_quant.c $K/gemm_bf16w.c \
 *       $K/gemm_bf16dot.c -o /tmp/proto_f32_panels -lm
 *   /tmp/proto_f32_panels TYPE REPS COPIES THREADS N K PASSES    # e.g. 12 5 24 2 3072 1536 3
 * Prints, per row count, q8x's time (dspark_gemm_q8x), the prototype's and the gguf
 * precision's (dspark_gemm_quant), all three on the same matrices in turn. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"
#include "q8x_panels.h"

void dspark_quant_repack(int type, const uint8_t *src, int64_t src_row, int64_t rows, int64_t K, uint8_t *dst);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Byte b of each 32-bit lane (4-bit quants: already split into nibbles), zero-extended. */
static inline __m256i byte_of(__m256i v, int b) {
    const __m256i m = _mm256_setr_epi8(b, -1, -1, -1, 4 + b, -1, -1, -1, 8 + b, -1, -1, -1, 12 + b, -1, -1, -1, b, -1,
                                       -1, -1, 4 + b, -1, -1, -1, 8 + b, -1, -1, -1, 12 + b, -1, -1, -1);
    return _mm256_shuffle_epi8(v, m);
}

/* Byte b of each 32-bit lane, sign-extended (Q8_0's int8 quants). */
static inline __m256i sbyte_of(__m256i v, int b) { return _mm256_srai_epi32(_mm256_slli_epi32(v, 24 - 8 * b), 24); }

/* MR rows of x against NG groups of 8 columns. */
static inline __attribute__((always_inline)) void tile(int type, const float *x, const float *sx, int64_t K,
                                                       const uint8_t *grp, int64_t gb, __m256 *out, int MR, int NG) {
    const xtype t = xinfo(type);
    const int64_t nq = K / 32, ub = unit_bytes(t);
    __m256 acc[4][4], off[4][4];
    for (int i = 0; i < MR; i++)
        for (int g = 0; g < NG; g++) acc[i][g] = off[i][g] = _mm256_setzero_ps();
    for (int64_t u = 0; u < nq; u++) {
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) {
            const uint8_t *unit = grp + g * gb + u * ub, *qb = unit_quants(t, unit);
            __m256 pl[4], ph[4];
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++) pl[i] = ph[i] = _mm256_setzero_ps();
            if (t.four) {
#pragma GCC unroll 4
                for (int h = 0; h < 4; h++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(qb + 32 * h));
                    const __m256i lo = _mm256_and_si256(v, _mm256_set1_epi8(15));
                    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(15));
#pragma GCC unroll 4
                    for (int b = 0; b < 4; b++) {
                        const __m256 wl = _mm256_cvtepi32_ps(byte_of(lo, b)), wh = _mm256_cvtepi32_ps(byte_of(hi, b));
#pragma GCC unroll 4
                        for (int i = 0; i < MR; i++) {
                            const float *xu = x + i * K + 32 * u;
                            pl[i] = _mm256_fmadd_ps(wl, _mm256_set1_ps(xu[4 * h + b]), pl[i]);
                            ph[i] = _mm256_fmadd_ps(wh, _mm256_set1_ps(xu[16 + 4 * h + b]), ph[i]);
                        }
                    }
                }
            } else {
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(qb + 32 * j));
#pragma GCC unroll 4
                    for (int b = 0; b < 4; b++) {
                        const __m256 w = _mm256_cvtepi32_ps(sbyte_of(v, b));
#pragma GCC unroll 4
                        for (int i = 0; i < MR; i++) {
                            const __m256 xb = _mm256_set1_ps(x[i * K + 32 * u + 4 * j + b]);
                            if (j < 4) pl[i] = _mm256_fmadd_ps(w, xb, pl[i]);
                            else ph[i] = _mm256_fmadd_ps(w, xb, ph[i]);
                        }
                    }
                }
            }
            const __m256 D = unit_scales8(t, unit, 0), Mv = t.nm ? unit_scales8(t, unit, t.nd) : D;
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++) {
                acc[i][g] = _mm256_fmadd_ps(_mm256_add_ps(pl[i], ph[i]), D, acc[i][g]);
                if (t.nm) off[i][g] = _mm256_fmadd_ps(Mv, _mm256_set1_ps(sx[i * nq + u]), off[i][g]);
            }
        }
    }
    for (int i = 0; i < MR; i++)
        for (int g = 0; g < NG; g++) out[i * NG + g] = t.nm ? _mm256_add_ps(acc[i][g], off[i][g]) : acc[i][g];
}

#define TILE(mr, ng)                                                                            \
    if (type == R_Q8_0) tile(R_Q8_0, xm, sxm, K, data + g * gb, gb, out, mr, ng);               \
    else tile(R_Q4_K, xm, sxm, K, data + g * gb, gb, out, mr, ng);

/* One row: four groups at a time; more rows: tiles of up to 4 rows against one group. */
static void gemm(int type, const float *x, const float *sx, int64_t M, int64_t N, int64_t K, const uint8_t *data,
                 int64_t gb, float *y, int threads) {
    const int64_t G = (N + 7) / 8;
#pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t g0 = G * t / nt, g1 = G * (t + 1) / nt;
        __m256 out[16] = {0};
        for (int64_t g = g0; g < g1;) {
            if (M == 1 && g1 - g >= 4) {
                const float *xm = x, *sxm = sx;
                TILE(1, 4)
                for (int c = 0; c < 4; c++) _mm256_storeu_ps(y + 8 * (g + c), out[c]);
                g += 4;
                continue;
            }
            for (int64_t m = 0; m < M; m += 4) {
                const int mr = M - m >= 4 ? 4 : (int)(M - m);
                const float *xm = x + m * K, *sxm = sx + m * (K / 32);
                if (mr == 4) { TILE(4, 1) } else if (mr == 3) { TILE(3, 1) } else if (mr == 2) { TILE(2, 1) } else { TILE(1, 1) }
                for (int i = 0; i < mr; i++) _mm256_storeu_ps(y + (m + i) * N + 8 * g, out[i]);
            }
            g++;
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 8) {
        fprintf(stderr, "usage: %s TYPE(12 Q4_K | 8 Q8_0) REPS COPIES THREADS N K PASSES\n", argv[0]);
        return 2;
    }
    const int gt = atoi(argv[1]), reps = atoi(argv[2]), copies = atoi(argv[3]), th = atoi(argv[4]);
    const int64_t N = atoi(argv[5]), K = atoi(argv[6]);
    const int passes = atoi(argv[7]);
    if (gt != 8 && gt != 12) return 2;
    const int ptype = dspark_q8x_panel_type(gt), rt = dspark_quant_repacked_type(gt);
    const int64_t gb = dspark_q8x_group_bytes(ptype, K), G = (N + 7) / 8;
    int64_t bb, rbb;
    const int64_t bs = dspark_quant_block(gt, &bb), rn = dspark_quant_block(rt, &rbb);
    const int64_t srow = K / bs * bb, rrow = K / rn * rbb;
    uint8_t **panels = malloc(copies * sizeof(*panels));
    int64_t(*xdesc)[5] = malloc(copies * sizeof(*xdesc)), (*gdesc)[5] = malloc(copies * sizeof(*gdesc));
    srand(1);
    for (int c = 0; c < copies; c++) {
        panels[c] = aligned_alloc(64, G * gb);
        for (int64_t i = 0; i < G * gb; i++) panels[c][i] = rand() & 0x3f;  /* Q8_0: fp16 scales, no NaN */
        if (gt == 12)  /* Q4_K's fp32 D and M: normal values (random bytes would hold denormals, slow in both) */
            for (int64_t g = 0; g < G; g++)
                for (int64_t u = 0; u < K / 32; u++)
                    for (int l = 0; l < 16; l++) ((float *)(panels[c] + g * gb + u * 192))[l] = 0.01f * (1 + rand() % 100);
        int64_t xd[5] = {1, X_OFF + gt, N, gb, (int64_t)(intptr_t)panels[c]};
        memcpy(xdesc[c], xd, sizeof(xd));
        uint8_t *src = malloc(N * srow), *rows = aligned_alloc(64, N * rrow + 64);
        for (int64_t i = 0; i < N * srow; i++) src[i] = rand() & 255;
        for (int64_t r = 0; r < N; r++)
            for (int64_t b = 0; b < K / bs; b++) {  /* normal fp16 scales (and mins) */
                const uint16_t h = 0x1c00 | (rand() & 0x3ff);
                memcpy(src + r * srow + b * bb, &h, 2);
                if (gt == 12) memcpy(src + r * srow + b * bb + 2, &h, 2);
            }
        dspark_quant_repack(gt, src, srow, N, K, rows);
        free(src);
        int64_t gd[5] = {1, rt, N, rrow, (int64_t)(intptr_t)rows};
        memcpy(gdesc[c], gd, sizeof(gd));
    }
    float *x = malloc(16 * K * 4), *y = malloc(16 * N * 4), *sx = malloc(16 * (K / 32) * 4);
    for (int64_t i = 0; i < 16 * K; i++) x[i] = (rand() % 2000 - 1000) / 1000.0f;
    for (int64_t i = 0; i < 16 * (K / 32); i++) sx[i] = 1.0f;
    const int Ms[] = {1, 2, 4, 8, 16};
    for (int p = 0; p < passes; p++)
        for (int mi = 0; mi < 5; mi++) {
            const int M = Ms[mi];
            double bq = 1e9, bf = 1e9, bg = 1e9;
            for (int r = 0; r < reps; r++) {
                double t0 = now();
                for (int c = 0; c < copies; c++) dspark_gemm_q8x(x, &xdesc[c][0], 0, y, M, N, K, th);
                double t = (now() - t0) / copies;
                bq = t < bq ? t : bq;
                t0 = now();
                for (int c = 0; c < copies; c++) gemm(ptype, x, sx, M, N, K, panels[c], gb, y, th);
                t = (now() - t0) / copies;
                bf = t < bf ? t : bf;
                t0 = now();
                for (int c = 0; c < copies; c++) dspark_gemm_quant(x, &gdesc[c][0], 0, y, M, N, K, th);
                t = (now() - t0) / copies;
                bg = t < bg ? t : bg;
            }
            const double mac = (double)M * N * K;
            printf("type %d M=%2d q8x %.1f GMAC/s  fp32-panels %.1f GMAC/s  gguf %.1f GMAC/s  "
                   "fp32-panels/q8x time %.2f  gguf/fp32-panels time %.2f\n",
                   gt, M, mac / bq / 1e9, mac / bf / 1e9, mac / bg / 1e9, bf / bq, bg / bf);
        }
    return 0;
}
