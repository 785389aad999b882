/* Per-row symmetric quantization over one ISA's vector layer (quantize.c has the arithmetic's contract):
 *   scale = max(absmax(row) / 127, floor);  q = clamp(round_half_even(x / scale), -127, 127)
 * and the same per 32 values of a row (the group32 recipe: each group a row of its own).
 * Included once per build; the includer defines the layer first and this file undefines its parameters:
 *   Q_ISA         the suffix of every name defined here (avx512, avx2): quantize_row_<isa>, quantize_rows_<isa>, ...
 *   Q_TARGET      the target attribute of the build's functions (empty: the file's baseline flags)
 *   Q_LANES       floats per vector; Q_VEC, Q_IVEC the float and int32 vector types
 *   Q_CHAINS      the independent max chains of absmax's main loop; Q_TAIL_CHAIN the chain the row's last
 *                 K % Q_LANES values join. Max is exact in any order on finite values; each build keeps its
 *                 chain layout, so a row holding NaN (no defined result) still gives what that build gave.
 *   Q_UNROLL      vectors quantized per store in the main loop
 *   qv_<op>_<isa> zero, set1, loadu, load_tail (the first n < Q_LANES floats, the rest 0), abs, max, min, div,
 *                 round (to nearest, ties to even), cvt (to int32), reduce_max (of the Q_CHAINS chains),
 *                 store_block (Q_UNROLL vectors of int32 lanes in [-127, 127] -> their bytes), store_bytes
 *                 (one vector's), store_tail (the first n < Q_LANES of one vector's).
 * Every value's divide, round, clamp and convert are its own (no lane meets another), so how the loops group
 * the stores never changes a byte.
 */
#ifndef SALON_QUANTIZE_H_NAMES
#define SALON_QUANTIZE_H_NAMES
#define Q_PASTE_(name, isa) name##_##isa
#define Q_PASTE(name, isa) Q_PASTE_(name, isa)
#define Q_FN(name) Q_PASTE(name, Q_ISA)
#define QV(op) Q_PASTE(qv_##op, Q_ISA)
#endif

#include <omp.h>
#include <stdint.h>

/* absmax(row) of K floats. */
Q_TARGET static inline float Q_FN(absmax_row)(const float *x, int64_t K) {
    Q_VEC m[Q_CHAINS];
    for (int c = 0; c < Q_CHAINS; c++) m[c] = QV(zero)();
    int64_t k = 0;
    for (; k + Q_CHAINS * Q_LANES <= K; k += Q_CHAINS * Q_LANES)
        for (int c = 0; c < Q_CHAINS; c++) m[c] = QV(max)(m[c], QV(abs)(QV(loadu)(x + k + c * Q_LANES)));
    for (; k + Q_LANES <= K; k += Q_LANES) m[0] = QV(max)(m[0], QV(abs)(QV(loadu)(x + k)));
    if (k < K) m[Q_TAIL_CHAIN] = QV(max)(m[Q_TAIL_CHAIN], QV(abs)(QV(load_tail)(x + k, K - k)));
    return QV(reduce_max)(m);
}

/* One vector quantized with scale s and bounds lo, hi: divide, round (ties to even), clamp, convert. */
Q_TARGET static inline Q_IVEC Q_FN(quantize_lanes)(Q_VEC v, Q_VEC s, Q_VEC lo, Q_VEC hi) {
    Q_VEC y = QV(round)(QV(div)(v, s));
    return QV(cvt)(QV(min)(QV(max)(y, lo), hi));
}

/* One row: its scale (returned) and its K int8 values. */
Q_TARGET static inline float Q_FN(quantize_row)(const float *x, int64_t K, int8_t *q, float floor_) {
    float scale = Q_FN(absmax_row)(x, K) / 127.0f;
    if (scale < floor_) scale = floor_;
    const Q_VEC s = QV(set1)(scale), lo = QV(set1)(-127.0f), hi = QV(set1)(127.0f);
    int64_t k = 0;
    for (; k + Q_UNROLL * Q_LANES <= K; k += Q_UNROLL * Q_LANES) {
        Q_IVEC v[Q_UNROLL];
        for (int u = 0; u < Q_UNROLL; u++) v[u] = Q_FN(quantize_lanes)(QV(loadu)(x + k + u * Q_LANES), s, lo, hi);
        QV(store_block)(q + k, v);
    }
    for (; k + Q_LANES <= K; k += Q_LANES) QV(store_bytes)(q + k, Q_FN(quantize_lanes)(QV(loadu)(x + k), s, lo, hi));
    if (k < K) QV(store_tail)(q + k, Q_FN(quantize_lanes)(QV(load_tail)(x + k, K - k), s, lo, hi), K - k);
    return scale;
}

/* x f32[M, K] (row stride sx) -> q int8[M, K], scale f32[M]. */
Q_TARGET void Q_FN(quantize_rows)(const float *x, int64_t M, int64_t K, int64_t sx, int8_t *q, float *scale,
                                  float floor_, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (M * K >= 65536)
    for (int64_t m = 0; m < M; m++) scale[m] = Q_FN(quantize_row)(x + m * sx, K, q + m * K, floor_);
}

/* One row of the group32 recipe (salon.kernels.w8a8_group32): each group of 32 values quantized as a row of its own,
   its scale in scale[g]. */
Q_TARGET static inline void Q_FN(quantize_group32_row)(const float *x, int64_t K, int8_t *q, float *scale,
                                                       float floor_) {
    for (int64_t g = 0; g < K / 32; g++) scale[g] = Q_FN(quantize_row)(x + 32 * g, 32, q + 32 * g, floor_);
}

/* x f32[M, K] (row stride sx, K a multiple of 32) -> q int8[M, K], scale f32[M, K / 32]. */
Q_TARGET void Q_FN(quantize_group32_rows)(const float *x, int64_t M, int64_t K, int64_t sx, int8_t *q, float *scale,
                                          float floor_, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (M * K >= 65536)
    for (int64_t m = 0; m < M; m++) Q_FN(quantize_group32_row)(x + m * sx, K, q + m * K, scale + m * (K / 32), floor_);
}

/* x: f32[T, H, D] contiguous; cache int8[.., H, D] and scale f32[.., H] addressed by slot (block * BS + offset). */
Q_TARGET void Q_FN(kv_write_rows)(const float *x, int64_t T, int64_t H, int64_t D, int8_t *cache, float *scale,
                                  const int64_t *slot, float floor_, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (T * H * D >= 65536)
    for (int64_t i = 0; i < T * H; i++) {
        int64_t t = i / H, h = i % H, row = slot[t] * H + h;
        if (slot[t] < 0) continue; /* a padded row: writes nothing */
        scale[row] = Q_FN(quantize_row)(x + i * D, D, cache + row * D, floor_);
    }
}

#undef Q_ISA
#undef Q_TARGET
#undef Q_LANES
#undef Q_VEC
#undef Q_IVEC
#undef Q_CHAINS
#undef Q_TAIL_CHAIN
#undef Q_UNROLL
