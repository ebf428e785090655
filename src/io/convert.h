/* convert.h — write a model (a GGUF file or an HF folder's view) as a GGUF
 * file that llama.cpp and NSTF load: `nstf convert`.
 *
 * Key/values are copied, except NSTF_GGUF_KEY_ROPE_NEOX and
 * general.file_type (recomputed). A view of an HF folder has its Q and K
 * rows in rotate-half order: they are permuted to GGUF's adjacent-pair
 * order, row for row as llama.cpp's converter does (LlamaModel.permute):
 * within each head of d rows, output row 2i + j is input row j * d/2 + i.
 * Matrices keep their type or take `out_type` (F32, F16 or BF16);
 * vectors (norms) are written as F32, as llama.cpp writes them. F16
 * output refuses values beyond its range instead of writing infinities.
 * Tensors are streamed one at a time (nstf_gguf_writer_add_tensor_fill):
 * memory is one tensor, not the model. The file appears atomically: it is
 * written beside the target under a temporary name, read back with the
 * validating reader, and renamed over the target. */
#ifndef NSTF_IO_CONVERT_H
#define NSTF_IO_CONVERT_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "io/gguf.h"

typedef struct nstf_convert_params {
    int out_type; /* -1: matrices keep their type; else NSTF_TYPE_F32, _F16 or _BF16 */
    /* called with the bytes written so far after each tensor and every
     * 1024 converted rows (may be NULL) */
    void (*progress)(void *user, uint64_t done, uint64_t total);
    void *user;
} nstf_convert_params;

nstf_status nstf_convert_to_gguf(const nstf_gguf *in, const char *out_path, const nstf_convert_params *p);

/* ---- the pieces, for writers that convert on the way (nstf quantize) ---- */

/* What convert makes of each tensor of `in` (out_type as above): its type
 * (type[i]) and the heads its Q/K rows are permuted by (perm_heads[i], 0:
 * rows as they are); both hold in->n_tensors entries. */
nstf_status nstf_convert_tensor_plan(const nstf_gguf *in, int out_type, nstf_type *type, uint32_t *perm_heads);
/* The input row that output row r (of `rows`) comes from in a tensor
 * permuted by `heads` (r itself when heads is 0). */
uint64_t nstf_convert_src_row(uint64_t r, uint32_t heads, uint64_t rows);
/* The input key/values convert does not copy (it recomputes or drops them). */
bool nstf_convert_drops_kv(nstf_gguf_str key);

#endif
