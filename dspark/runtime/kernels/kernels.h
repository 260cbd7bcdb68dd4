/* The native kernels' entry points, for the kernels that call one another
 * (decoder_f32.c runs a model's decoder layers through the others). */
#ifndef DSPARK_KERNELS_H
#define DSPARK_KERNELS_H
#include <stdint.h>

void dspark_gemm_bf16w_packed(const float *x, const uint16_t *wp, const float *bias, float *y, int64_t M,
                              int64_t N, int64_t K, int threads);
int dspark_attention_f32(const float *qkv, int64_t row, float *k_cache, float *v_cache, const int64_t *slots,
                         const int64_t *positions, float *out, int64_t N, int64_t S, int64_t H, int64_t KVH,
                         int64_t D, int64_t L, float scale, int threads);
int dspark_gemm_bf16w_isa(void);
void dspark_gemm_f32w_packed(const float *x, const float *wp, const float *bias, float *y, int64_t M, int64_t N,
                             int64_t K, int threads);
void dspark_gemm_bf16x_packed(const float *x, const uint16_t *wp, const float *bias, float *y, int64_t M,
                              int64_t N, int64_t K, int threads);
int dspark_attention_f32_span(const float *qkv, int64_t row, float *k_cache, float *v_cache, const int64_t *slots,
                              const int64_t *positions, const int64_t *visible, float *out, int64_t N, int64_t S,
                              int64_t H, int64_t KVH, int64_t D, int64_t L, float scale, int threads);
void dspark_rmsnorm_f32(const float *x, const float *w, float *out, int64_t M, int64_t K, float eps, int threads);
void dspark_silu_mul_f32(const float *gu, float *out, int64_t M, int64_t I, int threads);
void dspark_rope_f32(float *x, int64_t row, const float *cos, const float *sin, int64_t N, int64_t heads,
                     int64_t D);

/* The q8x precision (gemm_q8x.c): a descriptor whose segments are of X_OFF + type. */
void dspark_gemm_q8x(const float *x, const int64_t *desc, const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                     int threads);
int64_t dspark_q8x_group_bytes(int type, int64_t K);
int dspark_q8x_panel_type(int file_type);
/* Columns [c, c + nc) of a repacked or float segment in the gguf precision's order, one
 * element at a time (quant_repack.c). */
void dspark_quant_ref_cols(int type, const uint8_t *data, int64_t rb, int64_t c, int64_t nc, const float *x,
                           int64_t M, int64_t K, float *y, int64_t ldy, const float *bias, float *w);
void dspark_q8x_pack(int type, const uint8_t *src, int64_t rb, int64_t rows, int64_t K, uint8_t *dst);
void dspark_q8x_dequant(int type, const uint8_t *panel, int64_t rows, int64_t K, float *out);
/* gemm_q8x_vnni.c: the panel groups with vpdpbusd (the same bits). */
int dspark_q8x_vnni_available(void);
void dspark_q8x_groups_vnni(int type, const int8_t *q, const float *dx, const float *sx, const int32_t *S, int64_t M,
                            int64_t K, const uint8_t *data, int64_t gb, int64_t rows, int64_t g0, int64_t g1, float *y,
                            int64_t ldy, const float *bias);
void dspark_gemm_q8x_ref(const float *x, const int64_t *desc, const float *bias, float *y, int64_t M, int64_t N,
                         int64_t K);
void dspark_gemm_quant(const float *x, const int64_t *desc, const float *bias, float *y, int64_t M, int64_t N,
                       int64_t K, int threads);

#endif
