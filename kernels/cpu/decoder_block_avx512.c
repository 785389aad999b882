/* The Gemma 3 decoder layer in one call on AVX-512 VNNI CPUs (decoder_block.h has the composition): the
 * AVX-512 builds of paged attention and the KV write and the VNNI grouped W8A8 GEMM, the kernels the CPU family
 * runs on such a CPU. decoder_block_avx2.c is the same on AVX2 CPUs.
 *
 * The attention comes first, compiled as in its own library (before rmsnorm.c turns fp-contract off for what
 * follows; it holds no product feeding an addition anyway).
 */
#include "paged_attention.c"
#include "rmsnorm.c"
#include "rope.c"
#include "quantize.c"
#include "w8a8_grouped_vnni.c"
#include "geglu.c"

#define BLOCK_GEMM w8a8_grouped_vnni
#define BLOCK_KV_WRITE kv_write_rows_avx512
#define BLOCK_ENTRY decoder_block_avx512
#include "decoder_block.h"
