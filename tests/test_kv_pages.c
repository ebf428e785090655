/* test_kv_pages.c — the paged KV cache's bookkeeping (serve/kv_pages.c):
 * blocks handed out and returned, prefix sharing of full blocks only and
 * never of the last token's block, cached prefixes reused after their
 * sequence left and evicted least recently freed first when the pool is
 * short, and a randomized run against an independent model of the pool
 * (reference counts from the tables, every block accounted for as used,
 * cached or free, shared blocks holding equal tokens). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/kv_pages.h"
#include "test_util.h"

#define BS 4

static void stats(const nstf_kv_pages *p, int used, int cached, const char *when) {
    nstf_kv_stats s;
    nstf_kv_pages_stats(p, &s);
    CHECK(s.used == used && s.cached == cached, "%s: used %d cached %d, want %d and %d", when, s.used, s.cached, used,
          cached);
    CHECK(s.used + nstf_kv_pages_available(p) == s.n_blocks, "%s: %d used + %d available != %d blocks", when, s.used,
          nstf_kv_pages_available(p), s.n_blocks);
}

static void basics(void) {
    nstf_kv_pages *p;
    CHECK(nstf_kv_pages_create(10, BS, 3, 5, &p) == NSTF_OK, "%s", nstf_last_error());
    const int32_t *tab = nstf_kv_pages_table(p);
    int32_t a[11], b[11], c[11];
    for (int i = 0; i < 11; i++) a[i] = 100 + i, b[i] = a[i], c[i] = a[i];
    b[9] = 7;  /* b shares a's first two blocks (positions 0..7) */
    c[5] = 7;  /* c shares only the first */
    CHECK(nstf_kv_seq_begin(p, 0, a, 11) == 0, "an empty cache shared something");
    CHECK(nstf_kv_seq_reserve(p, 0, 11), "3 blocks from 10");
    stats(p, 3, 0, "a reserved");
    int idle = -1;
    CHECK(nstf_kv_pages_probe(p, a, 11, &idle) == 0, "blocks shared before their K/V were committed");
    nstf_kv_seq_commit(p, 0, a, 11);
    CHECK(nstf_kv_pages_probe(p, a, 11, &idle) == 2 && idle == 0, "a's 2 full blocks not found (idle %d)", idle);
    CHECK(nstf_kv_pages_probe(p, a, 8, &idle) == 1, "the block of the last token shared");
    CHECK(nstf_kv_pages_probe(p, a, 9, &idle) == 2, "a 9-token prefix of a: 2 blocks");
    CHECK(nstf_kv_pages_probe(p, c, 11, NULL) == 1, "c: 1 block");
    CHECK(nstf_kv_seq_begin(p, 1, b, 11) == 8, "b shares 8 positions");
    CHECK(tab[5] == tab[0] && tab[6] == tab[1], "b's table does not name a's blocks");
    CHECK(nstf_kv_seq_reserve(p, 1, 11), "b's third block");
    CHECK(tab[7] != tab[2], "b's own block is a's");
    stats(p, 4, 0, "a and b");
    nstf_kv_seq_commit(p, 1, b, 11);
    nstf_kv_seq_end(p, 0);
    stats(p, 3, 0, "a left"); /* a's third block held no full prefix */
    nstf_kv_seq_end(p, 1);
    stats(p, 0, 2, "b left");
    CHECK(nstf_kv_pages_probe(p, a, 11, &idle) == 2 && idle == 2, "a's prefix not cached after its users left");
    CHECK(nstf_kv_seq_begin(p, 2, c, 11) == 4, "c takes the cached first block");
    stats(p, 1, 1, "c");
    /* the pool runs dry: the 8 uncached blocks go first, then the cached one */
    CHECK(nstf_kv_seq_reserve(p, 2, 20), "c to 5 blocks");
    CHECK(nstf_kv_seq_begin(p, 0, a, 1) == 0 && nstf_kv_seq_reserve(p, 0, 16), "a second sequence of 4 blocks");
    nstf_kv_stats s;
    nstf_kv_pages_stats(p, &s);
    CHECK(s.evicted == 0 && s.cached == 1 && nstf_kv_pages_available(p) == 1, "evicted %lld, cached %d, free %d",
          (long long)s.evicted, s.cached, nstf_kv_pages_available(p));
    CHECK(!nstf_kv_seq_reserve(p, 1, 8), "2 blocks out of 1");
    nstf_kv_pages_stats(p, &s);
    CHECK(s.evicted == 1 && s.cached == 0 && s.used == 10, "evicted %lld, cached %d, used %d", (long long)s.evicted,
          s.cached, s.used);
    CHECK(nstf_kv_pages_probe(p, a, 11, NULL) == 1, "an evicted block still found");
    nstf_kv_seq_end(p, 0), nstf_kv_seq_end(p, 1), nstf_kv_seq_end(p, 2);
    stats(p, 0, 1, "all left");
    nstf_kv_pages_free(p);
}

/* Random sequences drawn from a few prefixes, started, grown, committed
 * and ended at random; after every operation the pool agrees with the
 * tables: each block's users are the tables naming it, blocks shared by
 * two sequences sit at the same index in both with equal tokens. */
static void randomized(void) {
    enum { NB = 24, NS = 4, BPS = 6, STEPS = 20000 };
    nstf_kv_pages *p;
    CHECK(nstf_kv_pages_create(NB, BS, NS, BPS, &p) == NSTF_OK, "%s", nstf_last_error());
    const int32_t *tab = nstf_kv_pages_table(p);
    int32_t tok[NS][BPS * BS];
    int64_t len[NS] = {0}, done[NS] = {0};
    bool live[NS] = {false};
    test_rng r = {0x5eed};
    int64_t bad = 0, shared_pos = 0;
    for (int step = 0; step < STEPS && !bad; step++) {
        const int s = (int)(rng_next(&r) % NS), op = (int)(rng_next(&r) % 4);
        if (!live[s]) { /* start: one of 3 prefixes, then random tokens */
            const int fam = (int)(rng_next(&r) % 3);
            len[s] = 1 + (int64_t)(rng_next(&r) % (BPS * BS));
            for (int i = 0; i < len[s]; i++) tok[s][i] = i < 13 ? fam * 1000 + i : (int32_t)(rng_next(&r) % 50);
            done[s] = nstf_kv_seq_begin(p, s, tok[s], len[s]);
            shared_pos += done[s];
            bad += done[s] % BS != 0 || done[s] >= len[s];
            live[s] = true;
        } else if (op == 0) {
            nstf_kv_seq_end(p, s);
            live[s] = false;
        } else if (done[s] < len[s]) { /* compute some positions */
            const int64_t to = done[s] + 1 + (int64_t)(rng_next(&r) % (uint64_t)(len[s] - done[s]));
            if (nstf_kv_seq_reserve(p, s, to)) {
                nstf_kv_seq_commit(p, s, tok[s], to);
                done[s] = to;
            }
        }
        /* the model: users per block from the tables */
        int users[NB] = {0}, used = 0;
        for (int q = 0; q < NS; q++)
            for (int k = 0; k < BPS; k++) {
                const int32_t id = tab[q * BPS + k];
                if (id < 0) continue;
                bad += id >= NB || !live[q];
                if (id < NB) users[id]++;
            }
        for (int i = 0; i < NB; i++) used += users[i] > 0;
        nstf_kv_stats st;
        nstf_kv_pages_stats(p, &st);
        bad += st.used != used || st.used + nstf_kv_pages_available(p) != NB || st.cached > NB - used;
        /* shared blocks: same index, same tokens, fully computed in both */
        for (int q = 0; q < NS; q++)
            for (int o = q + 1; o < NS; o++)
                for (int k = 0; k < BPS; k++)
                    for (int k2 = 0; k2 < BPS; k2++) {
                        const int32_t a = tab[q * BPS + k], b = tab[o * BPS + k2];
                        if (a < 0 || a != b) continue;
                        bad += k != k2 || memcmp(tok[q], tok[o], (size_t)(k + 1) * BS * sizeof(int32_t)) != 0;
                    }
        if (bad) printf("test_kv_pages: the pool disagrees with its tables at step %d\n", step);
    }
    nstf_kv_stats st;
    nstf_kv_pages_stats(p, &st);
    printf("test_kv_pages: %d random operations: %lld positions shared, %lld cache hits, %lld evictions\n", STEPS,
           (long long)shared_pos, (long long)st.hits, (long long)st.evicted);
    CHECK(bad == 0, "pool and tables disagree");
    CHECK(st.hits > 0 && st.evicted > 0, "the random run never shared (%lld) or evicted (%lld)", (long long)st.hits,
          (long long)st.evicted);
    nstf_kv_pages_free(p);
}

int main(void) {
    basics();
    randomized();
    nstf_kv_pages *p = NULL;
    CHECK(nstf_kv_pages_create(0, BS, 1, 1, &p) == NSTF_ERR_INVALID_ARG && !p, "an empty pool accepted");
    CHECK(nstf_kv_pages_create(1 << 30, 1 << 20, 1, 1, &p) != NSTF_OK && !p, "an overflowing pool accepted");
    return test_finish("test_kv_pages");
}
