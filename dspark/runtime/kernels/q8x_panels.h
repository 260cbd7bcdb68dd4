/* The q8x precision's panels (q8x_panels.c) and activations, shared by its matmul
 * (gemm_q8x.c, which describes the arithmetic contract and the layout). */
#ifndef DSPARK_Q8X_PANELS_H
#define DSPARK_Q8X_PANELS_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "quant_units.h"

/* A type's panel: how its quants are stored and summed (the layout: gemm_q8x.c). */
typedef struct {
    int four;  /* the low 4 bits of the quants two to a byte */
    int five;  /* and their fifth bits in a plane of 32 bytes (the 5-bit types) */
    int o;     /* w8 = q - o */
    int nd;    /* scales per column and unit (8 lanes each): 1, or 2 for Q6_K */
    int nm;    /* 1 where the type has a min */
    int g16;   /* groups summed in 16 bits */
    int sgn;   /* the quants are int8 (Q8_0) */
    int half;  /* the scales are the file's fp16 values, stored as such (Q4_0/1, Q5_0/1, Q8_0) */
    int lut;   /* the 4-bit quants index IQ4_VALUES (IQ4_NL, IQ4_XS: w8 = IQ4_VALUES[q]) */
} xtype;

static inline __attribute__((always_inline)) xtype xinfo(int t) {
    switch (t) {
        case R_Q4_0: return (xtype){1, 0, 8, 1, 0, 8, 0, 1};
        case R_Q4_1: return (xtype){1, 0, 0, 1, 1, 8, 0, 1};
        case R_Q4_K: return (xtype){1, 0, 0, 1, 1, 8, 0, 0};
        case R_Q5_0: return (xtype){1, 1, 16, 1, 0, 4, 0, 1};
        case R_Q5_1: return (xtype){1, 1, 0, 1, 1, 4, 0, 1};
        case R_Q5_K: return (xtype){1, 1, 0, 1, 1, 4, 0, 0};
        case R_Q6_K: return (xtype){0, 0, 32, 2, 0, 2, 0, 0};
        case R_IQ4_NL: return (xtype){1, 0, 0, 1, 0, 1, 1, 1, 1};
        case R_IQ4_XS: return (xtype){1, 0, 0, 1, 0, 1, 1, 0, 1};  /* fp32 scales: d (ls - 32) */
        default: return (xtype){0, 0, 0, 1, 0, 1, 1, 1};  /* R_Q8_0 */
    }
}

/* Bytes of one scale vector (8 columns): fp16 where the file's scales are fp16 values
 * (d of Q4_0 ..., d and m of Q4_1/Q5_1), fp32 where they are products (d sc, dmin m). */
static inline int64_t scale_bytes(xtype t) { return t.half ? 16 : 32; }

static inline int64_t unit_bytes(xtype t) {
    return scale_bytes(t) * (t.nd + t.nm) + (t.four ? 128 + 32 * t.five : 256);
}

/* A unit's quants, after its scale vectors (D, [D1], [M]). */
static inline const uint8_t *unit_quants(xtype t, const uint8_t *unit) {
    return unit + scale_bytes(t) * (t.nd + t.nm);
}

/* Scale vector v (0: D or D0, 1: D1 or M ...) of column c of a unit, as fp32 (exact). */
static inline float unit_scale(xtype t, const uint8_t *unit, int v, int c) {
    const uint8_t *p = unit + scale_bytes(t) * v;
    if (t.half) {
        uint16_t h;
        memcpy(&h, p + 2 * c, 2);
        return _cvtsh_ss(h);
    }
    float f;
    memcpy(&f, p + 4 * c, 4);
    return f;
}

/* Scale vector v of a unit, 8 lanes. */
static inline __attribute__((always_inline)) __m256 unit_scales8(xtype t, const uint8_t *unit, int v) {
    const uint8_t *p = unit + scale_bytes(t) * v;
    return t.half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)) : _mm256_loadu_ps((const float *)p);
}

/* Byte offset of weight k of column c (0-7) in a unit's quants, and whether it is a high nibble. */
static inline int64_t quant_at(xtype t, int c, int k, int *high) {
    *high = t.four && k >= 16;
    if (t.four) return 32 * ((k & 15) >> 2) + 4 * c + (k & 3);
    return 32 * (k >> 2) + 4 * c + (k & 3);
}

/* w8 of weight k of column c of a unit (scalar). */
static inline int panel_w8(xtype t, const uint8_t *qb, int c, int k) {
    int high;
    const uint8_t v = qb[quant_at(t, c, k, &high)];
    if (t.lut) return IQ4_VALUES[high ? v >> 4 : v & 15];
    if (t.sgn) return (int8_t)v;
    if (!t.four) return v - t.o;
    int n = high ? v >> 4 : v & 15;
    if (t.five) n |= ((qb[128 + 4 * c + (k & 3)] >> (2 * ((k & 15) >> 2) + high)) & 1) << 4;
    return n - t.o;
}

/* The repacked type whose q8x panel a file's type is packed into (R_IQ4_NL, R_IQ4_XS for
 * the IQ4 types, whose rows are R_Q8_0's). */
int dspark_q8x_panel_type(int file_type);

/* One row of K (a multiple of 32) -> q [K], dx, sx [K / 32], S [K / 32][2]. */
void dspark_q8x_quantize_row(const float *x, int64_t K, int8_t *q, float *dx, float *sx, int32_t *S);

#endif
