/* NeoX RoPE from cos/sin tables (salon/kernels/cpu/rope.py builds them): for each (t, h) row and i < D/2,
 *   y[i]         = x[i] * c - x[i + D/2] * s
 *   y[i + D/2]   = x[i + D/2] * c + x[i] * s,        c = cos[pos[t], i], s = sin[pos[t], i]
 * each product rounded on its own, then the difference or sum (no FMA): the bits of the PyTorch expression
 * x1 * cos - x2 * sin, x2 * cos + x1 * sin, which rope.py runs where this kernel cannot.
 *
 *   rope_rows  x f32[T, H, D] (strides sxt, sxh; unit stride within a head), pos int64[T],
 *              cos/sin f32[P, D/2] (P > every pos) -> y f32[T, H, D] contiguous
 */
#include <immintrin.h>
#include <stdint.h>

#include "avx2_tail.h"

static inline __m256 mul_rounded(__m256 a, __m256 b) {
    __m256 p = _mm256_mul_ps(a, b);
    __asm__("" : "+x"(p));
    return p;
}

static inline void rope_row(const float *x, const float *c, const float *s, int64_t half, float *y) {
    for (int64_t i = 0; i < half; i += 8) {
        const __m256i m = half - i >= 8 ? _mm256_set1_epi32(-1) : avx2_tail_mask(half - i);
        const __m256 x1 = _mm256_maskload_ps(x + i, m), x2 = _mm256_maskload_ps(x + half + i, m);
        const __m256 cv = _mm256_maskload_ps(c + i, m), sv = _mm256_maskload_ps(s + i, m);
        _mm256_maskstore_ps(y + i, m, _mm256_sub_ps(mul_rounded(x1, cv), mul_rounded(x2, sv)));
        _mm256_maskstore_ps(y + half + i, m, _mm256_add_ps(mul_rounded(x2, cv), mul_rounded(x1, sv)));
    }
}

void rope_rows(const float *x, int64_t T, int64_t H, int64_t D, int64_t sxt, int64_t sxh, const int64_t *pos,
               const float *cos, const float *sin, float *y, int nthreads) {
    const int64_t half = D / 2;
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (T * H * D >= 65536)
    for (int64_t i = 0; i < T * H; i++) {
        const int64_t t = i / H, h = i % H;
        rope_row(x + t * sxt + h * sxh, cos + pos[t] * half, sin + pos[t] * half, half, y + i * D);
    }
}
