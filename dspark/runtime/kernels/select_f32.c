/* The C largest entries of each fp32 row, for AVX2: a draft restricts each position to
 * the top C of its logits over the draft vocabulary (C = 64 of 8192 for the shipped
 * drafter). torch's topk takes about 20 us a row there on these CPUs; this about 10
 * (on a draft's logits: 64-66 us for a one-request draft's 7 rows, torch 133-137).
 *
 * A row takes two vector passes and two counting searches, with few branches that
 * depend on the data (mispredicted branches, not arithmetic, were the cost):
 *   1. the maxima of about 4C blocks of the row, and t = the C-th largest of them: C
 *      blocks reach t, so at least C entries are >= t (on a draft's logits this keeps
 *      about 2C of 8192);
 *   2. the entries >= t, packed into a buffer eight at a time (a permutation per mask);
 *   3. T = the C-th largest collected value; the entries above T and the first entries
 *      equal to T (collected in index order) are the C best, sorted stably.
 * The C-th largest of a few hundred values is found by a binary search over the
 * values' order-preserving integer keys, counting eight keys per instruction.
 * Where more entries reach t than the buffer holds (rows with very many equal
 * values), the buffer is cut to its C best the same way (keeping index order) and t
 * rises to the C-th.
 *
 * Order: descending value, and among equal values ascending index (a total order, so
 * the result is a function of the row alone). A row holding a NaN is left to the
 * caller (return value 1), which falls back to torch.
 *
 * Built on first use by dspark/runtime/cpu_kernels.py (cc -O3 -mavx2 -mfma -fopenmp).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Threads only where the work pays for waking them. */
#define PAR_MIN_ELEMS (1 << 17)
/* collected entries held per row, and block maxima (on one thread's stack) */
#define BUF 2048
#define MAX_BLOCKS 8192

/* lane order that packs the lanes set in an 8-bit mask to the front */
static int32_t pack_lut[256][8];

__attribute__((constructor)) static void build_pack_lut(void) {
    for (int m = 0; m < 256; m++) {
        int n = 0;
        for (int lane = 0; lane < 8; lane++)
            if (m & (1 << lane)) pack_lut[m][n++] = lane;
        while (n < 8) pack_lut[m][n++] = 0;
    }
}

/* A float's key: signed integers in the floats' order, -0 the same as +0 (no NaN here). */
static inline int32_t key_of(float f) {
    int32_t b;
    memcpy(&b, &f, 4);
    if (b == INT32_MIN) return 0;  /* -0.0 */
    return b < 0 ? b ^ 0x7fffffff : b;
}

/* The c-th largest of keys[0:n) (1 <= c <= n; keys padded with INT32_MIN to a multiple
 * of 8): the largest T with at least c keys >= T. */
static int32_t kth_largest_key(const int32_t *keys, int64_t n, int64_t c) {
    int64_t lo = INT32_MIN, hi = INT32_MAX;
    int64_t n8 = (n + 7) & ~(int64_t)7;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        __m256i below = _mm256_set1_epi32((int32_t)(mid - 1));
        int64_t count = 0;
        for (int64_t i = 0; i < n8; i += 8) {
            __m256i k = _mm256_loadu_si256((const __m256i *)(keys + i));
            count += __builtin_popcount(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(k, below))));
        }
        if (count >= c) lo = mid;
        else hi = mid - 1;
    }
    return (int32_t)lo;
}

/* The float of a key (key_of's inverse, +0 for 0). */
static inline float value_of(int32_t key) {
    int32_t b = key < 0 ? key ^ 0x7fffffff : key;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* Keep the c best of v/ix[0:n) (c <= n) at its front, in their order: the entries above
 * the c-th largest value T and the first entries equal to T. Entries collected in index
 * order stay so, which ranks equal values by index. `keys`: scratch for n + 8 ints.
 * Returns T. */
static float keep_best(float *v, int32_t *ix, int64_t n, int64_t c, int32_t *keys) {
    for (int64_t i = 0; i < n; i++) keys[i] = key_of(v[i]);
    for (int64_t i = n; i < ((n + 7) & ~(int64_t)7); i++) keys[i] = INT32_MIN;
    int32_t T = kth_largest_key(keys, n, c);
    int64_t greater = 0, m = 0;
    for (int64_t i = 0; i < n; i++) greater += keys[i] > T;
    int64_t equal_left = c - greater;
    for (int64_t i = 0; i < n; i++) {
        int take = keys[i] > T || (keys[i] == T && equal_left > 0);
        equal_left -= keys[i] == T && take;
        v[m] = v[i];
        ix[m] = ix[i];
        m += take;
    }
    return value_of(T);
}

/* The C best of one row (C <= K, 8 * C <= MAX_BLOCKS, C + 8 <= BUF) into
 * vals/idx; 1 if the row holds a NaN. */
static int topk_row(const float *x, int64_t K, int64_t C, float *vals, int64_t *idx) {
    int32_t keys[MAX_BLOCKS + 8];
    float bv[BUF];
    int32_t bi[BUF];
    /* 1. the C-th largest of the blocks' maxima */
    int64_t block = K / (4 * C) > 0 ? K / (4 * C) : 1, nb = K / block;
    __m256 nan = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + b * block;
        int64_t len = b == nb - 1 ? K - b * block : block, k = 0;
        float m = -INFINITY;
        if (len >= 8) {
            __m256 mx = _mm256_set1_ps(-INFINITY);
            for (; k + 8 <= len; k += 8) {
                __m256 xv = _mm256_loadu_ps(xb + k);
                nan = _mm256_or_ps(nan, _mm256_cmp_ps(xv, xv, _CMP_UNORD_Q));
                mx = _mm256_max_ps(mx, xv);
            }
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            h = _mm_max_ss(h, _mm_movehdup_ps(h));
            m = _mm_cvtss_f32(h);
        }
        for (; k < len; k++) {
            if (xb[k] != xb[k]) return 1;
            m = xb[k] > m ? xb[k] : m;
        }
        keys[b] = key_of(m);
    }
    if (_mm256_movemask_ps(nan)) return 1;
    for (int64_t b = nb; b < ((nb + 7) & ~(int64_t)7); b++) keys[b] = INT32_MIN;
    float t = value_of(kth_largest_key(keys, nb, C));
    /* 2. every entry >= t, packed, in index order (the keys are scratch from here on) */
    int64_t n = 0, k = 0;
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (; k + 8 <= K; k += 8) {
        __m256 xv = _mm256_loadu_ps(x + k);
        int mask = _mm256_movemask_ps(_mm256_cmp_ps(xv, _mm256_set1_ps(t), _CMP_GE_OQ));
        if (!mask) continue;
        if (n + 8 > BUF) {  /* keep the C best; later entries must reach the C-th */
            t = keep_best(bv, bi, n, C, keys);
            n = C;
            mask = _mm256_movemask_ps(_mm256_cmp_ps(xv, _mm256_set1_ps(t), _CMP_GE_OQ));
        }
        __m256i perm = _mm256_loadu_si256((const __m256i *)pack_lut[mask]);
        _mm256_storeu_ps(bv + n, _mm256_permutevar8x32_ps(xv, perm));
        __m256i at = _mm256_add_epi32(_mm256_set1_epi32((int32_t)k), lanes);
        _mm256_storeu_si256((__m256i *)(bi + n), _mm256_permutevar8x32_epi32(at, perm));
        n += __builtin_popcount(mask);
    }
    for (; k < K; k++) {
        if (x[k] < t) continue;
        if (n == BUF) {
            t = keep_best(bv, bi, n, C, keys);
            n = C;
            if (x[k] < t) continue;
        }
        bv[n] = x[k];
        bi[n++] = (int32_t)k;
    }
    /* 3. the C best, sorted by value, stably: equal values keep their index order */
    keep_best(bv, bi, n, C, keys);
    for (int64_t i = 1; i < C; i++) {
        float tv = bv[i];
        int32_t ti = bi[i];
        int64_t j = i - 1;
        while (j >= 0 && bv[j] < tv) {
            bv[j + 1] = bv[j];
            bi[j + 1] = bi[j];
            j--;
        }
        bv[j + 1] = tv;
        bi[j + 1] = ti;
    }
    for (int64_t i = 0; i < C; i++) {
        vals[i] = bv[i];
        idx[i] = bi[i];
    }
    return 0;
}

/* vals[m, :C], idx[m, :C] = the C largest of x[m, :K], best first. Needs C <= K,
 * C <= 1020 and K < 2^31. Returns 0, or 1 where some row holds a NaN (the outputs are
 * then unspecified). */
int dspark_topk_f32(const float *x, int64_t M, int64_t K, int64_t C, float *vals, int64_t *idx, int threads) {
    int nan_rows = 0;
#pragma omp parallel for schedule(static) num_threads(threads) if (M * K >= PAR_MIN_ELEMS) reduction(|:nan_rows)
    for (int64_t m = 0; m < M; m++)
        nan_rows |= topk_row(x + m * K, K, C, vals + m * C, idx + m * C);
    return nan_rows;
}
