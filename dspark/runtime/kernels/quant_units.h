/* The layouts of a GGUF file's blocks as the gguf-precision kernels read them, and
 * their dequantization 32 weights (one unit) at a time in registers: shared by
 * quant_repack.c (repacking, the reference, the scratch fill) and gemm_quant.c (the
 * matmul, whose decode path dequantizes inside its dot products). */
#ifndef DSPARK_QUANT_UNITS_H
#define DSPARK_QUANT_UNITS_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

enum { GT_F32 = 0, GT_F16 = 1, GT_Q4_0 = 2, GT_Q4_1 = 3, GT_Q5_0 = 6, GT_Q5_1 = 7, GT_Q8_0 = 8, GT_Q2_K = 10, GT_Q3_K = 11,
       GT_Q4_K = 12, GT_Q5_K = 13, GT_Q6_K = 14, GT_IQ4_NL = 20, GT_IQ4_XS = 23, GT_BF16 = 30 };

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
 *   R_Q2_K 256: f32 ds[16], f32 dm[16], 256 uint8 q in [0, 3]  (w = (d sc) q - (dmin m) per 16)
 * The 5- and 6-bit quants are widened to a byte each (a third or a half more bytes read):
 * assembling them from their bit planes cost more than the dot products they feed.
 * R_Q2_K is read by the AVX2 units on every CPU (AVX-512 ones included: the same values)
 * and never packed for q8x; it is correct, not fast (1.5 bytes a weight, the file 0.33).
 * Q3_K becomes R_Q6_K rows (ds = d (sc - 32) per 16 weights, exact in fp32; q in [-4, 3] a
 * byte each: three times the file's bytes).
 * IQ4_NL and IQ4_XS become R_Q8_0 rows: each 4-bit index replaced by its value in ggml's
 * non-linear table (an int8 in [-127, 113]) and each 32 weights' scale in fp32 (IQ4_NL: d;
 * IQ4_XS: d (ls - 32), exact in fp32), so w = d q as for Q8_0, twice the file's bytes.
 * R_IQ4_NL and R_IQ4_XS name those rows' q8x panels, which keep the 4-bit indices (half
 * the bytes) and look their values up (q8x_tiles.h).
 * F32, F16 and BF16 rows are read as stored. */
enum { R_OFF = 100, R_Q4_0 = 102, R_Q4_1 = 103, R_Q5_0 = 106, R_Q5_1 = 107, R_Q8_0 = 108, R_Q2_K = 110, R_Q4_K = 112,
       R_Q5_K = 113, R_Q6_K = 114, R_IQ4_NL = 120, R_IQ4_XS = 123 };

/* ggml's table of the IQ4 types' 16 values. */
static const int8_t IQ4_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
/* X_OFF + t: a segment of ggml type t packed into q8x panels and computed with int8
 * activations (q8x_panels.c, gemm_q8x.c): a matrix carries its precision in its descriptor. */
enum { X_OFF = 200 };

/* Whether a descriptor's segments are computed with int8 activations (gemm_q8x.c). */
static inline int dspark_q8x_matrix(const int64_t *desc) {
    for (int64_t s = 0; s < desc[0]; s++)
        if (desc[1 + 4 * s] > X_OFF) return 1;
    return 0;
}

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

/* The 6-bit scale and min j of a K-type block's 12 bytes of them (ggml's get_scale_min_k4). */
static inline void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}


/* Weights per block and bytes per block of a file's type or a repacked one (0: not
 * readable here). */
int64_t dspark_quant_block(int type, int64_t *bytes);
/* The type the kernels read for a file's type (itself for F32, F16, BF16). */
int dspark_quant_repacked_type(int type);
/* One row of K weights of a repacked (or float) type -> fp32, by the variant in use. */
void dspark_dequant_row(int type, const uint8_t *row, int64_t K, float *restrict out);

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
        case R_Q2_K: {  /* a scale and a min per 16 weights; (d sc) q is exact, so one rounding as ggml's */
            const int sub = (int)(u & 7);
            const uint8_t *blk = row + (u >> 3) * 384, *q = blk + 128 + 32 * sub;
            for (int h = 0; h < 4; h++) {
                const int j = 2 * sub + (h >> 1);
                w[h] = _mm256_fmsub_ps(_mm256_set1_ps(f32at(blk + 4 * j)), _mm256_cvtepi32_ps(U8x8(q + 8 * h)),
                                       _mm256_set1_ps(f32at(blk + 64 + 4 * j)));
            }
            return;
        }
    }
}


#endif
