/* Repacking a GGUF file's blocks into the layouts of quant_units.h, and dequantizing
 * rows: the one-weight-at-a-time reference, and the AVX-512 and AVX2 fills of the
 * matmul's scratch (tests check all three against the gguf package, bit for bit). */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "quant_units.h"

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
        case GT_Q2_K: n = 256; b = 84; break;
        case GT_Q3_K: n = 256; b = 110; break;
        case GT_Q4_K: n = 256; b = 144; break;
        case GT_Q5_K: n = 256; b = 176; break;
        case GT_Q6_K: n = 256; b = 210; break;
        case GT_IQ4_NL: b = 18; break;
        case GT_IQ4_XS: n = 256; b = 136; break;
        case R_Q4_0: b = 20; break;
        case R_Q4_1: b = 24; break;
        case R_Q5_0: b = 36; break;
        case R_Q5_1: b = 40; break;
        case R_Q8_0: b = 36; break;
        case R_Q4_K: n = 256; b = 192; break;
        case R_Q5_K: n = 256; b = 320; break;
        case R_Q6_K: n = 256; b = 320; break;
        case R_Q2_K: n = 256; b = 384; break;
        default: n = 0;
    }
    if (bytes) *bytes = b;
    return n;
}

/* The type the kernel reads for a file's type (itself for F32, F16, BF16). */
int dspark_quant_repacked_type(int type) {
    if (type == GT_IQ4_NL || type == GT_IQ4_XS) return R_Q8_0;
    if (type == GT_Q3_K) return R_Q6_K;
    return type == GT_F32 || type == GT_F16 || type == GT_BF16 ? type : R_OFF + type;
}


/* rows of a file's blocks (src, src_row bytes each) -> the repacked layout (dst). */
void dspark_quant_repack(int type, const uint8_t *src, int64_t src_row, int64_t rows, int64_t K, uint8_t *dst) {
    const int rtype = dspark_quant_repacked_type(type);
    int64_t sb, rb;
    const int64_t bs = dspark_quant_block(type, &sb), rn = dspark_quant_block(rtype, &rb);
    rb *= bs / rn;  /* repacked bytes per file block (an IQ4_XS block: 8 R_Q8_0 units) */
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
                case GT_IQ4_NL: case GT_IQ4_XS: {  /* R_Q8_0 units: d (IQ4_XS: d (ls - 32)), table values */
                    const int xs = type == GT_IQ4_XS;
                    const float d = h2f(s);
                    for (int ib = 0; ib < bs / 32; ib++) {
                        const int ls = xs ? ((s[4 + ib / 2] >> (4 * (ib % 2))) & 15) |
                                                (((s[2] | s[3] << 8) >> (2 * ib) & 3) << 4) : 32;
                        const uint8_t *qs = s + (xs ? 8 : 2) + 16 * ib;
                        uint8_t *unit = o + 36 * ib;
                        f[0] = xs ? d * (float)(ls - 32) : d;
                        memcpy(unit, f, 4);
                        for (int j = 0; j < 16; j++) {
                            unit[4 + j] = (uint8_t)IQ4_VALUES[qs[j] & 15];
                            unit[20 + j] = (uint8_t)IQ4_VALUES[qs[j] >> 4];
                        }
                    }
                    break;
                }
                case GT_Q3_K: {  /* R_Q6_K: ds[16] = d (sc - 32), then q in [-4, 3] a byte each */
                    const float d = h2f(s + 108);
                    const uint8_t *hmask = s, *qs = s + 32, *sc = s + 96;
                    for (int j = 0; j < 16; j++) {
                        const int lo = j < 8 ? sc[j] & 15 : sc[j - 8] >> 4, hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
                        f[j] = d * (float)((lo | hi << 4) - 32);
                    }
                    memcpy(o, f, 64);
                    int8_t *q = (int8_t *)(o + 64);
                    for (int i = 0; i < 256; i++) {  /* i = 128 half + 32 shift + l */
                        const int half = i / 128, sh = (i / 32) % 4, l = i % 32;
                        const int low = (qs[32 * half + l] >> (2 * sh)) & 3, high = (hmask[l] >> (4 * half + sh)) & 1;
                        q[i] = (int8_t)(low - (high ? 0 : 4));
                    }
                    break;
                }
                case GT_Q2_K: {  /* R_Q2_K: ds[16] = d (sc & 15), dm[16] = dmin (sc >> 4), then q a byte each */
                    const float d = h2f(s + 80), dmin = h2f(s + 82);
                    const uint8_t *sc = s, *qs = s + 16;
                    float g[32];
                    for (int j = 0; j < 16; j++) {
                        g[j] = d * (float)(sc[j] & 15);
                        g[16 + j] = dmin * (float)(sc[j] >> 4);
                    }
                    memcpy(o, g, 128);
                    for (int i = 0; i < 256; i++) {  /* i = 128 half + 32 shift + l */
                        const int half = i / 128, sh = (i / 32) % 4, l = i % 32;
                        o[128 + i] = (uint8_t)((qs[32 * half + l] >> (2 * sh)) & 3);
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
            case R_Q2_K: {
                for (int l = 0; l < 256; l++)
                    y[l] = f32at(blk + 4 * (l / 16)) * (float)blk[128 + l] - f32at(blk + 64 + 4 * (l / 16));
                break;
            }
        }
    }
}


static void dq256(int type, const uint8_t *row, int64_t K, float *restrict out);

static T512 void dq512(int type, const uint8_t *row, int64_t K, float *restrict out) {
    switch (type) {
        case GT_F32: case GT_F16: case GT_BF16:
            dequant_row_ref(type, row, K, out);
            return;
        case R_Q2_K:  /* AVX2 units only (quant_units.h) */
            dq256(type, row, K, out);
            return;
    }
    for (int64_t u = 0; u < K / 32; u++) {
        __m512 w0 = _mm512_setzero_ps(), w1 = w0;
        unit512(type, row, u, &w0, &w1);
        _mm512_storeu_ps(out + 32 * u, w0);
        _mm512_storeu_ps(out + 32 * u + 16, w1);
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

void dspark_dequant_row(int type, const uint8_t *row, int64_t K, float *restrict out) {
    const int isa = dequant_isa >= 0 ? dequant_isa : dspark_gemm_bf16w_isa();
    if (isa == 512) dq512(type, row, K, out);
    else if (isa == 256) dq256(type, row, K, out);
    else dequant_row_ref(type, row, K, out);
}

/* The exact fp32 values of `rows` rows (for tests and checks). */
void dspark_dequant_rows(int type, const uint8_t *data, int64_t row_bytes, int64_t rows, int64_t K, float *out) {
    for (int64_t r = 0; r < rows; r++) dspark_dequant_row(type, data + r * row_bytes, K, out + r * K);
}

/* The gguf precision's sequence for one output, one element at a time: sixteen lane
 * sums (an FMA chain each over k = l, l + 16, ...), then a fixed tree, then the bias
 * (gemm_quant.c). Columns [c, c + nc) of rows `data` (rb bytes each) of a repacked or
 * float type, for M rows of x; w: K floats of scratch. */
void dspark_quant_ref_cols(int type, const uint8_t *data, int64_t rb, int64_t c, int64_t nc, const float *x,
                           int64_t M, int64_t K, float *y, int64_t ldy, const float *bias, float *w) {
    for (int64_t j = 0; j < nc; j++) {
        dspark_dequant_row(type, data + (c + j) * rb, K, w);
        for (int64_t m = 0; m < M; m++) {
            float a[16] = {0}, t[8], u[4], v[2];
            for (int64_t k = 0; k < K; k += 16)
                for (int l = 0; l < 16; l++) a[l] = __builtin_fmaf(x[m * K + k + l], w[k + l], a[l]);
            for (int l = 0; l < 8; l++) t[l] = a[l] + a[l + 8];
            for (int l = 0; l < 4; l++) u[l] = t[l] + t[l + 4];
            for (int l = 0; l < 2; l++) v[l] = u[l] + u[l + 2];
            const float r = v[0] + v[1];
            y[m * ldy + j] = bias ? r + bias[j] : r;
        }
    }
}

/* The gguf matmul's scalar reference (a q8x descriptor: gemm_q8x.c's). */
void dspark_gemm_quant_ref(const float *x, const int64_t *desc, const float *bias, float *y, int64_t M, int64_t N,
                           int64_t K) {
    if (dspark_q8x_matrix(desc)) {
        dspark_gemm_q8x_ref(x, desc, bias, y, M, N, K);
        return;
    }
    float *w = malloc((size_t)K * sizeof(float));
    int64_t n = 0;
    for (int64_t s = 0; s < desc[0] && w; s++) {
        const int64_t *g = desc + 1 + 4 * s;
        dspark_quant_ref_cols((int)g[0], (const uint8_t *)(intptr_t)g[3], g[2], 0, g[1], x, M, K, y + n, N,
                              bias ? bias + n : 0, w);
        n += g[1];
    }
    free(w);
}
