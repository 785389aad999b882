/* The two-term int8 Linear of grouped weights in one call on AVX2 CPUs (linear_two_terms.h has the
 * composition; w8a8_grouped.c is its GEMM, whose activations may not hold -128: the two terms never do, they
 * are clamped to [-127, 127]). linear_two_terms.c is the same on AVX-512 VNNI CPUs.
 *
 * Returns 0 when done, 1 when nothing was computed (shapes the GEMM declines, no memory).
 */
#include "rmsnorm.c"
#include "quantize.c"
#include "w8a8_grouped.c"
#include "w16a8_grouped.c"
#include "linear_two_terms.h"

int linear_two_terms_avx2(const float *x, int64_t M, int64_t K, int64_t sx, const float *norm_w, double eps,
                          const int8_t *w, const float *w_scale, int64_t N, const float *post_w,
                          const float *residual, int64_t sr, float *out, float scale_floor, int nthreads) {
    const linear_gemm g = {w8a8_grouped_avx2, NULL, NULL};
    return linear_with(g, x, M, K, sx, norm_w, eps, w, w_scale, N, post_w, residual, sr, out, scale_floor, nthreads);
}

/* The same Linear with one int16 term a row (salon.kernels.w16a8_grouped): the one entry point of that recipe on every
   CPU (its GEMM is AVX2's, which AVX-512 CPUs run too). */
int linear_int16_avx2(const float *x, int64_t M, int64_t K, int64_t sx, const float *norm_w, double eps,
                       const int8_t *w, const float *w_scale, int64_t N, const float *post_w, const float *residual,
                       int64_t sr, float *out, float scale_floor, int nthreads) {
    const linear_gemm g = {NULL, w16a8_grouped_avx2, NULL};
    return linear_with(g, x, M, K, sx, norm_w, eps, w, w_scale, N, post_w, residual, sr, out, scale_floor, nthreads);
}

/* The same Linear with one int8 term per token and 32 channels (salon.kernels.w8a8_group32; the int8 values never
   hold -128, which the AVX2 GEMM declines). */
int linear_group32_avx2(const float *x, int64_t M, int64_t K, int64_t sx, const float *norm_w, double eps,
                        const int8_t *w, const float *w_scale, int64_t N, const float *post_w, const float *residual,
                        int64_t sr, float *out, float scale_floor, int nthreads) {
    const linear_gemm g = {NULL, NULL, w8a8_group32_avx2};
    return linear_with(g, x, M, K, sx, norm_w, eps, w, w_scale, N, post_w, residual, sr, out, scale_floor, nthreads);
}
