/* quantize.h — re-encode a model's weights to another tensor type
 * (`nstf quantize`): a GGUF file, or an HF model folder (io/hf_model.h) in
 * one step.
 *
 * Targets: the plain types F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K,
 * Q3_K, Q4_K, Q5_K, Q6_K and the mixes Q4_K_M / Q5_K_M. Which tensor gets which type
 * follows llama.cpp's rules (llama_tensor_get_type, no importance matrix):
 *   - only matrices are quantized (names ending in "weight", >= 2 dims);
 *     vectors (norms) keep their type;
 *   - the output matrix (output.weight, or token_embd.weight when the
 *     embeddings are tied) gets Q6_K for every quantized target but Q8_0,
 *     and Q8_0 when its rows are not a multiple of 256;
 *   - Q4_K_M / Q5_K_M: attn_v and ffn_down of the layers chosen by
 *     use_more_bits (the first and last eighth of the layers and every
 *     third one in between) get Q6_K; the rest Q4_K / Q5_K;
 *   - a super-block type on rows that are not a multiple of 256 falls back
 *     as llama.cpp's does: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0;
 *     Q2_K, Q3_K -> Q4_0 (llama.cpp's fallback before IQ4_NL; it now
 *     takes IQ4_NL);
 *   - IQ4_NL, IQ4_XS: without an importance matrix ffn_down of the first
 *     eighth of the layers in Q5_K, as llama.cpp (not its attn_v rule for 4
 *     or more query heads per kv head); IQ4_XS on rows that are not a
 *     multiple of 256 falls back to IQ4_NL.
 * Every other key/value is copied; general.file_type is set to llama.cpp's
 * ftype id and general.quantization_version to 2.
 *
 * An HF folder is first taken as `nstf convert` writes it (io/convert.h:
 * Q/K rows permuted for llama-family files, vectors F32, its key/values),
 * so the result is byte for byte that of convert, then quantize.
 *
 * Tensors are converted one at a time while the file is written: memory is
 * the largest output tensor plus one fp32 row per thread, not the model
 * (the input is mapped, never copied). The output is written to a
 * temporary file beside OUT and renamed over it only when complete. Already-quantized matrices in the input are refused
 * unless allow_requantize (they are then dequantized to fp32 first, which
 * compounds the quantization error). */
#ifndef NSTF_OPT_QUANTIZE_H
#define NSTF_OPT_QUANTIZE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"
#include "io/gguf.h"

typedef enum nstf_qmix {
    NSTF_QMIX_PLAIN = 0, /* one type for every matrix (plus the output rule) */
    NSTF_QMIX_Q4_K_M,
    NSTF_QMIX_Q5_K_M,
} nstf_qmix;

typedef struct nstf_quant_target {
    const char *name;  /* "Q4_K_M", "Q8_0", ... */
    nstf_type base;    /* the type of most matrices */
    nstf_qmix mix;
    uint32_t ftype;    /* llama.cpp's llama_ftype, for general.file_type */
} nstf_quant_target;

/* Parse a target name (case-insensitive); false if unknown. */
bool nstf_quant_target_parse(const char *name, nstf_quant_target *out);
/* The names accepted, for messages: "F16, BF16, Q8_0, ..." */
const char *nstf_quant_target_list(void);

/* Progress: called from the calling thread after each piece of work with
 * the input bytes done and the total. */
typedef void (*nstf_quant_progress_fn)(void *user, uint64_t done, uint64_t total);

/* A tensor given its own type (adaptive precision, adaptive.h): it
 * replaces the target's rule for that tensor; a matrix's own type copies
 * it unchanged. */
typedef struct nstf_quant_override {
    const char *name;
    nstf_type type;
} nstf_quant_override;

typedef struct nstf_quant_params {
    nstf_quant_target target;          /* the rule for every tensor not overridden */
    const nstf_quant_override *overrides; /* [n_overrides], or NULL */
    int n_overrides;
    /* extra keys written after the input's (nstf.* metadata), or NULL */
    nstf_status (*add_keys)(void *user, nstf_gguf_writer *w);
    void *add_keys_user;
    bool allow_requantize;
    /* importance weights (imatrix.h): a quantized tensor with an entry is
     * quantized by nstf_quantize_row_w with its per-column weights; NULL:
     * ggml's reference quantizers, bit for bit */
    const struct nstf_imatrix *imatrix;
    int n_threads;                   /* >= 1 */
    nstf_quant_progress_fn progress; /* optional */
    void *progress_user;
} nstf_quant_params;

/* The type llama.cpp's rules give tensor `name` (ne0 values per row) for
 * the target; n_layers is the model's block count. Vectors and non-weight
 * tensors return `cur` (unchanged). Exposed for the tests. */
nstf_type nstf_quant_tensor_type(const nstf_quant_target *tg, const char *name, uint32_t n_dims,
                                 int64_t ne0, nstf_type cur, bool has_output, int n_layers);

/* in_path: a GGUF file or an HF model folder (a directory). */
nstf_status nstf_quantize_file(const char *in_path, const char *out_path,
                               const nstf_quant_params *p);

/* Bytes of tensor data nstf_quantize_file would write for the open input
 * g (overrides included), and the elements of all its tensors. */
nstf_status nstf_quantize_plan_bytes(const nstf_gguf *g, const nstf_quant_params *p, uint64_t *bytes,
                                     uint64_t *n_elems);

#endif
