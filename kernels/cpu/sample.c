/* Sampling rows of logits with temperature, top-k and top-p on the CPU, without sorting the vocabulary:
 * the semantics of services/engine/sampler.py (its PyTorch path is the reference).
 *
 * Per row (rows run in parallel; a row's arithmetic is its own, so a token never depends on its batch):
 *   x = logits / temperature;  m = max(x);  e = exp(x - m)
 *   rank order: x descending, then token id ascending;
 *   top-k (0 < k < V): keep the first k tokens in rank order;
 *   top-p (< 1): of those (or of all), keep the shortest rank-order prefix whose mass reaches
 *     top_p * (their mass), the crossing token included;
 *   token = the first kept token, in vocabulary order, at which the running mass of kept tokens exceeds
 *     u * (kept mass); u in [0, 1) comes from the caller (one uniform per token from the request's
 *     generator). If rounding leaves none, the last kept token.
 * A histogram over NBINS equal logit bins, of counts (top-k) or of masses (top-p), finds the bin where a
 * cut falls; only that bin's tokens are sorted. exp is simd_math.h's exp_ps; masses are float64 sums in a
 * fixed order.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "simd_math.h"

#define AVX512 __attribute__((target("avx512f,avx512bw")))
#define NBINS 1024
#define SUBHIST 4


typedef struct { float x; int32_t id; } Entry;

static int rank_order(const void *a, const void *b) {
    const Entry *p = a, *q = b;
    if (p->x != q->x) return p->x < q->x ? 1 : -1;
    return (p->id > q->id) - (p->id < q->id);
}

static int id_order(const void *a, const void *b) {
    const Entry *p = a, *q = b;
    return (p->id > q->id) - (p->id < q->id);
}

/* Tokens whose bin is `lo_bin` <= bin <= `hi_bin`, appended to out in vocabulary order; returns the new count. */
AVX512 static int64_t gather_bins(const float *x, const uint16_t *bins, int64_t V, int lo_bin, int hi_bin, Entry *out,
                                  int64_t n) {
    const __m512i lo = _mm512_set1_epi32(lo_bin), hi = _mm512_set1_epi32(hi_bin), step = _mm512_set1_epi32(16);
    __m512i ids = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int64_t i = 0;
    for (; i + 16 <= V; i += 16, ids = _mm512_add_epi32(ids, step)) {
        __m512i b = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(bins + i)));
        __mmask16 hit = _mm512_cmpge_epi32_mask(b, lo) & _mm512_cmple_epi32_mask(b, hi);
        if (!hit) continue;
        float xs[16]; int32_t is[16];
        _mm512_mask_compressstoreu_ps(xs, hit, _mm512_loadu_ps(x + i));
        _mm512_mask_compressstoreu_epi32(is, hit, ids);
        for (int j = 0; j < __builtin_popcount(hit); j++) { out[n].x = xs[j]; out[n].id = is[j]; n++; }
    }
    for (; i < V; i++)
        if (bins[i] >= lo_bin && bins[i] <= hi_bin) { out[n].x = x[i]; out[n].id = (int32_t)i; n++; }
    return n;
}

/* Mass of the tokens with bin > cut, float64, in blocks of 16 in vocabulary order (the walk's own order). */
AVX512 static inline double block_mass(const float *e, const uint16_t *bins, int64_t i, int cut) {
    __m512i b = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(bins + i)));
    __m512 v = _mm512_maskz_mov_ps(_mm512_cmpgt_epi32_mask(b, _mm512_set1_epi32(cut)), _mm512_loadu_ps(e + i));
    __m512d s = _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(v)),
                              _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
    return _mm512_reduce_add_pd(s);
}

/* The token at which the running mass of {bin > cut}, in vocabulary order, exceeds u * (their mass). The
   masses of whole blocks of 16 (kept in `block`) let the walk skip to the block where the target falls. */
AVX512 static int64_t walk(const float *e, const uint16_t *bins, int64_t V, int cut, double u, double *block) {
    const int64_t nb = V / 16;
    double total = 0.0;
    for (int64_t b = 0; b < nb; b++) total += block[b] = block_mass(e, bins, b * 16, cut);
    for (int64_t i = nb * 16; i < V; i++)
        if (bins[i] > cut) total += e[i];
    const double target = u * total;
    double run = 0.0;
    int64_t i = 0;
    for (int64_t b = 0; b < nb && run + block[b] <= target; b++, i += 16) run += block[b];
    for (; i < V; i++)
        if (bins[i] > cut && (run += e[i]) > target) return i;
    for (i = V - 1; i > 0 && bins[i] <= cut; i--) {}  /* rounding left none: the last kept token */
    return i;
}

/* The first token of `kept` (n entries, any order) at which the running mass in vocabulary order exceeds u * total. */
static int64_t walk_list(Entry *kept, int64_t n, const float *e, double u) {
    qsort(kept, n, sizeof(Entry), id_order);
    double total = 0.0, run = 0.0;
    for (int64_t j = 0; j < n; j++) total += e[kept[j].id];
    const double target = u * total;
    for (int64_t j = 0; j < n; j++) {
        run += e[kept[j].id];
        if (run > target) return kept[j].id;
    }
    return kept[n - 1].id;
}

/* One row. x: f32[V] holding the row / temperature; e, bins, entries: scratch of V; block: of V / 16. */
AVX512 static int64_t sample_row(const float *x, float *e, uint16_t *bins, Entry *entries, double *block, int64_t V,
                                 int64_t top_k, double top_p, double u) {
    __m512 mv = _mm512_set1_ps(-INFINITY), nv = _mm512_set1_ps(INFINITY);
    int64_t i = 0;
    for (; i + 16 <= V; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        mv = _mm512_max_ps(mv, v);
        nv = _mm512_min_ps(nv, v);
    }
    float m = _mm512_reduce_max_ps(mv), lo = _mm512_reduce_min_ps(nv);
    for (; i < V; i++) { m = x[i] > m ? x[i] : m; lo = x[i] < lo ? x[i] : lo; }
    const float scale = m > lo ? NBINS / (m - lo) : 0.0f;
    const __m512 vm = _mm512_set1_ps(m), vlo = _mm512_set1_ps(lo), vscale = _mm512_set1_ps(scale);
    const __m512i top_bin = _mm512_set1_epi32(NBINS - 1), zero = _mm512_setzero_si512();
    for (i = 0; i + 16 <= V; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        _mm512_storeu_ps(e + i, exp_ps(_mm512_sub_ps(v, vm)));
        __m512i b = _mm512_cvttps_epi32(_mm512_mul_ps(_mm512_sub_ps(v, vlo), vscale));
        b = _mm512_min_epi32(_mm512_max_epi32(b, zero), top_bin);
        _mm256_storeu_si256((__m256i *)(bins + i), _mm512_cvtepi32_epi16(b));
    }
    for (; i < V; i++) {
        float t[16] = {0};
        t[0] = x[i] - m;
        e[i] = _mm512_cvtss_f32(exp_ps(_mm512_loadu_ps(t)));
        int b = (int)((x[i] - lo) * scale);
        bins[i] = (uint16_t)(b < 0 ? 0 : (b >= NBINS ? NBINS - 1 : b));
    }
    if (top_k > 0 && top_k < V) {
        /* The k first in rank order: whole bins from the top, then the start of the bin where k is reached. */
        int64_t count[SUBHIST][NBINS] = {{0}}, above = 0;
        for (i = 0; i + SUBHIST <= V; i += SUBHIST)
            for (int s = 0; s < SUBHIST; s++) count[s][bins[i + s]]++;
        for (; i < V; i++) count[0][bins[i]]++;
        int cut = NBINS - 1;
        for (;; cut--) {
            int64_t c = count[0][cut] + count[1][cut] + count[2][cut] + count[3][cut];
            if (above + c >= top_k) break;
            above += c;
        }
        int64_t n = gather_bins(x, bins, V, cut + 1, NBINS - 1, entries, 0);
        int64_t in_cut = gather_bins(x, bins, V, cut, cut, entries + n, 0);
        qsort(entries + n, in_cut, sizeof(Entry), rank_order);
        n = top_k;  /* above + (top_k - above) from the cut bin */
        if (top_p < 1.0) {
            qsort(entries, n, sizeof(Entry), rank_order);
            double total = 0.0, run = 0.0;
            for (int64_t j = 0; j < n; j++) total += e[entries[j].id];
            int64_t keep = 0;
            while (keep < n && (keep == 0 || run < top_p * total)) run += e[entries[keep++].id];
            n = keep;
        }
        return walk_list(entries, n, e, u);
    }
    if (top_p >= 1.0) return walk(e, bins, V, -1, u, block);
    /* Top-p: masses of the bins from the top down to the one where the prefix reaches top_p * total. */
    double mass[SUBHIST][NBINS] = {{0}};
    for (i = 0; i + SUBHIST <= V; i += SUBHIST)
        for (int s = 0; s < SUBHIST; s++) mass[s][bins[i + s]] += e[i + s];
    for (; i < V; i++) mass[0][bins[i]] += e[i];
    double total = 0.0, bin_mass[NBINS];
    for (int b = 0; b < NBINS; b++) {
        bin_mass[b] = mass[0][b] + mass[1][b] + mass[2][b] + mass[3][b];
        total += bin_mass[b];
    }
    const double goal = top_p * total;
    double run = 0.0;
    int cut = NBINS - 1;
    while (cut > 0 && run + bin_mass[cut] < goal) run += bin_mass[cut--];
    int64_t n = gather_bins(x, bins, V, cut, cut, entries, 0);
    qsort(entries, n, sizeof(Entry), rank_order);
    /* Mark the cut bin's kept tokens with a bin above every real one; then kept == (bin > cut). */
    for (int64_t j = 0; j < n && (j == 0 || run < goal); j++) {
        run += e[entries[j].id];
        bins[entries[j].id] = NBINS;
    }
    return walk(e, bins, V, cut, u, block);
}

/* Rows rows[0..R) of logits f32[., V]; per sampled row: temperature > 0, top_k (0 = none), top_p (1 = none),
   u in [0, 1). */
AVX512 void sample_rows(const float *logits, const int64_t *rows, int64_t R, int64_t V, const float *temperature,
                        const int64_t *top_k, const double *top_p, const double *u, int64_t *tokens, int nthreads) {
    #pragma omp parallel num_threads(nthreads)
    {
        float *x = malloc(sizeof(float) * V), *e = malloc(sizeof(float) * V);
        uint16_t *bins = malloc(sizeof(uint16_t) * V);
        Entry *entries = malloc(sizeof(Entry) * V);
        double *block = malloc(sizeof(double) * (V / 16 + 1));
        const int ok = x && e && bins && entries && block;
        #pragma omp for schedule(dynamic, 1)
        for (int64_t r = 0; r < R; r++) {
            if (!ok) { tokens[r] = -1; continue; }  /* out of memory: the caller samples this row itself */
            const float *row = logits + rows[r] * V;
            for (int64_t i = 0; i < V; i++) x[i] = row[i] / temperature[r];
            tokens[r] = sample_row(x, e, bins, entries, block, V, top_k[r], top_p[r], u[r]);
        }
        free(x); free(e); free(bins); free(entries); free(block);
    }
}
