/* tokshard.h — training data: token shards (`nstf tokenize`) and the
 * loader that streams them in training sequences with a seeded shuffle.
 *
 * A shard is one file, little-endian:
 *   offset  0  magic "NSTFTOKS" (8 bytes)
 *           8  u32 version (1)
 *          12  u32 vocabulary size (every token is below it)
 *          16  u32 bytes per token: 2 (uint16, vocabularies up to 65536) or 4 (uint32)
 *          20  u32 0 (reserved)
 *          24  u64 token count
 *          32  the tokens
 * and nothing after them. A data set is a shard, a folder of shards
 * (*.tok, in name order, one stream), or a text file, which the loader
 * tokenizes when it opens it ("training on a plain text file").
 *
 * The stream of N tokens is cut into N_seq = (N - 1) / T windows of T + 1
 * tokens (inputs and next-token targets), window i starting at token i T.
 * Each epoch visits every window once in an order drawn from the seed and
 * the epoch (Fisher-Yates over xorshift64*), so a position (epoch, index)
 * names the next window exactly: a resumed run continues where the
 * checkpoint left it. Shards are mapped, not read: the OS streams them. */
#ifndef NSTF_IO_TOKSHARD_H
#define NSTF_IO_TOKSHARD_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "io/tokenizer.h"

#define NSTF_TOKSHARD_MAGIC "NSTFTOKS"
#define NSTF_TOKSHARD_VERSION 1
#define NSTF_TOKSHARD_HEADER 32

/* Write tokens as one shard at path, atomically (a temporary file, fsync,
 * rename). Every token must be below n_vocab. */
nstf_status nstf_tokshard_write(const char *path, const int32_t *tokens, int64_t n, int32_t n_vocab);

/* The tokens of a text file: BOS first when the tokenizer wants one, EOS
 * last when it has one. An empty file is an error. *ids is malloc'd. */
nstf_status nstf_tokenize_file(const nstf_tokenizer *tok, const char *path, int32_t **ids, int64_t *n);

typedef struct nstf_data nstf_data;

/* Open a data set for sequences of seq_len tokens (+1 target). n_vocab:
 * the model's vocabulary, which every shard must match; tok: the model's
 * tokenizer, for a text file (may be NULL: then only shards). shuffle:
 * a seeded order per epoch (training) or the stream's order (evaluation). */
nstf_status nstf_data_open(const char *path, int32_t n_vocab, int seq_len, uint64_t seed, bool shuffle,
                           const nstf_tokenizer *tok, nstf_data **out);
void nstf_data_close(nstf_data *d);
int64_t nstf_data_n_tokens(const nstf_data *d);
int64_t nstf_data_n_seq(const nstf_data *d);
/* The position of the next window: epoch (from 0) and index in the epoch. */
void nstf_data_tell(const nstf_data *d, int64_t *epoch, int64_t *index);
nstf_status nstf_data_seek(nstf_data *d, int64_t epoch, int64_t index);
/* The next window's seq_len + 1 tokens into out; moves on (to the next
 * epoch, reshuffled, after the last window). */
nstf_status nstf_data_next(nstf_data *d, int32_t *out);

#endif
