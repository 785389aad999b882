/* GeGLU and SwiGLU rows, bit-identical to salon.kernels.glu.geglu_ref and swiglu_ref (the contract is there):
 * out = act(g) * u with act = gelu_tanh (g / (1 + exp(-2 sqrt(2/pi) (g + 0.044715 g^3)))) or silu
 * (g / (1 + exp(-g))) and the contract's float32 exp, 8 lanes at a time, each product, sum and quotient rounded
 * on its own. No fused multiply-add: the build flags carry -mfma, and GCC would contract _mm256_mul_ps followed
 * by _mm256_add_ps into one vfmadd (other bits) unless fp-contract is off, as it is for this file (and for what
 * includes it after it). Lanes are independent, so the AVX2 code is also the AVX-512 machines' (the same bits
 * everywhere).
 *
 *   geglu_rows, swiglu_rows  y f32[M, 2F] (row stride sy; gate columns [0, F), up columns [F, 2F))
 *                            -> out f32[M, F] (row stride so), the rows split over nthreads threads (a
 *                            prefill's; a row's bits never depend on the thread that computes it)
 *   geglu_row, swiglu_row    one row (the fused decoder layer's, decoder_block.h, from its own threads)
 */
#pragma GCC optimize("fp-contract=off")
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include "avx2_tail.h"

#define GLU_AVX2 __attribute__((target("avx2")))

/* The contract's exp of 8 floats (salon.kernels.glu.exp_ref). */
GLU_AVX2 static inline __m256 glu_exp8(__m256 z) {
    const __m256 lo = _mm256_set1_ps(-87.0f), hi = _mm256_set1_ps(88.0f);
    const __m256 tiny = _mm256_cmp_ps(z, lo, _CMP_LT_OQ);
    const __m256 t = _mm256_min_ps(_mm256_max_ps(z, lo), hi);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(t, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_sub_ps(t, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n for n in [-126, 127]: its biased exponent n + 127 shifted into place (exact) */
    const __m256 two_n = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, two_n));
}

/* gelu_tanh(g) * u for 8 lanes. */
GLU_AVX2 static inline __m256 geglu8(__m256 g, __m256 u) {
    const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
    const __m256 inner = _mm256_add_ps(g, _mm256_mul_ps(_mm256_set1_ps(0.044715f), g3));
    const __m256 e = glu_exp8(_mm256_mul_ps(inner, _mm256_set1_ps(-1.5957691216057308f)));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

/* silu(g) * u for 8 lanes (-g flips the sign bit: exact). */
GLU_AVX2 static inline __m256 swiglu8(__m256 g, __m256 u) {
    const __m256 e = glu_exp8(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

/* One row: out[j] = act(y[j]) * y[F + j] for j < F; the last F % 8 lanes through masked loads and stores (the
   masked-off lanes compute on zeros). */
#define GLU_ROW(NAME, ACT8)                                                                                     \
    GLU_AVX2 static inline void NAME(const float *y, int64_t F, float *out) {                                   \
        int64_t j = 0;                                                                                          \
        for (; j + 8 <= F; j += 8) _mm256_storeu_ps(out + j, ACT8(_mm256_loadu_ps(y + j), _mm256_loadu_ps(y + F + j))); \
        if (j < F) {                                                                                            \
            const __m256i m = avx2_tail_mask(F - j);                                                            \
            _mm256_maskstore_ps(out + j, m, ACT8(_mm256_maskload_ps(y + j, m), _mm256_maskload_ps(y + F + j, m))); \
        }                                                                                                       \
    }
GLU_ROW(geglu_row, geglu8)
GLU_ROW(swiglu_row, swiglu8)

/* Calls of fewer outputs than this run on one thread (a decode step's rows: the team costs more than it saves). */
#define GLU_PARALLEL_MIN_OUTPUTS 32768

GLU_AVX2 void geglu_rows(const float *y, int64_t M, int64_t F, int64_t sy, float *out, int64_t so, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (M * F >= GLU_PARALLEL_MIN_OUTPUTS)
    for (int64_t m = 0; m < M; m++) geglu_row(y + m * sy, F, out + m * so);
}

GLU_AVX2 void swiglu_rows(const float *y, int64_t M, int64_t F, int64_t sy, float *out, int64_t so, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (M * F >= GLU_PARALLEL_MIN_OUTPUTS)
    for (int64_t m = 0; m < M; m++) swiglu_row(y + m * sy, F, out + m * so);
}
