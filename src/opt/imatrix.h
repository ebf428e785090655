/* imatrix.h — importance matrices (llama.cpp's imatrix): for each weight
 * matrix, the sum over calibration tokens of the squared activations
 * feeding each of its columns, and the token count. Their ratio (the
 * mean squared input of column j) weights column j's squared error in the
 * quantizers' scale search (nstf_quantize_row_w, core/dtype.h), so the
 * columns the model leans on are reproduced more closely.
 *
 * Collection: the model runs over a text in chunks of chunk_size tokens,
 * each from position 0 (as llama-imatrix), and a CPU op hook adds x^2 of
 * every layer matmul's input rows: the normed input of Q/K/V (one entry
 * each, equal sums), the attention output before O, the normed input of
 * gate/up, the SwiGLU output before down, and the final normed state
 * before the output matrix (named output.weight, or token_embd.weight for
 * tied embeddings).
 *
 * File: llama.cpp's GGUF imatrix format, which llama-quantize --imatrix
 * reads: general.type "imatrix", imatrix.datasets (string array),
 * imatrix.chunk_count and imatrix.chunk_size (u32); per matrix NAME two F32
 * tensors, NAME.in_sum2 [n_in, 1] (the sums) and NAME.counts [1, 1] (the
 * tokens). The loader takes that layout (one expert: the second dimension
 * 1). */
#ifndef NSTF_OPT_IMATRIX_H
#define NSTF_OPT_IMATRIX_H

#include <stdint.h>

#include "core/status.h"
#include "nstf.h"

typedef struct nstf_imatrix_entry {
    char name[96];   /* blk.N.attn_q.weight */
    int64_t n_in;
    double *sum2;    /* [n_in] */
    double count;    /* tokens */
    float *mean;     /* [n_in] sum2 / count (filled by nstf_imatrix_finish / load) */
} nstf_imatrix_entry;

typedef struct nstf_imatrix {
    nstf_imatrix_entry *e;
    int n;
    int chunk_count, chunk_size;
    char dataset[256];
} nstf_imatrix;

/* Run the session's model (CPU) over ids in chunks of chunk_size (the last
 * chunk may be shorter; chunks shorter than 2 tokens are dropped) and
 * collect the sums. progress (may be NULL): after each chunk. */
nstf_status nstf_imatrix_collect(nstf_session *s, const int32_t *ids, int n, int chunk_size,
                                 void (*progress)(void *user, int done, int total), void *user, nstf_imatrix **out);
nstf_status nstf_imatrix_write(const nstf_imatrix *im, const char *path);
nstf_status nstf_imatrix_load(const char *path, nstf_imatrix **out);
/* The per-column weights of tensor `name` (mean squared inputs), NULL when
 * the matrix has no entry; an entry whose length is not n_in is an error
 * (*st set), as is a count of 0. */
const float *nstf_imatrix_weights(const nstf_imatrix *im, const char *name, int64_t n_in, nstf_status *st);
void nstf_imatrix_free(nstf_imatrix *im);

#endif
