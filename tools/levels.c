/* levels.c — the execution-level matrix of `nstf bench --levels --device
 * gpu`: forward time per level, its split into attention / feed-forward /
 * normalization / residual / other from a profiling pass (the profiler's
 * records, marks around every op), kernels per forward, device memory by
 * kind, speed-up over L0, and a sweep over prefill batch and context
 * depth. Every time is from the backend's timer (GPU events). Written
 * against the session interface only: a backend with one level gives a
 * one-row matrix. */
#include "levels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nstf.h"
#include "nstf_tools.h"
#include "prof/bench.h"
#include "prof/profiler.h"

enum {
    CAT_ATTN = NSTF_PROF_CAT_ATTN,
    CAT_FFN = NSTF_PROF_CAT_FFN,
    CAT_NORM = NSTF_PROF_CAT_NORM,
    CAT_RESID = NSTF_PROF_CAT_RESID,
    CAT_OTHER = NSTF_PROF_CAT_OTHER,
    N_CAT = NSTF_PROF_N_CAT
};

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void rand_toks(int32_t *t, int n, int nv, uint64_t *rng) {
    for (int i = 0; i < n; i++) {
        uint64_t x = *rng;
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        *rng = x;
        t[i] = (int32_t)(x % (uint64_t)nv);
    }
}

/* Median ms of `reps` forwards of n tokens at pos0 (after 2 untimed ones). */
static nstf_status time_fwd(nstf_session *s, const int32_t *toks, int n, int pos0, int reps, double *ms_out) {
    nstf_timer t = nstf_bench_timer(s);
    double ms[64];
    if (reps > 64) reps = 64;
    for (int r = -2; r < reps; r++) {
        uint64_t ns = 0;
        NSTF_TRY(nstf_timer_start(&t));
        NSTF_TRY(nstf_session_forward(s, toks, n, pos0, false, NULL, NULL));
        NSTF_TRY(nstf_timer_stop(&t, &ns));
        if (r >= 0) ms[r] = (double)ns * 1e-6;
    }
    qsort(ms, (size_t)reps, sizeof ms[0], cmp_d);
    *ms_out = ms[reps / 2];
    return NSTF_OK;
}

/* One profiled forward: time per category (ms). */
static nstf_status prof_fwd(nstf_session *s, const int32_t *toks, int n, int pos0, double cat[N_CAT]) {
    nstf_prof *p = calloc(1, sizeof *p);
    if (!p) return NSTF_ERR_OOM;
    nstf_status rc = nstf_prof_attach(p, s, 0);
    if (rc == NSTF_OK) rc = nstf_session_forward(s, toks, n, pos0, false, NULL, NULL);
    if (rc == NSTF_OK) rc = nstf_prof_collect(p);
    for (int c = 0; c < N_CAT; c++) cat[c] = 0;
    for (int i = 0; rc == NSTF_OK && i < p->n_recs; i++)
        cat[p->recs[i].cat] += (double)(p->recs[i].t1_ns - p->recs[i].t0_ns) * 1e-6;
    nstf_prof_detach(p);
    free(p);
    return rc;
}

#define MIB(x) ((double)(x) / (1 << 20))
#define MAX_LEVELS 5

int nstf_levels_matrix(const char *model, int reps) {
    enum { PP = 512, DEPTH_MAX = 8192 };
    static const int batches[] = {1, 8, 32}, depths[] = {128, 1024, 8192};
    nstf_session_params sp = nstf_session_default_params();
    sp.n_ctx = DEPTH_MAX + PP + 8;
    sp.n_batch = PP;
    sp.device = "gpu";
    nstf_session *s = NULL;
    if (nstf_session_open(model, &sp, &s) != NSTF_OK) {
        fprintf(stderr, "nstf: %s\n", nstf_last_error());
        return 1;
    }
    const int nv = nstf_session_n_vocab(s), n_levels = nstf_session_n_levels(s);
    if (n_levels > MAX_LEVELS) {
        nstf_session_close(s);
        return 1;
    }
    int32_t *toks = malloc(sizeof(int32_t) * PP);
    if (!toks) {
        nstf_session_close(s);
        return 1;
    }
    uint64_t rng = 0x2545f4914f6cdd1dull;
    rand_toks(toks, PP, nv, &rng);
    double pf[MAX_LEVELS], dc[MAX_LEVELS], pcat[MAX_LEVELS][N_CAT], dcat[MAX_LEVELS][N_CAT], sweep[MAX_LEVELS][6];
    int64_t pk[MAX_LEVELS], dk[MAX_LEVELS], nodes = 0, l4_ins = 0;
    const char *l4_why = NULL;
    nstf_session_mem mem[MAX_LEVELS];
    nstf_status st = NSTF_OK;
    /* fill the cache to the deepest depth once at L3 (the contents do not
     * depend on the level; each timed step only writes its own position) */
    st = nstf_session_set_opt(s, NSTF_SESSION_LEVEL, n_levels - 1);
    for (int p = 0; st == NSTF_OK && p < DEPTH_MAX; p += PP) st = nstf_session_forward(s, toks, PP, p, false, NULL, NULL);
    for (int L = 0; st == NSTF_OK && L < n_levels; L++) {
        int64_t k0;
        st = nstf_session_set_opt(s, NSTF_SESSION_LEVEL, L);
        if (st == NSTF_OK) st = time_fwd(s, toks, PP, 0, reps, &pf[L]);
        k0 = nstf_session_kernels(s); /* one more forward, counted */
        if (st == NSTF_OK) st = nstf_session_forward(s, toks, PP, 0, false, NULL, NULL);
        pk[L] = nstf_session_kernels(s) - k0;
        if (st == NSTF_OK) st = time_fwd(s, toks, 1, PP, reps * 4, &dc[L]);
        k0 = nstf_session_kernels(s);
        if (st == NSTF_OK) st = nstf_session_forward(s, toks, 1, PP, false, NULL, NULL);
        dk[L] = nstf_session_kernels(s) - k0;
        if (L == 3) nodes = nstf_session_graph_kernels(s); /* L3's graph */
        if (L == 4) l4_why = nstf_session_l4_status(s, &l4_ins);
        if (st == NSTF_OK) st = prof_fwd(s, toks, PP, 0, pcat[L]);
        if (st == NSTF_OK) st = prof_fwd(s, toks, 1, PP, dcat[L]);
        for (int b = 0; st == NSTF_OK && b < 3; b++) st = time_fwd(s, toks, batches[b], 0, reps, &sweep[L][b]);
        for (int d = 0; st == NSTF_OK && d < 3; d++) st = time_fwd(s, toks, 1, depths[d], reps * 4, &sweep[L][3 + d]);
        nstf_session_mem_get(s, &mem[L]);
        fprintf(stderr, "nstf: levels: L%d done\n", L);
    }
    if (st != NSTF_OK) {
        fprintf(stderr, "nstf: bench --levels: %s\n", nstf_last_error());
        free(toks);
        nstf_session_close(s);
        return 1;
    }
    static const char *lname[] = {"L0 baseline", "L1 fused", "L2 tiled", "L3 ultra", "L4 persistent"};
    printf("\n### %s — %s (bf16 KV cache, context %d, median of %d; decode median of %d)\n\n", model,
           nstf_session_device(s),
           sp.n_ctx, reps, reps * 4);
    printf("Forward time split (ms) from a profiling pass with events around every op; `total` is the timed\n"
           "forward without per-op events. Prefill = %d tokens from position 0; decode = 1 token at depth %d.\n\n",
           PP, PP);
    printf("| level | phase | total ms | speed-up vs L0 | attention | feed-forward | normalization | residual | other "
           "| kernels / forward |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int ph = 0; ph < 2; ph++)
        for (int L = 0; L < n_levels; L++) {
            const double *c = ph ? dcat[L] : pcat[L];
            double t = ph ? dc[L] : pf[L], t0 = ph ? dc[0] : pf[0];
            char kern[64];
            if (ph && L == 3 && nodes > 0)
                snprintf(kern, sizeof kern, "1 graph (%lld nodes)", (long long)nodes);
            else if (ph && L == 4 && dk[L] == 1 && !l4_why && l4_ins > 0)
                snprintf(kern, sizeof kern, "1 persistent kernel (%lld instructions)", (long long)l4_ins);
            else if (ph && L == 4 && l4_why)
                snprintf(kern, sizeof kern, "as L3: %.30s", l4_why);
            else snprintf(kern, sizeof kern, "%lld", (long long)(ph ? dk[L] : pk[L]));
            printf("| %s | %s | %.3f | %.2fx | %.3f | %.3f | %.3f | %.3f | %.3f | %s |\n", lname[L],
                   ph ? "decode" : "prefill", t, t0 / t, c[CAT_ATTN], c[CAT_FFN], c[CAT_NORM], c[CAT_RESID],
                   c[CAT_OTHER], kern);
        }
    printf("\nPeak device memory by kind (MiB):\n\n| level | weights | KV cache | activations | workspace | total "
           "|\n|---|---:|---:|---:|---:|---:|\n");
    for (int L = 0; L < n_levels; L++)
        printf("| %s | %.1f | %.1f | %.1f | %.1f | %.1f |\n", lname[L], MIB(mem[L].weights), MIB(mem[L].kv_cache),
               MIB(mem[L].activations), MIB(mem[L].workspace),
               MIB(mem[L].weights + mem[L].kv_cache + mem[L].activations + mem[L].workspace));
    printf("\nSweep: ms per forward (speed-up over L0). Prefill of B tokens from position 0; decode of 1 token at "
           "context depth D.\n\n| level | B=1 | B=8 | B=32 | D=128 | D=1024 | D=8192 |\n|---|---:|---:|---:|---:|---:|---:|\n");
    for (int L = 0; L < n_levels; L++) {
        printf("| %s |", lname[L]);
        for (int i = 0; i < 6; i++) printf(" %.3f (%.2fx) |", sweep[L][i], sweep[0][i] / sweep[L][i]);
        printf("\n");
    }
    /* where the time of the L4 step goes: its timeline by kind of instruction */
    if (n_levels > 4 && nstf_session_set_opt(s, NSTF_SESSION_LEVEL, 4) == NSTF_OK &&
        nstf_session_l4_profile(s, true) == NSTF_OK) {
        nstf_l4_profile pr;
        double ms = 0;
        if (time_fwd(s, toks, 1, PP, 3, &ms) == NSTF_OK && nstf_session_l4_profile_get(s, &pr) == NSTF_OK) {
            printf("\nL4 step at depth %d, from one traced step (device timer): %.1f us in the kernel over %d "
                   "instructions; `work` runs from the barrier before an instruction to its last block's end, `wait` "
                   "from there to the barrier's release.\n\n| instructions | count | work us | wait us | per "
                   "instruction us |\n|---|---:|---:|---:|---:|\n",
                   PP, pr.total_us, pr.n_ins);
            for (int k = 0; k < NSTF_L4_KINDS; k++)
                if (pr.count[k])
                    printf("| %s | %d | %.1f | %.1f | %.2f |\n", nstf_l4_kind_name(k), pr.count[k], pr.work_us[k],
                           pr.wait_us[k], (pr.work_us[k] + pr.wait_us[k]) / pr.count[k]);
        } else {
            printf("\nL4 profile: %s\n", nstf_last_error());
        }
        (void)nstf_session_l4_profile(s, false);
    }
    printf("\nWorkspace = dequantization buffer + argmax/flash-decode scratch, plus for L0/L1 the fp32 score "
           "matrix [n_heads, %d, %d].\n", PP, sp.n_ctx);
    free(toks);
    nstf_session_close(s);
    return 0;
}
