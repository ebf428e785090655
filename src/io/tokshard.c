/* tokshard.c — token shards and the training data loader (tokshard.h). */
#include "io/tokshard.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/mem.h"
#include "io/atomic_file.h"
#include "io/mapfile.h"

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

nstf_status nstf_tokshard_write(const char *path, const int32_t *tokens, int64_t n, int32_t n_vocab) {
    if (n < 0 || n_vocab < 1) return nstf_set_error(NSTF_ERR_INVALID_ARG, "shard of %lld tokens, vocabulary %d", (long long)n, n_vocab);
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= n_vocab)
            return nstf_set_error(NSTF_ERR_RANGE, "%s: token %lld is %d, outside the vocabulary of %d", path,
                                  (long long)i, tokens[i], n_vocab);
    const uint32_t width = n_vocab <= 65536 ? 2 : 4;
    uint8_t h[NSTF_TOKSHARD_HEADER] = {0};
    memcpy(h, NSTF_TOKSHARD_MAGIC, 8);
    put_u32(h + 8, NSTF_TOKSHARD_VERSION);
    put_u32(h + 12, (uint32_t)n_vocab);
    put_u32(h + 16, width);
    put_u64(h + 24, (uint64_t)n);
    nstf_afile f;
    NSTF_TRY(nstf_afile_open(&f, path));
    nstf_status st = nstf_afile_write(&f, h, sizeof h);
    uint8_t buf[1 << 16];
    for (int64_t i = 0; st == NSTF_OK && i < n;) {
        size_t k = 0;
        for (; i < n && k + width <= sizeof buf; i++, k += width) {
            if (width == 2) buf[k] = (uint8_t)tokens[i], buf[k + 1] = (uint8_t)(tokens[i] >> 8);
            else put_u32(buf + k, (uint32_t)tokens[i]);
        }
        st = nstf_afile_write(&f, buf, k);
    }
    if (st != NSTF_OK) {
        nstf_afile_abort(&f);
        return st;
    }
    return nstf_afile_commit(&f);
}

nstf_status nstf_tokenize_file(const nstf_tokenizer *tok, const char *path, int32_t **ids, int64_t *n) {
    *ids = NULL;
    *n = 0;
    const uint8_t *base = NULL;
    uint64_t size = 0;
    nstf_status st = nstf_map_file(path, "text", &base, &size);
    if (st == NSTF_ERR_FORMAT) /* the mapper's one format error: an empty file */
        return nstf_set_error(NSTF_ERR_FORMAT, "data file %s is empty: nothing to train on", path);
    NSTF_TRY(st);
    int32_t *t = NULL;
    int64_t k = 0;
    st = nstf_tokenizer_encode(tok, (const char *)base, (size_t)size, nstf_tokenizer_wants_bos(tok), false, &t, &k);
    nstf_unmap_file(base, size);
    if (st != NSTF_OK) return nstf_wrap_error(st, "%s", path);
    const int32_t eos = nstf_tokenizer_eos(tok);
    if (eos >= 0) {
        int32_t *t2 = realloc(t, (size_t)(k + 1) * sizeof *t);
        if (!t2) {
            free(t);
            return nstf_set_error(NSTF_ERR_OOM, "%s: out of memory for %lld tokens", path, (long long)k + 1);
        }
        t = t2;
        t[k++] = eos;
    }
    *ids = t;
    *n = k;
    return NSTF_OK;
}

/* ---- the loader ------------------------------------------------------------------------------ */

typedef struct shard {
    const uint8_t *base;  /* mapping (NULL: tokens in memory) */
    uint64_t size;
    const uint8_t *data;  /* first token */
    int width;
    int64_t n, start;     /* tokens, and the first one's place in the stream */
} shard;

struct nstf_data {
    shard *sh;
    int n_sh;
    int32_t *mem;         /* a tokenized text file */
    int64_t n_tok, n_seq;
    int seq_len;
    uint64_t seed;
    bool shuffle;
    int64_t epoch, index;
    int64_t *perm;        /* [n_seq] the epoch's order (shuffle) */
};

static nstf_status shard_open(const char *path, int32_t n_vocab, shard *s) {
    memset(s, 0, sizeof *s);
    NSTF_TRY(nstf_map_file(path, "token shard", &s->base, &s->size));
    const uint8_t *h = s->base;
    nstf_status st = NSTF_OK;
    if (s->size < NSTF_TOKSHARD_HEADER || memcmp(h, NSTF_TOKSHARD_MAGIC, 8) != 0)
        st = nstf_set_error(NSTF_ERR_FORMAT, "%s: not a token shard (no %s header)", path, NSTF_TOKSHARD_MAGIC);
    else if (get_u32(h + 8) != NSTF_TOKSHARD_VERSION)
        st = nstf_set_error(NSTF_ERR_FORMAT, "%s: token shard version %u (this build reads %d)", path, get_u32(h + 8),
                            NSTF_TOKSHARD_VERSION);
    else if (get_u32(h + 12) != (uint32_t)n_vocab)
        st = nstf_set_error(NSTF_ERR_FORMAT,
                            "%s: the shard's vocabulary has %u tokens but the model's has %d; tokenize the data with "
                            "this model's tokenizer",
                            path, get_u32(h + 12), n_vocab);
    else if ((get_u32(h + 16) != 2 && get_u32(h + 16) != 4) || (get_u32(h + 16) == 2 && n_vocab > 65536))
        st = nstf_set_error(NSTF_ERR_FORMAT, "%s: %u bytes per token", path, get_u32(h + 16));
    if (st == NSTF_OK) {
        s->width = (int)get_u32(h + 16);
        const uint64_t n = get_u64(h + 24);
        uint64_t bytes = 0;
        if (n > (uint64_t)INT64_MAX / 4 || !nstf_mul_ok(n, (uint64_t)s->width, &bytes) ||
            bytes != s->size - NSTF_TOKSHARD_HEADER)
            st = nstf_set_error(NSTF_ERR_FORMAT, "%s: the header counts %llu tokens but the file holds %llu bytes of them",
                                path, (unsigned long long)n, (unsigned long long)(s->size - NSTF_TOKSHARD_HEADER));
        s->n = (int64_t)n;
        s->data = h + NSTF_TOKSHARD_HEADER;
    }
    for (int64_t i = 0; st == NSTF_OK && i < s->n; i++) {
        const uint32_t v = s->width == 2 ? (uint32_t)s->data[2 * i] | (uint32_t)s->data[2 * i + 1] << 8 : get_u32(s->data + 4 * i);
        if (v >= (uint32_t)n_vocab)
            st = nstf_set_error(NSTF_ERR_FORMAT, "%s: token %lld is %u, outside the vocabulary of %d", path,
                                (long long)i, v, n_vocab);
    }
    if (st != NSTF_OK) {
        nstf_unmap_file(s->base, s->size);
        s->base = NULL;
    }
    return st;
}

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The *.tok files of a folder, sorted by name. */
static nstf_status list_shards(const char *dir, char ***names, int *n) {
    *names = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return nstf_set_error(NSTF_ERR_IO, "%s: cannot open the folder: %s", dir, strerror(errno));
    int cap = 0;
    nstf_status st = NSTF_OK;
    for (struct dirent *e; st == NSTF_OK && (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 4, ".tok") != 0) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            char **nn = realloc(*names, (size_t)cap * sizeof *nn);
            if (!nn) { st = nstf_set_error(NSTF_ERR_OOM, "shard list"); break; }
            *names = nn;
        }
        char *p = malloc(strlen(dir) + l + 2);
        if (!p) { st = nstf_set_error(NSTF_ERR_OOM, "shard list"); break; }
        sprintf(p, "%s/%s", dir, e->d_name);
        (*names)[(*n)++] = p;
    }
    closedir(d);
    if (st == NSTF_OK && *n == 0) st = nstf_set_error(NSTF_ERR_FORMAT, "%s: no token shards (*.tok) in the folder", dir);
    if (st == NSTF_OK) qsort(*names, (size_t)*n, sizeof **names, name_cmp);
    return st;
}

static uint64_t xs_next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* The order of epoch e: the identity, or Fisher-Yates from (seed, e). */
static void make_perm(nstf_data *d) {
    for (int64_t i = 0; i < d->n_seq; i++) d->perm[i] = i;
    if (!d->shuffle) return;
    uint64_t s = (d->seed ^ 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull + (uint64_t)d->epoch * 0x94d049bb133111ebull;
    if (!s) s = 1;
    for (int64_t i = d->n_seq - 1; i > 0; i--) {
        const int64_t j = (int64_t)(xs_next(&s) % (uint64_t)(i + 1));
        const int64_t x = d->perm[i];
        d->perm[i] = d->perm[j];
        d->perm[j] = x;
    }
}

void nstf_data_close(nstf_data *d) {
    if (!d) return;
    for (int i = 0; i < d->n_sh; i++) nstf_unmap_file(d->sh[i].base, d->sh[i].size);
    nstf_free(d->sh);
    free(d->mem);
    nstf_free(d->perm);
    nstf_free(d);
}

nstf_status nstf_data_open(const char *path, int32_t n_vocab, int seq_len, uint64_t seed, bool shuffle,
                           const nstf_tokenizer *tok, nstf_data **out) {
    *out = NULL;
    if (seq_len < 1) return nstf_set_error(NSTF_ERR_INVALID_ARG, "sequence length %d", seq_len);
    nstf_data *d = nstf_calloc(1, sizeof *d, "data set");
    if (!d) return NSTF_ERR_OOM;
    d->seq_len = seq_len;
    d->seed = seed;
    d->shuffle = shuffle;
    nstf_status st = NSTF_OK;
    struct stat sb;
    if (stat(path, &sb) != 0) {
        st = nstf_set_error(NSTF_ERR_IO, "data %s: %s", path, strerror(errno));
    } else if (S_ISDIR(sb.st_mode)) {
        char **names = NULL;
        int n = 0;
        st = list_shards(path, &names, &n);
        d->sh = st == NSTF_OK ? nstf_calloc((size_t)n, sizeof *d->sh, "shards") : NULL;
        if (st == NSTF_OK && !d->sh) st = NSTF_ERR_OOM;
        for (int i = 0; st == NSTF_OK && i < n; i++, d->n_sh++) st = shard_open(names[i], n_vocab, &d->sh[i]);
        for (int i = 0; i < n; i++) free(names[i]);
        free(names);
    } else {
        /* a shard when it starts like one, else text */
        FILE *f = fopen(path, "rb");
        char magic[8] = {0};
        const size_t got = f ? fread(magic, 1, 8, f) : 0;
        if (f) fclose(f);
        d->sh = nstf_calloc(1, sizeof *d->sh, "shards");
        if (!d->sh) st = NSTF_ERR_OOM;
        else if (got == 8 && memcmp(magic, NSTF_TOKSHARD_MAGIC, 8) == 0) {
            st = shard_open(path, n_vocab, &d->sh[0]);
            d->n_sh = st == NSTF_OK;
        } else if (!tok) {
            st = nstf_set_error(NSTF_ERR_FORMAT, "%s: not a token shard, and no tokenizer to read it as text", path);
        } else {
            st = nstf_tokenize_file(tok, path, &d->mem, &d->sh[0].n);
            d->n_sh = st == NSTF_OK;
        }
    }
    for (int i = 0; st == NSTF_OK && i < d->n_sh; i++) {
        d->sh[i].start = d->n_tok;
        d->n_tok += d->sh[i].n;
    }
    if (st == NSTF_OK && d->n_tok < (int64_t)seq_len + 1)
        st = nstf_set_error(NSTF_ERR_FORMAT,
                            "data %s has %lld tokens; a training sequence of --seq %d needs at least %d; give more "
                            "text or a shorter --seq",
                            path, (long long)d->n_tok, seq_len, seq_len + 1);
    if (st == NSTF_OK) {
        d->n_seq = (d->n_tok - 1) / seq_len;
        d->perm = nstf_alloc((size_t)d->n_seq * sizeof *d->perm, "sequence order");
        if (!d->perm) st = NSTF_ERR_OOM;
        else make_perm(d);
    }
    if (st != NSTF_OK) {
        nstf_data_close(d);
        return st;
    }
    *out = d;
    return NSTF_OK;
}

int64_t nstf_data_n_tokens(const nstf_data *d) { return d->n_tok; }
int64_t nstf_data_n_seq(const nstf_data *d) { return d->n_seq; }

void nstf_data_tell(const nstf_data *d, int64_t *epoch, int64_t *index) {
    *epoch = d->epoch;
    *index = d->index;
}

nstf_status nstf_data_seek(nstf_data *d, int64_t epoch, int64_t index) {
    if (epoch < 0 || index < 0 || index >= d->n_seq)
        return nstf_set_error(NSTF_ERR_RANGE, "data position (epoch %lld, sequence %lld) is outside the %lld sequences",
                              (long long)epoch, (long long)index, (long long)d->n_seq);
    if (epoch != d->epoch) {
        d->epoch = epoch;
        make_perm(d);
    }
    d->index = index;
    return NSTF_OK;
}

/* token at stream position p */
static int32_t token_at(const nstf_data *d, int64_t p, int *hint) {
    if (d->mem) return d->mem[p];
    int i = *hint;
    while (i + 1 < d->n_sh && p >= d->sh[i + 1].start) i++;
    while (p < d->sh[i].start) i--;
    *hint = i;
    const shard *s = &d->sh[i];
    const int64_t k = p - s->start;
    return s->width == 2 ? (int32_t)((uint32_t)s->data[2 * k] | (uint32_t)s->data[2 * k + 1] << 8)
                         : (int32_t)get_u32(s->data + 4 * k);
}

nstf_status nstf_data_next(nstf_data *d, int32_t *out) {
    const int64_t p0 = d->perm[d->index] * d->seq_len;
    int hint = 0;
    for (int i = 0; i <= d->seq_len; i++) out[i] = token_at(d, p0 + i, &hint);
    if (++d->index == d->n_seq) {
        d->index = 0;
        d->epoch++;
        make_perm(d);
    }
    return NSTF_OK;
}
