/* RMSNorm of each (token, head) row, then NeoX RoPE from the cos/sin tables, in one pass: rmsnorm.c's norm_row
 * into a row on the stack, then rope.c's rope_row from it, so every bit is that of the two kernels called one
 * after the other (salon.kernels.rmsnorm_rope has the contract).
 *
 *   rmsnorm_rope_rows  x f32[T, H, D] (strides sxt, sxh; unit stride within a head), w f32[D], pos int64[T],
 *                      cos/sin f32[P, D/2] (P > every pos) -> y f32[T, H, D] contiguous
 *
 * Returns 0 when done, 1 when nothing was computed (D odd or above MAX_HEAD_DIM).
 */
#include "rmsnorm.c"
#include "rope.c"

#define MAX_HEAD_DIM 1024

int rmsnorm_rope_rows(const float *x, int64_t T, int64_t H, int64_t D, int64_t sxt, int64_t sxh, const float *w,
                      double eps, const int64_t *pos, const float *cos, const float *sin, float *y, int nthreads) {
    if (D < 2 || D % 2 || D > MAX_HEAD_DIM) return 1;
    const int64_t half = D / 2;
    const float inv_d = (float)(1.0 / (double)D), eps_f = (float)eps;
    const int threads = T * H * D >= PARALLEL_MIN_ELEMENTS ? nthreads : 1;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < T * H; i++) {
        float row[MAX_HEAD_DIM];
        const int64_t t = i / H, h = i % H;
        norm_row(x + t * sxt + h * sxh, w, row, D, inv_d, eps_f);
        rope_row(row, cos + pos[t] * half, sin + pos[t] * half, half, y + i * D);
    }
    return 0;
}
