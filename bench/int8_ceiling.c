/* The integer-product ceiling of this CPU for the engine's W8A8 kernels: the inner instructions of a kernel's
 * products, with every operand in registers and eight independent accumulators, run on each thread at once.
 * No kernel can compute exact int8 products faster than this with the same instructions; a GEMM's GMAC/s
 * over it says how much of the time went to anything else (loads, shuffles, scaling, waiting for memory).
 *
 *   avx2: 32 products per vpsignb + vpmaddubsw + vpmaddwd + vpaddd (w8a8_grouped.c, w8a8_gemv.c: AVX2 has
 *         no exact signed int8 dot product), the activation bytes broadcast from memory as the kernels do;
 *   vnni: 64 products per vpdpbusd with the activation bytes broadcast from memory (w8a8_grouped_vnni.c);
 *   int16: 16 products of an int16 activation and a sign-extended int8 weight per vpmaddwd + vpaddd, the
 *          activation pair broadcast from memory. No engine kernel runs this: it is what a recipe with one
 *          int16 term per activation (instead of two int8 terms, x ~ s1 * q1 + s2 * q2) would get on AVX2.
 *          One such product stands for the two int8 products of the two terms, so it is counted twice:
 *          the figure compares with the avx2 one directly.
 *
 * int8_products_per_s(mode, iters, nthreads) -> products per second over all the threads (each runs iters
 * rounds of 8 independent accumulations), timed from the first thread's start to the last one's end;
 * mode 0 avx2, 1 vnni, 2 int16 (in two-term int8 products).
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

static volatile int32_t sink;

#define FOR8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

__attribute__((target("avx2"))) static int32_t avx2_rounds(int64_t iters, const int32_t *act) {
    const __m256i ones = _mm256_set1_epi16(1);
#define DECL(i) __m256i acc##i = _mm256_set1_epi32(i + act[0]); \
                __m256i w##i = _mm256_set1_epi8((char)(i * 37 + act[1])); __m256i u##i = _mm256_abs_epi8(w##i);
    FOR8(DECL)
    for (int64_t n = 0; n < iters; n++) {
        const __m256i a = _mm256_set1_epi32(act[n & 63]);
#define STEP(i) acc##i = _mm256_add_epi32(acc##i, _mm256_madd_epi16(_mm256_maddubs_epi16(u##i, \
                    _mm256_sign_epi8(a, w##i)), ones));
        FOR8(STEP)
    }
    __m256i all = _mm256_setzero_si256();
#define SUM(i) all = _mm256_add_epi32(all, acc##i);
    FOR8(SUM)
    return _mm256_extract_epi32(all, 0);
}

__attribute__((target("avx2"))) static int32_t int16_rounds(int64_t iters, const int32_t *act) {
#define DECL16(i) __m256i acc##i = _mm256_set1_epi32(i + act[0]); \
                  __m256i w##i = _mm256_set1_epi16((short)(i * 37 + act[1]));
    FOR8(DECL16)
    for (int64_t n = 0; n < iters; n++) {
        const __m256i a = _mm256_set1_epi32(act[n & 63]);
#define STEP16(i) acc##i = _mm256_add_epi32(acc##i, _mm256_madd_epi16(a, w##i));
        FOR8(STEP16)
    }
    __m256i all = _mm256_setzero_si256();
    FOR8(SUM)
    return _mm256_extract_epi32(all, 0);
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static int32_t vnni_rounds(int64_t iters,
                                                                                  const int32_t *act) {
#define DECL512(i) __m512i acc##i = _mm512_set1_epi32(i + act[0]); \
                   __m512i w##i = _mm512_set1_epi8((char)(i * 37 + act[1]));
    FOR8(DECL512)
    for (int64_t n = 0; n < iters; n++) {
        const __m512i a = _mm512_set1_epi32(act[n & 63]);
#define STEP512(i) acc##i = _mm512_dpbusd_epi32(acc##i, w##i, a);
        FOR8(STEP512)
    }
    __m512i all = _mm512_setzero_si512();
#define SUM512(i) all = _mm512_add_epi32(all, acc##i);
    FOR8(SUM512)
    return _mm512_reduce_add_epi32(all);
}

double int8_products_per_s(int mode, int64_t iters, int nthreads) {
    int32_t act[64];
    for (int i = 0; i < 64; i++) act[i] = (int32_t)(0x01020304u * (uint32_t)(i + 1));
    int ran = 0;
    const double start = omp_get_wtime();
    #pragma omp parallel num_threads(nthreads)
    {
        const int32_t r = mode == 1 ? vnni_rounds(iters, act) : mode == 2 ? int16_rounds(iters, act)
                                                                          : avx2_rounds(iters, act);
        #pragma omp atomic
        sink += r;
        #pragma omp atomic
        ran++;
    }
    const double seconds = omp_get_wtime() - start;
    /* int16: 16 products a round, each standing for two int8 products of the two-term recipe */
    return (double)iters * 8.0 * (mode == 1 ? 64.0 : 32.0) * ran / seconds;
}
