/* How much of a GEMM's instruction time this CPU hides under its weights' stream: a synthetic read of a buffer in
 * 512-byte units (8 x 64 bytes loaded into registers), each thread its own contiguous share, prefetched
 * PREFETCH_BYTES ahead into L2 as the engine's packed GEMM does, with `work` of one of two instruction mixes per
 * unit:
 *
 *   mix 0, thin:    `work` vpdpbusd on the loaded vectors with register operands, round robin over 8 accumulators
 *                   (few micro-ops per product, no other loads);
 *   mix 1, kernel:  `work` activation rows, each as the VNNI grouped GEMM treats one row of a group
 *                   (salon/kernels/cpu/w8a8_grouped_vnni.c's group_rows): 8 vpdpbusd whose activation bytes are
 *                   broadcast from memory (an L1-resident buffer), in two chains from a broadcast correction, then
 *                   the group's float step (the chains' sum converted, times a scale times the row's scale, added
 *                   to the row's accumulator): the same micro-ops per product as the kernel.
 *
 * With window > 0 each thread reads its own first `window` bytes over and over instead, the same number of units:
 * the same instructions without memory traffic (the window stays in L2). bench.overlap_probe times them.
 *
 *   overlap_seconds(mix, buf, bytes, window, work, act, nthreads) -> seconds from the first thread's start to the
 *   last one's end; act: 4096 bytes (mix 1's activation rows and scales). VNNI (AVX-512) only: the caller checks.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#define UNIT 512
#define PREFETCH_BYTES 8192
#define ACT_ROWS 8

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

static volatile int32_t sink;

typedef int32_t __attribute__((aligned(1), may_alias)) unaligned_i32;

VNNI static int32_t units(int mix, const uint8_t *p, int64_t n, int64_t window_units, int64_t work,
                          const int8_t *act) {
    __m512i acc[8];
    __m512 y[ACT_ROWS];
    for (int i = 0; i < 8; i++) acc[i] = _mm512_set1_epi32(i);
    for (int i = 0; i < ACT_ROWS; i++) y[i] = _mm512_setzero_ps();
    const __m512i x = _mm512_set1_epi32(0x01020304);
    const float *scales = (const float *)(act + 2048);
    for (int64_t u = 0; u < n; u++) {
        const uint8_t *q = p + (window_units ? u % window_units : u) * UNIT;
        for (int i = 0; i < UNIT; i += 64) _mm_prefetch((const char *)q + PREFETCH_BYTES + i, _MM_HINT_T1);
        __m512i v[8];
        for (int i = 0; i < 8; i++) v[i] = _mm512_load_si512((const void *)(q + 64 * i));
        if (mix == 0) {
            for (int64_t w = 0; w < work; w++) acc[w & 7] = _mm512_dpbusd_epi32(acc[w & 7], v[w & 7], x);
            continue;
        }
        const __m512 s = _mm512_loadu_ps(scales + 16 * (u & 3));
        for (int64_t m = 0; m < work; m++) {
            const unaligned_i32 *am = (const unaligned_i32 *)(act + 32 * (m % ACT_ROWS) + 256 * (u & 7));
            __m512i c0 = _mm512_set1_epi32(am[0]), c1 = _mm512_setzero_si512();
            for (int i = 0; i < 8; i += 2) {  /* the broadcast as the instruction's memory operand, as the kernel */
                __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(c0) : "v"(v[i]), "m"(am[i]));
                __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(c1) : "v"(v[i + 1]), "m"(am[i + 1]));
            }
            const __m512 f = _mm512_mul_ps(s, _mm512_set1_ps(scales[(m + u) & 63]));
            y[m % ACT_ROWS] = _mm512_add_ps(y[m % ACT_ROWS],
                                            _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(c0, c1)), f));
        }
    }
    __m512i t = acc[0];
    for (int i = 1; i < 8; i++) t = _mm512_add_epi32(t, acc[i]);
    for (int i = 0; i < ACT_ROWS; i++) t = _mm512_xor_si512(t, _mm512_castps_si512(y[i]));
    return _mm512_reduce_add_epi32(t);
}

double overlap_seconds(int mix, const uint8_t *buf, int64_t bytes, int64_t window, int64_t work, const int8_t *act,
                       int nthreads) {
    const int64_t n = bytes / UNIT / nthreads, window_units = window / UNIT;
    const double start = omp_get_wtime();
    int32_t total = 0;
    #pragma omp parallel num_threads(nthreads) reduction(+ : total)
    {
        const int64_t t = omp_get_thread_num();
        total += units(mix, buf + (window ? t * window : t * n * UNIT), n, window_units, work, act);
    }
    sink = total;
    return omp_get_wtime() - start;
}
