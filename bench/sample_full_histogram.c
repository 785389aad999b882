/* bench.sampler's baseline: salon/kernels/cpu/sample.c as it is, with every row through the bins, the mass histogram
 * over every token (top-p) and the walk over the vocabulary: no first look among the top bins' tokens, no plain
 * temperature path without bins. The same rule: the same kept set, its masses summed in another order (top-p), the
 * same sums (top_p 1). */
#define SAMPLE_SHORT_PATHS 0
#include "../salon/kernels/cpu/sample.c"
