/* The two-term int8 Linear of grouped weights in one call on AVX-512 VNNI CPUs (linear_two_terms.h has the
 * composition; w8a8_grouped_vnni.c is its GEMM), the group32 one (linear_group32_vnni: one int8 term per token
 * and 32 channels, w8a8_group32_vnni), and the group32 recipe's rescored output projection (linear_rescored_vnni).
 * linear_two_terms_avx2.c is the same on AVX2 CPUs, less the rescored projection (composed there).
 *
 * Returns 0 when done, 1 when nothing was computed (shapes the GEMM declines, no memory).
 */
#include "rmsnorm.c"
#include "quantize.c"
#include "w8a8_grouped_vnni.c"
#include "linear_two_terms.h"

/* salon.kernels.linear_rescored's RESCORE_MARGIN and OUTLIER_GROUPS */
#define RESCORE_MARGIN 0.515625f
#define OUTLIER_GROUPS 6
/* The most groups (K / 32) of the rescored projection's input: K up to 32,768. */
#define RESCORE_MAX_GROUPS 1024

/* alpha and beta of one row's group32 scales s[G] and second two-term scale s2 (salon.kernels.linear_rescored's
   bound_factors: the same operations in the same order). */
static void rescore_factors(const float *s, int64_t G, float s2, float *alpha, float *beta) {
    float top[OUTLIER_GROUPS + 1];
    unsigned char taken[RESCORE_MAX_GROUPS] = {0};
    const int keep = G > OUTLIER_GROUPS ? OUTLIER_GROUPS + 1 : (int)G;
    for (int j = 0; j < keep; j++) {  /* the keep largest, largest first */
        int64_t best = -1;
        for (int64_t g = 0; g < G; g++)
            if (!taken[g] && (best < 0 || s[g] > s[best])) best = g;
        taken[best] = 1;
        top[j] = s[best];
    }
    const float cap = G > OUTLIER_GROUPS ? top[OUTLIER_GROUPS] : 0.0f;
    const int n = G > OUTLIER_GROUPS ? OUTLIER_GROUPS : (int)G;
    float b = top[0] - cap;
    for (int j = 1; j < n; j++) b = b + (top[j] - cap);
    *alpha = (cap + s2) * RESCORE_MARGIN;
    *beta = b * RESCORE_MARGIN;
}

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

/* The rescored output projection (salon.kernels.linear_rescored) of x f32[M, K] (row stride sx; no norm, post-norm
 * or residual): each row's group32 term and its two int8 terms (linear_input_row, as linear_with quantizes them),
 * the selection's factors, then w8a8_group32_rescored_vnni (argmax: its per-row argmax, or NULL). bounds f32[2, N]:
 * row_bounds of the weights. Returns 0 when done, 1 when nothing was computed (shapes declined: more than
 * SUM2_MAX_ROWS rows; no memory). */
int linear_rescored_vnni(const float *x, int64_t M, int64_t K, int64_t sx, const int8_t *w, const float *w_scale,
                         const float *bounds, int64_t N, float *out, int64_t *argmax, float scale_floor,
                         int nthreads) {
    if (M < 1 || M > SUM2_MAX_ROWS || K < GROUP || K % GROUP || K / GROUP > RESCORE_MAX_GROUPS || N < 1) return 1;
    const int64_t G = K / GROUP, ks = (K + 15) / 16 * 16;
    int8_t *q32 = malloc((size_t)(M * K)), *q2 = malloc((size_t)(2 * M * K));
    float *s32 = malloc((size_t)(M * G) * sizeof(float)), *s2 = malloc((size_t)(2 * M) * sizeof(float));
    float *factors = malloc((size_t)(2 * M) * sizeof(float));
    float *r = aligned_alloc(64, (size_t)(ks * row_team(M, nthreads)) * sizeof(float));
    int status = 1;
    if (q32 && q2 && s32 && s2 && factors && r) {
        linear_rows one = {.x = x, .M = M, .K = K, .sx = sx, .ks = ks, .scale_floor = scale_floor, .s = s32,
                           .q = q32, .terms = 1, .group32 = 1};
        linear_rows two = {.x = x, .M = M, .K = K, .sx = sx, .ks = ks, .scale_floor = scale_floor, .s = s2,
                           .r = r, .q = q2, .terms = 2};
        for_rows(M, nthreads, linear_input_row, &one);
        for_rows(M, nthreads, linear_input_row, &two);
        for (int64_t m = 0; m < M; m++) rescore_factors(s32 + m * G, G, s2[M + m], factors + m, factors + M + m);
        status = w8a8_group32_rescored_vnni(q32, s32, q2, s2, factors, w, w_scale, bounds, out, argmax, M, N, K,
                                            nthreads);
    }
    free(q32);
    free(q2);
    free(s32);
    free(s2);
    free(factors);
    free(r);
    return status;
}
