/* RMSNorm rows, bit-identical to salon.kernels.rmsnorm.rmsnorm_ref (the contract is there): 16 lane sums of squares
 * in order, a fixed tree, r = 1 / sqrt(s * (1/K) + eps), y = (x * r) * w, every operation rounded to float32.
 * No fused multiply-add (fp-contract is off for the file; the build flags carry -mfma); the loops over the 16
 * lanes vectorize without changing any lane's order of additions.
 *
 * x: rows (t, h) at x + t * stride_t + h * stride_h, K contiguous floats each; y: contiguous [T, H, K].
 * Rows are split over the threads when there are enough of them (a row's bits never depend on the split).
 */
#pragma GCC optimize("fp-contract=off")
#include <math.h>
#include <omp.h>
#include <stdint.h>

#define LANES 16
/* Rows x K below which one thread does all (waking the others costs more). */
#define PARALLEL_MIN_ELEMENTS 65536

static void norm_row(const float *x, const float *w, float *y, int64_t K, float inv_k, float eps) {
    float acc[LANES] = {0};
    int64_t k = 0;
    for (; k + LANES <= K; k += LANES)
        for (int j = 0; j < LANES; j++) {
            const float sq = x[k + j] * x[k + j];
            acc[j] = acc[j] + sq;
        }
    for (int j = 0; k + j < K; j++) { /* the tail: the missing lanes add zeros, which change nothing */
        const float sq = x[k + j] * x[k + j];
        acc[j] = acc[j] + sq;
    }
    for (int width = LANES / 2; width >= 1; width /= 2)
        for (int j = 0; j < width; j++) acc[j] = acc[j] + acc[j + width];
    const float mean = acc[0] * inv_k;
    const float r = 1.0f / sqrtf(mean + eps);
    for (int64_t i = 0; i < K; i++) {
        const float xr = x[i] * r;
        y[i] = xr * w[i];
    }
}

void rmsnorm_rows(const float *x, int64_t T, int64_t H, int64_t K, int64_t stride_t, int64_t stride_h,
                  const float *w, float *y, double eps, int nthreads) {
    const float inv_k = (float)(1.0 / (double)K), eps_f = (float)eps;
    const int64_t rows = T * H;
    const int threads = rows * K >= PARALLEL_MIN_ELEMENTS ? nthreads : 1;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t t = r / H, h = r % H;
        norm_row(x + t * stride_t + h * stride_h, w, y + r * K, K, inv_k, eps_f);
    }
}
