/* The element-wise pieces of a decoder layer in fp32, for AVX2 + FMA: RMSNorm,
 * SiLU(gate) * up, and the rotary embedding. In a decode step each is a handful of
 * torch operators over a few thousand numbers, where dispatch costs more than the
 * arithmetic; here each is one call. Rows are independent and each row is computed
 * the same way whatever else shares the call (a fixed order of operations), so the
 * batch composition does not change any result.
 *
 * Built on first use by dspark/runtime/cpu_kernels.py (cc -O3 -mavx2 -mfma -fopenmp).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "simd_f32.h"

/* Threads only where the work pays for waking them. SiLU, with its exponential and
 * division, pays from fewer elements (two threads: 4 x 1536 4.5 -> 3.3 us, 16 x 1536
 * 13.8 -> 8.0 us; 2 x 1536 level). */
#define PAR_MIN_ELEMS (1 << 16)
#define SILU_PAR_MIN (1 << 12)

static inline float exp1(float x) {
    float in[8] = {x}, out[8];
    _mm256_storeu_ps(out, exp8(_mm256_loadu_ps(in)));
    return out[0];
}

/* out[m] = w * (x[m] / sqrt(mean(x[m]^2) + eps)), rows of K. */
void dspark_rmsnorm_f32(const float *x, const float *w, float *out, int64_t M, int64_t K, float eps,
                        int threads) {
    const int64_t K8 = K & ~(int64_t)7;
#pragma omp parallel for schedule(static) num_threads(threads) if (M * K >= PAR_MIN_ELEMS)
    for (int64_t m = 0; m < M; m++) {
        const float *xm = x + m * K;
        float *om = out + m * K;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t k = 0; k < K8; k += 8) {
            __m256 v = _mm256_loadu_ps(xm + k);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        float ss = hsum8(acc);
        for (int64_t k = K8; k < K; k++) ss += xm[k] * xm[k];
        const float inv = 1.0f / sqrtf(ss / (float)K + eps);
        const __m256 vinv = _mm256_set1_ps(inv);
        for (int64_t k = 0; k < K8; k += 8)
            _mm256_storeu_ps(om + k, _mm256_mul_ps(_mm256_loadu_ps(w + k),
                                                   _mm256_mul_ps(_mm256_loadu_ps(xm + k), vinv)));
        for (int64_t k = K8; k < K; k++) om[k] = w[k] * (xm[k] * inv);
    }
}

/* gu [M, 2I] = [gate | up] -> out [M, I] = silu(gate) * up. */
void dspark_silu_mul_f32(const float *gu, float *out, int64_t M, int64_t I, int threads) {
    const int64_t I8 = I & ~(int64_t)7;
    const __m256 one = _mm256_set1_ps(1.0f);
#pragma omp parallel for schedule(static) num_threads(threads) if (M * I >= SILU_PAR_MIN)
    for (int64_t m = 0; m < M; m++) {
        const float *g = gu + m * 2 * I, *u = g + I;
        float *o = out + m * I;
        for (int64_t i = 0; i < I8; i += 8) {
            __m256 gv = _mm256_loadu_ps(g + i);
            __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
        }
        for (int64_t i = I8; i < I; i++) o[i] = g[i] / (1.0f + exp1(-g[i])) * u[i];
    }
}

/* In place, the first `heads` heads of D floats of each of N rows of `row` floats:
 * x = x * cos + rotate_half(x) * sin, with cos and sin [N, D] per token (halves
 * duplicated, as the tables are built). D even. */
void dspark_rope_f32(float *x, int64_t row, const float *cos, const float *sin, int64_t N, int64_t heads,
                     int64_t D) {
    const int64_t half = D / 2;
    for (int64_t n = 0; n < N; n++) {
        const float *c = cos + n * D, *s = sin + n * D;
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + n * row + h * D;
            int64_t i = 0;
            for (; i + 8 <= half; i += 8) {
                __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + half + i);
                __m256 lo = _mm256_sub_ps(_mm256_mul_ps(a, _mm256_loadu_ps(c + i)),
                                          _mm256_mul_ps(b, _mm256_loadu_ps(s + i)));
                __m256 hi = _mm256_add_ps(_mm256_mul_ps(b, _mm256_loadu_ps(c + half + i)),
                                          _mm256_mul_ps(a, _mm256_loadu_ps(s + half + i)));
                _mm256_storeu_ps(v + i, lo);
                _mm256_storeu_ps(v + half + i, hi);
            }
            for (; i < half; i++) {
                float a = v[i], b = v[half + i];
                v[i] = a * c[i] - b * s[i];
                v[half + i] = b * c[half + i] + a * s[half + i];
            }
        }
    }
}

/* out[m] = the index of the largest x[m, :] (rows of K), as torch.argmax gives it: the
 * first maximal index, and a NaN counts as the largest value (the first NaN wins).
 * Greedy decoding reads it from every logit row of a step: torch's argmax goes through
 * a 49k-entry row at a few GB/s on one thread. Rows are independent. */
void dspark_argmax_f32(const float *x, int64_t M, int64_t K, int64_t *out, int threads) {
    const int64_t K8 = K & ~(int64_t)7;
#pragma omp parallel for schedule(static) num_threads(threads) if (M * K >= 4 * PAR_MIN_ELEMS)
    for (int64_t m = 0; m < M; m++) {
        const float *xm = x + m * K;
        __m256 vmx = _mm256_set1_ps(-INFINITY);
        __m256 nan = _mm256_setzero_ps();
        for (int64_t k = 0; k < K8; k += 8) {
            __m256 v = _mm256_loadu_ps(xm + k);
            vmx = _mm256_max_ps(vmx, v);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, vmx);
        float mx = lanes[0];
        for (int i = 1; i < 8; i++) mx = lanes[i] > mx ? lanes[i] : mx;
        int has_nan = _mm256_movemask_ps(nan) != 0;
        for (int64_t k = K8; k < K; k++) {
            if (xm[k] != xm[k]) has_nan = 1;
            else if (xm[k] > mx) mx = xm[k];
        }
        int64_t at = 0;
        if (has_nan) {
            while (xm[at] == xm[at]) at++;
        } else {
            const __m256 target = _mm256_set1_ps(mx);
            int64_t k = 0;
            for (; k < K8; k += 8) {
                int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(xm + k), target, _CMP_EQ_OQ));
                if (hit) break;
            }
            while (k < K && xm[k] != mx) k++;
            at = k < K ? k : 0;
        }
        out[m] = at;
    }
}
