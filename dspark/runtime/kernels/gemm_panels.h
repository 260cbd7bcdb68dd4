/* The panel matmul y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]), fp32 activations and
 * accumulation, written once for every weight storage: included by gemm_bf16w.c (bf16
 * weights) and gemm_f32w.c (fp32 weights), each of which defines first
 *
 *   WT                       the stored weight element (uint16_t for bf16, float);
 *   load_panel_row(p, lo, hi)  AVX2: one panel row (16 weights at p) as fp32 columns
 *                            0-7 in lo and 8-15 in hi;
 *   PANEL512_SETUP / PANEL512_LOAD(p)  AVX-512: constants the load needs (declared in
 *                            the micro-kernel) and one panel row as 16 fp32 in column order;
 *   GEMM_PACKED              the name of the entry point;
 *
 * and provides int dspark_gemm_bf16w_isa(void) (the variant in use, shared by both).
 *
 * Decode on a CPU is bound by reading the weights; prefill and large batches by
 * arithmetic. The weights are stored pre-packed (dspark/runtime/cpu_kernels.py) in
 * panels of 16 output columns, [panel][k][16], each panel one contiguous stream: the
 * kernel reads them strictly in order (what the hardware prefetcher likes best) and an
 * outer-product micro-kernel keeps up to 12 accumulators busy (up to 6 rows by 16
 * columns) with one broadcast and one panel-row load per step of k.
 *
 * Every output element is one fused multiply-add chain over k ascending, starting
 * from zero, then + bias: the same operations whatever M, the tile it falls in and
 * the thread count are. A row's result therefore does not depend on which other
 * rows share the call: verifying k draft tokens gives bit for bit the logits that
 * decoding them one at a time gives.
 *
 * On CPUs with AVX-512 (F + BW) a second variant runs: one 512-bit register holds a
 * panel row's 16 columns, and a micro-kernel of up to 6 rows by 4 panels (24
 * accumulators) or 3 rows by 8 panels. Each output element is still the same fused
 * multiply-add chain over k ascending from zero, then + bias, so the two variants give
 * the same bits (tested).
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define PANEL 16
#ifndef W_PF
#define W_PF 64 /* panel rows prefetched ahead of the micro-kernels */
#endif
#define T512 __attribute__((target("avx512f,avx512bw")))

int dspark_gemm_bf16w_isa(void);

static inline __attribute__((always_inline)) void store16(float *y, __m256 lo, __m256 hi, const float *bias,
                                                          int ncols) {
    if (ncols == PANEL) {
        if (bias) {
            lo = _mm256_add_ps(lo, _mm256_loadu_ps(bias));
            hi = _mm256_add_ps(hi, _mm256_loadu_ps(bias + 8));
        }
        _mm256_storeu_ps(y, lo);
        _mm256_storeu_ps(y + 8, hi);
        return;
    }
    float tmp[PANEL];
    _mm256_storeu_ps(tmp, lo);
    _mm256_storeu_ps(tmp + 8, hi);
    for (int j = 0; j < ncols; j++) y[j] = bias ? tmp[j] + bias[j] : tmp[j];
}

/* MR rows of x times NP consecutive panels. MR and NP are compile-time constants at
 * every call site; `ncols` is the number of valid columns of the last panel. */
static inline __attribute__((always_inline)) void micro(
    const float *x, int64_t K, const WT *wp, float *y, int64_t ldy, const float *bias,
    int MR, int NP, int ncols_last) {
    __m256 acc[6][4][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int p = 0; p < NP; p++) acc[i][p][0] = acc[i][p][1] = _mm256_setzero_ps();
    const int64_t pstride = K * PANEL;
    for (int64_t k = 0; k < K; k++) {
        __m256 w[4][2];
#pragma GCC unroll 8
        for (int p = 0; p < NP; p++) {
            _mm_prefetch((const char *)(wp + p * pstride + (k + W_PF) * PANEL), _MM_HINT_T0);
            load_panel_row(wp + p * pstride + k * PANEL, &w[p][0], &w[p][1]);
        }
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m256 xb = _mm256_broadcast_ss(x + i * K + k);
#pragma GCC unroll 8
            for (int p = 0; p < NP; p++) {
                acc[i][p][0] = _mm256_fmadd_ps(xb, w[p][0], acc[i][p][0]);
                acc[i][p][1] = _mm256_fmadd_ps(xb, w[p][1], acc[i][p][1]);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int p = 0; p < NP; p++)
            store16(y + i * ldy + p * PANEL, acc[i][p][0], acc[i][p][1], bias ? bias + p * PANEL : 0,
                    p == NP - 1 ? ncols_last : PANEL);
}

/* One panel, MR rows (a compile-time constant), steps k0..k1 of the product: the
 * accumulators start from zero (k0 == 0) or from part [MR][16], where they are left
 * again; after the last step (k1 == K) the rows are stored to y (+ bias). Split so,
 * each output element is still one FMA chain over k ascending from zero. */
static inline __attribute__((always_inline)) void micro_steps(
    const float *x, int64_t K, int64_t k0, int64_t k1, const WT *wp, float *part, float *y, int64_t ldy,
    const float *bias, int MR, int ncols) {
    __m256 acc[6][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        acc[i][0] = k0 ? _mm256_loadu_ps(part + i * PANEL) : _mm256_setzero_ps();
        acc[i][1] = k0 ? _mm256_loadu_ps(part + i * PANEL + 8) : _mm256_setzero_ps();
    }
    for (int64_t k = k0; k < k1; k++) {
        __m256 w0, w1;
        _mm_prefetch((const char *)(wp + (k + W_PF) * PANEL), _MM_HINT_T0);
        load_panel_row(wp + k * PANEL, &w0, &w1);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m256 xb = _mm256_broadcast_ss(x + i * K + k);
            acc[i][0] = _mm256_fmadd_ps(xb, w0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(xb, w1, acc[i][1]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        if (k1 == K) {
            store16(y + i * ldy, acc[i][0], acc[i][1], bias, ncols);
        } else {
            _mm256_storeu_ps(part + i * PANEL, acc[i][0]);
            _mm256_storeu_ps(part + i * PANEL + 8, acc[i][1]);
        }
    }
}

#ifndef K_STEPS
#define K_STEPS 64 /* steps of k a tile takes before the next tile's turn (2 KiB of a bf16 panel, 4 KiB of an fp32 one) */
#endif

/* Rows [m0, m1) of x against panels [p0, p1). */
static void block(const float *x, const WT *wp, const float *bias, float *y, int64_t N, int64_t K,
                  int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
    const int64_t P = (N + PANEL - 1) / PANEL;
    const int64_t M = m1 - m0;
#define LAST(q, n) ((q) + (n) == P ? (int)(N - (P - 1) * PANEL) : PANEL)
#define CALL(m, q, mr, nparg) \
    micro(x + (m) * K, K, wp + (q) * K * PANEL, y + (m) * N + (q) * PANEL, N, bias ? bias + (q) * PANEL : 0, mr, nparg, LAST(q, nparg))
    if (M < 4) {
        /* Panels per micro-kernel call: wide for few rows (more independent chains to
         * hide the FMA latency), as wide as the 16 ymm registers hold without spilling:
         * accumulators (2 per row and panel) plus the panel rows being read (2 per
         * panel). One row takes 4 panels (8 + 8), two rows 2 (8 + 4), three rows 1
         * (6 + 2): 3 rows by 2 panels (12 + 4 and the broadcast) spilled and ran 1.6x
         * the time of 4 rows on the LM head. */
        const int64_t np = M == 3 ? 1 : M == 2 ? 2 : 4;
        for (int64_t p = p0; p < p1;) {
            int64_t take = p1 - p < np ? p1 - p : np;
            if (take == 4) CALL(m0, p, 1, 4);
            else if (take == 3) { if (M == 1) CALL(m0, p, 1, 3); else CALL(m0, p, 2, 3); }
            else if (take == 2) { if (M == 3) CALL(m0, p, 3, 2); else if (M == 2) CALL(m0, p, 2, 2); else CALL(m0, p, 1, 2); }
            else { if (M == 3) CALL(m0, p, 3, 1); else if (M == 2) CALL(m0, p, 2, 1); else CALL(m0, p, 1, 1); }
            p += take;
        }
        return;
    }
    if (M >= 7 && M <= 15) {
        /* A verification's 7-15 rows: one panel at a time, its rows in ceil(M / 6)
         * tiles as even as can be (7 rows: 4 + 3, 8: 4 + 4, 13: 5 + 4 + 4), so no tile
         * is left with 1 or 2 rows (two or four FMA chains, bound by their latency).
         * The tiles take turns every K_STEPS steps of k, each turn on the same 2 KiB of
         * the panel (in L1), so the panel streams from memory at one steady pace while
         * all of them compute (0.88-0.96x the time of the prefill path for 7-15 rows). */
        const int64_t tiles = (M + 5) / 6, base = M / tiles, extra = M % tiles;
        float part[M * PANEL];
        for (int64_t q = p0; q < p1; q++) {
            const WT *w = wp + q * K * PANEL;
            const float *b = bias ? bias + q * PANEL : 0;
            const int nc = LAST(q, 1);
            for (int64_t k0 = 0, k1; k0 < K; k0 = k1) {
                k1 = tiles == 1 || K - k0 < K_STEPS ? K : k0 + K_STEPS;
                int64_t m = m0;
                for (int64_t i = 0; i < tiles; i++) {
                    const int64_t mr = base + (i < extra);
                    const float *xm = x + m * K;
                    float *pm = part + (m - m0) * PANEL, *ym = y + m * N + q * PANEL;
                    if (mr == 6) micro_steps(xm, K, k0, k1, w, pm, ym, N, b, 6, nc);
                    else if (mr == 5) micro_steps(xm, K, k0, k1, w, pm, ym, N, b, 5, nc);
                    else if (mr == 4) micro_steps(xm, K, k0, k1, w, pm, ym, N, b, 4, nc);
                    else micro_steps(xm, K, k0, k1, w, pm, ym, N, b, 3, nc);
                    m += mr;
                }
            }
        }
        return;
    }
    /* Prefill-sized calls: 6-row tiles one panel at a time (12 accumulators). A
     * remainder of 4 or 5 rows is one more such tile; a remainder of 1 or 2 rows would
     * be two or four chains per panel, bound by the FMA latency, so it runs across the
     * group of 4 panels just read (still in cache) with wider tiles instead. */
    int64_t rem = M % 6;
    const int64_t tiled = rem >= 4 || rem == 0 ? M : M - rem;
    if (rem >= 4) rem = 0;
    for (int64_t p = p0; p < p1; p += 4) {
        const int64_t take = p1 - p < 4 ? p1 - p : 4;
        for (int64_t q = p; q < p + take; q++) {
            for (int64_t m = m0; m < m0 + tiled;) {
                int64_t r = m0 + tiled - m;
                if (r >= 6) { CALL(m, q, 6, 1); m += 6; }
                else if (r == 5) { CALL(m, q, 5, 1); m += 5; }
                else { CALL(m, q, 4, 1); m += 4; }
            }
        }
        if (!rem) continue;
        const int64_t m = m0 + tiled;
        for (int64_t q = p; q < p + take;) {
            int64_t left = p + take - q;
            if (rem == 1) {
                if (left == 4) CALL(m, q, 1, 4); else if (left == 3) CALL(m, q, 1, 3);
                else if (left == 2) CALL(m, q, 1, 2); else CALL(m, q, 1, 1);
                q += left;
            } else if (rem == 2) {
                if (left >= 2) { CALL(m, q, 2, 2); q += 2; } else { CALL(m, q, 2, 1); q += 1; }
            } else {  /* 3 rows: 6 chains a panel already; two panels would spill registers */
                CALL(m, q, 3, 1);
                q += 1;
            }
        }
    }
#undef CALL
#undef LAST
}

/* ---- AVX-512 variant --------------------------------------------------------------- */
static inline __attribute__((always_inline)) T512 void store16_512(float *y, __m512 acc, const float *bias,
                                                                   int ncols) {
    __mmask16 m = ncols == PANEL ? (__mmask16)0xFFFF : (__mmask16)((1u << ncols) - 1);
    if (bias) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(m, bias));
    _mm512_mask_storeu_ps(y, m, acc);
}

static inline __attribute__((always_inline)) T512 void micro512(
    const float *x, int64_t K, const WT *wp, float *y, int64_t ldy, const float *bias,
    int MR, int NP, int ncols_last) {
    __m512 acc[6][8];
    PANEL512_SETUP
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int p = 0; p < NP; p++) acc[i][p] = _mm512_setzero_ps();
    const int64_t pstride = K * PANEL;
    for (int64_t k = 0; k < K; k++) {
        __m512 xb[6];
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) xb[i] = _mm512_set1_ps(x[i * K + k]);
#pragma GCC unroll 8
        for (int p = 0; p < NP; p++) {
            _mm_prefetch((const char *)(wp + p * pstride + (k + W_PF) * PANEL), _MM_HINT_T0);
            __m512 w = PANEL512_LOAD(wp + p * pstride + k * PANEL);
#pragma GCC unroll 8
            for (int i = 0; i < MR; i++) acc[i][p] = _mm512_fmadd_ps(xb[i], w, acc[i][p]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int p = 0; p < NP; p++)
            store16_512(y + i * ldy + p * PANEL, acc[i][p], bias ? bias + p * PANEL : 0,
                        p == NP - 1 ? ncols_last : PANEL);
}

/* Rows [m0, m1) of x against panels [p0, p1), AVX-512: 8 panels a call for up to 3
 * rows, else 4 panels by 6-row tiles. */
static T512 void block512(const float *x, const WT *wp, const float *bias, float *y, int64_t N,
                          int64_t K, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
    const int64_t P = (N + PANEL - 1) / PANEL;
    const int64_t np = m1 - m0 <= 3 ? 8 : 4;
    for (int64_t p = p0; p < p1;) {
        int64_t take = p1 - p < np ? p1 - p : np;
        int last = (int)(p + take == P ? N - (P - 1) * PANEL : PANEL);
        const WT *w = wp + p * K * PANEL;
        const float *b = bias ? bias + p * PANEL : 0;
        for (int64_t m = m0; m < m1;) {
            int64_t r = m1 - m;
            const float *xm = x + m * K;
            float *ym = y + m * N + p * PANEL;
#define C5(mr, nparg) micro512(xm, K, w, ym, N, b, mr, nparg, last)
#define ROWS(nparg)                                          \
    if (r >= 6 && nparg <= 4) { C5(6, nparg); m += 6; }      \
    else if (r >= 5 && nparg <= 4) { C5(5, nparg); m += 5; } \
    else if (r >= 4 && nparg <= 4) { C5(4, nparg); m += 4; } \
    else if (r >= 3) { C5(3, nparg); m += 3; }               \
    else if (r == 2) { C5(2, nparg); m += 2; }               \
    else { C5(1, nparg); m += 1; }
            switch (take) {
                case 8: ROWS(8) break;
                case 7: ROWS(7) break;
                case 6: ROWS(6) break;
                case 5: ROWS(5) break;
                case 4: ROWS(4) break;
                case 3: ROWS(3) break;
                case 2: ROWS(2) break;
                default: ROWS(1) break;
            }
#undef ROWS
#undef C5
        }
        p += take;
    }
}

/* wp: the packed weight, ceil(N / 16) panels of [K][16] WT. */
void GEMM_PACKED(const float *x, const WT *wp, const float *bias, float *y,
                              int64_t M, int64_t N, int64_t K, int threads) {
    const int64_t P = (N + PANEL - 1) / PANEL;
    /* Rows per pass: keep the pass's activations (MC x K fp32) within ~192 KiB of
     * cache while each panel is streamed once per pass. */
    int64_t mc = (192 * 1024 / 4) / (K > 0 ? K : 1);
    mc = mc < 6 ? 6 : mc / 6 * 6;
    if (threads < 1) threads = 1;
    if (threads > P) threads = (int)P;
    const int wide = dspark_gemm_bf16w_isa() == 512;
#pragma omp parallel num_threads(threads)
    {
#ifdef _OPENMP
        int t = omp_get_thread_num();
        int nt = omp_get_num_threads();
#else
        int t = 0, nt = 1;
#endif
        int64_t p0 = P * t / nt, p1 = P * (t + 1) / nt;
        for (int64_t m = 0; m < M; m += mc) {
            int64_t m1 = m + mc < M ? m + mc : M;
            if (wide) block512(x, wp, bias, y, N, K, m, m1, p0, p1);
            else block(x, wp, bias, y, N, K, m, m1, p0, p1);
        }
    }
}
