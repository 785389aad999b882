/* The split of a group-scaled GEMM's weight rows shared by w8a8_grouped.c (AVX2, 8-row blocks) and
 * w8a8_grouped_vnni.c (AVX-512 VNNI, 16-row blocks): inside an OpenMP parallel region each thread takes one
 * contiguous range of row blocks (the blocks split evenly over the threads) and, for each block, the block's
 * first row, how many rows it has, and the next block's weights and scales to prefetch while it reads this
 * one (when that block is the same thread's and full: its rows and their G scales each are contiguous).
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
    blk.pf_s = next ? w_scale + (blk.n + rows) * G : NULL;
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

#endif
