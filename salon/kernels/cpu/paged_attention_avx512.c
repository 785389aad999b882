/* Paged attention over the int8 KV cache for CPUs with AVX-512 (F and BW): paged_attention.h in 16-lane vectors,
 * 4 rows of one sequence per work item. Its fixed sums: pa_hsum4 adds each head's vector in halves (pairs of
 * lanes, then pairs of pairs, then the 256-bit halves, then the 128-bit ones); pa_chunk_sum is
 * _mm512_reduce_add_ps's order.
 */
#include <immintrin.h>

#include "simd_math.h"

#define PA_TARGET __attribute__((target("avx512f,avx512bw")))
#define PA_LANES 16
#define PA_RUN 4
#define PA_PAIR_KEYS_MAX_G PA_MAX_G /* a row's scores go two keys at a time for every group size */
#define PA_CONSTANT_G3 0

typedef __m512 pa_vec;

PA_TARGET static inline pa_vec pa_zero(void) { return _mm512_setzero_ps(); }
PA_TARGET static inline pa_vec pa_set1(float x) { return _mm512_set1_ps(x); }
PA_TARGET static inline pa_vec pa_load(const float *p) { return _mm512_load_ps(p); }
PA_TARGET static inline pa_vec pa_loadu(const float *p) { return _mm512_loadu_ps(p); }
PA_TARGET static inline void pa_store(float *p, pa_vec v) { _mm512_store_ps(p, v); }
PA_TARGET static inline void pa_storeu(float *p, pa_vec v) { _mm512_storeu_ps(p, v); }
PA_TARGET static inline pa_vec pa_mul(pa_vec a, pa_vec b) { return _mm512_mul_ps(a, b); }
PA_TARGET static inline pa_vec pa_sub(pa_vec a, pa_vec b) { return _mm512_sub_ps(a, b); }
PA_TARGET static inline pa_vec pa_div(pa_vec a, pa_vec b) { return _mm512_div_ps(a, b); }
PA_TARGET static inline pa_vec pa_fmadd(pa_vec a, pa_vec b, pa_vec c) { return _mm512_fmadd_ps(a, b, c); }
PA_TARGET static inline float pa_first(pa_vec v) { return _mm512_cvtss_f32(v); }
PA_TARGET static inline pa_vec pa_exp(pa_vec v) { return exp_ps(v); }

/* 16 int8 -> 16 floats. */
PA_TARGET static inline pa_vec pa_widen(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* Four sums, one per head: [sum(v0), sum(v1), sum(v2), sum(v3)]; each output sums only its own vector, in a
   fixed pattern. */
PA_TARGET static inline __m128 pa_hsum4(pa_vec v0, pa_vec v1, pa_vec v2, pa_vec v3) {
    __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(v0, v1), _mm512_unpackhi_ps(v0, v1));
    __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(v2, v3), _mm512_unpackhi_ps(v2, v3));
    __m512 u = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))));
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(u),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(u), 1)));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* The largest and the sum of a chunk's 16 floats (one vector). */
PA_TARGET static inline float pa_chunk_max(const pa_vec *s) { return _mm512_reduce_max_ps(s[0]); }
PA_TARGET static inline float pa_chunk_sum(const pa_vec *p) { return _mm512_reduce_add_ps(p[0]); }

#include "paged_attention.h"
