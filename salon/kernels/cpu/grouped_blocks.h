/* The split of a group-scaled GEMM's weight rows shared by w8a8_grouped.c and w16a8_grouped.c (AVX2, 8-row
 * blocks) and w8a8_grouped_vnni.c (AVX-512 VNNI, 16-row blocks): inside an OpenMP parallel region each thread
 * takes one contiguous range of row blocks (the blocks split evenly over the threads) and, for each block, the block's
 * first row, how many rows it has, and the next block's weights and scales to prefetch while it reads this
 * one (when that block is the same thread's and full: its rows and their G scales each are contiguous); and
 * the transposed load of an 8-row block's scales and the scaled store of its outputs the AVX2 kernels share.
 */
#ifndef SALON_GROUPED_BLOCKS_H
#define SALON_GROUPED_BLOCKS_H

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stddef.h>

#define GROUP 32

typedef struct {
    int64_t n;           /* the block's first weight row */
    int nr;              /* its rows (the last block may be short) */
    const int8_t *pf_w;  /* the next block's weights, or NULL */
    const float *pf_s;   /* the next block's scales, or NULL */
} grouped_block;

/* This thread's blocks [*b0, *b1) of nb. */
static inline void grouped_thread_blocks(int64_t nb, int64_t *b0, int64_t *b1) {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    *b0 = nb * t / nt;
    *b1 = nb * (t + 1) / nt;
}

static inline grouped_block grouped_block_at(int64_t b, int64_t b1, int rows, int64_t N, int64_t K, int64_t G,
                                             const int8_t *w, const float *w_scale) {
    grouped_block blk;
    blk.n = b * rows;
    blk.nr = N - blk.n < rows ? (int)(N - blk.n) : rows;
    const int next = b + 1 < b1 && N - blk.n >= 2 * rows;
    blk.pf_w = next ? w + (blk.n + rows) * K : NULL;
    blk.pf_s = next && w_scale ? w_scale + (blk.n + rows) * G : NULL;
    return blk;
}

/* wrow[r], srow[r]: row r's weights and scales for r < rows (the rows past a short block's nr alias its first
   row: they are computed, never stored). */
static inline __attribute__((always_inline)) void grouped_rows(const int8_t **wrow, const float **srow, int rows,
                                                               int64_t n, int nr, const int8_t *w,
                                                               const float *w_scale, int64_t K, int64_t G) {
    for (int r = 0; r < rows; r++) {
        const int64_t row = n + (r < nr ? r : 0);
        wrow[r] = w + row * K;
        srow[r] = w_scale + row * G;
    }
}

/* Prefetch the next block's scales of groups [g0, g0 + 8) (rows x 8 floats, all there are) while this block's
   are read: over the whole block, all of the next block's rows x G scales. */
static inline __attribute__((always_inline)) void grouped_prefetch_scales(const float *pf_s, int rows, int64_t g0,
                                                                          int64_t G) {
    const int64_t end = rows * G * 4, start = rows * g0 * 4;
    for (int64_t off = start; off < start + rows * 32 && off < end; off += 64)
        _mm_prefetch((const char *)pf_s + off, _MM_HINT_T0);
}

/* Prefetch the next block's weights for group g (rows x 32 bytes of its contiguous rows x K): over the whole
   block, all of them. */
static inline __attribute__((always_inline)) void grouped_prefetch_weights(const int8_t *pf_w, int rows, int64_t g) {
    for (int i = 0; i < rows / 2; i++) _mm_prefetch((const char *)(pf_w + g * rows * GROUP + 64 * i), _MM_HINT_T0);
}

/* For the AVX2 kernels' 8-row blocks: sc[j] = the 8 rows' scales of group g0 + j, for j < ng (ng <= 8; the
   other lanes and vectors are zero). */
static inline __attribute__((always_inline)) void grouped_load_scales(__m256 *sc, const float *const *srow,
                                                                      int64_t g0, int64_t ng) {
    __m256 v[8];
    if (ng == 8) {
        for (int r = 0; r < 8; r++) v[r] = _mm256_loadu_ps(srow[r] + g0);
    } else {
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)ng), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int r = 0; r < 8; r++) v[r] = _mm256_maskload_ps(srow[r] + g0, mask);
    }
    /* 8 x 8 transpose: v[r] lane j -> sc[j] lane r. */
    const __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
    const __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
    const __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
    const __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    sc[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    sc[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    sc[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    sc[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    sc[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    sc[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    sc[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    sc[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* For the AVX2 kernels' 8-row blocks: out[m, n .. n + nr) = y[m] * a_scale[m] for the chunk's mc rows (a short
   block's nr < 8 columns through a masked store); y[m] itself with a_scale NULL (the group32 recipe's rows, scaled
   per group already). */
static inline __attribute__((always_inline)) void grouped_store_rows(const __m256 *y, int64_t mc,
                                                                     const float *a_scale, float *out, int64_t ldo,
                                                                     int64_t n, int nr) {
    const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int64_t m = 0; m < mc; m++) {
        const __m256 v = a_scale ? _mm256_mul_ps(y[m], _mm256_set1_ps(a_scale[m])) : y[m];
        if (nr == 8) _mm256_storeu_ps(out + m * ldo + n, v);
        else _mm256_maskstore_ps(out + m * ldo + n, keep, v);
    }
}

#endif
