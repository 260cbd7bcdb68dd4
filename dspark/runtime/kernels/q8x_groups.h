/* The q8x matmul's loop over a panel segment's groups of 8 columns (gemm_q8x.c describes
 * the arithmetic and the layout). Compiled twice: in gemm_q8x.c for AVX2, and in
 * gemm_q8x_vnni.c with Q8X_VNNI 1 for CPUs with AVX512-VNNI (q8x_tiles.h: the same integer
 * sums in fewer instructions, so the same bits). */
#ifndef DSPARK_Q8X_GROUPS_H
#define DSPARK_Q8X_GROUPS_H
#include <immintrin.h>
#include <stdint.h>

#include "q8x_tiles.h"

/* Rows a panel_rows call takes at most (its accumulators: 2 KB of L1), and the fewest rows
 * that go to it rather than to panel_tile. */
#define ROWS_CHUNK 32
#define ROWS_MIN 9

#define PANEL_TYPES(mr, ng)                                                                             \
    switch (type) {                                                                                    \
        case R_Q4_0: panel_tile(R_Q4_0, qm, dxm, sxm, Sm, K, grp, gb, out, mr, ng); break;             \
        case R_Q4_1: panel_tile(R_Q4_1, qm, dxm, sxm, Sm, K, grp, gb, out, mr, ng); break;             \
        case R_Q5_0: panel_tile(R_Q5_0, qm, dxm, sxm, Sm, K, grp, gb, out, mr, ng); break;             \
        case R_Q5_1: panel_tile(R_Q5_1, qm, dxm, sxm, Sm, K, grp, gb, out, mr, ng); break;             \
        case R_Q8_0: panel_tile(R_Q8_0, qm, dxm, sxm, Sm, K, grp, gb, out, mr, ng); break;             \
        case R_Q4_K: panel_tile(R_Q4_K, qm, dxm, sxm, Sm, K, grp, gb, out, mr, ng); break;             \
        case R_Q5_K: panel_tile(R_Q5_K, qm, dxm, sxm, Sm, K, grp, gb, out, mr, ng); break;             \
        case R_IQ4_XS: panel_tile(R_IQ4_XS, qm, dxm, sxm, Sm, K, grp, gb, out, mr, ng); break;         \
        case R_IQ4_NL: panel_tile(R_IQ4_NL, qm, dxm, sxm, Sm, K, grp, gb, out, mr, ng); break;         \
        default: panel_tile(R_Q6_K, qm, dxm, sxm, Sm, K, grp, gb, out, mr, ng); break;                 \
    }

#define ROWS_TYPES                                                                                      \
    switch (type) {                                                                                    \
        case R_Q4_0: panel_rows(R_Q4_0, qm, dxm, sxm, Sm, K, grp, mr, out, off); break;                \
        case R_Q4_1: panel_rows(R_Q4_1, qm, dxm, sxm, Sm, K, grp, mr, out, off); break;                \
        case R_Q5_0: panel_rows(R_Q5_0, qm, dxm, sxm, Sm, K, grp, mr, out, off); break;                \
        case R_Q5_1: panel_rows(R_Q5_1, qm, dxm, sxm, Sm, K, grp, mr, out, off); break;                \
        case R_Q8_0: panel_rows(R_Q8_0, qm, dxm, sxm, Sm, K, grp, mr, out, off); break;                \
        case R_Q4_K: panel_rows(R_Q4_K, qm, dxm, sxm, Sm, K, grp, mr, out, off); break;                \
        case R_Q5_K: panel_rows(R_Q5_K, qm, dxm, sxm, Sm, K, grp, mr, out, off); break;                \
        case R_IQ4_XS: panel_rows(R_IQ4_XS, qm, dxm, sxm, Sm, K, grp, mr, out, off); break;            \
        case R_IQ4_NL: panel_rows(R_IQ4_NL, qm, dxm, sxm, Sm, K, grp, mr, out, off); break;            \
        default: panel_rows(R_Q6_K, qm, dxm, sxm, Sm, K, grp, mr, out, off); break;                    \
    }

/* Groups [g0, g1) of a panel segment of `rows` columns, for all M rows: one row four groups
 * at a time; up to ROWS_MIN - 1 rows one group at a time, every row against it in tiles of
 * up to four (panel_tile: the group's weights stay in L1 while the rows stream); more rows
 * one group at a time in chunks of ROWS_CHUNK (panel_rows). */
static inline void panel_groups(int type, const int8_t *q, const float *dx, const float *sx, const int32_t *S, int64_t M,
                         int64_t K, const uint8_t *data, int64_t gb, int64_t rows, int64_t g0, int64_t g1, float *y,
                         int64_t ldy, const float *bias) {
    const int64_t nq = K / 32;
    __m256 out[ROWS_CHUNK], off[ROWS_CHUNK];
    for (int64_t gi = g0; gi < g1;) {
        const int ng = M == 1 && g1 - gi >= 4 ? 4 : 1;
        const uint8_t *grp = data + gi * gb;
        const int64_t col = 8 * gi, ncols = rows - col < 8 * ng ? rows - col : 8 * ng;
        for (int64_t m = 0; m < M;) {
            const int chunk = M >= ROWS_MIN ? ROWS_CHUNK : 4;
            const int mr = M - m >= chunk ? chunk : (int)(M - m);
            const int8_t *qm = q + m * K;
            const float *dxm = dx + m * nq, *sxm = sx + m * nq;
            const int32_t *Sm = S + m * nq * 2;
            if (M >= ROWS_MIN) {
                ROWS_TYPES
            } else if (ng == 4) {
                PANEL_TYPES(1, 4)
            } else {
                switch (mr) {
                    case 4: PANEL_TYPES(4, 1) break;
                    case 3: PANEL_TYPES(3, 1) break;
                    case 2: PANEL_TYPES(2, 1) break;
                    default: PANEL_TYPES(1, 1) break;
                }
            }
            store_tile(out, mr, ng, y + m * ldy + col, ldy, ncols, bias ? bias + col : 0);
            m += mr;
        }
        gi += ng;
    }
}
#undef ROWS_TYPES
#undef PANEL_TYPES

#endif
