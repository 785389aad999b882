/* Paged attention over the int8 KV cache for CPUs with AVX-512; the semantics of
 * salon.kernels.paged_attention.paged_attention_ref (see that module for the addressing).
 *
 * One work item is one KV head (its G = Hq / Hkv query heads together, so each key is read and widened once
 * for all of them) of 4 consecutive rows of one sequence, which also share each widened key; rows left over,
 * and decodes, go one at a time. Where the items are fewer than the threads (a decode of one sequence with one
 * KV head), the query heads of a KV head are split between items (head_parts). A query's arithmetic depends
 * only on its own query, position and keys -- never on the other rows of the call, on how they are grouped
 * into sequences or on the thread that runs it -- so a query gets the same bits alone or batched, in a
 * prefill chunk or as a decode:
 *
 *   keys are visited in chunks of 16 positions aligned to absolute positions (16c .. 16c + 15), from the
 *   chunk holding the first visible key (window start or 0) to the one holding the query itself; every
 *   such chunk has a visible key. Keys outside [lo, position] get score -inf and are never read.
 *   score = dot(q, k) * (k_scale * sm_scale); dot: 16-lane FMAs over D in order, then a fixed reduction
 *   of each head's own vector (hsum4_ps);
 *   online softmax per chunk: m' = max(m, chunk max), alpha = exp(m - m'), p = exp(score - m'),
 *   l = l * alpha + sum(p), acc = acc * alpha + sum_j (p_j * v_scale_j) * v_j in key order;
 *   out = acc / l.
 *
 * exp is simd_math.h's exp_ps.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "simd_math.h"

#define AVX512 __attribute__((target("avx512f,avx512bw")))
#define MAX_G 8
#define MAX_D 512
#define CHUNK 16

/* The limits above, read by the binding (salon/kernels/cpu/paged_attention.py) so they are written down once. */
const int64_t salon_paged_attention_max_group = MAX_G;
const int64_t salon_paged_attention_max_head_dim = MAX_D;

AVX512 static inline __m512 widen(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* Four int32 -> float sums, one per head: [sum(v0), sum(v1), sum(v2), sum(v3)]; each output sums only its own
   vector, in a fixed pattern. */
AVX512 static inline __m128 hsum4_ps(__m512 v0, __m512 v1, __m512 v2, __m512 v3) {
    __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(v0, v1), _mm512_unpackhi_ps(v0, v1));
    __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(v2, v3), _mm512_unpackhi_ps(v2, v3));
    __m512 u = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))));
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(u), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(u), 1)));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

static const int8_t ZERO_KEY[MAX_D] __attribute__((aligned(64)));

/* NQ consecutive query rows of one sequence (positions pos0 .. pos0 + NQ - 1), KV head h with its G query
   heads, each key widened once for all of them. Per query and head the operations are those of the NQ = 1
   path, in the same order: a key a row cannot see gets score -inf and weight 0 (fma(0, v, a) == a), and a
   chunk outside a row's range leaves that row untouched. Inlined with constant NQ (and G = 4, Gemma's MQA,
   also constant) so that the accumulators live in registers. */
AVX512 static inline __attribute__((always_inline)) void attend_rows(
        const int NQ, const int G, const float *q, int64_t q_stride, const int8_t *kc, const int8_t *vc,
        const float *ks, const float *vs, const int32_t *table, int64_t pos0, int64_t window, int64_t h, int64_t Hkv,
        int64_t D, int64_t BS, float sm_scale, float *out, int64_t out_stride) {
    float acc[4][MAX_G * MAX_D] __attribute__((aligned(64)));
    float m[4][MAX_G], l[4][MAX_G];
    int64_t lo[4], pos[4];
    for (int r = 0; r < NQ; r++) {
        pos[r] = pos0 + r;
        lo[r] = window > 0 && pos[r] - window + 1 > 0 ? pos[r] - window + 1 : 0;
        for (int g = 0; g < G; g++) { m[r][g] = -INFINITY; l[r][g] = 0.0f; }
        for (int64_t i = 0; i < G * D; i++) acc[r][i] = 0.0f;
    }
    const int64_t row = Hkv * D;
    for (int64_t c = lo[0] / CHUNK; c <= pos[NQ - 1] / CHUNK; c++) {
        float sc[4][MAX_G][CHUNK] __attribute__((aligned(64)));
        float w[4][MAX_G][CHUNK] __attribute__((aligned(64)));
        const int8_t *kp[CHUNK], *vp[CHUNK];
        float kscale[CHUNK], vscale[CHUNK];
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
        /* Scores: keys two at a time when one row (8 independent FMA chains), else one (4 x NQ chains). */
        const int KP = NQ == 1 ? 2 : 1;
        for (int i = 0; i < CHUNK; i += KP) {
            __m512 d[2][4][MAX_G];
            const int8_t *kk[2];
            int any = 0;
            for (int p = 0; p < KP; p++) {
                kk[p] = kp[i + p] ? kp[i + p] : ZERO_KEY;
                any |= kp[i + p] != 0;
                for (int r = 0; r < NQ; r++)
                    for (int g = 0; g < G; g++) d[p][r][g] = _mm512_setzero_ps();
            }
            if (!any) {
                for (int p = 0; p < KP; p++)
                    for (int r = 0; r < NQ; r++)
                        for (int g = 0; g < G; g++) sc[r][g][i + p] = -INFINITY;
                continue;
            }
            for (int64_t dd = 0; dd < D; dd += 16) {
                for (int p = 0; p < KP; p++) {
                    __m512 kf = widen(kk[p] + dd);
                    for (int r = 0; r < NQ; r++)
                        for (int g = 0; g < G; g++)
                            d[p][r][g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + r * q_stride + g * D + dd), kf, d[p][r][g]);
                }
            }
            for (int p = 0; p < KP; p++) {
                int64_t j = j0 + i + p;
                for (int r = 0; r < NQ; r++) {
                    float t[MAX_G];
                    const __m512 zero = _mm512_setzero_ps();
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
        float alpha[4][MAX_G];
        for (int r = 0; r < NQ; r++) {
            int active = c >= lo[r] / CHUNK && c <= pos[r] / CHUNK;
            for (int g = 0; g < G; g++) {
                if (!active) { alpha[r][g] = 1.0f; _mm512_store_ps(w[r][g], _mm512_setzero_ps()); continue; }
                __m512 sv = _mm512_load_ps(sc[r][g]);
                float m_new = fmaxf(m[r][g], _mm512_reduce_max_ps(sv));
                alpha[r][g] = _mm512_cvtss_f32(exp_ps(_mm512_set1_ps(m[r][g] - m_new)));
                __m512 pv = exp_ps(_mm512_sub_ps(sv, _mm512_set1_ps(m_new)));
                l[r][g] = l[r][g] * alpha[r][g] + _mm512_reduce_add_ps(pv);
                m[r][g] = m_new;
                _mm512_store_ps(w[r][g], _mm512_mul_ps(pv, _mm512_loadu_ps(vscale)));
            }
        }
        for (int64_t dd = 0; dd < D; dd += 16) {
            __m512 a[4][MAX_G];
            for (int r = 0; r < NQ; r++)
                for (int g = 0; g < G; g++)
                    a[r][g] = _mm512_mul_ps(_mm512_load_ps(acc[r] + g * D + dd), _mm512_set1_ps(alpha[r][g]));
            for (int i = 0; i < CHUNK; i++) {
                if (!vp[i]) continue;
                __m512 vf = widen(vp[i] + dd);
                for (int r = 0; r < NQ; r++)
                    for (int g = 0; g < G; g++) a[r][g] = _mm512_fmadd_ps(_mm512_set1_ps(w[r][g][i]), vf, a[r][g]);
            }
            for (int r = 0; r < NQ; r++)
                for (int g = 0; g < G; g++) _mm512_store_ps(acc[r] + g * D + dd, a[r][g]);
        }
    }
    for (int r = 0; r < NQ; r++)
        for (int g = 0; g < G; g++) {
            __m512 lv = _mm512_set1_ps(l[r][g]);
            for (int64_t dd = 0; dd < D; dd += 16)
                _mm512_storeu_ps(out + r * out_stride + g * D + dd, _mm512_div_ps(_mm512_load_ps(acc[r] + g * D + dd), lv));
        }
}

/* Parts to split each KV head's G query heads into: 1, or while the work items are fewer than the threads
   (the decode of one sequence of an MQA model is one item) a power of two dividing G. A head's bits never
   depend on the heads beside it (its scores, softmax and sums are its own; hsum4_ps sums each vector alone), so
   a split changes which thread computes a head and nothing else. */
static int64_t head_parts(int64_t items, int64_t G, int nthreads) {
    int64_t parts = 1;
    while (items * parts < nthreads && G % (parts * 2) == 0) parts *= 2;
    return parts;
}

/* q, out: f32[T, Hq, D]; k/v cache: int8[NB, BS, Hkv, D]; k/v scale: f32[NB, BS, Hkv];
   block_tables: int32[S, bt_stride]; query_start_loc: int32[S + 1]; seq_lens: int32[S]; window 0 = none.
   row_seq: int32[T], the sequence of each query row. Needs Hq / Hkv <= MAX_G, D % 16 == 0, D <= MAX_D. */
AVX512 void paged_attention_i8(const float *q, const int8_t *kc, const int8_t *vc, const float *ks, const float *vs,
                               const int32_t *block_tables, int64_t bt_stride, const int32_t *query_start_loc,
                               const int32_t *seq_lens, const int32_t *row_seq, int64_t T, int64_t Hq, int64_t Hkv,
                               int64_t D, int64_t BS, float sm_scale, int64_t window, float *out, int nthreads) {
    const int64_t G = Hq / Hkv, parts = head_parts(T * Hkv, G, nthreads), Gp = G / parts;
    /* Work items: runs of 4 rows of one sequence from its first row on, then single rows for the rest, each
       for one part of a KV head's query heads; an item is named by its first row, and the other rows of a run
       have nothing to do. */
    #pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1)
    for (int64_t item = 0; item < T * Hkv * parts; item++) {
        int64_t part = item % parts, t = item / parts / Hkv, h = item / parts % Hkv, s = row_seq[t];
        int64_t q_len = query_start_loc[s + 1] - query_start_loc[s], offset = t - query_start_loc[s];
        int64_t in_runs = q_len / 4 * 4;
        if (offset < in_runs && offset % 4 != 0) continue;
        int64_t position = seq_lens[s] - q_len + offset;
        const float *qp = q + (t * Hq + h * G + part * Gp) * D;
        float *op = out + (t * Hq + h * G + part * Gp) * D;
        const int32_t *table = block_tables + s * bt_stride;
        const int64_t qs = Hq * D;
        const int run = offset < in_runs;
        if (Gp == 4 && run)  /* Gemma 3 */
            attend_rows(4, 4, qp, qs, kc, vc, ks, vs, table, position, window, h, Hkv, D, BS, sm_scale, op, qs);
        else if (Gp == 4)
            attend_rows(1, 4, qp, qs, kc, vc, ks, vs, table, position, window, h, Hkv, D, BS, sm_scale, op, qs);
        else if (Gp == 2 && !run)  /* Gemma 3's decode of one sequence, its heads in two parts */
            attend_rows(1, 2, qp, qs, kc, vc, ks, vs, table, position, window, h, Hkv, D, BS, sm_scale, op, qs);
        else if (run)
            attend_rows(4, (int)Gp, qp, qs, kc, vc, ks, vs, table, position, window, h, Hkv, D, BS, sm_scale, op, qs);
        else
            attend_rows(1, (int)Gp, qp, qs, kc, vc, ks, vs, table, position, window, h, Hkv, D, BS, sm_scale, op, qs);
    }
}
