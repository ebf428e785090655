/* test_train_torch.c — one optimizer step of NSTF equals one step of
 * PyTorch on a small random Llama (tests/data/train_tiny.gguf; the
 * reference tests/data/train_tiny_ref.gguf was made in float64 by
 * scripts/ref/make_train_ref.py with HF transformers' LlamaForCausalLM and
 * torch.optim.AdamW, versions in its metadata): the same weights, batch
 * (2 x 16 tokens), mean cross-entropy, global-norm clipping at 1 and
 * AdamW (lr 1e-3, betas 0.9 / 0.95, eps 1e-8, weight decay 0.1 on matrices).
 *
 * NSTF runs on the CPU backend in fp32 (precise, deterministic). Metrics
 * and tolerances, against the float64 reference:
 *   - the loss and the gradient norm within a relative 1e-6 (fp32 sums over
 *     a vocabulary of 96 and 32 targets: ~1e-7 expected);
 *   - every parameter's gradient NMSE <= 1e-7 (the fp32 rule);
 *   - every updated weight within 1e-6 max(1, |w|) + lr (1e-3 + s), s =
 *     min(2, eps d / (|g| + eps)^2), d = 4e-6 rms(g) of its tensor: the
 *     weight's own fp32 rounding, a thousandth of one step, and the
 *     sensitivity of AdamW's first step, which moves w by lr g / (|g| +
 *     eps), to an error d in g (four times the rms error of a gradient
 *     NMSE of 1e-12; ~6e-13 is measured). For the rare
 *     element whose gradient is within a few eps of 0, the step's direction
 *     itself is not determined by fp32 arithmetic; s bounds it by 2 lr.
 * The same step with --recompute attn and full gives bitwise the same
 * gradients and weights (recomputation reproduces the forward's bits), and
 * two micro-batches of one sequence (gradient accumulation) the same
 * numbers within the tolerances above.
 *
 * LoRA: the same step with the base frozen and rank-2 adapters on all seven
 * matrices of both layers, started from the reference's adapter values
 * (A and B nonzero); the adapters' gradients and updated values, the loss
 * and the norm against torch with the same tolerances. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/train.h"
#include "test_util.h"

#define MODEL NSTF_SOURCE_DIR "/tests/data/train_tiny.gguf"
#define REF NSTF_SOURCE_DIR "/tests/data/train_tiny_ref.gguf"

static double kv_double(const nstf_gguf *g, const char *key) {
    nstf_gguf_str s = {0, NULL};
    if (nstf_gguf_get_str(g, key, &s) != NSTF_OK) return NAN;
    char buf[64];
    snprintf(buf, sizeof buf, "%.*s", (int)s.len, s.ptr);
    return strtod(buf, NULL);
}

typedef struct run_out {
    double loss, norm;
    float *g, *w; /* flat arrays on the host */
    int64_t n_flat;
} run_out;

/* One step of the model on the reference batch as n_micro micro-batches;
 * lora: rank-2 adapters on every matrix, from the reference's .init values. */
static bool run_step(const nstf_llama *m, nstf_backend *be, nstf_recompute mode, int n_micro, const int32_t *tokens,
                     run_out *o, nstf_train **keep, const nstf_gguf *lora) {
    const train_shape sh = {2 / n_micro, 16, lora ? 2 : 0, lora ? 0x7fu : 0u, mode, 1};
    nstf_train *t = NULL;
    nstf_status st = nstf_train_create(m, be, &sh, 1, &t);
    CHECK(st == NSTF_OK, "train_create: %s", nstf_last_error());
    if (st != NSTF_OK) return false;
    for (int i = 0; lora && i < t->n_ptab; i++) {
        char nm[128];
        snprintf(nm, sizeof nm, "%s.init", t->ptab[i].name);
        const nstf_gguf_tensor *x = nstf_gguf_find_tensor(lora, nm);
        CHECK(x && (int64_t)x->n_elems == t->ptab[i].n, "reference %s missing", nm);
        if (x) CHECK(nstf_train_put(t, 0, t->ptab[i].offset, t->ptab[i].n, x->data) == NSTF_OK, "%s", nstf_last_error());
    }
    if (lora) CHECK(nstf_train_sync_copy(t) == NSTF_OK, "%s", nstf_last_error());
    const nstf_adamw_params opt = {1e-3, 0.9, 0.95, 1e-8, 0.1};
    st = nstf_train_step(t, tokens, n_micro, 0, &opt, 1.0, &o->loss, &o->norm);
    CHECK(st == NSTF_OK, "train_step: %s", nstf_last_error());
    o->n_flat = t->n_flat;
    o->g = malloc((size_t)t->n_flat * 4);
    o->w = malloc((size_t)t->n_flat * 4);
    CHECK(be->vt->download(be, o->g, t->g, (uint64_t)t->n_flat * 4) == NSTF_OK, "%s", nstf_last_error());
    CHECK(nstf_train_get(t, 0, 0, t->n_flat, o->w) == NSTF_OK, "%s", nstf_last_error());
    *keep = t;
    return st == NSTF_OK;
}

static void judge(const char *what, const nstf_train *t, const run_out *o, const nstf_gguf *ref, double want_loss,
                  double want_norm, const char *gsuf, const char *wsuf) {
    CHECK(fabs(o->loss - want_loss) <= 1e-6 * fabs(want_loss), "%s: loss %.10f, torch %.10f", what, o->loss, want_loss);
    CHECK(fabs(o->norm - want_norm) <= 1e-6 * fabs(want_norm), "%s: grad norm %.10f, torch %.10f", what, o->norm,
          want_norm);
    double worst_g = 0, worst_w = 0;
    for (int i = 0; i < t->n_ptab; i++) {
        const nstf_param_tensor *p = &t->ptab[i];
        char nm[128];
        snprintf(nm, sizeof nm, "%s%s", p->name, gsuf);
        const nstf_gguf_tensor *rg = nstf_gguf_find_tensor(ref, nm);
        snprintf(nm, sizeof nm, "%s%s", p->name, wsuf);
        const nstf_gguf_tensor *rw = nstf_gguf_find_tensor(ref, nm);
        CHECK(rg && rw && (int64_t)rg->n_elems == p->n && (int64_t)rw->n_elems == p->n, "%s: reference of %s missing",
              what, p->name);
        if (!rg || !rw || (int64_t)rg->n_elems != p->n) continue;
        const float *gr = rg->data, *wr = rw->data;
        double *gd = malloc((size_t)p->n * 8);
        for (int64_t k = 0; k < p->n; k++) gd[k] = gr[k];
        const double e = nmse(o->g + p->offset, gd, p->n);
        worst_g = e > worst_g ? e : worst_g;
        CHECK(e <= 1e-7, "%s: gradient of %s: NMSE %.3g against torch (tolerance 1e-7)", what, p->name, e);
        int bad = 0;
        double dev = 0, ss = 0;
        for (int64_t k = 0; k < p->n; k++) ss += gd[k] * gd[k];
        const double lr = 1e-3, eps = 1e-8, dg = 4e-6 * sqrt(ss / (double)p->n);
        for (int64_t k = 0; k < p->n; k++) {
            const double sens = fmin(2.0, eps * dg / ((fabs(gd[k]) + eps) * (fabs(gd[k]) + eps)));
            const double d = fabs((double)o->w[p->offset + k] - wr[k]),
                         tol = 1e-6 * fmax(1.0, fabs(wr[k])) + lr * (1e-3 + sens);
            dev = d / tol > dev ? d / tol : dev;
            bad += d > tol;
        }
        worst_w = dev > worst_w ? dev : worst_w;
        CHECK(bad == 0, "%s: %s: %d updated weights off torch's by more than the tolerance (worst %.2fx)", what,
              p->name, bad, dev);
        free(gd);
    }
    printf("  %-26s loss %.10f (torch %.10f), grad norm %.6f, worst gradient NMSE %.2e, worst weight %.2f of "
           "its tolerance\n",
           what, o->loss, want_loss, o->norm, worst_g, worst_w);
}

int main(void) {
    nstf_gguf *g = NULL, *ref = NULL;
    if (nstf_gguf_open(MODEL, &g) != NSTF_OK || nstf_gguf_open(REF, &ref) != NSTF_OK) {
        printf("test_train_torch: reference data missing (%s); skipped\n", nstf_last_error());
        nstf_gguf_close(g);
        return 77;
    }
    nstf_llama *m = NULL;
    CHECK(nstf_llama_load(g, &m) == NSTF_OK, "%s", nstf_last_error());
    const nstf_gguf_kv *tk = NULL;
    CHECK(nstf_gguf_get_arr(ref, "nstf.ref.tokens", NSTF_GGUF_INT32, &tk) == NSTF_OK && tk->arr_n == 34, "tokens");
    const double want_loss = kv_double(ref, "nstf.ref.loss"), want_norm = kv_double(ref, "nstf.ref.grad_norm");
    nstf_backend *be = NULL;
    const nstf_cpu_params cp = {2, true, true, 32};
    CHECK(nstf_backend_cpu_create(&cp, &be) == NSTF_OK, "%s", nstf_last_error());
    if (!m || !tk || !be) return test_finish("test_train_torch");
    int32_t tokens[34];
    memcpy(tokens, tk->arr_data, sizeof tokens);

    run_out base = {0}, other = {0};
    nstf_train *t = NULL, *t2 = NULL;
    if (run_step(m, be, NSTF_RECOMPUTE_NONE, 1, tokens, &base, &t, NULL)) judge("one step", t, &base, ref, want_loss, want_norm, ".grad", ".new");
    const char *modes[] = {"recompute attn", "recompute full"};
    for (int k = 0; t && k < 2; k++) {
        if (!run_step(m, be, (nstf_recompute)(k + 1), 1, tokens, &other, &t2, NULL)) break;
        CHECK(other.loss == base.loss && memcmp(other.g, base.g, (size_t)base.n_flat * 4) == 0 &&
                  memcmp(other.w, base.w, (size_t)base.n_flat * 4) == 0,
              "%s: gradients or weights differ from recompute none", modes[k]);
        printf("  %-26s bitwise equal to recompute none\n", modes[k]);
        free(other.g), free(other.w);
        nstf_train_free(t2);
    }
    /* gradient accumulation: two micro-batches of one sequence */
    if (t && run_step(m, be, NSTF_RECOMPUTE_NONE, 2, tokens, &other, &t2, NULL)) {
        judge("2 micro-batches of 1", t2, &other, ref, want_loss, want_norm, ".grad", ".new");
        free(other.g), free(other.w);
        nstf_train_free(t2);
    }
    /* LoRA */
    if (run_step(m, be, NSTF_RECOMPUTE_NONE, 1, tokens, &other, &t2, ref)) {
        judge("LoRA rank 2", t2, &other, ref, kv_double(ref, "nstf.ref.lora.loss"),
              kv_double(ref, "nstf.ref.lora.grad_norm"), ".grad", ".new");
        free(other.g), free(other.w);
        nstf_train_free(t2);
    }
    free(base.g), free(base.w);
    nstf_train_free(t);
    nstf_backend_free(be);
    nstf_llama_free(m);
    nstf_gguf_close(ref);
    return test_finish("test_train_torch");
}
