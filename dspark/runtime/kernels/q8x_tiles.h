/* The q8x matmul's register tiles (gemm_q8x.c describes the arithmetic and the layout):
 * panel_tile, MR (<= 4) rows against NG (<= 4) groups of 8 columns with every accumulator in
 * a register, for one row and for the few rows of a verification step; panel_rows (AVX2: one
 * group) and panel_rows_vnni (two groups), against many rows, for batched decoding and
 * prefill. All give every output the one sequence of the contract. */
#ifndef DSPARK_Q8X_TILES_H
#define DSPARK_Q8X_TILES_H
#include <immintrin.h>
#include <stdint.h>

#include "q8x_panels.h"

/* 1 in gemm_q8x_vnni.c: each group of four products of a row summed by one vpdpbusd
 * (unsigned weight bytes times signed activations, into 32 bits), which also takes the
 * signed Q8_0 and IQ4 values as w8 + 128 with 128 S subtracted after. The integer sums are
 * the AVX2 code's (exact either way), so every output has the same bits. */
#ifndef Q8X_VNNI
#define Q8X_VNNI 0
#endif

#define BCAST4(p) _mm256_set1_epi32(*(const int32_t *)(p))

/* x shifted left by s bits (right by -s) in each 16-bit lane; s a constant in -3 .. 4. */
static inline __attribute__((always_inline)) __m256i shift_bits(__m256i x, int s) {
    return s > 0 ? _mm256_slli_epi16(x, s) : s < 0 ? _mm256_srli_epi16(x, -s) : x;
}

/* The low and high nibbles of chunk h of a 4-bit unit's quants (weights 4h .. 4h + 3 and
 * 16 + 4h .. of the 8 columns, as unsigned bytes), with their fifth bits from `plane` for the
 * 5-bit types: bit 2h (2h + 1) of each plane byte to bit 4 (16-bit shifts of at most 4 keep
 * it within its byte). */
static inline __attribute__((always_inline)) void nibbles(xtype t, const uint8_t *qb, __m256i plane, int h,
                                                          __m256i *lo, __m256i *hi) {
    const __m256i f15 = _mm256_set1_epi8(15), b4 = _mm256_set1_epi8(16);
    const __m256i v = _mm256_loadu_si256((const __m256i *)(qb + 32 * h));
    *lo = _mm256_and_si256(v, f15);
    *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), f15);
    if (t.five) {
        *lo = _mm256_or_si256(*lo, _mm256_and_si256(shift_bits(plane, 4 - 2 * h), b4));
        *hi = _mm256_or_si256(*hi, _mm256_and_si256(shift_bits(plane, 3 - 2 * h), b4));
    }
}

/* The signed values of 32 4-bit indices (IQ4_VALUES looked up in each 128-bit lane). */
static inline __attribute__((always_inline)) __m256i iq4_values(__m256i idx) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)IQ4_VALUES));
    return _mm256_shuffle_epi8(table, idx);
}

/* Ask for the unit PREFETCH_UNITS ahead of `unit` in its group (ub bytes a unit). The
 * many-row passes read each group as a stream of units with much arithmetic between reads,
 * and streamed from memory the hardware's prefetch alone left them short of bandwidth: 1.1-1.3x
 * from 6 to 32 rows, none at one row, which does without (docs/journal.md). */
#define PREFETCH_UNITS 2
static inline __attribute__((always_inline)) void prefetch_ahead(const uint8_t *unit, int64_t ub) {
    for (int64_t l = 0; l < ub; l += 64) _mm_prefetch((const char *)unit + PREFETCH_UNITS * ub + l, _MM_HINT_T0);
}

/* A register of signed weights (Q8_0, IQ4 values) as the unsigned bytes vpdpbusd takes. */
static inline __attribute__((always_inline)) __m256i biased(__m256i w) {
    return _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80));
}

#if Q8X_VNNI
#define DOT4(P, w, x) _mm256_dpbusd_epi32(P, w, x)
/* A unit's quants as vpdpbusd takes them: w[j] holds weights 4j .. 4j + 3 of the 8 columns as
 * unsigned bytes (the signed Q8_0 and IQ4 values as w8 + 128). */
static inline __attribute__((always_inline)) void vnni_weights(xtype t, const uint8_t *qb, __m256i *w) {
    if (t.four) {
        const __m256i plane = t.five ? _mm256_loadu_si256((const __m256i *)(qb + 128)) : _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) nibbles(t, qb, plane, h, &w[h], &w[4 + h]);
        if (t.lut)
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) w[j] = biased(iq4_values(w[j]));
        return;
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qb + 32 * j));
        w[j] = t.sgn ? biased(v) : v;
    }
}

/* P[i] (P0[i]: Q6_K's first half) of MR rows over one unit, vpdpbusd. */
static inline __attribute__((always_inline)) void unit_sums_vnni(xtype t, const int8_t *q, int64_t K, int64_t u,
                                                                 const uint8_t *qb, __m256i *P0, __m256i *P,
                                                                 int MR) {
    __m256i w[8];
    vnni_weights(t, qb, w);
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) P[i] = DOT4(P[i], w[j], BCAST4(q + i * K + 32 * u + 4 * j));
        if (t.nd == 2 && j == 3) {
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++) {
                P0[i] = P[i];
                P[i] = _mm256_setzero_si256();
            }
        }
    }
}
#else
#define DOT4(P, w, x) (P)  /* not reached: the AVX2 build takes its own branches */
#endif

/* One row's unit added to its sums, the contract's step: acc += (P - o S) D dx (Q6_K: its
 * halves P0 with D0 and P with D1), off += M sx where the type has a min. */
static inline __attribute__((always_inline)) void unit_terms(xtype t, __m256i P0, __m256i P, __m256 D0, __m256 D1,
                                                             __m256 Mv, float dx, float sx, const int32_t *Su,
                                                             __m256 *acc, __m256 *off) {
    const int o = Q8X_VNNI && t.sgn ? 128 : t.o;  /* VNNI's signed weights come as w8 + 128 */
    const __m256 e = _mm256_set1_ps(dx);
    if (t.nd == 2) {
        const __m256i p0 = _mm256_sub_epi32(P0, _mm256_set1_epi32(o * Su[0]));
        const __m256i p1 = _mm256_sub_epi32(P, _mm256_set1_epi32(o * Su[1]));
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_mul_ps(D0, e), *acc);
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_mul_ps(D1, e), *acc);
    } else {
        const __m256i p = o ? _mm256_sub_epi32(P, _mm256_set1_epi32(o * (Su[0] + Su[1]))) : P;
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(D0, e), *acc);
    }
    if (t.nm) *off = _mm256_fmadd_ps(Mv, _mm256_set1_ps(sx), *off);
}

static inline __attribute__((always_inline)) void panel_tile(int type, const int8_t *q, const float *dx,
                                                             const float *sx, const int32_t *S, int64_t K,
                                                             const uint8_t *grp, int64_t gb, __m256 *out,
                                                             int MR, int NG) {
    const xtype t = xinfo(type);
    const int64_t nq = K / 32, ub = unit_bytes(t);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4][4], off[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) acc[i][g] = off[i][g] = _mm256_setzero_ps();
    for (int64_t u = 0; u < nq; u++) {
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) {
            const uint8_t *unit = grp + g * gb + u * ub, *qb = unit_quants(t, unit);
            __m256i P[4], P0[4];
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++) P[i] = P0[i] = _mm256_setzero_si256();
            if (Q8X_VNNI) {
#if Q8X_VNNI
                unit_sums_vnni(t, q, K, u, qb, P0, P, MR);
#endif
            } else if (t.four) {
                __m256i a[4];
                const __m256i plane = t.five ? _mm256_loadu_si256((const __m256i *)(qb + 128)) : ones;
#pragma GCC unroll 4
                for (int i = 0; i < MR; i++) a[i] = _mm256_setzero_si256();
#pragma GCC unroll 4
                for (int h = 0; h < 4; h++) {
                    __m256i lo, hi;
                    nibbles(t, qb, plane, h, &lo, &hi);
                    if (t.lut) {  /* int8 values up to 127: each product pair summed in 32 bits (Q8_0's sign trick) */
                        lo = iq4_values(lo);
                        hi = iq4_values(hi);
                        const __m256i alo = _mm256_sign_epi8(lo, lo), ahi = _mm256_sign_epi8(hi, hi);
#pragma GCC unroll 4
                        for (int i = 0; i < MR; i++) {
                            const int8_t *qu = q + i * K + 32 * u;
                            const __m256i xl = _mm256_sign_epi8(BCAST4(qu + 4 * h), lo);
                            const __m256i xh = _mm256_sign_epi8(BCAST4(qu + 16 + 4 * h), hi);
                            P[i] = _mm256_add_epi32(P[i], _mm256_madd_epi16(_mm256_maddubs_epi16(alo, xl), ones));
                            P[i] = _mm256_add_epi32(P[i], _mm256_madd_epi16(_mm256_maddubs_epi16(ahi, xh), ones));
                        }
                        continue;
                    }
#pragma GCC unroll 4
                    for (int i = 0; i < MR; i++) {
                        const int8_t *qu = q + i * K + 32 * u;
                        a[i] = _mm256_add_epi16(a[i], _mm256_maddubs_epi16(lo, BCAST4(qu + 4 * h)));
                        a[i] = _mm256_add_epi16(a[i], _mm256_maddubs_epi16(hi, BCAST4(qu + 16 + 4 * h)));
                    }
                    if (t.five && h == 1) {  /* four groups of 5-bit products: as many as 16 bits hold */
#pragma GCC unroll 4
                        for (int i = 0; i < MR; i++) {
                            P[i] = _mm256_madd_epi16(a[i], ones);
                            a[i] = _mm256_setzero_si256();
                        }
                    }
                }
                if (!t.lut)
#pragma GCC unroll 4
                    for (int i = 0; i < MR; i++) P[i] = _mm256_add_epi32(P[i], _mm256_madd_epi16(a[i], ones));
            } else {
                __m256i a[4];
#pragma GCC unroll 4
                for (int i = 0; i < MR; i++) a[i] = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int gq = 0; gq < 8; gq++) {
                    const __m256i w = _mm256_loadu_si256((const __m256i *)(qb + 32 * gq));
                    const __m256i aw = t.sgn ? _mm256_sign_epi8(w, w) : w;
#pragma GCC unroll 4
                    for (int i = 0; i < MR; i++) {
                        __m256i xb = BCAST4(q + i * K + 32 * u + 4 * gq);
                        if (t.sgn) xb = _mm256_sign_epi8(xb, w);
                        a[i] = _mm256_add_epi16(a[i], _mm256_maddubs_epi16(aw, xb));
                    }
                    if ((gq + 1) % t.g16 == 0) {
#pragma GCC unroll 4
                        for (int i = 0; i < MR; i++) {
                            P[i] = _mm256_add_epi32(P[i], _mm256_madd_epi16(a[i], ones));
                            a[i] = _mm256_setzero_si256();
                        }
                    }
                    if (t.nd == 2 && gq == 3) {
#pragma GCC unroll 4
                        for (int i = 0; i < MR; i++) {
                            P0[i] = P[i];
                            P[i] = _mm256_setzero_si256();
                        }
                    }
                }
            }
            const __m256 D0 = unit_scales8(t, unit, 0);
            const __m256 D1 = t.nd == 2 ? unit_scales8(t, unit, 1) : D0;
            const __m256 Mv = t.nm ? unit_scales8(t, unit, t.nd) : D0;
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++)
                unit_terms(t, P0[i], P[i], D0, D1, Mv, dx[i * nq + u], sx[i * nq + u], S + (i * nq + u) * 2,
                           &acc[i][g], &off[i][g]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) out[i * NG + g] = t.nm ? _mm256_add_ps(acc[i][g], off[i][g]) : acc[i][g];
}

#if Q8X_VNNI
/* panel_rows for NG (1 or 2) adjacent groups at once, AVX512-VNNI only (its 32 vector
 * registers hold both groups' unpacked weights): a row's activations are broadcast once for
 * both, and each group's products are summed in four independent chains (integer sums:
 * exact in any order). acc, off: [M][NG]. The same sequence per output as panel_tile.
 * Against one group a call (products, 2 threads, AVX512-VNNI EPYC): 1.13-1.29x faster
 * from 12 to 256 rows for Q8_0, Q5_0, Q6_K, 1.01-1.07x for Q4_K; level at 2-4 rows, where
 * panel_tile stays below rows of 4096 (ROWS_FROM). One row goes here too, one group at a time: a single
 * stream of weights per thread, 1.07-1.69x panel_tile's four groups when the weights come
 * from memory (as a decode step's do), 0.66-0.95x when they sit in cache. */
static inline __attribute__((always_inline)) void panel_rows_vnni(int type, const int8_t *q, const float *dx,
                                                                  const float *sx, const int32_t *S, int64_t K,
                                                                  const uint8_t *grp, int64_t gb, int M, int NG,
                                                                  __m256 *acc, __m256 *off) {
    const xtype t = xinfo(type);
    const int64_t nq = K / 32, ub = unit_bytes(t);
    for (int i = 0; i < M * NG; i++) acc[i] = off[i] = _mm256_setzero_ps();
    for (int64_t u = 0; u < nq; u++) {
        __m256i wv[2][8];
        __m256 D0[2], D1[2], Mv[2];
#pragma GCC unroll 2
        for (int g = 0; g < NG; g++) {
            const uint8_t *unit = grp + g * gb + u * ub;
            if (M > 1) prefetch_ahead(unit, ub);
            vnni_weights(t, unit_quants(t, unit), wv[g]);
            D0[g] = unit_scales8(t, unit, 0);
            D1[g] = t.nd == 2 ? unit_scales8(t, unit, 1) : D0[g];
            Mv[g] = t.nm ? unit_scales8(t, unit, t.nd) : D0[g];
        }
        for (int i = 0; i < M; i++) {
            const int8_t *qu = q + i * K + 32 * u;
            __m256i c[2][4];
#pragma GCC unroll 2
            for (int g = 0; g < NG; g++)
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) c[g][j] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                const __m256i xb = BCAST4(qu + 4 * j);
#pragma GCC unroll 2
                for (int g = 0; g < NG; g++)
                    c[g][(j >> 2) * 2 + (j & 1)] = DOT4(c[g][(j >> 2) * 2 + (j & 1)], wv[g][j], xb);
            }
#pragma GCC unroll 2
            for (int g = 0; g < NG; g++) {
                const __m256i P0 = _mm256_add_epi32(c[g][0], c[g][1]), P1 = _mm256_add_epi32(c[g][2], c[g][3]);
                unit_terms(t, P0, t.nd == 2 ? P1 : _mm256_add_epi32(P0, P1), D0[g], D1[g], Mv[g], dx[i * nq + u],
                           sx[i * nq + u], S + (i * nq + u) * 2, &acc[i * NG + g], &off[i * NG + g]);
            }
        }
    }
    if (t.nm)
        for (int i = 0; i < M * NG; i++) acc[i] = _mm256_add_ps(acc[i], off[i]);
}
#endif

/* Rows [0, M) of x against one group of 8 columns, for many rows: unit by unit, the
 * group's quants are unpacked once into eight registers of unsigned bytes (weights 4j ..
 * 4j + 3 of the 8 columns in register j), then every row in turn sums its products and
 * adds its unit's terms to acc[i] and off[i] (in memory: M of each). The same sequence per
 * output as panel_tile, so the same bits; it does not redo the unpacking for every four
 * rows nor spill a tile's sixteen accumulators (0.8x panel_tile's time at 128 rows, 0.94x
 * at 16 with the weights in cache; streamed, from 5 rows: ROWS_FROM). The AVX2 form (the
 * VNNI build takes panel_rows_vnni). */
static inline __attribute__((always_inline)) void panel_rows(int type, const int8_t *q, const float *dx,
                                                             const float *sx, const int32_t *S, int64_t K,
                                                             const uint8_t *grp, int M, __m256 *acc, __m256 *off) {
    const xtype t = xinfo(type);
    const int64_t nq = K / 32, ub = unit_bytes(t);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int i = 0; i < M; i++) acc[i] = off[i] = _mm256_setzero_ps();
    for (int64_t u = 0; u < nq; u++) {
        const uint8_t *unit = grp + u * ub, *qb = unit_quants(t, unit);
        if (M > 1) prefetch_ahead(unit, ub);
        const uint8_t *signs = qb;  /* the signed weights of register j at 32 j (Q8_0, the IQ4 types) */
        __m256i wv[8];
        if (t.four) {
            const __m256i plane = t.five ? _mm256_loadu_si256((const __m256i *)(qb + 128)) : ones;
#pragma GCC unroll 4
            for (int h = 0; h < 4; h++) nibbles(t, qb, plane, h, &wv[h], &wv[4 + h]);
            if (t.lut) {
                static __thread __attribute__((aligned(32))) uint8_t values[256];
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) {
                    const __m256i v = iq4_values(wv[j]);
                    _mm256_store_si256((__m256i *)(values + 32 * j), v);
                    wv[j] = _mm256_sign_epi8(v, v);
                }
                signs = values;
            }
        } else {
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(qb + 32 * j));
                wv[j] = t.sgn ? _mm256_sign_epi8(w, w) : w;
            }
        }
        const __m256 D0 = unit_scales8(t, unit, 0);
        const __m256 D1 = t.nd == 2 ? unit_scales8(t, unit, 1) : D0;
        const __m256 Mv = t.nm ? unit_scales8(t, unit, t.nd) : D0;
        for (int i = 0; i < M; i++) {
            const int8_t *qu = q + i * K + 32 * u;
            __m256i a = _mm256_setzero_si256(), P = _mm256_setzero_si256(), P0 = P;
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                __m256i xb = BCAST4(qu + 4 * j);
                if (t.sgn) xb = _mm256_sign_epi8(xb, _mm256_loadu_si256((const __m256i *)(signs + 32 * j)));
                a = _mm256_add_epi16(a, _mm256_maddubs_epi16(wv[j], xb));
                if ((j + 1) % t.g16 == 0) {
                    P = _mm256_add_epi32(P, _mm256_madd_epi16(a, ones));
                    a = _mm256_setzero_si256();
                }
                if (t.nd == 2 && j == 3) {
                    P0 = P;
                    P = _mm256_setzero_si256();
                }
            }
            unit_terms(t, P0, P, D0, D1, Mv, dx[i * nq + u], sx[i * nq + u], S + (i * nq + u) * 2, &acc[i], &off[i]);
        }
    }
    if (t.nm)
        for (int i = 0; i < M; i++) acc[i] = _mm256_add_ps(acc[i], off[i]);
}

/* Outputs of a tile -> y, the valid columns only, plus the bias. */
static inline void store_tile(const __m256 *out, int MR, int NG, float *y, int64_t ldy, int64_t ncols,
                              const float *bias) {
    for (int i = 0; i < MR; i++)
        for (int g = 0; g < NG; g++) {
            float v[8];
            _mm256_storeu_ps(v, out[i * NG + g]);
            for (int c = 0; c < 8 && 8 * g + c < ncols; c++)
                y[i * ldy + 8 * g + c] = bias ? v[c] + bias[8 * g + c] : v[c];
        }
}

#endif
