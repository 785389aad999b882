/* How much of a GEMM's instruction time this CPU hides under its weights' stream: a synthetic read of a buffer in
 * 512-byte units (8 x 64 bytes loaded into registers), each thread its own contiguous share, prefetched
 * PREFETCH_BYTES ahead into L2 as the engine's packed GEMM does, with `work` of one of two instruction mixes per
 * unit:
 *
 *   mix 0, thin:    `work` vpdpbusd on the loaded vectors with register operands (rounded up to a multiple of 8:
 *                   each of the 8 vectors into its own accumulator), few micro-ops per product, no other loads;
 *                   work 0 folds the loaded vectors into the accumulators (the stream alone);
 *   mix 1, kernel:  `work` activation rows (1 to 8), each as the VNNI grouped GEMM treats one row of a group
 *                   (salon/kernels/cpu/w8a8_grouped_vnni.c's group_rows): 8 vpdpbusd whose activation bytes are
 *                   broadcast from memory (an L1-resident buffer), in two chains from a broadcast correction, then
 *                   the group's float step (the chains' sum converted, times a scale times the row's scale, added
 *                   to the row's accumulator, no fused multiply-add, every accumulator in a register): the same
 *                   micro-ops per product as the kernel.
 *
 * With window > 0 each thread reads its own first `window` bytes over and over instead, the same number of units:
 * the same instructions without memory traffic (the window stays in L2). bench.overlap_probe times them.
 *
 *   overlap_seconds(mix, buf, bytes, window, work, act, nthreads) -> seconds from the first thread's start to the
 *   last one's end; act: 4096 bytes (mix 1's activation rows and scales). VNNI (AVX-512) only: the caller checks.
 */
#pragma GCC optimize("fp-contract=off") /* as the kernel: its products rounded, then summed */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#define UNIT 512
#define PREFETCH_BYTES 8192
#define MAX_ROWS 8 /* mix 1's rows per unit: 1 to MAX_ROWS (the activation buffer holds 8) */

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

static volatile int32_t sink;

typedef int32_t __attribute__((aligned(1), may_alias)) unaligned_i32;

/* The unit's 8 vectors at q, its prefetch issued. */
VNNI static inline __attribute__((always_inline)) void load_unit(__m512i *v, const uint8_t *q) {
    for (int i = 0; i < UNIT; i += 64) _mm_prefetch((const char *)q + PREFETCH_BYTES + i, _MM_HINT_T1);
    for (int i = 0; i < 8; i++) v[i] = _mm512_load_si512((const void *)(q + 64 * i));
}

/* Mix 0 over n units. */
VNNI static int32_t thin_units(const uint8_t *p, int64_t n, int64_t window_units, int64_t work) {
    __m512i acc[8];
    for (int i = 0; i < 8; i++) acc[i] = _mm512_set1_epi32(i);
    const __m512i x = _mm512_set1_epi32(0x01020304);
    for (int64_t u = 0; u < n; u++) {
        __m512i v[8];
        load_unit(v, p + (window_units ? u % window_units : u) * UNIT);
        for (int64_t w = 0; w < work; w += 8)  /* 8 at a time, each vector into its own accumulator */
            for (int i = 0; i < 8; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], v[i], x);
        if (!work)  /* the stream alone: the loaded vectors still go somewhere */
            for (int i = 0; i < 8; i++) acc[i] = _mm512_xor_si512(acc[i], v[i]);
    }
    __m512i t = acc[0];
    for (int i = 1; i < 8; i++) t = _mm512_add_epi32(t, acc[i]);
    return _mm512_reduce_add_epi32(t);
}

/* Mix 1 over n units, ROWS rows each (a compile-time constant, so the rows' accumulators stay in registers, as the
   kernel's do at decode sizes). */
VNNI static inline __attribute__((always_inline)) int32_t kernel_units(const int ROWS, const uint8_t *p, int64_t n,
                                                                      int64_t window_units, const int8_t *act) {
    __m512 y[MAX_ROWS];
    for (int m = 0; m < ROWS; m++) y[m] = _mm512_setzero_ps();
    const float *scales = (const float *)(act + 2048);
    for (int64_t u = 0; u < n; u++) {
        __m512i v[8];
        load_unit(v, p + (window_units ? u % window_units : u) * UNIT);
        const __m512 s = _mm512_loadu_ps(scales + 16 * (u & 3));
        #pragma GCC unroll 16
        for (int m = 0; m < ROWS; m++) {
            const unaligned_i32 *am = (const unaligned_i32 *)(act + 32 * m + 256 * (u & 7));
            __m512i c0 = _mm512_set1_epi32(am[0]), c1 = _mm512_setzero_si512();
            for (int i = 0; i < 8; i += 2) {  /* the broadcast as the instruction's memory operand, as the kernel */
                __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(c0) : "v"(v[i]), "m"(am[i]));
                __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(c1) : "v"(v[i + 1]), "m"(am[i + 1]));
            }
            const __m512 f = _mm512_mul_ps(s, _mm512_set1_ps(scales[(m + u) & 63]));
            y[m] = _mm512_add_ps(y[m], _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(c0, c1)), f));
        }
    }
    __m512i t = _mm512_setzero_si512();
    for (int m = 0; m < ROWS; m++) t = _mm512_xor_si512(t, _mm512_castps_si512(y[m]));
    return _mm512_reduce_add_epi32(t);
}

#define ROWS_CASE(R) \
    case R: return kernel_units(R, p, n, window_units, act);

VNNI static int32_t units(int mix, const uint8_t *p, int64_t n, int64_t window_units, int64_t work,
                          const int8_t *act) {
    if (mix == 0) return thin_units(p, n, window_units, work);
    switch (work) {
        ROWS_CASE(1) ROWS_CASE(2) ROWS_CASE(3) ROWS_CASE(4) ROWS_CASE(5) ROWS_CASE(6) ROWS_CASE(7) ROWS_CASE(8)
        default: return 0;
    }
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
