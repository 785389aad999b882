/* The mask of an AVX2 maskload / maskstore of a row's last n floats (n < 8): the first n lanes set, so the
 * other lanes read as 0 and are not written. Shared by the kernels that handle a row's tail this way. */
#ifndef SALON_AVX2_TAIL_H
#define SALON_AVX2_TAIL_H

#include <immintrin.h>
#include <stdint.h>

__attribute__((target("avx2"))) static inline __m256i avx2_tail_mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

#endif
