/* Paged attention over the int8 KV cache for CPUs with AVX2 and FMA but no AVX-512: paged_attention.h in 8-lane
 * vectors, 2 rows of one sequence per work item (2 rows x 4 heads of accumulators are what 16 vector registers
 * hold). Its fixed sums: pa_hsum4 adds each head's vector as ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7));
 * pa_chunk_sum adds p_i + p_(i+8) lane-wise, then sums those 8 the same way.
 */
#include <immintrin.h>

#include "simd_math.h"

#define PA_TARGET __attribute__((target("avx2,fma")))
#define PA_LANES 8
#define PA_RUN 2
#define PA_PAIR_KEYS_MAX_G 4 /* 2 keys x 4 heads: 8 independent FMA chains; more would spill */
#define PA_CONSTANT_G3 1

typedef __m256 pa_vec;

PA_TARGET static inline pa_vec pa_zero(void) { return _mm256_setzero_ps(); }
PA_TARGET static inline pa_vec pa_set1(float x) { return _mm256_set1_ps(x); }
PA_TARGET static inline pa_vec pa_load(const float *p) { return _mm256_load_ps(p); }
PA_TARGET static inline pa_vec pa_loadu(const float *p) { return _mm256_loadu_ps(p); }
PA_TARGET static inline void pa_store(float *p, pa_vec v) { _mm256_store_ps(p, v); }
PA_TARGET static inline void pa_storeu(float *p, pa_vec v) { _mm256_storeu_ps(p, v); }
PA_TARGET static inline pa_vec pa_mul(pa_vec a, pa_vec b) { return _mm256_mul_ps(a, b); }
PA_TARGET static inline pa_vec pa_sub(pa_vec a, pa_vec b) { return _mm256_sub_ps(a, b); }
PA_TARGET static inline pa_vec pa_div(pa_vec a, pa_vec b) { return _mm256_div_ps(a, b); }
PA_TARGET static inline pa_vec pa_fmadd(pa_vec a, pa_vec b, pa_vec c) { return _mm256_fmadd_ps(a, b, c); }
PA_TARGET static inline float pa_first(pa_vec v) { return _mm256_cvtss_f32(v); }
PA_TARGET static inline pa_vec pa_exp(pa_vec v) { return exp256_ps(v); }

/* 8 int8 -> 8 floats. */
PA_TARGET static inline pa_vec pa_widen(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* Four sums, one per head: [sum(v0), sum(v1), sum(v2), sum(v3)]; each output sums only its own vector, as
   ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)). */
PA_TARGET static inline __m128 pa_hsum4(pa_vec v0, pa_vec v1, pa_vec v2, pa_vec v3) {
    __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(v0, v1), _mm256_hadd_ps(v2, v3));
    return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

/* The largest of a chunk's 16 floats (two vectors; exact in any order). */
PA_TARGET static inline float pa_chunk_max(const pa_vec *s) {
    __m256 v = _mm256_max_ps(s[0], s[1]);
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}

/* The sum of a chunk's 16 floats (two vectors): p_i + p_(i+8) lane-wise, then pa_hsum4's pattern. */
PA_TARGET static inline float pa_chunk_sum(const pa_vec *p) {
    const pa_vec zero = _mm256_setzero_ps();
    return _mm_cvtss_f32(pa_hsum4(_mm256_add_ps(p[0], p[1]), zero, zero, zero));
}

#include "paged_attention.h"
