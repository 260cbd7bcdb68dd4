/* The q8x matmul's loop over a panel segment's groups of 8 columns (gemm_q8x.c describes
 * the arithmetic and the layout). Compiled twice: in gemm_q8x.c for AVX2, and in
 * gemm_q8x_vnni.c with Q8X_VNNI 1 for CPUs with AVX512-VNNI (q8x_tiles.h: the same integer
 * sums in fewer instructions, so the same bits). */
#ifndef DSPARK_Q8X_GROUPS_H
#define DSPARK_Q8X_GROUPS_H
#include <immintrin.h>
#include <stdint.h>

#include "q8x_tiles.h"

/* Rows a panel_rows call takes at most (its accumulators: 2 KB of L1, 4 KB for the VNNI
 * form's two groups), and the fewest rows that go to it rather than to panel_tile, by the
 * length K of a row: from 2 rows where K >= 4096; below that from 5, except in the VNNI form
 * where K < 1024 (from 9). Measured with the weights streamed from memory, as a step reads
 * them (docs/journal.md): at K = 4864 the rows path is 1.0-1.4x the tiles at 2-4 rows; at
 * 1536-2048 the tiles are faster there (1.05-1.5x) and slower at 5-8 rows (0.7-0.85x, AVX2
 * 0.7-0.95x at every K); in the VNNI form at 576 and 896 the tiles stay 1.1-1.5x faster to 8. */
#define ROWS_CHUNK 32
#define ROWS_FROM(K) ((K) >= 4096 ? 2 : Q8X_VNNI && (K) < 1024 ? 9 : 5)

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

#if Q8X_VNNI
/* one row with constant sizes, so that its sums stay in registers */
#define ROWS_CALL(T) (M == 1 ? panel_rows_vnni(T, qm, dxm, sxm, Sm, K, grp, gb, 1, 1, out, off) \
                             : panel_rows_vnni(T, qm, dxm, sxm, Sm, K, grp, gb, mr, ng, out, off))
#else
#define ROWS_CALL(T) (M == 1 ? panel_rows(T, qm, dxm, sxm, Sm, K, grp, 1, out, off) : panel_rows(T, qm, dxm, sxm, Sm, K, grp, mr, out, off))
#endif
#define ROWS_TYPES                                                                                      \
    switch (type) {                                                                                    \
        case R_Q4_0: ROWS_CALL(R_Q4_0); break;                \
        case R_Q4_1: ROWS_CALL(R_Q4_1); break;                \
        case R_Q5_0: ROWS_CALL(R_Q5_0); break;                \
        case R_Q5_1: ROWS_CALL(R_Q5_1); break;                \
        case R_Q8_0: ROWS_CALL(R_Q8_0); break;                \
        case R_Q4_K: ROWS_CALL(R_Q4_K); break;                \
        case R_Q5_K: ROWS_CALL(R_Q5_K); break;                \
        case R_IQ4_XS: ROWS_CALL(R_IQ4_XS); break;            \
        case R_IQ4_NL: ROWS_CALL(R_IQ4_NL); break;            \
        default: ROWS_CALL(R_Q6_K); break;                                                             \
    }

/* Groups [g0, g1) of a panel segment of `rows` columns, for all M rows: one row one group at
 * a time through the rows path (AVX2's K types: four groups at a time, panel_tile); up to
 * ROWS_FROM(K) - 1 rows one group at a time, every row against it in tiles of up to four
 * (panel_tile: the group's weights stay in L1 while the rows stream); more rows in chunks of
 * ROWS_CHUNK, one group at a time (panel_rows) or two (panel_rows_vnni). */
static inline void panel_groups(int type, const int8_t *q, const float *dx, const float *sx, const int32_t *S, int64_t M,
                         int64_t K, const uint8_t *data, int64_t gb, int64_t rows, int64_t g0, int64_t g1, float *y,
                         int64_t ldy, const float *bias) {
    const int64_t nq = K / 32;
    __m256 out[2 * ROWS_CHUNK], off[2 * ROWS_CHUNK];
    /* One row goes one group at a time through the rows path: each thread reads one stream of
     * weights. Streamed from memory, against the four groups' tile: VNNI 1.1-2.0x; AVX2 1.4-2.2x
     * for Q8_0, Q4_0 and Q5_0, 0.94-1.04x for the K types, which keep the tile there
     * (docs/journal.md). */
    const int one_stream = Q8X_VNNI || !(type == R_Q4_K || type == R_Q5_K || type == R_Q6_K);
    const int from = ROWS_FROM(K), rows_path = M >= from || (one_stream && M == 1);
    for (int64_t gi = g0; gi < g1;) {
        int ng = 1;  /* groups this step takes */
        if (!one_stream && M == 1 && g1 - gi >= 4)
            ng = 4;
        else if (Q8X_VNNI && M >= from && g1 - gi >= 2)
            ng = 2;
        const uint8_t *grp = data + gi * gb;
        const int64_t col = 8 * gi, ncols = rows - col < 8 * ng ? rows - col : 8 * ng;
        for (int64_t m = 0; m < M;) {
            const int chunk = M >= from ? ROWS_CHUNK : 4;
            const int mr = M - m >= chunk ? chunk : (int)(M - m);
            const int8_t *qm = q + m * K;
            const float *dxm = dx + m * nq, *sxm = sx + m * nq;
            const int32_t *Sm = S + m * nq * 2;
            if (rows_path) {
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
#undef ROWS_CALL
#undef PANEL_TYPES

#endif
