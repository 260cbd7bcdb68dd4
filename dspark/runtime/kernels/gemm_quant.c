/* y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) over a GGUF file's weights as stored:
 * the `gguf` precision. fp32 activations and accumulation; every weight is its exact
 * dequantized fp32 value (what ggml's dequantize_row_* and the `gguf` package give, and
 * so what transformers builds from the file).
 *
 * Block layouts (ggml-common.h), a row of K weights being K / block consecutive blocks:
 *   Q4_0  32: fp16 d, 16 bytes; low nibbles are weights 0-15, high 16-31; w = d (q - 8)
 *   Q4_1  32: fp16 d, fp16 m, 16 bytes as Q4_0;                        w = d q + m
 *   Q5_0  32: fp16 d, 32-bit mask of fifth bits, 16 bytes as Q4_0;       w = d (q - 16)
 *   Q5_1  32: fp16 d, fp16 m, mask, 16 bytes;                           w = d q + m
 *   Q8_0  32: fp16 d, 32 int8;                                          w = d q
 *   Q4_K 256: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes: eight
 *             sub-blocks of 32 (64 weights per 32 bytes: low nibbles then high);
 *             w = (d sc) q - (dmin m)
 *   Q5_K 256: as Q4_K plus 32 bytes of fifth bits (bit j of byte l: weight 32 j + l)
 *   Q6_K 256: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, fp16 d
 *             last; w = (d sc) (q - 32), sixteen sub-blocks of 16
 *   F32, F16, BF16: one weight per element (treated as blocks of 32 here).
 * Each product above is exact in fp32 (at most 11 + 7 + 6 significant bits), so the
 * only rounding is the one subtraction or addition of Q4_1, Q5_1, Q4_K and Q5_K, done
 * once in fp32 as ggml does.
 *
 * The matmul reads each weight row's blocks in place (no repacking: a Q4_K row streams
 * 0.5625 bytes a weight, Q5_0 0.6875, Q8_0 1.0625), dequantizes a tile of rows into a
 * per-thread fp32 scratch and runs dot products against it. Every output element is the
 * same sequence whatever M, the tile it falls in, the ISA and the thread count:
 *   sixteen lane sums s[l] = FMA chain over k = l, l + 16, l + 32, ... ascending from 0;
 *   then t[l] = s[l] + s[l + 8] (l < 8), u[l] = t[l] + t[l + 4], v[l] = u[l] + u[l + 2],
 *   r = v[0] + v[1], and r + bias[n] where there is a bias.
 * A token's logits therefore do not depend on what shares its step. The AVX-512 and
 * AVX2 variants and the scalar reference (`dspark_gemm_quant_ref`) compute exactly that,
 * bit for bit (tests/test_quant_kernels.py).
 *
 * A matrix is a descriptor of int64s: [segments, then per segment: ggml type, rows,
 * bytes per row, address of its first row] (a fused q|k|v projection is three
 * segments, possibly of three types).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels.h"

enum { GT_F32 = 0, GT_F16 = 1, GT_Q4_0 = 2, GT_Q4_1 = 3, GT_Q5_0 = 6, GT_Q5_1 = 7, GT_Q8_0 = 8, GT_Q4_K = 12,
       GT_Q5_K = 13, GT_Q6_K = 14, GT_BF16 = 30 };

#define T512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

static inline float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* Weights per block, and bytes per block, of a type (0: not readable here). */
int64_t dspark_quant_block(int type, int64_t *bytes) {
    int64_t b = 0, n = 32;
    switch (type) {
        case GT_F32: b = 128; break;
        case GT_F16: case GT_BF16: b = 64; break;
        case GT_Q4_0: b = 18; break;
        case GT_Q4_1: b = 20; break;
        case GT_Q5_0: b = 22; break;
        case GT_Q5_1: b = 24; break;
        case GT_Q8_0: b = 34; break;
        case GT_Q4_K: n = 256; b = 144; break;
        case GT_Q5_K: n = 256; b = 176; break;
        case GT_Q6_K: n = 256; b = 210; break;
        default: n = 0;
    }
    if (bytes) *bytes = b;
    return n;
}

static inline void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* One row of K weights (a multiple of the type's block) -> fp32, one weight at a time:
 * the reference the vector versions below are tested against (every value is exact or
 * rounded once, the same way, so any vector width gives the same bits). */
static void dequant_row_ref(int type, const uint8_t *row, int64_t K, float *restrict out) {
    int64_t bb;
    const int64_t bs = dspark_quant_block(type, &bb);
    const int64_t nb = K / bs;
    switch (type) {
        case GT_F32:
            memcpy(out, row, K * sizeof(float));
            return;
        case GT_F16:
            for (int64_t i = 0; i < K; i += 8)
                _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * i))));
            return;
        case GT_BF16:
            for (int64_t i = 0; i < K; i++) {
                uint32_t u = (uint32_t)((const uint16_t *)row)[i] << 16;
                memcpy(out + i, &u, 4);
            }
            return;
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bb;
        float *restrict y = out + b * bs;
        switch (type) {
            case GT_Q4_0: {
                const float d = h2f(blk);
                const uint8_t *qs = blk + 2;
                for (int j = 0; j < 16; j++) {
                    y[j] = d * (float)((int)(qs[j] & 15) - 8);
                    y[j + 16] = d * (float)((int)(qs[j] >> 4) - 8);
                }
                break;
            }
            case GT_Q4_1: {
                const float d = h2f(blk), m = h2f(blk + 2);
                const uint8_t *qs = blk + 4;
                for (int j = 0; j < 16; j++) {
                    y[j] = d * (float)(qs[j] & 15) + m;
                    y[j + 16] = d * (float)(qs[j] >> 4) + m;
                }
                break;
            }
            case GT_Q5_0: case GT_Q5_1: {
                const int one = type == GT_Q5_1;
                const float d = h2f(blk), m = one ? h2f(blk + 2) : 0.0f;
                uint32_t qh;
                memcpy(&qh, blk + 2 + 2 * one, 4);
                const uint8_t *qs = blk + 6 + 2 * one;
                if (one) {
                    for (int j = 0; j < 16; j++) {
                        y[j] = d * (float)((qs[j] & 15) | (((qh >> j) & 1) << 4)) + m;
                        y[j + 16] = d * (float)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) + m;
                    }
                } else {
                    for (int j = 0; j < 16; j++) {
                        y[j] = d * (float)((int)((qs[j] & 15) | (((qh >> j) & 1) << 4)) - 16);
                        y[j + 16] = d * (float)((int)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
                    }
                }
                break;
            }
            case GT_Q8_0: {
                const float d = h2f(blk);
                const int8_t *qs = (const int8_t *)(blk + 2);
                for (int j = 0; j < 32; j++) y[j] = d * (float)qs[j];
                break;
            }
            case GT_Q4_K: case GT_Q5_K: {
                const float d = h2f(blk), dmin = h2f(blk + 2);
                const uint8_t *scales = blk + 4;
                const int five = type == GT_Q5_K;
                const uint8_t *qh = blk + 16, *qs = blk + 16 + 32 * five;
                for (int g = 0; g < 4; g++) {
                    int sc1, m1, sc2, m2;
                    scale_min_k4(2 * g, scales, &sc1, &m1);
                    scale_min_k4(2 * g + 1, scales, &sc2, &m2);
                    const float d1 = d * (float)sc1, o1 = dmin * (float)m1;
                    const float d2 = d * (float)sc2, o2 = dmin * (float)m2;
                    const uint8_t *q = qs + 32 * g;
                    float *yy = y + 64 * g;
                    if (five) {
                        for (int l = 0; l < 32; l++) {
                            yy[l] = d1 * (float)((q[l] & 15) | (((qh[l] >> (2 * g)) & 1) << 4)) - o1;
                            yy[l + 32] = d2 * (float)((q[l] >> 4) | (((qh[l] >> (2 * g + 1)) & 1) << 4)) - o2;
                        }
                    } else {
                        for (int l = 0; l < 32; l++) {
                            yy[l] = d1 * (float)(q[l] & 15) - o1;
                            yy[l + 32] = d2 * (float)(q[l] >> 4) - o2;
                        }
                    }
                }
                break;
            }
            case GT_Q6_K: {
                const uint8_t *ql = blk, *qh = blk + 128;
                const int8_t *sc = (const int8_t *)(blk + 192);
                const float d = h2f(blk + 208);
                for (int half = 0; half < 2; half++) {
                    const uint8_t *l0 = ql + 64 * half, *h0 = qh + 32 * half;
                    const int8_t *s = sc + 8 * half;
                    float *yy = y + 128 * half;
                    for (int l = 0; l < 32; l++) {
                        const int is = l / 16;
                        yy[l] = (d * (float)s[is]) * (float)((int)((l0[l] & 15) | ((h0[l] & 3) << 4)) - 32);
                        yy[l + 32] = (d * (float)s[is + 2]) *
                                     (float)((int)((l0[l + 32] & 15) | (((h0[l] >> 2) & 3) << 4)) - 32);
                        yy[l + 64] = (d * (float)s[is + 4]) *
                                     (float)((int)((l0[l] >> 4) | (((h0[l] >> 4) & 3) << 4)) - 32);
                        yy[l + 96] = (d * (float)s[is + 6]) *
                                     (float)((int)((l0[l + 32] >> 4) | (((h0[l] >> 6) & 3) << 4)) - 32);
                    }
                }
                break;
            }
        }
    }
}

/* ---- vector dequantization: the same values, 16 (AVX-512) or 8 (AVX2) at a time ---- */

/* 16 bytes -> 16 int32 lanes (AVX-512) */
#define U8x16(p) _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p)))

static T512 void dq512(int type, const uint8_t *row, int64_t K, float *restrict out) {
    int64_t bb;
    const int64_t bs = dspark_quant_block(type, &bb), nb = K / bs;
    const __m512i f15 = _mm512_set1_epi32(15);
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    switch (type) {
        case GT_F16:
            for (int64_t i = 0; i < K; i += 16)
                _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * i))));
            return;
        /* 4- and 5-bit types: the block's 16 (32) possible values computed once, each
         * weight then one table lookup (vpermps uses the low 4 bits of each lane, so
         * the byte holding two nibbles is its own index for the low one) */
        case GT_Q4_0: case GT_Q4_1:
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * bb;
                const __m512 d = _mm512_set1_ps(h2f(blk));
                const __m512 table = type == GT_Q4_1 ? _mm512_fmadd_ps(d, iota, _mm512_set1_ps(h2f(blk + 2)))
                                                     : _mm512_mul_ps(d, _mm512_sub_ps(iota, _mm512_set1_ps(8.0f)));
                const __m512i v = U8x16(blk + 2 + 2 * (type == GT_Q4_1));
                _mm512_storeu_ps(out + 32 * b, _mm512_permutexvar_ps(v, table));
                _mm512_storeu_ps(out + 32 * b + 16, _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table));
            }
            return;
        case GT_Q5_0: case GT_Q5_1:
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * bb;
                const int one = type == GT_Q5_1;
                const __m512 d = _mm512_set1_ps(h2f(blk));
                __m512 t0, t1;  /* values of q = 0..15 and 16..31 */
                if (one) {
                    const __m512 m = _mm512_set1_ps(h2f(blk + 2));
                    t0 = _mm512_fmadd_ps(d, iota, m);
                    t1 = _mm512_fmadd_ps(d, _mm512_add_ps(iota, _mm512_set1_ps(16.0f)), m);
                } else {
                    t0 = _mm512_mul_ps(d, _mm512_sub_ps(iota, _mm512_set1_ps(16.0f)));
                    t1 = _mm512_mul_ps(d, iota);
                }
                uint32_t qh;
                memcpy(&qh, blk + 2 + 2 * one, 4);
                const __m512i v = U8x16(blk + 6 + 2 * one), sixteen = _mm512_set1_epi32(16);
                __m512i lo = _mm512_and_si512(v, f15), hi = _mm512_srli_epi32(v, 4);
                lo = _mm512_mask_or_epi32(lo, (__mmask16)(qh & 0xFFFF), lo, sixteen);
                hi = _mm512_mask_or_epi32(hi, (__mmask16)(qh >> 16), hi, sixteen);
                _mm512_storeu_ps(out + 32 * b, _mm512_permutex2var_ps(t0, lo, t1));
                _mm512_storeu_ps(out + 32 * b + 16, _mm512_permutex2var_ps(t0, hi, t1));
            }
            return;
        case GT_Q8_0:
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * bb;
                const __m512 d = _mm512_set1_ps(h2f(blk));
                for (int h = 0; h < 2; h++) {
                    const __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2 + 16 * h)));
                    _mm512_storeu_ps(out + 32 * b + 16 * h, _mm512_mul_ps(d, _mm512_cvtepi32_ps(q)));
                }
            }
            return;
        case GT_Q4_K: case GT_Q5_K:
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * bb;
                const float d = h2f(blk), dmin = h2f(blk + 2);
                const int five = type == GT_Q5_K;
                const uint8_t *qh = blk + 16, *qs = blk + 16 + 32 * five;
                float *y = out + 256 * b;
                const __m512 iota16 = _mm512_add_ps(iota, _mm512_set1_ps(16.0f));
                for (int g = 0; g < 4; g++) {
                    int sc1, m1, sc2, m2;
                    scale_min_k4(2 * g, blk + 4, &sc1, &m1);
                    scale_min_k4(2 * g + 1, blk + 4, &sc2, &m2);
                    const __m512 d1 = _mm512_set1_ps(d * (float)sc1), o1 = _mm512_set1_ps(dmin * (float)m1);
                    const __m512 d2 = _mm512_set1_ps(d * (float)sc2), o2 = _mm512_set1_ps(dmin * (float)m2);
                    /* w = (d sc) q - (dmin m): the product is exact, so the fused form rounds as ggml's */
                    const __m512 ta = _mm512_fmsub_ps(d1, iota, o1), tb = _mm512_fmsub_ps(d2, iota, o2);
                    if (!five) {
                        for (int h = 0; h < 2; h++) {
                            const __m512i v = U8x16(qs + 32 * g + 16 * h);
                            _mm512_storeu_ps(y + 64 * g + 16 * h, _mm512_permutexvar_ps(v, ta));
                            _mm512_storeu_ps(y + 64 * g + 32 + 16 * h,
                                             _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tb));
                        }
                        continue;
                    }
                    const __m512 ta1 = _mm512_fmsub_ps(d1, iota16, o1), tb1 = _mm512_fmsub_ps(d2, iota16, o2);
                    for (int h = 0; h < 2; h++) {
                        const __m512i v = U8x16(qs + 32 * g + 16 * h), vh = U8x16(qh + 16 * h);
                        const __m512i lo = _mm512_or_si512(_mm512_and_si512(v, f15), _mm512_slli_epi32(
                            _mm512_and_si512(_mm512_srli_epi32(vh, 2 * g), _mm512_set1_epi32(1)), 4));
                        const __m512i hi = _mm512_or_si512(_mm512_srli_epi32(v, 4), _mm512_slli_epi32(
                            _mm512_and_si512(_mm512_srli_epi32(vh, 2 * g + 1), _mm512_set1_epi32(1)), 4));
                        _mm512_storeu_ps(y + 64 * g + 16 * h, _mm512_permutex2var_ps(ta, lo, ta1));
                        _mm512_storeu_ps(y + 64 * g + 32 + 16 * h, _mm512_permutex2var_ps(tb, hi, tb1));
                    }
                }
            }
            return;
        case GT_Q6_K:
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * bb;
                const int8_t *sc = (const int8_t *)(blk + 192);
                const float d = h2f(blk + 208);
                const __m512i three = _mm512_set1_epi32(3), off = _mm512_set1_epi32(32);
                for (int half = 0; half < 2; half++) {
                    const uint8_t *l0 = blk + 64 * half, *h0 = blk + 128 + 32 * half;
                    const int8_t *s = sc + 8 * half;
                    float *y = out + 256 * b + 128 * half;
                    for (int h = 0; h < 2; h++) {  /* l = 16 h .. 16 h + 15 */
                        const __m512i a = U8x16(l0 + 16 * h), c = U8x16(l0 + 32 + 16 * h), q = U8x16(h0 + 16 * h);
                        const __m512i q1 = _mm512_or_si512(_mm512_and_si512(a, f15),
                                                           _mm512_slli_epi32(_mm512_and_si512(q, three), 4));
                        const __m512i q2 = _mm512_or_si512(_mm512_and_si512(c, f15), _mm512_slli_epi32(
                            _mm512_and_si512(_mm512_srli_epi32(q, 2), three), 4));
                        const __m512i q3 = _mm512_or_si512(_mm512_srli_epi32(a, 4), _mm512_slli_epi32(
                            _mm512_and_si512(_mm512_srli_epi32(q, 4), three), 4));
                        const __m512i q4 = _mm512_or_si512(_mm512_srli_epi32(c, 4), _mm512_slli_epi32(
                            _mm512_srli_epi32(q, 6), 4));
                        const __m512i qq[4] = {q1, q2, q3, q4};
                        for (int j = 0; j < 4; j++) {
                            const __m512 ds = _mm512_set1_ps(d * (float)s[h + 2 * j]);
                            _mm512_storeu_ps(y + 32 * j + 16 * h,
                                             _mm512_mul_ps(ds, _mm512_cvtepi32_ps(_mm512_sub_epi32(qq[j], off))));
                        }
                    }
                }
            }
            return;
        default:
            dequant_row_ref(type, row, K, out);
    }
}

/* 8 bytes -> 8 int32 lanes (AVX2) */
#define U8x8(p) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p)))

static void dq256(int type, const uint8_t *row, int64_t K, float *restrict out) {
    int64_t bb;
    const int64_t bs = dspark_quant_block(type, &bb), nb = K / bs;
    const __m256i f15 = _mm256_set1_epi32(15);
    switch (type) {
        case GT_Q4_0: case GT_Q4_1: case GT_Q5_0: case GT_Q5_1:
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * bb;
                const int one = type == GT_Q4_1 || type == GT_Q5_1, five = type == GT_Q5_0 || type == GT_Q5_1;
                const __m256 d = _mm256_set1_ps(h2f(blk));
                const __m256 m = _mm256_set1_ps(one ? h2f(blk + 2) : 0.0f);
                uint32_t qh = 0;
                if (five) memcpy(&qh, blk + 2 + 2 * one, 4);
                const uint8_t *qs = blk + 2 + 2 * one + 4 * five;
                const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
                const __m256i e = _mm256_set1_epi32(five ? 16 : 8);
                for (int h = 0; h < 2; h++) {
                    const __m256i v = U8x8(qs + 8 * h);
                    __m256i q[2] = {_mm256_and_si256(v, f15), _mm256_srli_epi32(v, 4)};
                    for (int n = 0; n < 2; n++) {  /* weights 16 n + 8 h .. + 7 */
                        if (five) {
                            const __m256i hb = _mm256_set1_epi32((int)((qh >> (16 * n + 8 * h)) & 0xFF));
                            const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(hb, bit), bit);
                            q[n] = _mm256_or_si256(q[n], _mm256_and_si256(set, _mm256_set1_epi32(16)));
                        }
                        __m256 w = one ? _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q[n]), m)
                                       : _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(q[n], e)));
                        _mm256_storeu_ps(out + 32 * b + 16 * n + 8 * h, w);
                    }
                }
            }
            return;
        case GT_Q8_0:
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * bb;
                const __m256 d = _mm256_set1_ps(h2f(blk));
                for (int h = 0; h < 4; h++) {
                    const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * h)));
                    _mm256_storeu_ps(out + 32 * b + 8 * h, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
                }
            }
            return;
        case GT_Q4_K: case GT_Q5_K:
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * bb;
                const float d = h2f(blk), dmin = h2f(blk + 2);
                const int five = type == GT_Q5_K;
                const uint8_t *qh = blk + 16, *qs = blk + 16 + 32 * five;
                float *y = out + 256 * b;
                for (int g = 0; g < 4; g++) {
                    int sc1, m1, sc2, m2;
                    scale_min_k4(2 * g, blk + 4, &sc1, &m1);
                    scale_min_k4(2 * g + 1, blk + 4, &sc2, &m2);
                    const __m256 d1 = _mm256_set1_ps(d * (float)sc1), o1 = _mm256_set1_ps(dmin * (float)m1);
                    const __m256 d2 = _mm256_set1_ps(d * (float)sc2), o2 = _mm256_set1_ps(dmin * (float)m2);
                    for (int h = 0; h < 4; h++) {
                        const __m256i v = U8x8(qs + 32 * g + 8 * h);
                        __m256i lo = _mm256_and_si256(v, f15), hi = _mm256_srli_epi32(v, 4);
                        if (five) {
                            const __m256i vh = U8x8(qh + 8 * h), one = _mm256_set1_epi32(1);
                            lo = _mm256_or_si256(lo, _mm256_slli_epi32(
                                _mm256_and_si256(_mm256_srli_epi32(vh, 2 * g), one), 4));
                            hi = _mm256_or_si256(hi, _mm256_slli_epi32(
                                _mm256_and_si256(_mm256_srli_epi32(vh, 2 * g + 1), one), 4));
                        }
                        _mm256_storeu_ps(y + 64 * g + 8 * h, _mm256_fmsub_ps(d1, _mm256_cvtepi32_ps(lo), o1));
                        _mm256_storeu_ps(y + 64 * g + 32 + 8 * h, _mm256_fmsub_ps(d2, _mm256_cvtepi32_ps(hi), o2));
                    }
                }
            }
            return;
        case GT_Q6_K:
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * bb;
                const int8_t *sc = (const int8_t *)(blk + 192);
                const float d = h2f(blk + 208);
                const __m256i three = _mm256_set1_epi32(3), off = _mm256_set1_epi32(32);
                for (int half = 0; half < 2; half++) {
                    const uint8_t *l0 = blk + 64 * half, *h0 = blk + 128 + 32 * half;
                    const int8_t *s = sc + 8 * half;
                    float *y = out + 256 * b + 128 * half;
                    for (int h = 0; h < 4; h++) {  /* l = 8 h .. 8 h + 7 */
                        const __m256i a = U8x8(l0 + 8 * h), c = U8x8(l0 + 32 + 8 * h), q = U8x8(h0 + 8 * h);
                        const __m256i qq[4] = {
                            _mm256_or_si256(_mm256_and_si256(a, f15), _mm256_slli_epi32(_mm256_and_si256(q, three), 4)),
                            _mm256_or_si256(_mm256_and_si256(c, f15),
                                            _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(q, 2), three), 4)),
                            _mm256_or_si256(_mm256_srli_epi32(a, 4),
                                            _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(q, 4), three), 4)),
                            _mm256_or_si256(_mm256_srli_epi32(c, 4), _mm256_slli_epi32(_mm256_srli_epi32(q, 6), 4))};
                        for (int j = 0; j < 4; j++) {
                            const __m256 ds = _mm256_set1_ps(d * (float)s[h / 2 + 2 * j]);
                            _mm256_storeu_ps(y + 32 * j + 8 * h,
                                             _mm256_mul_ps(ds, _mm256_cvtepi32_ps(_mm256_sub_epi32(qq[j], off))));
                        }
                    }
                }
            }
            return;
        default:
            dequant_row_ref(type, row, K, out);
    }
}

/* 0: the one-at-a-time reference, 256 / 512: the vector versions (tests compare them) */
static int dequant_isa = -1;

void dspark_quant_set_dequant(int isa) { dequant_isa = isa; }

static void dequant_row(int type, const uint8_t *row, int64_t K, float *restrict out) {
    const int isa = dequant_isa >= 0 ? dequant_isa : dspark_gemm_bf16w_isa();
    if (isa == 512) dq512(type, row, K, out);
    else if (isa == 256) dq256(type, row, K, out);
    else dequant_row_ref(type, row, K, out);
}

/* The exact fp32 values of `rows` rows (for tests and for embeddings). */
void dspark_dequant_rows(int type, const uint8_t *data, int64_t row_bytes, int64_t rows, int64_t K, float *out) {
    for (int64_t r = 0; r < rows; r++) dequant_row(type, data + r * row_bytes, K, out + r * K);
}

/* The reduction every variant ends with (see the top of this file). */
static inline float reduce16(const float *s) {
    float t[8], u[4], v[2];
    for (int l = 0; l < 8; l++) t[l] = s[l] + s[l + 8];
    for (int l = 0; l < 4; l++) u[l] = t[l] + t[l + 4];
    for (int l = 0; l < 2; l++) v[l] = u[l] + u[l + 2];
    return v[0] + v[1];
}

static inline float reduce256(__m256 lo, __m256 hi) {
    __m256 t = _mm256_add_ps(lo, hi);
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)));
}

/* ---- micro-kernels: MR rows of x against NC dequantized rows w [NC][K] ------------- */
static inline __attribute__((always_inline)) T512 void micro512(const float *x, int64_t ldx, const float *w,
                                                                 int64_t K, float *y, int64_t ldy,
                                                                 const float *bias, int MR, int NC) {
    __m512 acc[6][8];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NC; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
        __m512 wv[8];
#pragma GCC unroll 8
        for (int j = 0; j < NC; j++) wv[j] = _mm512_loadu_ps(w + j * K + k);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m512 xv = _mm512_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 8
            for (int j = 0; j < NC; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NC; j++) {
            float r = reduce256(_mm512_castps512_ps256(acc[i][j]), _mm512_extractf32x8_ps(acc[i][j], 1));
            y[i * ldy + j] = bias ? r + bias[j] : r;
        }
}

static inline __attribute__((always_inline)) void micro256(const float *x, int64_t ldx, const float *w, int64_t K,
                                                           float *y, int64_t ldy, const float *bias, int MR,
                                                           int NC) {
    __m256 acc[3][4][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NC; j++) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m256 x0 = _mm256_loadu_ps(x + i * ldx + k), x1 = _mm256_loadu_ps(x + i * ldx + k + 8);
#pragma GCC unroll 8
            for (int j = 0; j < NC; j++) {
                acc[i][j][0] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w + j * K + k), acc[i][j][0]);
                acc[i][j][1] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(w + j * K + k + 8), acc[i][j][1]);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NC; j++) {
            float r = reduce256(acc[i][j][0], acc[i][j][1]);
            y[i * ldy + j] = bias ? r + bias[j] : r;
        }
}

/* Every row of x against `nc` (<= 8) dequantized rows: tiles of rows by columns, their
 * shapes chosen for registers only (each output's sequence is the same in all). */
static T512 void tile512(const float *x, int64_t M, const float *w, int nc, int64_t K, float *y, int64_t ldy,
                         const float *bias) {
    for (int64_t m = 0; m < M;) {
        const int64_t r = M - m;
        const float *xm = x + m * K;
        float *ym = y + m * ldy;
        if (r <= 2) {  /* one or two rows: all 8 columns at once, 8 or 16 chains */
            for (int j = 0; j < nc;) {
                const int take = nc - j;
                const float *b = bias ? bias + j : 0;
#define C(mr, n) micro512(xm, K, w + j * K, K, ym + j, ldy, b, mr, n)
                if (r == 2) {
                    if (take >= 8) { C(2, 8); j += 8; } else if (take >= 4) { C(2, 4); j += 4; }
                    else if (take >= 2) { C(2, 2); j += 2; } else { C(2, 1); j += 1; }
                } else {
                    if (take >= 8) { C(1, 8); j += 8; } else if (take >= 4) { C(1, 4); j += 4; }
                    else if (take >= 2) { C(1, 2); j += 2; } else { C(1, 1); j += 1; }
                }
            }
            m += r;
            continue;
        }
        const int mr = r >= 6 ? 6 : (int)r;
        for (int j = 0; j < nc;) {
            const int take = nc - j;
            const float *b = bias ? bias + j : 0;
#define ROWS(n)                                              \
    switch (mr) {                                            \
        case 6: C(6, n); break;                              \
        case 5: C(5, n); break;                              \
        case 4: C(4, n); break;                              \
        default: C(3, n); break;                             \
    }
            if (take >= 4) { ROWS(4) j += 4; } else if (take >= 2) { ROWS(2) j += 2; } else { ROWS(1) j += 1; }
#undef ROWS
#undef C
        }
        m += mr;
    }
}

static void tile256(const float *x, int64_t M, const float *w, int nc, int64_t K, float *y, int64_t ldy,
                    const float *bias) {
    for (int64_t m = 0; m < M;) {
        const int64_t r = M - m;
        const int mr = r >= 3 ? 3 : (int)r;
        const float *xm = x + m * K;
        float *ym = y + m * ldy;
        for (int j = 0; j < nc;) {
            const int take = nc - j;
            const float *b = bias ? bias + j : 0;
#define C(mr_, n) micro256(xm, K, w + j * K, K, ym + j, ldy, b, mr_, n)
            if (mr == 1) {
                if (take >= 4) { C(1, 4); j += 4; } else if (take >= 2) { C(1, 2); j += 2; } else { C(1, 1); j += 1; }
            } else if (mr == 2) {
                if (take >= 2) { C(2, 2); j += 2; } else { C(2, 1); j += 1; }
            } else {
                if (take >= 2) { C(3, 2); j += 2; } else { C(3, 1); j += 1; }
            }
#undef C
        }
        m += mr;
    }
}

/* ---- decode (one or two rows): dequantization fused into the dot products --------- */

/* Weights [32 u, 32 u + 32) of a row as two vectors: the values dq512 stores, made in
 * registers (the scratch's store and reload would cost as much as the dequantization). */
static inline __attribute__((always_inline)) T512 void unit512(int type, const uint8_t *row, int64_t u,
                                                                __m512 *w0, __m512 *w1) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i f15 = _mm512_set1_epi32(15);
    switch (type) {
        case GT_Q4_0: case GT_Q4_1: {
            const int one = type == GT_Q4_1;
            const uint8_t *blk = row + u * (18 + 2 * one);
            const __m512 d = _mm512_set1_ps(h2f(blk));
            const __m512 table = one ? _mm512_fmadd_ps(d, iota, _mm512_set1_ps(h2f(blk + 2)))
                                     : _mm512_mul_ps(d, _mm512_sub_ps(iota, _mm512_set1_ps(8.0f)));
            const __m512i v = U8x16(blk + 2 + 2 * one);
            *w0 = _mm512_permutexvar_ps(v, table);
            *w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
            return;
        }
        case GT_Q5_0: case GT_Q5_1: {
            const int one = type == GT_Q5_1;
            const uint8_t *blk = row + u * (22 + 2 * one);
            const __m512 d = _mm512_set1_ps(h2f(blk));
            __m512 t0, t1;
            if (one) {
                const __m512 m = _mm512_set1_ps(h2f(blk + 2));
                t0 = _mm512_fmadd_ps(d, iota, m);
                t1 = _mm512_fmadd_ps(d, _mm512_add_ps(iota, _mm512_set1_ps(16.0f)), m);
            } else {
                t0 = _mm512_mul_ps(d, _mm512_sub_ps(iota, _mm512_set1_ps(16.0f)));
                t1 = _mm512_mul_ps(d, iota);
            }
            uint32_t qh;
            memcpy(&qh, blk + 2 + 2 * one, 4);
            const __m512i v = U8x16(blk + 6 + 2 * one), sixteen = _mm512_set1_epi32(16);
            const __m512i lo = _mm512_mask_or_epi32(_mm512_and_si512(v, f15), (__mmask16)(qh & 0xFFFF),
                                                    _mm512_and_si512(v, f15), sixteen);
            const __m512i hi = _mm512_mask_or_epi32(_mm512_srli_epi32(v, 4), (__mmask16)(qh >> 16),
                                                    _mm512_srli_epi32(v, 4), sixteen);
            *w0 = _mm512_permutex2var_ps(t0, lo, t1);
            *w1 = _mm512_permutex2var_ps(t0, hi, t1);
            return;
        }
        case GT_Q8_0: {
            const uint8_t *blk = row + u * 34;
            const __m512 d = _mm512_set1_ps(h2f(blk));
            *w0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2)))));
            *w1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18)))));
            return;
        }
        case GT_Q4_K: case GT_Q5_K: {
            const int five = type == GT_Q5_K, sub = (int)(u & 7), g = sub >> 1;
            const uint8_t *blk = row + (u >> 3) * (144 + 32 * five);
            int sc, m;
            scale_min_k4(sub, blk + 4, &sc, &m);
            const __m512 ds = _mm512_set1_ps(h2f(blk) * (float)sc), dm = _mm512_set1_ps(h2f(blk + 2) * (float)m);
            const uint8_t *qs = blk + 16 + 32 * five + 32 * g;
            const __m512 t0 = _mm512_fmsub_ps(ds, iota, dm);
            __m512i a = U8x16(qs), b = U8x16(qs + 16);
            if (sub & 1) {
                a = _mm512_srli_epi32(a, 4);
                b = _mm512_srli_epi32(b, 4);
            }
            if (!five) {
                *w0 = _mm512_permutexvar_ps(a, t0);
                *w1 = _mm512_permutexvar_ps(b, t0);
                return;
            }
            const __m512 t1 = _mm512_fmsub_ps(ds, _mm512_add_ps(iota, _mm512_set1_ps(16.0f)), dm);
            const __m512i one = _mm512_set1_epi32(1);
            const __m512i ha = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(U8x16(blk + 16), sub), one), 4);
            const __m512i hb = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(U8x16(blk + 32), sub), one), 4);
            *w0 = _mm512_permutex2var_ps(t0, _mm512_or_si512(_mm512_and_si512(a, f15), ha), t1);
            *w1 = _mm512_permutex2var_ps(t0, _mm512_or_si512(_mm512_and_si512(b, f15), hb), t1);
            return;
        }
        case GT_Q6_K: {
            /* unit u: half h = (u & 7) >> 2 of its block, quarter j = u & 3 (weights 32 j .. of the half) */
            const uint8_t *blk = row + (u >> 3) * 210;
            const int h = (int)((u & 7) >> 2), j = (int)(u & 3);
            const uint8_t *l0 = blk + 64 * h + 32 * (j & 1), *h0 = blk + 128 + 32 * h;
            const int8_t *s = (const int8_t *)(blk + 192) + 8 * h + 2 * j;
            const float d = h2f(blk + 208);
            const __m512i three = _mm512_set1_epi32(3), off = _mm512_set1_epi32(32);
            for (int half = 0; half < 2; half++) {
                __m512i a = U8x16(l0 + 16 * half), q = U8x16(h0 + 16 * half);
                a = j >= 2 ? _mm512_srli_epi32(a, 4) : _mm512_and_si512(a, f15);
                q = _mm512_and_si512(_mm512_srli_epi32(q, 2 * j), three);
                const __m512 w = _mm512_mul_ps(_mm512_set1_ps(d * (float)s[half]),
                                               _mm512_cvtepi32_ps(_mm512_sub_epi32(
                                                   _mm512_or_si512(a, _mm512_slli_epi32(q, 4)), off)));
                if (half) *w1 = w;
                else *w0 = w;
            }
            return;
        }
    }
}

/* MR (1 or 2) rows of x against NC rows of W starting at `rows`, all of K. */
static inline __attribute__((always_inline)) T512 void fused512(int type, const float *x, int64_t K,
                                                                 const uint8_t *rows, int64_t rb, float *y,
                                                                 int64_t ldy, const float *bias, int MR, int NC) {
    __m512 acc[2][8];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NC; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t u = 0; u < K / 32; u++) {
#pragma GCC unroll 8
        for (int j = 0; j < NC; j++) {
            __m512 w0, w1;
            unit512(type, rows + j * rb, u, &w0, &w1);
#pragma GCC unroll 2
            for (int i = 0; i < MR; i++) {
                acc[i][j] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i * K + 32 * u), w0, acc[i][j]);
                acc[i][j] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i * K + 32 * u + 16), w1, acc[i][j]);
            }
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NC; j++) {
            float r = reduce256(_mm512_castps512_ps256(acc[i][j]), _mm512_extractf32x8_ps(acc[i][j], 1));
            y[i * ldy + j] = bias ? r + bias[j] : r;
        }
}

/* Whether a type has a fused path. */
static int fused_type(int type) {
    return type == GT_Q4_0 || type == GT_Q4_1 || type == GT_Q5_0 || type == GT_Q5_1 || type == GT_Q8_0 ||
           type == GT_Q4_K || type == GT_Q5_K || type == GT_Q6_K;
}

/* Columns [c, c + nc) of one segment for M (1 or 2) rows: 8 (one row) or 4 (two rows)
 * columns at a time, then one at a time. */
static T512 void fused_cols(int type, const float *x, int64_t M, int64_t K, const uint8_t *data, int64_t rb,
                            int64_t c, int64_t nc, float *y, int64_t ldy, const float *bias) {
    const int wide = M == 1 ? 8 : 4;
    int64_t j = 0;
#define F(t, mr, n) fused512(t, x, K, data + (c + j) * rb, rb, y + j, ldy, bias ? bias + j : 0, mr, n)
#define TYPES(mr, n)                                                   \
    switch (type) {                                                    \
        case GT_Q4_0: F(GT_Q4_0, mr, n); break;                        \
        case GT_Q4_1: F(GT_Q4_1, mr, n); break;                        \
        case GT_Q5_0: F(GT_Q5_0, mr, n); break;                        \
        case GT_Q5_1: F(GT_Q5_1, mr, n); break;                        \
        case GT_Q8_0: F(GT_Q8_0, mr, n); break;                        \
        case GT_Q4_K: F(GT_Q4_K, mr, n); break;                        \
        case GT_Q5_K: F(GT_Q5_K, mr, n); break;                        \
        default: F(GT_Q6_K, mr, n); break;                             \
    }
    for (; j + wide <= nc; j += wide) {
        if (M == 1) { TYPES(1, 8) } else { TYPES(2, 4) }
    }
    for (; j < nc; j++) {
        if (M == 1) { TYPES(1, 1) } else { TYPES(2, 1) }
    }
#undef TYPES
#undef F
}

/* 512: the AVX-512 micro-kernels, 256: AVX2; follows the bf16w kernel's choice. */
static int quant_isa(void) { return dspark_gemm_bf16w_isa(); }

/* A thread's scratch of at least n floats, kept between calls (a fresh 150 KB block
 * per call would be an mmap and munmap for each matmul of a decode step). */
static float *scratch(int64_t n) {
    static __thread float *buf;
    static __thread int64_t cap;
    if (n > cap) {
        free(buf);
        cap = (n + 1023) / 1024 * 1024;
        buf = aligned_alloc(64, (size_t)cap * sizeof(float));
        if (!buf) cap = 0;
    }
    return buf;
}

/* Columns dequantized per tile: 8 rows of W (8 dot products for one row of x). */
#define NC_TILE 8

/* Checks a descriptor: every type readable, K a multiple of its block. Returns the
 * total rows, or -1. */
int64_t dspark_quant_rows(const int64_t *desc, int64_t K) {
    int64_t n = 0;
    for (int64_t s = 0; s < desc[0]; s++) {
        const int64_t *g = desc + 1 + 4 * s;
        int64_t bb;
        const int64_t bs = dspark_quant_block((int)g[0], &bb);
        if (!bs || K % bs || K % 16 || g[2] != K / bs * bb) return -1;
        n += g[1];
    }
    return n;
}

/* 0: decode through the scratch like any M (for tests: both give the same bits) */
static int fuse = 1;

void dspark_quant_set_fused(int on) { fuse = on; }

static void gemm_quant(const float *x, const int64_t *desc, const float *bias, float *y, int64_t M, int64_t N,
                       int64_t K, int threads, int isa) {
    const int64_t tiles_total = (N + NC_TILE - 1) / NC_TILE + desc[0];  /* an upper bound over segments */
    if (threads < 1) threads = 1;
    if (threads > tiles_total) threads = (int)tiles_total;
#pragma omp parallel num_threads(threads)
    {
#ifdef _OPENMP
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        const int t = 0, nt = 1;
#endif
        float *w = scratch(NC_TILE * K);
        /* this thread's columns: [N t / nt, N (t + 1) / nt), cut at NC_TILE multiples */
        const int64_t c0 = (N * t / nt) / NC_TILE * NC_TILE;
        const int64_t c1 = t == nt - 1 ? N : (N * (t + 1) / nt) / NC_TILE * NC_TILE;
        int64_t base = 0;
        for (int64_t s = 0; s < desc[0] && w; s++) {
            const int64_t *g = desc + 1 + 4 * s;
            const int type = (int)g[0];
            const int64_t rows = g[1], rb = g[2];
            const uint8_t *data = (const uint8_t *)(intptr_t)g[3];
            int64_t lo = c0 > base ? c0 : base, hi = c1 < base + rows ? c1 : base + rows;
            if (isa == 512 && M <= 2 && fused_type(type) && fuse) {
                if (hi > lo)
                    fused_cols(type, x, M, K, data, rb, lo - base, hi - lo, y + lo, N, bias ? bias + lo : 0);
                base += rows;
                continue;
            }
            for (int64_t c = lo; c < hi; c += NC_TILE) {
                const int nc = (int)(hi - c < NC_TILE ? hi - c : NC_TILE);
                for (int j = 0; j < nc; j++) dequant_row(type, data + (c - base + j) * rb, K, w + j * K);
                const float *b = bias ? bias + c : 0;
                if (isa == 512) tile512(x, M, w, nc, K, y + c, N, b);
                else tile256(x, M, w, nc, K, y + c, N, b);
            }
            base += rows;
        }
    }
}

void dspark_gemm_quant(const float *x, const int64_t *desc, const float *bias, float *y, int64_t M, int64_t N,
                       int64_t K, int threads) {
    gemm_quant(x, desc, bias, y, M, N, K, threads, quant_isa());
}

/* The scalar reference: the same sequence per output, one element at a time. */
void dspark_gemm_quant_ref(const float *x, const int64_t *desc, const float *bias, float *y, int64_t M, int64_t N,
                           int64_t K) {
    float *w = malloc((size_t)K * sizeof(float));
    int64_t n = 0;
    for (int64_t s = 0; s < desc[0] && w; s++) {
        const int64_t *g = desc + 1 + 4 * s;
        for (int64_t r = 0; r < g[1]; r++, n++) {
            dequant_row((int)g[0], (const uint8_t *)(intptr_t)g[3] + r * g[2], K, w);
            for (int64_t m = 0; m < M; m++) {
                float acc[16] = {0};
                for (int64_t k = 0; k < K; k += 16)
                    for (int l = 0; l < 16; l++) acc[l] = __builtin_fmaf(x[m * K + k + l], w[k + l], acc[l]);
                const float v = reduce16(acc);
                y[m * N + n] = bias ? v + bias[n] : v;
            }
        }
    }
    free(w);
}
