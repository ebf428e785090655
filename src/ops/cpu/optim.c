/* optim.c — the optimizer step (optim.h): AdamW as one fused, threaded
 * pass over the flat parameter arrays; the global gradient norm with
 * NaN/Inf detection; clipping; the cosine schedule. The references are in
 * optim_ref.c. */
#include <math.h>
#include <stdatomic.h>

#include "ops/cpu/cpu_internal.h"
#include "ops/optim.h"

/* ---- AdamW ------------------------------------------------------------------ */

/* The per-step scalars, formed in double as torch does with Python floats. */
typedef struct {
    double decay_mul;  /* 1 - lr * weight_decay */
    double one_m_b1;   /* 1 - beta1: torch lerp_(grad, 1 - beta1) */
    double beta2, one_m_b2;
    double step_size;  /* lr / (1 - beta1^step) */
    double bc2_sqrt;   /* sqrt(1 - beta2^step) */
    double eps;
} adamw_k;

static adamw_k adamw_consts(const nstf_adamw_params *p, int64_t step) {
    adamw_k k = {1.0 - p->lr * p->weight_decay,
                 1.0 - p->beta1,
                 p->beta2,
                 1.0 - p->beta2,
                 p->lr / (1.0 - pow(p->beta1, (double)step)),
                 sqrt(1.0 - pow(p->beta2, (double)step)),
                 p->eps};
    return k;
}

typedef struct {
    adamw_k k;
    float grad_scale;
    const nstf_param_tensor *t;
    int n_t;
    int64_t n_total; /* elements covered by the table */
    float *w, *m, *v;
    const float *g;
} adamw_ctx;

/* fp32, in the order of torch's single-tensor AdamW:
 *   param.mul_(1 - lr wd); exp_avg.lerp_(g, 1 - beta1);
 *   exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2);
 *   denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps);
 *   param.addcdiv_(exp_avg, denom, value=-step_size) */
static void adamw_range(const adamw_ctx *c, bool decay, int64_t i0, int64_t i1) {
    const float dm = (float)c->k.decay_mul, a1 = (float)c->k.one_m_b1, b2 = (float)c->k.beta2,
                a2 = (float)c->k.one_m_b2, bc2 = (float)c->k.bc2_sqrt, eps = (float)c->k.eps,
                step = (float)-c->k.step_size, gs = c->grad_scale;
    float *w = c->w, *m = c->m, *v = c->v;
    const float *grad = c->g;
    for (int64_t i = i0; i < i1; i++) {
        float g = grad[i] * gs;
        float wi = decay ? w[i] * dm : w[i];
        float mi = m[i] + a1 * (g - m[i]);
        float vi = v[i] * b2 + a2 * g * g;
        float den = sqrtf(vi) / bc2 + eps;
        w[i] = wi + step * mi / den;
        m[i] = mi;
        v[i] = vi;
    }
}

/* Each thread takes a contiguous run of the concatenated tensors. */
static void adamw_fn(void *p, int ith, int nth) {
    const adamw_ctx *c = p;
    int64_t lo, hi, base = 0;
    nstf_split_range(c->n_total, 64, ith, nth, &lo, &hi);
    for (int i = 0; i < c->n_t && base < hi; i++) {
        const nstf_param_tensor *t = &c->t[i];
        int64_t a = lo > base ? lo - base : 0, b = hi - base < t->n ? hi - base : t->n;
        if (a < b) adamw_range(c, t->decay, t->offset + a, t->offset + b);
        base += t->n;
    }
}

void nstf_cpu_adamw(nstf_cpu *cpu, const nstf_adamw_params *p, int64_t step, float grad_scale,
                    const nstf_param_tensor *tensors /* [n_tensors] */, int n_tensors,
                    float *w, const float *grad, float *m, float *v) {
    adamw_ctx c = {adamw_consts(p, step), grad_scale, tensors, n_tensors, 0, w, m, v, grad};
    for (int i = 0; i < n_tensors; i++) c.n_total += tensors[i].n;
    cpu_run(cpu, adamw_fn, &c, 16 * c.n_total, c.n_total / 64);
}

/* ---- gradient norm, clipping ---------------------------------------------------- */

/* sum of g^2 in double, four running sums in a fixed order */
static double sum_sq(const float *g, int64_t n) {
    double s[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) s[j] += (double)g[i + j] * g[i + j];
    for (; i < n; i++) s[0] += (double)g[i] * g[i];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

typedef struct {
    const nstf_param_tensor *t;
    int n_t;
    const float *g;
    double *sq;
    atomic_int next;
} norm_ctx;

static void norm_fn(void *p, int ith, int nth) {
    norm_ctx *c = p;
    for (;;) {
        int i = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
        if (i >= c->n_t) break;
        c->sq[i] = sum_sq(c->g + c->t[i].offset, c->t[i].n);
    }
    (void)ith;
    (void)nth;
}

nstf_status nstf_cpu_grad_norm(nstf_cpu *cpu, const nstf_param_tensor *tensors, int n_tensors,
                               const float *grad, double *sq /* [n_tensors] or NULL */,
                               double *norm) {
    double total = 0;
    int bad = -1;
    if (sq) {
        norm_ctx c = {tensors, n_tensors, grad, sq, 0};
        int64_t n_total = 0;
        for (int i = 0; i < n_tensors; i++) n_total += tensors[i].n;
        atomic_init(&c.next, 0);
        cpu_run(cpu, norm_fn, &c, n_total, n_tensors);
    }
    for (int i = 0; i < n_tensors; i++) {
        double s = sq ? sq[i] : sum_sq(grad + tensors[i].offset, tensors[i].n);
        if (!isfinite(s) && bad < 0) bad = i;
        total += s;
    }
    *norm = sqrt(total);
    if (bad < 0) return NSTF_OK;
    *norm = NAN;
    const nstf_param_tensor *t = &tensors[bad];
    int64_t at = 0;
    while (at < t->n && isfinite(grad[t->offset + at])) at++;
    float x = at < t->n ? grad[t->offset + at] : NAN; /* at == n: the sum itself overflowed */
    return nstf_set_error(NSTF_ERR_RANGE, "gradient of %s is not finite: element %lld is %s",
                          t->name ? t->name : "(unnamed tensor)", (long long)at,
                          isnan(x) ? "nan" : x > 0 ? "inf" : "-inf");
}

float nstf_clip_scale(double norm, double max_norm) {
    if (max_norm <= 0) return 1.0f;
    double c = max_norm / (norm + 1e-6);
    return c < 1.0 ? (float)c : 1.0f;
}

/* ---- schedule ------------------------------------------------------------------- */

double nstf_lr_cosine(const nstf_lr_schedule *s, int64_t step) {
    if (step < s->warmup) return s->lr_max * (double)(step + 1) / (double)s->warmup;
    if (step >= s->total) return s->lr_min;
    double r = (double)(step - s->warmup) / (double)(s->total - s->warmup);
    return s->lr_min + (s->lr_max - s->lr_min) * 0.5 * (1.0 + cos(3.14159265358979323846 * r));
}
