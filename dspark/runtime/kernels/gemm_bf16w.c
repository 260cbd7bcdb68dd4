/* y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]): fp32 activations, bf16 weights
 * (nn.Linear layout, [N, K] row-major), fp32 accumulation, for AVX2 + FMA CPUs.
 *
 * Decode on a CPU is bound by reading the weights; bf16 weights halve that traffic,
 * and widening bf16 to fp32 is a 16-bit shift, so it costs almost nothing in the
 * inner loop. Every output element is computed by the same sequence of operations
 * whatever M, the tile it falls in and the thread count are (one 8-lane accumulator
 * over k ascending, a fixed horizontal sum, then the K % 8 tail in order), so a row's
 * result does not depend on which other rows share the batch: verifying k draft
 * tokens gives bit-for-bit the logits that decoding them one at a time gives.
 *
 * Built on first use by dspark/runtime/cpu_kernels.py (cc -O3 -mavx2 -mfma -fopenmp).
 */
#include <immintrin.h>
#include <stdint.h>

static inline __m256 load_bf16(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline float bf16_to_float(uint16_t h) {
    union { uint32_t u; float f; } v;
    v.u = ((uint32_t)h) << 16;
    return v.f;
}

static inline float hsum(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
    return _mm_cvtss_f32(lo);
}

/* One MB x NB tile; MB and NB are compile-time constants at every call site. */
static inline __attribute__((always_inline)) void tile(
    const float *x, int64_t K, const uint16_t *w, float *y, int64_t N,
    const float *bias, int MB, int NB) {
    __m256 acc[3][8];
    for (int i = 0; i < MB; i++)
        for (int j = 0; j < NB; j++) acc[i][j] = _mm256_setzero_ps();
    const int64_t K8 = K & ~(int64_t)7;
    for (int64_t k = 0; k < K8; k += 8) {
        __m256 wv[8];
        for (int j = 0; j < NB; j++) wv[j] = load_bf16(w + j * K + k);
        for (int i = 0; i < MB; i++) {
            __m256 xv = _mm256_loadu_ps(x + i * K + k);
            for (int j = 0; j < NB; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    for (int i = 0; i < MB; i++)
        for (int j = 0; j < NB; j++) {
            float s = hsum(acc[i][j]);
            for (int64_t k = K8; k < K; k++) s += x[i * K + k] * bf16_to_float(w[j * K + k]);
            if (bias) s += bias[j];
            y[i * N + j] = s;
        }
}

#define TILE(mb, nb) tile(x + m * K, K, wb, y + m * N + n, N, bb, mb, nb)

static void column_block(const float *x, const uint16_t *w, const float *bias, float *y,
                         int64_t M, int64_t N, int64_t K, int64_t n, int nb) {
    const uint16_t *wb = w + n * K;
    const float *bb = bias ? bias + n : 0;
    int64_t m = 0;
    if (nb == 8 && M == 1) {  /* decode: eight weight rows in flight */
        TILE(1, 8);
        return;
    }
    for (int64_t j = 0; j < nb; j += 4, wb += 4 * K, bb = bb ? bb + 4 : 0, n += 4) {
        int nj = nb - j < 4 ? (int)(nb - j) : 4;
        m = 0;
        if (nj == 4) {
            for (; m + 3 <= M; m += 3) TILE(3, 4);
            if (M - m == 2) TILE(2, 4);
            else if (M - m == 1) TILE(1, 4);
        } else {
            for (; m < M; m++) {
                switch (nj) {
                    case 3: TILE(1, 3); break;
                    case 2: TILE(1, 2); break;
                    default: TILE(1, 1); break;
                }
            }
        }
    }
}

void dspark_gemm_bf16w(const float *x, const uint16_t *w, const float *bias, float *y,
                       int64_t M, int64_t N, int64_t K, int threads) {
    const int64_t blocks = (N + 7) / 8;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t n = b * 8;
        int nb = (int)(N - n < 8 ? N - n : 8);
        column_block(x, w, bias, y, M, N, K, n, nb);
    }
}
