/* kv_pages.c — the paged KV cache's blocks, tables and prefix cache
 * (kv_pages.h says what it promises).
 *
 * Blocks with no user sit on one doubly linked free list: blocks that
 * hold no registered prefix at its head (handed out first), registered
 * ones appended at its tail as their last user leaves, so the pool
 * reclaims the least recently used cached prefix first. Registered
 * blocks are found through an open-addressing table of block ids keyed
 * by their chain hash (linear probing, at most half full, deletion by
 * backward shift so no tombstones accumulate). */
#include "serve/kv_pages.h"

#include <string.h>

#include "core/mem.h"

#define HASH_SEED 0x6a09e667f3bcc909ull

typedef struct kv_block {
    int32_t ref;        /* sequences holding it */
    int32_t prev, next; /* free-list links while ref == 0 */
    bool registered;    /* in the prefix cache */
    uint64_t hash;      /* chain hash of the token prefix it ends */
    uint64_t parent;    /* the chain hash before it (HASH_SEED for a first block) */
} kv_block;

struct nstf_kv_pages {
    int n_blocks, block, n_seq, bps;
    kv_block *b;        /* [n_blocks] */
    int32_t *tokens;    /* [n_blocks, block] a registered block's tokens */
    int32_t *table;     /* [n_seq, bps] block ids, -1: none */
    int32_t *n_held;    /* [n_seq] blocks in each sequence's table */
    int32_t *n_hashed;  /* [n_seq] leading blocks of each sequence whose chain hash is known */
    uint64_t *seq_hash; /* [n_seq, bps] those chain hashes */
    int32_t *map;       /* [mask + 1] registered block ids, -1: empty */
    uint64_t mask;
    int32_t free_head, free_tail;
    int n_free, used, cached;
    int64_t hits, evicted;
};

/* FNV-1a over the parent hash and the block's tokens, then a 64-bit
 * finalizer (splitmix64's) so that the low bits index the table well. */
static uint64_t chain_hash(uint64_t parent, const int32_t *t, int n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < 8; i++) h = (h ^ ((parent >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    for (int k = 0; k < n; k++)
        for (int i = 0; i < 4; i++) h = (h ^ (((uint32_t)t[k] >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

/* ---- the free list --------------------------------------------------------------- */

static void free_unlink(nstf_kv_pages *p, int32_t id) {
    kv_block *b = &p->b[id];
    if (b->prev >= 0) p->b[b->prev].next = b->next;
    else p->free_head = b->next;
    if (b->next >= 0) p->b[b->next].prev = b->prev;
    else p->free_tail = b->prev;
    b->prev = b->next = -1;
    p->n_free--;
}

static void free_push(nstf_kv_pages *p, int32_t id, bool at_tail) {
    kv_block *b = &p->b[id];
    if (at_tail) {
        b->prev = p->free_tail, b->next = -1;
        if (p->free_tail >= 0) p->b[p->free_tail].next = id;
        else p->free_head = id;
        p->free_tail = id;
    } else {
        b->prev = -1, b->next = p->free_head;
        if (p->free_head >= 0) p->b[p->free_head].prev = id;
        else p->free_tail = id;
        p->free_head = id;
    }
    p->n_free++;
}

/* ---- the prefix table -------------------------------------------------------------- */

static int32_t map_find(const nstf_kv_pages *p, uint64_t hash, uint64_t parent, const int32_t *tokens) {
    for (uint64_t i = hash & p->mask;; i = (i + 1) & p->mask) {
        const int32_t id = p->map[i];
        if (id < 0) return -1;
        const kv_block *b = &p->b[id];
        if (b->hash == hash && b->parent == parent &&
            !memcmp(p->tokens + (int64_t)id * p->block, tokens, (size_t)p->block * sizeof(int32_t)))
            return id;
    }
}

static void map_insert(nstf_kv_pages *p, int32_t id) {
    uint64_t i = p->b[id].hash & p->mask;
    while (p->map[i] >= 0) i = (i + 1) & p->mask;
    p->map[i] = id;
}

static void map_delete(nstf_kv_pages *p, int32_t id) {
    uint64_t i = p->b[id].hash & p->mask;
    while (p->map[i] != id) i = (i + 1) & p->mask;
    for (uint64_t j = i;;) { /* backward shift: pull later entries of the probe run into the hole */
        j = (j + 1) & p->mask;
        if (p->map[j] < 0) break;
        const uint64_t k = p->b[p->map[j]].hash & p->mask; /* its home slot */
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j)) continue; /* still reachable from home */
        p->map[i] = p->map[j];
        i = j;
    }
    p->map[i] = -1;
}

/* ---- the pool ------------------------------------------------------------------------ */

nstf_status nstf_kv_pages_create(int n_blocks, int block, int n_seq, int blocks_per_seq, nstf_kv_pages **out) {
    *out = NULL;
    if (n_blocks < 1 || block < 1 || n_seq < 1 || blocks_per_seq < 1)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "KV pages: %d blocks of %d positions, %d sequences of %d blocks",
                              n_blocks, block, n_seq, blocks_per_seq);
    uint64_t n_tok = 0, n_tab = 0, cap = 1;
    if (!nstf_mul_ok((uint64_t)n_blocks, (uint64_t)block, &n_tok) ||
        !nstf_mul_ok((uint64_t)n_seq, (uint64_t)blocks_per_seq, &n_tab) || n_tok > ((uint64_t)1 << 40) ||
        n_tab > ((uint64_t)1 << 40))
        return nstf_set_error(NSTF_ERR_RANGE, "KV pages: %d x %d positions or %d x %d table entries overflow", n_blocks,
                              block, n_seq, blocks_per_seq);
    while (cap < 2 * (uint64_t)n_blocks) cap *= 2;
    nstf_kv_pages *p = nstf_calloc(1, sizeof *p, "KV pages");
    if (!p) return NSTF_ERR_OOM;
    p->n_blocks = n_blocks, p->block = block, p->n_seq = n_seq, p->bps = blocks_per_seq;
    p->b = nstf_calloc((size_t)n_blocks, sizeof *p->b, "KV blocks");
    p->tokens = nstf_calloc((size_t)n_tok, sizeof *p->tokens, "KV block tokens");
    p->table = nstf_calloc((size_t)n_tab, sizeof *p->table, "KV block tables");
    p->seq_hash = nstf_calloc((size_t)n_tab, sizeof *p->seq_hash, "KV block hashes");
    p->n_held = nstf_calloc((size_t)n_seq, sizeof *p->n_held, "KV block counts");
    p->n_hashed = nstf_calloc((size_t)n_seq, sizeof *p->n_hashed, "KV block counts");
    p->map = nstf_calloc((size_t)cap, sizeof *p->map, "KV prefix table");
    if (!p->b || !p->tokens || !p->table || !p->seq_hash || !p->n_held || !p->n_hashed || !p->map) {
        nstf_kv_pages_free(p);
        return NSTF_ERR_OOM;
    }
    p->mask = cap - 1;
    memset(p->map, 0xff, (size_t)cap * sizeof *p->map);
    memset(p->table, 0xff, (size_t)n_tab * sizeof *p->table);
    p->free_head = p->free_tail = -1;
    for (int i = n_blocks - 1; i >= 0; i--) free_push(p, i, false); /* block 0 first */
    *out = p;
    return NSTF_OK;
}

void nstf_kv_pages_free(nstf_kv_pages *p) {
    if (!p) return;
    nstf_free(p->b);
    nstf_free(p->tokens);
    nstf_free(p->table);
    nstf_free(p->seq_hash);
    nstf_free(p->n_held);
    nstf_free(p->n_hashed);
    nstf_free(p->map);
    nstf_free(p);
}

const int32_t *nstf_kv_pages_table(const nstf_kv_pages *p) { return p->table; }
int nstf_kv_pages_block(const nstf_kv_pages *p) { return p->block; }
int nstf_kv_pages_available(const nstf_kv_pages *p) { return p->n_free; }

void nstf_kv_pages_stats(const nstf_kv_pages *p, nstf_kv_stats *out) {
    *out = (nstf_kv_stats){p->n_blocks, p->used, p->cached, p->hits, p->evicted};
}

/* Walk the registered blocks that match tokens[0..n) from position 0
 * (never the block of the last token); take them for seq when seq >= 0. */
static int match(nstf_kv_pages *p, int seq, const int32_t *tokens, int64_t n, int *idle) {
    int k = 0, n_idle = 0;
    uint64_t parent = HASH_SEED;
    while (k < p->bps && (int64_t)(k + 1) * p->block <= n - 1) {
        const int32_t *t = tokens + (int64_t)k * p->block;
        const uint64_t h = chain_hash(parent, t, p->block);
        const int32_t id = map_find(p, h, parent, t);
        if (id < 0) break;
        kv_block *b = &p->b[id];
        if (b->ref == 0) n_idle++;
        if (seq >= 0) {
            if (b->ref == 0) {
                free_unlink(p, id);
                p->cached--;
                p->used++;
            }
            b->ref++;
            p->table[(int64_t)seq * p->bps + k] = id;
            p->seq_hash[(int64_t)seq * p->bps + k] = h;
        }
        parent = h;
        k++;
    }
    if (idle) *idle = n_idle;
    return k;
}

int nstf_kv_pages_probe(const nstf_kv_pages *p, const int32_t *tokens, int64_t n, int *idle) {
    return match((nstf_kv_pages *)p, -1, tokens, n, idle);
}

int64_t nstf_kv_seq_begin(nstf_kv_pages *p, int seq, const int32_t *tokens, int64_t n) {
    const int k = match(p, seq, tokens, n, NULL);
    p->n_held[seq] = p->n_hashed[seq] = k;
    p->hits += k;
    return (int64_t)k * p->block;
}

bool nstf_kv_seq_reserve(nstf_kv_pages *p, int seq, int64_t n_pos) {
    const int64_t need = (n_pos + p->block - 1) / p->block;
    int32_t *tab = p->table + (int64_t)seq * p->bps;
    while (p->n_held[seq] < need && p->n_held[seq] < p->bps) {
        const int32_t id = p->free_head;
        if (id < 0) return false;
        free_unlink(p, id);
        kv_block *b = &p->b[id];
        if (b->registered) { /* reclaim the least recently used cached prefix */
            map_delete(p, id);
            b->registered = false;
            p->cached--;
            p->evicted++;
        }
        b->ref = 1;
        p->used++;
        tab[p->n_held[seq]++] = id;
    }
    return p->n_held[seq] >= need;
}

void nstf_kv_seq_commit(nstf_kv_pages *p, int seq, const int32_t *tokens, int64_t n_computed) {
    int64_t full = n_computed / p->block;
    if (full > p->n_held[seq]) full = p->n_held[seq];
    const int64_t row = (int64_t)seq * p->bps;
    for (int64_t k = p->n_hashed[seq]; k < full; k++) {
        const int32_t *t = tokens + k * p->block;
        const uint64_t parent = k ? p->seq_hash[row + k - 1] : HASH_SEED, h = chain_hash(parent, t, p->block);
        p->seq_hash[row + k] = h;
        const int32_t id = p->table[row + k];
        kv_block *b = &p->b[id];
        /* a block already registered (taken from the cache) stays as it is; an
         * equal prefix registered by another sequence keeps its place */
        if (b->registered || map_find(p, h, parent, t) >= 0) continue;
        b->registered = true;
        b->hash = h;
        b->parent = parent;
        memcpy(p->tokens + (int64_t)id * p->block, t, (size_t)p->block * sizeof(int32_t));
        map_insert(p, id);
    }
    if (full > p->n_hashed[seq]) p->n_hashed[seq] = (int32_t)full;
}

void nstf_kv_seq_end(nstf_kv_pages *p, int seq) {
    int32_t *tab = p->table + (int64_t)seq * p->bps;
    for (int k = 0; k < p->n_held[seq]; k++) {
        kv_block *b = &p->b[tab[k]];
        if (--b->ref == 0) {
            p->used--;
            if (b->registered) p->cached++;
            free_push(p, tab[k], b->registered);
        }
        tab[k] = -1;
    }
    p->n_held[seq] = p->n_hashed[seq] = 0;
}
