/* model_test.h — the test model file opened and loaded, or why not: what
 * the CPU tests that run on models/SmolLM2-135M-Instruct.Q4_1.gguf share
 * (test_batch, test_split, test_tp). */
#ifndef NSTF_TESTS_MODEL_TEST_H
#define NSTF_TESTS_MODEL_TEST_H

#include <stdio.h>

#include "io/gguf.h"
#include "model/llama.h"
#include "test_util.h"

/* Opens and loads the model at path into *g and *m. Returns 0 when it is
 * loaded; 77 when the file is not there (the test skips; the line says
 * so); 1 when it is there but does not load (a failed check). */
static inline int test_model_load(const char *path, const char *test, nstf_gguf **g, nstf_llama **m) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("%s: model not fetched (make model); the model part skipped\n", test);
        return 77;
    }
    fclose(f);
    if (nstf_gguf_open(path, g) != NSTF_OK || nstf_llama_load(*g, m) != NSTF_OK) {
        CHECK(0, "%s", nstf_last_error());
        return 1;
    }
    return 0;
}

#endif
