/* Causal attention of a step's new tokens over an fp32 KV cache, for AVX2 + FMA:
 * decodes, verifications and prefills alike.
 *
 * Every token of a decode or verification step carries its KV slot and absolute
 * position. The kernel first writes each token's key and value into the cache, then
 * gives each token softmax(q k^T * scale) v over keys 0..position of its own slot:
 * causal, no padding, no mask tensor, and no copy of the cache. Query heads are
 * grouped onto their KV head (GQA), so a key row is read once for the whole group.
 *
 * Each (token, head) is computed by the same sequence of operations whatever else
 * shares the call: scores key by key (one 8-lane FMA chain over head_dim and a fixed
 * horizontal sum), the maximum, exponentials (a fixed polynomial, below), their sum in
 * a fixed order, then the weighted sum of values key by key. A token verified next to
 * other draft tokens gets bit for bit what it gets when decoded alone.
 *
 * The cache layout is [slots, kv_heads, max_len, head_dim], contiguous; head_dim must
 * be a multiple of 8 (the Python side falls back to torch otherwise).
 *
 * Built on first use by dspark/runtime/cpu_kernels.py (cc -O3 -mavx2 -mfma -fopenmp).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd_f32.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* One token, the `g` query heads of one KV head. q: [g][D]; out: [g][D];
 * keys/values: [n][D]; w: scratch of g * n floats (rounded up to 8). */
static void attend_group(const float *q, const float *keys, const float *values, float *out, int64_t g,
                         int64_t n, int64_t D, float scale, float *w) {
    const int64_t n8 = (n + 7) & ~(int64_t)7;
    for (int64_t h = 0; h < g; h++) {
        const float *qh = q + h * D;
        float *wh = w + h * n8;
        int64_t j = 0;
        for (; j + 8 <= n; j += 8) { /* eight independent chains; each score as below */
            __m256 acc[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
            for (int64_t d = 0; d < D; d += 8) {
                const __m256 qv = _mm256_loadu_ps(qh + d);
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++)
                    acc[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys + (j + i) * D + d), acc[i]);
            }
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) wh[j + i] = hsum8(acc[i]) * scale;
        }
        for (; j < n; j++) {
            const float *kj = keys + j * D;
            __m256 acc = _mm256_setzero_ps();
            for (int64_t d = 0; d < D; d += 8)
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d), _mm256_loadu_ps(kj + d), acc);
            wh[j] = hsum8(acc) * scale;
        }
        float mx = wh[0];
        for (int64_t j = 1; j < n; j++) mx = wh[j] > mx ? wh[j] : mx;
        for (int64_t j = n; j < n8; j++) wh[j] = -1e30f; /* exp -> 0 in the padding */
        __m256 vmx = _mm256_set1_ps(mx), vsum = _mm256_setzero_ps();
        for (int64_t j = 0; j < n8; j += 8) {
            __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(wh + j), vmx));
            e = j + 8 <= n ? e : _mm256_and_ps(e, _mm256_castsi256_ps(_mm256_cmpgt_epi32(
                    _mm256_set1_epi32((int)(n - j)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))));
            _mm256_storeu_ps(wh + j, e);
            vsum = _mm256_add_ps(vsum, e);
        }
        const __m256 inv = _mm256_set1_ps(1.0f / hsum8(vsum));
        float *oh = out + h * D;
        for (int64_t d0 = 0; d0 < D; d0 += 64) {
            const int64_t dn = D - d0 < 64 ? D - d0 : 64;
            __m256 acc[8];
            for (int c = 0; c < 8; c++) acc[c] = _mm256_setzero_ps();
            for (int64_t j = 0; j < n; j++) {
                const __m256 pj = _mm256_broadcast_ss(wh + j);
                const float *vj = values + j * D + d0;
                if (dn == 64) {
#pragma GCC unroll 8
                    for (int c = 0; c < 8; c++) acc[c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * c), acc[c]);
                } else {
                    for (int c = 0; c < dn / 8; c++) acc[c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * c), acc[c]);
                }
            }
            for (int c = 0; c < dn / 8; c++) _mm256_storeu_ps(oh + d0 + 8 * c, _mm256_mul_ps(acc[c], inv));
        }
    }
}

/* qkv [N, row]: each token's H query heads, then its KVH keys, then its KVH values,
 * D floats each (row >= (H + 2 KVH) D); caches [S, KVH, L, D]; slots, positions [N];
 * out [N, H, D]. A token's key and value go to (slots[t], positions[t]); it attends to
 * keys 0..visible[t]-1 of its slot, or 0..positions[t] (causal) when `visible` is NULL.
 * Returns 0, or -1 (nothing written) when a slot, a position or a span is out of range. */
int dspark_attention_f32_span(const float *qkv, int64_t row, float *k_cache, float *v_cache, const int64_t *slots,
                              const int64_t *positions, const int64_t *visible, float *out, int64_t N, int64_t S,
                              int64_t H, int64_t KVH, int64_t D, int64_t L, float scale, int threads) {
    const int64_t g = H / KVH;
    int64_t longest = 0;
    for (int64_t t = 0; t < N; t++) {
        const int64_t n = visible ? visible[t] : positions[t] + 1;
        if (slots[t] < 0 || slots[t] >= S || positions[t] < 0 || positions[t] >= L || n < 1 || n > L) return -1;
        longest = n > longest ? n : longest;
    }
    const int64_t items = N * KVH;
    if (threads < 1) threads = 1;
    if (threads > items) threads = (int)items;
    for (int64_t t = 0; t < N; t++)
        for (int64_t kh = 0; kh < KVH; kh++) {
            const int64_t at = ((slots[t] * KVH + kh) * L + positions[t]) * D;
            memcpy(k_cache + at, qkv + t * row + (H + kh) * D, D * sizeof(float));
            memcpy(v_cache + at, qkv + t * row + (H + KVH + kh) * D, D * sizeof(float));
        }
#pragma omp parallel num_threads(threads)
    {
        float *w = (float *)malloc(sizeof(float) * g * ((longest + 7) & ~(int64_t)7));
#pragma omp for schedule(static, 1) /* round robin: a prefill's later tokens see more keys */
        for (int64_t it = 0; it < items; it++) {
            const int64_t t = it / KVH, kh = it % KVH;
            const int64_t base = (slots[t] * KVH + kh) * L * D;
            attend_group(qkv + t * row + kh * g * D, k_cache + base, v_cache + base, out + (t * H + kh * g) * D, g,
                         visible ? visible[t] : positions[t] + 1, D, scale, w);
        }
        free(w);
    }
    return 0;
}

/* Causal: `dspark_attention_f32_span` with each token seeing keys 0..positions[t]. */
int dspark_attention_f32(const float *qkv, int64_t row, float *k_cache, float *v_cache, const int64_t *slots,
                         const int64_t *positions, float *out, int64_t N, int64_t S, int64_t H, int64_t KVH,
                         int64_t D, int64_t L, float scale, int threads) {
    return dspark_attention_f32_span(qkv, row, k_cache, v_cache, slots, positions, 0, out, N, S, H, KVH, D, L,
                                     scale, threads);
}
