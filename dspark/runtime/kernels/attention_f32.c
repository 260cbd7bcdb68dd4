/* Causal attention of a step's new tokens over an fp32 KV cache, for AVX2 + FMA:
 * decodes, verifications and prefills alike.
 *
 * Every token of a decode or verification step carries its KV slot and absolute
 * position. The kernel first writes each token's key and value into the cache, then
 * gives each token softmax(q k^T * scale) v over keys 0..position of its own slot:
 * causal, no padding, no mask tensor, and no copy of the cache. Query heads are
 * grouped onto their KV head (GQA), and a key or value row is read once for up to three
 * heads of the group.
 *
 * Each (token, head) is computed by the same sequence of operations whatever else
 * shares the call: scores four keys at a time (four 8-lane FMA chains over head_dim,
 * reduced together by one fixed tree; the last n mod 4 keys one at a time), the
 * maximum, exponentials (a fixed polynomial, below), their sum in a fixed order, then
 * the weighted sum of values key by key. A token verified next to other draft tokens
 * gets bit for bit what it gets when decoded alone.
 *
 * The cache layout is [slots, kv_heads, max_len, head_dim], contiguous; head_dim must
 * be a multiple of 8 (the Python side falls back to torch otherwise).
 *
 * Where the CPU has AVX-512 (and the matmuls run their AVX-512 variant: one ISA per
 * process, see gemm_bf16w.c) and head_dim is a multiple of 16, `attend_group512` does
 * the same with 16 lanes and each key and value row read once for all heads of its
 * group: a block of 8 keys is scored for up to 3 heads at once and the 8 sums are
 * reduced together (a fixed tree: a score's bits depend only on its key's place in
 * its block of 8, counted from key 0, and so on the token's own context length).
 * The weighted sum of values is the same chain of FMAs over the keys as above.
 *
 * Built on first use by dspark/runtime/cpu_kernels.py (cc -O3 -mavx2 -mfma -fopenmp).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "simd_f32.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* One head's scores wh[0..n) -> exp(score - max) in place, zeros in the padding up to
 * the next multiple of 8; returns 1 / their sum (a fixed order: 8 lanes, then hsum8). */
static float softmax_weights(float *wh, int64_t n) {
    const int64_t n8 = (n + 7) & ~(int64_t)7;
    /* the maximum: exact in any order, so 8 lanes then across them */
    __m256 vm = _mm256_set1_ps(wh[0]);
    int64_t j0 = 0;
    for (; j0 + 8 <= n; j0 += 8) vm = _mm256_max_ps(_mm256_loadu_ps(wh + j0), vm);
    float lanes[8];
    _mm256_storeu_ps(lanes, vm);
    float mx = lanes[0];
    for (int i = 1; i < 8; i++) mx = lanes[i] > mx ? lanes[i] : mx;
    for (; j0 < n; j0++) mx = wh[j0] > mx ? wh[j0] : mx;
    for (int64_t j = n; j < n8; j++) wh[j] = -1e30f; /* exp -> 0 in the padding */
    __m256 vmx = _mm256_set1_ps(mx), vsum = _mm256_setzero_ps();
    for (int64_t j = 0; j < n8; j += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(wh + j), vmx));
        e = j + 8 <= n ? e : _mm256_and_ps(e, _mm256_castsi256_ps(_mm256_cmpgt_epi32(
                _mm256_set1_epi32((int)(n - j)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))));
        _mm256_storeu_ps(wh + j, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    return 1.0f / hsum8(vsum);
}

/* The sums of four 8-lane vectors, as four lanes in order: a fixed tree of pairwise
 * horizontal adds, then the two 128-bit halves added. */
static inline __m128 sum4x8(const __m256 *a) {
    const __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

/* Scores of keys [j, j + 4) for GH (1-3) heads of a group: each key chunk is read once
 * for all GH heads; four FMA chains a head over head_dim, reduced together by sum4x8.
 * w[h * n8 + j + i]. */
static inline __attribute__((always_inline)) void score4(const float *q, const float *keys, int64_t j, int64_t D,
                                                         float scale, float *w, int64_t n8, int GH) {
    __m256 acc[3][4];
#pragma GCC unroll 3
    for (int h = 0; h < GH; h++)
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) acc[h][i] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) {
        __m256 qv[3];
#pragma GCC unroll 3
        for (int h = 0; h < GH; h++) qv[h] = _mm256_loadu_ps(q + h * D + d);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            const __m256 kv = _mm256_loadu_ps(keys + (j + i) * D + d);
#pragma GCC unroll 3
            for (int h = 0; h < GH; h++) acc[h][i] = _mm256_fmadd_ps(qv[h], kv, acc[h][i]);
        }
    }
#pragma GCC unroll 3
    for (int h = 0; h < GH; h++) _mm_storeu_ps(w + h * n8 + j, _mm_mul_ps(sum4x8(acc[h]), _mm_set1_ps(scale)));
}

/* out[h] = inv[h] * sum_j w[h][j] v_j (j ascending) for GH (1-3) heads, columns
 * [d0, d0 + 8 NC): each value chunk read once for all GH heads. */
static inline __attribute__((always_inline)) void weigh_values8(const float *values, const float *w, int64_t n8,
                                                                int64_t n, int64_t D, int64_t d0, float *out,
                                                                const float *inv, int GH, int NC) {
    __m256 acc[3][4];
#pragma GCC unroll 3
    for (int h = 0; h < GH; h++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) acc[h][c] = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j++) {
        __m256 p[3];
#pragma GCC unroll 3
        for (int h = 0; h < GH; h++) p[h] = _mm256_broadcast_ss(w + h * n8 + j);
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) {
            const __m256 vv = _mm256_loadu_ps(values + j * D + d0 + 8 * c);
#pragma GCC unroll 3
            for (int h = 0; h < GH; h++) acc[h][c] = _mm256_fmadd_ps(p[h], vv, acc[h][c]);
        }
    }
#pragma GCC unroll 3
    for (int h = 0; h < GH; h++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++)
            _mm256_storeu_ps(out + h * D + d0 + 8 * c, _mm256_mul_ps(acc[h][c], _mm256_set1_ps(inv[h])));
}

/* One token, the `g` query heads of one KV head, three at a time: each key and value
 * row is read once for them. q: [g][D]; out: [g][D]; keys/values: [n][D]; w: scratch
 * of g * n floats (n rounded up to 8). A score's bits depend only on its key's place in
 * its block of 4 (blocks counted from key 0; the last n mod 4 keys one at a time) and
 * so on the token's own context length, never on what shares the call. */
static void attend_group(const float *q, const float *keys, const float *values, float *out, int64_t g,
                         int64_t n, int64_t D, float scale, float *w) {
    const int64_t n8 = (n + 7) & ~(int64_t)7, full = n & ~(int64_t)3;
    for (int64_t h0 = 0; h0 < g; h0 += 3) {
        const int gh = g - h0 < 3 ? (int)(g - h0) : 3;
        const float *qh = q + h0 * D;
        float *wh = w + h0 * n8;
        for (int64_t j = 0; j < full; j += 4) {
            if (gh == 3) score4(qh, keys, j, D, scale, wh, n8, 3);
            else if (gh == 2) score4(qh, keys, j, D, scale, wh, n8, 2);
            else score4(qh, keys, j, D, scale, wh, n8, 1);
        }
        for (int64_t j = full; j < n; j++) /* the last n mod 4 keys, one at a time */
            for (int h = 0; h < gh; h++) {
                __m256 acc = _mm256_setzero_ps();
                for (int64_t d = 0; d < D; d += 8)
                    acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + h * D + d), _mm256_loadu_ps(keys + j * D + d), acc);
                wh[h * n8 + j] = hsum8(acc) * scale;
            }
        float inv[3];
        for (int h = 0; h < gh; h++) inv[h] = softmax_weights(wh + h * n8, n);
        float *oh = out + h0 * D;
        for (int64_t d0 = 0; d0 < D; d0 += 32) {
            const int nc = D - d0 < 32 ? (int)((D - d0) / 8) : 4;
#define WV(GH)                                                                  \
    if (nc == 4) weigh_values8(values, wh, n8, n, D, d0, oh, inv, GH, 4);       \
    else if (nc == 3) weigh_values8(values, wh, n8, n, D, d0, oh, inv, GH, 3);  \
    else if (nc == 2) weigh_values8(values, wh, n8, n, D, d0, oh, inv, GH, 2);  \
    else weigh_values8(values, wh, n8, n, D, d0, oh, inv, GH, 1);
            if (gh == 3) { WV(3) } else if (gh == 2) { WV(2) } else { WV(1) }
#undef WV
        }
    }
}

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))

/* The sums of eight 16-lane vectors, as eight lanes: pairs of lanes, then pairs of
 * pairs within each 128-bit lane, then across the four 128-bit lanes. */
static inline __attribute__((always_inline)) T512 __m256 sum8x16(const __m512 *a) {
    __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a[0], a[1]), _mm512_unpackhi_ps(a[0], a[1]));
    __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a[2], a[3]), _mm512_unpackhi_ps(a[2], a[3]));
    __m512 t2 = _mm512_add_ps(_mm512_unpacklo_ps(a[4], a[5]), _mm512_unpackhi_ps(a[4], a[5]));
    __m512 t3 = _mm512_add_ps(_mm512_unpacklo_ps(a[6], a[7]), _mm512_unpackhi_ps(a[6], a[7]));
#define LO(x, y) _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x), _mm512_castps_pd(y)))
#define HI(x, y) _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x), _mm512_castps_pd(y)))
    __m512 u0 = _mm512_add_ps(LO(t0, t1), HI(t0, t1)); /* per 128-bit lane: keys 0-3 */
    __m512 u1 = _mm512_add_ps(LO(t2, t3), HI(t2, t3)); /* keys 4-7 */
#undef LO
#undef HI
    __m512 v = _mm512_add_ps(_mm512_shuffle_f32x4(u0, u1, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(u0, u1, _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 w = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm512_castps512_ps256(_mm512_shuffle_f32x4(w, w, _MM_SHUFFLE(2, 0, 2, 0)));
}

/* Scores of keys [j, j + 8) for GH (1-3) heads: w[h * n8 + j + i] */
static inline __attribute__((always_inline)) T512 void score8(const float *q, const float *keys, int64_t j,
                                                               int64_t D, float scale, float *w, int64_t n8, int GH) {
    __m512 acc[3][8];
#pragma GCC unroll 3
    for (int h = 0; h < GH; h++)
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) acc[h][i] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) {
        __m512 qv[3];
#pragma GCC unroll 3
        for (int h = 0; h < GH; h++) qv[h] = _mm512_loadu_ps(q + h * D + d);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            const __m512 kv = _mm512_loadu_ps(keys + (j + i) * D + d);
#pragma GCC unroll 3
            for (int h = 0; h < GH; h++) acc[h][i] = _mm512_fmadd_ps(qv[h], kv, acc[h][i]);
        }
    }
#pragma GCC unroll 3
    for (int h = 0; h < GH; h++)
        _mm256_storeu_ps(w + h * n8 + j, _mm256_mul_ps(sum8x16(acc[h]), _mm256_set1_ps(scale)));
}

/* out[h] = inv[h] * sum_j w[h][j] v_j (j ascending) for GH (1-4) heads, columns [d0, d0 + 16 NC) */
static inline __attribute__((always_inline)) T512 void weigh_values(const float *values, const float *w, int64_t n8,
                                                                     int64_t n, int64_t D, int64_t d0, float *out,
                                                                     const float *inv, int GH, int NC) {
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int h = 0; h < GH; h++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) acc[h][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j++) {
        __m512 vv[4];
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) vv[c] = _mm512_loadu_ps(values + j * D + d0 + 16 * c);
#pragma GCC unroll 4
        for (int h = 0; h < GH; h++) {
            const __m512 p = _mm512_set1_ps(w[h * n8 + j]);
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++) acc[h][c] = _mm512_fmadd_ps(p, vv[c], acc[h][c]);
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < GH; h++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++)
            _mm512_storeu_ps(out + h * D + d0 + 16 * c, _mm512_mul_ps(acc[h][c], _mm512_set1_ps(inv[h])));
}

/* `attend_group` with 16 lanes, each key and value row read once per group of heads
 * (D a multiple of 16). */
static T512 void attend_group512(const float *q, const float *keys, const float *values, float *out, int64_t g,
                                 int64_t n, int64_t D, float scale, float *w) {
    const int64_t n8 = (n + 7) & ~(int64_t)7, full = n & ~(int64_t)7;
    for (int64_t h0 = 0; h0 < g; h0 += 3) {
        const int gh = g - h0 < 3 ? (int)(g - h0) : 3;
        const float *qh = q + h0 * D;
        float *wh = w + h0 * n8;
        for (int64_t j = 0; j < full; j += 8) {
            if (gh == 3) score8(qh, keys, j, D, scale, wh, n8, 3);
            else if (gh == 2) score8(qh, keys, j, D, scale, wh, n8, 2);
            else score8(qh, keys, j, D, scale, wh, n8, 1);
        }
        for (int64_t j = full; j < n; j++) /* the last n mod 8 keys, one at a time */
            for (int h = 0; h < gh; h++) {
                __m512 acc = _mm512_setzero_ps();
                for (int64_t d = 0; d < D; d += 16)
                    acc = _mm512_fmadd_ps(_mm512_loadu_ps(qh + h * D + d), _mm512_loadu_ps(keys + j * D + d), acc);
                wh[h * n8 + j] = _mm512_reduce_add_ps(acc) * scale;
            }
    }
    float inv[4];
    for (int64_t h0 = 0; h0 < g; h0 += 4) {
        const int gh = g - h0 < 4 ? (int)(g - h0) : 4;
        for (int h = 0; h < gh; h++) inv[h] = softmax_weights(w + (h0 + h) * n8, n);
        const float *wh = w + h0 * n8;
        float *oh = out + h0 * D;
        for (int64_t d0 = 0; d0 < D; d0 += 64) {
            const int nc = D - d0 < 64 ? (int)((D - d0) / 16) : 4;
#define WV(GH)                                                                     \
    if (nc == 4) weigh_values(values, wh, n8, n, D, d0, oh, inv, GH, 4);           \
    else if (nc == 3) weigh_values(values, wh, n8, n, D, d0, oh, inv, GH, 3);      \
    else if (nc == 2) weigh_values(values, wh, n8, n, D, d0, oh, inv, GH, 2);      \
    else weigh_values(values, wh, n8, n, D, d0, oh, inv, GH, 1);
            if (gh == 4) { WV(4) } else if (gh == 3) { WV(3) } else if (gh == 2) { WV(2) } else { WV(1) }
#undef WV
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
    for (int64_t t = 0; t < N; t++)
        for (int64_t kh = 0; kh < KVH; kh++) {
            const int64_t at = ((slots[t] * KVH + kh) * L + positions[t]) * D;
            memcpy(k_cache + at, qkv + t * row + (H + kh) * D, D * sizeof(float));
            memcpy(v_cache + at, qkv + t * row + (H + KVH + kh) * D, D * sizeof(float));
        }
    const int wide = D % 16 == 0 && dspark_gemm_bf16w_isa() == 512;
    const int64_t items = N * KVH;
    if (threads < 1) threads = 1;
    if (threads > items) threads = (int)items;
    /* Work items are (token, KV head). A prefill's later tokens see more keys, so its
     * items go round robin; a decode or verification step of a few tokens gives each
     * thread a contiguous run of items KV head by KV head, so that a thread reads a KV
     * head's cache once and the tokens after the first find it in cache (AVX2 path). */
    const int by_head = !wide && N <= 16;
#pragma omp parallel num_threads(threads)
    {
#ifdef _OPENMP
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        const int tid = 0, nt = 1;
#endif
        float *w = (float *)malloc(sizeof(float) * g * ((longest + 7) & ~(int64_t)7));
        const int64_t lo = by_head ? items * tid / nt : tid, hi = by_head ? items * (tid + 1) / nt : items;
        for (int64_t it = lo; it < hi; it += by_head ? 1 : nt) {
            const int64_t t = by_head ? it % N : it / KVH, kh = by_head ? it / N : it % KVH;
            const int64_t base = (slots[t] * KVH + kh) * L * D;
            const int64_t n = visible ? visible[t] : positions[t] + 1;
            if (wide)
                attend_group512(qkv + t * row + kh * g * D, k_cache + base, v_cache + base, out + (t * H + kh * g) * D,
                                g, n, D, scale, w);
            else
                attend_group(qkv + t * row + kh * g * D, k_cache + base, v_cache + base, out + (t * H + kh * g) * D, g,
                             n, D, scale, w);
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
