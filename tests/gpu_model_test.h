/* gpu_model_test.h — what the C GPU tests share: the random-weight model
 * they run on when given no file (<build>/tests/random-smollm2-135m-
 * <type>.gguf, written by `nstf gen-model` on first use; needs
 * NSTF_BUILD_DIR, set for these tests in cmake/gpu.cmake, or the
 * environment's NSTF_TEST_MODEL_DIR and NSTF_TEST_NSTF), and a model
 * placed on the GPU backend or the CPU backend for comparison. */
#ifndef NSTF_TESTS_GPU_MODEL_TEST_H
#define NSTF_TESTS_GPU_MODEL_TEST_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "io/gguf.h"
#include "model/llama.h"

/* Puts the model's path in path; generates the file if it is missing.
 * False when it cannot be generated. Where the tests run from a copy of
 * the build (another machine), NSTF_TEST_MODEL_DIR names the directory
 * for the files and NSTF_TEST_NSTF the nstf binary that writes them. */
static inline bool random_model_path(char *path, size_t cap, const char *type) {
    struct stat sb;
    const char *dir = getenv("NSTF_TEST_MODEL_DIR"), *bin = getenv("NSTF_TEST_NSTF");
    if (!dir || !*dir) dir = NSTF_BUILD_DIR "/tests";
    if (!bin || !*bin) bin = NSTF_BUILD_DIR "/nstf";
    snprintf(path, cap, "%s/random-smollm2-135m-%s.gguf", dir, type);
    if (stat(path, &sb) == 0) return true;
    char cmd[2600];
    snprintf(cmd, sizeof cmd, "'%s' gen-model --shape smollm2-135m --type %s -o '%s'", bin, type, path);
    return system(cmd) == 0;
}

/* A model on a backend: GPU 0 (gpu) or the CPU (fp32 activations in the
 * matmuls when precise). */
typedef struct placed {
    nstf_backend *be;
    nstf_llama_run *run;
} placed;

/* As place_model, with the KV cache in Q8_0 when kv_q8. */
static inline nstf_status place_model_kv(const nstf_llama *m, bool gpu, bool precise, int n_ctx, int n_batch,
                                         bool kv_q8, placed *p) {
    p->be = NULL;
    p->run = NULL;
    nstf_status st;
    if (gpu) {
        st = nstf_backend_gpu_create(0, &p->be);
    } else {
        const nstf_cpu_params cp = {0, precise, false, 0};
        st = nstf_backend_cpu_create(&cp, &p->be);
    }
    const nstf_llama_run_shape sh = {n_ctx, n_batch, 1, 0, m->cfg.n_layers, true, true, 0, 0, kv_q8};
    if (st == NSTF_OK) st = nstf_llama_run_create_shaped(m, p->be, &sh, &p->run);
    if (st != NSTF_OK) {
        nstf_backend_free(p->be);
        p->be = NULL;
    }
    return st;
}

static inline nstf_status place_model(const nstf_llama *m, bool gpu, bool precise, int n_ctx, int n_batch, placed *p) {
    return place_model_kv(m, gpu, precise, n_ctx, n_batch, false, p);
}

static inline void placed_free(placed *p) {
    nstf_llama_run_free(p->run);
    nstf_backend_free(p->be);
    p->run = NULL;
    p->be = NULL;
}

static inline nstf_status placed_set(placed *p, nstf_backend_opt opt, int v) { return p->be->vt->set_opt(p->be, opt, v); }
static inline int placed_get(const placed *p, nstf_backend_opt opt) { return p->be->vt->get_opt(p->be, opt); }

/* Open and load a model file (the model owns the file on success). */
static inline nstf_status load_model(const char *path, nstf_llama **m) {
    nstf_gguf *f;
    NSTF_TRY(nstf_gguf_open(path, &f));
    nstf_status st = nstf_llama_load(f, m);
    if (st != NSTF_OK) nstf_gguf_close(f);
    return st;
}

#endif
