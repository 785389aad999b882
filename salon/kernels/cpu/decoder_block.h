/* One pre-norm decoder layer over the paged int8 KV cache in one C call -- Gemma 3's or Llama's: every op the
 * model makes for the layer (salon/engine/model/models/gemma3.py and llama.py, their kernel-family calls), in
 * the same order, with the same functions, so every bit is the one the model's own composition gives
 * (salon/kernels/decoder_block.py says when it runs; tests/model/test_model_decoder_block.py checks the bits):
 *
 *   qkv  = linear_two_terms(x, norm attn_norm, W_qkv)              (linear_two_terms.h; linear_int16 or
 *                                                                   linear_group32 in those recipes)
 *   q    = rope(rmsnorm(q heads, q_norm))                          (rmsnorm.c's norm_row, rope.c's rope_row:
 *   k    = rope(rmsnorm(k heads, k_norm))                           rmsnorm_rope.c's loop; Llama: rope only)
 *   cache[slot] = int8(k), int8(v)                                 (quantize.c's kv_write_rows)
 *   a    = paged_attention(q, cache, block tables)                 (paged_attention.h)
 *   x1   = x + rmsnorm(linear_two_terms(a, W_o), post_attention_norm)       (Llama: no post-norm)
 *   h    = act(linear_two_terms(x1, norm ffn_norm, W_gate_up))     (glu.c: GeGLU for Gemma, SwiGLU for Llama)
 *   out  = x1 + rmsnorm(linear_two_terms(h, W_down), post_ffw_norm)         (Llama: no post-norm)
 *
 * A layer that reads another layer's KV (writes_kv = 0) computes q only and writes nothing. The Linears' scales
 * are grouped (f32[N, K/32], BLOCK_GEMM) or one per row (f32[N], BLOCK_ROW_GEMM, which may decline row counts
 * its build's composition would send elsewhere). What is saved is the Python between the ops (a decode step's
 * layer made about twenty calls), and with it the gaps in which the GEMMs' OpenMP threads went to sleep: the
 * layer's four GEMMs now run back to back.
 *
 * The includer brings the kernels of one CPU build (decoder_block_avx512.c, decoder_block_avx2.c), and defines
 * BLOCK_GEMM (its grouped W8A8 GEMM), BLOCK_GEMM_SUM2 (the same summing two terms as it stores them, or NULL:
 * linear_two_terms.h's gemm8_sum), BLOCK_ROW_GEMM (its per-row one, as a grouped_gemm_fn), BLOCK_KV_WRITE
 * (its kv_write_rows), BLOCK_ENTRY (the entry point's name) and BLOCK_LAYERS_ENTRY (the step's layers in one
 * call), BLOCK_GROUP32_GEMM (its group32 GEMM), and includes w16a8_grouped.c (the int16 GEMM); paged_attention_i8 is
 * the build's attention.
 * The scratch rows are allocated per call (a decode step's are a few kilobytes). The row-wise work (q/k norm and
 * RoPE, the GLU, linear_with's) splits its rows over the threads from ROWS_PARALLEL rows (linear_two_terms.h).
 */
#ifndef SALON_DECODER_BLOCK_H
#define SALON_DECODER_BLOCK_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "linear_two_terms.h"

#define BLOCK_MAX_HEAD_DIM 1024
#define BLOCK_GEGLU 0
#define BLOCK_SWIGLU 1

/* One layer's weights and geometry (constant while the model lives). Norm weights f32 (q_norm, k_norm and the
   post-norms NULL where the architecture has none); each Linear int8 w[N, K] with f32 scales [N, K / 32], or
   [N] with per_row_scales. */
typedef struct {
    int64_t d_model, num_heads, num_kv_heads, head_dim, ffn_dim;
    int64_t writes_kv;       /* 1: computes k/v and writes them; 0: attends over another layer's KV */
    int64_t sliding_window;  /* 0: global attention */
    int64_t per_row_scales;  /* 1: one weight scale per row (BLOCK_ROW_GEMM); 0: per row and 32 channels */
    int64_t activation;      /* BLOCK_GEGLU or BLOCK_SWIGLU */
    int64_t int16_activations; /* 1: every Linear takes one int16 term a row (w16a8_grouped_avx2, grouped
                                  scales only); 0: two int8 terms */
    int64_t group32_activations; /* 1: every Linear takes one int8 term per token and 32 channels
                                    (BLOCK_GROUP32_GEMM, grouped scales only) */
    double eps;
    float sm_scale;
    const float *attn_norm, *q_norm, *k_norm, *post_attention_norm, *ffn_norm, *post_ffw_norm;
    const int8_t *qkv_w, *o_w, *gate_up_w, *down_w;
    const float *qkv_s, *o_s, *gate_up_s, *down_s;
} block_weights;

/* The layer's KV cache slot: int8 k/v [num_blocks, block_size, Hkv, D], f32 scales [num_blocks, block_size, Hkv]. */
typedef struct {
    int8_t *k_cache, *v_cache;
    float *k_scale, *v_scale;
    int64_t block_size;
} block_cache;

/* One step's rows for the layer's KV cache group: T query rows of S sequences, grouped by sequence in order. */
typedef struct {
    int64_t num_tokens, num_seqs, max_blocks;
    const int64_t *positions;     /* [T] */
    const int64_t *slot_mapping;  /* [T]: cache slot (block * block_size + offset) of each row's k/v */
    const int32_t *block_tables;  /* [S, max_blocks] */
    const int32_t *query_start_loc, *seq_lens, *row_seq;  /* [S + 1], [S], [T] */
} block_batch;

/* A layer's row-wise work, its rows split by for_rows (linear_two_terms.h): BLOCK_ENTRY's arguments and scratch. */
typedef struct {
    const block_weights *L;
    const block_batch *B;
    const float *cos, *sin;
    float *qkv, *q, *kv, *h, *act;
    int64_t T, n_qkv, half;
    float inv_d, eps_f;
} block_rows;

/* Row t's q heads and (writes_kv) its k heads: rmsnorm (q_norm, k_norm where the architecture has them), RoPE at
   its position; its v copied beside the k rows for the KV write. */
static void block_qk_row(void *ctx, int64_t t, int thread) {
    const block_rows *c = ctx;
    const block_weights *L = c->L;
    const int64_t Hq = L->num_heads, Hkv = L->num_kv_heads, D = L->head_dim, T = c->T, n_qkv = c->n_qkv;
    const float *cs = c->cos + c->B->positions[t] * c->half, *sn = c->sin + c->B->positions[t] * c->half;
    float row[BLOCK_MAX_HEAD_DIM];
    (void)thread;
    for (int64_t hd = 0; hd < Hq; hd++) {
        const float *head = c->qkv + t * n_qkv + hd * D;
        if (L->q_norm) {
            norm_row(head, L->q_norm, row, D, c->inv_d, c->eps_f);
            head = row;
        }
        rope_row(head, cs, sn, c->half, c->q + (t * Hq + hd) * D);
    }
    if (!L->writes_kv) return;
    for (int64_t hd = 0; hd < Hkv; hd++) {
        const float *head = c->qkv + t * n_qkv + (Hq + hd) * D;
        if (L->k_norm) {
            norm_row(head, L->k_norm, row, D, c->inv_d, c->eps_f);
            head = row;
        }
        rope_row(head, cs, sn, c->half, c->kv + (t * Hkv + hd) * D);
    }
    memcpy(c->kv + (T + t) * Hkv * D, c->qkv + t * n_qkv + (Hq + Hkv) * D, (size_t)(Hkv * D) * sizeof(float));
}

/* Row t of the GLU: act[t] = act(gate) * up of h[t] (glu.c's row function). */
static void block_glu_row(void *ctx, int64_t t, int thread) {
    const block_rows *c = ctx;
    const int64_t F = c->L->ffn_dim;
    (void)thread;
    (c->L->activation == BLOCK_SWIGLU ? swiglu_row : geglu_row)(c->h + t * 2 * F, F, c->act + t * F);
}

/* x f32[T, d_model] (contiguous) -> the layer's output, in place; cos/sin f32[P, D / 2] the RoPE tables of the
   layer's base (P > every position). Returns 0 when done, 1 when nothing was computed (shapes a kernel
   declines, no memory): x is then unchanged. */
int BLOCK_ENTRY(const block_weights *L, const block_cache *C, const block_batch *B, const float *cos,
                const float *sin, float *x, float scale_floor, int nthreads) {
    const int64_t T = B->num_tokens, d = L->d_model, Hq = L->num_heads, Hkv = L->num_kv_heads;
    const int64_t D = L->head_dim, F = L->ffn_dim, half = D / 2;
    const int64_t n_qkv = L->writes_kv ? (Hq + 2 * Hkv) * D : Hq * D;
    if (T < 1 || D < 2 || D % 2 || D > BLOCK_MAX_HEAD_DIM) return 1;
    const float eps_f = (float)L->eps, inv_d = (float)(1.0 / (double)D);
    const int one_term = L->int16_activations || L->group32_activations;
    if ((one_term && L->per_row_scales) || (L->int16_activations && L->group32_activations)) return 1;
    const linear_gemm gemm = {one_term ? NULL : L->per_row_scales ? BLOCK_ROW_GEMM : BLOCK_GEMM,
                              L->int16_activations ? w16a8_grouped_avx2 : NULL,
                              L->group32_activations ? BLOCK_GROUP32_GEMM : NULL,
                              one_term || L->per_row_scales ? NULL : BLOCK_GEMM_SUM2};
    float *qkv = malloc((size_t)(T * n_qkv) * sizeof(float));
    float *q = malloc((size_t)(T * Hq * D) * sizeof(float));
    float *kv = L->writes_kv ? malloc((size_t)(2 * T * Hkv * D) * sizeof(float)) : NULL;
    float *att = malloc((size_t)(T * Hq * D) * sizeof(float));
    float *x1 = malloc((size_t)(T * d) * sizeof(float));
    float *h = malloc((size_t)(T * 2 * F) * sizeof(float));
    float *act = malloc((size_t)(T * F) * sizeof(float));
    int status = 1;
    if (!qkv || !q || (L->writes_kv && !kv) || !att || !x1 || !h || !act) goto done;

    /* attention */
    if (linear_with(gemm, x, T, d, d, L->attn_norm, L->eps, L->qkv_w, L->qkv_s, n_qkv, NULL, NULL, 0, qkv,
                    scale_floor, nthreads))
        goto done;
    block_rows rows = {L, B, cos, sin, qkv, q, kv, h, act, T, n_qkv, half, inv_d, eps_f};
    for_rows(T, nthreads, block_qk_row, &rows);
    if (L->writes_kv) {
        BLOCK_KV_WRITE(kv, T, Hkv, D, C->k_cache, C->k_scale, B->slot_mapping, scale_floor, nthreads);
        BLOCK_KV_WRITE(kv + T * Hkv * D, T, Hkv, D, C->v_cache, C->v_scale, B->slot_mapping, scale_floor, nthreads);
    }
    paged_attention_i8(q, C->k_cache, C->v_cache, C->k_scale, C->v_scale, B->block_tables, B->max_blocks,
                       B->query_start_loc, B->seq_lens, B->row_seq, T, Hq, Hkv, D, C->block_size, L->sm_scale,
                       L->sliding_window, att, nthreads);
    if (linear_with(gemm, att, T, Hq * D, Hq * D, NULL, L->eps, L->o_w, L->o_s, d, L->post_attention_norm, x,
                    d, x1, scale_floor, nthreads))
        goto done;

    /* feed-forward */
    if (linear_with(gemm, x1, T, d, d, L->ffn_norm, L->eps, L->gate_up_w, L->gate_up_s, 2 * F, NULL, NULL, 0,
                    h, scale_floor, nthreads))
        goto done;
    for_rows(T, nthreads, block_glu_row, &rows);
    /* the last op writes x itself: its residual is x1, so x is only overwritten once nothing can fail */
    if (linear_with(gemm, act, T, F, F, NULL, L->eps, L->down_w, L->down_s, d, L->post_ffw_norm, x1, d, x,
                    scale_floor, nthreads))
        goto done;
    status = 0;
done:
    free(qkv);
    free(q);
    free(kv);
    free(att);
    free(x1);
    free(h);
    free(act);
    return status;
}

/* Layers 0 .. n - 1 of a step in order on x, each as BLOCK_ENTRY with L[i], C[i], B[i] and its RoPE tables
   cos[i], sin[i]: one call for the step's layers instead of one each (what it saves is the Python between them).
   Returns how many were done: at the first layer that computes nothing it stops, and x holds the output of the
   layer before it (x itself when none was done). */
int64_t BLOCK_LAYERS_ENTRY(int64_t n, const block_weights *const *L, const block_cache *const *C,
                           const block_batch *const *B, const float *const *cos, const float *const *sin, float *x,
                           float scale_floor, int nthreads) {
    for (int64_t i = 0; i < n; i++)
        if (BLOCK_ENTRY(L[i], C[i], B[i], cos[i], sin[i], x, scale_floor, nthreads)) return i;
    return n;
}

#endif
