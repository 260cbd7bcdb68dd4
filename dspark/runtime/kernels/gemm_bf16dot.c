/* y[m, n] = sum_k bf16(x[m, k]) * w[n, k] (+ bias[n]): bf16 weights, activations
 * rounded to bf16 at the matmul's input, fp32 accumulation, for CPUs with AVX-512 BF16
 * (the `bf16x` precision).
 *
 * One VDPBF16PS multiplies 16 pairs of bf16 and adds both products of each pair to an
 * fp32 lane: twice the multiply-adds of an fp32 FMA per instruction, and no widening of
 * the weights. Where a step is bound by arithmetic (prefill, verification, large
 * batches) that is what counts; a one-token decode stays bound by reading the weights,
 * which are bf16 here as in bf16w.
 *
 * The weights are packed once (cpu_kernels.py `PackedBf16Dot`) in panels of 16 output
 * columns, [panel][k / 2][16][2]: each panel row is one 64-byte load holding, for each
 * of its 16 columns, the weights of inputs 2j and 2j + 1. Each row of x is rounded to
 * bf16 once per call (round to nearest even), and a micro-kernel of up to 8 rows by 3
 * panels (24 accumulators) or 4 rows by 6 panels broadcasts one input pair per row and
 * step of j.
 *
 * Every output element is one chain of VDPBF16PS over j ascending, starting from zero,
 * then + bias: the same operations whatever M, the tile it falls in and the thread
 * count are, so a row's result does not depend on which other rows share the call
 * (batch-invariant, as the bf16w kernel).
 *
 * Built on first use by dspark/runtime/cpu_kernels.py; runs only where the CPU has
 * avx512_bf16 (`dspark_gemm_bf16dot_available`).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define PANEL 16
#ifndef DOT_PF
#define DOT_PF 32 /* weight rows (64 bytes each) prefetched ahead of the micro-kernel */
#endif
#define TBF __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

/* Compilers older than these have no AVX-512 BF16 intrinsics: the kernel is then left
 * out (and reported unavailable) rather than failing the whole build. */
#if (defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10)
#define HAVE_BF16DOT 1
#else
#define HAVE_BF16DOT 0
#endif

int dspark_gemm_bf16dot_available(void) {
    if (!HAVE_BF16DOT) return 0;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}

#if HAVE_BF16DOT

/* rows of x [M, K] fp32 -> bf16 [M, K] (K even), round to nearest even */
static TBF void round_rows(const float *x, uint16_t *xb, int64_t M, int64_t K) {
    for (int64_t m = 0; m < M; m++) {
        const float *xm = x + m * K;
        uint16_t *bm = xb + m * K;
        int64_t k = 0;
        for (; k + 16 <= K; k += 16) {
            __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(xm + k));
            _mm256_storeu_si256((__m256i *)(bm + k), (__m256i)h);
        }
        if (k < K) {
            __mmask16 mk = (__mmask16)((1u << (K - k)) - 1);
            __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mk, xm + k));
            _mm256_mask_storeu_epi16(bm + k, mk, (__m256i)h);
        }
    }
}

static inline __attribute__((always_inline)) TBF void microdot(const uint16_t *xb, int64_t K, const uint16_t *wp,
                                                               float *y, int64_t ldy, const float *bias, int MR,
                                                               int NP, int ncols_last) {
    __m512 acc[8][6];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int p = 0; p < NP; p++) acc[i][p] = _mm512_setzero_ps();
    const int64_t pairs = K / 2, pstride = K * PANEL;
    const uint32_t *x32 = (const uint32_t *)xb;
    for (int64_t j = 0; j < pairs; j++) {
        __m512bh w[6];
#pragma GCC unroll 8
        for (int p = 0; p < NP; p++) {
            if (MR > 1) /* a one-row call is bound by the weight stream, which the hardware prefetches */
                _mm_prefetch((const char *)(wp + p * pstride + (j + DOT_PF) * 32), _MM_HINT_T0);
            w[p] = (__m512bh)_mm512_loadu_si512((const void *)(wp + p * pstride + j * 32));
        }
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m512bh xv = (__m512bh)_mm512_set1_epi32((int)x32[i * pairs + j]);
#pragma GCC unroll 8
            for (int p = 0; p < NP; p++) acc[i][p] = _mm512_dpbf16_ps(acc[i][p], xv, w[p]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int p = 0; p < NP; p++) {
            int nc = p == NP - 1 ? ncols_last : PANEL;
            __mmask16 m = nc == PANEL ? (__mmask16)0xFFFF : (__mmask16)((1u << nc) - 1);
            __m512 v = acc[i][p];
            if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + p * PANEL));
            _mm512_mask_storeu_ps(y + i * ldy + p * PANEL, m, v);
        }
}

/* Rows [m0, m1) of xb against panels [p0, p1): 6 panels a tile for up to 4 rows, else 3
 * panels by 8-row tiles. */
static TBF void blockdot(const uint16_t *xb, const uint16_t *wp, const float *bias, float *y, int64_t N, int64_t K,
                         int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
    const int64_t P = (N + PANEL - 1) / PANEL;
    const int64_t np = m1 - m0 <= 4 ? 6 : 3;
    for (int64_t p = p0; p < p1;) {
        int64_t take = p1 - p < np ? p1 - p : np;
        int last = (int)(p + take == P ? N - (P - 1) * PANEL : PANEL);
        const uint16_t *w = wp + p * K * PANEL;
        const float *b = bias ? bias + p * PANEL : 0;
        for (int64_t m = m0; m < m1;) {
            int64_t r = m1 - m;
            const uint16_t *xm = xb + m * K;
            float *ym = y + m * N + p * PANEL;
#define CD(mr, nparg) microdot(xm, K, w, ym, N, b, mr, nparg, last)
#define ROWSD(nparg)                                          \
    if (r >= 8 && nparg <= 3) { CD(8, nparg); m += 8; }       \
    else if (r >= 7 && nparg <= 3) { CD(7, nparg); m += 7; }  \
    else if (r >= 6 && nparg <= 3) { CD(6, nparg); m += 6; }  \
    else if (r >= 5 && nparg <= 3) { CD(5, nparg); m += 5; }  \
    else if (r >= 4) { CD(4, nparg); m += 4; }                \
    else if (r == 3) { CD(3, nparg); m += 3; }                \
    else if (r == 2) { CD(2, nparg); m += 2; }                \
    else { CD(1, nparg); m += 1; }
            switch (take) {
                case 6: ROWSD(6) break;
                case 5: ROWSD(5) break;
                case 4: ROWSD(4) break;
                case 3: ROWSD(3) break;
                case 2: ROWSD(2) break;
                default: ROWSD(1) break;
            }
#undef ROWSD
#undef CD
        }
        p += take;
    }
}

/* x [M, K] fp32 (K even); wp: ceil(N / 16) panels of [K / 2][16][2] bf16. */
TBF void dspark_gemm_bf16dot_packed(const float *x, const uint16_t *wp, const float *bias, float *y, int64_t M,
                                    int64_t N, int64_t K, int threads) {
    const int64_t P = (N + PANEL - 1) / PANEL;
    uint16_t stackbuf[8192];
    uint16_t *xb = M * K <= 8192 ? stackbuf : (uint16_t *)malloc(sizeof(uint16_t) * M * K);
    round_rows(x, xb, M, K);
    /* rows per pass: the pass's bf16 activations within ~128 KiB of cache */
    int64_t mc = (128 * 1024 / 2) / (K > 0 ? K : 1);
    mc = mc < 8 ? 8 : mc / 8 * 8;
    if (threads < 1) threads = 1;
    if (threads > P) threads = (int)P;
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
            blockdot(xb, wp, bias, y, N, K, m, m1, p0, p1);
        }
    }
    if (xb != stackbuf) free(xb);
}
/* ---- AMX ------------------------------------------------------------------------------
 * The same packing read by AMX tiles: a B tile is 16 consecutive pair rows of one panel
 * (32 inputs x 16 columns, 1 KiB, 64-byte stride), an A tile 16 rows of the bf16
 * activations by 32 inputs, and TDPBF16PS adds their product to a 16 x 16 fp32 tile.
 * Four panels share each A tile (C in tiles 0-3, A in 4, B in 5-7). A row's outputs
 * are one chain of TDPBF16PS over the input blocks in ascending order whatever the
 * other rows of the tile hold, so the result is batch-invariant too; it is not the
 * bits of the VDPBF16PS kernel (the hardware sums a block's 32 products in its own
 * order). Linux hands out the tile registers only on request
 * (`dspark_amx_available` asks once per process; DSPARK_NO_AMX=1 declines them, which
 * runs a CPU with AMX as one with avx512_bf16 alone). */
#include <sys/syscall.h>
#include <unistd.h>
#define TAMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))

static int amx_state = -1;

#ifndef PF_AHEAD
#define PF_AHEAD 64
#endif

int dspark_amx_available(void) {
    if (amx_state >= 0) return amx_state;
    amx_state = 0;
    const char *off = getenv("DSPARK_NO_AMX"); /* the VDPBF16PS kernel even where AMX runs */
    if (off && *off && *off != '0') return 0;
    __builtin_cpu_init();
    if (!dspark_gemm_bf16dot_available()) return 0;
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    if (!((d >> 22) & 1) || !((d >> 24) & 1)) return 0; /* amx-bf16, amx-tile */
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0) return 0;
    amx_state = 1;
    return 1;
}

typedef struct {
    uint8_t palette, start;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg_t;

static TAMX void amx_config(int rows) {
    tilecfg_t c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 4; t++) { c.colsb[t] = 64; c.rows[t] = (uint8_t)rows; } /* C: rows x 16 fp32 */
    c.colsb[4] = 64; c.rows[4] = (uint8_t)rows;                                 /* A: rows x 32 bf16 */
    for (int t = 5; t < 8; t++) { c.colsb[t] = 64; c.rows[t] = 16; }            /* B: 16 pair rows */
    _tile_loadconfig(&c);
}

/* rows [m0, m0 + rows) (rows <= 16) against panels [p, p + 4) (all full, in range) */
static TAMX void amx_tile4(const uint16_t *xb, int64_t K, const uint16_t *wp, float *y, int64_t N, int64_t m0,
                           int64_t p) {
    const int64_t pstride = K * PANEL;
    const uint16_t *w = wp + p * pstride;
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int64_t k = 0; k < K; k += 32) {
        if (k + PF_AHEAD < K) /* the B stream, PF_AHEAD inputs ahead: 1 KiB of each panel */
            for (int q = 0; q < 4; q++) {
                const char *pf = (const char *)(w + q * pstride + (k + PF_AHEAD) * PANEL);
                for (int l = 0; l < 1024; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
            }
        _tile_loadd(4, xb + m0 * K + k, K * 2);
        _tile_loadd(5, w + k * PANEL, 64);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, w + pstride + k * PANEL, 64);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(7, w + 2 * pstride + k * PANEL, 64);
        _tile_dpbf16ps(2, 4, 7);
        _tile_loadd(5, w + 3 * pstride + k * PANEL, 64);
        _tile_dpbf16ps(3, 4, 5);
    }
    float *yp = y + m0 * N + p * PANEL;
    _tile_stored(0, yp, N * 4);
    _tile_stored(1, yp + PANEL, N * 4);
    _tile_stored(2, yp + 2 * PANEL, N * 4);
    _tile_stored(3, yp + 3 * PANEL, N * 4);
}

/* one panel (possibly partial: ncols valid), rows [m0, m0 + rows) */
static TAMX void amx_tile1(const uint16_t *xb, int64_t K, const uint16_t *wp, float *y, int64_t N, int64_t m0,
                           int rows, int64_t p, int ncols) {
    const uint16_t *w = wp + p * K * PANEL;
    float tmp[16 * 16];
    _tile_zero(0);
    for (int64_t k = 0; k < K; k += 32) {
        _tile_loadd(4, xb + m0 * K + k, K * 2);
        _tile_loadd(5, w + k * PANEL, 64);
        _tile_dpbf16ps(0, 4, 5);
    }
    _tile_stored(0, tmp, 64);
    for (int r = 0; r < rows; r++) memcpy(y + (m0 + r) * N + p * PANEL, tmp + r * 16, ncols * sizeof(float));
}

/* x [M, K] fp32 (K a multiple of 32); wp as dspark_gemm_bf16dot_packed's. */
TAMX void dspark_gemm_bf16amx_packed(const float *x, const uint16_t *wp, const float *bias, float *y, int64_t M,
                                     int64_t N, int64_t K, int threads) {
    const int64_t P = (N + PANEL - 1) / PANEL;
    uint16_t *xb = (uint16_t *)malloc(sizeof(uint16_t) * M * K);
    round_rows(x, xb, M, K);
    if (threads < 1) threads = 1;
    if (threads > P) threads = (int)P;
#pragma omp parallel num_threads(threads)
    {
#ifdef _OPENMP
        int t = omp_get_thread_num();
        int nt = omp_get_num_threads();
#else
        int t = 0, nt = 1;
#endif
        int64_t p0 = P * t / nt, p1 = P * (t + 1) / nt;
        int configured = -1;
        for (int64_t p = p0; p < p1;) {
            int full4 = p + 4 <= p1 && (p + 4 < P || N % PANEL == 0);
            for (int64_t m = 0; m < M; m += 16) {
                int rows = (int)(M - m < 16 ? M - m : 16);
                if (rows != configured) { amx_config(rows); configured = rows; }
                if (full4) amx_tile4(xb, K, wp, y, N, m, p);
                else amx_tile1(xb, K, wp, y, N, m, rows, p, (int)(p == P - 1 ? N - (P - 1) * PANEL : PANEL));
            }
            p += full4 ? 4 : 1;
        }
        if (configured >= 0) _tile_release();
    }
    if (bias)
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) y[m * N + n] += bias[n];
    free(xb);
}
#else
int dspark_amx_available(void) { return 0; }
void dspark_gemm_bf16amx_packed(const float *x, const uint16_t *wp, const float *bias, float *y, int64_t M,
                                int64_t N, int64_t K, int threads) {
    (void)x; (void)wp; (void)bias; (void)y; (void)M; (void)N; (void)K; (void)threads;
}
void dspark_gemm_bf16dot_packed(const float *x, const uint16_t *wp, const float *bias, float *y, int64_t M,
                                int64_t N, int64_t K, int threads) {
    (void)x; (void)wp; (void)bias; (void)y; (void)M; (void)N; (void)K; (void)threads;
}
#endif

/* The bf16x matmul: AMX tiles where Linux grants them, else VDPBF16PS (decided once per
 * process, so every call of a process computes a row the same way). K: a multiple of 32
 * for AMX (the Python side packs other shapes for bf16w instead). */
void dspark_gemm_bf16x_packed(const float *x, const uint16_t *wp, const float *bias, float *y, int64_t M,
                              int64_t N, int64_t K, int threads) {
    if (dspark_amx_available() && K % 32 == 0)
        dspark_gemm_bf16amx_packed(x, wp, bias, y, M, N, K, threads);
    else
        dspark_gemm_bf16dot_packed(x, wp, bias, y, M, N, K, threads);
}
