/* A model's decoder layers in one call (bf16w, bf16x, f32w or GGUF-quantized weights): the same kernels, in the same order, as
 * the layer-by-layer path of dspark/runtime/model.py (`DecoderLayer.forward` with the
 * native kernels), so the two give the same bits. What it saves is the interpreter:
 * a decode step of a 30-layer model otherwise makes some 300 calls from Python, each
 * with its argument checks and fresh output tensors, a few milliseconds a step that
 * the arithmetic of one token does not need.
 *
 * Per layer (x [N, hidden] is updated in place):
 *   h = rmsnorm(x) * ln1;  qkv = h @ Wqkv^T (+ b);  per-head rmsnorm of queries and
 *   keys where the layer has them (Qwen3);  rotary on queries and keys;
 *   keys/values into the cache, attention;  x = x + attn @ Wo^T;
 *   h = rmsnorm(x) * ln2;  gu = h @ Wgu^T;  x = x + (silu(gate) * up) @ Wdown^T
 * and, where asked, a copy of x after the layer into the taps.
 *
 * Built on first use by dspark/runtime/cpu_kernels.py with the other kernels.
 */
#include <stdint.h>
#include <string.h>

#include "kernels.h"

/* The layers' matmul: 0 = bf16w (bf16 weights, fp32 activations), 1 = bf16x (bf16
 * activations, see gemm_bf16dot.c), 2 = f32w (fp32 weights), 3 = a GGUF file's blocks
 * (wp: a descriptor, see gemm_quant.c); all batch-invariant. */
static void gemm(int kind, const float *x, const void *wp, const float *bias, float *y, int64_t M, int64_t N,
                 int64_t K, int threads) {
    if (kind == 3)
        dspark_gemm_quant(x, (const int64_t *)wp, bias, y, M, N, K, threads);
    else if (kind == 2)
        dspark_gemm_f32w_packed(x, (const float *)wp, bias, y, M, N, K, threads);
    else if (kind == 1)
        dspark_gemm_bf16x_packed(x, (const uint16_t *)wp, bias, y, M, N, K, threads);
    else
        dspark_gemm_bf16w_packed(x, (const uint16_t *)wp, bias, y, M, N, K, threads);
}

/* Bytes per stored weight of a kind. */
static int64_t weight_bytes(int kind) { return kind == 2 ? 4 : 2; }

/* The pointers of one layer, in this order, as int64 (see native_stack.py). */
enum { W_QKV, B_QKV, W_O, W_GU, W_DOWN, LN1, LN2, K_CACHE, V_CACHE, Q_NORM, K_NORM, LAYER_PTRS };

/* x [N, hidden] in place. ptrs [layers][LAYER_PTRS]. cos, sin [N, D]; slots and
 * positions [N] (checked by the caller); visible [N] or NULL: the keys each token
 * attends to (see dspark_attention_f32_span; NULL = causal). scratch: at least
 * N * (2 hidden + (H + 2 KVH) D + H D + 3 I) floats. taps [N, ntaps, hidden];
 * tap_col[layer]: the column the layer's output is copied to, or -1.
 * Returns 0, or -1 when attention found a slot or position out of range. */
int dspark_decoder_layers(float *x, int64_t N, const int64_t *ptrs, int64_t layers, int64_t hidden, int64_t H,
                         int64_t KVH, int64_t D, int64_t I, int64_t S, int64_t L, const float *cos,
                         const float *sin, const int64_t *slots, const int64_t *positions, const int64_t *visible,
                         float eps, float scale,
                         float *scratch, float *taps, const int64_t *tap_col, int64_t ntaps, int threads,
                         int kind) {
    const int64_t W = (H + 2 * KVH) * D;
    float *h = scratch, *tmp = h + N * hidden, *qkv = tmp + N * hidden, *ao = qkv + N * W, *gu = ao + N * H * D,
          *act = gu + N * 2 * I;
    for (int64_t l = 0; l < layers; l++) {
        const int64_t *p = ptrs + l * LAYER_PTRS;
        dspark_rmsnorm_f32(x, (const float *)p[LN1], h, N, hidden, eps, threads);
        gemm(kind, h, (const void *)p[W_QKV], (const float *)p[B_QKV], qkv, N, W, hidden,
                                 threads);
        if (p[Q_NORM])
            for (int64_t n = 0; n < N; n++) {
                float *q = qkv + n * W;
                dspark_rmsnorm_f32(q, (const float *)p[Q_NORM], q, H, D, eps, threads);
                dspark_rmsnorm_f32(q + H * D, (const float *)p[K_NORM], q + H * D, KVH, D, eps, threads);
            }
        dspark_rope_f32(qkv, W, cos, sin, N, H + KVH, D);
        if (dspark_attention_f32_span(qkv, W, (float *)p[K_CACHE], (float *)p[V_CACHE], slots, positions, visible,
                                      ao, N, S, H, KVH, D, L, scale, threads))
            return -1;
        gemm(kind, ao, (const void *)p[W_O], 0, tmp, N, hidden, H * D, threads);
        for (int64_t i = 0; i < N * hidden; i++) x[i] = x[i] + tmp[i];
        dspark_rmsnorm_f32(x, (const float *)p[LN2], h, N, hidden, eps, threads);
        gemm(kind, h, (const void *)p[W_GU], 0, gu, N, 2 * I, hidden, threads);
        dspark_silu_mul_f32(gu, act, N, I, threads);
        gemm(kind, act, (const void *)p[W_DOWN], 0, tmp, N, hidden, I, threads);
        for (int64_t i = 0; i < N * hidden; i++) x[i] = x[i] + tmp[i];
        if (tap_col[l] >= 0)
            for (int64_t n = 0; n < N; n++)
                memcpy(taps + (n * ntaps + tap_col[l]) * hidden, x + n * hidden, hidden * sizeof(float));
    }
    return 0;
}

/* A drafter's context keys and values (DSpark, DFlash: the target's tapped hidden
 * states injected as keys and values of every layer), for N new context tokens:
 *   f = rmsnorm(taps @ Wfc^T) * hn;  per layer: k, v = f @ [Wk; Wv]^T (+ b), read from
 *   the k and v panels of the fused qkv weight;  per-head k norm where present;
 *   rotary on the keys;  both into the layer's cache at (slots[t], positions[t]).
 * taps [N, tap_width]; fc: the packed [hidden, tap_width] weight; ptrs as above (the
 * caches and norms included); scratch: at least N * (2 hidden + 2 KVH D) floats.
 * Returns 0, or -1 (nothing written) when a slot or a position is out of range, or a
 * quantized qkv descriptor does not split after the H*D query rows. */
int dspark_drafter_context(const float *taps, int64_t N, int64_t tap_width, const void *fc,
                                 const float *hn, const int64_t *ptrs, int64_t layers, int64_t hidden, int64_t H,
                                 int64_t KVH, int64_t D, int64_t S, int64_t L, const float *cos, const float *sin,
                                 const int64_t *slots, const int64_t *positions, float eps, float *scratch,
                                 int threads, int kind) {
    for (int64_t t = 0; t < N; t++)
        if (slots[t] < 0 || slots[t] >= S || positions[t] < 0 || positions[t] >= L) return -1;
    const int64_t KV = 2 * KVH * D;
    float *f = scratch, *tmp = f + N * hidden, *kv = tmp + N * hidden;
    gemm(kind, taps, fc, 0, tmp, N, hidden, tap_width, threads);
    dspark_rmsnorm_f32(tmp, hn, f, N, hidden, eps, threads);
    for (int64_t l = 0; l < layers; l++) {
        const int64_t *p = ptrs + l * LAYER_PTRS;
        /* the packed weight is panels of [hidden][16]: the keys' panels start at panel H*D/16;
         * a quantized one is a descriptor of segments: the keys' start after H*D rows */
        const void *wkv = (const char *)p[W_QKV] + H * D * hidden * weight_bytes(kind);
        int64_t kv_desc[1 + 4 * 8];
        if (kind == 3) {
            const int64_t *d = (const int64_t *)p[W_QKV];
            int64_t rows = 0, s = 0;
            while (s < d[0] && rows < H * D) rows += d[1 + 4 * s + 1], s++;
            if (rows != H * D || d[0] - s > 8) return -1;
            kv_desc[0] = d[0] - s;
            memcpy(kv_desc + 1, d + 1 + 4 * s, (size_t)(4 * kv_desc[0]) * sizeof(int64_t));
            wkv = kv_desc;
        }
        const float *bkv = p[B_QKV] ? (const float *)p[B_QKV] + H * D : 0;
        gemm(kind, f, wkv, bkv, kv, N, KV, hidden, threads);
        if (p[K_NORM])
            for (int64_t n = 0; n < N; n++) dspark_rmsnorm_f32(kv + n * KV, (const float *)p[K_NORM], kv + n * KV,
                                                               KVH, D, eps, threads);
        dspark_rope_f32(kv, KV, cos, sin, N, KVH, D);
        float *kc = (float *)p[K_CACHE], *vc = (float *)p[V_CACHE];
        for (int64_t t = 0; t < N; t++)
            for (int64_t kh = 0; kh < KVH; kh++) {
                const int64_t at = ((slots[t] * KVH + kh) * L + positions[t]) * D;
                memcpy(kc + at, kv + t * KV + kh * D, D * sizeof(float));
                memcpy(vc + at, kv + t * KV + (KVH + kh) * D, D * sizeof(float));
            }
    }
    return 0;
}
