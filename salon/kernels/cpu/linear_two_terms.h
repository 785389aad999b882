/* The int8 Linear of grouped weights as one C function, bit for bit the composition of the kernels the
 * including file brings in (salon.kernels.linear_two_terms has the contract and the references). Two int8 terms:
 *
 *   h   = rmsnorm(x, norm_w)                          (optional; rmsnorm.c's norm_row)
 *   q, s = the two int8 terms of every row of h       (quantize.c's quantize_two_terms_rows arithmetic)
 *   y   = gemm(q, s, w)                               (the grouped W8A8 GEMM of 2M rows: both terms, the
 *                                                      weights read once)
 *   o   = y[m] + y[M + m]                             (the terms' sum, one rounding; on VNNI, up to SUM2_MAX_ROWS
 *                                                      rows with no post-norm, summed in the GEMM's registers as it
 *                                                      stores them, the residual added there too: gemm8_sum)
 *   out = residual + rmsnorm(o, post_w)               (optional post-norm, optional residual)
 *
 * One int16 term (salon.kernels.w16a8_grouped) instead: q, s = the row's int16 term, out = residual +
 * rmsnorm(gemm16(q, s, w), post_w).
 *
 * One int8 term per token and 32 channels (salon.kernels.w8a8_group32) instead: q, s = the row's int8 values and
 * its scale per group (quantize.c's quantize_group32_row), out = residual + rmsnorm(gemm32(q, s, w), post_w).
 *
 * The includer brings rmsnorm.c, quantize.c and one grouped GEMM (w8a8_grouped_vnni.c or w8a8_grouped.c, each with
 * its group32 entry point), and the int16 one (w16a8_grouped.c) where it runs that recipe, and passes the GEMMs'
 * entry points: linear_two_terms.c (VNNI: two terms, group32), linear_two_terms_avx2.c (AVX2: all three recipes),
 * and the decoder block (decoder_block.h, two terms and int16) through either. The same functions
 * run in the same order as when each is its own call, so every bit is the same; what is saved is the calls
 * between them (a decode step makes about ten per layer, each a few microseconds of Python, tensor allocation
 * and argument conversion). The row-wise work before and after the GEMM (norm, the terms, the terms' sum, the
 * post-norm and residual) splits its rows over the threads from ROWS_PARALLEL rows (a decode step of several
 * sequences, a prefill chunk: on the calling thread alone, the other threads waited for it, about a tenth of a
 * 64-token chunk's step) and runs on the calling thread below; the terms' sum of a large output (the output
 * projection's) splits its columns over the threads as the GEMM splits its weight rows. Each row's operations are
 * the same on whichever thread.
 *
 * fp-contract is off for every included file (rmsnorm.c's pragma comes first); none of quantize.c's
 * functions holds a product followed by a sum outside its own fp-contract=off section, so none changes.
 */
#ifndef SALON_LINEAR_TWO_TERMS_H
#define SALON_LINEAR_TWO_TERMS_H

#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

/* A grouped W8A8 GEMM's entry point (w8a8_grouped_vnni, w8a8_grouped_avx2): 0 when done, 1 when declined. */
typedef int (*grouped_gemm_fn)(const int8_t *a, int64_t lda, const int8_t *w, const float *w_scale, float *out,
                               int64_t ldo, const float *a_scale, int64_t M, int64_t N, int64_t K, int nthreads);
/* The grouped GEMM of int16 activations (w16a8_grouped_avx2), the same way. */
typedef int (*grouped_gemm16_fn)(const int16_t *a, int64_t lda, const int8_t *w, const float *w_scale, float *out,
                                 int64_t ldo, const float *a_scale, int64_t M, int64_t N, int64_t K, int nthreads);

/* The two int8 terms' GEMM that sums the terms as it stores them (w8a8_grouped_vnni_sum2): a holds 2H rows, out
   gets H rows, + residual where given. */
typedef int (*grouped_gemm_sum2_fn)(const int8_t *a, int64_t lda, const int8_t *w, const float *w_scale, float *out,
                                    int64_t ldo, const float *a_scale, int64_t H, int64_t N, int64_t K,
                                    const float *residual, int64_t sr, int nthreads);
/* Rows (H) up to which a Linear of two terms with no post-norm runs gemm8_sum (its 2H term rows in one tile). */
#define SUM2_MAX_ROWS 32

/* A Linear's activation recipe and its GEMM: two int8 terms through gemm8 (the others NULL; gemm8_sum, where the
   build has one, for the Linears without a post-norm of up to SUM2_MAX_ROWS rows), one int16 term through gemm16
   (salon.kernels.w16a8_grouped), or one int8 term per token and 32 channels through gemm32
   (salon.kernels.w8a8_group32: w8a8_group32_vnni, w8a8_group32_avx2; a_scale f32[M, K / 32]). */
typedef struct {
    grouped_gemm_fn gemm8;
    grouped_gemm16_fn gemm16;
    grouped_gemm_fn gemm32;
    grouped_gemm_sum2_fn gemm8_sum;
} linear_gemm;

/* out[i] = a[i] + b[i] for n floats (one rounding each). */
static void add_rows(const float *a, const float *b, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* Both terms' GEMM output above this size comes from a buffer the calling thread keeps (grown as needed, freed
   when the thread ends) instead of malloc: glibc maps every allocation above its 32 MB threshold afresh, and
   the output projection's at 17 or more rows (35 MB at 17, 134 MB at MAX_ROWS; on VNNI from SUM2_MAX_ROWS + 1, the
   rows below never having a buffer) paid a fresh mapping's page faults on every call, about 1 ms per MB in this
   kind of VM. Smaller ones malloc reuses by itself. */
#define KEPT_SCRATCH_BYTES ((size_t)32 << 20)

struct kept_scratch {
    void *p;
    size_t bytes;
};
static pthread_key_t kept_scratch_key;
static pthread_once_t kept_scratch_once = PTHREAD_ONCE_INIT;
static int kept_scratch_ready;

static void kept_scratch_free(void *v) {
    struct kept_scratch *s = v;
    free(s->p);
    free(s);
}

static void kept_scratch_init(void) { kept_scratch_ready = pthread_key_create(&kept_scratch_key, kept_scratch_free) == 0; }

/* The calling thread's kept buffer of at least `bytes` (its contents undefined), or NULL (no memory). */
static void *kept_scratch(size_t bytes) {
    pthread_once(&kept_scratch_once, kept_scratch_init);
    if (!kept_scratch_ready) return NULL;
    struct kept_scratch *s = pthread_getspecific(kept_scratch_key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s))) return NULL;
        if (pthread_setspecific(kept_scratch_key, s)) {
            free(s);
            return NULL;
        }
    }
    if (s->bytes < bytes) {
        free(s->p);
        s->p = malloc(bytes);
        s->bytes = s->p ? bytes : 0;
    }
    return s->p;
}

/* Row-wise work (norms, quantization, GLU, RoPE) of at least this many rows splits its rows over the threads; fewer
   rows stay on the calling thread, where a parallel region would cost about what it saves. On Gemma 3 270M's decode
   steps (2 threads, alternated rounds in one process), splitting from 4 rows rather than 16 gives 8 sequences a
   2.8% shorter step (medians 0.972 twice, ranges 0.91-1.04) and 4 sequences 1.7%; splitting 2 rows costs 2.4%. */
#define ROWS_PARALLEL 4
/* fn(ctx, m, thread) for the rows m of [0, M): split over the threads from ROWS_PARALLEL rows (thread: the
   caller's index in the team, for its own scratch), else in order on the calling thread, with no parallel region
   at all (a region that runs on one thread still costs its setup, about 0.35 us, some ten times a layer). */
typedef void (*row_fn)(void *ctx, int64_t m, int thread);
/* The threads for_rows gives M rows: the scratch rows a caller keeps for them. */
static inline int row_team(int64_t M, int nthreads) { return nthreads > 1 && M >= ROWS_PARALLEL ? nthreads : 1; }
static inline __attribute__((always_inline)) void for_rows(int64_t M, int nthreads, row_fn fn, void *ctx) {
    if (row_team(M, nthreads) > 1) {
        #pragma omp parallel for num_threads(nthreads) schedule(static)
        for (int64_t m = 0; m < M; m++) fn(ctx, m, omp_get_thread_num());
    } else {
        for (int64_t m = 0; m < M; m++) fn(ctx, m, 0);
    }
}
/* Calls whose output holds at least this many floats sum their terms on all the threads (the output
   projection: 262,144 columns a row); a layer's few thousand are summed on the calling thread, where a
   parallel region would cost more than it saves. */
#define SUM_TERMS_PARALLEL_FLOATS (1 << 16)
#define SUM_TERMS_CHUNK 4096

/* out[m] = y[m] + y[M + m] (+ residual[m]) for the M rows of N floats, in chunks of columns over the threads:
   each element's additions are the same, in the same order, on whichever thread. */
static void sum_terms(const float *y, int64_t M, int64_t N, const float *residual, int64_t sr, float *out,
                      int nthreads) {
    const int64_t per_row = (N + SUM_TERMS_CHUNK - 1) / SUM_TERMS_CHUNK;
    #pragma omp parallel for num_threads(nthreads) schedule(static) \
        if (nthreads > 1 && M * N >= SUM_TERMS_PARALLEL_FLOATS)
    for (int64_t c = 0; c < M * per_row; c++) {
        const int64_t m = c / per_row, n0 = (c % per_row) * SUM_TERMS_CHUNK;
        const int64_t n = N - n0 < SUM_TERMS_CHUNK ? N - n0 : SUM_TERMS_CHUNK;
        float *dst = out + m * N + n0;
        add_rows(y + m * N + n0, y + (M + m) * N + n0, dst, n);
        if (residual) add_rows(residual + m * sr + n0, dst, dst, n);
    }
}

/* One Linear's row-wise work, its rows split by for_rows (linear_with's arguments; r and o: a scratch row per
   thread, ks and N floats apart). */
typedef struct {
    const float *x, *norm_w, *post_w, *residual;
    int64_t M, K, sx, N, sr, ks;
    float inv_k, inv_n, eps_f, scale_floor;
    float *h, *r, *s, *y, *o, *out;
    void *q;
    int terms, group32;
} linear_rows;
/* Row m before the GEMM: the norm (norm_w), then the row's terms. */
static void linear_input_row(void *ctx, int64_t m, int thread) {
    const linear_rows *c = ctx;
    const int64_t K = c->K;
    const float *src = c->x + m * c->sx;
    if (c->norm_w) {
        norm_row(src, c->norm_w, c->h + m * K, K, c->inv_k, c->eps_f);
        src = c->h + m * K;
    }
    if (c->group32) {
        quantize_group32_row_avx2(src, K, (int8_t *)c->q + m * K, c->s + m * (K / GROUP), c->scale_floor);
    } else if (c->terms == 1) {
        c->s[m] = quantize_row_int16_avx2(src, K, (int16_t *)c->q + m * K, c->scale_floor);
    } else {
        int8_t *q8 = c->q;
        float *r = c->r + c->ks * thread;
        c->s[m] = quantize_row_avx2(src, K, q8 + m * K, c->scale_floor);
        residual_row(src, q8 + m * K, c->s[m], K, r);
        c->s[c->M + m] = quantize_row_avx2(r, K, q8 + (c->M + m) * K, c->scale_floor);
    }
}
/* Row m after the GEMM with a post-norm: the terms' sum (two terms), the norm, the residual. */
static void linear_post_row(void *ctx, int64_t m, int thread) {
    const linear_rows *c = ctx;
    const int64_t N = c->N;
    float *dst = c->out + m * N;
    const float *lin = c->y + m * N;
    if (c->terms == 2) {
        float *o = c->o + N * thread;
        add_rows(c->y + m * N, c->y + (c->M + m) * N, o, N);
        lin = o;
    }
    norm_row(lin, c->post_w, dst, N, c->inv_n, c->eps_f);
    if (c->residual) add_rows(c->residual + m * c->sr, dst, dst, N);
}
/* Row m after the GEMM of one term with a residual and no post-norm: out = residual + y. */
static void linear_residual_row(void *ctx, int64_t m, int thread) {
    const linear_rows *c = ctx;
    (void)thread;
    add_rows(c->residual + m * c->sr, c->y + m * c->N, c->out + m * c->N, c->N);
}
/* x f32[M, K] (row stride sx) -> out f32[M, N] contiguous; norm_w f32[K], post_w f32[N] and residual f32[M, N]
   (row stride sr) optional (NULL). Two int8 terms a row (g.gemm8: quantize.c's two-term arithmetic, both terms'
   2M rows through it, summed), one int16 term (quantize_row_int16_avx2, g.gemm16 on M rows, its output the
   Linear's: straight into out where no post-norm or residual follows) or one int8 term per 32 channels
   (quantize_group32_row_avx2, g.gemm32 on M rows, M x K / 32 scales, the same way). Returns 0 when done, 1 when
   nothing was computed (shapes the GEMM declines, no memory). */
static int linear_with(linear_gemm g, const float *x, int64_t M, int64_t K, int64_t sx, const float *norm_w,
                       double eps, const int8_t *w, const float *w_scale, int64_t N, const float *post_w,
                       const float *residual, int64_t sr, float *out, float scale_floor, int nthreads) {
    if (M < 1 || K < GROUP || K % GROUP || N < 1) return 1;
    const int group32 = g.gemm32 != NULL, terms = g.gemm16 || group32 ? 1 : 2;
    const int64_t ks = (K + 15) / 16 * 16;
    const int row_threads = row_team(M, nthreads);
    float *h = norm_w ? malloc((size_t)(M * K) * sizeof(float)) : NULL;
    float *r = terms == 2 ? aligned_alloc(64, (size_t)(ks * row_threads) * sizeof(float)) : NULL;
    void *q = malloc((size_t)(2 * M * K));  /* 2M int8 rows or M int16 rows: the same bytes */
    float *s = malloc((size_t)(group32 ? M * (K / GROUP) : terms * M) * sizeof(float));
    const int direct = terms == 1 && !post_w && !residual;  /* the GEMM writes out itself */
    const int summed = terms == 2 && !post_w && g.gemm8_sum && M <= SUM2_MAX_ROWS;  /* and sums its terms */
    const size_t y_bytes = direct || summed ? 0 : (size_t)(terms * M * N) * sizeof(float);
    const int y_kept = y_bytes > KEPT_SCRATCH_BYTES;
    float *y = direct ? out : summed ? NULL : y_kept ? kept_scratch(y_bytes) : malloc(y_bytes);
    float *o = post_w && terms == 2 ? malloc((size_t)(N * row_threads) * sizeof(float)) : NULL;
    int status = 1;
    if ((norm_w && !h) || (terms == 2 && !r) || !q || !s || (!y && !summed) || (post_w && terms == 2 && !o))
        goto done;
    linear_rows rows = {x, norm_w, post_w, residual, M, K, sx, N, sr, ks, (float)(1.0 / (double)K),
                        (float)(1.0 / (double)N), (float)eps, scale_floor, h, r, s, y, o, out, q, terms, group32};
    for_rows(M, nthreads, linear_input_row, &rows);
    if (group32) {
        if (g.gemm32(q, K, w, w_scale, y, N, s, M, N, K, nthreads)) goto done;
    } else if (terms == 1) {
        if (g.gemm16(q, K, w, w_scale, y, N, s, M, N, K, nthreads)) goto done;
    } else if (summed) {
        if (g.gemm8_sum(q, K, w, w_scale, out, N, s, M, N, K, residual, sr, nthreads)) goto done;
    } else {
        if (g.gemm8(q, K, w, w_scale, y, N, s, 2 * M, N, K, nthreads)) goto done;
    }
    if (!post_w && terms == 2) {
        if (!summed) sum_terms(y, M, N, residual, sr, out, nthreads);  /* gemm8_sum has summed them */
    } else if (post_w) {
        for_rows(M, nthreads, linear_post_row, &rows);
    } else if (residual) {  /* one term, a residual: out = residual + y (direct: out is y already) */
        for_rows(M, nthreads, linear_residual_row, &rows);
    }
    status = 0;
done:
    free(h);
    free(r);
    free(q);
    free(s);
    if (!direct && !y_kept) free(y);  /* NULL where summed */
    free(o);
    return status;
}

#endif
