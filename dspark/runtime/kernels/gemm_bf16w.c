/* y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]): fp32 activations, bf16 weights,
 * fp32 accumulation, for AVX2 + FMA CPUs (and an AVX-512 variant giving the same bits).
 *
 * Decode on a CPU is bound by reading the weights; bf16 weights halve that traffic,
 * and widening bf16 to fp32 is a 16-bit shift, so it costs almost nothing in the
 * inner loop. The matmul itself (panels, tiles, the order of operations that makes it
 * batch-invariant) is gemm_panels.h, shared with the fp32-weight kernel (gemm_f32w.c);
 * this file gives it the bf16 panel-row loads and holds the choice of variant.
 *
 * Within a panel the 16 columns are stored in the order 0-3, 8-11, 4-7, 12-15, so
 * that unpacking the low and the high 16-bit halves of one 256-bit load against zero
 * (which widens bf16 to fp32 in the same instruction) yields columns 0-7 and 8-15.
 * The AVX-512 variant widens a panel row and puts it back in column order with one
 * masked word permutation. `dspark_gemm_bf16w_set_isa` picks the variant (for tests
 * and A/B runs), by default the widest the CPU has; the fp32-weight kernel follows it.
 *
 * Built on first use by dspark/runtime/cpu_kernels.py (cc -O3 -mavx2 -mfma -fopenmp).
 */
#include <immintrin.h>
#include <stdint.h>

#define WT uint16_t
#define GEMM_PACKED dspark_gemm_bf16w_packed

static inline __attribute__((always_inline)) void load_panel_row(const uint16_t *p, __m256 *lo, __m256 *hi) {
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    __m256i z = _mm256_setzero_si256();
    *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v));
    *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v));
}

/* Word permutation that widens a panel row (16 bf16 in the low 256 bits, stored order
 * 0-3, 8-11, 4-7, 12-15) into 16 fp32 in column order: column j's bf16 goes to the
 * high half of dword j, the low halves are zeroed by the mask. */
static const uint16_t WIDEN_IDX[32] = {0, 0, 0, 1, 0, 2, 0, 3, 0, 8, 0, 9, 0, 10, 0, 11,
                                       0, 4, 0, 5, 0, 6, 0, 7, 0, 12, 0, 13, 0, 14, 0, 15};

static inline __attribute__((always_inline)) __attribute__((target("avx512f,avx512bw"))) __m512 widen16(const uint16_t *p, __m512i idx) {
    __m512i v = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, idx, v));
}

#define PANEL512_SETUP const __m512i idx = _mm512_loadu_si512((const void *)WIDEN_IDX);
#define PANEL512_LOAD(p) widen16((p), idx)

/* 512: the AVX-512 variant, 256: AVX2; 0 until first use (then the widest available). */
static int gemm_isa = 0;

static int cpu_has_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
}

/* Select the variant: 512 or 256 (512 falls back to 256 where the CPU lacks AVX-512);
 * any other value, the widest available. Returns the one in use. */
int dspark_gemm_bf16w_set_isa(int isa) {
    int wide = cpu_has_avx512();
    gemm_isa = isa == 256 ? 256 : (wide ? 512 : 256);
    return gemm_isa;
}

int dspark_gemm_bf16w_isa(void) {
    if (!gemm_isa) dspark_gemm_bf16w_set_isa(0);
    return gemm_isa;
}

#include "gemm_panels.h"
