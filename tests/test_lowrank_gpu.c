/* test_lowrank_gpu.c — low-rank matrices through the GPU backend, at
 * every execution level: the model (SmolLM2 when present, else the
 * random-weight SmolLM2-shaped Q8_0 model) with every layer's Q, K, V, O,
 * gate and up matrices replaced by an exact factorization that needs no
 * SVD (A = I, B = W when n_in <= n_out; A = W, B = I otherwise; I in
 * F16) against the same model dense, on the GPU, prefill of 37 tokens and
 * 4 decode steps. The identity stage only copies bf16 activations, so the
 * factorized forward computes what the dense one does; the tolerance,
 * NMSE <= 1e-6 of the logits, leaves room only for a GEMM that tiles the
 * Q|K|V group differently from its parts (different summation blocks, fp32
 * accumulation). `test_lowrank_gpu [MODEL]` takes the model from its
 * argument where the build directory's CLI cannot make the random one (a
 * copied build). Skipped (77) without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/mem.h"
#include "gpu_model_test.h"
#include "test_util.h"

#define REAL_MODEL NSTF_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf"

/* An F16 identity [n, n]. */
static uint16_t *identity(int64_t n) {
    uint16_t *e = calloc((size_t)(n * n), 2);
    for (int64_t i = 0; e && i < n; i++) e[i * n + i] = nstf_f32_to_fp16(1.0f);
    return e;
}

int main(int argc, char **argv) {
    if (nstf_backend_gpu_count() < 1) {
        printf("test_lowrank_gpu: no GPU; skipped\n");
        return 77;
    }
    char path[512];
    if (argc > 1) snprintf(path, sizeof path, "%s", argv[1]);
    else if (access(REAL_MODEL, R_OK) == 0) snprintf(path, sizeof path, "%s", REAL_MODEL);
    else if (!random_model_path(path, sizeof path, "q8_0")) {
        printf("test_lowrank_gpu: cannot make the random model; skipped\n");
        return 77;
    }
    nstf_llama *dense = NULL, *lr = NULL;
    CHECK(load_model(path, &dense) == NSTF_OK && load_model(path, &lr) == NSTF_OK, "load: %s", nstf_last_error());
    if (!dense || !lr) return test_finish("test_lowrank_gpu");
    const nstf_llama_config *c = &lr->cfg;
    uint16_t *eye_d = identity(c->dim), *eye_kv = identity((int64_t)c->n_kv_heads * c->head_dim);
    for (int l = 0; l < c->n_layers; l++) {
        nstf_llama_layer *L = &lr->w.layers[l];
        nstf_matrix *m[6] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up};
        for (int k = 0; k < 6; k++) {
            nstf_matrix *fac = lr->w.factors + (size_t)14 * l + 2 * k, w = *m[k];
            if (w.n_in <= w.n_out) { /* A = I [n_in, n_in], B = W */
                fac[0] = (nstf_matrix){eye_d, NSTF_TYPE_F16, w.n_in, w.n_in, NULL};
                fac[1] = (nstf_matrix){w.data, w.type, w.n_in, w.n_out, NULL};
            } else { /* A = W, B = I [n_out, n_out] */
                fac[0] = (nstf_matrix){w.data, w.type, w.n_in, w.n_out, NULL};
                fac[1] = (nstf_matrix){eye_kv, NSTF_TYPE_F16, w.n_out, w.n_out, NULL};
            }
            *m[k] = (nstf_matrix){NULL, w.type, w.n_in, w.n_out, fac};
        }
    }
    const int n_prompt = 37, n_dec = 4, nv = c->n_vocab;
    int32_t toks[64];
    for (int i = 0; i < n_prompt + n_dec; i++) toks[i] = (int32_t)((i * 7919 + 13) % nv);
    float *a = malloc((size_t)nv * 4), *b = malloc((size_t)nv * 4);
    placed pd, pl;
    CHECK(place_model(dense, true, false, 128, 64, &pd) == NSTF_OK, "dense on the GPU: %s", nstf_last_error());
    CHECK(place_model(lr, true, false, 128, 64, &pl) == NSTF_OK, "factorized on the GPU: %s", nstf_last_error());
    for (int level = 0; pd.run && pl.run && level < pd.be->vt->n_levels; level++) {
        CHECK(placed_set(&pd, NSTF_OPT_LEVEL, level) == NSTF_OK && placed_set(&pl, NSTF_OPT_LEVEL, level) == NSTF_OK,
              "level %d: %s", level, nstf_last_error());
        double worst = 0;
        for (int step = 0; step <= n_dec; step++) {
            const int pos0 = step ? n_prompt + step - 1 : 0, n = step ? 1 : n_prompt;
            CHECK(nstf_llama_forward_seq(pd.run, toks + pos0, n, pos0, false, a, NULL) == NSTF_OK &&
                      nstf_llama_forward_seq(pl.run, toks + pos0, n, pos0, false, b, NULL) == NSTF_OK,
                  "L%d step %d: %s", level, step, nstf_last_error());
            double e = 0, r = 0;
            for (int i = 0; i < nv; i++) e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), r += (double)a[i] * a[i];
            worst = fmax(worst, r > 0 ? e / r : e);
        }
        printf("  L%d: factorized vs dense logits, worst NMSE %.3g over prefill and %d decode steps\n", level, worst,
               n_dec);
        CHECK(worst <= 1e-6, "L%d: factorized vs dense NMSE %.3g (tolerance 1e-6)", level, worst);
    }
    placed_free(&pd);
    placed_free(&pl);
    nstf_llama_free(dense);
    nstf_llama_free(lr);
    free(eye_d), free(eye_kv), free(a), free(b);
    return test_finish("test_lowrank_gpu");
}
