/* test_lowrank.c — the low-rank path (src/opt/lowrank.h, the MATMUL_LR
 * op):
 *  - the rank rules on spectra with a known answer (energy fractions of
 *    geometric and flat spectra, the parameter cap, the budget rank);
 *  - the SVD: a matrix of exact rank 5 is rebuilt from its rank-5 factors
 *    (NMSE <= 1e-10: double SVD, factors stored fp32), its singular values
 *    past 5 vanish (<= 1e-5 of the first); the activation-aware form's
 *    output error on the calibration data equals the energy of the dropped
 *    whitened singular values (relative 1e-6, the identity SVD-LLM rests
 *    on), and with X^T X = I it is the plain SVD (values within 1e-9);
 *  - the factorized matmul against the dense matrix B A (nstf_cpu_matmul_lr
 *    vs nstf_cpu_matmul on the reconstruction, both fp32 paths: NMSE <=
 *    1e-7, the project's fp32 bound);
 *  - SmolLM2 (skipped, 77, without the model or without LAPACKE), fast:
 *    layer 0's attn_q/k/v/output and ffn_gate (so each of the forward's
 *    three scratch buffers is used), activation-aware (calibrated on
 *    another sentence), at full
 *    rank gives the unmodified model's logits (fp32 activations: mean KL
 *    <= 1e-6, top-1 100%); a file factorized at 30% fewer parameters (fp32
 *    factors) reloads, its logits equal the in-memory factorization's bit
 *    for bit, and it generates text. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/mem.h"
#include "model/session.h"
#include "ops/ops.h"
#include "opt/evaluate.h"
#include "opt/lowrank.h"
#include "test_util.h"

#define MODEL NSTF_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf"

static void rules(void) {
    double geo[10], flat[8];
    for (int i = 0; i < 10; i++) geo[i] = pow(0.5, i); /* energies 1, 1/4, 1/16, ...: sum 4/3 (1 - 4^-10) */
    for (int i = 0; i < 8; i++) flat[i] = 2.0;
    /* geometric: the first value holds 3/4 of the energy, two 15/16, three 63/64 */
    CHECK(nstf_lowrank_rank_energy(geo, 10, 0.74) == 1, "geo 0.74: %lld", (long long)nstf_lowrank_rank_energy(geo, 10, 0.74));
    CHECK(nstf_lowrank_rank_energy(geo, 10, 0.76) == 2, "geo 0.76");
    CHECK(nstf_lowrank_rank_energy(geo, 10, 0.95) == 3, "geo 0.95");
    CHECK(nstf_lowrank_rank_energy(geo, 10, 1.0) == 10, "geo 1.0");
    /* flat: r / 8 of the energy */
    CHECK(nstf_lowrank_rank_energy(flat, 8, 0.5) == 4, "flat 0.5");
    CHECK(nstf_lowrank_rank_energy(flat, 8, 0.51) == 5, "flat 0.51");
    /* budget: r (n_in + n_out) <= keep n_in n_out */
    CHECK(nstf_lowrank_rank_budget(576, 576, 1.0) == 288, "budget 576x576");
    CHECK(nstf_lowrank_rank_budget(576, 1536, 0.5) == 209, "budget 576x1536 at 0.5: %lld",
          (long long)nstf_lowrank_rank_budget(576, 1536, 0.5));
    CHECK(nstf_lowrank_rank_budget(576, 192, 0.7) == 100, "budget 576x192 at 0.7");
    /* the cap: a 16x16 matrix saves 10% up to r = floor(0.9 * 256 / 32) = 7 */
    double s16[16];
    for (int i = 0; i < 16; i++) s16[i] = 1.0; /* flat: keep 0.5 -> r 8 > 7: dense */
    CHECK(nstf_lowrank_rank_rule(s16, 16, 16, 16, 0.5, 0.1) == 0, "cap: flat spectrum stays dense");
    CHECK(nstf_lowrank_rank_rule(s16, 16, 16, 16, 0.4, 0.1) == 7, "cap: r 7 fits");
    unsigned t = 0;
    CHECK(nstf_lowrank_parse_targets("attn_q,ffn_down", &t) && t == (NSTF_LR_Q | NSTF_LR_DOWN), "targets");
    CHECK(!nstf_lowrank_parse_targets("attn_x", &t), "unknown target refused");
}

static double nmse_ff(const float *a, const float *b, int64_t n) {
    double e = 0, r = 0;
    for (int64_t i = 0; i < n; i++) e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), r += (double)b[i] * b[i];
    return r > 0 ? e / r : e;
}

/* sum over the rows of X of ||x W^T - (x A^T) B^T||^2, in double */
static double output_error(const float *w, const float *fa, const float *fb, const float *x, int64_t N, int64_t n_in,
                           int64_t n_out, int64_t r) {
    double err = 0;
    for (int64_t t = 0; t < N; t++)
        for (int64_t o = 0; o < n_out; o++) {
            double y = 0, yr = 0;
            for (int64_t i = 0; i < n_in; i++) y += (double)w[o * n_in + i] * x[t * n_in + i];
            for (int64_t k = 0; k < r; k++) {
                double ax = 0;
                for (int64_t i = 0; i < n_in; i++) ax += (double)fa[k * n_in + i] * x[t * n_in + i];
                yr += (double)fb[o * r + k] * ax;
            }
            err += (y - yr) * (y - yr);
        }
    return err;
}

static void svd_checks(void) {
    test_rng rng = {12345};
    const int64_t n_in = 48, n_out = 40, r0 = 5, N = 200;
    float *b0 = malloc(n_out * r0 * 4), *a0 = malloc(r0 * n_in * 4), *w = malloc(n_out * n_in * 4);
    for (int64_t i = 0; i < n_out * r0; i++) b0[i] = rng_normal(&rng);
    for (int64_t i = 0; i < r0 * n_in; i++) a0[i] = rng_normal(&rng);
    for (int64_t o = 0; o < n_out; o++)
        for (int64_t i = 0; i < n_in; i++) {
            double s = 0;
            for (int64_t k = 0; k < r0; k++) s += (double)b0[o * r0 + k] * a0[k * n_in + i];
            w[o * n_in + i] = (float)s;
        }
    nstf_svd s;
    CHECK(nstf_svd_compute(w, n_in, n_out, NULL, &s) == NSTF_OK, "svd: %s", nstf_last_error());
    float *fa = malloc(n_out * n_in * 4), *fb = malloc(n_out * n_in * 4), *rec = malloc(n_out * n_in * 4);
    nstf_svd_factors(&s, r0, fa, fb);
    for (int64_t o = 0; o < n_out; o++)
        for (int64_t i = 0; i < n_in; i++) {
            double acc = 0;
            for (int64_t k = 0; k < r0; k++) acc += (double)fb[o * r0 + k] * fa[k * n_in + i];
            rec[o * n_in + i] = (float)acc;
        }
    const double e = nmse_ff(rec, w, n_out * n_in);
    CHECK(e <= 1e-10, "rank-5 matrix rebuilt from its rank-5 factors: NMSE %.3g (tolerance 1e-10)", e);
    CHECK(s.s[r0] <= 1e-5 * s.s[0], "singular value 6 of a rank-5 matrix: %.3g of %.3g", s.s[r0], s.s[0]);

    /* a full-rank matrix and calibration X [N, n_in] with unequal scales */
    for (int64_t i = 0; i < n_out * n_in; i++) w[i] = rng_normal(&rng);
    float *x = malloc(N * n_in * 4);
    for (int64_t t = 0; t < N; t++)
        for (int64_t i = 0; i < n_in; i++) x[t * n_in + i] = rng_normal(&rng) * (float)(1 + (i % 7));
    double *g = calloc((size_t)(n_in * n_in), 8), *eye = calloc((size_t)(n_in * n_in), 8);
    for (int64_t t = 0; t < N; t++)
        for (int64_t i = 0; i < n_in; i++)
            for (int64_t j = 0; j < n_in; j++) g[i * n_in + j] += (double)x[t * n_in + i] * x[t * n_in + j];
    for (int64_t i = 0; i < n_in; i++) eye[i * n_in + i] = 1;
    nstf_svd sw, si;
    CHECK(nstf_svd_compute(w, n_in, n_out, g, &sw) == NSTF_OK, "whitened svd: %s", nstf_last_error());
    CHECK(nstf_svd_compute(w, n_in, n_out, eye, &si) == NSTF_OK, "identity-whitened svd: %s", nstf_last_error());
    nstf_svd sp;
    CHECK(nstf_svd_compute(w, n_in, n_out, NULL, &sp) == NSTF_OK, "plain svd");
    double dmax = 0;
    for (int64_t i = 0; i < sp.k; i++) dmax = fmax(dmax, fabs(si.s[i] - sp.s[i]) / sp.s[0]);
    CHECK(dmax <= 1e-9, "X^T X = I: whitened singular values equal the plain ones (max rel. diff %.3g)", dmax);
    const int64_t r = 12;
    nstf_svd_factors(&sw, r, fa, fb);
    const double err = output_error(w, fa, fb, x, N, n_in, n_out, r);
    double dropped = 0;
    for (int64_t i = r; i < sw.k; i++) dropped += sw.s[i] * sw.s[i];
    CHECK(fabs(err - dropped) <= 1e-6 * dropped, "whitened: output error %.9g = dropped energy %.9g", err, dropped);
    /* ... and it is smaller than the plain SVD's output error at the same rank */
    nstf_svd_factors(&sp, r, fa, fb);
    const double err_p = output_error(w, fa, fb, x, N, n_in, n_out, r);
    CHECK(err < err_p, "whitened output error %.6g below the plain SVD's %.6g", err, err_p);
    nstf_svd_free(&s), nstf_svd_free(&sw), nstf_svd_free(&si), nstf_svd_free(&sp);
    free(b0), free(a0), free(w), free(fa), free(fb), free(rec), free(x), free(g), free(eye);
}

static void matmul_vs_dense(void) {
    test_rng rng = {777};
    const int64_t n_in = 160, rank = 37, n_out = 72, n = 9;
    float *a = malloc(rank * n_in * 4), *b = malloc(n_out * rank * 4), *w = malloc(n_out * n_in * 4);
    float *x = malloc(n * n_in * 4), *tmp = malloc(n * rank * 4), *y = malloc(n * n_out * 4), *yd = malloc(n * n_out * 4);
    for (int64_t i = 0; i < rank * n_in; i++) a[i] = rng_normal(&rng);
    for (int64_t i = 0; i < n_out * rank; i++) b[i] = rng_normal(&rng);
    for (int64_t i = 0; i < n * n_in; i++) x[i] = rng_normal(&rng);
    for (int64_t o = 0; o < n_out; o++)
        for (int64_t i = 0; i < n_in; i++) {
            double s = 0;
            for (int64_t k = 0; k < rank; k++) s += (double)b[o * rank + k] * a[k * n_in + i];
            w[o * n_in + i] = (float)s;
        }
    nstf_pool *pool = NULL;
    CHECK(nstf_pool_create(2, &pool) == NSTF_OK, "pool");
    nstf_cpu cpu = {.pool = pool};
    CHECK(nstf_cpu_reserve(&cpu, n, n_in) == NSTF_OK, "reserve");
    nstf_cpu_matmul_lr(&cpu, NSTF_TYPE_F32, a, NSTF_TYPE_F32, b, x, tmp, y, n, n_in, rank, n_out);
    nstf_cpu_matmul(&cpu, NSTF_TYPE_F32, w, x, yd, n, n_in, n_out);
    const double e = nmse_ff(y, yd, n * n_out);
    printf("  factorized matmul vs dense B A: NMSE %.3g\n", e);
    CHECK(e <= 1e-7, "factorized matmul vs the dense reconstruction: NMSE %.3g (tolerance 1e-7)", e);
    nstf_cpu_release(&cpu);
    nstf_pool_free(pool);
    free(a), free(b), free(w), free(x), free(tmp), free(y), free(yd);
}

static double mean_kl(const float *lp, const float *ref, int n, int nv, double *top1) {
    nstf_eval_score sc;
    int32_t *ids = calloc((size_t)n, sizeof *ids);
    nstf_eval_scores(lp, ref, ids, n, nv, 0, &sc);
    free(ids);
    *top1 = sc.top1;
    return sc.kl;
}

static void smollm2(void) {
    nstf_session_params sp = nstf_session_default_params();
    sp.device = "cpu";
    sp.precise = true;
    sp.n_threads = 2;
    sp.n_ctx = 64;
    nstf_session *s = NULL;
    CHECK(nstf_session_open(MODEL, &sp, &s) == NSTF_OK, "open: %s", nstf_last_error());
    if (!s) return;
    const char *text = "The quick brown fox jumps over the lazy dog. Low-rank factors of a weight matrix keep "
                       "most of what it does to the activations it sees.";
    const char *calib = "Calibration runs the model over a text and keeps the second moment of every matrix's "
                        "inputs, so that the factors are fitted to the activations the matrix really meets.";
    int32_t *ids = NULL, *cal = NULL;
    int n = 0, n_cal = 0;
    CHECK(nstf_eval_tokenize(s, text, 24, &ids, &n) == NSTF_OK, "tokenize: %s", nstf_last_error());
    CHECK(nstf_eval_tokenize(s, calib, 32, &cal, &n_cal) == NSTF_OK, "tokenize: %s", nstf_last_error());
    const int nv = nstf_session_n_vocab(s);
    float *ref = malloc((size_t)n * nv * 4), *lp = malloc((size_t)n * nv * 4), *lp2 = malloc((size_t)n * nv * 4);
    CHECK(nstf_eval_logprobs(s, ids, n, ref) == NSTF_OK, "reference: %s", nstf_last_error());
    nstf_lowrank_params p = {0};
    p.layer0 = 0, p.layer1 = 1;
    p.targets = NSTF_LR_Q | NSTF_LR_K | NSTF_LR_V | NSTF_LR_O | NSTF_LR_GATE;
    p.whiten = true;
    nstf_lowrank *lr = NULL;
    CHECK(nstf_lowrank_create(s, cal, n_cal, &p, &lr) == NSTF_OK, "decompose: %s", nstf_last_error());
    if (!lr) goto out;
    for (int i = 0; i < nstf_lowrank_count(lr); i++) {
        int64_t ni, no;
        nstf_lowrank_shape(lr, i, &ni, &no);
        CHECK(nstf_lowrank_set(lr, i, ni < no ? ni : no) == NSTF_OK, "full rank: %s", nstf_last_error());
    }
    double top1 = 0, kl = 0;
    CHECK(nstf_eval_logprobs(s, ids, n, lp) == NSTF_OK, "full rank: %s", nstf_last_error());
    kl = mean_kl(lp, ref, n, nv, &top1);
    printf("  SmolLM2, layer 0 at full rank: mean KL %.3g, top-1 %.3f\n", kl, top1);
    CHECK(kl <= 1e-6 && top1 == 1.0, "full-rank factors: mean KL %.3g (tolerance 1e-6), top-1 %.3f", kl, top1);
    /* 30% fewer parameters in layer 0, written with fp32 factors */
    p.alloc = NSTF_LR_UNIFORM;
    p.reduce = 0.3;
    uint64_t before = 0, after = 0;
    CHECK(nstf_lowrank_apply(lr, &p, &before, &after) == NSTF_OK, "apply: %s", nstf_last_error());
    CHECK(after <= 0.7 * (double)before && after > 0.69 * (double)before, "30%% fewer: %llu of %llu",
          (unsigned long long)after, (unsigned long long)before);
    {
        /* ranks rounded down to multiples of 32 (so that both factors
         * quantize): each a multiple, none above the rule's, the reduction
         * at least the one asked; then the plain ranks again */
        int64_t r0[16] = {0};
        const int nm = nstf_lowrank_count(lr) < 16 ? nstf_lowrank_count(lr) : 16;
        for (int i = 0; i < nm; i++) r0[i] = nstf_lowrank_rank_of(lr, i, NULL);
        nstf_lowrank_params pm = p;
        pm.rank_multiple = 32;
        uint64_t b2 = 0, a2 = 0;
        CHECK(nstf_lowrank_apply(lr, &pm, &b2, &a2) == NSTF_OK, "apply (multiples of 32): %s", nstf_last_error());
        for (int i = 0; i < nm; i++) {
            const char *name = NULL;
            const int64_t r = nstf_lowrank_rank_of(lr, i, &name);
            CHECK(r >= 32 && r % 32 == 0 && r <= r0[i], "%s: rank %lld rounded from %lld", name ? name : "?",
                  (long long)r, (long long)r0[i]);
        }
        CHECK(b2 == before && a2 <= after, "multiples of 32: %llu parameters (plain ranks %llu)",
              (unsigned long long)a2, (unsigned long long)after);
        pm.rank_multiple = -1;
        CHECK(nstf_lowrank_apply(lr, &pm, NULL, NULL) == NSTF_ERR_INVALID_ARG, "rank multiple -1 refused");
        CHECK(nstf_lowrank_apply(lr, &p, &before, &after) == NSTF_OK, "apply again: %s", nstf_last_error());
        for (int i = 0; i < nm; i++)
            CHECK(nstf_lowrank_rank_of(lr, i, NULL) == r0[i], "matrix %d back at rank %lld", i, (long long)r0[i]);
    }
    CHECK(nstf_eval_logprobs(s, ids, n, lp) == NSTF_OK, "factorized: %s", nstf_last_error());
    char path[256];
    snprintf(path, sizeof path, "%s/test_lowrank_%ld.gguf", NSTF_BUILD_DIR, (long)getpid());
    CHECK(nstf_lowrank_write(lr, path, NSTF_TYPE_F32) == NSTF_OK, "write: %s", nstf_last_error());
    nstf_lowrank_free(lr);
    {
        /* the SVDs ran on the session's two threads, a matrix each: one
         * thread gives the same file, byte for byte */
        nstf_session_params sp1 = sp;
        sp1.n_threads = 1;
        nstf_session *s1 = NULL;
        nstf_lowrank *lr1 = NULL;
        char path1[256];
        snprintf(path1, sizeof path1, "%s/test_lowrank_%ld_t1.gguf", NSTF_BUILD_DIR, (long)getpid());
        nstf_lowrank_params p1 = p;
        p1.alloc = NSTF_LR_ENERGY, p1.reduce = 0; /* made as above: then the same reduction */
        CHECK(nstf_session_open(MODEL, &sp1, &s1) == NSTF_OK && nstf_lowrank_create(s1, cal, n_cal, &p1, &lr1) ==
                  NSTF_OK && nstf_lowrank_apply(lr1, &p, &before, &after) == NSTF_OK &&
                  nstf_lowrank_write(lr1, path1, NSTF_TYPE_F32) == NSTF_OK,
              "one thread: %s", nstf_last_error());
        FILE *fa = fopen(path, "rb"), *fb = fopen(path1, "rb");
        bool same = fa && fb;
        for (int ca = 0, cb = 0; same && (ca != EOF || cb != EOF);) {
            ca = fgetc(fa), cb = fgetc(fb);
            same = ca == cb;
        }
        CHECK(same, "the factorized file made on one thread differs from the one made on two");
        if (fa) fclose(fa);
        if (fb) fclose(fb);
        nstf_lowrank_free(lr1);
        nstf_session_close(s1);
        remove(path1);
    }
    nstf_session *s2 = NULL;
    CHECK(nstf_session_open(path, &sp, &s2) == NSTF_OK, "reopen: %s", nstf_last_error());
    if (s2) {
        int n_lr = 0;
        for (int l = 0; l < s2->model->cfg.n_layers; l++)
            n_lr += s2->model->w.layers[l].wq.factors != NULL && s2->model->w.layers[l].w_gate.factors != NULL &&
                    s2->model->w.layers[l].w_up.factors == NULL;
        CHECK(n_lr == 1, "the reloaded model has %d factorized layers (want 1)", n_lr);
        CHECK(nstf_eval_logprobs(s2, ids, n, lp2) == NSTF_OK, "reloaded: %s", nstf_last_error());
        CHECK(!memcmp(lp, lp2, (size_t)n * nv * 4), "the reloaded file's logits equal the in-memory factorization's");
        kl = mean_kl(lp2, ref, n, nv, &top1);
        printf("  SmolLM2, layer 0 at 30%% fewer parameters (activation-aware file): mean KL %.3g, top-1 %.3f\n", kl, top1);
        nstf_sampler_params smp = nstf_sampler_default_params();
        smp.temp = 0;
        nstf_gen_stats st;
        CHECK(nstf_session_generate(s2, "Hello", false, NULL, &smp, 4, true, NULL, NULL, &st) == NSTF_OK &&
                  st.n_gen == 4,
              "generate from the factorized file: %s", nstf_last_error());
        nstf_session_close(s2);
    }
    remove(path);
out:
    nstf_session_close(s);
    free(ids), free(cal), free(ref), free(lp), free(lp2);
}

int main(void) {
    rules();
    if (!nstf_lowrank_available()) {
        printf("test_lowrank: no LAPACKE in this build; the SVD checks skipped\n");
        return g_fails ? 1 : 77;
    }
    svd_checks();
    matmul_vs_dense();
    if (access(MODEL, R_OK) != 0) {
        printf("test_lowrank: %s missing; the model checks skipped\n", MODEL);
        return g_fails ? 1 : 77;
    }
    smollm2();
    return test_finish("test_lowrank");
}
