/* The q8x matmul's groups for CPUs with AVX512-VNNI (q8x_groups.h with Q8X_VNNI 1: one
 * vpdpbusd per four products of a row, where AVX2 needs vpmaddubsw, vpmaddwd and adds, and
 * vpsignb for the signed types). Used when the CPU has avx512vnni and avx512vl and the
 * AVX-512 variant is selected (`set_gemm_isa`); the same bits as the AVX2 code. */
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#define Q8X_VNNI 1
#include "q8x_groups.h"
#include "kernels.h"

int dspark_q8x_vnni_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

void dspark_q8x_groups_vnni(int type, const int8_t *q, const float *dx, const float *sx, const int32_t *S, int64_t M,
                            int64_t K, const uint8_t *data, int64_t gb, int64_t rows, int64_t g0, int64_t g1, float *y,
                            int64_t ldy, const float *bias) {
    panel_groups(type, q, dx, sx, S, M, K, data, gb, rows, g0, g1, y, ldy, bias);
}
