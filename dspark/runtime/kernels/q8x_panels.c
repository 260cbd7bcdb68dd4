/* The q8x precision's data: activations quantized per 32, and the panels its matmul
 * reads, packed once at load from the repacked rows of quant_units.h (layout and
 * arithmetic: gemm_q8x.c). */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "q8x_panels.h"

/* ---- activations ------------------------------------------------------------------ */

/* One row of K (a multiple of 32) -> q [K], dx, sx [K / 32], S [K / 32][2] (the sums of q
 * over each unit's halves). Every operation is exact or one IEEE rounding, so the vector
 * form is the scalar rule (tests check it against numpy): the largest |x| of a unit
 * ignores NaN lanes and is exact in any order, a value becomes its 32-bit integer's low
 * byte (as a C cast to int8 takes it), and the integer sums are exact in any order. */
void dspark_q8x_quantize_row(const float *x, int64_t K, int8_t *q, float *dx, float *sx, int32_t *S) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i low = _mm256_set1_epi32(0xff), order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < K / 32; b++) {
        const float *xb = x + 32 * b;
        __m256 v[4], m = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(xb + 8 * j);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[j]));
        }
        m = _mm256_and_ps(m, _mm256_cmp_ps(m, m, _CMP_ORD_Q)); /* NaN lanes count as 0 */
        m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
        m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, _MM_SHUFFLE(1, 0, 3, 2)));
        m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, _MM_SHUFFLE(2, 3, 0, 1)));
        const float a = _mm256_cvtss_f32(m);
        const __m256 id = _mm256_set1_ps(a > 0.0f ? 127.0f / a : 0.0f);
        __m256i n[4];
        for (int j = 0; j < 4; j++)
            n[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], id),
                                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        /* low bytes, 0..255 each, so the packs do not saturate; their lane order undone after */
        const __m256i w01 = _mm256_packus_epi32(_mm256_and_si256(n[0], low), _mm256_and_si256(n[1], low));
        const __m256i w23 = _mm256_packus_epi32(_mm256_and_si256(n[2], low), _mm256_and_si256(n[3], low));
        _mm256_storeu_si256((__m256i *)(q + 32 * b),
                            _mm256_permutevar8x32_epi32(_mm256_packus_epi16(w01, w23), order));
        /* the two halves' sums side by side, then across the lanes of each */
        __m256i h = _mm256_hadd_epi32(_mm256_add_epi32(n[0], n[1]), _mm256_add_epi32(n[2], n[3]));
        h = _mm256_hadd_epi32(h, h);
        h = _mm256_add_epi32(h, _mm256_permute2x128_si256(h, h, 1));
        const int32_t s0 = _mm256_extract_epi32(h, 0), s1 = _mm256_extract_epi32(h, 1);
        dx[b] = a / 127.0f;
        sx[b] = dx[b] * (float)(s0 + s1);
        S[2 * b] = s0;
        S[2 * b + 1] = s1;
    }
}

/* ---- a type's panel ----------------------------------------------------------------- */

/* The repacked rows a panel type is packed from (the IQ4 panels' rows are R_Q8_0's). */
static int row_type(int type) { return type == R_IQ4_NL || type == R_IQ4_XS ? R_Q8_0 : type; }

/* The scales of unit u of a repacked row: d0 for weights 0-15, d1 for 16-31, m (0 where none). */
static void unit_scales(int type, const uint8_t *row, int64_t u, float *d0, float *d1, float *m) {
    const int sub = (int)(u & 7);
    type = row_type(type);
    *m = 0.0f;
    switch (type) {
        case R_Q4_0: *d0 = *d1 = f32at(row + u * 20); return;
        case R_Q4_1: *d0 = *d1 = f32at(row + u * 24); *m = f32at(row + u * 24 + 4); return;
        case R_Q5_0: case R_Q8_0: *d0 = *d1 = f32at(row + u * 36); return;
        case R_Q5_1: *d0 = *d1 = f32at(row + u * 40); *m = f32at(row + u * 40 + 4); return;
        case R_Q4_K: case R_Q5_K: {
            const uint8_t *blk = row + (u >> 3) * (type == R_Q4_K ? 192 : 320);
            *d0 = *d1 = f32at(blk + 4 * sub);
            *m = -f32at(blk + 32 + 4 * sub);
            return;
        }
        default: {  /* R_Q6_K */
            const uint8_t *blk = row + (u >> 3) * 320;
            *d0 = f32at(blk + 8 * sub);
            *d1 = f32at(blk + 8 * sub + 4);
            return;
        }
    }
}

/* The 32 integers w8 of unit u of a repacked row. */
static void unit_w8(int type, const uint8_t *row, int64_t u, int w8[32]) {
    const int sub = (int)(u & 7);
    type = row_type(type);
    switch (type) {
        case R_Q4_0: case R_Q4_1: {
            const int one = type == R_Q4_1;
            const uint8_t *qs = row + u * (20 + 4 * one) + 4 + 4 * one;
            for (int j = 0; j < 16; j++) {
                w8[j] = (qs[j] & 15) - (one ? 0 : 8);
                w8[j + 16] = (qs[j] >> 4) - (one ? 0 : 8);
            }
            return;
        }
        case R_Q4_K: {
            const uint8_t *qs = row + (u >> 3) * 192 + 64 + 32 * (sub >> 1);
            for (int j = 0; j < 32; j++) w8[j] = sub & 1 ? qs[j] >> 4 : qs[j] & 15;
            return;
        }
        default: {  /* a byte a weight */
            const uint8_t *q;
            if (type == R_Q5_1) q = row + u * 40 + 8;
            else if (type == R_Q5_0 || type == R_Q8_0) q = row + u * 36 + 4;
            else q = row + (u >> 3) * 320 + 64 + 32 * sub;  /* Q5_K (unsigned), Q6_K */
            for (int j = 0; j < 32; j++) w8[j] = type == R_Q5_K ? (int)q[j] : (int)(int8_t)q[j];
            return;
        }
    }
}

int64_t dspark_q8x_group_bytes(int type, int64_t K) { return K / 32 * unit_bytes(xinfo(type)); }

int dspark_q8x_panel_type(int file_type) {
    if (file_type == GT_Q2_K) return 0;  /* no panel form: a min per 16 weights (the gguf precision reads it) */
    if (file_type == GT_IQ4_NL) return R_IQ4_NL;
    return file_type == GT_IQ4_XS ? R_IQ4_XS : dspark_quant_repacked_type(file_type);
}

/* The index of an IQ4 value in IQ4_VALUES (an IQ4 row holds no other). */
static uint8_t iq4_index(int w8) {
    for (uint8_t j = 0; j < 16; j++)
        if (IQ4_VALUES[j] == w8) return j;
    return 0;
}

/* rows repacked rows of `type` (R_), rb bytes each -> panels (dst: ceil(rows / 8) groups). */
void dspark_q8x_pack(int type, const uint8_t *src, int64_t rb, int64_t rows, int64_t K, uint8_t *dst) {
    const xtype t = xinfo(type);
    const int64_t ub = unit_bytes(t), gb = K / 32 * ub;
    memset(dst, 0, (size_t)((rows + 7) / 8 * gb));
    for (int64_t r = 0; r < rows; r++) {
        const int c = (int)(r & 7);
        uint8_t *grp = dst + (r >> 3) * gb;
        for (int64_t u = 0; u < K / 32; u++) {
            uint8_t *unit = grp + u * ub;
            float d0, d1, m;
            int w8[32];
            unit_scales(type, src + r * rb, u, &d0, &d1, &m);
            unit_w8(type, src + r * rb, u, w8);
            const float sc[3] = {d0, t.nd == 2 ? d1 : m, m};
            for (int v = 0; v < t.nd + t.nm; v++) {
                if (t.half) {  /* the file's fp16 value, exact both ways */
                    const uint16_t h = _cvtss_sh(sc[v], _MM_FROUND_TO_NEAREST_INT);
                    memcpy(unit + scale_bytes(t) * v + 2 * c, &h, 2);
                } else {
                    memcpy(unit + scale_bytes(t) * v + 4 * c, &sc[v], 4);
                }
            }
            uint8_t *qb = (uint8_t *)unit_quants(t, unit);
            for (int k = 0; k < 32; k++) {
                int high;
                const int64_t at = quant_at(t, c, k, &high);
                const uint8_t v = t.lut ? iq4_index(w8[k]) : (uint8_t)(w8[k] + t.o);
                qb[at] |= high ? (uint8_t)((v & 15) << 4) : (t.four ? v & 15 : v);
                if (t.five)  /* bit 2h (low nibble) or 2h + 1 (high) of the lane's plane byte */
                    qb[128 + 4 * c + (k & 3)] |= (uint8_t)(((v >> 4) & 1) << (2 * ((k & 15) >> 2) + high));
            }
        }
    }
}

/* The exact fp32 weights of a panel segment (columns [0, rows)). */
void dspark_q8x_dequant(int type, const uint8_t *panel, int64_t rows, int64_t K, float *out) {
    const xtype t = xinfo(type);
    const int64_t ub = unit_bytes(t), gb = K / 32 * ub;
    for (int64_t r = 0; r < rows; r++) {
        const int c = (int)(r & 7);
        for (int64_t u = 0; u < K / 32; u++) {
            const uint8_t *unit = panel + (r >> 3) * gb + u * ub, *qb = unit_quants(t, unit);
            for (int k = 0; k < 32; k++) {
                const float d = unit_scale(t, unit, t.nd == 2 && k >= 16, c);
                const float w = d * (float)panel_w8(t, qb, c, k);
                out[r * K + 32 * u + k] = t.nm ? w + unit_scale(t, unit, t.nd, c) : w;
            }
        }
    }
}
