/* tokenizer.h — tokenizers built from GGUF metadata, and chat templates.
 *
 * Two models, chosen by tokenizer.ggml.model:
 *   "gpt2"  byte-level BPE (GPT-2, SmolLM2, Llama-3, Qwen...) with the
 *           pre-tokenizer regexes named by tokenizer.ggml.pre, run with PCRE2;
 *   "llama" SentencePiece-style BPE over scores with byte fallback
 *           (<0xNN> tokens) and the U+2581 space marker (Llama-1/2).
 * Special (control / user-defined) tokens are matched in the text first
 * when parse_special is set, as llama.cpp and HF do. */
#ifndef NSTF_IO_TOKENIZER_H
#define NSTF_IO_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "io/gguf.h"

typedef struct nstf_tokenizer nstf_tokenizer;

/* The pre-tokenizer regexes (PCRE2 syntax, as HF's tokenizer.json writes
 * them) behind tokenizer.ggml.pre "gpt2" (also "smollm", after splitting
 * digits), "llama-bpe" (Llama-3), "qwen2" (Qwen2, Qwen2.5, Qwen3: Llama-3's
 * with single digits) and "tekken" (Mistral Nemo and later). */
extern const char *const nstf_pre_regex_gpt2;
extern const char *const nstf_pre_regex_llama3;
extern const char *const nstf_pre_regex_qwen2;
extern const char *const nstf_pre_regex_tekken;

nstf_status nstf_tokenizer_from_gguf(const nstf_gguf *g, nstf_tokenizer **out);
void nstf_tokenizer_free(nstf_tokenizer *t);

int32_t nstf_tokenizer_n_vocab(const nstf_tokenizer *t);
int32_t nstf_tokenizer_bos(const nstf_tokenizer *t); /* -1 if none */
int32_t nstf_tokenizer_eos(const nstf_tokenizer *t); /* -1 if none */
/* The file's tokenizer.ggml.add_bos_token (default per model type). */
bool nstf_tokenizer_wants_bos(const nstf_tokenizer *t);
/* End of generation: eos, eot (<|im_end|>, <|eot_id|>, <|end_of_text|>...). */
bool nstf_tokenizer_is_eog(const nstf_tokenizer *t, int32_t id);

/* Encode `len` bytes of UTF-8. Invalid UTF-8 -> NSTF_ERR_INVALID_ARG naming
 * the byte offset. *ids is malloc'd (free with free()). */
nstf_status nstf_tokenizer_encode(const nstf_tokenizer *t, const char *text, size_t len,
                                  bool add_bos, bool parse_special, int32_t **ids, int64_t *n_ids);

/* The bytes of one token (for streaming; may be a partial UTF-8 sequence).
 * Writes at most `cap` bytes to buf and returns the piece's full length,
 * or -1 for an id out of range. Special tokens render as their text. */
int64_t nstf_tokenizer_piece(const nstf_tokenizer *t, int32_t id, char *buf, size_t cap);

/* Decode a whole sequence into a malloc'd NUL-terminated string. */
nstf_status nstf_tokenizer_decode(const nstf_tokenizer *t, const int32_t *ids, int64_t n_ids,
                                  char **out, size_t *out_len);

/* ---- chat ----------------------------------------------------------------- */

typedef struct nstf_chat_msg {
    const char *role;    /* "system" | "user" | "assistant" */
    const char *content;
} nstf_chat_msg;

/* Render messages with the model's template (tokenizer.chat_template):
 * ChatML (<|im_start|>, including a default system message the template
 * inserts, as SmolLM2's does), Llama-3 (<|start_header_id|>) and Llama-2
 * ([INST]). Unknown template -> NSTF_ERR_UNSUPPORTED. *out is malloc'd.
 * As in llama.cpp, the rendered text does not start with BOS: the caller
 * encodes it with add_bos = nstf_tokenizer_wants_bos() and parse_special. */
nstf_status nstf_chat_render(const nstf_gguf *g, const nstf_chat_msg *msgs, int n_msgs,
                             bool add_generation_prompt, char **out);
/* The same from a NUL-terminated template string; NULL means the file has
 * none (plain ChatML without a default system message). */
nstf_status nstf_chat_render_template(const char *tmpl, const nstf_chat_msg *msgs, int n_msgs,
                                      bool add_generation_prompt, char **out);
/* The family a template renders as: "chatml" (also for NULL: no template),
 * "llama3", "llama2"; NULL when it is none of those. */
const char *nstf_chat_family(const char *tmpl);
/* A template string that renders as family name ("chatml", "llama3",
 * "llama2"; static), or NULL for another name. */
const char *nstf_chat_family_template(const char *name);
/* The file's tokenizer.chat_template as a malloc'd string, or NULL (none,
 * not a string, or out of memory). */
char *nstf_chat_template_of(const nstf_gguf *g);

#endif
