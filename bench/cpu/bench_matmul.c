/* bench_matmul.c — nstf_cpu_matmul on the SmolLM2-135M shapes.
 *
 * Allocates the whole model's matmul weights (30 layers x {q, k, v, o,
 * gate, up, down} in Q4_1, plus the tied [49152 x 576] output in Q8_0;
 * ~96 MB, more than the L3), so every call streams its weights as in a
 * real forward. For n_tok = 1 (decode) and 512 (prefill), on 1 and 2
 * threads, it prints per shape the time per call, GFLOP/s and GB/s of
 * weights, then times a full pass (every layer in order, then the output)
 * and projects model tokens/s from it.
 *
 * usage: bench_matmul [n_threads_max=2] [reps=3] [n_tok: 0 = both, 1, 512] [hot=0]
 *                     [layer type=Q4_1] [output type=Q8_0] [ffn_down type=layer type]
 * hot=1 reuses layer 0's weights for every layer (cache-resident: kernel speed).
 * Types are any nstf type name; a super-block type (Q4_K, ...) on a
 * 576-wide matrix is not possible, so e.g. the Q4_K_M file's mix is
 * "Q5_0 Q8_0 Q4_K" (576-wide matrices Q5_0, output Q8_0, ffn_down Q4_K).
 * NSTF_CPU_ISA=scalar|avx2|avx512 forces a SIMD level. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/dtype.h"
#include "core/mem.h"
#include "core/threadpool.h"
#include "ops/cpu/cpu_isa.h"
#include "ops/ops.h"

#define N_LAYER 30
#define DIM 576
#define KV_DIM 192
#define FFN 1536
#define VOCAB 49152

typedef struct { const char *name; int64_t n_in, n_out; nstf_type type; } shape;
static shape k_shapes[8] = {
    {"q", DIM, DIM, NSTF_TYPE_Q4_1},      {"k", DIM, KV_DIM, NSTF_TYPE_Q4_1},
    {"v", DIM, KV_DIM, NSTF_TYPE_Q4_1},   {"o", DIM, DIM, NSTF_TYPE_Q4_1},
    {"gate", DIM, FFN, NSTF_TYPE_Q4_1},   {"up", DIM, FFN, NSTF_TYPE_Q4_1},
    {"down", FFN, DIM, NSTF_TYPE_Q4_1},   {"output", DIM, VOCAB, NSTF_TYPE_Q8_0},
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU time of the calling thread: with one thread this is the kernel's cost
 * even when other processes share the cores (wall time is printed too). */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t g_rng = 88172645463325252ull;
static float frand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

static void *make_weights(const shape *s) {
    uint64_t rb;
    nstf_type_row_bytes(s->type, s->n_in, &rb);
    uint8_t *w = nstf_alloc((size_t)(rb * (uint64_t)s->n_out), "bench weights");
    float *row = malloc((size_t)s->n_in * 4);
    if (!w || !row) { fprintf(stderr, "out of memory\n"); exit(1); }
    for (int64_t o = 0; o < s->n_out; o++) {
        for (int64_t i = 0; i < s->n_in; i++) row[i] = 0.05f * frand();
        nstf_quantize_row(s->type, row, w + o * rb, s->n_in);
    }
    free(row);
    return w;
}

int main(int argc, char **argv) {
    int max_threads = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 3;
    if (max_threads < 1) max_threads = 1;
    if (reps < 1) reps = 1;
    nstf_type lt = NSTF_TYPE_Q4_1, ot = NSTF_TYPE_Q8_0, dt;
    if ((argc > 5 && !nstf_type_from_name(argv[5], &lt)) || (argc > 6 && !nstf_type_from_name(argv[6], &ot))) {
        fprintf(stderr, "bench_matmul: unknown type\n");
        return 2;
    }
    dt = lt;
    if (argc > 7 && !nstf_type_from_name(argv[7], &dt)) {
        fprintf(stderr, "bench_matmul: unknown type\n");
        return 2;
    }
    for (int s = 0; s < 7; s++) k_shapes[s].type = s == 6 ? dt : lt;
    k_shapes[7].type = ot;
    for (int s = 0; s < 8; s++)
        if (k_shapes[s].n_in % nstf_type_block_elems(k_shapes[s].type) != 0) {
            fprintf(stderr, "bench_matmul: %s rows of %lld are not whole %s blocks\n", k_shapes[s].name,
                    (long long)k_shapes[s].n_in, nstf_type_name(k_shapes[s].type));
            return 2;
        }
    printf("types: layers %s, ffn_down %s, output %s; SIMD %s\n", nstf_type_name(lt), nstf_type_name(dt),
           nstf_type_name(ot), nstf_cpu_isa_name(nstf_cpu_isa_current()));
    void *w[N_LAYER][7], *w_out;
    for (int l = 0; l < N_LAYER; l++)
        for (int s = 0; s < 7; s++) w[l][s] = make_weights(&k_shapes[s]);
    w_out = make_weights(&k_shapes[7]);

    const int64_t toks[2] = {1, 512};
    float *x = malloc((size_t)512 * FFN * 4), *y = malloc((size_t)512 * VOCAB * 4);
    if (!x || !y) return 1;
    for (int64_t i = 0; i < 512 * FFN; i++) x[i] = frand();

    int only_tok = argc > 3 ? atoi(argv[3]) : 0, hot = argc > 4 ? atoi(argv[4]) : 0;
    if (hot)
        for (int l = 1; l < N_LAYER; l++)
            for (int s = 0; s < 7; s++) w[l][s] = w[0][s];
    for (int ti = 0; ti < 2; ti++)
        for (int nth = 1; nth <= max_threads; nth++) {
            int64_t n_tok = toks[ti];
            if (only_tok && n_tok != only_tok) continue;
            nstf_pool *pool;
            if (nstf_pool_create(nth, &pool) != NSTF_OK) return 1;
            nstf_cpu cpu = {.pool = pool};
            if (nstf_cpu_reserve(&cpu, n_tok, FFN) != NSTF_OK) return 1;
            int r = n_tok == 1 ? reps * 20 : reps;
            printf("\nn_tok=%lld threads=%d\n", (long long)n_tok, nth);
            printf("  %-7s %-6s %7s %7s %10s %9s %8s %12s\n", "shape", "type", "n_in", "n_out", "us/call",
                   "GFLOP/s", "GB/s(W)", "cpu us/call");
            double sum_layers = 0.0, t_out = 0.0;
            for (int s = 0; s < 8; s++) {
                const shape *sh = &k_shapes[s];
                int n_mat = s < 7 ? N_LAYER : 1;
                int rr = s < 7 ? r : (n_tok == 1 ? r : 1);
                /* warm-up, then time rr passes over the N_LAYER copies */
                nstf_cpu_matmul(&cpu, sh->type, s < 7 ? w[0][s] : w_out, x, y, n_tok, sh->n_in,
                                sh->n_out);
                double t0 = now_s(), c0 = cpu_s();
                for (int k = 0; k < rr; k++)
                    for (int l = 0; l < n_mat; l++)
                        nstf_cpu_matmul(&cpu, sh->type, s < 7 ? w[l][s] : w_out, x, y, n_tok,
                                        sh->n_in, sh->n_out);
                double per = (now_s() - t0) / (rr * n_mat);
                double cper = (cpu_s() - c0) / (rr * n_mat);
                uint64_t rb;
                nstf_type_row_bytes(sh->type, sh->n_in, &rb);
                double flop = 2.0 * (double)n_tok * (double)sh->n_in * (double)sh->n_out;
                double bytes = (double)rb * (double)sh->n_out;
                printf("  %-7s %-6s %7lld %7lld %10.1f %9.1f %8.1f %12.1f\n", sh->name, nstf_type_name(sh->type),
                       (long long)sh->n_in, (long long)sh->n_out, per * 1e6, flop / per * 1e-9,
                       bytes / per * 1e-9, cper * 1e6);
                if (s < 7)
                    sum_layers += per * N_LAYER;
                else
                    t_out = per;
            }
            /* a full pass in model order */
            int rp = n_tok == 1 ? r : 1;
            double t0 = now_s();
            for (int k = 0; k < rp; k++) {
                for (int l = 0; l < N_LAYER; l++)
                    for (int s = 0; s < 7; s++)
                        nstf_cpu_matmul(&cpu, k_shapes[s].type, w[l][s], x, y, n_tok,
                                        k_shapes[s].n_in, k_shapes[s].n_out);
                nstf_cpu_matmul(&cpu, k_shapes[7].type, w_out, x, y, n_tok, DIM, VOCAB);
            }
            double pass = (now_s() - t0) / rp;
            printf("  sum of shapes: layers %.2f ms + output %.2f ms -> %.1f tok/s\n",
                   sum_layers * 1e3, t_out * 1e3, (double)n_tok / (sum_layers + t_out));
            printf("  full pass in model order: %.2f ms -> %.1f tok/s", pass * 1e3,
                   (double)n_tok / pass);
            if (n_tok > 1) {
                /* a prompt needs logits for its last token only */
                double last = t_out / (double)n_tok * 1.0;
                printf("; with logits for the last token only: %.1f tok/s",
                       (double)n_tok / (pass - t_out + last));
            }
            printf("\n");
            nstf_cpu_release(&cpu);
            nstf_pool_free(pool);
        }
    free(x);
    free(y);
    for (int l = 0; l < (hot ? 1 : N_LAYER); l++)
        for (int s = 0; s < 7; s++) nstf_free(w[l][s]);
    nstf_free(w_out);
    return 0;
}
