/* The decoder layer in one call on AVX2 CPUs (decoder_block.h has the composition): the AVX2 builds of paged
 * attention, the KV write, the grouped W8A8 GEMM and the per-row GEMV, the kernels the CPU family runs on such a
 * CPU. decoder_block_avx512.c is the same on AVX-512 VNNI CPUs.
 *
 * The attention comes first, compiled as in its own library (before rmsnorm.c turns fp-contract off for what
 * follows; it holds no product feeding an addition anyway).
 */
#include "paged_attention_avx2.c"
#include "rmsnorm.c"
#include "rope.c"
#include "quantize.c"
#include "w8a8_grouped.c"
#include "w16a8_grouped.c"
#undef PREFETCH_BYTES
#include "w8a8_gemv.c"
#include "glu.c"
#include "linear_two_terms.h"

/* Per-row weight scales: the family's GEMM is w8a8_gemv.c, GEMV_MAX_ROWS rows a call (w8a8_gemm.py splits
   larger calls; a layer of MAX_ROWS rows has 2 * MAX_ROWS = GEMV_MAX_ROWS two-term rows, so it never meets
   one, and the GEMV would decline it). */
static int row_gemm_avx2(const int8_t *a, int64_t lda, const int8_t *w, const float *w_scale, float *out, int64_t ldo,
                         const float *a_scale, int64_t M, int64_t N, int64_t K, int nthreads) {
    return w8a8_gemv_avx2(a, lda, w, out, ldo, a_scale, w_scale, M, N, K, nthreads);
}

#define BLOCK_GEMM w8a8_grouped_avx2
#define BLOCK_GEMM_SUM2 NULL /* AVX2's GEMM stores each term's rows; sum_terms adds them */
#define BLOCK_ROW_GEMM row_gemm_avx2
#define BLOCK_GROUP32_GEMM w8a8_group32_avx2
#define BLOCK_KV_WRITE kv_write_rows_avx2
#define BLOCK_ENTRY decoder_block_avx2
#define BLOCK_LAYERS_ENTRY decoder_blocks_avx2
#include "decoder_block.h"
