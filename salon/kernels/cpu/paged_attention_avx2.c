/* Paged attention over the int8 KV cache for CPUs with AVX2 and FMA but no AVX-512; the semantics of
 * salon.kernels.paged_attention.paged_attention_ref (see that module for the addressing) and the interface of
 * paged_attention.c, whose structure it follows in 8-lane vectors. It equals the reference to float rounding;
 * its bits differ from the AVX-512 kernel's (other lane counts, other sums), and a machine always runs the
 * same one of the two.
 *
 * One work item is one KV head (its G = Hq / Hkv query heads together, so each key is read and widened once
 * for all of them) of 2 consecutive rows of one sequence, which also share each widened key (2 rows x 4 heads
 * of accumulators are what 16 vector registers hold); a row left over, and decodes, go alone. Where the items are
 * fewer than the threads (a decode of one sequence with one KV head), the query heads of a KV head are split
 * between items (head_parts). A query's
 * arithmetic depends only on its own query, position and keys -- never on the other rows of the call, on how
 * they are grouped into sequences or on the thread that runs it -- so a query gets the same bits alone or
 * batched, in a prefill chunk or as a decode:
 *
 *   keys are visited in chunks of 16 positions aligned to absolute positions (16c .. 16c + 15), from the
 *   chunk holding the first visible key (window start or 0) to the one holding the query itself; every
 *   such chunk has a visible key. Keys outside [lo, position] get score -inf and are never read.
 *   score = dot(q, k) * (k_scale * sm_scale); dot: 8-lane FMAs over D in order (lane i sums dimensions
 *   i, i + 8, i + 16, ...), then each head's own vector summed as ((x0 + x1) + (x2 + x3)) + ((x4 + x5) +
 *   (x6 + x7)) (hsum4_ps);
 *   online softmax per chunk: m' = max(m, chunk max), alpha = exp(m - m'), p = exp(score - m'),
 *   l = fma(l, alpha, sum(p)) where sum(p) adds p_i + p_(i+8) lane-wise, then sums those 8 as above;
 *   acc = acc * alpha, then acc = fma(p_j * v_scale_j, v_j, acc) for each key j of the chunk in order;
 *   out = acc / l.
 *
 * exp is simd_math.h's exp256_ps. The one multiply-add of scalars (l) is an explicit fmaf, and no product
 * feeds an addition elsewhere, so the compiler finds nothing to contract differently in the inlined copies.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "simd_math.h"

#define AVX2 __attribute__((target("avx2,fma")))
#define MAX_G 8
#define MAX_D 512
#define CHUNK 16
#define RUN 2 /* rows of one sequence per work item */

/* The limits above, read by the binding (salon/kernels/cpu/paged_attention.py) so they are written down once. */
const int64_t salon_paged_attention_max_group = MAX_G;
const int64_t salon_paged_attention_max_head_dim = MAX_D;

/* 8 int8 -> 8 floats. */
AVX2 static inline __m256 widen(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* Four sums, one per head: [sum(v0), sum(v1), sum(v2), sum(v3)]; each output sums only its own vector, as
   ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)). */
AVX2 static inline __m128 hsum4_ps(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
    __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(v0, v1), _mm256_hadd_ps(v2, v3));
    return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

/* The largest of 8 floats (exact in any order). */
AVX2 static inline float hmax_ps(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}

static const int8_t ZERO_KEY[MAX_D] __attribute__((aligned(32)));

/* NQ (1 or RUN) consecutive query rows of one sequence (positions pos0 .. pos0 + NQ - 1), KV head h with its G
   query heads, each key widened once for all of them. Per query and head the operations are those of the
   NQ = 1 path, in the same order: a key a row cannot see gets score -inf and weight 0 (fma(0, v, a) == a),
   and a chunk outside a row's range leaves that row untouched. Inlined with constant NQ (and constant G for
   the group sizes of the models served) so that the accumulators live in registers. */
AVX2 static inline __attribute__((always_inline)) void attend_rows(
        const int NQ, const int G, const float *q, int64_t q_stride, const int8_t *kc, const int8_t *vc,
        const float *ks, const float *vs, const int32_t *table, int64_t pos0, int64_t window, int64_t h, int64_t Hkv,
        int64_t D, int64_t BS, float sm_scale, float *out, int64_t out_stride) {
    float acc[RUN][MAX_G * MAX_D] __attribute__((aligned(32)));
    float m[RUN][MAX_G], l[RUN][MAX_G];
    int64_t lo[RUN], pos[RUN];
    for (int r = 0; r < NQ; r++) {
        pos[r] = pos0 + r;
        lo[r] = window > 0 && pos[r] - window + 1 > 0 ? pos[r] - window + 1 : 0;
        for (int g = 0; g < G; g++) { m[r][g] = -INFINITY; l[r][g] = 0.0f; }
        for (int64_t i = 0; i < G * D; i++) acc[r][i] = 0.0f;
    }
    const int64_t row = Hkv * D;
    for (int64_t c = lo[0] / CHUNK; c <= pos[NQ - 1] / CHUNK; c++) {
        float sc[RUN][MAX_G][CHUNK] __attribute__((aligned(32)));
        float w[RUN][MAX_G][CHUNK] __attribute__((aligned(32)));
        const int8_t *kp[CHUNK], *vp[CHUNK];
        float kscale[CHUNK] __attribute__((aligned(32))), vscale[CHUNK] __attribute__((aligned(32)));
        const int64_t j0 = c * CHUNK;
        for (int i = 0; i < CHUNK; i++) {
            int64_t j = j0 + i;
            if (j < lo[0] || j > pos[NQ - 1]) { kp[i] = vp[i] = 0; kscale[i] = vscale[i] = 0.0f; continue; }
            int64_t slot = (int64_t)table[j / BS] * BS + j % BS;
            kp[i] = kc + slot * row + h * D;
            vp[i] = vc + slot * row + h * D;
            kscale[i] = ks[slot * Hkv + h] * sm_scale;
            vscale[i] = vs[slot * Hkv + h];
        }
        /* The next chunk's rows, fetched while this one is computed (long contexts stream from memory). */
        if (c < pos[NQ - 1] / CHUNK) {
            int64_t j1 = j0 + CHUNK;
            const int8_t *nk = kc + ((int64_t)table[j1 / BS] * BS + j1 % BS) * row + h * D;
            const int8_t *nv = vc + ((int64_t)table[j1 / BS] * BS + j1 % BS) * row + h * D;
            for (int i = 0; i < CHUNK && (i == 0 || (j1 + i) % BS != 0); i++)  /* rows of j1's block */
                for (int64_t dd = 0; dd < D; dd += 64) {
                    _mm_prefetch((const char *)(nk + i * row + dd), _MM_HINT_T0);
                    _mm_prefetch((const char *)(nv + i * row + dd), _MM_HINT_T0);
                }
        }
        /* Scores: keys two at a time when one row of at most 4 heads (8 independent FMA chains), else one. */
        const int KP = NQ == 1 && G <= 4 ? 2 : 1;
        for (int i = 0; i < CHUNK; i += KP) {
            __m256 d[2][RUN][MAX_G];
            const int8_t *kk[2];
            int any = 0;
            for (int p = 0; p < KP; p++) {
                kk[p] = kp[i + p] ? kp[i + p] : ZERO_KEY;
                any |= kp[i + p] != 0;
                for (int r = 0; r < NQ; r++)
                    for (int g = 0; g < G; g++) d[p][r][g] = _mm256_setzero_ps();
            }
            if (!any) {
                for (int p = 0; p < KP; p++)
                    for (int r = 0; r < NQ; r++)
                        for (int g = 0; g < G; g++) sc[r][g][i + p] = -INFINITY;
                continue;
            }
            for (int64_t dd = 0; dd < D; dd += 8) {
                for (int p = 0; p < KP; p++) {
                    __m256 kf = widen(kk[p] + dd);
                    for (int r = 0; r < NQ; r++)
                        for (int g = 0; g < G; g++)
                            d[p][r][g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * q_stride + g * D + dd), kf, d[p][r][g]);
                }
            }
            for (int p = 0; p < KP; p++) {
                int64_t j = j0 + i + p;
                for (int r = 0; r < NQ; r++) {
                    float t[MAX_G];
                    const __m256 zero = _mm256_setzero_ps();
                    for (int g = 0; g < G; g += 4)  /* heads past G sum a zero vector, never stored */
                        _mm_storeu_ps(t + g, _mm_mul_ps(hsum4_ps(d[p][r][g], g + 1 < G ? d[p][r][g + 1] : zero,
                                                                 g + 2 < G ? d[p][r][g + 2] : zero,
                                                                 g + 3 < G ? d[p][r][g + 3] : zero),
                                                        _mm_set1_ps(kscale[i + p])));
                    int seen = j >= lo[r] && j <= pos[r];
                    for (int g = 0; g < G; g++) sc[r][g][i + p] = seen ? t[g] : -INFINITY;
                }
            }
        }
        /* Online softmax: the chunk's 16 scores of each row and head as two 8-lane halves. */
        float alpha[RUN][MAX_G];
        for (int r = 0; r < NQ; r++) {
            int active = c >= lo[r] / CHUNK && c <= pos[r] / CHUNK;
            for (int g = 0; g < G; g++) {
                if (!active) {
                    alpha[r][g] = 1.0f;
                    _mm256_store_ps(w[r][g], _mm256_setzero_ps());
                    _mm256_store_ps(w[r][g] + 8, _mm256_setzero_ps());
                    continue;
                }
                __m256 s0 = _mm256_load_ps(sc[r][g]), s1 = _mm256_load_ps(sc[r][g] + 8);
                float m_new = fmaxf(m[r][g], hmax_ps(_mm256_max_ps(s0, s1)));
                __m256 mv = _mm256_set1_ps(m_new);
                alpha[r][g] = _mm256_cvtss_f32(exp256_ps(_mm256_set1_ps(m[r][g] - m_new)));
                __m256 p0 = exp256_ps(_mm256_sub_ps(s0, mv)), p1 = exp256_ps(_mm256_sub_ps(s1, mv));
                __m256 zero = _mm256_setzero_ps();
                float sum = _mm_cvtss_f32(hsum4_ps(_mm256_add_ps(p0, p1), zero, zero, zero));
                l[r][g] = fmaf(l[r][g], alpha[r][g], sum);
                m[r][g] = m_new;
                _mm256_store_ps(w[r][g], _mm256_mul_ps(p0, _mm256_load_ps(vscale)));
                _mm256_store_ps(w[r][g] + 8, _mm256_mul_ps(p1, _mm256_load_ps(vscale + 8)));
            }
        }
        /* Values: 8 dimensions of every row and head at a time, the chunk's keys in order. */
        for (int64_t dd = 0; dd < D; dd += 8) {
            __m256 a[RUN][MAX_G];
            for (int r = 0; r < NQ; r++)
                for (int g = 0; g < G; g++)
                    a[r][g] = _mm256_mul_ps(_mm256_load_ps(acc[r] + g * D + dd), _mm256_set1_ps(alpha[r][g]));
            for (int i = 0; i < CHUNK; i++) {
                if (!vp[i]) continue;
                __m256 vf = widen(vp[i] + dd);
                for (int r = 0; r < NQ; r++)
                    for (int g = 0; g < G; g++) a[r][g] = _mm256_fmadd_ps(_mm256_set1_ps(w[r][g][i]), vf, a[r][g]);
            }
            for (int r = 0; r < NQ; r++)
                for (int g = 0; g < G; g++) _mm256_store_ps(acc[r] + g * D + dd, a[r][g]);
        }
    }
    for (int r = 0; r < NQ; r++)
        for (int g = 0; g < G; g++) {
            __m256 lv = _mm256_set1_ps(l[r][g]);
            for (int64_t dd = 0; dd < D; dd += 8)
                _mm256_storeu_ps(out + r * out_stride + g * D + dd, _mm256_div_ps(_mm256_load_ps(acc[r] + g * D + dd), lv));
        }
}

/* Parts to split each KV head's G query heads into, as in paged_attention.c (a head's bits never depend on the
   heads beside it). */
static int64_t head_parts(int64_t items, int64_t G, int nthreads) {
    int64_t parts = 1;
    while (items * parts < nthreads && G % (parts * 2) == 0) parts *= 2;
    return parts;
}

/* q, out: f32[T, Hq, D]; k/v cache: int8[NB, BS, Hkv, D]; k/v scale: f32[NB, BS, Hkv];
   block_tables: int32[S, bt_stride]; query_start_loc: int32[S + 1]; seq_lens: int32[S]; window 0 = none.
   row_seq: int32[T], the sequence of each query row. Needs Hq / Hkv <= MAX_G, D % 16 == 0, D <= MAX_D
   (as paged_attention.c; 8 would do here). */
AVX2 void paged_attention_i8(const float *q, const int8_t *kc, const int8_t *vc, const float *ks, const float *vs,
                             const int32_t *block_tables, int64_t bt_stride, const int32_t *query_start_loc,
                             const int32_t *seq_lens, const int32_t *row_seq, int64_t T, int64_t Hq, int64_t Hkv,
                             int64_t D, int64_t BS, float sm_scale, int64_t window, float *out, int nthreads) {
    const int64_t G = Hq / Hkv, parts = head_parts(T * Hkv, G, nthreads), Gp = G / parts;
    /* Work items: runs of RUN rows of one sequence from its first row on, then a single row for the rest, each
       for one part of a KV head's query heads; an item is named by its first row, and the other rows of a run
       have nothing to do. */
    #pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1)
    for (int64_t item = 0; item < T * Hkv * parts; item++) {
        int64_t part = item % parts, t = item / parts / Hkv, h = item / parts % Hkv, s = row_seq[t];
        int64_t q_len = query_start_loc[s + 1] - query_start_loc[s], offset = t - query_start_loc[s];
        int64_t in_runs = q_len / RUN * RUN;
        if (offset < in_runs && offset % RUN != 0) continue;
        int64_t position = seq_lens[s] - q_len + offset;
        const float *qp = q + (t * Hq + h * G + part * Gp) * D;
        float *op = out + (t * Hq + h * G + part * Gp) * D;
        const int32_t *table = block_tables + s * bt_stride;
        const int64_t qs = Hq * D;
        const int run = offset < in_runs;
        if (Gp == 4 && run)  /* Gemma 3 */
            attend_rows(RUN, 4, qp, qs, kc, vc, ks, vs, table, position, window, h, Hkv, D, BS, sm_scale, op, qs);
        else if (Gp == 4)
            attend_rows(1, 4, qp, qs, kc, vc, ks, vs, table, position, window, h, Hkv, D, BS, sm_scale, op, qs);
        else if (Gp == 2 && !run)  /* Gemma 3's decode of one sequence, its heads in two parts */
            attend_rows(1, 2, qp, qs, kc, vc, ks, vs, table, position, window, h, Hkv, D, BS, sm_scale, op, qs);
        else if (Gp == 3 && run)  /* SmolLM2 */
            attend_rows(RUN, 3, qp, qs, kc, vc, ks, vs, table, position, window, h, Hkv, D, BS, sm_scale, op, qs);
        else if (Gp == 3)
            attend_rows(1, 3, qp, qs, kc, vc, ks, vs, table, position, window, h, Hkv, D, BS, sm_scale, op, qs);
        else if (run)
            attend_rows(RUN, (int)Gp, qp, qs, kc, vc, ks, vs, table, position, window, h, Hkv, D, BS, sm_scale, op, qs);
        else
            attend_rows(1, (int)Gp, qp, qs, kc, vc, ks, vs, table, position, window, h, Hkv, D, BS, sm_scale, op, qs);
    }
}
