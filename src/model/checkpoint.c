/* checkpoint.c — the run's state in DIR/checkpoint.nstf, written whole or
 * not at all (io/atomic_file.h: a temporary file, fsync, rename), and read
 * back only after its header, size and checksum are checked.
 *
 * Layout (little-endian, as the host writes it):
 *   256-byte header: magic "NSTFCKPT", version, header size, the
 *     fingerprint of the model and training shape (the shape, the
 *     parameter table; with LoRA also the base's tensors), steps done, tokens,
 *     data position (epoch, index), the shape in words for messages
 *     (layers, width, heads, kv heads, ffn, vocabulary, LoRA rank and
 *     matrices, sequence length), the flat arrays' length, the seed, the
 *     last loss;
 *   the master weights, the first and the second AdamW moment: n_flat
 *     fp32 each;
 *   a 64-bit FNV-1a of everything before it.
 * Gradients are not saved (each step starts from zero). A ZeRO-1 run
 * writes the same file: the moments are gathered from the ranks' slots
 * as they are written, and a resume gives each rank its slot, so a
 * checkpoint moves between rank counts and --zero modes. With the data
 * position and the step, a resumed run repeats what the uninterrupted run
 * would have done, bit for bit on the CPU.
 *
 * NSTF_CKPT_STALL_MS (a switch of core/switches.h, for fault-injection tests): sleep that
 * long in the middle of writing the weights, so a test can kill the writer
 * there and check that the previous checkpoint survives. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/mem.h"
#include "core/switches.h"
#include "io/atomic_file.h"
#include "io/mapfile.h"
#include "model/trainer.h"

#define CK_MAGIC "NSTFCKPT"
#define CK_VERSION 1
#define CK_HEADER 256
#define CK_CHUNK ((int64_t)1 << 20) /* floats per transfer */

typedef struct ck_header {
    char magic[8];
    uint32_t version, header_bytes;
    uint64_t fingerprint;
    int64_t step, tokens, epoch, index;
    int32_t n_layers, dim, n_heads, n_kv_heads, ffn_dim, n_vocab, lora_rank, lora_mask, seq_len, pad_;
    int64_t n_flat;
    uint64_t seed;
    double loss;
} ck_header;
_Static_assert(sizeof(ck_header) <= CK_HEADER, "checkpoint header");

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ull;
    return h;
}
#define FNV0 0xcbf29ce484222325ull

typedef struct put_job {
    nstf_trainer *t;
    const float *arr;
    int64_t n_flat;
} put_job;

/* Rank r takes the weights whole and the moments of its part (all of
 * them without ZeRO-1, its slot with it). */
static nstf_status put_rank(void *ctx, int r) {
    put_job *j = ctx;
    nstf_train *tr = j->t->trs[r];
    int64_t lo = 0, hi = 0;
    nstf_train_shard(tr, &lo, &hi);
    NSTF_TRY(nstf_train_put(tr, 0, 0, j->n_flat, j->arr));
    for (int which = 1; which < 3; which++)
        NSTF_TRY(nstf_train_put(tr, which, lo, hi - lo, j->arr + (int64_t)which * j->n_flat + lo));
    return nstf_train_sync_copy(tr);
}

/* The moments' elements [o, o + k) into buf, each rank its part of them:
 * with ZeRO-1 they are gathered from the ranks' slots (on the ranks'
 * threads, each with its device current), else rank 0 holds them all. */
typedef struct get_job {
    nstf_trainer *t;
    int which;
    int64_t o, k;
    float *buf;
} get_job;

static nstf_status get_rank(void *ctx, int r) {
    get_job *j = ctx;
    int64_t lo = 0, hi = 0;
    nstf_train_shard(j->t->trs[r], &lo, &hi);
    const int64_t a = lo > j->o ? lo : j->o, b = hi < j->o + j->k ? hi : j->o + j->k;
    if (a >= b) return NSTF_OK;
    return nstf_train_get(j->t->trs[r], j->which, a, b - a, j->buf + (a - j->o));
}

/* The same in a launch by mpirun: every process gives its rank's part
 * (the rest of its k zero), and each element is taken from the rank that
 * owns it (shard_len elements a rank, as nstf_train_shard cuts them). */
static nstf_status gather_chunk(nstf_trainer *t, int which, int64_t o, int64_t k, float *buf) {
    const int n = t->dp;
    float *mine = nstf_calloc((size_t)k * (size_t)(n + 1), sizeof(float), "checkpoint gather"), *all = mine + k;
    if (!mine) return NSTF_ERR_OOM;
    int64_t lo = 0, hi = 0;
    nstf_train_shard(t->tr, &lo, &hi);
    const int64_t a = lo > o ? lo : o, b = hi < o + k ? hi : o + k;
    nstf_status st = a < b ? nstf_train_get(t->tr, which, a, b - a, mine + (a - o)) : NSTF_OK;
    if (st == NSTF_OK) st = nstf_comm_host_allgather(t->comm, t->self, mine, all, (size_t)k * sizeof(float));
    for (int64_t i = 0; st == NSTF_OK && i < k; i++) {
        int64_t r = (o + i) / t->tr->shard_len;
        if (r >= n) r = n - 1;
        buf[i] = all[r * k + i];
    }
    nstf_free(mine);
    return st;
}

static nstf_status get_chunk(nstf_trainer *t, int which, int64_t o, int64_t k, float *buf) {
    if (which == 0 || t->tr->sh.shards <= 1) return nstf_train_get(t->tr, which, o, k, buf);
    if (t->self >= 0) return gather_chunk(t, which, o, k, buf);
    get_job j = {t, which, o, k, buf};
    return nstf_trainer_on_ranks(t, get_rank, &j);
}

uint64_t nstf_trainer_fingerprint(const nstf_trainer *t) {
    const nstf_llama_config *c = &t->model->cfg;
    const int32_t v[] = {c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim, c->n_vocab,
                         (int32_t)c->tied_output, t->tr->sh.lora_rank, (int32_t)t->tr->sh.lora_mask};
    uint64_t h = fnv(FNV0, v, sizeof v);
    for (int i = 0; i < t->tr->n_ptab; i++) {
        const nstf_param_tensor *p = &t->tr->ptab[i];
        h = fnv(h, p->name, strlen(p->name));
        h = fnv(h, &p->offset, sizeof p->offset);
        h = fnv(h, &p->n, sizeof p->n);
    }
    /* adapters belong to their base: its tensors' types and leading bytes */
    const nstf_gguf *g = t->model->file;
    for (uint64_t i = 0; t->tr->sh.lora_rank > 0 && g && i < g->n_tensors; i++) {
        const nstf_gguf_tensor *bt = &g->tensors[i];
        h = fnv(h, bt->name.ptr, (size_t)bt->name.len);
        h = fnv(h, &bt->type, sizeof bt->type);
        h = fnv(h, bt->data, (size_t)(bt->n_bytes < 256 ? bt->n_bytes : 256));
    }
    return h;
}

static ck_header header_of(const nstf_trainer *t) {
    ck_header h;
    memset(&h, 0, sizeof h);
    const nstf_llama_config *c = &t->model->cfg;
    memcpy(h.magic, CK_MAGIC, 8);
    h.version = CK_VERSION;
    h.header_bytes = CK_HEADER;
    h.fingerprint = nstf_trainer_fingerprint(t);
    h.step = t->step;
    h.tokens = t->tokens;
    nstf_data_tell(t->data, &h.epoch, &h.index);
    h.n_layers = c->n_layers, h.dim = c->dim, h.n_heads = c->n_heads, h.n_kv_heads = c->n_kv_heads;
    h.ffn_dim = c->ffn_dim, h.n_vocab = c->n_vocab;
    h.lora_rank = t->tr->sh.lora_rank, h.lora_mask = (int32_t)t->tr->sh.lora_mask, h.seq_len = t->p.seq;
    h.n_flat = t->tr->n_flat;
    h.seed = t->p.seed;
    h.loss = t->last_loss;
    return h;
}

static void ck_path(const char *dir, char *buf, size_t cap) { snprintf(buf, cap, "%s/checkpoint.nstf", dir); }

static void stall(void) {
    const long ms = nstf_switch_int(NSTF_SW_CKPT_STALL_MS);
    if (ms <= 0) return;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* A launch's rank other than 0: its part of the moments' gathers (ZeRO-1;
 * without it rank 0 holds everything), in the order rank 0 asks them. */
static nstf_status save_share(nstf_trainer *t) {
    if (t->tr->sh.shards <= 1) return NSTF_OK;
    float *buf = nstf_alloc((size_t)CK_CHUNK * sizeof(float), "checkpoint buffer");
    if (!buf) return NSTF_ERR_OOM;
    nstf_status st = NSTF_OK;
    const int64_t n = t->tr->n_flat;
    for (int which = 1; st == NSTF_OK && which < 3; which++)
        for (int64_t o = 0; st == NSTF_OK && o < n; o += CK_CHUNK)
            st = gather_chunk(t, which, o, n - o < CK_CHUNK ? n - o : CK_CHUNK, buf);
    nstf_free(buf);
    return st;
}

nstf_status nstf_trainer_save(nstf_trainer *t, const char *dir) {
    if (t->self > 0) return save_share(t); /* rank 0 of the launch writes */
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return nstf_set_error(NSTF_ERR_IO, "checkpoint folder %s: %s", dir, strerror(errno));
    char path[1024];
    ck_path(dir, path, sizeof path);
    unsigned char hb[CK_HEADER] = {0};
    const ck_header h = header_of(t);
    memcpy(hb, &h, sizeof h);
    float *buf = nstf_alloc((size_t)CK_CHUNK * sizeof(float), "checkpoint buffer");
    if (!buf) return NSTF_ERR_OOM;
    nstf_afile f;
    nstf_status st = nstf_afile_open(&f, path);
    uint64_t sum = fnv(FNV0, hb, sizeof hb);
    if (st == NSTF_OK) st = nstf_afile_write(&f, hb, sizeof hb);
    const int64_t n = t->tr->n_flat;
    for (int which = 0; st == NSTF_OK && which < 3; which++)
        for (int64_t o = 0; st == NSTF_OK && o < n; o += CK_CHUNK) {
            const int64_t k = n - o < CK_CHUNK ? n - o : CK_CHUNK;
            if (which == 0 && o <= n / 2 && o + k > n / 2) stall();
            st = get_chunk(t, which, o, k, buf);
            if (st == NSTF_OK) {
                sum = fnv(sum, buf, (size_t)k * 4);
                st = nstf_afile_write(&f, buf, (size_t)k * 4);
            }
        }
    if (st == NSTF_OK) st = nstf_afile_write(&f, &sum, sizeof sum);
    nstf_free(buf);
    if (st == NSTF_OK) st = nstf_afile_commit(&f);
    else nstf_afile_abort(&f);
    if (st != NSTF_OK)
        return nstf_wrap_error(st, "checkpoint at step %lld not written (the previous one in %s is kept)",
                               (long long)t->step, dir);
    return NSTF_OK;
}

/* "30 layers, width 576, ..." of a header */
static void describe(const ck_header *h, char *buf, size_t cap) {
    snprintf(buf, cap, "%d layers, width %d, %d/%d heads, ffn %d, vocabulary %d, %s%.0d", h->n_layers, h->dim,
             h->n_heads, h->n_kv_heads, h->ffn_dim, h->n_vocab, h->lora_rank ? "LoRA rank " : "full fine-tune",
             h->lora_rank);
}

nstf_status nstf_trainer_resume(nstf_trainer *t, const char *dir) {
    char path[1024];
    ck_path(dir, path, sizeof path);
    const uint8_t *base = NULL;
    uint64_t size = 0;
    nstf_status st = nstf_map_file(path, "checkpoint", &base, &size);
    if (st != NSTF_OK) return nstf_wrap_error(st, "--resume %s", dir);
    ck_header h;
    memset(&h, 0, sizeof h);
    if (size >= CK_HEADER) memcpy(&h, base, sizeof h);
    const ck_header mine = header_of(t);
    char a[200], b[200];
    describe(&h, a, sizeof a);
    describe(&mine, b, sizeof b);
    const uint64_t want = CK_HEADER + 3 * (uint64_t)mine.n_flat * 4 + 8;
    if (size < CK_HEADER || memcmp(h.magic, CK_MAGIC, 8) != 0)
        st = nstf_set_error(NSTF_ERR_FORMAT, "--resume %s: %s is not a checkpoint", dir, path);
    else if (h.version != CK_VERSION || h.header_bytes != CK_HEADER)
        st = nstf_set_error(NSTF_ERR_FORMAT, "--resume %s: checkpoint version %u (this build reads %d)", dir, h.version,
                            CK_VERSION);
    else if (h.fingerprint != mine.fingerprint || h.n_flat != mine.n_flat)
        st = nstf_set_error(NSTF_ERR_INVALID_ARG,
                            "--resume %s: the checkpoint is of another model or training shape (%s); this run is %s",
                            dir, a, b);
    else if (h.seq_len != mine.seq_len)
        st = nstf_set_error(NSTF_ERR_INVALID_ARG, "--resume %s: the checkpoint was made with --seq %d, this run has %d",
                            dir, h.seq_len, mine.seq_len);
    else if (h.seed != mine.seed)
        st = nstf_set_error(NSTF_ERR_INVALID_ARG,
                            "--resume %s: the checkpoint's run drew its data order from --seed %llu, this run from "
                            "%llu; give --seed %llu",
                            dir, (unsigned long long)h.seed, (unsigned long long)mine.seed,
                            (unsigned long long)h.seed);
    else if (size != want)
        st = nstf_set_error(NSTF_ERR_FORMAT, "--resume %s: %s holds %llu bytes, a checkpoint of this model %llu "
                            "(truncated or damaged)", dir, path, (unsigned long long)size, (unsigned long long)want);
    else {
        uint64_t sum = 0;
        memcpy(&sum, base + size - 8, 8);
        if (fnv(FNV0, base, size - 8) != sum)
            st = nstf_set_error(NSTF_ERR_FORMAT, "--resume %s: %s fails its checksum (damaged)", dir, path);
    }
    const float *arr = (const float *)(base + CK_HEADER); /* CK_HEADER keeps them 4-byte aligned */
    if (st == NSTF_OK) { /* every data-parallel replica */
        put_job j = {t, arr, h.n_flat};
        st = nstf_trainer_on_ranks(t, put_rank, &j);
    }
    if (st == NSTF_OK) st = nstf_data_seek(t->data, h.epoch, h.index);
    if (st == NSTF_OK) {
        t->step = h.step;
        t->tokens = h.tokens;
        t->last_loss = h.loss;
    }
    nstf_unmap_file(base, size);
    return st;
}
