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
 * The matmul reads each row's blocks in a repacked layout (below: the scales in fp32,
 * the quants as stored; a Q4_K row streams 0.75 bytes a weight, Q5_0 0.75, Q8_0 1.125).
 * One or two rows of x (decode) take the dequantized weights straight into the dot
 * products; more rows dequantize a tile of W rows into a per-thread fp32 scratch once
 * and run every row of x against it. Every output element is the
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

/* The layouts the kernel reads (repacked once from a file's blocks by
 * dspark_quant_repack): each fp16 scale or min converted to fp32 and each K-type
 * sub-block's scale and min multiplied out (d sc, dmin m: exact in fp32), so the hot
 * loop broadcasts them from memory instead of converting and decoding them for every
 * column it reads. Per block (R = repacked):
 *   R_Q4_0  32: f32 d, 16 bytes              R_Q4_1  32: f32 d, f32 m, 16 bytes
 *   R_Q5_0  32: f32 d, 32 int8 (q - 16)      R_Q5_1  32: f32 d, f32 m, 32 int8 (q)
 *   R_Q8_0  32: f32 d, 32 int8
 *   R_Q4_K 256: f32 ds[8], f32 dm[8], the 128 bytes of quants as stored
 *   R_Q5_K 256: f32 ds[8], f32 dm[8], 256 int8 (q)
 *   R_Q6_K 256: f32 ds[16], 256 int8 (q - 32)
 * The 5- and 6-bit quants are widened to a byte each (a third or a half more bytes read):
 * assembling them from their bit planes cost more than the dot products they feed.
 * F32, F16 and BF16 rows are read as stored. */
enum { R_OFF = 100, R_Q4_0 = 102, R_Q4_1 = 103, R_Q5_0 = 106, R_Q5_1 = 107, R_Q8_0 = 108, R_Q4_K = 112,
       R_Q5_K = 113, R_Q6_K = 114 };

#define T512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

static inline float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static inline float f32at(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

/* Weights per block and bytes per block of a file's type or a repacked one (0: not
 * readable here). */
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
        case R_Q4_0: b = 20; break;
        case R_Q4_1: b = 24; break;
        case R_Q5_0: b = 36; break;
        case R_Q5_1: b = 40; break;
        case R_Q8_0: b = 36; break;
        case R_Q4_K: n = 256; b = 192; break;
        case R_Q5_K: n = 256; b = 320; break;
        case R_Q6_K: n = 256; b = 320; break;
        default: n = 0;
    }
    if (bytes) *bytes = b;
    return n;
}

/* The type the kernel reads for a file's type (itself for F32, F16, BF16). */
int dspark_quant_repacked_type(int type) {
    return type == GT_F32 || type == GT_F16 || type == GT_BF16 ? type : R_OFF + type;
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

/* rows of a file's blocks (src, src_row bytes each) -> the repacked layout (dst). */
void dspark_quant_repack(int type, const uint8_t *src, int64_t src_row, int64_t rows, int64_t K, uint8_t *dst) {
    const int rtype = dspark_quant_repacked_type(type);
    int64_t sb, rb;
    const int64_t bs = dspark_quant_block(type, &sb);
    dspark_quant_block(rtype, &rb);
    const int64_t nb = K / bs;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *in = src + r * src_row;
        uint8_t *out = dst + r * nb * rb;
        if (rtype == type) {
            memcpy(out, in, nb * sb);
            continue;
        }
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *s = in + b * sb;
            uint8_t *o = out + b * rb;
            float f[16];
            switch (type) {
                case GT_Q4_0: case GT_Q8_0:  /* d; the rest as stored */
                    f[0] = h2f(s);
                    memcpy(o, f, 4);
                    memcpy(o + 4, s + 2, sb - 2);
                    break;
                case GT_Q4_1:  /* d, m; the rest as stored */
                    f[0] = h2f(s);
                    f[1] = h2f(s + 2);
                    memcpy(o, f, 8);
                    memcpy(o + 8, s + 4, sb - 4);
                    break;
                case GT_Q5_0: case GT_Q5_1: {  /* d (, m), one byte a weight: q - 16 (q) */
                    const int one = type == GT_Q5_1;
                    f[0] = h2f(s);
                    f[1] = one ? h2f(s + 2) : 0.0f;
                    memcpy(o, f, 4 + 4 * one);
                    uint32_t qh;
                    memcpy(&qh, s + 2 + 2 * one, 4);
                    const uint8_t *qs = s + 6 + 2 * one;
                    int8_t *q = (int8_t *)(o + 4 + 4 * one);
                    for (int j = 0; j < 16; j++) {
                        q[j] = (int8_t)(((qs[j] & 15) | (((qh >> j) & 1) << 4)) - (one ? 0 : 16));
                        q[j + 16] = (int8_t)(((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - (one ? 0 : 16));
                    }
                    break;
                }
                case GT_Q4_K: case GT_Q5_K: {
                    const float d = h2f(s), dmin = h2f(s + 2);
                    for (int j = 0; j < 8; j++) {
                        int sc, m;
                        scale_min_k4(j, s + 4, &sc, &m);
                        f[j] = d * (float)sc;
                        f[8 + j] = dmin * (float)m;
                    }
                    memcpy(o, f, 64);
                    if (type == GT_Q4_K) {
                        memcpy(o + 64, s + 16, 128);
                        break;
                    }
                    for (int sub = 0; sub < 8; sub++)  /* Q5_K: one byte a weight, in weight order */
                        for (int l = 0; l < 32; l++) {
                            const uint8_t b = s[48 + 32 * (sub >> 1) + l];
                            o[64 + 32 * sub + l] = (uint8_t)((sub & 1 ? b >> 4 : b & 15) | (((s[16 + l] >> sub) & 1) << 4));
                        }
                    break;
                }
                case GT_Q6_K: {  /* ds[16], then q - 32 a byte each, in weight order */
                    const float d = h2f(s + 208);
                    for (int j = 0; j < 16; j++) f[j] = d * (float)((const int8_t *)(s + 192))[j];
                    memcpy(o, f, 64);
                    int8_t *q = (int8_t *)(o + 64);
                    for (int half = 0; half < 2; half++) {
                        const uint8_t *ql = s + 64 * half, *qh = s + 128 + 32 * half;
                        int8_t *qq = q + 128 * half;
                        for (int l = 0; l < 32; l++) {
                            qq[l] = (int8_t)((int)((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32);
                            qq[l + 32] = (int8_t)((int)((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
                            qq[l + 64] = (int8_t)((int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                            qq[l + 96] = (int8_t)((int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                        }
                    }
                    break;
                }
            }
        }
    }
}

/* One row of K weights of a repacked (or float) type -> fp32, one weight at a time:
 * the reference the vector code is tested against (every value exact or rounded once,
 * as ggml rounds it, so any vector width gives the same bits). */
static void dequant_row_ref(int type, const uint8_t *row, int64_t K, float *restrict out) {
    int64_t bb;
    const int64_t bs = dspark_quant_block(type, &bb), nb = K / bs;
    switch (type) {
        case GT_F32:
            memcpy(out, row, K * sizeof(float));
            return;
        case GT_F16:
            for (int64_t i = 0; i < K; i++) out[i] = h2f(row + 2 * i);
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
            case R_Q4_0: case R_Q4_1: {
                const int one = type == R_Q4_1;
                const float d = f32at(blk), m = one ? f32at(blk + 4) : 0.0f;
                const uint8_t *qs = blk + 4 + 4 * one;
                for (int j = 0; j < 16; j++) {
                    y[j] = one ? d * (float)(qs[j] & 15) + m : d * (float)((int)(qs[j] & 15) - 8);
                    y[j + 16] = one ? d * (float)(qs[j] >> 4) + m : d * (float)((int)(qs[j] >> 4) - 8);
                }
                break;
            }
            case R_Q5_0: case R_Q5_1: {
                const int one = type == R_Q5_1;
                const float d = f32at(blk), m = one ? f32at(blk + 4) : 0.0f;
                const int8_t *q = (const int8_t *)(blk + 4 + 4 * one);
                for (int j = 0; j < 32; j++) y[j] = one ? d * (float)q[j] + m : d * (float)q[j];
                break;
            }
            case R_Q8_0: {
                const float d = f32at(blk);
                for (int j = 0; j < 32; j++) y[j] = d * (float)((const int8_t *)(blk + 4))[j];
                break;
            }
            case R_Q4_K: {
                for (int sub = 0; sub < 8; sub++) {
                    const float ds = f32at(blk + 4 * sub), dm = f32at(blk + 32 + 4 * sub);
                    const uint8_t *q = blk + 64 + 32 * (sub >> 1);
                    for (int l = 0; l < 32; l++) y[32 * sub + l] = ds * (float)(sub & 1 ? q[l] >> 4 : q[l] & 15) - dm;
                }
                break;
            }
            case R_Q5_K: {
                for (int l = 0; l < 256; l++)
                    y[l] = f32at(blk + 4 * (l / 32)) * (float)blk[64 + l] - f32at(blk + 32 + 4 * (l / 32));
                break;
            }
            case R_Q6_K: {
                const int8_t *q = (const int8_t *)(blk + 64);
                for (int l = 0; l < 256; l++) y[l] = f32at(blk + 4 * (l / 16)) * (float)q[l];
                break;
            }
        }
    }
}

/* ---- vector dequantization: 32 weights (one unit) as two AVX-512 vectors ----------- */

/* 16 bytes -> 16 int32 lanes */
#define U8x16(p) _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p)))

/* Weights [32 u, 32 u + 32) of a repacked row, each the fp32 value the reference
 * computes: the 4-bit types by a table of the block's 16 possible values (vpermps reads
 * the low 4 bits of each lane, so the byte holding two nibbles is its own index for the
 * low one), the byte-wide ones by conversion and scale. */
static inline __attribute__((always_inline)) T512 void unit512(int type, const uint8_t *row, int64_t u,
                                                                __m512 *w0, __m512 *w1) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    switch (type) {
        case R_Q4_0: case R_Q4_1: {
            const int one = type == R_Q4_1;
            const uint8_t *blk = row + u * (20 + 4 * one);
            const __m512 d = _mm512_set1_ps(f32at(blk));
            const __m512 table = one ? _mm512_fmadd_ps(d, iota, _mm512_set1_ps(f32at(blk + 4)))
                                     : _mm512_mul_ps(d, _mm512_sub_ps(iota, _mm512_set1_ps(8.0f)));
            const __m512i v = U8x16(blk + 4 + 4 * one);
            *w0 = _mm512_permutexvar_ps(v, table);
            *w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
            return;
        }
        case R_Q5_0: case R_Q5_1: {  /* a byte a weight, as Q8_0 (Q5_1: plus m) */
            const int one = type == R_Q5_1;
            const uint8_t *blk = row + u * (36 + 4 * one), *q = blk + 4 + 4 * one;
            const __m512 d = _mm512_set1_ps(f32at(blk));
            const __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
            const __m512 b = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16))));
            if (one) {
                const __m512 m = _mm512_set1_ps(f32at(blk + 4));
                *w0 = _mm512_fmadd_ps(d, a, m);
                *w1 = _mm512_fmadd_ps(d, b, m);
            } else {
                *w0 = _mm512_mul_ps(d, a);
                *w1 = _mm512_mul_ps(d, b);
            }
            return;
        }
        case R_Q8_0: {
            const uint8_t *blk = row + u * 36;
            const __m512 d = _mm512_set1_ps(f32at(blk));
            *w0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 4)))));
            *w1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 20)))));
            return;
        }
        case R_Q4_K: {
            const int sub = (int)(u & 7);
            const uint8_t *blk = row + (u >> 3) * 192;
            const __m512 ds = _mm512_set1_ps(f32at(blk + 4 * sub)), dm = _mm512_set1_ps(f32at(blk + 32 + 4 * sub));
            const uint8_t *qs = blk + 64 + 32 * (sub >> 1);
            /* w = (d sc) q - (dmin m): the product is exact, so the fused form rounds as ggml's */
            const __m512 t0 = _mm512_fmsub_ps(ds, iota, dm);
            __m512i a = U8x16(qs), b = U8x16(qs + 16);
            if (sub & 1) {
                a = _mm512_srli_epi32(a, 4);
                b = _mm512_srli_epi32(b, 4);
            }
            *w0 = _mm512_permutexvar_ps(a, t0);
            *w1 = _mm512_permutexvar_ps(b, t0);
            return;
        }
        case R_Q5_K: {  /* a byte a weight */
            const int sub = (int)(u & 7);
            const uint8_t *blk = row + (u >> 3) * 320, *q = blk + 64 + 32 * sub;
            const __m512 ds = _mm512_set1_ps(f32at(blk + 4 * sub)), dm = _mm512_set1_ps(f32at(blk + 32 + 4 * sub));
            *w0 = _mm512_fmsub_ps(ds, _mm512_cvtepi32_ps(U8x16(q)), dm);
            *w1 = _mm512_fmsub_ps(ds, _mm512_cvtepi32_ps(U8x16(q + 16)), dm);
            return;
        }
        case R_Q6_K: {  /* 16 weights share a scale */
            const uint8_t *blk = row + (u >> 3) * 320;
            const int sub = (int)(u & 7);
            const int8_t *q = (const int8_t *)(blk + 64 + 32 * sub);
            *w0 = _mm512_mul_ps(_mm512_set1_ps(f32at(blk + 8 * sub)),
                                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q))));
            *w1 = _mm512_mul_ps(_mm512_set1_ps(f32at(blk + 8 * sub + 4)),
                                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16)))));
            return;
        }
    }
}

static T512 void dq512(int type, const uint8_t *row, int64_t K, float *restrict out) {
    switch (type) {
        case GT_F32: case GT_F16: case GT_BF16:
            dequant_row_ref(type, row, K, out);
            return;
    }
    for (int64_t u = 0; u < K / 32; u++) {
        __m512 w0 = _mm512_setzero_ps(), w1 = w0;
        unit512(type, row, u, &w0, &w1);
        _mm512_storeu_ps(out + 32 * u, w0);
        _mm512_storeu_ps(out + 32 * u + 16, w1);
    }
}

/* ---- the same units on AVX2: 32 weights as four 8-lane vectors (weights 0-7, 8-15,
 * 16-23, 24-31), the values unit512 makes ------------------------------------------ */

/* 8 bytes -> 8 int32 lanes */
#define U8x8(p) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define I8x8(p) _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p)))

static inline __attribute__((always_inline)) void unit256(int type, const uint8_t *row, int64_t u, __m256 *w) {
    const __m256i f15 = _mm256_set1_epi32(15);
    switch (type) {
        case R_Q4_0: case R_Q4_1: {
            const int one = type == R_Q4_1;
            const uint8_t *blk = row + u * (20 + 4 * one), *qs = blk + 4 + 4 * one;
            const __m256 d = _mm256_set1_ps(f32at(blk)), m = _mm256_set1_ps(one ? f32at(blk + 4) : 0.0f);
            const __m256i eight = _mm256_set1_epi32(8);
            for (int h = 0; h < 2; h++) {  /* bytes 8 h .. 8 h + 7: weights 8 h .. (low), 16 + 8 h .. (high) */
                const __m256i v = U8x8(qs + 8 * h);
                __m256i lo = _mm256_and_si256(v, f15), hi = _mm256_srli_epi32(v, 4);
                if (one) {
                    w[h] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lo), m);
                    w[2 + h] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(hi), m);
                } else {
                    w[h] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(lo, eight)));
                    w[2 + h] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(hi, eight)));
                }
            }
            return;
        }
        case R_Q5_0: case R_Q5_1: case R_Q8_0: {
            const int one = type == R_Q5_1;
            const uint8_t *blk = row + u * (type == R_Q5_1 ? 40 : 36), *q = blk + 4 + 4 * one;
            const __m256 d = _mm256_set1_ps(f32at(blk));
            for (int h = 0; h < 4; h++) {
                const __m256 qf = _mm256_cvtepi32_ps(I8x8(q + 8 * h));
                w[h] = one ? _mm256_fmadd_ps(d, qf, _mm256_set1_ps(f32at(blk + 4))) : _mm256_mul_ps(d, qf);
            }
            return;
        }
        case R_Q4_K: case R_Q5_K: {
            const int five = type == R_Q5_K, sub = (int)(u & 7);
            const uint8_t *blk = row + (u >> 3) * (five ? 320 : 192);
            const __m256 ds = _mm256_set1_ps(f32at(blk + 4 * sub)), dm = _mm256_set1_ps(f32at(blk + 32 + 4 * sub));
            for (int h = 0; h < 4; h++) {
                __m256i q;
                if (five) q = U8x8(blk + 64 + 32 * sub + 8 * h);
                else {
                    q = U8x8(blk + 64 + 32 * (sub >> 1) + 8 * h);
                    q = sub & 1 ? _mm256_srli_epi32(q, 4) : _mm256_and_si256(q, f15);
                }
                w[h] = _mm256_fmsub_ps(ds, _mm256_cvtepi32_ps(q), dm);
            }
            return;
        }
        case R_Q6_K: {
            const int sub = (int)(u & 7);
            const uint8_t *blk = row + (u >> 3) * 320;
            const int8_t *q = (const int8_t *)(blk + 64 + 32 * sub);
            for (int h = 0; h < 4; h++)
                w[h] = _mm256_mul_ps(_mm256_set1_ps(f32at(blk + 8 * sub + 4 * (h >> 1))),
                                     _mm256_cvtepi32_ps(I8x8(q + 8 * h)));
            return;
        }
    }
}

static void dq256(int type, const uint8_t *row, int64_t K, float *restrict out) {
    if (type < R_OFF) {
        dequant_row_ref(type, row, K, out);
        return;
    }
    for (int64_t u = 0; u < K / 32; u++) {
        __m256 w[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        unit256(type, row, u, w);
        for (int h = 0; h < 4; h++) _mm256_storeu_ps(out + 32 * u + 8 * h, w[h]);
    }
}

/* 0: the one-at-a-time reference, 512 / 256: the vector code (tests compare them). */
static int dequant_isa = -1;

void dspark_quant_set_dequant(int isa) { dequant_isa = isa; }

static void dequant_row(int type, const uint8_t *row, int64_t K, float *restrict out) {
    const int isa = dequant_isa >= 0 ? dequant_isa : dspark_gemm_bf16w_isa();
    if (isa == 512) dq512(type, row, K, out);
    else if (isa == 256) dq256(type, row, K, out);
    else dequant_row_ref(type, row, K, out);
}

/* The exact fp32 values of `rows` rows (for tests and checks). */
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

/* Whether a type has a fused path (the repacked ones). */
static int fused_type(int type) { return type > R_OFF; }

/* Columns [c, c + nc) of one segment for M (1 or 2) rows: 8 (one row) or 4 (two rows)
 * columns at a time, then one at a time. */
static T512 void fused_cols(int type, const float *x, int64_t M, int64_t K, const uint8_t *data, int64_t rb,
                            int64_t c, int64_t nc, float *y, int64_t ldy, const float *bias) {
    const int wide = M == 1 ? 8 : 4;
    int64_t j = 0;
#define F(t, mr, n) fused512(t, x, K, data + (c + j) * rb, rb, y + j, ldy, bias ? bias + j : 0, mr, n)
#define TYPES(mr, n)                                                   \
    switch (type) {                                                    \
        case R_Q4_0: F(R_Q4_0, mr, n); break;                          \
        case R_Q4_1: F(R_Q4_1, mr, n); break;                          \
        case R_Q5_0: F(R_Q5_0, mr, n); break;                          \
        case R_Q5_1: F(R_Q5_1, mr, n); break;                          \
        case R_Q8_0: F(R_Q8_0, mr, n); break;                          \
        case R_Q4_K: F(R_Q4_K, mr, n); break;                          \
        case R_Q5_K: F(R_Q5_K, mr, n); break;                          \
        default: F(R_Q6_K, mr, n); break;                              \
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

/* The AVX2 decode: MR (1 or 2) rows against NC rows of W, each output's lanes 0-7 and
 * 8-15 in two registers, in unit512's order (weights 0-7 and 8-15, then 16-23 and 24-31). */
static inline __attribute__((always_inline)) void fused256(int type, const float *x, int64_t K,
                                                           const uint8_t *rows, int64_t rb, float *y, int64_t ldy,
                                                           const float *bias, int MR, int NC) {
    __m256 acc[2][4][2];
#pragma GCC unroll 2
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NC; j++) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
    for (int64_t u = 0; u < K / 32; u++) {
#pragma GCC unroll 4
        for (int j = 0; j < NC; j++) {
            __m256 w[4];
            unit256(type, rows + j * rb, u, w);
#pragma GCC unroll 2
            for (int i = 0; i < MR; i++) {
                const float *xu = x + i * K + 32 * u;
                acc[i][j][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xu), w[0], acc[i][j][0]);
                acc[i][j][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xu + 8), w[1], acc[i][j][1]);
                acc[i][j][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xu + 16), w[2], acc[i][j][0]);
                acc[i][j][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xu + 24), w[3], acc[i][j][1]);
            }
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NC; j++) {
            const float r = reduce256(acc[i][j][0], acc[i][j][1]);
            y[i * ldy + j] = bias ? r + bias[j] : r;
        }
}

static void fused_cols256(int type, const float *x, int64_t M, int64_t K, const uint8_t *data, int64_t rb,
                          int64_t c, int64_t nc, float *y, int64_t ldy, const float *bias) {
    const int wide = M == 1 ? 4 : 2;
    int64_t j = 0;
#define F(t, mr, n) fused256(t, x, K, data + (c + j) * rb, rb, y + j, ldy, bias ? bias + j : 0, mr, n)
#define TYPES(mr, n)                                                   \
    switch (type) {                                                    \
        case R_Q4_0: F(R_Q4_0, mr, n); break;                          \
        case R_Q4_1: F(R_Q4_1, mr, n); break;                          \
        case R_Q5_0: F(R_Q5_0, mr, n); break;                          \
        case R_Q5_1: F(R_Q5_1, mr, n); break;                          \
        case R_Q8_0: F(R_Q8_0, mr, n); break;                          \
        case R_Q4_K: F(R_Q4_K, mr, n); break;                          \
        case R_Q5_K: F(R_Q5_K, mr, n); break;                          \
        default: F(R_Q6_K, mr, n); break;                              \
    }
    for (; j + wide <= nc; j += wide) {
        if (M == 1) { TYPES(1, 4) } else { TYPES(2, 2) }
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
            if (M <= 2 && fused_type(type) && fuse) {
                if (hi > lo && isa == 512)
                    fused_cols(type, x, M, K, data, rb, lo - base, hi - lo, y + lo, N, bias ? bias + lo : 0);
                else if (hi > lo)
                    fused_cols256(type, x, M, K, data, rb, lo - base, hi - lo, y + lo, N, bias ? bias + lo : 0);
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
