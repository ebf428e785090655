/* test_kv_q8.c — the Q8_0 KV cache (ops.h) on the CPU.
 *
 * The row format: nstf_kv_row_bytes (codes, then an fp16 scale per 32,
 * padded to 16 bytes; refused for a kv_dim that 32 does not divide), and
 * nstf_kv_q8_store / _load on random, zero, huge and NaN blocks: the scale
 * within fp16 rounding of amax / 127 (clipped at 65504), every value back
 * within 0.6 of a step, a zero block all zeros, NaN stored as 0.
 *
 * The model (SmolLM2-135M Q4_1; exit 77 when not fetched): a 200-token
 * prompt in chunks of 64, then 40 decode steps, with the cache in Q8_0
 * against the same run with the fp32 cache: the KL of every position's
 * softmax (mean <= 5e-4, max <= 5e-3: 7-10x the 7.1e-5 and 4.6e-4 measured
 * on the 2-core AVX2 machine, 2026-11-28; the cache's rounding is at most
 * half a step, 1/254 of each block's largest value) and top-1 agreement
 * >= 95% outside near-ties (240/240 measured). Then the
 * session's options: q8_0 is taken and named in nstf_session_kv_type;
 * an unknown type, K and V of different types, Q8_0 with sparse attention
 * (asked, or sparse layers set on the run as a file's plan would) are
 * clear errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "model/llama.h"
#include "model_test.h"
#include "nstf_tools.h"
#include "ops/ops.h"
#include "test_util.h"

#define MODEL NSTF_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define N_PROMPT 200
#define N_DEC 40

static void row_format(void) {
    uint64_t b = 0;
    CHECK(nstf_kv_row_bytes(true, 0, 192, &b) && b == 208, "kv_dim 192: %llu bytes (want 208)", (unsigned long long)b);
    CHECK(nstf_kv_row_bytes(true, 0, 1024, &b) && b == 1088, "kv_dim 1024: %llu bytes (want 1088)",
          (unsigned long long)b);
    CHECK(nstf_kv_row_bytes(false, 4, 192, &b) && b == 768, "fp32 row of 192: %llu bytes", (unsigned long long)b);
    CHECK(!nstf_kv_row_bytes(true, 0, 48, &b) && !nstf_kv_row_bytes(true, 0, 0, &b) &&
              !nstf_kv_row_bytes(false, 2, -1, &b),
          "kv_dim 48 (Q8_0), 0 and -1 must be refused");

    enum { D = 128 };
    float x[D], y[D];
    uint8_t row[D + D / 16];
    test_rng r = {99};
    for (int i = 0; i < D; i++) x[i] = (float)rng_normal(&r) * (i < 32 ? 1e-3f : 1.0f);
    for (int i = 64; i < 96; i++) x[i] = 0.0f;                    /* block 2: all zeros */
    for (int i = 96; i < D; i++) x[i] = (i % 2 ? -1.0f : 1.0f) * 1e9f; /* block 3: past 127 x 65504 */
    x[100] = NAN;
    nstf_kv_q8_store(x, D, row);
    nstf_kv_q8_load(row, D, y);
    int bad = 0;
    for (int b2 = 0; b2 < 3; b2++) {
        double amax = 0;
        for (int i = 0; i < 32; i++) amax = fmax(amax, fabs(x[32 * b2 + i]));
        const double d = nstf_fp16_to_f32(nstf_load_u16(row + D + 2 * b2));
        bad += fabs(d - amax / 127) > 1e-3 * amax / 127;
        for (int i = 0; i < 32; i++) bad += fabs(y[32 * b2 + i] - x[32 * b2 + i]) > 0.6 * d;
    }
    for (int i = 64; i < 96; i++) bad += y[i] != 0.0f;
    CHECK(bad == 0, "Q8_0 rows: %d values or scales off", bad);
    const float d3 = nstf_fp16_to_f32(nstf_load_u16(row + D + 6));
    CHECK(d3 == 65504.0f && y[100] == 0.0f && fabsf(y[97]) == 127.0f * 65504.0f && isfinite(y[99]),
          "a block past the fp16 range: scale %g (want 65504), NaN -> %g, clipped %g", d3, y[100], y[97]);
}

static double kl_row(const float *a, const float *b, int n) {
    double ma = -1e300, mb = -1e300, sa = 0, sb = 0, kl = 0;
    for (int i = 0; i < n; i++) ma = fmax(ma, a[i]), mb = fmax(mb, b[i]);
    for (int i = 0; i < n; i++) sa += exp(a[i] - ma), sb += exp(b[i] - mb);
    for (int i = 0; i < n; i++) {
        const double pa = exp(a[i] - ma) / sa;
        kl += pa * ((a[i] - ma - log(sa)) - (b[i] - mb - log(sb)));
    }
    return kl;
}

static int argmax(const float *v, int n) {
    int k = 0;
    for (int i = 1; i < n; i++) k = v[i] > v[k] ? i : k;
    return k;
}

static float top2_gap(const float *v, int n) {
    const int k = argmax(v, n);
    float s = -INFINITY;
    for (int i = 0; i < n; i++) s = i != k && v[i] > s ? v[i] : s;
    return v[k] - s;
}

/* Logits of every prompt position and decode step ([N_PROMPT + N_DEC][nv])
 * on a CPU run with the cache in Q8_0 or not; decode feeds the fp32 run's
 * greedy tokens (toks) so both see the same inputs. */
static int run(const nstf_llama *m, bool q8, const int32_t *toks, float *lg) {
    nstf_backend *be = NULL;
    nstf_llama_run *r = NULL;
    const nstf_cpu_params cp = {2, false, false, 0};
    const nstf_llama_run_shape sh = {N_PROMPT + N_DEC + 8, 64, 1, 0, m->cfg.n_layers, true, true, 0, 0, q8};
    nstf_status st = nstf_backend_cpu_create(&cp, &be);
    if (st == NSTF_OK) st = nstf_llama_run_create_shaped(m, be, &sh, &r);
    const int nv = m->cfg.n_vocab;
    for (int i = 0; st == NSTF_OK && i < N_PROMPT; i += 64) {
        const int n = N_PROMPT - i < 64 ? N_PROMPT - i : 64;
        st = nstf_llama_forward_seq(r, toks + i, n, i, true, lg + (int64_t)i * nv, NULL);
    }
    for (int t = N_PROMPT; st == NSTF_OK && t < N_PROMPT + N_DEC; t++)
        st = nstf_llama_forward_seq(r, toks + t, 1, t, false, lg + (int64_t)t * nv, NULL);
    CHECK(st == NSTF_OK, "%s cache: %s", q8 ? "Q8_0" : "fp32", nstf_last_error());
    if (r && q8) {
        CHECK(r->s.kv_q8 && r->s.kv_row == 208, "the run's cache rows: %llu bytes", (unsigned long long)r->s.kv_row);
        /* sparse layers (a file's plan) over it: refused */
        uint8_t layer[64] = {0};
        layer[0] = 1;
        const nstf_status ss = nstf_llama_run_sparse_set(r, layer, 16, 16, 64);
        CHECK(ss == NSTF_ERR_UNSUPPORTED && strstr(nstf_last_error(), "Q8_0"), "sparse layers over a Q8_0 cache: %s",
              ss == NSTF_OK ? "taken" : nstf_last_error());
    }
    nstf_llama_run_free(r);
    nstf_backend_free(be);
    return st == NSTF_OK;
}

static void model_part(void) {
    nstf_gguf *g = NULL;
    nstf_llama *m = NULL;
    const int lr = test_model_load(MODEL, "test_kv_q8", &g, &m);
    if (lr == 1) nstf_gguf_close(g);
    if (lr) return;
    const int nv = m->cfg.n_vocab, n = N_PROMPT + N_DEC;
    int32_t toks[N_PROMPT + N_DEC];
    test_rng r = {7};
    /* a prompt of text-like ids (the first 2000 of the vocabulary: bytes and
     * common merges), then the decode steps' tokens */
    for (int i = 0; i < N_PROMPT; i++) toks[i] = (int32_t)(rng_next(&r) % 2000);
    for (int i = N_PROMPT; i < n; i++) toks[i] = (int32_t)(rng_next(&r) % 2000);
    float *a = malloc((size_t)n * nv * 4), *b = malloc((size_t)n * nv * 4);
    if (a && b && run(m, false, toks, a) && run(m, true, toks, b)) {
        double kl = 0, kmax = 0;
        int agree = 0, ties = 0;
        for (int t = 0; t < n; t++) {
            const float *x = a + (int64_t)t * nv, *y = b + (int64_t)t * nv;
            const double k = kl_row(x, y, nv);
            kl += k;
            kmax = fmax(kmax, k);
            if (argmax(x, nv) == argmax(y, nv)) agree++;
            else ties += top2_gap(x, nv) < 0.25f;
        }
        kl /= n;
        printf("  Q8_0 cache against fp32: KL mean %.3g (tol 5e-4), max %.3g (tol 5e-3); top-1 %d/%d, %d flips at "
               "near-ties\n",
               kl, kmax, agree, n, ties);
        CHECK(kl <= 5e-4 && kmax <= 5e-3, "KL mean %.3g, max %.3g", kl, kmax);
        CHECK(agree + ties >= n * 95 / 100, "top-1 agreement %d (+%d near-ties) of %d", agree, ties, n);
    } else {
        CHECK(a && b, "out of memory");
    }
    free(a), free(b);
    nstf_llama_free(m);

    /* the session's options */
    nstf_session_params p = nstf_session_default_params();
    p.device = "cpu";
    p.n_ctx = 64;
    p.cache_type_k = p.cache_type_v = "q8_0";
    nstf_session *s = NULL;
    CHECK(nstf_session_open(MODEL, &p, &s) == NSTF_OK && s && !strcmp(nstf_session_kv_type(s), "q8_0"),
          "a session with the Q8_0 cache: %s", s ? nstf_session_kv_type(s) : nstf_last_error());
    nstf_session_close(s);
    const char *bad[3][3] = {{"q4_0", "q4_0", "q4_0"}, {"q8_0", "auto", "same cache type"}, {"q8_0", "q8_0", "sparse"}};
    for (int i = 0; i < 3; i++) {
        p.cache_type_k = bad[i][0];
        p.cache_type_v = bad[i][1];
        p.sparse_attn = i == 2 ? 1 : 0;
        s = NULL;
        const nstf_status st = nstf_session_open(MODEL, &p, &s);
        CHECK(st != NSTF_OK && !s && strstr(nstf_last_error(), bad[i][2]), "-ctk %s -ctv %s%s: %s (want an error naming %s)",
              bad[i][0], bad[i][1], i == 2 ? " with sparse attention" : "", st == NSTF_OK ? "opened" : nstf_last_error(),
              bad[i][2]);
        nstf_session_close(s);
    }
}

int main(void) {
    row_format();
    model_part();
    return test_finish("test_kv_q8");
}
