/* test_determinism_gpu.c — the GPU forward is bitwise deterministic run to
 * run: greedy decoding after a long prompt (600 positions, so the split-KV
 * flash decoding splits each row's keys) gives bitwise-identical logits at
 * every step in three runs on fresh GPU models: two replaying the decode
 * graph, one with plain launches. The decode path reduces with fixed-order
 * wave butterflies and a fixed-order split merge, no atomics.
 * Model: argv[1], else a random smollm2-135m-shaped bf16 model written by
 * `nstf gen-model` into the build folder. Exit 77 without a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_model_test.h"
#include "test_util.h"

#define N_PROMPT 600
#define N_GEN 32

/* Logits of the prompt's last token and of every decode step,
 * [(N_GEN + 1) * n_vocab], into out. */
static int run(const nstf_llama *m, bool graphs, float *out) {
    const int nv = m->cfg.n_vocab;
    placed g;
    if (place_model(m, true, false, 1024, 512, &g) != NSTF_OK) {
        CHECK(0, "gpu create: %s", nstf_last_error());
        return 0;
    }
    (void)placed_set(&g, NSTF_OPT_GRAPHS, graphs);
    int32_t prompt[N_PROMPT];
    test_rng r = {7};
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (int32_t)(rng_next(&r) % (uint64_t)nv);
    nstf_status st = NSTF_OK;
    int32_t tok = 0;
    for (int i = 0; st == NSTF_OK && i < N_PROMPT; i += 512) {
        int n = N_PROMPT - i < 512 ? N_PROMPT - i : 512;
        st = nstf_llama_forward_seq(g.run, prompt + i, n, i, false, out, &tok);
    }
    for (int s = 1; st == NSTF_OK && s <= N_GEN; s++)
        st = nstf_llama_forward_seq(g.run, &tok, 1, N_PROMPT + s - 1, false, out + (size_t)s * nv, &tok);
    CHECK(st == NSTF_OK, "forward: %s", nstf_last_error());
    CHECK(!graphs || placed_get(&g, NSTF_OPT_GRAPH_USED), "the decode step did not run from a graph");
    placed_free(&g);
    return st == NSTF_OK;
}

int main(int argc, char **argv) {
    if (nstf_backend_gpu_count() < 1) {
        printf("test_determinism_gpu: no GPU; skipped\n");
        return TEST_SKIP;
    }
    char path[1024];
    if (argc > 1) {
        snprintf(path, sizeof path, "%s", argv[1]);
    } else {
        CHECK(random_model_path(path, sizeof path, "bf16"), "cannot generate %s", path);
    }
    nstf_llama *m;
    if (load_model(path, &m) != NSTF_OK) {
        CHECK(0, "%s", nstf_last_error());
        return test_finish("test_determinism_gpu");
    }
    const size_t n = (size_t)(N_GEN + 1) * (size_t)m->cfg.n_vocab;
    float *a = malloc(n * 4), *b = malloc(n * 4);
    if (run(m, true, a)) {
        const bool graphs[] = {true, false};
        for (int i = 0; i < 2; i++) {
            if (!run(m, graphs[i], b)) continue;
            int same = memcmp(a, b, n * 4) == 0;
            printf("%s: greedy decode of %d tokens after %d: %s\n", graphs[i] ? "second run, graph" : "third run, plain launches",
                   N_GEN, N_PROMPT, same ? "bitwise identical logits" : "DIFFERENT");
            CHECK(same, "GPU logits differ between runs (%s)", graphs[i] ? "graph" : "plain launches");
        }
    }
    free(a);
    free(b);
    nstf_llama_free(m);
    return test_finish("test_determinism_gpu");
}
