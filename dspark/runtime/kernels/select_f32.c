/* The C largest entries of each fp32 row, for AVX2: a draft restricts each position to
 * the top C of its logits over the draft vocabulary (C = 64 of 8192 for the shipped
 * drafter). torch's topk takes about 20 us a row there on these CPUs.
 *
 * A row takes two vector passes and a small selection:
 *   1. the row's maxima over C blocks: each block's maximum is an entry, so at least C
 *      entries are >= the smallest of them (t);
 *   2. the entries >= t, collected (a few hundred of 8192 for logits): where more than
 *      the buffer holds arrive, the buffer is cut to its C best and t rises to the
 *      C-th;
 *   3. the C best of the collected by quickselect, then sorted.
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

/* Threads only where the work pays for waking them. */
#define PAR_MIN_ELEMS (1 << 17)
/* collected entries held per row (the stack of one thread: 24 KiB) */
#define BUF 2048

/* entry a ranks above entry b */
static inline int above(float av, int32_t ai, float bv, int32_t bi) {
    return av > bv || (av == bv && ai < bi);
}

static inline void swap(float *v, int32_t *ix, int64_t a, int64_t b) {
    float tv = v[a]; v[a] = v[b]; v[b] = tv;
    int32_t ti = ix[a]; ix[a] = ix[b]; ix[b] = ti;
}

/* Reorder v/ix[0:n) so that its first c entries are its c best (any order). */
static void select_best(float *v, int32_t *ix, int64_t n, int64_t c) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;  /* median of three as the pivot, moved to hi */
        if (above(v[mid], ix[mid], v[lo], ix[lo])) swap(v, ix, mid, lo);
        if (above(v[hi], ix[hi], v[lo], ix[lo])) swap(v, ix, hi, lo);
        if (above(v[mid], ix[mid], v[hi], ix[hi])) swap(v, ix, mid, hi);
        float pv = v[hi];
        int32_t pi = ix[hi];
        int64_t store = lo;
        for (int64_t i = lo; i < hi; i++)
            if (above(v[i], ix[i], pv, pi)) swap(v, ix, i, store++);
        swap(v, ix, store, hi);  /* the pivot's final place */
        if (store == c - 1 || store == c) return;
        if (store < c) lo = store + 1;
        else hi = store - 1;
    }
}

/* Sort v/ix[0:n) best first (insertion: n is C, a few dozen). */
static void sort_best(float *v, int32_t *ix, int64_t n) {
    for (int64_t i = 1; i < n; i++) {
        float tv = v[i];
        int32_t ti = ix[i];
        int64_t j = i - 1;
        while (j >= 0 && above(tv, ti, v[j], ix[j])) {
            v[j + 1] = v[j];
            ix[j + 1] = ix[j];
            j--;
        }
        v[j + 1] = tv;
        ix[j + 1] = ti;
    }
}

/* The C best of one row (C <= K, C <= BUF / 2) into vals/idx; 1 if the row holds a NaN. */
static int topk_row(const float *x, int64_t K, int64_t C, float *vals, int64_t *idx) {
    float bv[BUF];
    int32_t bi[BUF];
    /* 1. the smallest of the C blocks' maxima */
    int64_t block = K / C;
    float t = INFINITY;
    __m256 nan = _mm256_setzero_ps();
    for (int64_t b = 0; b < C; b++) {
        const float *xb = x + b * block;
        int64_t len = b == C - 1 ? K - b * block : block, k = 0;
        __m256 mx = _mm256_set1_ps(-INFINITY);
        for (; k + 8 <= len; k += 8) {
            __m256 xv = _mm256_loadu_ps(xb + k);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(xv, xv, _CMP_UNORD_Q));
            mx = _mm256_max_ps(mx, xv);
        }
        float lanes[8], m = -INFINITY;
        _mm256_storeu_ps(lanes, mx);
        for (int i = 0; i < 8; i++) m = lanes[i] > m ? lanes[i] : m;
        for (; k < len; k++) {
            if (xb[k] != xb[k]) return 1;
            m = xb[k] > m ? xb[k] : m;
        }
        t = m < t ? m : t;
    }
    if (_mm256_movemask_ps(nan)) return 1;
    /* 2. every entry >= t (at least C of them) */
    int64_t n = 0, k = 0;
    for (; k + 8 <= K; k += 8) {
        int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + k), _mm256_set1_ps(t), _CMP_GE_OQ));
        while (mask) {
            int lane = __builtin_ctz(mask);
            mask &= mask - 1;
            if (n == BUF) {  /* keep the C best; later entries must reach the C-th */
                select_best(bv, bi, n, C);
                n = C;
                t = bv[0];
                for (int64_t i = 1; i < C; i++) t = bv[i] < t ? bv[i] : t;
            }
            if (x[k + lane] >= t) {
                bv[n] = x[k + lane];
                bi[n++] = (int32_t)(k + lane);
            }
        }
    }
    for (; k < K; k++) {
        if (x[k] >= t) {
            if (n == BUF) {
                select_best(bv, bi, n, C);
                n = C;
                t = bv[0];
                for (int64_t i = 1; i < C; i++) t = bv[i] < t ? bv[i] : t;
            }
            if (x[k] >= t) {
                bv[n] = x[k];
                bi[n++] = (int32_t)k;
            }
        }
    }
    /* 3. the C best, sorted */
    select_best(bv, bi, n, C);
    sort_best(bv, bi, C);
    for (int64_t i = 0; i < C; i++) {
        vals[i] = bv[i];
        idx[i] = bi[i];
    }
    return 0;
}

/* vals[m, :C], idx[m, :C] = the C largest of x[m, :K], best first. Needs C <= K,
 * C <= 1024 and K < 2^31. Returns 0, or 1 where some row holds a NaN (the outputs are
 * then unspecified). */
int dspark_topk_f32(const float *x, int64_t M, int64_t K, int64_t C, float *vals, int64_t *idx, int threads) {
    int nan_rows = 0;
#pragma omp parallel for schedule(static) num_threads(threads) if (M * K >= PAR_MIN_ELEMS) reduction(|:nan_rows)
    for (int64_t m = 0; m < M; m++)
        nan_rows |= topk_row(x + m * K, K, C, vals + m * C, idx + m * C);
    return nan_rows;
}
