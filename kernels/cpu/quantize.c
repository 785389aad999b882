/* Per-row symmetric int8 quantization with AVX-512, bit for bit the semantics of kernels.quantize:
 *   scale = max(absmax(row) / 127, SCALE_FLOOR)      (IEEE division)
 *   q     = clamp(round_half_even(x / scale), -127, 127)
 * Rows are independent (max is exact in any order), so results never depend on the batch or the threads.
 *
 *   quantize_rows  x f32[M, K] (row stride sx) -> q int8[M, K], scale f32[M]
 *   kv_write_rows  x f32[T, H, D] -> the int8 rows and scales of cache slots slot[t] (the KV write)
 */
#include <immintrin.h>
#include <stdint.h>

#define AVX512 __attribute__((target("avx512f,avx512bw")))

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

AVX512 void quantize_rows(const float *x, int64_t M, int64_t K, int64_t sx, int8_t *q, float *scale, float floor_,
                          int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (M * K >= 65536)
    for (int64_t m = 0; m < M; m++) scale[m] = quantize_row(x + m * sx, K, q + m * K, floor_);
}

/* x: f32[T, H, D] contiguous; cache int8[.., H, D] and scale f32[.., H] addressed by slot (block * BS + offset). */
AVX512 void kv_write_rows(const float *x, int64_t T, int64_t H, int64_t D, int8_t *cache, float *scale,
                          const int64_t *slot, float floor_, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (T * H * D >= 65536)
    for (int64_t i = 0; i < T * H; i++) {
        int64_t t = i / H, h = i % H, row = slot[t] * H + h;
        scale[row] = quantize_row(x + i * D, D, cache + row * D, floor_);
    }
}
