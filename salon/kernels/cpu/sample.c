/* Sampling rows of logits with temperature, top-k and top-p on the CPU, without sorting the vocabulary:
 * the semantics of salon/engine/sampler.py (its PyTorch path is the reference).
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
 * cut falls; only that bin's tokens are sorted. Masses are float64 sums in a fixed order. Top-p looks first among
 * the tokens of the TOP_BINS highest bins (top_p_in_top_bins): where its cut falls there, as it does on a chat
 * model's rows, the kept tokens are all among them and neither the mass histogram nor the walk visits the rest. A
 * row that keeps every token (no top-k, top_p 1) needs no bins: its e and block masses come in one pass
 * (exp_and_masses; the same sums as the walk's, so the same token).
 *
 * The vector passes over the vocabulary (max and min, exp and bins, gathering a bin's tokens, the masses of
 * blocks of 16 tokens) are written once in sample.h and come in two builds, each a section below that defines
 * the vector layer and includes it: AVX-512 (sample_rows_avx512, exp_ps) and AVX2 + FMA (sample_rows_avx2,
 * exp256_ps). They give the same bits (exp256_ps is exp_ps lane for lane, and a block's mass is summed in the
 * same tree), so both draw the same tokens. The rest is scalar and shared.
 * salon/kernels/cpu/sample.py calls the best build the CPU has.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "simd_math.h"

#define AVX512 __attribute__((target("avx512f,avx512bw")))
#define NBINS 1024
#define SUBHIST 4
/* Top-p looks first among the tokens of this many highest bins, when they are at most TOP_TOKENS. */
#define TOP_BINS 64
#define TOP_TOKENS 2048
/* 0 (bench/sample_full_histogram.c, bench.sampler's baseline): neither that first look nor the plain temperature
   path without bins; every row through the bins, the mass histogram and the walk. */
#ifndef SAMPLE_SHORT_PATHS
#define SAMPLE_SHORT_PATHS 1
#endif


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

/* The vector passes of one build (sample.h writes them once; sample_simd_avx512 and sample_simd_avx2). */
typedef struct {
    /* x: f32[V] -> e = exp(x - max(x)), bins = the bin of each x among NBINS equal bins over [min, max]. */
    void (*exp_and_bins)(const float *x, int64_t V, float *e, uint16_t *bins);
    /* Tokens whose bin is lo_bin <= bin <= hi_bin, appended to out[n..] in vocabulary order; the new count. */
    int64_t (*gather_bins)(const float *x, const uint16_t *bins, int64_t V, int lo_bin, int hi_bin, Entry *out,
                           int64_t n);
    /* block[b] = the float64 mass of the tokens of block b (tokens [16 b, 16 b + 16)) with bin > cut, for
       b < nb; returns their sum, in block order. */
    double (*block_masses)(const float *e, const uint16_t *bins, int64_t nb, int cut, double *block);
    /* x: f32[V] -> e = exp(x - max(x)) and block[b] = the mass of block b's tokens (all of them: block_masses'
       with no cut), for b < V / 16; returns their sum, in block order. */
    double (*exp_and_masses)(const float *x, int64_t V, float *e, double *block);
} Simd;

/* The scalar steps the vector passes end with (the last V % 16 or V % 8 tokens). */
static inline void min_max_scalar(const float *x, int64_t i, int64_t V, float *m, float *lo) {
    for (; i < V; i++) { *m = x[i] > *m ? x[i] : *m; *lo = x[i] < *lo ? x[i] : *lo; }
}

static inline uint16_t bin_of(float x, float lo, float scale) {
    int b = (int)((x - lo) * scale);
    return (uint16_t)(b < 0 ? 0 : (b >= NBINS ? NBINS - 1 : b));
}

/* ---- AVX-512: 16 lanes ---- */

AVX512 static inline __m512 sv_set1_avx512(float x) { return _mm512_set1_ps(x); }
AVX512 static inline __m512 sv_loadu_avx512(const float *p) { return _mm512_loadu_ps(p); }
AVX512 static inline void sv_storeu_avx512(float *p, __m512 v) { _mm512_storeu_ps(p, v); }
AVX512 static inline __m512 sv_max_avx512(__m512 a, __m512 b) { return _mm512_max_ps(a, b); }
AVX512 static inline __m512 sv_min_avx512(__m512 a, __m512 b) { return _mm512_min_ps(a, b); }
AVX512 static inline __m512 sv_sub_avx512(__m512 a, __m512 b) { return _mm512_sub_ps(a, b); }
AVX512 static inline __m512 sv_mul_avx512(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
AVX512 static inline __m512 sv_exp_avx512(__m512 v) { return exp_ps(v); }
AVX512 static inline float sv_first_avx512(__m512 v) { return _mm512_cvtss_f32(v); }
AVX512 static inline float sv_reduce_max_avx512(__m512 v) { return _mm512_reduce_max_ps(v); }
AVX512 static inline float sv_reduce_min_avx512(__m512 v) { return _mm512_reduce_min_ps(v); }
AVX512 static inline __m512i sv_izero_avx512(void) { return _mm512_setzero_si512(); }
AVX512 static inline __m512i sv_iset1_avx512(int x) { return _mm512_set1_epi32(x); }
AVX512 static inline __m512i sv_imax_avx512(__m512i a, __m512i b) { return _mm512_max_epi32(a, b); }
AVX512 static inline __m512i sv_imin_avx512(__m512i a, __m512i b) { return _mm512_min_epi32(a, b); }
AVX512 static inline __m512i sv_cvtt_avx512(__m512 v) { return _mm512_cvttps_epi32(v); }
AVX512 static inline void sv_store_bins_avx512(uint16_t *bins, __m512i b) {
    _mm256_storeu_si256((__m256i *)bins, _mm512_cvtepi32_epi16(b));
}

AVX512 static inline unsigned sv_hits16_avx512(const uint16_t *bins, int lo_bin, int hi_bin) {
    __m512i b = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)bins));
    return _mm512_cmpge_epi32_mask(b, _mm512_set1_epi32(lo_bin))
           & _mm512_cmple_epi32_mask(b, _mm512_set1_epi32(hi_bin));
}

/* The 16 values as float64, v[j] + v[j + 8], then _mm512_reduce_add_pd's halving tree. */
AVX512 static inline double sv_tree_avx512(__m512 v) {
    __m512d s = _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(v)),
                              _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
    return _mm512_reduce_add_pd(s);
}
AVX512 static inline double sv_block_mass_avx512(const float *e, const uint16_t *bins, int64_t i, int cut) {
    __m512i b = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(bins + i)));
    __mmask16 keep = _mm512_cmpgt_epi32_mask(b, _mm512_set1_epi32(cut));
    return sv_tree_avx512(_mm512_maskz_mov_ps(keep, _mm512_loadu_ps(e + i)));
}
AVX512 static inline double sv_block_sum_avx512(const float *e, int64_t i) {
    return sv_tree_avx512(_mm512_loadu_ps(e + i));
}

#define S_ISA avx512
#define S_TARGET AVX512
#define S_LANES 16
#define S_VEC __m512
#define S_IVEC __m512i
#include "sample.h"

/* ---- AVX2 + FMA (the file's baseline flags): 8 lanes ---- */

static inline __m256 sv_set1_avx2(float x) { return _mm256_set1_ps(x); }
static inline __m256 sv_loadu_avx2(const float *p) { return _mm256_loadu_ps(p); }
static inline void sv_storeu_avx2(float *p, __m256 v) { _mm256_storeu_ps(p, v); }
static inline __m256 sv_max_avx2(__m256 a, __m256 b) { return _mm256_max_ps(a, b); }
static inline __m256 sv_min_avx2(__m256 a, __m256 b) { return _mm256_min_ps(a, b); }
static inline __m256 sv_sub_avx2(__m256 a, __m256 b) { return _mm256_sub_ps(a, b); }
static inline __m256 sv_mul_avx2(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
static inline __m256 sv_exp_avx2(__m256 v) { return exp256_ps(v); }
static inline float sv_first_avx2(__m256 v) { return _mm256_cvtss_f32(v); }
static inline float sv_reduce_max_avx2(__m256 v) {
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    return _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
}
static inline float sv_reduce_min_avx2(__m256 v) {
    __m128 n4 = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    n4 = _mm_min_ps(n4, _mm_movehl_ps(n4, n4));
    return _mm_cvtss_f32(_mm_min_ss(n4, _mm_movehdup_ps(n4)));
}
static inline __m256i sv_izero_avx2(void) { return _mm256_setzero_si256(); }
static inline __m256i sv_iset1_avx2(int x) { return _mm256_set1_epi32(x); }
static inline __m256i sv_imax_avx2(__m256i a, __m256i b) { return _mm256_max_epi32(a, b); }
static inline __m256i sv_imin_avx2(__m256i a, __m256i b) { return _mm256_min_epi32(a, b); }
static inline __m256i sv_cvtt_avx2(__m256 v) { return _mm256_cvttps_epi32(v); }
static inline void sv_store_bins_avx2(uint16_t *bins, __m256i b) {
    _mm_storeu_si128((__m128i *)bins, _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
}

/* bins hold 0..NBINS, so they compare as signed 16-bit words; the words' masks packed to bytes give one bit per
   token, in order. */
static inline unsigned sv_hits16_avx2(const uint16_t *bins, int lo_bin, int hi_bin) {
    const __m256i below = _mm256_set1_epi16((int16_t)(lo_bin - 1)), above = _mm256_set1_epi16((int16_t)(hi_bin + 1));
    __m256i b = _mm256_loadu_si256((const __m256i *)bins);
    __m256i in = _mm256_and_si256(_mm256_cmpgt_epi16(b, below), _mm256_cmpgt_epi16(above, b));
    return (unsigned)_mm_movemask_epi8(_mm_packs_epi16(_mm256_castsi256_si128(in), _mm256_extracti128_si256(in, 1)));
}

/* sv_block_mass_avx512's sum, step for step: s[j] = v[j] + v[j + 8] (j < 8) as float64, t[j] = s[j] + s[j + 4],
   then t[0] + t[2] plus t[1] + t[3]. */
static inline double sv_tree_avx2(__m256 a, __m256 b) {
    __m256d s_lo = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(a)),
                                 _mm256_cvtps_pd(_mm256_castps256_ps128(b)));   /* s[0..3] */
    __m256d s_hi = _mm256_add_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)),
                                 _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1)));  /* s[4..7] */
    __m256d t = _mm256_add_pd(s_hi, s_lo);
    __m128d t2 = _mm_add_pd(_mm256_extractf128_pd(t, 1), _mm256_castpd256_pd128(t));
    return _mm_cvtsd_f64(t2) + _mm_cvtsd_f64(_mm_unpackhi_pd(t2, t2));
}
static inline double sv_block_mass_avx2(const float *e, const uint16_t *bins, int64_t i, int cut) {
    __m256i keep = _mm256_cmpgt_epi16(_mm256_loadu_si256((const __m256i *)(bins + i)), _mm256_set1_epi16((int16_t)cut));
    return sv_tree_avx2(_mm256_and_ps(_mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(keep))),
                                      _mm256_loadu_ps(e + i)),
                        _mm256_and_ps(_mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(keep, 1))),
                                      _mm256_loadu_ps(e + i + 8)));
}
static inline double sv_block_sum_avx2(const float *e, int64_t i) {
    return sv_tree_avx2(_mm256_loadu_ps(e + i), _mm256_loadu_ps(e + i + 8));
}

#define S_ISA avx2
#define S_TARGET
#define S_LANES 8
#define S_VEC __m256
#define S_IVEC __m256i
#include "sample.h"

/* ---- shared ---- */

/* The token at which the running mass of the kept tokens ({bin > cut}, or every token where bins is NULL), in
   vocabulary order, exceeds u * (their mass). block[b] holds the mass of block b's kept tokens (tokens [16 b,
   16 b + 16), b < V / 16) and blocks_total their sum, so the walk skips to the block where the target falls. */
static int64_t walk_blocks(const float *e, const uint16_t *bins, int64_t V, int cut, double u, const double *block,
                           double blocks_total) {
    const int64_t nb = V / 16;
    double total = blocks_total;
    for (int64_t i = nb * 16; i < V; i++)
        if (!bins || bins[i] > cut) total += e[i];
    const double target = u * total;
    double run = 0.0;
    int64_t i = 0;
    for (int64_t b = 0; b < nb && run + block[b] <= target; b++, i += 16) run += block[b];
    for (; i < V; i++)
        if ((!bins || bins[i] > cut) && (run += e[i]) > target) return i;
    for (i = V - 1; i > 0 && bins && bins[i] <= cut; i--) {}  /* rounding left none: the last kept token */
    return i;
}

/* walk_blocks over the tokens with bin > cut, their block masses taken first (into `block`). */
static int64_t walk(const Simd *simd, const float *e, const uint16_t *bins, int64_t V, int cut, double u,
                    double *block) {
    return walk_blocks(e, bins, V, cut, u, block, simd->block_masses(e, bins, V / 16, cut, block));
}

/* The first token of `kept` (n entries in vocabulary order) at which the running mass exceeds u * total. */
static int64_t walk_ordered(const Entry *kept, int64_t n, const float *e, double u) {
    double total = 0.0, run = 0.0;
    for (int64_t j = 0; j < n; j++) total += e[kept[j].id];
    const double target = u * total;
    for (int64_t j = 0; j < n; j++) {
        run += e[kept[j].id];
        if (run > target) return kept[j].id;
    }
    return kept[n - 1].id;
}

/* walk_ordered over `kept` in any order (sorted into vocabulary order first). */
static int64_t walk_list(Entry *kept, int64_t n, const float *e, double u) {
    qsort(kept, n, sizeof(Entry), id_order);
    return walk_ordered(kept, n, e, u);
}

/* Top-p where the cut falls among the TOP_BINS highest bins and they hold at most TOP_TOKENS tokens (a chat model's
   row, unless it is flat): the row's mass from the blocks of 16, the tokens of those bins gathered (in vocabulary
   order), their bins' masses from the top down to the one where the prefix reaches top_p * total, the cut bin's
   tokens in rank order while the prefix is short of it (the crossing token included), then the draw among the kept
   tokens alone, in vocabulary order (walk_ordered) -- the kept set of the full histogram's path, without its pass over
   every token or the walk's. -1 where the cut is not there (the caller takes the full path). */
static int64_t top_p_in_top_bins(const Simd *simd, const float *x, const float *e, uint16_t *bins, Entry *entries,
                                 double *block, int64_t V, double top_p, double u) {
    double total = simd->block_masses(e, bins, V / 16, -1, block);
    for (int64_t i = V / 16 * 16; i < V; i++) total += e[i];
    const double goal = top_p * total;
    const int base = NBINS - TOP_BINS;
    const int64_t n = simd->gather_bins(x, bins, V, base, NBINS - 1, entries, 0);
    if (n > TOP_TOKENS) return -1;
    double bin_mass[TOP_BINS] = {0};
    for (int64_t j = 0; j < n; j++) bin_mass[bins[entries[j].id] - base] += e[entries[j].id];
    double run = 0.0;
    int cut = NBINS - 1;
    while (cut > base && run + bin_mass[cut - base] < goal) run += bin_mass[cut-- - base];
    if (!(run + bin_mass[cut - base] >= goal)) return -1;
    /* The cut bin's tokens after the others, in rank order; those kept are marked with a bin above every real one. */
    Entry in_cut[TOP_TOKENS];
    int64_t c = 0;
    for (int64_t j = 0; j < n; j++)
        if (bins[entries[j].id] == cut) in_cut[c++] = entries[j];
    qsort(in_cut, c, sizeof(Entry), rank_order);
    for (int64_t j = 0; j < c && (j == 0 || run < goal); j++) {
        run += e[in_cut[j].id];
        bins[in_cut[j].id] = NBINS;
    }
    int64_t kept = 0;
    for (int64_t j = 0; j < n; j++)
        if (bins[entries[j].id] > cut) entries[kept++] = entries[j];
    return walk_ordered(entries, kept, e, u);  /* gathered in vocabulary order */
}

/* One row. x: f32[V] holding the row / temperature; e, bins, entries: scratch of V; block: of V / 16. */
static int64_t sample_row(const Simd *simd, const float *x, float *e, uint16_t *bins, Entry *entries, double *block,
                          int64_t V, int64_t top_k, double top_p, double u) {
    if (SAMPLE_SHORT_PATHS && top_p >= 1.0 && !(top_k > 0 && top_k < V))  /* every token kept: no bins */
        return walk_blocks(e, NULL, V, -1, u, block, simd->exp_and_masses(x, V, e, block));
    simd->exp_and_bins(x, V, e, bins);
    int64_t i;
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
        int64_t n = simd->gather_bins(x, bins, V, cut + 1, NBINS - 1, entries, 0);
        int64_t in_cut = simd->gather_bins(x, bins, V, cut, cut, entries + n, 0);
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
    if (top_p >= 1.0) return walk(simd, e, bins, V, -1, u, block);
    const int64_t top = SAMPLE_SHORT_PATHS ? top_p_in_top_bins(simd, x, e, bins, entries, block, V, top_p, u) : -1;
    if (top >= 0) return top;
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
    int64_t n = simd->gather_bins(x, bins, V, cut, cut, entries, 0);
    qsort(entries, n, sizeof(Entry), rank_order);
    /* Mark the cut bin's kept tokens with a bin above every real one; then kept == (bin > cut). */
    for (int64_t j = 0; j < n && (j == 0 || run < goal); j++) {
        run += e[entries[j].id];
        bins[entries[j].id] = NBINS;
    }
    return walk(simd, e, bins, V, cut, u, block);
}

/* A thread's scratch, kept from call to call and grown when a row is longer. Allocated per call it would cost
   more than the row: freed, its ~18 bytes a token (4.7 MB for 262,144 tokens) go back to the system, and the
   next call faults in fresh pages. */
typedef struct { float *x, *e; uint16_t *bins; Entry *entries; double *block; int64_t V; } Scratch;
static _Thread_local Scratch scratch;

/* This thread's scratch for rows of V tokens; NULL if it cannot be allocated. */
static Scratch *scratch_for(int64_t V) {
    Scratch *s = &scratch;
    if (s->V >= V) return s;
    free(s->x); free(s->e); free(s->bins); free(s->entries); free(s->block);
    s->x = malloc(sizeof(float) * V);
    s->e = malloc(sizeof(float) * V);
    s->bins = malloc(sizeof(uint16_t) * V);
    s->entries = malloc(sizeof(Entry) * V);
    s->block = malloc(sizeof(double) * (V / 16 + 1));
    s->V = s->x && s->e && s->bins && s->entries && s->block ? V : 0;
    return s->V ? s : NULL;
}

/* Rows rows[0..R) of logits f32[., V]; per sampled row: temperature > 0, top_k (0 = none), top_p (1 = none),
   u in [0, 1). */
static void sample_rows(const Simd *simd, const float *logits, const int64_t *rows, int64_t R, int64_t V,
                        const float *temperature, const int64_t *top_k, const double *top_p, const double *u,
                        int64_t *tokens, int nthreads) {
    /* no more threads than rows: a thread with no row would still be woken (and waited for) on a busy machine */
    const int team = R < nthreads ? (R > 0 ? (int)R : 1) : nthreads;
    #pragma omp parallel num_threads(team)
    {
        Scratch *s = scratch_for(V);
        #pragma omp for schedule(dynamic, 1)
        for (int64_t r = 0; r < R; r++) {
            if (!s) { tokens[r] = -1; continue; }  /* out of memory: the caller samples this row itself */
            const float *row = logits + rows[r] * V, t = temperature[r];
            float *x = s->x;
            for (int64_t i = 0; i < V; i++) x[i] = row[i] / t;
            tokens[r] = sample_row(simd, s->x, s->e, s->bins, s->entries, s->block, V, top_k[r], top_p[r], u[r]);
        }
    }
}

/* The entry points, one per build: the same arguments as sample_rows. */
void sample_rows_avx512(const float *logits, const int64_t *rows, int64_t R, int64_t V, const float *temperature,
                        const int64_t *top_k, const double *top_p, const double *u, int64_t *tokens, int nthreads) {
    sample_rows(&sample_simd_avx512, logits, rows, R, V, temperature, top_k, top_p, u, tokens, nthreads);
}

void sample_rows_avx2(const float *logits, const int64_t *rows, int64_t R, int64_t V, const float *temperature,
                      const int64_t *top_k, const double *top_p, const double *u, int64_t *tokens, int nthreads) {
    sample_rows(&sample_simd_avx2, logits, rows, R, V, temperature, top_k, top_p, u, tokens, nthreads);
}
