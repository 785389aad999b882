/* The two-term int8 Linear of grouped weights in one call on AVX-512 VNNI CPUs (linear_two_terms.h has the
 * composition; w8a8_grouped_vnni.c is its GEMM), and the group32 one (linear_group32_vnni: one int8 term per token
 * and 32 channels, w8a8_group32_vnni). linear_two_terms_avx2.c is the same on AVX2 CPUs.
 *
 * Returns 0 when done, 1 when nothing was computed (shapes the GEMM declines, no memory).
 */
#include "rmsnorm.c"
#include "quantize.c"
#include "w8a8_grouped_vnni.c"
#include "linear_two_terms.h"

int linear_two_terms_vnni(const float *x, int64_t M, int64_t K, int64_t sx, const float *norm_w, double eps,
                          const int8_t *w, const float *w_scale, int64_t N, const float *post_w,
                          const float *residual, int64_t sr, float *out, float scale_floor, int nthreads) {
    const linear_gemm g = {w8a8_grouped_vnni, NULL, NULL, w8a8_grouped_vnni_sum2};
    return linear_with(g, x, M, K, sx, norm_w, eps, w, w_scale, N, post_w, residual, sr, out, scale_floor, nthreads);
}

int linear_group32_vnni(const float *x, int64_t M, int64_t K, int64_t sx, const float *norm_w, double eps,
                        const int8_t *w, const float *w_scale, int64_t N, const float *post_w, const float *residual,
                        int64_t sr, float *out, float scale_floor, int nthreads) {
    const linear_gemm g = {NULL, NULL, w8a8_group32_vnni};
    return linear_with(g, x, M, K, sx, norm_w, eps, w, w_scale, N, post_w, residual, sr, out, scale_floor, nthreads);
}

