/* test_sampler.c — the sampler (src/model/sampler.c) against a reference
 * chain written here in plain double-precision code with llama.cpp's
 * semantics (src/llama-sampling.cpp: penalties -> top_k -> top_p -> min_p ->
 * temp -> dist):
 *   - repetition penalty over the last repeat_last_n accepted tokens, once
 *     per distinct token: a positive logit is divided by the penalty, any
 *     other multiplied (the result is a float logit, as in llama.cpp);
 *   - top-k keeps the k best (k <= 0 or k >= vocab: all); candidates are
 *     ordered by logit, the lower id first among equal logits;
 *   - top-p keeps the shortest prefix whose probability (softmax over the
 *     top-k candidates, untempered) sums to >= top_p (1: off);
 *   - min-p keeps p_i >= min_p * p_max, i.e. l_i >= l_max + log(min_p) (0: off);
 *   - temperature divides the kept logits; the draw follows softmax(l / T);
 *   - temp <= 0 is greedy: the first maximum of the penalised logits.
 *
 * Checks and metrics:
 *   1. Candidate sets, their order and draw weights (nstf_sampler_candidates)
 *      on crafted logits (ties, k > vocab, p = 1, min_p = 0, equal logits,
 *      top-p over the renormalised top-k, filters judged before the
 *      temperature), each with the hand-derived answer too, and on 3000
 *      random cases (logits on a 0.25 grid, so ties are common). Sets and
 *      order: exact. Weights: |log(w / w_ref)| <= 1e-5 (float exp and the
 *      division by T carry a few 1e-7 relative).
 *   2. The draw, as distributions: counts of 40000 draws (first draws of
 *      40000 seeds, or one seed's stream) against the reference
 *      probabilities by Pearson's chi-square. A case fails if its p-value
 *      is below 1e-6, so a correct sampler fails a case with probability
 *      1e-6 (chi-square approximation; every expected count here is >= 100),
 *      and the 5 cases together with probability <= 5e-6. A token outside
 *      the reference's set drawn even once fails. The same counts judged
 *      against the distribution at a temperature 10% off must be rejected:
 *      the bound has the power to see a temperature error of that size
 *      (tried: a draw that moves 0.3% of the mass from the last candidate
 *      to the others fails two cases).
 *   3. Repetition penalty: penalised logits recovered from the weights
 *      (T = 1, no filters), window, duplicates, negative and zero logits,
 *      out-of-range ids, repeat_last_n = 0.
 *   4. Seeds: the same seed gives the same tokens; two seeds give different
 *      sequences (probability of a false failure < 1e-60, computed below);
 *      the generator's uniforms lie in [0, 1) with mean 1/2 within 6 sigma.
 *   5. Greedy is the first maximum, with and without a penalty. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/sampler.h"
#include "test_util.h"

#define MAXV 256
#define N_DRAWS 40000
#define MIN_PVALUE 1e-6
#define WEIGHT_TOL 1e-5
/* a top-p or min-p decision this close (relative) to its threshold could go
 * either way in float: random cases that meet one are not compared */
#define AMBIGUOUS 1e-5

/* ---- the reference ---------------------------------------------------------- */

typedef struct {
    int n;               /* candidates kept */
    int32_t id[MAXV];    /* their ids, in candidate order */
    double prob[MAXV];   /* their draw probabilities (sum 1) */
    double logit[MAXV];  /* penalised logits, by id */
    bool ambiguous;      /* a threshold decision within AMBIGUOUS of its boundary */
} ref_out;

static void ref_chain(const float *logits, int n, const nstf_sampler_params *p, const int32_t *hist, int n_hist,
                      ref_out *o) {
    double *l = o->logit;
    o->ambiguous = false;
    for (int i = 0; i < n; i++) l[i] = logits[i];
    if (p->repeat_penalty != 1.0f && p->repeat_last_n > 0) {
        bool pen[MAXV] = {false};
        for (int i = n_hist > p->repeat_last_n ? n_hist - p->repeat_last_n : 0; i < n_hist; i++)
            if (hist[i] >= 0 && hist[i] < n) pen[hist[i]] = true;
        for (int t = 0; t < n; t++)
            if (pen[t]) l[t] = (float)(l[t] > 0 ? l[t] / p->repeat_penalty : l[t] * p->repeat_penalty);
    }
    if (p->temp <= 0.0f) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (l[i] > l[best]) best = i;
        o->n = 1;
        o->id[0] = best;
        o->prob[0] = 1;
        return;
    }
    int32_t *id = o->id;
    for (int i = 0; i < n; i++) { /* insertion sort: logit descending, stable in id */
        int j = i;
        while (j > 0 && l[id[j - 1]] < l[i]) { id[j] = id[j - 1]; j--; }
        id[j] = i;
    }
    int k = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    const double mx = l[id[0]];
    if (p->top_p < 1.0f) {
        double z = 0, cum = 0;
        for (int i = 0; i < k; i++) z += exp(l[id[i]] - mx);
        for (int i = 0; i < k; i++) {
            cum += exp(l[id[i]] - mx) / z;
            if (fabs(cum - p->top_p) <= AMBIGUOUS * p->top_p) o->ambiguous = true;
            if (cum >= p->top_p) { k = i + 1; break; }
        }
    }
    if (p->min_p > 0.0f) {
        int keep = 1;
        for (; keep < k; keep++) {
            double r = exp(l[id[keep]] - mx);
            if (fabs(r - p->min_p) <= AMBIGUOUS * p->min_p) o->ambiguous = true;
            if (r < p->min_p) break;
        }
        k = keep;
    }
    double z = 0;
    for (int i = 0; i < k; i++) z += o->prob[i] = exp((l[id[i]] - mx) / p->temp);
    for (int i = 0; i < k; i++) o->prob[i] /= z;
    o->n = k;
}

/* ---- helpers ---------------------------------------------------------------- */

static nstf_sampler_params params(float temp, int top_k, float top_p, float min_p) {
    nstf_sampler_params p = nstf_sampler_default_params();
    p.temp = temp;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    return p;
}

static bool open_sampler(nstf_sampler *s, const nstf_sampler_params *p, int n, const int32_t *hist, int n_hist) {
    if (nstf_sampler_init(s, p, n) != NSTF_OK) {
        CHECK(0, "sampler init: %s", nstf_last_error());
        return false;
    }
    for (int i = 0; i < n_hist; i++) nstf_sampler_accept(s, hist[i]);
    return true;
}

static void print_ids(const char *what, const int32_t *id, int n) {
    fprintf(stderr, "  %s (%d):", what, n);
    for (int i = 0; i < n && i < 24; i++) fprintf(stderr, " %d", id[i]);
    fputc('\n', stderr);
}

/* Ours against the reference (and against `want`, the hand-derived ids in
 * candidate order, when given). Returns false if the reference called the
 * case ambiguous (then nothing is compared). */
static bool check_candidates(const char *name, const float *logits, int n, const nstf_sampler_params *p,
                             const int32_t *hist, int n_hist, const int32_t *want, int n_want) {
    ref_out r;
    ref_chain(logits, n, p, hist, n_hist, &r);
    if (want) {
        bool ok = r.n == n_want && !memcmp(r.id, want, (size_t)n_want * sizeof *want);
        CHECK(ok, "%s: the reference disagrees with the hand-derived set", name);
        if (!ok) { print_ids("reference", r.id, r.n); print_ids("want", want, n_want); }
    }
    if (r.ambiguous && !want) return false;
    nstf_sampler s;
    if (!open_sampler(&s, p, n, hist, n_hist)) return true;
    int k = nstf_sampler_candidates(&s, logits);
    bool same = k == r.n && !memcmp(s.idx, r.id, (size_t)k * sizeof(int32_t));
    CHECK(same, "%s: candidates differ from the reference", name);
    if (!same) { print_ids("ours", s.idx, k); print_ids("reference", r.id, r.n); }
    if (same) {
        double z = 0, worst = 0;
        for (int i = 0; i < k; i++) z += s.val[i];
        for (int i = 0; i < k; i++) {
            double w = s.val[i] / z;
            double e = r.prob[i] < 1e-30 ? (w < 1e-30 ? 0 : INFINITY) : fabs(log(w / r.prob[i]));
            if (e > worst) worst = e;
        }
        CHECK(worst <= WEIGHT_TOL, "%s: draw weights off by %.3g in log (bound %.0e)", name, worst, WEIGHT_TOL);
    }
    nstf_sampler_free(&s);
    return true;
}

/* ---- 1. candidate sets -------------------------------------------------------- */

static void test_crafted_sets(void) {
    const float dist[6] = {0.5f, 3.0f, -1.0f, 2.0f, 1.0f, -4.0f}; /* order: 1 3 4 0 2 5 */
    const float ties[6] = {1.0f, 3.0f, 2.0f, 2.0f, 2.0f, 0.0f};   /* order: 1 2 3 4 0 5 */
    float equal[8], neg[5] = {-2.0f, -1e4f, -3.0f, -1e4f, -2.5f};
    for (int i = 0; i < 8; i++) equal[i] = 0.75f;
    /* probabilities 0.5 0.3 0.15 0.05 (as logits) */
    const float probs[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    nstf_sampler_params p;

    p = params(1, 3, 1, 0);
    check_candidates("top-k 3", dist, 6, &p, NULL, 0, (const int32_t[]){1, 3, 4}, 3);
    check_candidates("top-k 3 with ties at the boundary", ties, 6, &p, NULL, 0, (const int32_t[]){1, 2, 3}, 3);
    p.top_k = 1;
    check_candidates("top-k 1 with tied maxima", equal, 8, &p, NULL, 0, (const int32_t[]){0}, 1);
    p.top_k = 100;
    check_candidates("top-k larger than the vocabulary", dist, 6, &p, NULL, 0, (const int32_t[]){1, 3, 4, 0, 2, 5}, 6);
    p.top_k = 0;
    check_candidates("top-k 0 (off), ties ordered by id", ties, 6, &p, NULL, 0, (const int32_t[]){1, 2, 3, 4, 0, 5}, 6);
    p = params(1, 0, 1.0f, 0);
    check_candidates("top-p 1 and min-p 0 keep underflowing logits", neg, 5, &p, NULL, 0,
                     (const int32_t[]){0, 4, 2, 1, 3}, 5);
    /* equal logits: each 1/8; cumulative 0.25 at two, exactly (>= keeps 2) */
    p = params(1, 0, 0.25f, 0);
    check_candidates("top-p 0.25 of 8 equal logits", equal, 8, &p, NULL, 0, (const int32_t[]){0, 1}, 2);
    p.top_p = 0.3f;
    check_candidates("top-p 0.3 of 8 equal logits", equal, 8, &p, NULL, 0, (const int32_t[]){0, 1, 2}, 3);
    p = params(1, 0, 1, 0.9f);
    check_candidates("min-p 0.9 keeps all equal logits", equal, 8, &p, NULL, 0, (const int32_t[]){0, 1, 2, 3, 4, 5, 6, 7}, 8);
    /* 0.5 0.3 0.15 0.05: cumulative 0.5 0.8 0.95 1 */
    p = params(1, 0, 0.79f, 0);
    check_candidates("top-p 0.79", probs, 4, &p, NULL, 0, (const int32_t[]){0, 1}, 2);
    p.top_p = 0.81f;
    check_candidates("top-p 0.81", probs, 4, &p, NULL, 0, (const int32_t[]){0, 1, 2}, 3);
    /* top-p over the top-3 renormalised (0.526 0.316 0.158: 2 reach 0.83);
     * over the whole vocabulary it would take 3 */
    p = params(1, 3, 0.83f, 0);
    check_candidates("top-p after top-k renormalises", probs, 4, &p, NULL, 0, (const int32_t[]){0, 1}, 2);
    /* the filters judge the untempered distribution: top-p 0.9 takes 3;
     * tempered at T = 2 (0.38 0.29 0.21 0.12) it would take all 4 */
    p = params(2, 0, 0.9f, 0);
    check_candidates("top-p before the temperature", probs, 4, &p, NULL, 0, (const int32_t[]){0, 1, 2}, 3);
    /* min-p 0.2: keeps p >= 0.1; 0.35: p >= 0.175; at T = 3 min-p 0.2
     * still drops 0.05 (tempered, its ratio to the best would be
     * 0.1^(1/3) = 0.46 and it would stay) */
    p = params(1, 0, 1, 0.2f);
    check_candidates("min-p 0.2", probs, 4, &p, NULL, 0, (const int32_t[]){0, 1, 2}, 3);
    p.min_p = 0.35f;
    check_candidates("min-p 0.35", probs, 4, &p, NULL, 0, (const int32_t[]){0, 1}, 2);
    p = params(3, 0, 1, 0.2f);
    check_candidates("min-p before the temperature", probs, 4, &p, NULL, 0, (const int32_t[]){0, 1, 2}, 3);
    /* the whole chain, each filter deciding: top-k 5 of dist drops 5;
     * top-p 0.95 over the five (0.62 0.23 0.08 0.05 0.01) drops 2; min-p 0.1
     * drops 0 (e^-2.5 = 0.08 of the best) */
    p = params(0.7f, 5, 0.95f, 0.1f);
    check_candidates("top-k, top-p, min-p", dist, 6, &p, NULL, 0, (const int32_t[]){1, 3, 4}, 3);
    /* greedy ignores the filters */
    p = params(0, 1, 0.1f, 0.9f);
    check_candidates("greedy, first maximum", ties, 6, &p, NULL, 0, (const int32_t[]){1}, 1);
}

static void test_random_sets(void) {
    test_rng rng = {0x51A3C0FFEEull};
    int compared = 0, n_cases = 3000;
    for (int c = 0; c < n_cases; c++) {
        int n = 2 + (int)(rng_next(&rng) % 120);
        float lg[MAXV];
        for (int i = 0; i < n; i++) lg[i] = 0.25f * (float)((int)(rng_next(&rng) % 33) - 16); /* [-4, 4] */
        static const float temps[] = {0, 0.3f, 0.7f, 1, 1.5f, 3};
        static const float top_ps[] = {1, 1, 0.5f, 0.9f, 0.95f, 0.99f};
        static const float min_ps[] = {0, 0, 0.01f, 0.05f, 0.2f, 0.5f};
        nstf_sampler_params p = params(temps[rng_next(&rng) % 6], (int)(rng_next(&rng) % 50) - 5,
                                       top_ps[rng_next(&rng) % 6], min_ps[rng_next(&rng) % 6]);
        static const float pens[] = {1, 1.1f, 1.5f, 0.8f};
        p.repeat_penalty = pens[rng_next(&rng) % 4];
        p.repeat_last_n = (int)(rng_next(&rng) % 20);
        int32_t hist[64];
        int n_hist = (int)(rng_next(&rng) % 64);
        for (int i = 0; i < n_hist; i++) hist[i] = (int32_t)(rng_next(&rng) % (uint64_t)n);
        char name[192];
        snprintf(name, sizeof name, "random case %d (n %d, T %g, k %d, p %g, min-p %g, pen %g/%d)", c, n,
                 (double)p.temp, p.top_k, (double)p.top_p, (double)p.min_p, (double)p.repeat_penalty,
                 p.repeat_last_n);
        compared += check_candidates(name, lg, n, &p, hist, n_hist, NULL, 0);
    }
    printf("candidates: %d of %d random cases compared (the rest sit within %.0e of a top-p/min-p threshold)\n",
           compared, n_cases, AMBIGUOUS);
    CHECK(compared >= n_cases * 9 / 10, "only %d of %d random cases unambiguous", compared, n_cases);
}

/* ---- 2. the draw -------------------------------------------------------------- */

/* Regularised upper incomplete gamma Q(a, x): series below a + 1,
 * Lentz's continued fraction above (Numerical Recipes, 6.2). */
static double gamma_q(double a, double x) {
    if (x <= 0) return 1;
    const double lead = exp(-x + a * log(x) - lgamma(a));
    if (x < a + 1) {
        double ap = a, del = 1 / a, sum = del;
        for (int i = 0; i < 10000 && fabs(del) > fabs(sum) * 1e-16; i++) {
            ap += 1;
            del *= x / ap;
            sum += del;
        }
        return 1 - sum * lead;
    }
    double b = x + 1 - a, c = 1e300, d = 1 / b, h = d;
    for (int i = 1; i < 10000; i++) {
        double an = -i * (i - a);
        b += 2;
        d = an * d + b;
        if (fabs(d) < 1e-300) d = 1e-300;
        c = b + an / c;
        if (fabs(c) < 1e-300) c = 1e-300;
        d = 1 / d;
        h *= d * c;
        if (fabs(d * c - 1) < 1e-16) break;
    }
    return lead * h;
}

/* Pearson's chi-square of counts[n] against probabilities prob[n] (by id);
 * returns the p-value, 0 if a token of probability 0 was drawn. */
static double chi2_pvalue(const long *count, const double *prob, int n, long total, double *stat, int *df) {
    double x = 0;
    int cats = 0;
    for (int i = 0; i < n; i++) {
        if (prob[i] == 0) {
            if (count[i]) { *stat = INFINITY; *df = 0; return 0; }
            continue;
        }
        double e = prob[i] * (double)total;
        x += (count[i] - e) * (count[i] - e) / e;
        cats++;
    }
    *stat = x;
    *df = cats - 1;
    return cats > 1 ? gamma_q(0.5 * (cats - 1), 0.5 * x) : 1.0;
}

static void test_chi2_self(void) {
    /* df 2: Q(1, x/2) = exp(-x/2); df 10 at 23.209: 0.01 (tables); df 1 at
     * 3.841: 0.05; df 30 at 59.703: 0.001 */
    CHECK(fabs(gamma_q(1, 3) - exp(-3)) < 1e-14, "Q(1, 3) %.17g", gamma_q(1, 3));
    CHECK(fabs(gamma_q(5, 23.209 / 2) - 0.01) < 1e-5, "chi2 df 10: %.6g", gamma_q(5, 23.209 / 2));
    CHECK(fabs(gamma_q(0.5, 3.841 / 2) - 0.05) < 1e-4, "chi2 df 1: %.6g", gamma_q(0.5, 3.841 / 2));
    CHECK(fabs(gamma_q(15, 59.703 / 2) - 0.001) < 1e-6, "chi2 df 30: %.6g", gamma_q(15, 59.703 / 2));
}

/* N_DRAWS draws: the first draw of each of N_DRAWS seeds (fresh) or one
 * seed's stream; the sampler sees the same history each time. */
static void draw_counts(const float *lg, int n, nstf_sampler_params p, const int32_t *hist, int n_hist, bool fresh,
                        long *count) {
    memset(count, 0, (size_t)n * sizeof *count);
    nstf_sampler s;
    p.seed = 0x5EED;
    if (!fresh && !open_sampler(&s, &p, n, hist, n_hist)) return;
    for (long i = 0; i < N_DRAWS; i++) {
        if (fresh) {
            p.seed = (uint64_t)i;
            if (!open_sampler(&s, &p, n, hist, n_hist)) return;
        }
        int32_t t = nstf_sampler_sample(&s, lg);
        if (t >= 0 && t < n) count[t]++;
        if (fresh) nstf_sampler_free(&s);
    }
    if (!fresh) nstf_sampler_free(&s);
}

/* The reference probabilities by id. */
static void ref_probs(const float *lg, int n, const nstf_sampler_params *p, const int32_t *hist, int n_hist,
                      double *prob) {
    ref_out r;
    ref_chain(lg, n, p, hist, n_hist, &r);
    CHECK(!r.ambiguous, "a distribution case sits on a threshold");
    for (int i = 0; i < n; i++) prob[i] = 0;
    for (int i = 0; i < r.n; i++) prob[r.id[i]] = r.prob[i];
}

static void check_draws(const char *name, const float *lg, int n, nstf_sampler_params p, const int32_t *hist,
                        int n_hist, bool fresh) {
    long count[MAXV];
    double prob[MAXV], stat, min_e = 1e300;
    int df;
    ref_probs(lg, n, &p, hist, n_hist, prob);
    for (int i = 0; i < n; i++)
        if (prob[i] > 0 && prob[i] * N_DRAWS < min_e) min_e = prob[i] * N_DRAWS;
    CHECK(min_e >= 100, "%s: smallest expected count %.1f (the chi-square approximation wants >= 100 here)", name, min_e);
    draw_counts(lg, n, p, hist, n_hist, fresh, count);
    double pv = chi2_pvalue(count, prob, n, N_DRAWS, &stat, &df);
    /* the same counts against a temperature 10% higher must be rejected */
    nstf_sampler_params q = p;
    q.temp *= 1.1f;
    double prob_q[MAXV], stat_q;
    int df_q;
    ref_probs(lg, n, &q, hist, n_hist, prob_q);
    double pv_q = chi2_pvalue(count, prob_q, n, N_DRAWS, &stat_q, &df_q);
    printf("draws %-44s: chi2 %7.2f, df %2d, p-value %.3g (bound %.0e); against T x 1.1: chi2 %.1f, p %.2g\n", name,
           stat, df, pv, MIN_PVALUE, stat_q, pv_q);
    CHECK(pv >= MIN_PVALUE, "%s: draws do not follow the reference (chi2 %.2f, df %d, p %.3g)", name, stat, df, pv);
    CHECK(pv_q < MIN_PVALUE, "%s: the test cannot tell a temperature 10%% off (p %.3g)", name, pv_q);
}

static void test_draws(void) {
    test_rng rng = {0xD1CEull};
    float a[12], b[200];
    for (int i = 0; i < 12; i++) a[i] = 0.8f * rng_normal(&rng);
    for (int i = 0; i < 200; i++) b[i] = 2.0f * rng_normal(&rng);
    check_draws("T 0.7, no filters, first draws of seeds", a, 12, params(0.7f, 0, 1, 0), NULL, 0, true);
    check_draws("T 1.6, no filters, one stream", a, 12, params(1.6f, 0, 1, 0), NULL, 0, false);
    check_draws("defaults (T .8, k 40, p .95, min-p .05), seeds", b, 200, nstf_sampler_default_params(), NULL, 0, true);
    check_draws("T 1.5, top-k 5, one stream", b, 200, params(1.5f, 5, 1, 0), NULL, 0, false);
    nstf_sampler_params p = params(1.2f, 0, 0.9f, 0.02f);
    p.repeat_penalty = 1.3f;
    p.repeat_last_n = 8;
    const int32_t hist[] = {3, 5, 5, 7, 0, 1, 2, 9, 11, 4};
    check_draws("penalty 1.3 over 8, T 1.2, p .9, min-p .02", a, 12, p, hist, 10, true);
}

/* ---- 3. repetition penalty ------------------------------------------------------ */

/* The penalised logits, from the weights at T = 1 without filters:
 * log w_i = l'_i - max l'. */
static void check_penalty(const char *name, const float *lg, int n, float pen, int last_n, const int32_t *hist,
                          int n_hist, const float *want) {
    nstf_sampler_params p = params(1, 0, 1, 0);
    p.repeat_penalty = pen;
    p.repeat_last_n = last_n;
    ref_out r;
    ref_chain(lg, n, &p, hist, n_hist, &r);
    double mx = -INFINITY;
    for (int i = 0; i < n; i++) {
        CHECK(r.logit[i] == want[i], "%s: reference penalised logit %d is %g, want %g", name, i, r.logit[i],
              (double)want[i]);
        if (r.logit[i] > mx) mx = r.logit[i];
    }
    nstf_sampler s;
    if (!open_sampler(&s, &p, n, hist, n_hist)) return;
    int k = nstf_sampler_candidates(&s, lg);
    CHECK(k == n, "%s: %d candidates", name, k);
    double worst = 0;
    for (int i = 0; i < k; i++) {
        double e = fabs(log((double)s.val[i]) - (r.logit[s.idx[i]] - mx));
        if (e > worst) worst = e;
    }
    CHECK(worst <= WEIGHT_TOL, "%s: penalised logits off by %.3g (bound %.0e)", name, worst, WEIGHT_TOL);
    nstf_sampler_free(&s);
}

static void test_penalty(void) {
    const float lg[6] = {2.0f, -1.0f, 0.0f, 3.0f, -2.0f, 1.0f};
    /* window of 4 over 0 1 2 3 4 5 5: tokens 3 4 5 (5 twice, penalised once) */
    const int32_t h1[] = {0, 1, 2, 3, 4, 5, 5};
    check_penalty("window 4", lg, 6, 2.0f, 4, h1, 7, (const float[]){2.0f, -1.0f, 0.0f, 1.5f, -4.0f, 0.5f});
    check_penalty("window longer than the history", lg, 6, 2.0f, 64, h1, 7,
                  (const float[]){1.0f, -2.0f, 0.0f, 1.5f, -4.0f, 0.5f});
    check_penalty("repeat_last_n 0: off", lg, 6, 2.0f, 0, h1, 7, lg);
    check_penalty("penalty 1: off", lg, 6, 1.0f, 64, h1, 7, lg);
    /* ring wrap-around and ids outside the vocabulary (ignored) */
    const int32_t h2[] = {0, 0, 0, 1, 99, -3, 1, 0, 1};
    check_penalty("window 3 after wrap-around, ids out of range", lg, 6, 4.0f, 3, h2, 9,
                  (const float[]){0.5f, -4.0f, 0.0f, 3.0f, -2.0f, 1.0f});
    check_penalty("penalty below 1 raises", lg, 6, 0.5f, 64, (const int32_t[]){0, 1}, 2,
                  (const float[]){4.0f, -0.5f, 0.0f, 3.0f, -2.0f, 1.0f});
}

/* ---- 4. seeds and the generator ----------------------------------------------- */

static void test_seeds(void) {
    test_rng rng = {0xBEEFull};
    float lg[10];
    for (int i = 0; i < 10; i++) lg[i] = 0.5f * rng_normal(&rng);
    nstf_sampler_params p = params(1, 0, 1, 0);
    /* P(two independent 200-token sequences are equal) = (sum p_i^2)^200 */
    ref_out r;
    ref_chain(lg, 10, &p, NULL, 0, &r);
    double coll = 0;
    for (int i = 0; i < r.n; i++) coll += r.prob[i] * r.prob[i];
    const double p_false = pow(coll, 200);
    int32_t seq[3][200];
    const uint64_t seeds[3] = {42, 42, 43};
    for (int k = 0; k < 3; k++) {
        p.seed = seeds[k];
        nstf_sampler s;
        if (!open_sampler(&s, &p, 10, NULL, 0)) return;
        for (int i = 0; i < 200; i++) nstf_sampler_accept(&s, seq[k][i] = nstf_sampler_sample(&s, lg));
        nstf_sampler_free(&s);
    }
    CHECK(!memcmp(seq[0], seq[1], sizeof seq[0]), "seed 42 twice: different tokens");
    CHECK(memcmp(seq[0], seq[2], sizeof seq[0]) != 0, "seeds 42 and 43 give the same 200 tokens (chance %.2g)", p_false);
    CHECK(p_false < 1e-60, "collision chance %.3g", p_false);
    /* uniforms: in [0, 1), mean 1/2 within 6 sigma (sigma = 1/sqrt(12 N)),
     * seed 0 included */
    const int n_u = 1000000;
    for (uint64_t seed = 0; seed < 2; seed++) {
        p.seed = seed;
        nstf_sampler s;
        if (!open_sampler(&s, &p, 10, NULL, 0)) return;
        double sum = 0, lo = 1, hi = 0;
        for (int i = 0; i < n_u; i++) {
            double u = nstf_sampler_uniform(&s);
            sum += u;
            if (u < lo) lo = u;
            if (u > hi) hi = u;
        }
        nstf_sampler_free(&s);
        const double sigma = 1 / sqrt(12.0 * n_u);
        CHECK(lo >= 0 && hi < 1, "seed %llu: uniform outside [0, 1): %g %g", (unsigned long long)seed, lo, hi);
        CHECK(fabs(sum / n_u - 0.5) <= 6 * sigma, "seed %llu: uniform mean %.6f", (unsigned long long)seed, sum / n_u);
    }
}

/* ---- 5. greedy ------------------------------------------------------------------ */

static int32_t sample_once(const float *lg, int n, nstf_sampler_params p, const int32_t *hist, int n_hist) {
    nstf_sampler s;
    if (!open_sampler(&s, &p, n, hist, n_hist)) return -1;
    int32_t t = nstf_sampler_sample(&s, lg);
    nstf_sampler_free(&s);
    return t;
}

static void test_greedy(void) {
    const float lg[6] = {1.0f, 5.0f, 3.0f, 5.0f, 2.0f, 5.0f};
    nstf_sampler_params p = params(0, 40, 0.95f, 0.05f);
    CHECK(sample_once(lg, 6, p, NULL, 0) == 1, "greedy: not the first maximum");
    p.repeat_penalty = 2.0f;
    CHECK(sample_once(lg, 6, p, (const int32_t[]){1}, 1) == 3, "greedy after a penalty on 1");
    CHECK(sample_once(lg, 6, p, (const int32_t[]){1, 3, 5}, 3) == 2, "greedy after penalties on every maximum");
    const float neg[3] = {-1.0f, -3.0f, -1.5f};
    CHECK(sample_once(neg, 3, p, (const int32_t[]){0}, 1) == 2, "greedy: a negative logit is multiplied");
    /* temperature with top-k 1 picks the same first maximum for every seed */
    int same = 0;
    for (uint64_t seed = 0; seed < 100; seed++) {
        nstf_sampler_params q = params(1.5f, 1, 1, 0);
        q.seed = seed;
        same += sample_once(lg, 6, q, NULL, 0) == 1;
    }
    CHECK(same == 100, "top-k 1: %d of 100 seeds gave the first maximum", same);
    /* parameter checks */
    nstf_sampler s;
    nstf_sampler_params bad = params(-1, 0, 1, 0);
    CHECK(nstf_sampler_init(&s, &bad, 10) == NSTF_ERR_INVALID_ARG, "negative temperature accepted");
    bad = params(1, 0, 0, 0);
    CHECK(nstf_sampler_init(&s, &bad, 10) == NSTF_ERR_INVALID_ARG, "top-p 0 accepted");
    bad = params(1, 0, 1, 1.5f);
    CHECK(nstf_sampler_init(&s, &bad, 10) == NSTF_ERR_INVALID_ARG, "min-p 1.5 accepted");
    bad = params(1, 0, 1, 0);
    CHECK(nstf_sampler_init(&s, &bad, 0) == NSTF_ERR_INVALID_ARG, "empty vocabulary accepted");
}

int main(void) {
    test_chi2_self();
    test_crafted_sets();
    test_random_sets();
    test_penalty();
    test_greedy();
    test_seeds();
    test_draws();
    return test_finish("test_sampler");
}
