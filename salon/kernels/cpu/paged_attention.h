/* Paged attention over the int8 KV cache: the semantics of salon.kernels.paged_attention.paged_attention_ref (see
 * that module for the addressing), written once against the vector layer of the including build:
 * paged_attention_avx512.c (16 lanes) and paged_attention_avx2.c (8 lanes). Each build equals the reference to
 * float rounding; their bits differ from each other's (other lane counts, other sums), and a machine always runs
 * the same one of the two.
 *
 * One work item is one KV head (its G = Hq / Hkv query heads together, so each key is read and widened once for
 * all of them) of PA_RUN consecutive rows of one sequence, which also share each widened key; rows left over,
 * and decodes, go one at a time. Where the items are fewer than the threads (a decode of one sequence with one
 * KV head), the query heads of a KV head are split between items (pa_head_parts). A query's arithmetic depends
 * only on its own query, position and keys -- never on the other rows of the call, on how they are grouped into
 * sequences or on the thread that runs it -- so a query gets the same bits alone or batched, in a prefill chunk
 * or as a decode:
 *
 *   keys are visited in chunks of 16 positions aligned to absolute positions (16c .. 16c + 15), from the chunk
 *   holding the first visible key (window start or 0) to the one holding the query itself; every such chunk has
 *   a visible key. Keys outside [lo, position] get score -inf and are never read.
 *   score = dot(q, k) * (k_scale * sm_scale); dot: PA_LANES-lane FMAs over D in order (lane i sums dimensions
 *   i, i + PA_LANES, ...), then each head's own vector summed in the build's fixed pattern (pa_hsum4);
 *   online softmax per chunk: m' = max(m, chunk max), alpha = exp(m - m'), p = exp(score - m'),
 *   l = fma(l, alpha, sum(p)) with sum(p) in the build's fixed pattern (pa_chunk_sum);
 *   acc = acc * alpha, then acc = fma(p_j * v_scale_j, v_j, acc) for each key j of the chunk in order;
 *   out = acc / l.
 *
 * exp is simd_math.h's (exp_ps, exp256_ps: the same polynomial lane for lane).
 *
 * The including build defines, before it includes this file:
 *   PA_TARGET    the function attribute that enables its instructions;
 *   PA_LANES     floats per vector (16 or 8); PA_RUN rows of one sequence per work item (its accumulators
 *                are what the build's vector registers hold: 4 rows x 4 heads of 16 lanes, 2 x 4 of 8);
 *   PA_PAIR_KEYS_MAX_G  the most heads of one row whose scores go two keys at a time (enough independent FMA
 *                chains without running out of registers);
 *   PA_CONSTANT_G3  1 to inline G = 3 (SmolLM2) with a constant group, 0 to run it through the generic path;
 *   pa_vec and its operations pa_zero, pa_set1, pa_load (aligned), pa_loadu, pa_store (aligned), pa_storeu,
 *   pa_mul, pa_sub, pa_div, pa_max, pa_fmadd, pa_first (lane 0), pa_exp;
 *   pa_widen (PA_LANES int8 -> floats), pa_hsum4 (four vectors' sums, each of its own vector only),
 *   pa_chunk_max and pa_chunk_sum (the largest and the sum of one chunk's 16 floats, given as
 *   PA_CHUNK / PA_LANES vectors).
 * Every product feeding an addition is an explicit fused multiply-add (pa_fmadd, fmaf), so the result does not
 * depend on what the compiler would contract.
 */
#ifndef SALON_PAGED_ATTENTION_H
#define SALON_PAGED_ATTENTION_H

#include <math.h>
#include <stdint.h>

#define PA_MAX_G 8
#define PA_MAX_D 512
#define PA_CHUNK 16
#define PA_VECS (PA_CHUNK / PA_LANES) /* vectors per chunk of floats */
#define PA_ALIGNED __attribute__((aligned(4 * PA_LANES)))

/* The limits above, read by the binding (salon/kernels/cpu/paged_attention.py) so they are written down once. */
const int64_t salon_paged_attention_max_group = PA_MAX_G;
const int64_t salon_paged_attention_max_head_dim = PA_MAX_D;

static const int8_t PA_ZERO_KEY[PA_MAX_D] PA_ALIGNED;

/* NQ (1 or PA_RUN) consecutive query rows of one sequence (positions pos0 .. pos0 + NQ - 1), KV head h with its
   G query heads, each key widened once for all of them. Per query and head the operations are those of the
   NQ = 1 path, in the same order: a key a row cannot see gets score -inf and weight 0 (fma(0, v, a) == a), and a
   chunk outside a row's range leaves that row untouched. Inlined with constant NQ (and constant G for the group
   sizes of the models served) so that the accumulators live in registers. */
PA_TARGET static inline __attribute__((always_inline)) void pa_attend_rows(
        const int NQ, const int G, const float *q, int64_t q_stride, const int8_t *kc, const int8_t *vc,
        const float *ks, const float *vs, const int32_t *table, int64_t pos0, int64_t window, int64_t h, int64_t Hkv,
        int64_t D, int64_t BS, float sm_scale, float *out, int64_t out_stride) {
    float acc[PA_RUN][PA_MAX_G * PA_MAX_D] PA_ALIGNED;
    float m[PA_RUN][PA_MAX_G], l[PA_RUN][PA_MAX_G];
    int64_t lo[PA_RUN], pos[PA_RUN];
    for (int r = 0; r < NQ; r++) {
        pos[r] = pos0 + r;
        lo[r] = window > 0 && pos[r] - window + 1 > 0 ? pos[r] - window + 1 : 0;
        for (int g = 0; g < G; g++) { m[r][g] = -INFINITY; l[r][g] = 0.0f; }
        for (int64_t i = 0; i < G * D; i++) acc[r][i] = 0.0f;
    }
    const int64_t row = Hkv * D;
    for (int64_t c = lo[0] / PA_CHUNK; c <= pos[NQ - 1] / PA_CHUNK; c++) {
        float sc[PA_RUN][PA_MAX_G][PA_CHUNK] PA_ALIGNED;
        float w[PA_RUN][PA_MAX_G][PA_CHUNK] PA_ALIGNED;
        const int8_t *kp[PA_CHUNK], *vp[PA_CHUNK];
        float kscale[PA_CHUNK] PA_ALIGNED, vscale[PA_CHUNK] PA_ALIGNED;
        const int64_t j0 = c * PA_CHUNK;
        for (int i = 0; i < PA_CHUNK; i++) {
            int64_t j = j0 + i;
            if (j < lo[0] || j > pos[NQ - 1]) { kp[i] = vp[i] = 0; kscale[i] = vscale[i] = 0.0f; continue; }
            int64_t slot = (int64_t)table[j / BS] * BS + j % BS;
            kp[i] = kc + slot * row + h * D;
            vp[i] = vc + slot * row + h * D;
            kscale[i] = ks[slot * Hkv + h] * sm_scale;
            vscale[i] = vs[slot * Hkv + h];
        }
        /* The next chunk's rows, fetched while this one is computed (long contexts stream from memory). */
        if (c < pos[NQ - 1] / PA_CHUNK) {
            int64_t j1 = j0 + PA_CHUNK;
            const int8_t *nk = kc + ((int64_t)table[j1 / BS] * BS + j1 % BS) * row + h * D;
            const int8_t *nv = vc + ((int64_t)table[j1 / BS] * BS + j1 % BS) * row + h * D;
            for (int i = 0; i < PA_CHUNK && (i == 0 || (j1 + i) % BS != 0); i++)  /* rows of j1's block */
                for (int64_t dd = 0; dd < D; dd += 64) {
                    _mm_prefetch((const char *)(nk + i * row + dd), _MM_HINT_T0);
                    _mm_prefetch((const char *)(nv + i * row + dd), _MM_HINT_T0);
                }
        }
        /* Scores: keys two at a time for one row of at most PA_PAIR_KEYS_MAX_G heads, else one. */
        const int KP = NQ == 1 && G <= PA_PAIR_KEYS_MAX_G ? 2 : 1;
        for (int i = 0; i < PA_CHUNK; i += KP) {
            pa_vec d[2][PA_RUN][PA_MAX_G];
            const int8_t *kk[2];
            int any = 0;
            for (int p = 0; p < KP; p++) {
                kk[p] = kp[i + p] ? kp[i + p] : PA_ZERO_KEY;
                any |= kp[i + p] != 0;
                for (int r = 0; r < NQ; r++)
                    for (int g = 0; g < G; g++) d[p][r][g] = pa_zero();
            }
            if (!any) {
                for (int p = 0; p < KP; p++)
                    for (int r = 0; r < NQ; r++)
                        for (int g = 0; g < G; g++) sc[r][g][i + p] = -INFINITY;
                continue;
            }
            for (int64_t dd = 0; dd < D; dd += PA_LANES) {
                for (int p = 0; p < KP; p++) {
                    pa_vec kf = pa_widen(kk[p] + dd);
                    for (int r = 0; r < NQ; r++)
                        for (int g = 0; g < G; g++)
                            d[p][r][g] = pa_fmadd(pa_loadu(q + r * q_stride + g * D + dd), kf, d[p][r][g]);
                }
            }
            for (int p = 0; p < KP; p++) {
                int64_t j = j0 + i + p;
                for (int r = 0; r < NQ; r++) {
                    float t[PA_MAX_G];
                    const pa_vec zero = pa_zero();
                    for (int g = 0; g < G; g += 4)  /* heads past G sum a zero vector, never stored */
                        _mm_storeu_ps(t + g, _mm_mul_ps(pa_hsum4(d[p][r][g], g + 1 < G ? d[p][r][g + 1] : zero,
                                                                 g + 2 < G ? d[p][r][g + 2] : zero,
                                                                 g + 3 < G ? d[p][r][g + 3] : zero),
                                                        _mm_set1_ps(kscale[i + p])));
                    int seen = j >= lo[r] && j <= pos[r];
                    for (int g = 0; g < G; g++) sc[r][g][i + p] = seen ? t[g] : -INFINITY;
                }
            }
        }
        /* Online softmax: the chunk's 16 scores of each row and head, PA_VECS vectors. */
        float alpha[PA_RUN][PA_MAX_G];
        for (int r = 0; r < NQ; r++) {
            int active = c >= lo[r] / PA_CHUNK && c <= pos[r] / PA_CHUNK;
            for (int g = 0; g < G; g++) {
                if (!active) {
                    alpha[r][g] = 1.0f;
                    for (int v = 0; v < PA_VECS; v++) pa_store(w[r][g] + v * PA_LANES, pa_zero());
                    continue;
                }
                pa_vec s[PA_VECS], pv[PA_VECS];
                for (int v = 0; v < PA_VECS; v++) s[v] = pa_load(sc[r][g] + v * PA_LANES);
                float m_new = fmaxf(m[r][g], pa_chunk_max(s));
                alpha[r][g] = pa_first(pa_exp(pa_set1(m[r][g] - m_new)));
                for (int v = 0; v < PA_VECS; v++) pv[v] = pa_exp(pa_sub(s[v], pa_set1(m_new)));
                l[r][g] = fmaf(l[r][g], alpha[r][g], pa_chunk_sum(pv));
                m[r][g] = m_new;
                for (int v = 0; v < PA_VECS; v++)
                    pa_store(w[r][g] + v * PA_LANES, pa_mul(pv[v], pa_load(vscale + v * PA_LANES)));
            }
        }
        /* Values: PA_LANES dimensions of every row and head at a time, the chunk's keys in order. */
        for (int64_t dd = 0; dd < D; dd += PA_LANES) {
            pa_vec a[PA_RUN][PA_MAX_G];
            for (int r = 0; r < NQ; r++)
                for (int g = 0; g < G; g++)
                    a[r][g] = pa_mul(pa_load(acc[r] + g * D + dd), pa_set1(alpha[r][g]));
            for (int i = 0; i < PA_CHUNK; i++) {
                if (!vp[i]) continue;
                pa_vec vf = pa_widen(vp[i] + dd);
                for (int r = 0; r < NQ; r++)
                    for (int g = 0; g < G; g++) a[r][g] = pa_fmadd(pa_set1(w[r][g][i]), vf, a[r][g]);
            }
            for (int r = 0; r < NQ; r++)
                for (int g = 0; g < G; g++) pa_store(acc[r] + g * D + dd, a[r][g]);
        }
    }
    for (int r = 0; r < NQ; r++)
        for (int g = 0; g < G; g++) {
            pa_vec lv = pa_set1(l[r][g]);
            for (int64_t dd = 0; dd < D; dd += PA_LANES)
                pa_storeu(out + r * out_stride + g * D + dd, pa_div(pa_load(acc[r] + g * D + dd), lv));
        }
}

/* Parts to split each KV head's G query heads into: 1, or while the work items are fewer than the threads
   (the decode of one sequence of an MQA model is one item) a power of two dividing G. A head's bits never
   depend on the heads beside it (its scores, softmax and sums are its own; pa_hsum4 sums each vector alone), so
   a split changes which thread computes a head and nothing else. */
static int64_t pa_head_parts(int64_t items, int64_t G, int nthreads) {
    int64_t parts = 1;
    while (items * parts < nthreads && G % (parts * 2) == 0) parts *= 2;
    return parts;
}

/* q, out: f32[T, Hq, D]; k/v cache: int8[NB, BS, Hkv, D]; k/v scale: f32[NB, BS, Hkv];
   block_tables: int32[S, bt_stride]; query_start_loc: int32[S + 1]; seq_lens: int32[S]; window 0 = none.
   row_seq: int32[T], the sequence of each query row. Needs Hq / Hkv <= PA_MAX_G, D % 16 == 0, D <= PA_MAX_D (one
   rule for every build). */
PA_TARGET void paged_attention_i8(const float *q, const int8_t *kc, const int8_t *vc, const float *ks, const float *vs,
                                  const int32_t *block_tables, int64_t bt_stride, const int32_t *query_start_loc,
                                  const int32_t *seq_lens, const int32_t *row_seq, int64_t T, int64_t Hq,
                                  int64_t Hkv, int64_t D, int64_t BS, float sm_scale, int64_t window, float *out,
                                  int nthreads) {
    const int64_t G = Hq / Hkv, parts = pa_head_parts(T * Hkv, G, nthreads), Gp = G / parts;
    /* Work items: runs of PA_RUN rows of one sequence from its first row on, then single rows for the rest, each
       for one part of a KV head's query heads; an item is named by its first row, and the other rows of a run
       have nothing to do. */
    #pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1)
    for (int64_t item = 0; item < T * Hkv * parts; item++) {
        int64_t part = item % parts, t = item / parts / Hkv, h = item / parts % Hkv, s = row_seq[t];
        int64_t q_len = query_start_loc[s + 1] - query_start_loc[s], offset = t - query_start_loc[s];
        int64_t in_runs = q_len / PA_RUN * PA_RUN;
        if (offset < in_runs && offset % PA_RUN != 0) continue;
        int64_t position = seq_lens[s] - q_len + offset;
        if (position < 0) {  /* a query before any key (a padded row: sequence length 0) sees nothing: zeros */
            for (int64_t i = 0; i < Gp * D; i++) out[(t * Hq + h * G + part * Gp) * D + i] = 0.0f;
            continue;
        }
        const float *qp = q + (t * Hq + h * G + part * Gp) * D;
        float *op = out + (t * Hq + h * G + part * Gp) * D;
        const int32_t *table = block_tables + s * bt_stride;
        const int64_t qs = Hq * D;
        const int run = offset < in_runs;
        if (Gp == 4 && run)  /* Gemma 3 */
            pa_attend_rows(PA_RUN, 4, qp, qs, kc, vc, ks, vs, table, position, window, h, Hkv, D, BS, sm_scale, op,
                           qs);
        else if (Gp == 4)
            pa_attend_rows(1, 4, qp, qs, kc, vc, ks, vs, table, position, window, h, Hkv, D, BS, sm_scale, op, qs);
        else if (Gp == 2 && !run)  /* Gemma 3's decode of one sequence, its heads in two parts */
            pa_attend_rows(1, 2, qp, qs, kc, vc, ks, vs, table, position, window, h, Hkv, D, BS, sm_scale, op, qs);
        else if (PA_CONSTANT_G3 && Gp == 3 && run)  /* SmolLM2 */
            pa_attend_rows(PA_RUN, 3, qp, qs, kc, vc, ks, vs, table, position, window, h, Hkv, D, BS, sm_scale, op,
                           qs);
        else if (PA_CONSTANT_G3 && Gp == 3)
            pa_attend_rows(1, 3, qp, qs, kc, vc, ks, vs, table, position, window, h, Hkv, D, BS, sm_scale, op, qs);
        else if (run)
            pa_attend_rows(PA_RUN, (int)Gp, qp, qs, kc, vc, ks, vs, table, position, window, h, Hkv, D, BS, sm_scale,
                           op, qs);
        else
            pa_attend_rows(1, (int)Gp, qp, qs, kc, vc, ks, vs, table, position, window, h, Hkv, D, BS, sm_scale, op,
                           qs);
    }
}

#endif
