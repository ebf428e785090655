/* test_backward_cpu.c — the backward ops (backward.h) and the optimizer step
 * (optim.h) on the CPU.
 *
 * Gradient checks. Every backward op, reference (nstf_ref_*) and fast path
 * (nstf_cpu_*), is compared with central finite differences of an fp64
 * forward written here: for an objective L = sum(dy * f(inputs)) (the
 * cross-entropy: L = the loss), dL/dp = (L(p + e) - L(p - e)) / 2e with
 * e = 1e-5 max(1, |p|), for every input element p. The fp64 forwards are
 * written here on purpose rather than obtained by making the references
 * generic over precision: an independent forward means the check does not
 * share its code (or its bugs) with what it checks, and each is itself
 * checked against the engine's fp32 forward reference (nstf_ref_rmsnorm,
 * _rope, _attention, _swiglu, _matmul, _get_rows), so the gradient checked
 * is that of the function the engine computes. The difference error is
 * ~e^2 |f'''| + 1e-16 |L| / e, about 1e-10 relative here, far below the
 * tolerance.
 *   metric: NMSE = sum (g - g_fd)^2 / sum g_fd^2 of each gradient tensor
 *   tolerance: 1e-7 (the project's fp32 bound against fp64); the worst
 *   values seen are printed (~1e-13 for the references).
 * Gradients that are added into (parameter gradients, RMSNorm's dx, matmul
 * dx with acc) start from random values and the check is on the difference,
 * so an overwrite fails; written outputs are poisoned with NaN and followed
 * by a guard region. Shapes are not powers of two, attention is GQA with 3
 * and 4 query heads per kv head, positions do not start at 0.
 *
 * Fast paths. The light ones (embedding, RMSNorm, RoPE, SwiGLU, the
 * forward attention's lse) against their references and bitwise across
 * pool sizes. On larger shapes (several GEMM tiles and K slices, attention
 * key blocks, cross-entropy token blocks and vocabulary chunks, a head_dim
 * above the fast limit) the fast path is compared with the reference
 * (NMSE <= 1e-7: the reference accumulates in double and rounds once, so it
 * stands for fp64), and must be bitwise identical with no pool and with
 * pools of 1, 2 and 3 threads (the determinism backward.h promises).
 *
 * Optimizer.
 *   - AdamW against its closed form: with a constant gradient g the bias-
 *     corrected moments are exactly g and g^2, so after T steps
 *     w_T = a^T w_0 - c (1 - a^T) / (1 - a), a = 1 - lr wd,
 *     c = lr g / (|g| + eps); |w - w_T| <= 4e-7 max(1, |w_T|) (a few fp32
 *     roundings per step);
 *   - against torch.optim.AdamW: tests/data/adamw_torch_ref.txt, written by
 *     scripts/ref/make_adamw_ref.py (four steps with global-norm clipping
 *     and the cosine schedule); the norm within a relative 1e-6, the
 *     learning rate to 1e-12, weights and both moments within 1e-6 of the
 *     largest magnitude of their tensor (torch forms the norm and the clip
 *     factor in fp32, we in double: the clipped gradients differ by an ulp,
 *     which the cancellation in m = beta1 m + (1 - beta1) g magnifies in
 *     m's smallest elements);
 *   - the fused fp32 step against the double reference: weights within
 *     2 ulp plus 1e-6 of the update, moments NMSE <= 1e-7, bitwise across
 *     pool sizes; NaN and Inf gradients name their tensor and element; the
 *     global norm to 1e-12; the schedule's warm-up, cosine and floor. */
#include <float.h>

#include "core/threadpool.h"
#include "ops/backward.h"
#include "ops/optim.h"
#include "test_util.h"

#define TOL 1e-7
#define FD_EPS 1e-5
#define N_CFG 4 /* no pool, then pools of 1..3 threads */
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static nstf_cpu g_cpu[N_CFG];

/* ---- helpers ------------------------------------------------------------------ */

static float *fnew(int64_t n) { return guarded_alloc((size_t)n * 4); }
static double *dnew(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

static void fill_normal(test_rng *r, float *x, int64_t n, float sigma) {
    for (int64_t i = 0; i < n; i++) x[i] = sigma * rng_normal(r);
}
static double *to_d(const float *x, int64_t n) {
    double *d = dnew(n);
    for (int64_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}
static void poison(float *p, int64_t n) { memset(p, 0xff, (size_t)n * 4); }

/* worst NMSE per check name (up to the first space) */
static struct { char op[24]; double worst; } g_worst[24];

static void note_worst(const char *what, double e) {
    char op[24];
    int i = 0;
    while (what[i] && what[i] != ' ' && i < 23) { op[i] = what[i]; i++; }
    op[i] = 0;
    for (i = 0; i < COUNT(g_worst); i++) {
        if (!g_worst[i].op[0]) strcpy(g_worst[i].op, op);
        if (!strcmp(g_worst[i].op, op)) {
            if (e > g_worst[i].worst) g_worst[i].worst = e;
            return;
        }
    }
}

/* got (minus base, when the op adds into base) against want; finite; guard */
static void check_grad(const char *what, const float *got, const float *base, const double *want,
                       int64_t n) {
    CHECK(count_nonfinite(got, n) == 0, "%s: non-finite values", what);
    CHECK(guard_ok(got, (size_t)n * 4), "%s: guard overwritten", what);
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = (double)got[i] - (base ? base[i] : 0.0f);
        num += (g - want[i]) * (g - want[i]);
        den += want[i] * want[i];
    }
    double e = den > 0 ? num / den : num;
    note_worst(what, e);
    CHECK(e <= TOL, "%s: NMSE %.3g > %.3g", what, e, TOL);
}

/* fp32 forward of the engine against the fp64 forward of the test */
static void check_fwd(const char *what, const float *got, const double *want, int64_t n) {
    double e = nmse(got, want, n);
    note_worst(what, e);
    CHECK(e <= TOL && count_nonfinite(got, n) == 0, "%s: forward NMSE %.3g", what, e);
}

static bool same_bits(const float *a, const float *b, int64_t n) {
    return memcmp(a, b, (size_t)n * 4) == 0;
}

/* Central differences of f at every element of p[0..n). */
typedef double (*objective_fn)(void *ctx);
static void fd_grad(objective_fn f, void *ctx, double *p, int64_t n, double *g) {
    for (int64_t i = 0; i < n; i++) {
        double save = p[i], e = FD_EPS * fmax(1.0, fabs(save));
        p[i] = save + e;
        double lp = f(ctx), hi = p[i];
        p[i] = save - e;
        double lm = f(ctx), lo = p[i];
        p[i] = save;
        g[i] = (lp - lm) / (hi - lo);
    }
}

static double dot_dd(const double *a, const double *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ---- fp64 forwards -------------------------------------------------------------- */

static void f64_rmsnorm(const double *x, const double *w, double *y, int64_t n_tok, int64_t dim,
                        double eps) {
    for (int64_t t = 0; t < n_tok; t++) {
        double r = 1.0 / sqrt(dot_dd(x + t * dim, x + t * dim, dim) / dim + eps);
        for (int64_t i = 0; i < dim; i++) y[t * dim + i] = x[t * dim + i] * r * w[i];
    }
}

static void f64_rope(double *x, const int32_t *pos, int64_t n_tok, int n_heads, int hd,
                     double base, nstf_rope_mode mode) {
    for (int64_t t = 0; t < n_tok; t++)
        for (int h = 0; h < n_heads; h++)
            for (int i = 0; i < hd / 2; i++) {
                double th = pos[t] * pow(base, -2.0 * i / hd);
                double *a = x + (t * n_heads + h) * hd + (mode == NSTF_ROPE_NEOX ? i : 2 * i);
                double *b = mode == NSTF_ROPE_NEOX ? a + hd / 2 : a + 1;
                double va = *a, vb = *b;
                *a = va * cos(th) - vb * sin(th);
                *b = va * sin(th) + vb * cos(th);
            }
}

typedef struct {
    int64_t n_tok, pos0;
    int n_heads, n_kv, hd;
    double scale;
} attn_cfg;

/* out and (optionally) lse of causal GQA attention, softmax written out */
static void f64_attention(const attn_cfg *a, const double *q, const double *k, const double *v,
                          double *out, double *lse) {
    int group = a->n_heads / a->n_kv;
    int64_t kvs = (int64_t)a->n_kv * a->hd;
    double *s = dnew(a->pos0 + a->n_tok);
    for (int64_t t = 0; t < a->n_tok; t++)
        for (int h = 0; h < a->n_heads; h++) {
            const double *qh = q + (t * a->n_heads + h) * a->hd;
            int64_t n_keys = a->pos0 + t + 1;
            double m = -INFINITY, den = 0;
            for (int64_t j = 0; j < n_keys; j++) {
                s[j] = a->scale * dot_dd(qh, k + j * kvs + (h / group) * a->hd, a->hd);
                m = fmax(m, s[j]);
            }
            for (int64_t j = 0; j < n_keys; j++) den += exp(s[j] - m);
            if (lse) lse[t * a->n_heads + h] = m + log(den);
            for (int d = 0; d < a->hd; d++) {
                double o = 0;
                for (int64_t j = 0; j < n_keys; j++)
                    o += exp(s[j] - m) / den * v[j * kvs + (h / group) * a->hd + d];
                out[(t * a->n_heads + h) * a->hd + d] = o;
            }
        }
    free(s);
}

static void f64_matmul(const double *x, const double *w, double *y, int64_t n_tok, int64_t n_in,
                       int64_t n_out) {
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t o = 0; o < n_out; o++) y[t * n_out + o] = dot_dd(x + t * n_in, w + o * n_in, n_in);
}

/* sum over non-ignored t of (logsumexp(z_t) - z[t, y_t]) / n_norm; lse optional */
static double f64_ce(const double *h, const double *w, const int32_t *tg, int32_t ignore,
                     double n_norm, int64_t n_tok, int64_t dim, int64_t n_vocab, double *lse) {
    double loss = 0, *z = dnew(n_vocab);
    for (int64_t t = 0; t < n_tok; t++) {
        if (tg[t] == ignore) continue;
        double m = -INFINITY, s = 0;
        for (int64_t v = 0; v < n_vocab; v++) {
            z[v] = dot_dd(h + t * dim, w + v * dim, dim);
            m = fmax(m, z[v]);
        }
        for (int64_t v = 0; v < n_vocab; v++) s += exp(z[v] - m);
        if (lse) lse[t] = m + log(s);
        loss += (m + log(s) - z[tg[t]]) / n_norm;
    }
    free(z);
    return loss;
}

/* ---- embedding ------------------------------------------------------------------ */

typedef struct { double *table, *dy; const int32_t *ids; int64_t n_tok, dim; } emb_ctx;

static double emb_obj(void *p) {
    emb_ctx *c = p;
    double L = 0;
    for (int64_t t = 0; t < c->n_tok; t++) L += dot_dd(c->dy + t * c->dim, c->table + c->ids[t] * c->dim, c->dim);
    return L;
}

static void test_embedding(test_rng *r) {
    const int64_t n_rows = 7, dim = 13, n_tok = 9;
    const int32_t ids[9] = {3, 0, 6, 3, 2, 3, 6, 1, 0}; /* repeats, row 4 and 5 unused */
    float *table = fnew(n_rows * dim), *dy = fnew(n_tok * dim), *fwd = fnew(n_tok * dim);
    float *dt = fnew(n_rows * dim), *base = fnew(n_rows * dim);
    fill_normal(r, table, n_rows * dim, 1.0f);
    fill_normal(r, dy, n_tok * dim, 1.0f);
    fill_normal(r, base, n_rows * dim, 0.5f);
    nstf_ref_get_rows(NSTF_TYPE_F32, table, ids, fwd, n_tok, dim);
    emb_ctx c = {to_d(table, n_rows * dim), to_d(dy, n_tok * dim), ids, n_tok, dim};
    double *y64 = dnew(n_tok * dim), *g = dnew(n_rows * dim);
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < dim; i++) y64[t * dim + i] = c.table[ids[t] * dim + i];
    check_fwd("embedding fwd", fwd, y64, n_tok * dim);
    fd_grad(emb_obj, &c, c.table, n_rows * dim, g);
    memcpy(dt, base, (size_t)(n_rows * dim) * 4);
    nstf_ref_get_rows_bwd(ids, dy, dt, n_tok, dim);
    check_grad("embedding dtable (+=)", dt, base, g, n_rows * dim);
    free(c.table); free(c.dy); free(y64); free(g);
    free(table); free(dy); free(fwd); free(dt); free(base);
}

/* ---- rmsnorm -------------------------------------------------------------------- */

typedef struct { double *x, *w, *dy, *y; int64_t n_tok, dim; double eps; } rms_ctx;

static double rms_obj(void *p) {
    rms_ctx *c = p;
    f64_rmsnorm(c->x, c->w, c->y, c->n_tok, c->dim, c->eps);
    return dot_dd(c->dy, c->y, c->n_tok * c->dim);
}

static void test_rmsnorm(test_rng *r) {
    const int64_t shapes[][2] = {{5, 13}, {3, 300}}; /* 300 > the reference's 256-chunk */
    for (int si = 0; si < COUNT(shapes); si++) {
        int64_t n_tok = shapes[si][0], dim = shapes[si][1], n = n_tok * dim;
        const float eps = 1e-2f; /* large enough to matter in the gradient */
        float *x = fnew(n), *w = fnew(dim), *dy = fnew(n), *y = fnew(n);
        float *dx = fnew(n), *dxb = fnew(n), *dw = fnew(dim), *dwb = fnew(dim);
        fill_normal(r, x, n, 0.3f);
        for (int64_t i = 0; i < dim; i++) w[i] = 1.0f + 0.3f * rng_normal(r);
        fill_normal(r, dy, n, 1.0f);
        fill_normal(r, dxb, n, 0.5f);
        fill_normal(r, dwb, dim, 0.5f);
        rms_ctx c = {to_d(x, n), to_d(w, dim), to_d(dy, n), dnew(n), n_tok, dim, eps};
        rms_obj(&c);
        nstf_ref_rmsnorm(x, w, y, n_tok, dim, eps);
        check_fwd("rmsnorm fwd", y, c.y, n);
        double *gx = dnew(n), *gw = dnew(dim);
        fd_grad(rms_obj, &c, c.x, n, gx);
        fd_grad(rms_obj, &c, c.w, dim, gw);
        memcpy(dx, dxb, (size_t)n * 4);
        memcpy(dw, dwb, (size_t)dim * 4);
        nstf_ref_rmsnorm_bwd(x, w, dy, dx, dw, n_tok, dim, eps);
        check_grad("rmsnorm dx (+=)", dx, dxb, gx, n);
        check_grad("rmsnorm dw (+=)", dw, dwb, gw, dim);
        free(c.x); free(c.w); free(c.dy); free(c.y); free(gx); free(gw);
        free(x); free(w); free(dy); free(y); free(dx); free(dxb); free(dw); free(dwb);
    }
}

/* ---- rope ------------------------------------------------------------------------- */

typedef struct { double *x, *dy, *y; const int32_t *pos; int64_t n_tok; int n_heads, hd; nstf_rope_mode mode; } rope_ctx;

static double rope_obj(void *p) {
    rope_ctx *c = p;
    int64_t n = c->n_tok * c->n_heads * c->hd;
    memcpy(c->y, c->x, (size_t)n * sizeof(double));
    f64_rope(c->y, c->pos, c->n_tok, c->n_heads, c->hd, 10000.0, c->mode);
    return dot_dd(c->dy, c->y, n);
}

static void test_rope(test_rng *r) {
    const int64_t n_tok = 4;
    const int n_heads = 3, hd = 10;
    const int32_t pos[4] = {7, 8, 9, 300};
    const int64_t n = n_tok * n_heads * hd;
    const nstf_rope_mode modes[] = {NSTF_ROPE_NORM, NSTF_ROPE_NEOX};
    for (int mi = 0; mi < 2; mi++) {
        float *x = fnew(n), *dy = fnew(n), *y = fnew(n), *dx = fnew(n);
        fill_normal(r, x, n, 1.0f);
        fill_normal(r, dy, n, 1.0f);
        rope_ctx c = {to_d(x, n), to_d(dy, n), dnew(n), pos, n_tok, n_heads, hd, modes[mi]};
        rope_obj(&c);
        memcpy(y, x, (size_t)n * 4);
        nstf_ref_rope(y, pos, n_tok, n_heads, hd, 10000.0f, modes[mi]);
        check_fwd("rope fwd", y, c.y, n);
        double *g = dnew(n);
        fd_grad(rope_obj, &c, c.x, n, g);
        memcpy(dx, dy, (size_t)n * 4);
        nstf_ref_rope_bwd(dx, pos, n_tok, n_heads, hd, 10000.0f, modes[mi]);
        check_grad(mi ? "rope dx (neox)" : "rope dx (norm)", dx, NULL, g, n);
        free(c.x); free(c.dy); free(c.y); free(g);
        free(x); free(dy); free(y); free(dx);
    }
}

/* ---- attention -------------------------------------------------------------------- */

typedef struct { attn_cfg a; double *q, *k, *v, *dout, *out; } att_ctx;

static double att_obj(void *p) {
    att_ctx *c = p;
    f64_attention(&c->a, c->q, c->k, c->v, c->out, NULL);
    return dot_dd(c->dout, c->out, c->a.n_tok * c->a.n_heads * c->a.hd);
}

typedef struct {
    float *q, *k, *v, *out, *lse, *dout; /* inputs, forward from nstf_ref_attention_lse */
    int64_t nq, nk, nl;                  /* element counts: q-shaped, k-shaped, lse */
} att_data;

static att_data att_make(test_rng *r, const attn_cfg *a) {
    att_data d;
    d.nq = a->n_tok * a->n_heads * a->hd;
    d.nk = (a->pos0 + a->n_tok) * a->n_kv * a->hd;
    d.nl = a->n_tok * a->n_heads;
    d.q = fnew(d.nq); d.k = fnew(d.nk); d.v = fnew(d.nk);
    d.out = fnew(d.nq); d.lse = fnew(d.nl); d.dout = fnew(d.nq);
    fill_normal(r, d.q, d.nq, 1.0f);
    fill_normal(r, d.k, d.nk, 1.0f);
    fill_normal(r, d.v, d.nk, 1.0f);
    fill_normal(r, d.dout, d.nq, 1.0f);
    nstf_ref_attention_lse(d.q, d.k, d.v, d.out, d.lse, a->n_tok, a->pos0, a->n_heads, a->n_kv,
                           a->hd, (float)a->scale);
    return d;
}

static void att_free(att_data *d) {
    free(d->q); free(d->k); free(d->v); free(d->out); free(d->lse); free(d->dout);
}

/* cfg < 0: the reference, else the fast path on g_cpu[cfg] */
static void att_bwd(int cfg, const attn_cfg *a, const att_data *d, float *dq, float *dk, float *dv) {
    poison(dq, d->nq);
    poison(dk, d->nk);
    poison(dv, d->nk);
    if (cfg < 0)
        nstf_ref_attention_bwd(d->q, d->k, d->v, d->out, d->dout, d->lse, dq, dk, dv, a->n_tok,
                               a->pos0, a->n_heads, a->n_kv, a->hd, (float)a->scale);
    else
        nstf_cpu_attention_bwd(&g_cpu[cfg], d->q, d->k, d->v, d->out, d->dout, d->lse, dq, dk, dv,
                               a->n_tok, a->pos0, a->n_heads, a->n_kv, a->hd, (float)a->scale);
}

static void test_attention_fd(test_rng *r) {
    const attn_cfg cfgs[] = {
        {5, 3, 6, 2, 12, 0.0}, /* 3 query heads per kv head, positions from 3 */
        {4, 0, 4, 1, 7, 0.0},  /* 4 per kv head (MQA), odd head_dim */
    };
    for (int ci = 0; ci < COUNT(cfgs); ci++) {
        attn_cfg a = cfgs[ci];
        a.scale = 1.0 / sqrt((double)a.hd) * 1.7; /* sharper than usual: larger gradients */
        att_data d = att_make(r, &a);
        att_ctx c = {a, to_d(d.q, d.nq), to_d(d.k, d.nk), to_d(d.v, d.nk), to_d(d.dout, d.nq), dnew(d.nq)};
        double *lse64 = dnew(d.nl);
        f64_attention(&a, c.q, c.k, c.v, c.out, lse64);
        {
            float *o = fnew(d.nq);
            nstf_ref_attention(d.q, d.k, d.v, o, a.n_tok, a.pos0, a.n_heads, a.n_kv, a.hd, (float)a.scale);
            check_fwd("attention fwd", o, c.out, d.nq);
            free(o);
        }
        check_fwd("attention_lse fwd out", d.out, c.out, d.nq);
        check_fwd("attention_lse fwd lse", d.lse, lse64, d.nl);
        double *gq = dnew(d.nq), *gk = dnew(d.nk), *gv = dnew(d.nk);
        fd_grad(att_obj, &c, c.q, d.nq, gq);
        fd_grad(att_obj, &c, c.k, d.nk, gk);
        fd_grad(att_obj, &c, c.v, d.nk, gv);
        float *dq = fnew(d.nq), *dk = fnew(d.nk), *dv = fnew(d.nk);
        const int paths[] = {-1, 2}; /* the reference, the fast path on 2 threads */
        for (int k = 0; k < 2; k++) {
            att_bwd(paths[k], &a, &d, dq, dk, dv);
            check_grad(k == 0 ? "attention dq" : "attention_cpu dq", dq, NULL, gq, d.nq);
            check_grad(k == 0 ? "attention dk" : "attention_cpu dk", dk, NULL, gk, d.nk);
            check_grad(k == 0 ? "attention dv" : "attention_cpu dv", dv, NULL, gv, d.nk);
        }
        free(dq); free(dk); free(dv); free(gq); free(gk); free(gv); free(lse64);
        free(c.q); free(c.k); free(c.v); free(c.dout); free(c.out);
        att_free(&d);
    }
}

/* Fast path vs reference on larger shapes; bitwise across pool sizes. */
static void test_attention_fast(test_rng *r) {
    const attn_cfg cfgs[] = {
        {40, 9, 6, 2, 40, 0.0},  /* 49 keys: several key blocks and score chunks */
        {20, 0, 16, 1, 24, 0.0}, /* 16 heads per kv head: two head batches */
        {3, 2, 2, 1, 260, 0.0},  /* head_dim above the fast limit: the fallback */
    };
    for (int ci = 0; ci < COUNT(cfgs); ci++) {
        attn_cfg a = cfgs[ci];
        a.scale = 1.0 / sqrt((double)a.hd);
        att_data d = att_make(r, &a);
        float *rq = fnew(d.nq), *rk = fnew(d.nk), *rv = fnew(d.nk);
        float *dq[N_CFG], *dk[N_CFG], *dv[N_CFG];
        att_bwd(-1, &a, &d, rq, rk, rv);
        double *wq = to_d(rq, d.nq), *wk = to_d(rk, d.nk), *wv = to_d(rv, d.nk);
        char what[96];
        for (int cfg = 0; cfg < N_CFG; cfg++) {
            dq[cfg] = fnew(d.nq); dk[cfg] = fnew(d.nk); dv[cfg] = fnew(d.nk);
            att_bwd(cfg, &a, &d, dq[cfg], dk[cfg], dv[cfg]);
            snprintf(what, sizeof what, "attention_cpu vs ref shape %d cfg %d", ci, cfg);
            check_grad(what, dq[cfg], NULL, wq, d.nq);
            check_grad(what, dk[cfg], NULL, wk, d.nk);
            check_grad(what, dv[cfg], NULL, wv, d.nk);
            CHECK(same_bits(dq[cfg], dq[0], d.nq) && same_bits(dk[cfg], dk[0], d.nk) &&
                      same_bits(dv[cfg], dv[0], d.nk),
                  "attention_cpu shape %d: pool config %d differs from config 0", ci, cfg);
        }
        for (int cfg = 0; cfg < N_CFG; cfg++) { free(dq[cfg]); free(dk[cfg]); free(dv[cfg]); }
        free(rq); free(rk); free(rv); free(wq); free(wk); free(wv);
        att_free(&d);
    }
}

/* ---- swiglu --------------------------------------------------------------------- */

typedef struct { double *g, *u, *dy; int64_t n; } swi_ctx;

static double swi_obj(void *p) {
    swi_ctx *c = p;
    double L = 0;
    for (int64_t i = 0; i < c->n; i++) L += c->dy[i] * c->g[i] / (1.0 + exp(-c->g[i])) * c->u[i];
    return L;
}

static void test_swiglu(test_rng *r) {
    const int64_t n = 37;
    float *g = fnew(n), *u = fnew(n), *dy = fnew(n), *y = fnew(n), *dg = fnew(n), *du = fnew(n);
    fill_normal(r, g, n, 2.5f);
    fill_normal(r, u, n, 1.0f);
    fill_normal(r, dy, n, 1.0f);
    swi_ctx c = {to_d(g, n), to_d(u, n), to_d(dy, n), n};
    double *y64 = dnew(n), *gg = dnew(n), *gu = dnew(n);
    for (int64_t i = 0; i < n; i++) y64[i] = c.g[i] / (1.0 + exp(-c.g[i])) * c.u[i];
    nstf_ref_swiglu(g, u, y, n);
    check_fwd("swiglu fwd", y, y64, n);
    fd_grad(swi_obj, &c, c.g, n, gg);
    fd_grad(swi_obj, &c, c.u, n, gu);
    poison(dg, n);
    poison(du, n);
    nstf_ref_swiglu_bwd(g, u, dy, dg, du, n);
    check_grad("swiglu dgate", dg, NULL, gg, n);
    check_grad("swiglu dup", du, NULL, gu, n);
    /* in place: dgate over gate, dup over up */
    float *g2 = fnew(n), *u2 = fnew(n);
    memcpy(g2, g, (size_t)n * 4);
    memcpy(u2, u, (size_t)n * 4);
    nstf_ref_swiglu_bwd(g2, u2, dy, g2, u2, n);
    CHECK(same_bits(g2, dg, n) && same_bits(u2, du, n), "swiglu_bwd in place differs");
    free(c.g); free(c.u); free(c.dy); free(y64); free(gg); free(gu);
    free(g); free(u); free(dy); free(y); free(dg); free(du); free(g2); free(u2);
}

/* ---- matmul -------------------------------------------------------------------- */

typedef struct { double *x, *w, *dy, *y; int64_t n_tok, n_in, n_out; } mm_ctx;

static double mm_obj(void *p) {
    mm_ctx *c = p;
    f64_matmul(c->x, c->w, c->y, c->n_tok, c->n_in, c->n_out);
    return dot_dd(c->dy, c->y, c->n_tok * c->n_out);
}

/* cfg < 0: the reference, else the fast path on g_cpu[cfg] */
static void mm_bwd_x(int cfg, const float *w, const float *dy, float *dx, int64_t n_tok,
                     int64_t n_in, int64_t n_out, bool acc) {
    if (cfg < 0) nstf_ref_matmul_bwd_x(w, dy, dx, n_tok, n_in, n_out, acc);
    else nstf_cpu_matmul_bwd_x(&g_cpu[cfg], w, dy, dx, n_tok, n_in, n_out, acc);
}
static void mm_bwd_w(int cfg, const float *x, const float *dy, float *dw, int64_t n_tok,
                     int64_t n_in, int64_t n_out) {
    if (cfg < 0) nstf_ref_matmul_bwd_w(x, dy, dw, n_tok, n_in, n_out);
    else nstf_cpu_matmul_bwd_w(&g_cpu[cfg], x, dy, dw, n_tok, n_in, n_out);
}

static void test_matmul_fd(test_rng *r) {
    const int64_t n_tok = 6, n_in = 11, n_out = 9;
    float *x = fnew(n_tok * n_in), *w = fnew(n_out * n_in), *dy = fnew(n_tok * n_out);
    float *y = fnew(n_tok * n_out), *dx = fnew(n_tok * n_in), *dxb = fnew(n_tok * n_in);
    float *dw = fnew(n_out * n_in), *dwb = fnew(n_out * n_in);
    fill_normal(r, x, n_tok * n_in, 1.0f);
    fill_normal(r, w, n_out * n_in, 1.0f);
    fill_normal(r, dy, n_tok * n_out, 1.0f);
    fill_normal(r, dxb, n_tok * n_in, 1.0f);
    fill_normal(r, dwb, n_out * n_in, 1.0f);
    mm_ctx c = {to_d(x, n_tok * n_in), to_d(w, n_out * n_in), to_d(dy, n_tok * n_out),
                dnew(n_tok * n_out), n_tok, n_in, n_out};
    mm_obj(&c);
    nstf_ref_matmul(NSTF_TYPE_F32, w, x, y, n_tok, n_in, n_out);
    check_fwd("matmul fwd", y, c.y, n_tok * n_out);
    double *gx = dnew(n_tok * n_in), *gw = dnew(n_out * n_in);
    fd_grad(mm_obj, &c, c.x, n_tok * n_in, gx);
    fd_grad(mm_obj, &c, c.w, n_out * n_in, gw);
    const int cfgs[] = {-1, 2};
    for (int k = 0; k < 2; k++) {
        int cfg = cfgs[k];
        poison(dx, n_tok * n_in);
        mm_bwd_x(cfg, w, dy, dx, n_tok, n_in, n_out, false);
        check_grad(cfg < 0 ? "matmul dx" : "matmul_cpu dx", dx, NULL, gx, n_tok * n_in);
        memcpy(dx, dxb, (size_t)(n_tok * n_in) * 4);
        mm_bwd_x(cfg, w, dy, dx, n_tok, n_in, n_out, true);
        check_grad(cfg < 0 ? "matmul dx (acc)" : "matmul_cpu dx (acc)", dx, dxb, gx, n_tok * n_in);
        memcpy(dw, dwb, (size_t)(n_out * n_in) * 4);
        mm_bwd_w(cfg, x, dy, dw, n_tok, n_in, n_out);
        check_grad(cfg < 0 ? "matmul dw (+=)" : "matmul_cpu dw (+=)", dw, dwb, gw, n_out * n_in);
    }
    free(c.x); free(c.w); free(c.dy); free(c.y); free(gx); free(gw);
    free(x); free(w); free(dy); free(y); free(dx); free(dxb); free(dw); free(dwb);
}

static void test_matmul_fast(test_rng *r) {
    /* several tiles of 64 x 128, K past one 256-slice, column and row edges */
    const int64_t shapes[][3] = {{70, 150, 301}, {260, 35, 17}, {1, 200, 33}, {3, 0, 5}};
    for (int si = 0; si < COUNT(shapes); si++) {
        int64_t n_tok = shapes[si][0], n_in = shapes[si][1], n_out = shapes[si][2];
        int64_t nx = n_tok * n_in, nw = n_out * n_in;
        float *x = fnew(nx), *w = fnew(nw), *dy = fnew(n_tok * n_out);
        float *rx = fnew(nx), *rw = fnew(nw), *dxb = fnew(nx), *dwb = fnew(nw);
        fill_normal(r, x, nx, 1.0f);
        fill_normal(r, w, nw, 1.0f);
        fill_normal(r, dy, n_tok * n_out, 1.0f);
        fill_normal(r, dxb, nx, 1.0f);
        fill_normal(r, dwb, nw, 1.0f);
        memcpy(rx, dxb, (size_t)nx * 4);
        memcpy(rw, dwb, (size_t)nw * 4);
        mm_bwd_x(-1, w, dy, rx, n_tok, n_in, n_out, true);
        mm_bwd_w(-1, x, dy, rw, n_tok, n_in, n_out);
        double *wx = dnew(nx), *ww = dnew(nw);
        for (int64_t i = 0; i < nx; i++) wx[i] = (double)rx[i] - dxb[i];
        for (int64_t i = 0; i < nw; i++) ww[i] = (double)rw[i] - dwb[i];
        float *dx[N_CFG], *dw[N_CFG], *dxo = fnew(nx);
        char what[96];
        for (int cfg = 0; cfg < N_CFG; cfg++) {
            dx[cfg] = fnew(nx);
            dw[cfg] = fnew(nw);
            memcpy(dx[cfg], dxb, (size_t)nx * 4);
            memcpy(dw[cfg], dwb, (size_t)nw * 4);
            mm_bwd_x(cfg, w, dy, dx[cfg], n_tok, n_in, n_out, true);
            mm_bwd_w(cfg, x, dy, dw[cfg], n_tok, n_in, n_out);
            snprintf(what, sizeof what, "matmul_cpu vs ref %lldx%lldx%lld cfg %d",
                     (long long)n_tok, (long long)n_in, (long long)n_out, cfg);
            check_grad(what, dx[cfg], dxb, wx, nx);
            check_grad(what, dw[cfg], dwb, ww, nw);
            CHECK(same_bits(dx[cfg], dx[0], nx) && same_bits(dw[cfg], dw[0], nw),
                  "%s: differs from pool config 0", what);
            poison(dxo, nx); /* overwrite mode */
            mm_bwd_x(cfg, w, dy, dxo, n_tok, n_in, n_out, false);
            check_grad(what, dxo, NULL, wx, nx);
        }
        for (int cfg = 0; cfg < N_CFG; cfg++) { free(dx[cfg]); free(dw[cfg]); }
        free(x); free(w); free(dy); free(rx); free(rw); free(dxb); free(dwb); free(dxo);
        free(wx); free(ww);
    }
}

/* ---- the light fast paths ---------------------------------------------------------------- */

/* Embedding (repeated ids), RMSNorm (dw and a frozen norm), RoPE (both
 * modes), SwiGLU and the forward attention's lse: against their references
 * (NMSE <= 1e-7) and bitwise across pool sizes. Work above the inline
 * threshold, so the pools run. */
static void test_light_fast(test_rng *r) {
    const int64_t n = 300, dim = 200, rows = 37;
    int32_t ids[300], pos[300];
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(rng_next(r) % rows), pos[i] = 1000 + 7 * i;
    float *x = fnew(n * dim), *dy = fnew(n * dim), *w = fnew(dim), *base = fnew(rows * dim);
    fill_normal(r, x, n * dim, 2.0f), fill_normal(r, dy, n * dim, 1.0f), fill_normal(r, w, dim, 1.0f);
    fill_normal(r, base, rows * dim, 1.0f);
    float *ref = fnew(rows * dim), *ref2 = fnew(dim), *got[N_CFG], *got2[N_CFG], *work = fnew(n);
    char what[64];
    /* embedding */
    memcpy(ref, base, (size_t)(rows * dim) * 4);
    nstf_ref_get_rows_bwd(ids, dy, ref, n, dim);
    double *want = dnew(rows * dim);
    for (int64_t i = 0; i < rows * dim; i++) want[i] = (double)ref[i] - base[i];
    for (int c = 0; c < N_CFG; c++) {
        got[c] = fnew(rows * dim);
        memcpy(got[c], base, (size_t)(rows * dim) * 4);
        nstf_cpu_get_rows_bwd(&g_cpu[c], ids, dy, got[c], n, dim);
        snprintf(what, sizeof what, "get_rows_bwd_cpu cfg %d", c);
        check_grad(what, got[c], base, want, rows * dim);
        CHECK(same_bits(got[c], got[0], rows * dim), "%s: differs from pool config 0", what);
    }
    for (int c = 0; c < N_CFG; c++) free(got[c]);
    free(want);
    /* RMSNorm: dx added into base values, dw; then a frozen norm (dw NULL) */
    float *dx0 = fnew(n * dim), *rdx = fnew(n * dim);
    fill_normal(r, dx0, n * dim, 1.0f);
    memcpy(rdx, dx0, (size_t)(n * dim) * 4);
    memset(ref2, 0, (size_t)dim * 4);
    nstf_ref_rmsnorm_bwd(x, w, dy, rdx, ref2, n, dim, 1e-5f);
    double *wdx = dnew(n * dim), *wdw = to_d(ref2, dim);
    for (int64_t i = 0; i < n * dim; i++) wdx[i] = (double)rdx[i] - dx0[i];
    for (int c = 0; c < N_CFG; c++) {
        got[c] = fnew(n * dim), got2[c] = fnew(dim);
        memcpy(got[c], dx0, (size_t)(n * dim) * 4);
        memset(got2[c], 0, (size_t)dim * 4);
        nstf_cpu_rmsnorm_bwd(&g_cpu[c], x, w, dy, got[c], c == 1 ? NULL : got2[c], n, dim, 1e-5f, work);
        snprintf(what, sizeof what, "rmsnorm_bwd_cpu cfg %d", c);
        check_grad(what, got[c], dx0, wdx, n * dim);
        if (c != 1) check_grad(what, got2[c], NULL, wdw, dim);
        CHECK(same_bits(got[c], got[0], n * dim) && (c == 1 || same_bits(got2[c], got2[0], dim)),
              "%s: differs from pool config 0", what);
    }
    for (int c = 0; c < N_CFG; c++) free(got[c]), free(got2[c]);
    free(dx0), free(rdx), free(wdx), free(wdw);
    /* RoPE backward (3 heads of 64 per token) and SwiGLU backward */
    for (int mode = 0; mode <= 2; mode += 2) {
        float *rr = fnew(n * dim);
        memcpy(rr, x, (size_t)(n * 192) * 4);
        nstf_ref_rope_bwd(rr, pos, n, 3, 64, 10000.0f, (nstf_rope_mode)mode);
        double *wr = to_d(rr, n * 192);
        for (int c = 0; c < N_CFG; c++) {
            got[c] = fnew(n * 192);
            memcpy(got[c], x, (size_t)(n * 192) * 4);
            nstf_cpu_rope_bwd(&g_cpu[c], got[c], pos, n, 3, 64, 10000.0f, (nstf_rope_mode)mode);
            snprintf(what, sizeof what, "rope_bwd_cpu mode %d cfg %d", mode, c);
            check_grad(what, got[c], NULL, wr, n * 192);
            CHECK(same_bits(got[c], got[0], n * 192), "%s: differs from pool config 0", what);
        }
        for (int c = 0; c < N_CFG; c++) free(got[c]);
        free(rr), free(wr);
    }
    {
        float *rg = fnew(n * dim), *ru = fnew(n * dim);
        nstf_ref_swiglu_bwd(x, dy, x, rg, ru, n * dim); /* gate x, up dy, dy x */
        double *wg = to_d(rg, n * dim), *wu = to_d(ru, n * dim);
        for (int c = 0; c < N_CFG; c++) {
            got[c] = fnew(n * dim), got2[c] = fnew(n * dim);
            nstf_cpu_swiglu_bwd(&g_cpu[c], x, dy, x, got[c], got2[c], n * dim);
            snprintf(what, sizeof what, "swiglu_bwd_cpu cfg %d", c);
            check_grad(what, got[c], NULL, wg, n * dim);
            check_grad(what, got2[c], NULL, wu, n * dim);
            CHECK(same_bits(got[c], got[0], n * dim) && same_bits(got2[c], got2[0], n * dim),
                  "%s: differs from pool config 0", what);
        }
        for (int c = 0; c < N_CFG; c++) free(got[c]), free(got2[c]);
        free(rg), free(ru), free(wg), free(wu);
    }
    /* the forward attention's lse: 37 tokens at 20 over 57 keys, GQA 4:1 */
    {
        const int64_t nt = 37, p0 = 20, nk = p0 + nt;
        const int nh = 8, nkv = 2, hd = 32;
        float *q = fnew(nt * nh * hd), *k = fnew(nk * nkv * hd), *v = fnew(nk * nkv * hd);
        float *ro = fnew(nt * nh * hd), *rl = fnew(nt * nh);
        fill_normal(r, q, nt * nh * hd, 1.0f), fill_normal(r, k, nk * nkv * hd, 1.0f);
        fill_normal(r, v, nk * nkv * hd, 1.0f);
        nstf_ref_attention_lse(q, k, v, ro, rl, nt, p0, nh, nkv, hd, 0.2f);
        double *wo = to_d(ro, nt * nh * hd), *wl = to_d(rl, nt * nh);
        for (int c = 0; c < N_CFG; c++) {
            got[c] = fnew(nt * nh * hd), got2[c] = fnew(nt * nh);
            nstf_cpu_attention_lse(&g_cpu[c], q, k, v, got[c], got2[c], nt, p0, nh, nkv, hd, 0.2f);
            snprintf(what, sizeof what, "attention_lse_cpu cfg %d", c);
            check_grad(what, got[c], NULL, wo, nt * nh * hd);
            check_grad(what, got2[c], NULL, wl, nt * nh);
            CHECK(same_bits(got[c], got[0], nt * nh * hd) && same_bits(got2[c], got2[0], nt * nh),
                  "%s: differs from pool config 0", what);
        }
        for (int c = 0; c < N_CFG; c++) free(got[c]), free(got2[c]);
        free(q), free(k), free(v), free(ro), free(rl), free(wo), free(wl);
    }
    free(x), free(dy), free(w), free(base), free(ref), free(ref2), free(work);
}

/* ---- cross-entropy ------------------------------------------------------------------ */

#define IGNORE (-100)

typedef struct { double *h, *w; const int32_t *tg; double n_norm; int64_t n_tok, dim, n_vocab; } ce_ctx;

static double ce_obj(void *p) {
    ce_ctx *c = p;
    return f64_ce(c->h, c->w, c->tg, IGNORE, c->n_norm, c->n_tok, c->dim, c->n_vocab, NULL);
}

/* cfg < 0: the reference, else the fast path on g_cpu[cfg] (with its workspace) */
static double ce_run(int cfg, const float *h, const float *w, const int32_t *tg, double n_norm,
                     float *lse, float *dh, float *dw, int64_t n_tok, int64_t dim, int64_t n_vocab) {
    if (cfg < 0)
        return nstf_ref_cross_entropy(h, w, tg, IGNORE, n_norm, lse, dh, dw, n_tok, dim, n_vocab);
    float *work = fnew(nstf_cpu_cross_entropy_work(n_tok, dim, n_vocab));
    double loss = nstf_cpu_cross_entropy(&g_cpu[cfg], h, w, tg, IGNORE, n_norm, lse, dh, dw,
                                         n_tok, dim, n_vocab, work);
    CHECK(guard_ok(work, (size_t)nstf_cpu_cross_entropy_work(n_tok, dim, n_vocab) * 4),
          "cross-entropy workspace overrun");
    free(work);
    return loss;
}

static void test_ce_fd(test_rng *r) {
    const int64_t n_tok = 7, dim = 9, n_vocab = 23;
    const int32_t tg[7] = {4, IGNORE, 22, 0, 4, IGNORE, 13};
    float *h = fnew(n_tok * dim), *w = fnew(n_vocab * dim), *lse = fnew(n_tok);
    float *dh = fnew(n_tok * dim), *dw = fnew(n_vocab * dim), *dwb = fnew(n_vocab * dim);
    fill_normal(r, h, n_tok * dim, 1.0f);
    fill_normal(r, w, n_vocab * dim, 1.0f);
    fill_normal(r, dwb, n_vocab * dim, 0.05f);
    int64_t n_valid = -1;
    CHECK(nstf_ce_count(tg, n_tok, n_vocab, IGNORE, &n_valid) == NSTF_OK && n_valid == 5,
          "ce_count: %lld", (long long)n_valid);
    ce_ctx c = {to_d(h, n_tok * dim), to_d(w, n_vocab * dim), tg, (double)n_valid, n_tok, dim, n_vocab};
    double *lse64 = dnew(n_tok), *gh = dnew(n_tok * dim), *gw = dnew(n_vocab * dim);
    double loss64 = f64_ce(c.h, c.w, tg, IGNORE, c.n_norm, n_tok, dim, n_vocab, lse64);
    for (int t = 0; t < n_tok; t++)
        if (tg[t] == IGNORE) lse64[t] = 0; /* the contract: 0 for ignored tokens */
    fd_grad(ce_obj, &c, c.h, n_tok * dim, gh);
    fd_grad(ce_obj, &c, c.w, n_vocab * dim, gw);
    const int cfgs[] = {-1, 2};
    for (int k = 0; k < 2; k++) {
        int cfg = cfgs[k];
        poison(dh, n_tok * dim);
        poison(lse, n_tok);
        memcpy(dw, dwb, (size_t)(n_vocab * dim) * 4);
        /* n_norm <= 0: this call's count */
        double loss = ce_run(cfg, h, w, tg, 0, lse, dh, dw, n_tok, dim, n_vocab);
        const char *who = cfg < 0 ? "ce" : "ce_cpu";
        CHECK(fabs(loss - loss64) <= 1e-6 * fabs(loss64), "%s loss %.9g vs fp64 %.9g", who, loss, loss64);
        char what[64];
        snprintf(what, sizeof what, "%s dh", who);
        check_grad(what, dh, NULL, gh, n_tok * dim);
        snprintf(what, sizeof what, "%s dw (+=)", who);
        check_grad(what, dw, dwb, gw, n_vocab * dim);
        snprintf(what, sizeof what, "%s lse", who);
        check_fwd(what, lse, lse64, n_tok);
        /* an explicit normalizer twice the count halves loss and gradients */
        poison(dh, n_tok * dim);
        memset(dw, 0, (size_t)(n_vocab * dim) * 4);
        double half = ce_run(cfg, h, w, tg, 2.0 * (double)n_valid, NULL, dh, dw, n_tok, dim, n_vocab);
        double *gh2 = dnew(n_tok * dim);
        for (int64_t i = 0; i < n_tok * dim; i++) gh2[i] = 0.5 * gh[i];
        CHECK(fabs(half - 0.5 * loss64) <= 1e-6 * fabs(loss64), "%s n_norm: loss %.9g", who, half);
        snprintf(what, sizeof what, "%s dh (n_norm)", who);
        check_grad(what, dh, NULL, gh2, n_tok * dim);
        free(gh2);
        /* every target ignored: loss 0, gradients 0 */
        const int32_t all_ignored[7] = {IGNORE, IGNORE, IGNORE, IGNORE, IGNORE, IGNORE, IGNORE};
        memcpy(dw, dwb, (size_t)(n_vocab * dim) * 4);
        poison(dh, n_tok * dim);
        double zero = ce_run(cfg, h, w, all_ignored, 0, NULL, dh, dw, n_tok, dim, n_vocab);
        bool dh_zero = true;
        for (int64_t i = 0; i < n_tok * dim; i++) dh_zero &= dh[i] == 0.0f;
        CHECK(zero == 0.0 && dh_zero && same_bits(dw, dwb, n_vocab * dim),
              "%s with every target ignored: loss %g, gradients not zero/untouched", who, zero);
    }
    const int32_t bad[3] = {1, 23, IGNORE};
    CHECK(nstf_ce_count(bad, 3, n_vocab, IGNORE, &n_valid) == NSTF_ERR_RANGE,
          "ce_count accepted a target past the vocabulary");
    free(c.h); free(c.w); free(lse64); free(gh); free(gw);
    free(h); free(w); free(lse); free(dh); free(dw); free(dwb);
}

/* Two token blocks (more than NSTF_CE_TOK valid tokens), three vocabulary
 * chunks (the last partial); fast vs reference, bitwise across pools. */
static void test_ce_fast(test_rng *r) {
    const int64_t n_tok = 300, dim = 24, n_vocab = 2 * NSTF_CE_VOCAB + 52;
    int32_t *tg = malloc(n_tok * sizeof *tg);
    for (int64_t t = 0; t < n_tok; t++)
        tg[t] = rng_next(r) % 10 == 0 ? IGNORE : (int32_t)(rng_next(r) % n_vocab);
    tg[0] = 0;
    tg[1] = (int32_t)n_vocab - 1;
    int64_t n_valid = 0;
    CHECK(nstf_ce_count(tg, n_tok, n_vocab, IGNORE, &n_valid) == NSTF_OK && n_valid > NSTF_CE_TOK,
          "ce fast: %lld valid targets, want > %d", (long long)n_valid, NSTF_CE_TOK);
    float *h = fnew(n_tok * dim), *w = fnew(n_vocab * dim), *dwb = fnew(n_vocab * dim);
    float *rh = fnew(n_tok * dim), *rw = fnew(n_vocab * dim), *rl = fnew(n_tok);
    fill_normal(r, h, n_tok * dim, 1.0f);
    fill_normal(r, w, n_vocab * dim, 0.5f);
    fill_normal(r, dwb, n_vocab * dim, 1e-4f);
    memcpy(rw, dwb, (size_t)(n_vocab * dim) * 4);
    double rloss = ce_run(-1, h, w, tg, 0, rl, rh, rw, n_tok, dim, n_vocab);
    double *wh = to_d(rh, n_tok * dim), *wl = to_d(rl, n_tok), *ww = dnew(n_vocab * dim);
    for (int64_t i = 0; i < n_vocab * dim; i++) ww[i] = (double)rw[i] - dwb[i];
    float *dh[N_CFG], *dw[N_CFG], *lse[N_CFG];
    double loss[N_CFG];
    char what[64];
    for (int cfg = 0; cfg < N_CFG; cfg++) {
        dh[cfg] = fnew(n_tok * dim);
        dw[cfg] = fnew(n_vocab * dim);
        lse[cfg] = fnew(n_tok);
        memcpy(dw[cfg], dwb, (size_t)(n_vocab * dim) * 4);
        loss[cfg] = ce_run(cfg, h, w, tg, 0, lse[cfg], dh[cfg], dw[cfg], n_tok, dim, n_vocab);
        snprintf(what, sizeof what, "ce_cpu vs ref cfg %d", cfg);
        CHECK(fabs(loss[cfg] - rloss) <= 1e-6 * rloss, "%s: loss %.9g vs %.9g", what, loss[cfg], rloss);
        check_grad(what, dh[cfg], NULL, wh, n_tok * dim);
        check_grad(what, dw[cfg], dwb, ww, n_vocab * dim);
        check_fwd(what, lse[cfg], wl, n_tok);
        CHECK(loss[cfg] == loss[0] && same_bits(dh[cfg], dh[0], n_tok * dim) &&
                  same_bits(dw[cfg], dw[0], n_vocab * dim) && same_bits(lse[cfg], lse[0], n_tok),
              "ce_cpu: pool config %d differs from config 0", cfg);
    }
    for (int cfg = 0; cfg < N_CFG; cfg++) { free(dh[cfg]); free(dw[cfg]); free(lse[cfg]); }
    free(tg); free(h); free(w); free(dwb); free(rh); free(rw); free(rl); free(wh); free(wl); free(ww);
}

/* ---- optimizer ------------------------------------------------------------------ */

static void test_adamw_closed_form(void) {
    const nstf_adamw_params p = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                                 .weight_decay = 0.1};
    const float w0[5] = {0.5f, -1.25f, 2.0f, 0.75f, -0.3f};
    const float g[5] = {0.3f, -2.0f, 1e-9f, -4e-8f, 7.0f}; /* the small ones feel eps */
    const nstf_param_tensor t[2] = {{"decayed", 0, 3, true}, {"not_decayed", 3, 2, false}};
    const int T = 6;
    for (int path = 0; path < 2; path++) { /* reference, fused */
        float w[5], m[5] = {0}, v[5] = {0};
        memcpy(w, w0, sizeof w);
        for (int s = 1; s <= T; s++) {
            if (path == 0) {
                nstf_ref_adamw(&p, s, 1.0f, true, w, g, m, v, 3);
                nstf_ref_adamw(&p, s, 1.0f, false, w + 3, g + 3, m + 3, v + 3, 2);
            } else {
                nstf_cpu_adamw(&g_cpu[2], &p, s, 1.0f, t, 2, w, g, m, v);
            }
        }
        for (int i = 0; i < 5; i++) {
            double a = i < 3 ? 1.0 - p.lr * p.weight_decay : 1.0;
            double c = p.lr * g[i] / (fabs((double)g[i]) + p.eps);
            double want = a == 1.0 ? w0[i] - T * c : pow(a, T) * w0[i] - c * (1 - pow(a, T)) / (1 - a);
            CHECK(fabs(w[i] - want) <= 4e-7 * fmax(1.0, fabs(want)),
                  "adamw closed form (%s) element %d: %.9g, want %.9g", path ? "fused" : "ref", i,
                  w[i], want);
        }
    }
}

/* tests/data/adamw_torch_ref.txt: "key count v1 v2 ..." lines */
static char *g_ref_text;

static int ref_get(const char *key, double *out, int n) {
    size_t kl = strlen(key);
    for (const char *l = g_ref_text; l && *l;) {
        if (!strncmp(l, key, kl) && l[kl] == ' ') {
            char *e;
            if (strtol(l + kl, &e, 10) != n) return 0;
            for (int i = 0; i < n; i++) out[i] = strtod(e, &e);
            return 1;
        }
        l = strchr(l, '\n');
        if (l) l++;
    }
    return 0;
}

/* |got - want| <= tol * max |want| over the array */
static void check_rel(const char *what, const float *got, const double *want, int n, double tol) {
    double scale = 0;
    for (int i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (int i = 0; i < n; i++)
        CHECK(fabs(got[i] - want[i]) <= tol * scale, "%s[%d]: %.9g vs torch %.9g", what, i,
              got[i], want[i]);
}

static void test_adamw_torch(void) {
    FILE *f = fopen(NSTF_SOURCE_DIR "/tests/data/adamw_torch_ref.txt", "rb");
    CHECK(f != NULL, "tests/data/adamw_torch_ref.txt is missing");
    if (!f) return;
    g_ref_text = calloc(1 << 16, 1);
    size_t got = fread(g_ref_text, 1, (1 << 16) - 1, f);
    fclose(f);
    CHECK(got > 0, "empty reference file");
    enum { NM = 15, NV = 7, N = NM + NV };
    double hp[9], d[N];
    CHECK(ref_get("hparams", hp, 9), "hparams");
    nstf_adamw_params p = {.beta1 = hp[4], .beta2 = hp[5], .eps = hp[6], .weight_decay = hp[7]};
    nstf_lr_schedule sched = {hp[0], hp[1], (int64_t)hp[2], (int64_t)hp[3]};
    const nstf_param_tensor t[2] = {{"mat", 0, NM, true}, {"vec", NM, NV, false}};
    float w[N], g[N], m[N] = {0}, v[N] = {0};
    CHECK(ref_get("w0.mat", d, NM) && ref_get("w0.vec", d + NM, NV), "w0");
    for (int i = 0; i < N; i++) w[i] = (float)d[i];
    int steps = 0;
    for (int s = 1;; s++) {
        char k1[32], k2[32];
        snprintf(k1, sizeof k1, "grad.%d.mat", s);
        snprintf(k2, sizeof k2, "grad.%d.vec", s);
        if (!ref_get(k1, d, NM) || !ref_get(k2, d + NM, NV)) break;
        steps++;
        for (int i = 0; i < N; i++) g[i] = (float)d[i];
        double norm, sq[2], want;
        CHECK(nstf_cpu_grad_norm(&g_cpu[1], t, 2, g, sq, &norm) == NSTF_OK, "grad norm");
        snprintf(k1, sizeof k1, "norm.%d", s);
        CHECK(ref_get(k1, &want, 1) && fabs(norm - want) <= 1e-6 * want, "step %d norm %.9g vs torch %.9g", s, norm, want);
        p.lr = nstf_lr_cosine(&sched, s - 1);
        snprintf(k1, sizeof k1, "lr.%d", s);
        CHECK(ref_get(k1, &want, 1) && fabs(p.lr - want) <= 1e-12, "step %d lr %.9g vs %.9g", s, p.lr, want);
        nstf_cpu_adamw(&g_cpu[2], &p, s, nstf_clip_scale(norm, hp[8]), t, 2, w, g, m, v);
        const char *names[3] = {"w", "m", "v"};
        const float *arrs[3] = {w, m, v};
        for (int a = 0; a < 3; a++) {
            snprintf(k1, sizeof k1, "%s.%d.mat", names[a], s);
            snprintf(k2, sizeof k2, "%s.%d.vec", names[a], s);
            CHECK(ref_get(k1, d, NM) && ref_get(k2, d + NM, NV), "%s missing", k1);
            snprintf(k1, sizeof k1, "adamw vs torch step %d %s", s, names[a]);
            check_rel(k1, arrs[a], d, NM, 1e-6);
            check_rel(k1, arrs[a] + NM, d + NM, NV, 1e-6);
        }
    }
    CHECK(steps == 4, "reference file holds %d steps, expected 4", steps);
    free(g_ref_text);
}

static void test_adamw_fused(test_rng *r) {
    const nstf_param_tensor t[3] = {{"a", 0, 4099, true}, {"b", 4099, 31, false}, {"c", 4130, 20001, true}};
    const int64_t n = 24131;
    const nstf_adamw_params p = {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                                 .weight_decay = 0.01};
    float *w0 = fnew(n), *g = fnew(n), *m0 = fnew(n), *v0 = fnew(n);
    fill_normal(r, w0, n, 1.0f);
    fill_normal(r, g, n, 1.0f);
    fill_normal(r, m0, n, 0.1f);
    for (int64_t i = 0; i < n; i++) v0[i] = 0.01f * fabsf(rng_normal(r));
    float *rw = fnew(n), *rm = fnew(n), *rv = fnew(n);
    memcpy(rw, w0, (size_t)n * 4); memcpy(rm, m0, (size_t)n * 4); memcpy(rv, v0, (size_t)n * 4);
    for (int i = 0; i < 3; i++)
        nstf_ref_adamw(&p, 7, 0.5f, t[i].decay, rw + t[i].offset, g + t[i].offset,
                       rm + t[i].offset, rv + t[i].offset, t[i].n);
    double *dw = to_d(rw, n), *dm = to_d(rm, n), *dv = to_d(rv, n);
    float *w[N_CFG], *m[N_CFG], *v[N_CFG];
    for (int cfg = 0; cfg < N_CFG; cfg++) {
        w[cfg] = fnew(n); m[cfg] = fnew(n); v[cfg] = fnew(n);
        memcpy(w[cfg], w0, (size_t)n * 4); memcpy(m[cfg], m0, (size_t)n * 4); memcpy(v[cfg], v0, (size_t)n * 4);
        nstf_cpu_adamw(&g_cpu[cfg], &p, 7, 0.5f, t, 3, w[cfg], g, m[cfg], v[cfg]);
        /* fp32 steps vs the once-rounded double step: 2 ulp of the weight
         * (two roundings) plus 1e-6 of the update */
        int64_t n_bad = 0;
        for (int64_t i = 0; i < n; i++) {
            double u = dw[i] - w0[i], e = (double)w[cfg][i] - dw[i];
            n_bad += !(fabs(e) <= 2 * FLT_EPSILON * fabs(dw[i]) + 1e-6 * fabs(u));
        }
        CHECK(n_bad == 0, "adamw_cpu cfg %d: %lld weights off the reference", cfg, (long long)n_bad);
        check_fwd("adamw_cpu m", m[cfg], dm, n);
        check_fwd("adamw_cpu v", v[cfg], dv, n);
        CHECK(same_bits(w[cfg], w[0], n) && same_bits(m[cfg], m[0], n) && same_bits(v[cfg], v[0], n),
              "adamw_cpu: pool config %d differs", cfg);
    }
    for (int cfg = 0; cfg < N_CFG; cfg++) { free(w[cfg]); free(m[cfg]); free(v[cfg]); }
    free(w0); free(g); free(m0); free(v0); free(rw); free(rm); free(rv); free(dw); free(dm); free(dv);
}

static void test_grad_norm(test_rng *r) {
    const nstf_param_tensor t[3] = {{"tok_embd.weight", 0, 1000, true},
                                    {"blk.0.attn_norm.weight", 1000, 17, false},
                                    {"blk.0.ffn_up.weight", 1017, 3001, true}};
    const int64_t n = 4018;
    float *g = fnew(n);
    fill_normal(r, g, n, 1.0f);
    double want = 0;
    for (int64_t i = 0; i < n; i++) want += (double)g[i] * g[i];
    want = sqrt(want);
    for (int cfg = 0; cfg < N_CFG; cfg++) {
        double sq[3], norm = 0, norm1 = 0;
        CHECK(nstf_cpu_grad_norm(&g_cpu[cfg], t, 3, g, sq, &norm) == NSTF_OK, "grad norm failed");
        CHECK(nstf_cpu_grad_norm(&g_cpu[cfg], t, 3, g, NULL, &norm1) == NSTF_OK && norm1 == norm,
              "grad norm without sq: %.17g vs %.17g", norm1, norm);
        CHECK(fabs(norm - want) <= 1e-12 * want, "grad norm %.17g, want %.17g", norm, want);
    }
    CHECK(fabsf(nstf_clip_scale(want, 1.0) - (float)(1.0 / (want + 1e-6))) <= 1e-7f, "clip scale");
    CHECK(nstf_clip_scale(0.5, 1.0) == 1.0f && nstf_clip_scale(5.0, 0.0) == 1.0f, "clip scale (no clip)");
    const struct { int64_t at; float val; const char *name, *what; } bad[] = {
        {1005, NAN, "blk.0.attn_norm.weight", "element 5 is nan"},
        {1017 + 100, INFINITY, "blk.0.ffn_up.weight", "element 100 is inf"},
        {0, -INFINITY, "tok_embd.weight", "element 0 is -inf"},
    };
    const int64_t later = 3500; /* a second NaN further on: the first tensor is named */
    float save_later = g[later];
    for (int b = 0; b < COUNT(bad); b++) {
        float save = g[bad[b].at];
        g[bad[b].at] = bad[b].val;
        g[later] = NAN;
        double sq[3], norm = 0;
        nstf_status s = nstf_cpu_grad_norm(&g_cpu[2], t, 3, g, b == 1 ? NULL : sq, &norm);
        const char *msg = nstf_last_error();
        CHECK(s == NSTF_ERR_RANGE && isnan(norm) && strstr(msg, bad[b].name) && strstr(msg, bad[b].what),
              "non-finite gradient %d: status %d, message '%s'", b, (int)s, msg);
        g[bad[b].at] = save;
        g[later] = save_later;
    }
    free(g);
}

static void test_schedule(void) {
    const nstf_lr_schedule s = {1e-3, 1e-4, 10, 110};
    CHECK(fabs(nstf_lr_cosine(&s, 0) - 1e-4) < 1e-15, "warm-up step 0: %g", nstf_lr_cosine(&s, 0));
    CHECK(fabs(nstf_lr_cosine(&s, 4) - 5e-4) < 1e-15, "warm-up step 4");
    CHECK(fabs(nstf_lr_cosine(&s, 9) - 1e-3) < 1e-15, "warm-up end");
    CHECK(fabs(nstf_lr_cosine(&s, 10) - 1e-3) < 1e-15, "cosine start");
    CHECK(fabs(nstf_lr_cosine(&s, 60) - 5.5e-4) < 1e-15, "cosine midpoint: %.17g", nstf_lr_cosine(&s, 60));
    CHECK(fabs(nstf_lr_cosine(&s, 35) - (1e-4 + 9e-4 * (1 + sqrt(0.5)) / 2)) < 1e-15, "cosine quarter");
    CHECK(nstf_lr_cosine(&s, 110) == 1e-4 && nstf_lr_cosine(&s, 1000) == 1e-4, "floor after total");
    for (int64_t k = 10; k < 110; k++)
        CHECK(nstf_lr_cosine(&s, k + 1) <= nstf_lr_cosine(&s, k), "cosine not decreasing at %lld", (long long)k);
}

int main(void) {
    nstf_pool *pools[N_CFG] = {NULL};
    for (int i = 1; i < N_CFG; i++) {
        if (nstf_pool_create(i, &pools[i]) != NSTF_OK) {
            fprintf(stderr, "pool: %s\n", nstf_last_error());
            return 1;
        }
        g_cpu[i].pool = pools[i];
    }
    test_rng r = {0x5eed1234abcdull};
    test_embedding(&r);
    test_rmsnorm(&r);
    test_rope(&r);
    test_attention_fd(&r);
    test_attention_fast(&r);
    test_swiglu(&r);
    test_matmul_fd(&r);
    test_matmul_fast(&r);
    test_light_fast(&r);
    test_ce_fd(&r);
    test_ce_fast(&r);
    test_adamw_closed_form();
    test_adamw_torch();
    test_adamw_fused(&r);
    test_grad_norm(&r);
    test_schedule();
    for (int i = 0; i < COUNT(g_worst) && g_worst[i].op[0]; i++)
        printf("  worst NMSE %-16s %.3g\n", g_worst[i].op, g_worst[i].worst);
    for (int i = 1; i < N_CFG; i++) nstf_pool_free(pools[i]);
    return test_finish("test_backward_cpu");
}
