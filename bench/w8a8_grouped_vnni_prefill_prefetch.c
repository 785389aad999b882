/* bench.gemv's baseline for the VNNI kernel's decode prefetch: salon/kernels/cpu/w8a8_grouped_vnni.c as it is, with the
 * prefill's prefetch (into L1, 4 groups ahead) at every size instead of the decode one (into L2 16 groups ahead and
 * into L1 2 ahead, up to 16 rows). The same bits: a prefetch changes no result. */
#define DECODE_PREFETCH 0
#include "../salon/kernels/cpu/w8a8_grouped_vnni.c"
