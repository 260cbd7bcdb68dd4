/* y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) in fp32: the `fp32` precision's matmul
 * on CPUs with AVX2 + FMA (and AVX-512, same bits), weights pre-packed in panels of
 * [K][16] fp32 in column order (dspark/runtime/cpu_kernels.py `PackedF32`).
 *
 * torch's fp32 matmul picks its blocking by shape on some CPUs, so a row's last bits
 * change with the number of rows sharing the product (measured on a 2-core AVX2 EPYC:
 * docs/journal.md, "fp32's matmuls were not batch-invariant"), and it runs 2-3 rows at 2-3x the time
 * of one. This kernel is gemm_panels.h, the bf16w kernel's matmul, reading fp32 panel
 * rows: every output element is one FMA chain over k ascending from zero, whatever
 * the rows, tiles and threads, so verification gives the bits of one-token decoding.
 */
#include <immintrin.h>
#include <stdint.h>

#define WT float
#define GEMM_PACKED dspark_gemm_f32w_packed

static inline __attribute__((always_inline)) void load_panel_row(const float *p, __m256 *lo, __m256 *hi) {
    *lo = _mm256_loadu_ps(p);
    *hi = _mm256_loadu_ps(p + 8);
}

#define PANEL512_SETUP
#define PANEL512_LOAD(p) _mm512_loadu_ps(p)

#include "gemm_panels.h"
