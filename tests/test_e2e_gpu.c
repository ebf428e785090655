/* test_e2e_gpu.c — the GPU forward against the CPU forward of the same
 * binary, teacher-forced over 256 random token ids.
 *
 * Models: the paths given as arguments, else SmolLM2-135M-shaped random
 * models written by `nstf gen-model` (Q4_1, BF16, Q8_0) into the build
 * folder, and the real SmolLM2 file, which must be present (a missing
 * file fails: this test runs on the GPU machine, where it is carried).
 * Reference: the CPU path in precise mode (fp32 activations, exact-to-
 * rounding matmuls). Compared, per model:
 *   - GPU prefill (all 256 tokens in one forward: GEMM + flash attention),
 *   - GPU decode (one token at a time from position 0: GEMV + split-KV flash
 *     decoding, replayed from a captured graph),
 * position by position, so that a bug in a few positions fails:
 *   - KL(CPU || GPU) of the softmax at every position <= KL_MAX, and the
 *     mean <= KL_MEAN;
 *   - the centred NMSE of every logit row (each row minus its mean) <=
 *     NMSE_MAX;
 *   - top-1: the GPU may pick another token only where the CPU's top two
 *     logits are closer than TOP2_EPS (a near-tie bf16 rounding can flip);
 *     anywhere else a different top-1 fails.
 * The bounds come from the bf16 activations (8 mantissa bits: a relative
 * rounding of 2^-9 per value, accumulated in fp32 over a few hundred terms
 * per layer) and the first H100 measurements, with the margins stated where
 * they are set. Also: greedy generation of 32 tokens (reported), the device
 * argmax against the argmax of the GPU's own logits (must agree), and a
 * context far too large for the device fails with NSTF_ERR_OOM and a
 * message, not a crash. The same gates hold for a model split between the
 * GPU (embedding and the first half of the layers) and the CPU (the rest
 * and the output head), the partial offload of -ngl (against the CPU and
 * against the whole model on the GPU), and for a continuous batch of 4
 * sequences over a paged KV cache (prefill chunks beside decode tokens,
 * selected logits rows: nstf serve's forward), and with the KV cache in
 * Q8_0 against the CPU with the same cache. Exit 77 (skipped)
 * without a GPU. Built only with a GPU backend. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/mem.h"
#include "gpu_model_test.h"
#include "test_util.h"

#define N_TOK 256
#define N_PROMPT 8
#define N_GEN 32
/* Per-position bounds (see the header). Measured on the H100 (2026-11-26,
 * the kernels of 1f137a2 behind the backend seam), worst of prefill and
 * decode: real SmolLM2 Q4_1 mean KL 4.2e-4, max KL 3.3e-3, max centred
 * NMSE 1.42e-3, every top-1 flip at a near-tie; random Q4_1/BF16/Q8_0
 * models mean KL <= 1.1e-5, max KL <= 1.4e-5, max centred NMSE <= 1.2e-4.
 * Those 256 positions are one input; the continuous batch's sequences are
 * others (ids from 50 s, positions 0..56), and on the H200 (2026-11-26)
 * the plain GPU decode of sequence 1's ids alone reached mean KL 1.43e-3,
 * max 8.35e-3 against the CPU, the batch 1.73e-3 / 1.08e-2 / NMSE 3.51e-3
 * (the batch against that decode alone: 9.2e-4 / 4.2e-3, bf16 roundings
 * in another order, GEMM and multi-token GEMV rows). Bounds: about 3x the
 * worst of all of these; a bug that spoils even one position (a wrong RoPE
 * angle, a stale cache row: KL of order 0.1 and more there) still fails
 * KL_MAX. */
#define KL_MEAN 5e-3
#define KL_MAX 3e-2
#define NMSE_MAX 1e-2
#define TOP2_EPS 0.25f

static int g_fail = 0;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int argmax_row(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* KL(p || q) of softmax(a), softmax(b), in nats. */
static double kl_row(const float *a, const float *b, int n) {
    double ma = -INFINITY, mb = -INFINITY, sa = 0, sb = 0, kl = 0;
    for (int i = 0; i < n; i++) { if (a[i] > ma) ma = a[i]; if (b[i] > mb) mb = b[i]; }
    for (int i = 0; i < n; i++) { sa += exp(a[i] - ma); sb += exp(b[i] - mb); }
    double la = log(sa) + ma, lb = log(sb) + mb;
    for (int i = 0; i < n; i++) {
        double lpa = a[i] - la, lpb = b[i] - lb;
        kl += exp(lpa) * (lpa - lpb);
    }
    return kl;
}

/* Centred NMSE of row b against row a: sum((b - a - mean(b - a))^2) /
 * sum((a - mean(a))^2), so that a row's offset (which softmax ignores)
 * does not hide an error in its shape. */
static double nmse_centred(const float *a, const float *b, int n) {
    double ma = 0, md = 0, num = 0, den = 0;
    for (int i = 0; i < n; i++) { ma += a[i]; md += (double)b[i] - a[i]; }
    ma /= n;
    md /= n;
    for (int i = 0; i < n; i++) {
        double d = (double)b[i] - a[i] - md, c = a[i] - ma;
        num += d * d;
        den += c * c;
    }
    return den > 0 ? num / den : num;
}

/* The gap between a row's two largest values. */
static float top2_gap(const float *v, int n) {
    float m1 = -INFINITY, m2 = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (v[i] > m1) { m2 = m1; m1 = v[i]; }
        else if (v[i] > m2) m2 = v[i];
    }
    return m1 - m2;
}

static void compare(const char *what, const float *cpu, const float *gpu, int n_tok, int nv) {
    double kl = 0, kl_max = 0, nmse_max = 0;
    int agree = 0, bad = 0, flips_ok = 0, flips_bad = 0, worst_kl = 0, worst_nmse = 0;
    for (int t = 0; t < n_tok; t++) {
        const float *a = cpu + (int64_t)t * nv, *b = gpu + (int64_t)t * nv;
        for (int i = 0; i < nv; i++) bad += !isfinite(b[i]);
        double k = kl_row(a, b, nv), e = nmse_centred(a, b, nv);
        kl += k;
        if (k > kl_max) { kl_max = k; worst_kl = t; }
        if (e > nmse_max) { nmse_max = e; worst_nmse = t; }
        if (argmax_row(a, nv) == argmax_row(b, nv)) agree++;
        else if (top2_gap(a, nv) < TOP2_EPS) flips_ok++;
        else flips_bad++;
    }
    kl /= n_tok;
    bool ok = bad == 0 && kl <= KL_MEAN && kl_max <= KL_MAX && nmse_max <= NMSE_MAX && flips_bad == 0;
    printf("  %-8s KL(cpu||gpu) mean %.3g (tol %.2g), max %.3g at %d (tol %.2g); centred NMSE max %.3g at %d (tol "
           "%.2g); top-1 %d/%d, %d flips at near-ties (gap < %.2f), %d elsewhere%s  %s\n",
           what, kl, KL_MEAN, kl_max, worst_kl, KL_MAX, nmse_max, worst_nmse, NMSE_MAX, agree, n_tok, flips_ok,
           (double)TOP2_EPS, flips_bad, bad ? " NON-FINITE" : "", ok ? "ok" : "FAIL");
    if (!ok) g_fail++;
}

/* A continuous batch, as nstf serve runs one: CB_SEQ sequences over a paged
 * KV cache of shuffled CB_BLOCK-position blocks, joining at different steps;
 * even ones advance in prefill chunks of CB_CHUNK tokens, odd ones a token
 * at a time (decode) beside them, so batches hold 1..16 tokens (GEMV and
 * GEMM). Every batch asks for the logits of all its rows, in reverse order
 * (the rows gather). Each sequence's logits are compared with the CPU's
 * (precise) for the same ids alone from position 0, under the same gates. */
#define CB_SEQ 4
#define CB_BLOCK 16
#define CB_CHUNK 7
static void continuous_batch(const nstf_llama *m, const int32_t *ids, placed *cpu, placed *gpu) {
    static const int len[CB_SEQ] = {40, 23, 57, 9}, join[CB_SEQ] = {0, 1, 3, 6};
    const int nv = m->cfg.n_vocab, ctx = 64, bps = ctx / CB_BLOCK;
    int total = 0, n_blocks = 0;
    for (int s = 0; s < CB_SEQ; s++) {
        total += len[s];
        n_blocks += (len[s] + CB_BLOCK - 1) / CB_BLOCK;
    }
    float *lc = malloc((size_t)total * nv * sizeof(float)), *lg = malloc((size_t)total * nv * sizeof(float)),
          *la = malloc((size_t)total * nv * sizeof(float)), *step = malloc((size_t)2 * CB_CHUNK * CB_SEQ * nv * sizeof(float));
    int32_t tbl[CB_SEQ * 4], perm[CB_SEQ * 4], off[CB_SEQ], done[CB_SEQ] = {0};
    nstf_backend *gb = NULL;
    nstf_llama_run *r = NULL;
    nstf_status st = lc && lg && la && step ? NSTF_OK : NSTF_ERR_OOM;
    /* the reference: each sequence alone on the CPU; sequence s reads ids
     * from 50 s. Also each alone on the GPU, decoded a token at a time on
     * the contiguous cache: what the same ids give without the batch */
    for (int s = 0, o = 0; st == NSTF_OK && s < CB_SEQ; o += len[s], s++) {
        off[s] = o;
        st = nstf_llama_forward_seq(cpu->run, ids + 50 * s, len[s], 0, true, lc + (int64_t)o * nv, NULL);
        for (int t = 0; st == NSTF_OK && t < len[s]; t++)
            st = nstf_llama_forward_seq(gpu->run, ids + 50 * s + t, 1, t, false, la + (int64_t)(o + t) * nv, NULL);
    }
    test_rng rng = {0xcb5eedu};
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        const int j = (int)(rng_next(&rng) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int s = 0, k = 0; s < CB_SEQ; s++)
        for (int b = 0; b < bps; b++) tbl[s * bps + b] = b * CB_BLOCK < len[s] ? perm[k++] : -1;
    if (st == NSTF_OK) st = nstf_backend_gpu_create(0, &gb);
    if (st == NSTF_OK) st = nstf_llama_run_create_paged(m, gb, ctx, 32, CB_SEQ, CB_BLOCK, n_blocks, &r);
    int steps = 0, max_n = 0, min_n = 1 << 30;
    for (bool more = true; st == NSTF_OK && more; steps++) {
        int32_t tok[CB_SEQ * CB_CHUNK], pos[CB_SEQ * CB_CHUNK], seq[CB_SEQ * CB_CHUNK], rows[CB_SEQ * CB_CHUNK];
        int n = 0;
        more = false;
        for (int s = 0; s < CB_SEQ; s++) {
            if (steps < join[s] || done[s] == len[s]) {
                more |= done[s] < len[s];
                continue;
            }
            const int k = s % 2 == 0 ? CB_CHUNK : 1;
            for (int i = 0; i < k && done[s] < len[s]; i++, done[s]++, n++) {
                tok[n] = ids[50 * s + done[s]];
                pos[n] = done[s];
                seq[n] = s;
            }
            more |= done[s] < len[s];
        }
        if (n == 0) continue;
        for (int i = 0; i < n; i++) rows[i] = n - 1 - i;
        max_n = n > max_n ? n : max_n;
        min_n = n < min_n ? n : min_n;
        const nstf_batch b = {.tokens = tok, .pos = pos, .seq = seq, .n = n, .rows = rows, .n_rows = n, .blocks = tbl};
        st = nstf_llama_forward(r, &b, step, NULL);
        for (int i = 0; st == NSTF_OK && i < n; i++) { /* logits row i is batch row n-1-i */
            const int t = n - 1 - i;
            memcpy(lg + (int64_t)(off[seq[t]] + pos[t]) * nv, step + (int64_t)i * nv, (size_t)nv * sizeof(float));
        }
    }
    if (st == NSTF_OK) {
        printf("  continuous batch: %d sequences, %d steps of %d..%d tokens, %d paged blocks of %d\n", CB_SEQ, steps,
               min_n, max_n, n_blocks, CB_BLOCK);
        for (int s = 0; s < CB_SEQ; s++) {
            char what[32];
            snprintf(what, sizeof what, "cb seq %d", s);
            compare(what, lc + (int64_t)off[s] * nv, lg + (int64_t)off[s] * nv, len[s], nv);
            snprintf(what, sizeof what, "alone %d", s);
            compare(what, lc + (int64_t)off[s] * nv, la + (int64_t)off[s] * nv, len[s], nv);
            snprintf(what, sizeof what, "cb vs alone %d", s);
            compare(what, la + (int64_t)off[s] * nv, lg + (int64_t)off[s] * nv, len[s], nv);
        }
    } else {
        printf("  continuous batch: %s  FAIL\n", nstf_last_error());
        g_fail++;
    }
    nstf_llama_run_free(r);
    nstf_backend_free(gb);
    free(lc);
    free(lg);
    free(la);
    free(step);
}

static void run_model(const char *path, bool real) {
    printf("%s%s\n", path, real ? " (real weights)" : " (random weights)");
    nstf_llama *m = NULL;
    if (load_model(path, &m) != NSTF_OK) {
        printf("  cannot load: %s  FAIL\n", nstf_last_error());
        g_fail++;
        return;
    }
    const int nv = m->cfg.n_vocab;
    printf("  types: embd %s, attn_q %s, ffn_down %s\n", nstf_type_name(m->w.tok_embd.type),
           nstf_type_name(m->w.layers[0].wq.type), nstf_type_name(m->w.layers[0].w_down.type));
    placed cpu = {0}, g = {0};
    float *lc = malloc((size_t)N_TOK * nv * sizeof(float)), *lg = malloc((size_t)N_TOK * nv * sizeof(float));
    int32_t ids[N_TOK];
    test_rng rng = {0x5eed1234u};
    for (int i = 0; i < N_TOK; i++) ids[i] = (int32_t)(rng_next(&rng) % (uint64_t)nv);
    CHECK(lc && lg, "out of host memory");
    CHECK(place_model(m, false, true, N_TOK + N_GEN, 64, &cpu) == NSTF_OK, "%s", nstf_last_error());
    nstf_status s = place_model(m, true, false, N_TOK + N_GEN, N_TOK, &g);
    if (s != NSTF_OK || !cpu.run) {
        printf("  GPU create failed: %s  FAIL\n", nstf_last_error());
        g_fail++;
        goto done;
    }
    double t0 = now_ms();
    for (int i = 0; i < N_TOK; i += 64)
        CHECK(nstf_llama_forward_seq(cpu.run, ids + i, 64, i, true, lc + (int64_t)i * nv, NULL) == NSTF_OK, "%s",
              nstf_last_error());
    double t1 = now_ms();
    /* prefill: one forward of all tokens */
    s = nstf_llama_forward_seq(g.run, ids, N_TOK, 0, true, lg, NULL);
    double t2 = now_ms();
    if (s != NSTF_OK) { printf("  GPU prefill: %s  FAIL\n", nstf_last_error()); g_fail++; goto done; }
    printf("  CPU (precise) %.0f ms, GPU prefill %.1f ms\n", t1 - t0, t2 - t1);
    compare("prefill", lc, lg, N_TOK, nv);
    /* decode: token by token from position 0 (the cache is rewritten) */
    int dev_mismatch = 0, graphs = 0;
    for (int t = 0; t < N_TOK; t++) {
        int32_t am = -1;
        s = nstf_llama_forward_seq(g.run, &ids[t], 1, t, false, lg + (int64_t)t * nv, &am);
        if (s != NSTF_OK) break;
        dev_mismatch += am != argmax_row(lg + (int64_t)t * nv, nv);
        graphs += placed_get(&g, NSTF_OPT_GRAPH_USED);
    }
    if (s != NSTF_OK) { printf("  GPU decode: %s  FAIL\n", nstf_last_error()); g_fail++; goto done; }
    compare("decode", lc, lg, N_TOK, nv);
    float *lgf = malloc((size_t)N_TOK * nv * sizeof(float)); /* the whole model's GPU decode logits */
    CHECK(lgf != NULL, "out of host memory");
    if (lgf) memcpy(lgf, lg, (size_t)N_TOK * nv * sizeof(float));
    printf("  decode steps from a graph: %d/%d; device argmax vs host argmax of the GPU logits: %d mismatches  %s\n",
           graphs, N_TOK, dev_mismatch, dev_mismatch == 0 && graphs >= N_TOK - 1 ? "ok" : "FAIL");
    if (dev_mismatch || graphs < N_TOK - 1) g_fail++;

    /* partial offload (-ngl): the embedding and the first half of the layers
     * on the GPU, the rest and the output on the CPU (precise), the residual
     * stream handed over through the host: the same gates against the CPU */
    {
        const int L = m->cfg.n_layers, half = L / 2;
        nstf_backend *gb = NULL, *cb = NULL;
        nstf_llama_run *s1 = NULL, *s2 = NULL;
        const nstf_cpu_params cp = {0, true, false, 32};
        nstf_status ss = nstf_backend_gpu_create(0, &gb);
        if (ss == NSTF_OK) ss = nstf_llama_run_create_stage(m, gb, N_TOK + N_GEN, N_TOK, 1, 0, half, true, false, &s1);
        if (ss == NSTF_OK) ss = nstf_backend_cpu_create(&cp, &cb);
        if (ss == NSTF_OK) ss = nstf_llama_run_create_stage(m, cb, N_TOK + N_GEN, N_TOK, 1, half, L, false, true, &s2);
        if (ss == NSTF_OK) {
            s1->next = s2;
            ss = nstf_llama_forward_seq(s1, ids, N_TOK, 0, true, lg, NULL);
            printf("  split: layers 0-%d on the GPU, %d-%d on the CPU\n", half - 1, half, L - 1);
            if (ss == NSTF_OK) compare("split pf", lc, lg, N_TOK, nv);
            for (int t = 0; ss == NSTF_OK && t < N_TOK; t++)
                ss = nstf_llama_forward_seq(s1, &ids[t], 1, t, false, lg + (int64_t)t * nv, NULL);
            if (ss == NSTF_OK) compare("split dec", lc, lg, N_TOK, nv);
            /* and against the whole model on the GPU (the same gates: the
             * split is closer to either side than they are to each other) */
            if (ss == NSTF_OK && lgf) compare("split vs GPU", lgf, lg, N_TOK, nv);
        }
        if (ss != NSTF_OK) {
            printf("  split: %s  FAIL\n", nstf_last_error());
            g_fail++;
        }
        nstf_llama_run_free(s2);
        nstf_llama_run_free(s1);
        nstf_backend_free(cb);
        nstf_backend_free(gb);
        free(lgf);
    }

    continuous_batch(m, ids, &cpu, &g);

    /* the Q8_0 KV cache: the GPU (prefill in three chunks, each reading the
     * cache the earlier ones wrote; then decode from position 0, replayed
     * from a graph) against the CPU (precise) with the same cache type, under
     * the same gates; the cache's own cost (CPU with Q8_0 against CPU with
     * fp32) is reported */
    {
        placed c8 = {0}, g8 = {0};
        float *l8 = malloc((size_t)N_TOK * nv * sizeof(float));
        nstf_status ss = l8 ? place_model_kv(m, false, true, N_TOK + N_GEN, 64, true, &c8) : NSTF_ERR_OOM;
        if (ss == NSTF_OK) ss = place_model_kv(m, true, false, N_TOK + N_GEN, N_TOK, true, &g8);
        for (int i = 0; ss == NSTF_OK && i < N_TOK; i += 64)
            ss = nstf_llama_forward_seq(c8.run, ids + i, 64, i, true, l8 + (int64_t)i * nv, NULL);
        if (ss == NSTF_OK) {
            double kl = 0, kmax = 0;
            int agree = 0;
            for (int t = 0; t < N_TOK; t++) {
                const double k = kl_row(lc + (int64_t)t * nv, l8 + (int64_t)t * nv, nv);
                kl += k;
                kmax = k > kmax ? k : kmax;
                agree += argmax_row(lc + (int64_t)t * nv, nv) == argmax_row(l8 + (int64_t)t * nv, nv);
            }
            printf("  Q8_0 KV cache on the CPU against fp32: KL mean %.3g, max %.3g, top-1 %d/%d (reported)\n",
                   kl / N_TOK, kmax, agree, N_TOK);
        }
        const int chunk[3] = {100, 100, N_TOK - 200};
        for (int c = 0, p0 = 0; ss == NSTF_OK && c < 3; p0 += chunk[c++])
            ss = nstf_llama_forward_seq(g8.run, ids + p0, chunk[c], p0, true, lg + (int64_t)p0 * nv, NULL);
        if (ss == NSTF_OK) compare("q8 pf", l8, lg, N_TOK, nv);
        int gr = 0;
        for (int t = 0; ss == NSTF_OK && t < N_TOK; t++) {
            ss = nstf_llama_forward_seq(g8.run, &ids[t], 1, t, false, lg + (int64_t)t * nv, NULL);
            gr += ss == NSTF_OK && placed_get(&g8, NSTF_OPT_GRAPH_USED);
        }
        if (ss == NSTF_OK) {
            compare("q8 dec", l8, lg, N_TOK, nv);
            printf("  Q8_0 cache decode steps from a graph: %d/%d  %s\n", gr, N_TOK, gr >= N_TOK - 1 ? "ok" : "FAIL");
            if (gr < N_TOK - 1) g_fail++;
        } else {
            printf("  Q8_0 KV cache: %s  FAIL\n", nstf_last_error());
            g_fail++;
        }
        placed_free(&g8);
        placed_free(&c8);
        free(l8);
    }

    /* greedy generation: 8 prompt tokens, then 32 greedy tokens on each side */
    {
        int32_t cseq[N_GEN], gseq[N_GEN], tok;
        CHECK(nstf_llama_forward_seq(cpu.run, ids, N_PROMPT, 0, false, NULL, &tok) == NSTF_OK, "%s", nstf_last_error());
        for (int i = 0; i < N_GEN; i++) {
            cseq[i] = tok;
            if (i + 1 < N_GEN)
                CHECK(nstf_llama_forward_seq(cpu.run, &cseq[i], 1, N_PROMPT + i, false, NULL, &tok) == NSTF_OK, "%s",
                      nstf_last_error());
        }
        CHECK(nstf_llama_forward_seq(g.run, ids, N_PROMPT, 0, false, NULL, &tok) == NSTF_OK, "%s", nstf_last_error());
        for (int i = 0; i < N_GEN; i++) {
            gseq[i] = tok;
            if (i + 1 < N_GEN)
                CHECK(nstf_llama_forward_seq(g.run, &gseq[i], 1, N_PROMPT + i, false, NULL, &tok) == NSTF_OK, "%s",
                      nstf_last_error());
        }
        int same = 0, prefix = 0;
        for (int i = 0; i < N_GEN; i++) same += cseq[i] == gseq[i];
        while (prefix < N_GEN && cseq[prefix] == gseq[prefix]) prefix++;
        printf("  greedy %d tokens: GPU == CPU at %d positions, identical prefix %d (reported)\n", N_GEN, same, prefix);
    }

    /* out of device memory: a message, not a crash */
    {
        placed big = {0};
        nstf_status so = place_model(m, true, false, 1 << 24, 512, &big);
        bool ok = so == NSTF_ERR_OOM && !big.run && strstr(nstf_last_error(), "free");
        printf("  context of 2^24 positions: %s -> \"%s\"  %s\n", nstf_status_str(so), nstf_last_error(),
               ok ? "ok" : "FAIL");
        if (!ok) g_fail++;
        placed_free(&big);
    }
done:
    placed_free(&g);
    placed_free(&cpu);
    free(lc);
    free(lg);
    nstf_llama_free(m);
}

static bool exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

int main(int argc, char **argv) {
    if (nstf_backend_gpu_count() < 1) {
        printf("test_e2e_gpu: no GPU; skipped\n");
        return 77;
    }
    char line[320];
    CHECK(nstf_backend_gpu_line(0, line, sizeof line) == NSTF_OK, "%s", nstf_last_error());
    printf("%s\n", line);
    if (argc > 1) {
        for (int i = 1; i < argc; i++) run_model(argv[i], strstr(argv[i], "SmolLM2-135M-Instruct") != NULL);
    } else {
        static const char *types[] = {"q4_1", "bf16", "q8_0"};
        for (int i = 0; i < 3; i++) {
            char path[1024];
            if (!random_model_path(path, sizeof path, types[i])) {
                printf("cannot generate %s  FAIL\n", path);
                g_fail++;
                continue;
            }
            run_model(path, false);
        }
        const char *real = NSTF_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
        if (exists(real)) {
            run_model(real, true);
        } else {
            printf("real SmolLM2 model not present (models/SmolLM2-135M-Instruct.Q4_1.gguf; make model)  FAIL\n");
            g_fail++;
        }
    }
    printf("test_e2e_gpu: %s (%d comparison failures)\n", g_fail ? "FAIL" : "ok", g_fail);
    return test_finish("test_e2e_gpu") | (g_fail ? 1 : 0);
}
