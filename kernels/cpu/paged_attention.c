/* Paged attention over the int8 KV cache for CPUs with AVX-512; the semantics of
 * kernels.paged_attention.paged_attention_ref (see that module for the addressing).
 *
 * One work item is one query row and one KV head (its G = Hq / Hkv query heads together, so each key is
 * read and widened once for all of them). The item's arithmetic depends only on its own query, position
 * and keys -- never on the other rows of the call, on how they are grouped into sequences or on the thread
 * that runs it -- so a query gets the same bits alone or batched, in a prefill chunk or as a decode:
 *
 *   keys are visited in chunks of 16 positions aligned to absolute positions (16c .. 16c + 15), from the
 *   chunk holding the first visible key (window start or 0) to the one holding the query itself; every
 *   such chunk has a visible key. Keys outside [lo, position] get score -inf and are never read.
 *   score = dot(q, k) * (k_scale * sm_scale); dot: 16-lane FMAs over D in order, then a fixed reduction;
 *   online softmax per chunk: m' = max(m, chunk max), alpha = exp(m - m'), p = exp(score - m'),
 *   l = l * alpha + sum(p), acc = acc * alpha + sum_j (p_j * v_scale_j) * v_j in key order;
 *   out = acc / l.
 *
 * exp is a Cephes-style polynomial (relative error ~1e-7), the same code for every lane.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define AVX512 __attribute__((target("avx512f,avx512bw")))
#define MAX_G 8
#define MAX_D 512
#define CHUNK 16

AVX512 static inline __m512 exp_ps(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.0f), hi = _mm512_set1_ps(88.3762626647949f);
    __mmask16 tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);  /* -inf and exp(x) < 1.6e-38 give 0 */
    x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_mov_ps(~tiny, _mm512_scalef_ps(p, n));
}

AVX512 static inline __m512 widen(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* One query row t of sequence s at `position`, KV head h: out[t, h*G .. h*G+G-1, :]. */
AVX512 static void attend_one(const float *q, const int8_t *kc, const int8_t *vc, const float *ks, const float *vs,
                              const int32_t *table, int64_t position, int64_t lo, int64_t h, int64_t G,
                              int64_t Hkv, int64_t D, int64_t BS, float sm_scale, float *out) {
    float acc[MAX_G * MAX_D] __attribute__((aligned(64)));
    float m[MAX_G], l[MAX_G];
    for (int64_t g = 0; g < G; g++) { m[g] = -INFINITY; l[g] = 0.0f; }
    for (int64_t i = 0; i < G * D; i++) acc[i] = 0.0f;
    const int64_t row = Hkv * D;  /* elements between consecutive tokens of a block */
    for (int64_t c = lo / CHUNK; c <= position / CHUNK; c++) {
        float sc[MAX_G][CHUNK] __attribute__((aligned(64)));
        float w[MAX_G][CHUNK] __attribute__((aligned(64)));
        const int8_t *vrow[CHUNK];
        int64_t j0 = c * CHUNK;
        for (int64_t i = 0; i < CHUNK; i++) {
            int64_t j = j0 + i;
            if (j < lo || j > position) {
                for (int64_t g = 0; g < G; g++) sc[g][i] = -INFINITY;
                vrow[i] = 0;
                continue;
            }
            int64_t slot = (int64_t)table[j / BS] * BS + j % BS;
            const int8_t *kp = kc + slot * row + h * D;
            vrow[i] = vc + slot * row + h * D;
            __m512 d0 = _mm512_setzero_ps(), d1 = d0, d2 = d0, d3 = d0, d4 = d0, d5 = d0, d6 = d0, d7 = d0;
            for (int64_t d = 0; d < D; d += 16) {
                __m512 kf = widen(kp + d);
                const float *qd = q + d;
                d0 = _mm512_fmadd_ps(_mm512_loadu_ps(qd), kf, d0);
                if (G > 1) d1 = _mm512_fmadd_ps(_mm512_loadu_ps(qd + D), kf, d1);
                if (G > 2) d2 = _mm512_fmadd_ps(_mm512_loadu_ps(qd + 2 * D), kf, d2);
                if (G > 3) d3 = _mm512_fmadd_ps(_mm512_loadu_ps(qd + 3 * D), kf, d3);
                if (G > 4) d4 = _mm512_fmadd_ps(_mm512_loadu_ps(qd + 4 * D), kf, d4);
                if (G > 5) d5 = _mm512_fmadd_ps(_mm512_loadu_ps(qd + 5 * D), kf, d5);
                if (G > 6) d6 = _mm512_fmadd_ps(_mm512_loadu_ps(qd + 6 * D), kf, d6);
                if (G > 7) d7 = _mm512_fmadd_ps(_mm512_loadu_ps(qd + 7 * D), kf, d7);
            }
            float kscale = ks[slot * Hkv + h] * sm_scale;
            __m512 dv[MAX_G] = {d0, d1, d2, d3, d4, d5, d6, d7};
            for (int64_t g = 0; g < G; g++) sc[g][i] = _mm512_reduce_add_ps(dv[g]) * kscale;
        }
        float alpha[MAX_G];
        for (int64_t g = 0; g < G; g++) {
            __m512 s = _mm512_load_ps(sc[g]);
            float m_new = fmaxf(m[g], _mm512_reduce_max_ps(s));
            alpha[g] = _mm512_cvtss_f32(exp_ps(_mm512_set1_ps(m[g] - m_new)));
            __m512 p = exp_ps(_mm512_sub_ps(s, _mm512_set1_ps(m_new)));
            l[g] = l[g] * alpha[g] + _mm512_reduce_add_ps(p);
            m[g] = m_new;
            _mm512_store_ps(w[g], p);
        }
        for (int64_t i = 0; i < CHUNK; i++) {
            if (!vrow[i]) continue;
            int64_t j = j0 + i;
            float vscale = vs[((int64_t)table[j / BS] * BS + j % BS) * Hkv + h];
            for (int64_t g = 0; g < G; g++) w[g][i] *= vscale;
        }
        for (int64_t d = 0; d < D; d += 16) {
            __m512 a[MAX_G];
            for (int64_t g = 0; g < G; g++) a[g] = _mm512_mul_ps(_mm512_load_ps(acc + g * D + d), _mm512_set1_ps(alpha[g]));
            for (int64_t i = 0; i < CHUNK; i++) {
                if (!vrow[i]) continue;
                __m512 vf = widen(vrow[i] + d);
                for (int64_t g = 0; g < G; g++) a[g] = _mm512_fmadd_ps(_mm512_set1_ps(w[g][i]), vf, a[g]);
            }
            for (int64_t g = 0; g < G; g++) _mm512_store_ps(acc + g * D + d, a[g]);
        }
    }
    for (int64_t g = 0; g < G; g++) {
        __m512 inv_l = _mm512_set1_ps(l[g]);
        for (int64_t d = 0; d < D; d += 16)
            _mm512_storeu_ps(out + g * D + d, _mm512_div_ps(_mm512_load_ps(acc + g * D + d), inv_l));
    }
}

/* q, out: f32[T, Hq, D]; k/v cache: int8[NB, BS, Hkv, D]; k/v scale: f32[NB, BS, Hkv];
   block_tables: int32[S, bt_stride]; query_start_loc: int32[S + 1]; seq_lens: int32[S]; window 0 = none.
   row_seq: int32[T], the sequence of each query row. Needs Hq / Hkv <= MAX_G, D % 16 == 0, D <= MAX_D. */
AVX512 void paged_attention_i8(const float *q, const int8_t *kc, const int8_t *vc, const float *ks, const float *vs,
                               const int32_t *block_tables, int64_t bt_stride, const int32_t *query_start_loc,
                               const int32_t *seq_lens, const int32_t *row_seq, int64_t T, int64_t Hq, int64_t Hkv,
                               int64_t D, int64_t BS, float sm_scale, int64_t window, float *out, int nthreads) {
    const int64_t G = Hq / Hkv;
    #pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1)
    for (int64_t item = 0; item < T * Hkv; item++) {
        int64_t t = item / Hkv, h = item % Hkv, s = row_seq[t];
        int64_t q_len = query_start_loc[s + 1] - query_start_loc[s];
        int64_t position = seq_lens[s] - q_len + (t - query_start_loc[s]);
        int64_t lo = window > 0 && position - window + 1 > 0 ? position - window + 1 : 0;
        attend_one(q + (t * Hq + h * G) * D, kc, vc, ks, vs, block_tables + s * bt_stride, position, lo, h, G, Hkv, D,
                   BS, sm_scale, out + (t * Hq + h * G) * D);
    }
}
