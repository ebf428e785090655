/* hf_model.h — Hugging Face model folders opened as GGUF views, and the one
 * entry point that opens either kind of model.
 *
 * A folder holds config.json, model.safetensors (or shards listed by
 * model.safetensors.index.json), tokenizer.json and tokenizer_config.json
 * (and chat_template.jinja, where newer transformers put the template). It
 * becomes the nstf_gguf a GGUF loader would produce:
 *   - key/values: general.architecture of the model_type's row in the
 *     architecture table (model/arch.h: "llama" for Llama and Mistral,
 *     "qwen2", "qwen3"), <arch>.* from config.json (Mistral's
 *     sliding_window as llama.attention.sliding_window), tokenizer.ggml.*
 *     from tokenizer.json / tokenizer_config.json, the same keys llama.cpp's
 *     converter writes;
 *   - tensors: GGUF names (token_embd.weight, blk.N.attn_q.weight, ...),
 *     dims reversed to GGUF order, data pointing into the safetensors
 *     mappings (F32, F16, BF16: mapped, never copied). The one computed
 *     tensor is rope_freqs.weight for rope_scaling type "llama3", as
 *     llama.cpp's converter makes it; Qwen2's Q/K/V biases and Qwen3's
 *     q/k norms map to blk.N.attn_{q,k,v}.bias and blk.N.attn_{q,k}_norm;
 *   - layout: HF keeps the rows of Q and K in rotate-half order, where
 *     llama.cpp's converter permutes them for adjacent-pair RoPE in "llama"
 *     files (Llama, Mistral; Qwen files keep HF's order and run RoPE in
 *     NEOX mode). For those the view does not permute; it sets
 *     NSTF_GGUF_KEY_ROPE_NEOX = true so that the loader runs RoPE in NEOX
 *     mode. `nstf convert` permutes (and drops the key) when it writes a
 *     GGUF file.
 * Only the table's ...ForCausalLM classes and byte-level BPE tokenizers
 * with the GPT-2, SmolLM2, Llama-3 or Qwen2 pre-tokenizer are recognised;
 * anything else is NSTF_ERR_UNSUPPORTED naming what was found. */
#ifndef NSTF_IO_HF_MODEL_H
#define NSTF_IO_HF_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/status.h"
#include "io/gguf.h"

/* bool key/value: Q/K rows in rotate-half order (RoPE mode NEOX). */
#define NSTF_GGUF_KEY_ROPE_NEOX "nstf.rope.neox"

/* Open a model for the loader: a GGUF file, or an HF model folder (any
 * directory) as a view. Either way the result is closed with
 * nstf_gguf_close. */
nstf_status nstf_model_file_open(const char *path, nstf_gguf **out);
/* Whether nstf_model_file_open takes `path` for an HF model folder (it is
 * a directory). */
bool nstf_model_path_is_folder(const char *path);

/* An HF model folder as a GGUF view (see above). */
nstf_status nstf_hf_open(const char *dir, nstf_gguf **out);

/* ---- used by hf_model.c and hf_tokenizer.c -------------------------------- */

/* "dir/name", malloc'd; NULL (and NSTF_ERR_OOM set) on failure. */
char *nstf_path_join(const char *dir, const char *name);

/* tokenizer.* key/values from DIR/tokenizer.json, tokenizer_config.json
 * (and chat_template.jinja). `config` is the parsed config.json (fallback
 * bos/eos ids); n_vocab is the model's vocabulary (config vocab_size):
 * ids the tokenizer leaves unused become "[PAD<id>]" tokens of type
 * unused, as llama.cpp's converter writes them. */
nstf_status nstf_hf_tokenizer_kvs(const char *dir, const cJSON *config, int64_t n_vocab, nstf_gguf_writer *w);

#endif
