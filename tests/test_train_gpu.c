/* test_train_gpu.c — the training step on the GPU against the same step on
 * the CPU (fp32, itself held to PyTorch by test_train_torch), on
 * tests/data/hf_tiny (2 layers, width 128, head size 64, 2 query heads on 1
 * kv head, untied output, vocabulary 416; an HF folder: RoPE in NEOX
 * mode), 2 sequences of 64 random tokens. Skipped (exit 77) without a GPU.
 *
 * The GPU runs bf16 activations and weights (fp32 master weights,
 * gradients, moments and residual stream); its ops are each held to 2x
 * a naive bf16 computation by test_backend_ops_gpu's gradient mode. Here
 * the whole step, with these tolerances against the CPU's fp32 step:
 *   - the loss and the gradient norm within a relative 1e-2;
 *   - each parameter's gradient NMSE <= 1e-3 (a bf16 step carries relative
 *     errors of a few 2^-9 through each layer; the worst NMSE is printed);
 *   - the GPU's recompute modes attn and full bitwise equal to none (its
 *     kernels are deterministic: no atomics, fixed tiles);
 *   - LoRA (rank 8, every matrix, a frozen bf16 base): the adapters'
 *     gradients NMSE <= 1e-3 against the CPU's;
 *   - five more steps run and the loss on the same batch falls. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "io/hf_model.h"
#include "model/train.h"
#include "test_util.h"

/* from the repository root (where CTest and scripts/device run it), else
 * the source tree it was built from */
#define MODEL_REL "tests/data/hf_tiny"
#define MODEL_SRC NSTF_SOURCE_DIR "/" MODEL_REL

typedef struct step_out {
    double loss, norm;
    float *g;
    nstf_train *t;
    nstf_backend *be; /* each run on its own backend (a backend is prepared for one model run) */
} step_out;

static bool one_step(const nstf_llama *m, bool on_gpu, nstf_recompute mode, int rank, const int32_t *tok,
                     step_out *o) {
    const train_shape sh = {2, 64, rank, rank ? 0x7fu : 0u, mode, 1};
    memset(o, 0, sizeof *o);
    const nstf_cpu_params cp = {0, true, true, 32};
    nstf_status st = on_gpu ? nstf_backend_gpu_create(0, &o->be) : nstf_backend_cpu_create(&cp, &o->be);
    CHECK(st == NSTF_OK, "backend: %s", nstf_last_error());
    if (st != NSTF_OK) return false;
    nstf_backend *be = o->be;
    st = nstf_train_create(m, be, &sh, 7, &o->t);
    CHECK(st == NSTF_OK, "%s: train_create: %s", be->device, nstf_last_error());
    if (st != NSTF_OK) return false;
    const nstf_adamw_params opt = {1e-3, 0.9, 0.95, 1e-8, 0.1};
    st = nstf_train_step(o->t, tok, 1, 0, &opt, 1.0, &o->loss, &o->norm);
    CHECK(st == NSTF_OK, "%s: train_step: %s", be->device, nstf_last_error());
    o->g = malloc((size_t)o->t->n_flat * 4);
    CHECK(st == NSTF_OK && be->vt->download(be, o->g, o->t->g, (uint64_t)o->t->n_flat * 4) == NSTF_OK, "download");
    return st == NSTF_OK;
}

static void compare(const char *what, const step_out *gpu, const step_out *cpu) {
    CHECK(fabs(gpu->loss - cpu->loss) <= 1e-2 * fabs(cpu->loss), "%s: loss %.6f, CPU %.6f", what, gpu->loss, cpu->loss);
    CHECK(fabs(gpu->norm - cpu->norm) <= 1e-2 * fabs(cpu->norm), "%s: gradient norm %.6f, CPU %.6f", what, gpu->norm,
          cpu->norm);
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < cpu->t->n_ptab; i++) {
        const nstf_param_tensor *p = &cpu->t->ptab[i];
        double *ref = malloc((size_t)p->n * 8);
        for (int64_t k = 0; k < p->n; k++) ref[k] = cpu->g[p->offset + k];
        const double e = nmse(gpu->g + p->offset, ref, p->n);
        CHECK(e <= 1e-3 && count_nonfinite(gpu->g + p->offset, p->n) == 0, "%s: gradient of %s: NMSE %.3g vs the CPU",
              what, p->name, e);
        if (e > worst) worst = e, worst_name = p->name;
        free(ref);
    }
    printf("  %-12s loss %.6f (CPU %.6f), grad norm %.5f (CPU %.5f), worst gradient NMSE %.2e (%s)\n", what,
           gpu->loss, cpu->loss, gpu->norm, cpu->norm, worst, worst_name);
}

static void drop(step_out *o) {
    free(o->g);
    nstf_train_free(o->t);
    nstf_backend_free(o->be);
    memset(o, 0, sizeof *o);
}

int main(void) {
    if (!nstf_backend_gpu_built() || nstf_backend_gpu_count() < 1) {
        printf("test_train_gpu: no GPU; skipped\n");
        return 77;
    }
    nstf_gguf *g = NULL;
    nstf_llama *m = NULL;
    const char *model = access(MODEL_REL "/config.json", R_OK) == 0 ? MODEL_REL : MODEL_SRC;
    CHECK(nstf_model_file_open(model, &g) == NSTF_OK && nstf_llama_load(g, &m) == NSTF_OK, "%s", nstf_last_error());
    if (!m) return test_finish("test_train_gpu");
    int32_t tok[2 * 65];
    test_rng r = {99};
    for (int i = 0; i < 2 * 65; i++) tok[i] = (int32_t)(rng_next(&r) % (uint64_t)m->cfg.n_vocab);

    step_out c0 = {0}, g0 = {0}, g1 = {0};
    if (one_step(m, false, NSTF_RECOMPUTE_NONE, 0, tok, &c0) && one_step(m, true, NSTF_RECOMPUTE_NONE, 0, tok, &g0)) {
        printf("  %s\n", g0.be->device);
        compare("full", &g0, &c0);
        const char *modes[] = {"recompute attn", "recompute full"};
        for (int k = 0; k < 2; k++) {
            if (!one_step(m, true, (nstf_recompute)(k + 1), 0, tok, &g1)) break;
            CHECK(g1.loss == g0.loss && memcmp(g1.g, g0.g, (size_t)g0.t->n_flat * 4) == 0,
                  "GPU %s: gradients differ from recompute none", modes[k]);
            printf("  GPU %s bitwise equal to recompute none\n", modes[k]);
            drop(&g1);
        }
        /* five more steps on the same batch: the loss falls */
        const nstf_adamw_params opt = {1e-3, 0.9, 0.95, 1e-8, 0.1};
        double loss = g0.loss, norm = 0;
        for (int s = 1; s <= 5; s++)
            CHECK(nstf_train_step(g0.t, tok, 1, s, &opt, 1.0, &loss, &norm) == NSTF_OK, "%s", nstf_last_error());
        CHECK(loss < g0.loss - 0.05, "GPU: the loss went from %.4f to %.4f in 5 more steps", g0.loss, loss);
        printf("  GPU 6 steps on one batch: loss %.4f -> %.4f\n", g0.loss, loss);
    }
    drop(&c0), drop(&g0);
    if (one_step(m, false, NSTF_RECOMPUTE_NONE, 8, tok, &c0) && one_step(m, true, NSTF_RECOMPUTE_NONE, 8, tok, &g0))
        compare("LoRA rank 8", &g0, &c0);
    drop(&c0), drop(&g0);
    nstf_llama_free(m);
    return test_finish("test_train_gpu");
}
