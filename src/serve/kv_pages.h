/* kv_pages.h — the bookkeeping of a paged KV cache: a pool of blocks of
 * `block` positions, one block table per sequence slot, reference counts,
 * and a prefix cache through which sequences whose tokens begin alike
 * (a shared system prompt) share the blocks that hold them.
 *
 * Only host bookkeeping: the K and V rows themselves live in the run
 * (nstf_llama_run_create_paged), which reads the tables through each
 * forward's batch (nstf_batch.blocks = nstf_kv_pages_table()).
 *
 * A block is "full" once every one of its positions holds computed K/V.
 * Full blocks are registered under the hash of the whole token prefix they
 * end (a chain: the hash of block i covers tokens [0, (i+1) * block)), and
 * a new sequence takes the longest run of registered blocks that matches
 * its tokens from position 0 (each block's own tokens and its parent's
 * hash are compared, not only its hash). Shared blocks are never written:
 * a sequence writes only past the positions it took, and at least its
 * last token is always computed (its logits are needed). A block whose
 * last user leaves stays registered, on a free list in least-recently-
 * freed order, until the pool needs it for something else: blocks never
 * registered are handed out first, then the oldest registered ones.
 *
 * Not thread-safe: the scheduler calls it under its lock. */
#ifndef NSTF_SERVE_KV_PAGES_H
#define NSTF_SERVE_KV_PAGES_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

typedef struct nstf_kv_pages nstf_kv_pages;

typedef struct nstf_kv_stats {
    int n_blocks;     /* in the pool */
    int used;         /* held by at least one sequence */
    int cached;       /* held by none but registered (reusable by a matching prefix) */
    int64_t hits;     /* blocks taken from the prefix cache, in all */
    int64_t evicted;  /* registered blocks handed out for other contents */
} nstf_kv_stats;

/* A pool of n_blocks blocks of `block` positions for n_seq sequences of
 * at most blocks_per_seq blocks each. */
nstf_status nstf_kv_pages_create(int n_blocks, int block, int n_seq, int blocks_per_seq, nstf_kv_pages **out);
void nstf_kv_pages_free(nstf_kv_pages *p);

/* [n_seq, blocks_per_seq]: each sequence's blocks (-1: none yet). */
const int32_t *nstf_kv_pages_table(const nstf_kv_pages *p);
int nstf_kv_pages_block(const nstf_kv_pages *p);
/* Blocks a sequence could get now: free ones, registered or not. */
int nstf_kv_pages_available(const nstf_kv_pages *p);
void nstf_kv_pages_stats(const nstf_kv_pages *p, nstf_kv_stats *out);

/* How many blocks of a prefix of tokens[0..n) (positions below n - 1:
 * the last token is always computed) the cache holds now; *idle: how
 * many of those no sequence holds (they count as available until taken). */
int nstf_kv_pages_probe(const nstf_kv_pages *p, const int32_t *tokens, int64_t n, int *idle);

/* Start sequence `seq` (empty) on tokens[0..n): it takes the cached
 * blocks nstf_kv_pages_probe counts. Returns the positions it shares
 * (their K/V need no computing): a multiple of the block size. */
int64_t nstf_kv_seq_begin(nstf_kv_pages *p, int seq, const int32_t *tokens, int64_t n);
/* Blocks for positions [0, n_pos) of seq: false when the pool is out of
 * blocks (those it could get stay the sequence's). */
bool nstf_kv_seq_reserve(nstf_kv_pages *p, int seq, int64_t n_pos);
/* Positions [0, n_computed) of seq now hold the K/V of tokens[0..):
 * its full blocks join the prefix cache. */
void nstf_kv_seq_commit(nstf_kv_pages *p, int seq, const int32_t *tokens, int64_t n_computed);
/* The sequence leaves: its blocks lose a user; its slot is empty again. */
void nstf_kv_seq_end(nstf_kv_pages *p, int seq);

#endif
