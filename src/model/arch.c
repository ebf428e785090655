/* arch.c — the architecture table (see arch.h) and its lookups. */
#include "model/arch.h"

#include <string.h>

static const nstf_arch k_arch[] = {
    {"llama", "llama", "llama", "LlamaForCausalLM", "Llama 1-3.x", NSTF_ROPE_NORM, NSTF_ARCH_OPTIONAL, NSTF_ARCH_NO,
     false},
    {"mistral", "llama", "mistral", "MistralForCausalLM", "Mistral", NSTF_ROPE_NORM, NSTF_ARCH_NO, NSTF_ARCH_NO, true},
    {"qwen2", "qwen2", "qwen2", "Qwen2ForCausalLM", "Qwen2, Qwen2.5", NSTF_ROPE_NEOX, NSTF_ARCH_REQUIRED, NSTF_ARCH_NO,
     false},
    {"qwen3", "qwen3", "qwen3", "Qwen3ForCausalLM", "Qwen3", NSTF_ROPE_NEOX, NSTF_ARCH_OPTIONAL, NSTF_ARCH_REQUIRED,
     false},
};
#define N_ARCH (sizeof k_arch / sizeof k_arch[0])

const nstf_arch *nstf_arch_by_gguf(const char *name) {
    for (size_t i = 0; name && i < N_ARCH; i++)
        if (strcmp(k_arch[i].gguf, name) == 0) return &k_arch[i];
    return NULL;
}

const nstf_arch *nstf_arch_by_hf(const char *model_type) {
    for (size_t i = 0; model_type && i < N_ARCH; i++)
        if (strcmp(k_arch[i].hf_type, model_type) == 0) return &k_arch[i];
    return NULL;
}

static void put(char *buf, size_t cap, size_t *n, const char *s) {
    while (*s && *n + 1 < cap) buf[(*n)++] = *s++;
    buf[*n] = 0;
}

void nstf_arch_names(bool hf, char *buf, size_t cap) {
    size_t n = 0;
    if (!buf || cap == 0) return;
    buf[0] = 0;
    for (size_t i = 0; i < N_ARCH; i++) {
        if (hf) {
            if (i) put(buf, cap, &n, ", ");
            put(buf, cap, &n, k_arch[i].hf_type);
            continue;
        }
        if (nstf_arch_by_gguf(k_arch[i].gguf) != &k_arch[i]) continue; /* listed with its first row */
        if (i) put(buf, cap, &n, ", ");
        put(buf, cap, &n, k_arch[i].gguf);
        put(buf, cap, &n, " (");
        for (size_t j = i, first = 1; j < N_ARCH; j++) {
            if (strcmp(k_arch[j].gguf, k_arch[i].gguf) != 0) continue;
            if (!first) put(buf, cap, &n, ", ");
            put(buf, cap, &n, k_arch[j].family);
            first = 0;
        }
        put(buf, cap, &n, ")");
    }
}
