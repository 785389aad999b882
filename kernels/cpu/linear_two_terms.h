/* The two-term int8 Linear of grouped weights as one C function, bit for bit the composition of the kernels
 * the including file brings in (kernels.linear_two_terms has the contract and the reference):
 *
 *   h   = rmsnorm(x, norm_w)                          (optional; rmsnorm.c's norm_row)
 *   q, s = the two int8 terms of every row of h       (quantize.c's quantize_two_terms_rows arithmetic)
 *   y   = gemm(q, s, w)                               (the grouped W8A8 GEMM of 2M rows: both terms, the
 *                                                      weights read once)
 *   o   = y[m] + y[M + m]                             (the terms' sum, one rounding)
 *   out = residual + rmsnorm(o, post_w)               (optional post-norm, optional residual)
 *
 * The includer brings rmsnorm.c, quantize.c and one grouped GEMM (w8a8_grouped_vnni.c or w8a8_grouped.c) and
 * passes that GEMM's entry point: linear_two_terms.c (VNNI), linear_two_terms_avx2.c (AVX2), and the decoder
 * block (decoder_block.h) through either. The same functions run in the same order as when each is its own
 * call, so every bit is the same; what is saved is the calls between them (a decode step makes about ten per
 * layer, each a few microseconds of Python, tensor allocation and argument conversion). The row-wise work
 * before and after the GEMM runs on the calling thread (a few rows at decode sizes); the GEMM splits its
 * weight rows over the threads.
 *
 * fp-contract is off for every included file (rmsnorm.c's pragma comes first); none of quantize.c's
 * functions holds a product followed by a sum outside its own fp-contract=off section, so none changes.
 */
#ifndef SALON_LINEAR_TWO_TERMS_H
#define SALON_LINEAR_TWO_TERMS_H

#include <stdint.h>
#include <stdlib.h>

/* A grouped W8A8 GEMM's entry point (w8a8_grouped_vnni, w8a8_grouped_avx2): 0 when done, 1 when declined. */
typedef int (*grouped_gemm_fn)(const int8_t *a, int64_t lda, const int8_t *w, const float *w_scale, float *out,
                               int64_t ldo, const float *a_scale, int64_t M, int64_t N, int64_t K, int nthreads);

/* out[i] = a[i] + b[i] for n floats (one rounding each). */
static void add_rows(const float *a, const float *b, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* x f32[M, K] (row stride sx) -> out f32[M, N] contiguous; norm_w f32[K], post_w f32[N] and residual f32[M, N]
   (row stride sr) optional (NULL). Returns 0 when done, 1 when nothing was computed (shapes the GEMM
   declines, no memory). */
static int linear_two_terms_with(grouped_gemm_fn gemm, const float *x, int64_t M, int64_t K, int64_t sx,
                                 const float *norm_w, double eps, const int8_t *w, const float *w_scale, int64_t N,
                                 const float *post_w, const float *residual, int64_t sr, float *out,
                                 float scale_floor, int nthreads) {
    if (M < 1 || K < GROUP || K % GROUP || N < 1) return 1;
    const float eps_f = (float)eps;
    const int64_t ks = (K + 15) / 16 * 16;
    float *h = norm_w ? malloc((size_t)(M * K) * sizeof(float)) : NULL;
    float *r = aligned_alloc(64, (size_t)ks * sizeof(float));
    int8_t *q = malloc((size_t)(2 * M * K));
    float *s = malloc((size_t)(2 * M) * sizeof(float));
    float *y = malloc((size_t)(2 * M * N) * sizeof(float));
    float *o = post_w ? malloc((size_t)N * sizeof(float)) : NULL;
    int status = 1;
    if ((norm_w && !h) || !r || !q || !s || !y || (post_w && !o)) goto done;
    const float *src = x;
    int64_t ss = sx;
    if (norm_w) {
        const float inv_k = (float)(1.0 / (double)K);
        for (int64_t m = 0; m < M; m++) norm_row(x + m * sx, norm_w, h + m * K, K, inv_k, eps_f);
        src = h;
        ss = K;
    }
    for (int64_t m = 0; m < M; m++) {
        s[m] = quantize_row_avx2(src + m * ss, K, q + m * K, scale_floor);
        residual_row(src + m * ss, q + m * K, s[m], K, r);
        s[M + m] = quantize_row_avx2(r, K, q + (M + m) * K, scale_floor);
    }
    if (gemm(q, K, w, w_scale, y, N, s, 2 * M, N, K, nthreads)) goto done;
    const float inv_n = (float)(1.0 / (double)N);
    for (int64_t m = 0; m < M; m++) {
        float *dst = out + m * N;
        if (!post_w) {
            add_rows(y + m * N, y + (M + m) * N, dst, N);
            if (residual) add_rows(residual + m * sr, dst, dst, N);
            continue;
        }
        add_rows(y + m * N, y + (M + m) * N, o, N);
        norm_row(o, post_w, dst, N, inv_n, eps_f);
        if (residual) add_rows(residual + m * sr, dst, dst, N);
    }
    status = 0;
done:
    free(h);
    free(r);
    free(q);
    free(s);
    free(y);
    free(o);
    return status;
}

#endif
