/* The Gemma 3 decoder layer in one call on AVX2 CPUs (decoder_block.h has the composition): the AVX2 builds of
 * paged attention, the KV write and the grouped W8A8 GEMM, the kernels the CPU family runs on such a CPU.
 * decoder_block_avx512.c is the same on AVX-512 VNNI CPUs.
 *
 * The attention comes first, compiled as in its own library (before rmsnorm.c turns fp-contract off for what
 * follows; it holds no product feeding an addition anyway).
 */
#include "paged_attention_avx2.c"
#include "rmsnorm.c"
#include "rope.c"
#include "quantize.c"
#include "w8a8_grouped.c"
#include "geglu.c"

#define BLOCK_GEMM w8a8_grouped_avx2
#define BLOCK_KV_WRITE kv_write_rows_avx2
#define BLOCK_ENTRY decoder_block_avx2
#include "decoder_block.h"
