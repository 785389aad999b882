/* The decoder layer in one call on AVX-512 VNNI CPUs (decoder_block.h has the composition): the AVX-512 builds
 * of paged attention and the KV write and the VNNI grouped and per-row W8A8 GEMMs, the kernels the CPU family
 * runs on such a CPU. decoder_block_avx2.c is the same on AVX2 CPUs.
 *
 * The attention comes first, compiled as in its own library (before rmsnorm.c turns fp-contract off for what
 * follows; it holds no product feeding an addition anyway).
 */
#include "paged_attention_avx512.c"
#include "rmsnorm.c"
#include "rope.c"
#include "quantize.c"
#include "w8a8_grouped_vnni.c"
#include "w16a8_grouped.c"
#undef VNNI
#include "w8a8_acc.c"
#include "glu.c"
#include "linear_two_terms.h"

/* Per-row weight scales: w8a8_acc.c's VNNI kernel with the scales applied as it stores, on the activations as
   unsigned bytes x + 128 in rows padded to a multiple of 64 bytes and 4 rows (the padding 128: zero), as
   salon/kernels/cpu/w8a8_gemm.py's int8_acc_c prepares them. */
static int row_gemm_vnni(const int8_t *a, int64_t lda, const int8_t *w, const float *w_scale, float *out, int64_t ldo,
                         const float *a_scale, int64_t M, int64_t N, int64_t K, int nthreads) {
    const int64_t kp = (K + 63) / 64 * 64, mp = (M + 3) / 4 * 4;
    if (M < 1 || ldo != N) return 1;
    uint8_t *a_u8 = malloc((size_t)(mp * kp));
    if (a_u8 == NULL) return 1;
    memset(a_u8, 128, (size_t)(mp * kp));
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) a_u8[m * kp + k] = (uint8_t)(a[m * lda + k] ^ 0x80);
    w8a8_acc_vnni(a_u8, w, out, a_scale, w_scale, M, mp, N, K, kp, nthreads);
    free(a_u8);
    return 0;
}

#define BLOCK_GEMM w8a8_grouped_vnni
#define BLOCK_GEMM_SUM2 w8a8_grouped_vnni_sum2
#define BLOCK_ROW_GEMM row_gemm_vnni
#define BLOCK_GROUP32_GEMM w8a8_group32_vnni
#define BLOCK_KV_WRITE kv_write_rows_avx512
#define BLOCK_ENTRY decoder_block_avx512
#define BLOCK_LAYERS_ENTRY decoder_blocks_avx512
#include "decoder_block.h"
