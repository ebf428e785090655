/* sampler.c — repetition penalty, top-k, top-p, min-p, temperature, draw. */
#include "model/sampler.h"

#include <math.h>
#include <string.h>

#include "core/mem.h"

nstf_sampler_params nstf_sampler_default_params(void) {
    nstf_sampler_params p = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                             .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 0};
    return p;
}

nstf_status nstf_sampler_check_params(const nstf_sampler_params *p) {
    if (!(p->temp >= 0.0f) || !isfinite(p->temp))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "temperature %g must be >= 0", (double)p->temp);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "top-p %g must be in (0, 1]", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "min-p %g must be in [0, 1]", (double)p->min_p);
    if (!(p->repeat_penalty > 0.0f) || !isfinite(p->repeat_penalty))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "repeat penalty %g must be > 0", (double)p->repeat_penalty);
    if (p->repeat_last_n < 0 || p->repeat_last_n > (1 << 20))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "repeat-last-n %d must be in 0..1048576", p->repeat_last_n);
    return NSTF_OK;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

double nstf_sampler_uniform(nstf_sampler *s) {
    uint64_t s0 = s->rng[0], s1 = s->rng[1], r = s0 + s1;
    s1 ^= s0;
    s->rng[0] = rotl(s0, 24) ^ s1 ^ (s1 << 16);
    s->rng[1] = rotl(s1, 37);
    return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

nstf_status nstf_sampler_init(nstf_sampler *s, const nstf_sampler_params *p, int n_vocab) {
    memset(s, 0, sizeof *s);
    NSTF_TRY(nstf_sampler_check_params(p));
    if (n_vocab < 1) return nstf_set_error(NSTF_ERR_INVALID_ARG, "vocabulary size %d", n_vocab);
    s->p = *p;
    s->n_vocab = n_vocab;
    uint64_t seed = p->seed;
    s->rng[0] = splitmix64(&seed);
    s->rng[1] = splitmix64(&seed);
    s->idx = nstf_calloc((size_t)n_vocab, sizeof(int32_t), "sampler candidates");
    s->val = nstf_calloc((size_t)n_vocab, sizeof(float), "sampler candidates");
    s->prob = nstf_calloc((size_t)n_vocab, sizeof(float), "sampler candidates");
    s->recent = nstf_calloc((size_t)(p->repeat_last_n > 0 ? p->repeat_last_n : 1), sizeof(int32_t), "sampler history");
    if (!s->idx || !s->val || !s->prob || !s->recent) {
        nstf_sampler_free(s);
        return NSTF_ERR_OOM;
    }
    return NSTF_OK;
}

void nstf_sampler_free(nstf_sampler *s) {
    nstf_free(s->idx);
    nstf_free(s->val);
    nstf_free(s->prob);
    nstf_free(s->recent);
    memset(s, 0, sizeof *s);
}

void nstf_sampler_accept(nstf_sampler *s, int32_t id) {
    int n = s->p.repeat_last_n;
    if (n <= 0) return;
    s->recent[s->recent_head] = id;
    s->recent_head = (s->recent_head + 1) % n;
    if (s->n_recent < n) s->n_recent++;
}

/* Candidate order: higher logit first; among equal logits the lower id
 * first, so the kept set and its order are one fixed function of the logits
 * (as greedy's first maximum is). */
static bool better(float va, int32_t ia, float vb, int32_t ib) { return va > vb || (va == vb && ia < ib); }

/* Partial selection: move the k best of val[0..n) (with their idx) to the
 * front, in candidate order. O(n log k) with a heap whose root is the
 * worst of the best k so far. */
static void sift_down(float *v, int32_t *ix, int k, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < k && better(v[m], ix[m], v[l], ix[l])) m = l;
        if (r < k && better(v[m], ix[m], v[r], ix[r])) m = r;
        if (m == i) return;
        float tv = v[i]; v[i] = v[m]; v[m] = tv;
        int32_t ti = ix[i]; ix[i] = ix[m]; ix[m] = ti;
        i = m;
    }
}

static void top_k_sorted(float *v, int32_t *ix, int n, int k) {
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(v, ix, k, i);
    for (int i = k; i < n; i++) {
        if (better(v[i], ix[i], v[0], ix[0])) {
            v[0] = v[i];
            ix[0] = ix[i];
            sift_down(v, ix, k, 0);
        }
    }
    /* heap sort: the worst goes to the back */
    for (int end = k - 1; end > 0; end--) {
        float tv = v[0]; v[0] = v[end]; v[end] = tv;
        int32_t ti = ix[0]; ix[0] = ix[end]; ix[end] = ti;
        sift_down(v, ix, end, 0);
    }
}

int nstf_sampler_candidates(nstf_sampler *s, const float *logits) {
    const int n = s->n_vocab;
    float *v = s->val;
    int32_t *ix = s->idx;
    memcpy(v, logits, (size_t)n * sizeof(float));
    for (int i = 0; i < n; i++) ix[i] = i;
    /* repetition penalty (as llama.cpp: divide positive, multiply negative),
     * once per distinct token of the window: ix[t] = -1 marks a token done */
    if (s->p.repeat_penalty != 1.0f) {
        for (int i = 0; i < s->n_recent; i++) {
            int32_t t = s->recent[i];
            if (t < 0 || t >= n || ix[t] < 0) continue;
            ix[t] = -1;
            v[t] = v[t] > 0 ? v[t] / s->p.repeat_penalty : v[t] * s->p.repeat_penalty;
        }
        for (int i = 0; i < s->n_recent; i++)
            if (s->recent[i] >= 0 && s->recent[i] < n) ix[s->recent[i]] = s->recent[i];
    }
    if (s->p.temp <= 0.0f) { /* greedy: first index of the maximum */
        int32_t best = 0;
        for (int i = 1; i < n; i++)
            if (v[i] > v[best]) best = i;
        ix[0] = best;
        v[0] = 1.0f;
        return 1;
    }
    int k = (s->p.top_k > 0 && s->p.top_k < n) ? s->p.top_k : n;
    top_k_sorted(v, ix, n, k);
    /* top-p and min-p judge the untempered distribution of the top-k
     * candidates (the temperature is applied last, as in llama.cpp's
     * default chain) */
    float *pr = s->prob, maxv = v[0];
    double sum = 0;
    for (int i = 0; i < k; i++) {
        pr[i] = expf(v[i] - maxv);
        sum += pr[i];
    }
    /* top-p: smallest prefix with cumulative probability >= top_p */
    if (s->p.top_p < 1.0f) {
        double cum = 0;
        for (int i = 0; i < k; i++) {
            cum += pr[i] / sum;
            if (cum >= s->p.top_p) { k = i + 1; break; }
        }
    }
    /* min-p: drop candidates below min_p times the best probability */
    if (s->p.min_p > 0.0f) {
        float floor_p = s->p.min_p * pr[0];
        int keep = 1;
        while (keep < k && pr[keep] >= floor_p) keep++;
        k = keep;
    }
    /* temperature: the draw weights */
    for (int i = 0; i < k; i++) v[i] = expf((v[i] - maxv) / s->p.temp);
    return k;
}

int32_t nstf_sampler_sample(nstf_sampler *s, const float *logits) {
    const int k = nstf_sampler_candidates(s, logits);
    const float *w = s->val;
    const int32_t *ix = s->idx;
    if (s->p.temp <= 0.0f) return ix[0]; /* greedy draws nothing; any other sample draws once */
    double total = 0;
    for (int i = 0; i < k; i++) total += w[i];
    double r = nstf_sampler_uniform(s) * total, acc = 0;
    for (int i = 0; i < k; i++) {
        acc += w[i];
        if (r < acc) return ix[i];
    }
    return ix[k - 1];
}
