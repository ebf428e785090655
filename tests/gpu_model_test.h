/* gpu_model_test.h — the random-weight model the C GPU tests run on when
 * they are given no file: <build>/tests/random-smollm2-135m-<type>.gguf,
 * written by `nstf gen-model` on first use. Needs NSTF_BUILD_DIR (set for
 * these tests in cmake/gpu.cmake). */
#ifndef NSTF_TESTS_GPU_MODEL_TEST_H
#define NSTF_TESTS_GPU_MODEL_TEST_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

/* Puts the model's path in path; generates the file if it is missing.
 * False when it cannot be generated. */
static bool random_model_path(char *path, size_t cap, const char *type) {
    struct stat sb;
    snprintf(path, cap, "%s/tests/random-smollm2-135m-%s.gguf", NSTF_BUILD_DIR, type);
    if (stat(path, &sb) == 0) return true;
    char cmd[2600];
    snprintf(cmd, sizeof cmd, "'%s/nstf' gen-model --shape smollm2-135m --type %s -o '%s'", NSTF_BUILD_DIR, type,
             path);
    return system(cmd) == 0;
}

#endif
