/* Greedy decoding's top-1: the index of each row's largest value, torch.argmax's answer (the first index
 * on ties; a NaN counts as larger than any number, so a row holding one gives its first NaN).
 *
 * A range of a row in one pass of 8 float lanes: each lane keeps its largest value and the first index where it
 * saw it (a later value replaces it only when strictly larger), and whether it saw a NaN; then the lanes are
 * merged (largest value, smallest index among equals). A range with a NaN is scanned again for its first one.
 *
 * Large calls (the output projection's rows at batch 8: 8 MB of logits, most of it out of the cores' caches)
 * split every row into one contiguous range of columns per thread, the split of the GEMM that wrote them, and
 * merge the threads' answers in column order (largest value, the earlier range among equals; the first range
 * with a NaN gives its first NaN): the same answer as one pass. Small ones (a decode step of a few rows, read from
 * cache right after the GEMM wrote them) stay on the calling thread, where waking a second one costs more than
 * it saves.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

/* Floats per call from which the rows are split over the threads. */
#define ARGMAX_PARALLEL_FLOATS (1 << 20)

typedef struct {
    float best;
    int64_t index; /* of best, the first; -1 for an empty range */
    int64_t nan;   /* the first NaN's index, -1 where none */
} range_max;

static range_max argmax_range(const float *x, int64_t i0, int64_t i1) {
    range_max r = {-INFINITY, -1, -1};
    int64_t i = i0;
    int nan_seen = 0;
    if (i1 - i0 >= 8) {
        __m256 vbest = _mm256_loadu_ps(x + i0);
        __m256i vidx = _mm256_add_epi32(_mm256_set1_epi32((int32_t)i0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256i step = _mm256_set1_epi32(8);
        __m256i cur = _mm256_add_epi32(vidx, step);
        __m256 nan = _mm256_cmp_ps(vbest, vbest, _CMP_UNORD_Q);
        for (i = i0 + 8; i + 8 <= i1; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i);
            __m256 gt = _mm256_cmp_ps(v, vbest, _CMP_GT_OQ);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            vbest = _mm256_blendv_ps(vbest, v, gt);
            vidx = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(vidx), _mm256_castsi256_ps(cur), gt));
            cur = _mm256_add_epi32(cur, step);
        }
        nan_seen = _mm256_movemask_ps(nan) != 0;
        float lv[8];
        int32_t li[8];
        _mm256_storeu_ps(lv, vbest);
        _mm256_storeu_si256((__m256i *)li, vidx);
        r.best = lv[0];
        r.index = li[0];
        for (int l = 1; l < 8; l++)
            if (lv[l] > r.best || (lv[l] == r.best && li[l] < r.index)) { r.best = lv[l]; r.index = li[l]; }
    } else if (i1 > i0) {
        r.best = x[i0];
        r.index = i0;
        nan_seen = isnan(x[i0]);
        i = i0 + 1;
    }
    for (; i < i1; i++) {
        if (isnan(x[i])) nan_seen = 1;
        else if (x[i] > r.best) { r.best = x[i]; r.index = i; }
    }
    if (nan_seen)
        for (int64_t j = i0; j < i1; j++)
            if (isnan(x[j])) { r.nan = j; break; }
    return r;
}

/* The row's answer from its ranges' answers, in column order. */
static int64_t merge_ranges(const range_max *r, int n) {
    int64_t best_i = -1;
    float best = -INFINITY;
    for (int t = 0; t < n; t++) {
        if (r[t].nan >= 0) return r[t].nan;
        if (r[t].index >= 0 && (best_i < 0 || r[t].best > best)) { best = r[t].best; best_i = r[t].index; }
    }
    return best_i < 0 ? 0 : best_i;
}

/* x: float32[M, N] with row stride ldx (N < 2^31); out: int64[M]. */
void argmax_rows(const float *x, int64_t ldx, int64_t M, int64_t N, int64_t *out, int nthreads) {
    range_max *r = nthreads > 1 && M * N >= ARGMAX_PARALLEL_FLOATS && N >= 8 * (int64_t)nthreads
        ? malloc((size_t)(M * nthreads) * sizeof(range_max))
        : NULL;
    if (r == NULL) {  /* small (or no memory): one pass a row on the calling thread */
        for (int64_t m = 0; m < M; m++) {
            range_max one = argmax_range(x + m * ldx, 0, N);
            out[m] = merge_ranges(&one, 1);
        }
        return;
    }
    int used = 1;
    #pragma omp parallel num_threads(nthreads)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        if (t == 0) used = nt;
        for (int64_t m = 0; m < M; m++) r[m * nthreads + t] = argmax_range(x + m * ldx, N * t / nt, N * (t + 1) / nt);
    }
    for (int64_t m = 0; m < M; m++) out[m] = merge_ranges(r + m * nthreads, used);
    free(r);
}
