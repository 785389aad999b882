/* Per-row symmetric int8 quantization, bit for bit the semantics of salon.kernels.quantize:
 *   scale = max(absmax(row) / 127, SCALE_FLOOR)      (IEEE division)
 *   q     = clamp(round_half_even(x / scale), -127, 127)
 * Rows are independent (max is exact in any order), so results never depend on the batch or the threads.
 * Two builds of the same arithmetic, lane for lane: AVX-512 (the *_avx512 entry points, 16 lanes, masked
 * tails) and AVX2 + FMA (the *_avx2 ones, 8 lanes, tails through masked loads); salon/kernels/cpu/quantize.py
 * calls the best one the CPU has. Finite rows only: a row holding inf or NaN has no defined result (the
 * reference converts NaN quotients to int8); both builds give -127 where x / scale is NaN.
 *
 *   quantize_rows_*  x f32[M, K] (row stride sx) -> q int8[M, K], scale f32[M]
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

/* ---- AVX-512 ---- */

AVX512 static inline __mmask16 tail_mask(int64_t k, int64_t K) {
    return K - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (K - k)) - 1);
}

AVX512 static inline float quantize_row(const float *x, int64_t K, int8_t *q, float floor_) {
    __m512 m = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16)
        m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_maskz_loadu_ps(tail_mask(k, K), x + k)));
    float scale = _mm512_reduce_max_ps(m) / 127.0f;
    if (scale < floor_) scale = floor_;
    const __m512 s = _mm512_set1_ps(scale), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    for (int64_t k = 0; k < K; k += 16) {
        __mmask16 mk = tail_mask(k, K);
        __m512 y = _mm512_roundscale_ps(_mm512_div_ps(_mm512_maskz_loadu_ps(mk, x + k), s),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        y = _mm512_min_ps(_mm512_max_ps(y, lo), hi);
        _mm512_mask_cvtepi32_storeu_epi8(q + k, mk, _mm512_cvtps_epi32(y));
    }
    return scale;
}

AVX512 void quantize_rows_avx512(const float *x, int64_t M, int64_t K, int64_t sx, int8_t *q, float *scale,
                                 float floor_, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (M * K >= 65536)
    for (int64_t m = 0; m < M; m++) scale[m] = quantize_row(x + m * sx, K, q + m * K, floor_);
}

/* x: f32[T, H, D] contiguous; cache int8[.., H, D] and scale f32[.., H] addressed by slot (block * BS + offset). */
AVX512 void kv_write_rows_avx512(const float *x, int64_t T, int64_t H, int64_t D, int8_t *cache, float *scale,
                                 const int64_t *slot, float floor_, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (T * H * D >= 65536)
    for (int64_t i = 0; i < T * H; i++) {
        int64_t t = i / H, h = i % H, row = slot[t] * H + h;
        if (slot[t] < 0) continue; /* a padded row: writes nothing */
        scale[row] = quantize_row(x + i * D, D, cache + row * D, floor_);
    }
}

/* ---- AVX2 + FMA (the file's baseline flags) ---- */

static inline __m256 abs8(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

/* 8 quantized values as int32 lanes: the AVX-512 build's divide, round (ties to even), clamp, convert. */
static inline __m256i quantize8(__m256 v, __m256 s) {
    __m256 y = _mm256_round_ps(_mm256_div_ps(v, s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    y = _mm256_min_ps(_mm256_max_ps(y, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    return _mm256_cvtps_epi32(y);
}

/* 8 int32 lanes in [-127, 127] -> their 8 bytes in order (the low half of the result). */
static inline __m128i pack8(__m256i v) {
    __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    return _mm_packs_epi16(w, w);
}

/* absmax(row) of K floats (exact in any order: four chains of max). */
static inline float absmax_row_avx2(const float *x, int64_t K) {
    const int64_t K32 = K / 32 * 32, K8 = K / 8 * 8;
    __m256 m0 = _mm256_setzero_ps(), m1 = m0, m2 = m0, m3 = m0;
    int64_t k = 0;
    for (; k < K32; k += 32) {
        m0 = _mm256_max_ps(m0, abs8(_mm256_loadu_ps(x + k)));
        m1 = _mm256_max_ps(m1, abs8(_mm256_loadu_ps(x + k + 8)));
        m2 = _mm256_max_ps(m2, abs8(_mm256_loadu_ps(x + k + 16)));
        m3 = _mm256_max_ps(m3, abs8(_mm256_loadu_ps(x + k + 24)));
    }
    for (; k < K8; k += 8) m0 = _mm256_max_ps(m0, abs8(_mm256_loadu_ps(x + k)));
    if (K8 < K) m1 = _mm256_max_ps(m1, abs8(_mm256_maskload_ps(x + K8, avx2_tail_mask(K - K8))));
    __m256 m8 = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    return _mm_cvtss_f32(m4);
}

/* 8 values quantized to int16 (as int32 lanes): divide, round (ties to even), clamp to +-32767, convert. */
static inline __m256i quantize8_int16(__m256 v, __m256 s) {
    __m256 y = _mm256_round_ps(_mm256_div_ps(v, s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    y = _mm256_min_ps(_mm256_max_ps(y, _mm256_set1_ps(-32767.0f)), _mm256_set1_ps(32767.0f));
    return _mm256_cvtps_epi32(y);
}

/* One row of salon.kernels.w16a8_grouped.quantize_int16_ref: scale = max(absmax / 32767, floor), q int16. */
static inline float quantize_row_int16_avx2(const float *x, int64_t K, int16_t *q, float floor_) {
    float scale = absmax_row_avx2(x, K) / 32767.0f;
    if (scale < floor_) scale = floor_;
    const __m256 s = _mm256_set1_ps(scale);
    const int64_t K16 = K / 16 * 16;
    int64_t k = 0;
    for (; k < K16; k += 16) {  /* the in-lane pack interleaves the two vectors' halves; one permute restores */
        __m256i v = _mm256_packs_epi32(quantize8_int16(_mm256_loadu_ps(x + k), s),
                                       quantize8_int16(_mm256_loadu_ps(x + k + 8), s));
        _mm256_storeu_si256((__m256i *)(q + k), _mm256_permute4x64_epi64(v, 0xD8));
    }
    for (; k < K; k += 8) {  /* the last K % 16: masked loads, stored through a bounce buffer */
        const int64_t n = K - k < 8 ? K - k : 8;
        int16_t buf[8];
        __m256i v = quantize8_int16(_mm256_maskload_ps(x + k, avx2_tail_mask(n)), s);
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

static inline float quantize_row_avx2(const float *x, int64_t K, int8_t *q, float floor_) {
    const int64_t K32 = K / 32 * 32, K8 = K / 8 * 8;
    const __m256i tail = avx2_tail_mask(K - K8);
    float scale = absmax_row_avx2(x, K) / 127.0f;
    if (scale < floor_) scale = floor_;
    const __m256 s = _mm256_set1_ps(scale);
    int64_t k;
    /* 32 at a time: two rounds of saturating packs interleave the four vectors' dwords; one permute restores
       the order. */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (k = 0; k < K32; k += 32) {
        __m256i ab = _mm256_packs_epi32(quantize8(_mm256_loadu_ps(x + k), s), quantize8(_mm256_loadu_ps(x + k + 8), s));
        __m256i cd = _mm256_packs_epi32(quantize8(_mm256_loadu_ps(x + k + 16), s),
                                        quantize8(_mm256_loadu_ps(x + k + 24), s));
        __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), order);
        _mm256_storeu_si256((__m256i *)(q + k), bytes);
    }
    for (; k < K8; k += 8) _mm_storel_epi64((__m128i *)(q + k), pack8(quantize8(_mm256_loadu_ps(x + k), s)));
    if (K8 < K) {  /* the last K % 8: the same arithmetic on a masked load, stored through a bounce buffer */
        int8_t buf[16];
        _mm_storeu_si128((__m128i *)buf, pack8(quantize8(_mm256_maskload_ps(x + K8, tail), s)));
        memcpy(q + K8, buf, (size_t)(K - K8));
    }
    return scale;
}

void quantize_rows_avx2(const float *x, int64_t M, int64_t K, int64_t sx, int8_t *q, float *scale, float floor_,
                        int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (M * K >= 65536)
    for (int64_t m = 0; m < M; m++) scale[m] = quantize_row_avx2(x + m * sx, K, q + m * K, floor_);
}

void kv_write_rows_avx2(const float *x, int64_t T, int64_t H, int64_t D, int8_t *cache, float *scale,
                        const int64_t *slot, float floor_, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (T * H * D >= 65536)
    for (int64_t i = 0; i < T * H; i++) {
        int64_t t = i / H, h = i % H, row = slot[t] * H + h;
        if (slot[t] < 0) continue; /* a padded row: writes nothing */
        scale[row] = quantize_row_avx2(x + i * D, D, cache + row * D, floor_);
    }
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
