/* bench.sampler's baseline: salon/kernels/cpu/sample.c as it is, with top-p always through the mass histogram over
 * every token and the walk over the vocabulary (no first look among the top bins' tokens). The same rule: the same
 * kept set, its masses summed in another order. */
#define TOP_P_TOP_BINS 0
#include "../salon/kernels/cpu/sample.c"
