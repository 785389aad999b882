/* The vector passes of sample.c over one ISA's vector layer (sample.c has the sampling rule and the scalar steps).
 * Included once per build after sample.c's Entry, Simd, min_max_scalar and bin_of; the includer defines the layer
 * first and this file undefines its parameters:
 *   S_ISA         the suffix of every name defined here (avx512, avx2); the passes are sample_simd_<isa>
 *   S_TARGET      the target attribute of the build's functions (empty: the file's baseline flags)
 *   S_LANES       floats per vector; S_VEC, S_IVEC the float and int32 vector types
 *   sv_<op>_<isa> set1, loadu, storeu, max, min, sub, mul, exp (simd_math.h's, lane for lane the same in both
 *                 builds), first (lane 0), reduce_max, reduce_min; izero, iset1, imax, imin, cvtt (truncating
 *                 convert), store_bins (one vector of bins in [0, NBINS) as S_LANES uint16);
 *                 hits16 (the mask of the 16 tokens at bins whose bin is in [lo_bin, hi_bin], token j as bit j);
 *                 block_mass (the float64 mass of the 16 tokens at i with bin > cut, in the build's fixed tree:
 *                 both builds add v[j] + v[j + 8], then halves, as _mm512_reduce_add_pd does, so they agree),
 *                 block_sum (the same of all 16).
 * Max and min are exact in any order; every other step is per token, so both builds give the same bits.
 */
#ifndef SALON_SAMPLE_H_NAMES
#define SALON_SAMPLE_H_NAMES
#define S_PASTE_(name, isa) name##_##isa
#define S_PASTE(name, isa) S_PASTE_(name, isa)
#define S_FN(name) S_PASTE(name, S_ISA)
#define SV(op) S_PASTE(sv_##op, S_ISA)
#endif

#include <math.h>
#include <stdint.h>

/* x: f32[V] -> e = exp(x - max(x)), bins = the bin of each x among NBINS equal bins over [min, max]. */
S_TARGET static void S_FN(exp_and_bins)(const float *x, int64_t V, float *e, uint16_t *bins) {
    S_VEC mv = SV(set1)(-INFINITY), nv = SV(set1)(INFINITY);
    int64_t i = 0;
    for (; i + S_LANES <= V; i += S_LANES) {
        S_VEC v = SV(loadu)(x + i);
        mv = SV(max)(mv, v);
        nv = SV(min)(nv, v);
    }
    float m = SV(reduce_max)(mv), lo = SV(reduce_min)(nv);
    min_max_scalar(x, i, V, &m, &lo);
    const float scale = m > lo ? NBINS / (m - lo) : 0.0f;
    const S_VEC vm = SV(set1)(m), vlo = SV(set1)(lo), vscale = SV(set1)(scale);
    const S_IVEC top_bin = SV(iset1)(NBINS - 1), zero = SV(izero)();
    for (i = 0; i + S_LANES <= V; i += S_LANES) {
        S_VEC v = SV(loadu)(x + i);
        SV(storeu)(e + i, SV(exp)(SV(sub)(v, vm)));
        S_IVEC b = SV(cvtt)(SV(mul)(SV(sub)(v, vlo), vscale));
        b = SV(imin)(SV(imax)(b, zero), top_bin);
        SV(store_bins)(bins + i, b);
    }
    for (; i < V; i++) {
        e[i] = SV(first)(SV(exp)(SV(set1)(x[i] - m)));
        bins[i] = bin_of(x[i], lo, scale);
    }
}

/* Tokens whose bin is lo_bin <= bin <= hi_bin, appended to out[n..] in vocabulary order; the new count. */
S_TARGET static int64_t S_FN(gather_bins)(const float *x, const uint16_t *bins, int64_t V, int lo_bin, int hi_bin,
                                          Entry *out, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= V; i += 16)
        for (unsigned hit = SV(hits16)(bins + i, lo_bin, hi_bin); hit; hit &= hit - 1) {
            int64_t j = i + __builtin_ctz(hit);
            out[n].x = x[j]; out[n].id = (int32_t)j; n++;
        }
    for (; i < V; i++)
        if (bins[i] >= lo_bin && bins[i] <= hi_bin) { out[n].x = x[i]; out[n].id = (int32_t)i; n++; }
    return n;
}

/* block[b] = the mass of block b's tokens with bin > cut, for b < nb; their sum, in block order. */
S_TARGET static double S_FN(block_masses)(const float *e, const uint16_t *bins, int64_t nb, int cut, double *block) {
    double total = 0.0;
    for (int64_t b = 0; b < nb; b++) total += block[b] = SV(block_mass)(e, bins, b * 16, cut);
    return total;
}

/* x: f32[V] -> e = exp(x - max(x)) and block[b] = the mass of block b's 16 tokens, for b < V / 16 (block_mass's tree
   with every token kept, taken as the block's e is stored); their sum, in block order. The last V % 16 tokens' e
   only. */
S_TARGET static double S_FN(exp_and_masses)(const float *x, int64_t V, float *e, double *block) {
    S_VEC mv = SV(set1)(-INFINITY);
    int64_t i = 0;
    for (; i + S_LANES <= V; i += S_LANES) mv = SV(max)(mv, SV(loadu)(x + i));
    float m = SV(reduce_max)(mv), lo = m;
    min_max_scalar(x, i, V, &m, &lo);
    const S_VEC vm = SV(set1)(m);
    double total = 0.0;
    for (i = 0; i + 16 <= V; i += 16) {
        for (int j = 0; j < 16; j += S_LANES) SV(storeu)(e + i + j, SV(exp)(SV(sub)(SV(loadu)(x + i + j), vm)));
        total += block[i / 16] = SV(block_sum)(e, i);
    }
    for (; i < V; i++) e[i] = SV(first)(SV(exp)(SV(set1)(x[i] - m)));
    return total;
}

static const Simd S_FN(sample_simd) = {S_FN(exp_and_bins), S_FN(gather_bins), S_FN(block_masses),
                                       S_FN(exp_and_masses)};

#undef S_ISA
#undef S_TARGET
#undef S_LANES
#undef S_VEC
#undef S_IVEC
