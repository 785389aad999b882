/* Per-row symmetric int8 quantization, bit for bit the semantics of salon.kernels.quantize:
 *   scale = max(absmax(row) / 127, SCALE_FLOOR)      (IEEE division)
 *   q     = clamp(round_half_even(x / scale), -127, 127)
 * Rows are independent (max is exact in any order), so results never depend on the batch or the threads.
 * Two builds of the same arithmetic, lane for lane: quantize.h holds the row loops once, and each section below
 * defines its vector layer and includes it: AVX-512 (the *_avx512 entry points, 16 lanes, masked tails) and
 * AVX2 + FMA (the *_avx2 ones, 8 lanes, tails through masked loads); salon/kernels/cpu/quantize.py calls the
 * best one the CPU has. One library holds both, because the fused units (linear_two_terms.h, decoder_block.h)
 * include this file and run the AVX2 rows on AVX-512 CPUs too. Finite rows only: a row holding inf or NaN has
 * no defined result (the reference converts NaN quotients to int8); both builds give -127 where x / scale is NaN.
 *
 *   quantize_rows_*  x f32[M, K] (row stride sx) -> q int8[M, K], scale f32[M]
 *   quantize_group32_rows_*  x f32[M, K] -> q int8[M, K], scale f32[M, K / 32] (salon.kernels.w8a8_group32's
 *                    recipe: every group of 32 values of a row quantized as a row of its own; K a multiple of 32)
 *   kv_write_rows_*  x f32[T, H, D] -> the int8 rows and scales of cache slots slot[t] (the KV write); a negative
 *                    slot (a padded row of a fixed-size batch) writes nothing
 *   quantize_two_terms_rows_avx2  x f32[M, K] -> q int8[2M, K], scale f32[2M] (two int8 terms per row)
 *   quantize_int16_rows_avx2  x f32[M, K] -> q int16[M, K], scale f32[M] (salon.kernels.w16a8_grouped's recipe: the
 *                             same arithmetic with 32767 for 127)
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "avx2_tail.h"

#define AVX512 __attribute__((target("avx512f,avx512bw")))

/* ---- AVX-512: 16 lanes, one max chain, tails through masked loads and stores ---- */

AVX512 static inline __mmask16 qv_mask_avx512(int64_t n) { return (__mmask16)((1u << n) - 1); }
AVX512 static inline __m512 qv_zero_avx512(void) { return _mm512_setzero_ps(); }
AVX512 static inline __m512 qv_set1_avx512(float x) { return _mm512_set1_ps(x); }
AVX512 static inline __m512 qv_loadu_avx512(const float *p) { return _mm512_loadu_ps(p); }
AVX512 static inline __m512 qv_load_tail_avx512(const float *p, int64_t n) {
    return _mm512_maskz_loadu_ps(qv_mask_avx512(n), p);
}
AVX512 static inline __m512 qv_abs_avx512(__m512 v) { return _mm512_abs_ps(v); }
AVX512 static inline __m512 qv_max_avx512(__m512 a, __m512 b) { return _mm512_max_ps(a, b); }
AVX512 static inline __m512 qv_min_avx512(__m512 a, __m512 b) { return _mm512_min_ps(a, b); }
AVX512 static inline __m512 qv_div_avx512(__m512 a, __m512 b) { return _mm512_div_ps(a, b); }
AVX512 static inline __m512 qv_round_avx512(__m512 v) {
    return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
AVX512 static inline __m512i qv_cvt_avx512(__m512 v) { return _mm512_cvtps_epi32(v); }
AVX512 static inline float qv_reduce_max_avx512(const __m512 *m) { return _mm512_reduce_max_ps(m[0]); }
AVX512 static inline void qv_store_bytes_avx512(int8_t *q, __m512i v) {
    _mm512_mask_cvtepi32_storeu_epi8(q, (__mmask16)0xFFFF, v);
}
AVX512 static inline void qv_store_block_avx512(int8_t *q, const __m512i *v) { qv_store_bytes_avx512(q, v[0]); }
AVX512 static inline void qv_store_tail_avx512(int8_t *q, __m512i v, int64_t n) {
    _mm512_mask_cvtepi32_storeu_epi8(q, qv_mask_avx512(n), v);
}

#define Q_ISA avx512
#define Q_TARGET AVX512
#define Q_LANES 16
#define Q_VEC __m512
#define Q_IVEC __m512i
#define Q_CHAINS 1
#define Q_TAIL_CHAIN 0
#define Q_UNROLL 1
#include "quantize.h"

/* ---- AVX2 + FMA (the file's baseline flags): 8 lanes, four max chains, 32 values a store, tails through masked
   loads and a bounce buffer ---- */

static inline __m256 qv_zero_avx2(void) { return _mm256_setzero_ps(); }
static inline __m256 qv_set1_avx2(float x) { return _mm256_set1_ps(x); }
static inline __m256 qv_loadu_avx2(const float *p) { return _mm256_loadu_ps(p); }
static inline __m256 qv_load_tail_avx2(const float *p, int64_t n) { return _mm256_maskload_ps(p, avx2_tail_mask(n)); }
static inline __m256 qv_abs_avx2(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }
static inline __m256 qv_max_avx2(__m256 a, __m256 b) { return _mm256_max_ps(a, b); }
static inline __m256 qv_min_avx2(__m256 a, __m256 b) { return _mm256_min_ps(a, b); }
static inline __m256 qv_div_avx2(__m256 a, __m256 b) { return _mm256_div_ps(a, b); }
static inline __m256 qv_round_avx2(__m256 v) {
    return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline __m256i qv_cvt_avx2(__m256 v) { return _mm256_cvtps_epi32(v); }

/* The four chains as (m0 max m1) max (m2 max m3), then halves down to one lane. */
static inline float qv_reduce_max_avx2(const __m256 *m) {
    __m256 m8 = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    return _mm_cvtss_f32(m4);
}

/* 8 int32 lanes in [-127, 127] -> their 8 bytes in order (the low half of the result). */
static inline __m128i pack8(__m256i v) {
    __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    return _mm_packs_epi16(w, w);
}

/* 4 vectors: two rounds of saturating packs interleave their dwords; one permute restores the order. */
static inline void qv_store_block_avx2(int8_t *q, const __m256i *v) {
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256i ab = _mm256_packs_epi32(v[0], v[1]), cd = _mm256_packs_epi32(v[2], v[3]);
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), order));
}
static inline void qv_store_bytes_avx2(int8_t *q, __m256i v) { _mm_storel_epi64((__m128i *)q, pack8(v)); }
static inline void qv_store_tail_avx2(int8_t *q, __m256i v, int64_t n) {
    int8_t buf[16];
    _mm_storeu_si128((__m128i *)buf, pack8(v));
    memcpy(q, buf, (size_t)n);
}

#define Q_ISA avx2
#define Q_TARGET
#define Q_LANES 8
#define Q_VEC __m256
#define Q_IVEC __m256i
#define Q_CHAINS 4
#define Q_TAIL_CHAIN 1
#define Q_UNROLL 4
#include "quantize.h"

/* One row of salon.kernels.w16a8_grouped.quantize_int16_ref (AVX2 only): the int8 row's absmax and per-value
   arithmetic with 32767 for 127, q int16. */
static inline float quantize_row_int16_avx2(const float *x, int64_t K, int16_t *q, float floor_) {
    float scale = absmax_row_avx2(x, K) / 32767.0f;
    if (scale < floor_) scale = floor_;
    const __m256 s = _mm256_set1_ps(scale), lo = _mm256_set1_ps(-32767.0f), hi = _mm256_set1_ps(32767.0f);
    const int64_t K16 = K / 16 * 16;
    int64_t k = 0;
    for (; k < K16; k += 16) {  /* the in-lane pack interleaves the two vectors' halves; one permute restores */
        __m256i v = _mm256_packs_epi32(quantize_lanes_avx2(_mm256_loadu_ps(x + k), s, lo, hi),
                                       quantize_lanes_avx2(_mm256_loadu_ps(x + k + 8), s, lo, hi));
        _mm256_storeu_si256((__m256i *)(q + k), _mm256_permute4x64_epi64(v, 0xD8));
    }
    for (; k < K; k += 8) {  /* the last K % 16: masked loads, stored through a bounce buffer */
        const int64_t n = K - k < 8 ? K - k : 8;
        int16_t buf[8];
        __m256i v = quantize_lanes_avx2(_mm256_maskload_ps(x + k, avx2_tail_mask(n)), s, lo, hi);
        _mm_storeu_si128((__m128i *)buf, _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
        memcpy(q + k, buf, (size_t)n * sizeof(int16_t));
    }
    return scale;
}

void quantize_int16_rows_avx2(const float *x, int64_t M, int64_t K, int64_t sx, int16_t *q, float *scale,
                              float floor_, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (M * K >= 65536)
    for (int64_t m = 0; m < M; m++) scale[m] = quantize_row_int16_avx2(x + m * sx, K, q + m * K, floor_);
}

/* ---- two int8 terms per row (salon.kernels.quantize.quantize_two_terms_ref) ----
 *   rows [0, M) of q / scale: quantize(x); rows [M, 2M): quantize(r), r = x - (float)q1 * s1
 * The residual is a product then a difference, each rounded (no fused multiply-add, as PyTorch computes it),
 * so the second term has the reference's bits too. r lives in a per-thread buffer of K floats. */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
static void residual_row(const float *x, const int8_t *q, float s1, int64_t K, float *r) {
    const __m256 s = _mm256_set1_ps(s1);
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 qf = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + k))));
        _mm256_storeu_ps(r + k, _mm256_sub_ps(_mm256_loadu_ps(x + k), _mm256_mul_ps(qf, s)));
    }
    for (; k < K; k++) {
        volatile float p = (float)q[k] * s1;  /* rounded before the difference */
        r[k] = x[k] - p;
    }
}

int quantize_two_terms_rows_avx2(const float *x, int64_t M, int64_t K, int64_t sx, int8_t *q, float *scale,
                                 float floor_, int nthreads) {
    const int64_t stride = (K + 15) / 16 * 16;  /* one residual row per thread */
    float *buf = aligned_alloc(64, (size_t)(stride * (nthreads > 0 ? nthreads : 1)) * sizeof(float));
    if (buf == NULL) return 1;
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (M * K >= 65536)
    for (int64_t m = 0; m < M; m++) {
        float *r = buf + stride * omp_get_thread_num();
        scale[m] = quantize_row_avx2(x + m * sx, K, q + m * K, floor_);
        residual_row(x + m * sx, q + m * K, scale[m], K, r);
        scale[M + m] = quantize_row_avx2(r, K, q + (M + m) * K, floor_);
    }
    free(buf);
    return 0;
}
#pragma GCC pop_options
