/* arch.h — the architectures NSTF runs, one row each: how a model of the
 * family is named in a GGUF file (general.architecture) and in an HF
 * folder (config.json model_type and architectures), and the features the
 * loader, the HF view and the forward take from the row. Adding an
 * architecture of the Llama shape is a row here plus the ops its features
 * need (src/ops/ops.h), not a new forward.
 *
 * Features beyond the Llama block:
 *   qkv_bias   Q, K and V projections have biases (blk.N.attn_{q,k,v}.bias)
 *   qk_norm    per-head RMSNorm of q and k before RoPE (blk.N.attn_{q,k}_norm)
 *   window     a sliding attention window ({arch}.attention.sliding_window,
 *              HF sliding_window)
 * and, for every row, RoPE frequency factors (rope_freqs.weight, Llama 3.x
 * rope_scaling "llama3") and linear RoPE scaling when a file has them. */
#ifndef NSTF_MODEL_ARCH_H
#define NSTF_MODEL_ARCH_H

#include <stdbool.h>
#include <stddef.h>

#include "ops/ops.h"

typedef enum nstf_arch_need {
    NSTF_ARCH_NO = 0,       /* the tensors must not be there */
    NSTF_ARCH_OPTIONAL,     /* loaded when present */
    NSTF_ARCH_REQUIRED,     /* a file without them is refused */
} nstf_arch_need;

typedef struct nstf_arch {
    const char *name;     /* "llama", "mistral", "qwen2", "qwen3" */
    const char *gguf;     /* general.architecture of its GGUF files (and the key prefix) */
    const char *hf_type;  /* config.json model_type */
    const char *hf_class; /* config.json architectures[0] */
    const char *family;   /* for messages: "Llama 1-3.x" */
    /* Q/K rows of its GGUF files: NORM (llama.cpp permutes HF's rotate-half
     * rows to adjacent pairs; an HF view of it sets nstf.rope.neox instead)
     * or NEOX (stored as HF has them) */
    nstf_rope_mode gguf_rope;
    nstf_arch_need qkv_bias;
    nstf_arch_need qk_norm;
    bool window;          /* an HF config's sliding_window is the model's window */
} nstf_arch;

/* The row of a GGUF general.architecture (the first of that name: "llama"
 * is the Llama row, which also runs Mistral files), or NULL. */
const nstf_arch *nstf_arch_by_gguf(const char *name);
/* The row of an HF config.json model_type, or NULL. */
const nstf_arch *nstf_arch_by_hf(const char *model_type);
/* The supported names, for an error message, into buf (cap bytes, always
 * terminated): GGUF names with their families, "llama (Llama 1-3.x,
 * Mistral), qwen2 (Qwen2, Qwen2.5), qwen3 (Qwen3)", or with hf the
 * model_types, "llama, mistral, qwen2, qwen3". */
void nstf_arch_names(bool hf, char *buf, size_t cap);

#endif
