/* fuzz_safetensors.c — libFuzzer target for the safetensors reader
 * (src/io/safetensors.c) and the strict JSON layer under it (src/io/json.c).
 *
 * Every input is opened with nstf_safetensors_open_memory from an
 * exactly-sized heap copy (so ASan sees any byte read past the end). A
 * rejected input must leave *out NULL and a non-empty message naming the
 * file. An accepted one must keep every promise of safetensors.h, checked
 * here independently of the reader: each tensor's type is F32/F16/BF16,
 * its element count the product of its shape and its byte size that count
 * times the element size, its range inside the data section and aligned
 * to its element size, no two non-empty ranges overlap, names are
 * non-empty valid UTF-8, strictly increasing (sorted, unique) and found by
 * nstf_safetensors_find; the first and last byte of every tensor are
 * touched and its first elements converted to fp32; __metadata__ strings
 * are readable. A failed invariant traps (the input becomes a crash file). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"

#include "core/dtype.h"
#include "io/safetensors.h"
#include "io/utf8.h"

#define FAIL FUZZ_FAIL

static volatile uint64_t g_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int cmp_begin(const void *a, const void *b) {
    const nstf_st_tensor *x = *(const nstf_st_tensor *const *)a, *y = *(const nstf_st_tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static void check_set(const nstf_safetensors *st, const uint8_t *img, size_t size) {
    if (st->n_shards != 1 || st->shards[0].base != img || st->shards[0].size != size) FAIL("shard table");
    const uint64_t ds = st->shards[0].data_start;
    if (ds < 10 || ds > size) FAIL("data_start %llu of %zu", (unsigned long long)ds, size);
    const nstf_st_tensor **by_begin = malloc((size_t)(st->n_tensors ? st->n_tensors : 1) * sizeof *by_begin);
    if (!by_begin) return;
    uint64_t n_nonempty = 0;
    float row[64];
    for (uint64_t i = 0; i < st->n_tensors; i++) {
        const nstf_st_tensor *t = &st->tensors[i];
        uint64_t es = t->type == NSTF_TYPE_F32 ? 4 : (t->type == NSTF_TYPE_F16 || t->type == NSTF_TYPE_BF16) ? 2 : 0;
        if (!es) FAIL("tensor %llu: type %d", (unsigned long long)i, (int)t->type);
        if (!t->name || !t->name[0]) FAIL("tensor %llu: empty name", (unsigned long long)i);
        const char *why;
        if (nstf_utf8_check((const uint8_t *)t->name, strlen(t->name), &why) >= 0) FAIL("name not UTF-8: %s", why);
        if (i && strcmp(st->tensors[i - 1].name, t->name) >= 0) FAIL("names not sorted or not unique at %llu", (unsigned long long)i);
        if (nstf_safetensors_find(st, t->name) != t) FAIL("find('%s') is not the tensor", t->name);
        if (t->n_dims > NSTF_ST_MAX_DIMS) FAIL("n_dims %u", t->n_dims);
        unsigned __int128 n = 1;
        for (uint32_t d = 0; d < NSTF_ST_MAX_DIMS; d++) {
            if (t->shape[d] < 0 || (d >= t->n_dims && t->shape[d] != 1)) FAIL("shape[%u] = %lld", d, (long long)t->shape[d]);
            if (d < t->n_dims) n *= (uint64_t)t->shape[d];
            if (n > UINT64_MAX) FAIL("element count overflow accepted");
        }
        if ((uint64_t)n != t->n_elems || n * es > UINT64_MAX || (uint64_t)(n * es) != t->n_bytes)
            FAIL("'%s': counts %llu / %llu", t->name, (unsigned long long)t->n_elems, (unsigned long long)t->n_bytes);
        const uint8_t *p = t->data;
        if (p != img + ds + t->begin) FAIL("'%s': data pointer", t->name);
        if (t->begin > size - ds || t->n_bytes > size - ds - t->begin) FAIL("'%s': range past the end", t->name);
        if ((ds + t->begin) % es) FAIL("'%s': misaligned data accepted", t->name);
        if (t->n_bytes) {
            g_sink += p[0] + p[t->n_bytes - 1];
            uint64_t k = t->n_elems < 64 ? t->n_elems : 64;
            nstf_dequantize_row(t->type, p, row, (int64_t)k);
            g_sink += (uint64_t)(row[0] != row[0]);
            by_begin[n_nonempty++] = t;
        }
    }
    qsort(by_begin, (size_t)n_nonempty, sizeof *by_begin, cmp_begin);
    for (uint64_t i = 1; i < n_nonempty; i++)
        if (by_begin[i]->begin < by_begin[i - 1]->begin + by_begin[i - 1]->n_bytes)
            FAIL("'%s' overlaps '%s'", by_begin[i]->name, by_begin[i - 1]->name);
    free(by_begin);
    for (uint64_t i = 0; i < st->n_meta; i++) {
        if (!st->meta_keys[i] || !st->meta_vals[i]) FAIL("metadata %llu", (unsigned long long)i);
        if (nstf_safetensors_meta(st, st->meta_keys[i]) == NULL) FAIL("metadata lookup");
        g_sink += strlen(st->meta_vals[i]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *img = malloc(size ? size : 1);
    if (!img) return 0;
    if (size) memcpy(img, data, size);
    nstf_safetensors *st = (nstf_safetensors *)(uintptr_t)1;
    nstf_status s = nstf_safetensors_open_memory(img, size, "fuzz.safetensors", &st);
    if (s != NSTF_OK) {
        if (st != NULL) FAIL("rejected input left *out set");
        const char *m = nstf_last_error();
        if (!m || !strstr(m, "fuzz.safetensors")) FAIL("rejection message does not name the file: %s", m ? m : "(null)");
    } else {
        if (!st) FAIL("accepted input without a set");
        check_set(st, img, size);
        nstf_safetensors_close(st);
    }
    free(img);
    return 0;
}
