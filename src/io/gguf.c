/* gguf.c — GGUF v2/v3 reader (mmap or borrowed memory, validate before
 * trust) and in-memory writer.
 *
 * Owns: the parse of a GGUF image into nstf_gguf (key/values, tensor infos,
 * pointers into the image), the hash indexes behind nstf_gguf_find_*, the
 * typed getters, and nstf_gguf_writer. Nothing that points into the file is
 * handed out before the whole header and every tensor range has been
 * checked; every failure is one message naming the file and the problem.
 *
 * Layout (little-endian): "GGUF" u32 version, u64 n_tensors, u64 n_kv,
 * n_kv x { str key, u32 type, value }, n_tensors x { str name, u32 n_dims,
 * u64 ne[n_dims], u32 type, u64 offset }, padding to `alignment`, data.
 * A str is { u64 len, bytes }. An array value is { u32 elem type, u64 n,
 * n elements }. */
#include "io/gguf.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/mem.h"
#include "io/mapfile.h"

typedef unsigned long long ull; /* for printf of uint64_t without PRIu64 noise */

/* ---- small helpers ------------------------------------------------------- */

static uint16_t ld_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t ld_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t ld_u64(const uint8_t *p) { return (uint64_t)ld_u32(p) | ((uint64_t)ld_u32(p + 4) << 32); }

/* Byte size of a fixed-size value type; 0 for STRING, ARRAY and unknown ids. */
static uint64_t vtype_size(uint32_t t) {
    static const uint8_t k[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < sizeof k ? k[t] : 0;
}
static bool vtype_known(uint32_t t) { return t <= NSTF_GGUF_FLOAT64; }
static bool vtype_is_int(uint32_t t) {
    return t <= NSTF_GGUF_INT32 || t == NSTF_GGUF_UINT64 || t == NSTF_GGUF_INT64;
}
static bool vtype_is_signed(uint32_t t) {
    return t == NSTF_GGUF_INT8 || t == NSTF_GGUF_INT16 || t == NSTF_GGUF_INT32 || t == NSTF_GGUF_INT64;
}

const char *nstf_gguf_vtype_name(uint32_t t) {
    static const char *const k[] = {"uint8",  "int8",   "uint16", "int16", "uint32",
                                    "int32",  "float32", "bool",  "string", "array",
                                    "uint64", "int64",  "float64"};
    return t < sizeof k / sizeof k[0] ? k[t] : "?";
}

/* ggml's names for type ids we do not support, so that a message can say
 * "type id 12 (Q4_K)" instead of a bare number. */
static const char *ggml_type_name(uint32_t id) {
    static const char *const k[] = {"F32",  "F16",  "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0",
                                    "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                                    "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
                                    "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32",
                                    "I64", "F64", "IQ1_M", "BF16"};
    return id < sizeof k / sizeof k[0] ? k[id] : "unknown";
}

/* A printable, NUL-terminated, shortened copy of a gguf string for messages. */
typedef struct { char s[72]; } shown;
static shown show(nstf_gguf_str v) {
    shown r;
    uint64_t n = v.len < 64 ? v.len : 64, i;
    for (i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)v.ptr[i];
        r.s[i] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
    }
    if (v.len > 64) { memcpy(r.s + i, "...", 3); i += 3; }
    r.s[i] = 0;
    return r;
}

bool nstf_gguf_str_eq(nstf_gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

/* ---- string hash set (key and tensor-name indexes) ---------------------- */

/* Open addressing over pointers to nstf_gguf_str that live in arrays which
 * never move once parsing starts. Grows at half load. */
typedef struct {
    const nstf_gguf_str **slot;
    uint64_t cap, n;
} strset;

static uint64_t hash_bytes(const char *p, uint64_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (uint64_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static const nstf_gguf_str *strset_find(const strset *s, const char *p, uint64_t n) {
    if (!s->cap) return NULL;
    for (uint64_t i = hash_bytes(p, n) & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
        const nstf_gguf_str *e = s->slot[i];
        if (!e) return NULL;
        if (e->len == n && (n == 0 || memcmp(e->ptr, p, n) == 0)) return e;
    }
}

static void strset_put(strset *s, const nstf_gguf_str *v) {
    uint64_t i = hash_bytes(v->ptr, v->len) & (s->cap - 1);
    while (s->slot[i]) i = (i + 1) & (s->cap - 1);
    s->slot[i] = v;
    s->n++;
}

/* Inserts v; *dup is set to the existing entry if one has the same bytes. */
static nstf_status strset_insert(strset *s, const nstf_gguf_str *v, const nstf_gguf_str **dup) {
    *dup = strset_find(s, v->ptr, v->len);
    if (*dup) return NSTF_OK;
    if ((s->n + 1) * 2 > s->cap) {
        uint64_t cap = s->cap ? s->cap * 2 : 64;
        const nstf_gguf_str **old = s->slot;
        uint64_t old_cap = s->cap;
        s->slot = nstf_calloc(cap, sizeof *s->slot, "gguf name index");
        if (!s->slot) { s->slot = old; return NSTF_ERR_OOM; }
        s->cap = cap;
        s->n = 0;
        for (uint64_t i = 0; i < old_cap; i++)
            if (old[i]) strset_put(s, old[i]);
        nstf_free(old);
    }
    strset_put(s, v);
    return NSTF_OK;
}

/* ---- reader -------------------------------------------------------------- */

typedef struct gguf_impl {
    nstf_gguf pub; /* first, so nstf_gguf* and gguf_impl* convert */
    strset keys, names;
    /* views (nstf_gguf_open_view): the key/value image they own, and who
     * owns the tensor data */
    void *owned_image;
    void (*release)(void *ctx);
    void *release_ctx;
} gguf_impl;

_Static_assert(offsetof(nstf_gguf_kv, key) == 0, "kv lookup casts key to kv");
_Static_assert(offsetof(nstf_gguf_tensor, name) == 0, "tensor lookup casts name to tensor");

/* A read cursor over the image; `ctx` describes what is being read for the
 * messages ("key #3 'general.name'"). */
typedef struct {
    const uint8_t *b;
    uint64_t size, pos;
    const char *file;
    char ctx[160];
} cursor;

static nstf_status need(cursor *c, uint64_t n, const char *what) {
    if (n > c->size - c->pos)
        return nstf_set_error(NSTF_ERR_FORMAT,
                              "%s: %s: %s (%llu bytes at offset %llu) extends past end of file "
                              "(size %llu); the file is truncated or corrupt",
                              c->file, c->ctx, what, (ull)n, (ull)c->pos, (ull)c->size);
    return NSTF_OK;
}
static nstf_status rd_u32(cursor *c, uint32_t *v, const char *what) {
    NSTF_TRY(need(c, 4, what));
    *v = ld_u32(c->b + c->pos);
    c->pos += 4;
    return NSTF_OK;
}
static nstf_status rd_u64(cursor *c, uint64_t *v, const char *what) {
    NSTF_TRY(need(c, 8, what));
    *v = ld_u64(c->b + c->pos);
    c->pos += 8;
    return NSTF_OK;
}
static nstf_status rd_str(cursor *c, nstf_gguf_str *s, const char *what) {
    uint64_t len;
    NSTF_TRY(rd_u64(c, &len, what));
    if (len > c->size - c->pos)
        return nstf_set_error(NSTF_ERR_FORMAT,
                              "%s: %s: %s has length %llu at offset %llu, which extends past end "
                              "of file (size %llu)",
                              c->file, c->ctx, what, (ull)len, (ull)(c->pos - 8), (ull)c->size);
    s->len = len;
    s->ptr = (const char *)c->b + c->pos;
    c->pos += len;
    return NSTF_OK;
}

/* One scalar of fixed-size type t at p into kv->val. */
static void decode_scalar(uint32_t t, const uint8_t *p, nstf_gguf_kv *kv) {
    uint32_t u32;
    uint64_t u64;
    float f32;
    switch ((nstf_gguf_vtype)t) {
    case NSTF_GGUF_UINT8: case NSTF_GGUF_BOOL: kv->val.u64 = p[0]; break;
    case NSTF_GGUF_INT8: kv->val.i64 = (int8_t)p[0]; break;
    case NSTF_GGUF_UINT16: kv->val.u64 = ld_u16(p); break;
    case NSTF_GGUF_INT16: kv->val.i64 = (int16_t)ld_u16(p); break;
    case NSTF_GGUF_UINT32: kv->val.u64 = ld_u32(p); break;
    case NSTF_GGUF_INT32: kv->val.i64 = (int32_t)ld_u32(p); break;
    case NSTF_GGUF_FLOAT32: u32 = ld_u32(p); memcpy(&f32, &u32, 4); kv->val.f64 = f32; break;
    case NSTF_GGUF_UINT64: kv->val.u64 = ld_u64(p); break;
    case NSTF_GGUF_INT64: kv->val.i64 = (int64_t)ld_u64(p); break;
    case NSTF_GGUF_FLOAT64: u64 = ld_u64(p); memcpy(&kv->val.f64, &u64, 8); break;
    case NSTF_GGUF_STRING: case NSTF_GGUF_ARRAY: break;
    }
}

static nstf_status parse_value(cursor *c, nstf_gguf_kv *kv) {
    uint32_t t = kv->type;
    if (t == NSTF_GGUF_STRING) return rd_str(c, &kv->val.str, "string value");
    if (t != NSTF_GGUF_ARRAY) {
        NSTF_TRY(need(c, vtype_size(t), "value"));
        const uint8_t *p = c->b + c->pos;
        if (t == NSTF_GGUF_BOOL && p[0] > 1)
            return nstf_set_error(NSTF_ERR_FORMAT, "%s: %s: bool value is %u at offset %llu (must be 0 or 1)",
                                  c->file, c->ctx, p[0], (ull)c->pos);
        decode_scalar(t, p, kv);
        c->pos += vtype_size(t);
        return NSTF_OK;
    }
    uint32_t et;
    uint64_t n;
    NSTF_TRY(rd_u32(c, &et, "array element type"));
    if (et == NSTF_GGUF_ARRAY)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: %s: nested array (array of arrays) is not allowed",
                              c->file, c->ctx);
    if (!vtype_known(et))
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: %s: unknown array element type %u (known: 0..12)",
                              c->file, c->ctx, et);
    NSTF_TRY(rd_u64(c, &n, "array length"));
    kv->arr_type = (nstf_gguf_vtype)et;
    kv->arr_n = n;
    if (et == NSTF_GGUF_STRING) {
        /* every element needs at least its 8-byte length */
        if (n > (c->size - c->pos) / 8)
            return nstf_set_error(NSTF_ERR_FORMAT,
                                  "%s: %s: string array of %llu elements cannot fit in the %llu bytes "
                                  "left in the file",
                                  c->file, c->ctx, (ull)n, (ull)(c->size - c->pos));
        kv->arr_data = c->b + c->pos;
        if (n == 0) return NSTF_OK;
        kv->arr_strs = nstf_calloc((size_t)n, sizeof *kv->arr_strs, "gguf string array");
        if (!kv->arr_strs) return NSTF_ERR_OOM;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t len;
            if (c->size - c->pos < 8 || (len = ld_u64(c->b + c->pos)) > c->size - c->pos - 8)
                return nstf_set_error(NSTF_ERR_FORMAT,
                                      "%s: %s: string array element %llu at offset %llu extends past "
                                      "end of file (size %llu)",
                                      c->file, c->ctx, (ull)i, (ull)c->pos, (ull)c->size);
            kv->arr_strs[i].len = len;
            kv->arr_strs[i].ptr = (const char *)c->b + c->pos + 8;
            c->pos += 8 + len;
        }
        return NSTF_OK;
    }
    uint64_t bytes;
    if (!nstf_mul_ok(n, vtype_size(et), &bytes))
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: %s: array of %llu %s elements: byte size overflows",
                              c->file, c->ctx, (ull)n, nstf_gguf_vtype_name(et));
    NSTF_TRY(need(c, bytes, "array data"));
    const uint8_t *p = c->b + c->pos;
    if (et == NSTF_GGUF_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (p[i] > 1)
                return nstf_set_error(NSTF_ERR_FORMAT,
                                      "%s: %s: bool array element %llu is %u (must be 0 or 1)",
                                      c->file, c->ctx, (ull)i, p[i]);
    kv->arr_data = p;
    c->pos += bytes;
    return NSTF_OK;
}

static nstf_status parse_kvs(gguf_impl *g, cursor *c) {
    nstf_gguf *G = &g->pub;
    for (uint64_t i = 0; i < G->n_kv; i++) {
        nstf_gguf_kv *kv = &G->kv[i];
        snprintf(c->ctx, sizeof c->ctx, "key/value #%llu", (ull)i);
        NSTF_TRY(rd_str(c, &kv->key, "key"));
        if (kv->key.len == 0)
            return nstf_set_error(NSTF_ERR_FORMAT, "%s: key/value #%llu at offset %llu has an empty key",
                                  c->file, (ull)i, (ull)(c->pos - 8));
        snprintf(c->ctx, sizeof c->ctx, "key '%s'", show(kv->key).s);
        const nstf_gguf_str *dup;
        NSTF_TRY(strset_insert(&g->keys, &kv->key, &dup));
        if (dup)
            return nstf_set_error(NSTF_ERR_FORMAT, "%s: duplicate key '%s' (key/value #%llu and #%llu)",
                                  c->file, show(kv->key).s,
                                  (ull)((const nstf_gguf_kv *)(const void *)dup - G->kv), (ull)i);
        uint32_t t;
        NSTF_TRY(rd_u32(c, &t, "value type"));
        if (!vtype_known(t))
            return nstf_set_error(NSTF_ERR_FORMAT, "%s: %s: unknown value type %u (known: 0..12)",
                                  c->file, c->ctx, t);
        kv->type = (nstf_gguf_vtype)t;
        NSTF_TRY(parse_value(c, kv));
    }
    return NSTF_OK;
}

static nstf_status parse_alignment(nstf_gguf *G) {
    G->alignment = NSTF_GGUF_DEFAULT_ALIGNMENT;
    const nstf_gguf_kv *kv = nstf_gguf_find_kv(G, "general.alignment");
    if (!kv) return NSTF_OK;
    if (kv->type != NSTF_GGUF_UINT32)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: general.alignment has type %s (must be uint32)",
                              G->path, nstf_gguf_vtype_name(kv->type));
    uint64_t a = kv->val.u64;
    if (a == 0 || (a & (a - 1)) != 0)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: general.alignment %llu is not a power of two",
                              G->path, (ull)a);
    G->alignment = a;
    return NSTF_OK;
}

static nstf_status parse_tensor_info(gguf_impl *g, cursor *c, uint64_t i) {
    nstf_gguf *G = &g->pub;
    nstf_gguf_tensor *t = &G->tensors[i];
    snprintf(c->ctx, sizeof c->ctx, "tensor #%llu", (ull)i);
    NSTF_TRY(rd_str(c, &t->name, "tensor name"));
    if (t->name.len == 0)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor #%llu at offset %llu has an empty name",
                              c->file, (ull)i, (ull)(c->pos - 8));
    char name[sizeof(shown)];
    memcpy(name, show(t->name).s, sizeof name);
    const char *nm = name;
    snprintf(c->ctx, sizeof c->ctx, "tensor '%s'", nm);
    const nstf_gguf_str *dup;
    NSTF_TRY(strset_insert(&g->names, &t->name, &dup));
    if (dup)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: duplicate tensor name '%s' (tensors #%llu and #%llu)",
                              c->file, nm,
                              (ull)((const nstf_gguf_tensor *)(const void *)dup - G->tensors), (ull)i);
    NSTF_TRY(rd_u32(c, &t->n_dims, "n_dims"));
    if (t->n_dims < 1 || t->n_dims > NSTF_GGUF_MAX_DIMS)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor '%s': n_dims %u is out of range (1..%d)",
                              c->file, nm, t->n_dims, NSTF_GGUF_MAX_DIMS);
    uint64_t n_elems = 1;
    for (uint32_t d = 0; d < NSTF_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t ne;
        NSTF_TRY(rd_u64(c, &ne, "dim"));
        if (ne == 0)
            return nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor '%s': dim %u is 0", c->file, nm, d);
        if (ne > (uint64_t)INT64_MAX)
            return nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor '%s': dim %u = %llu is too large",
                                  c->file, nm, d, (ull)ne);
        if (!nstf_mul_ok(n_elems, ne, &n_elems) || n_elems > (uint64_t)INT64_MAX)
            return nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor '%s': element count overflows at dim %u",
                                  c->file, nm, d);
        t->ne[d] = (int64_t)ne;
    }
    t->n_elems = n_elems;
    uint32_t type;
    NSTF_TRY(rd_u32(c, &type, "tensor type"));
    if (!nstf_type_valid(type))
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "%s: tensor '%s' has type id %u (%s), which is not supported "
                              "(supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, "
                              "Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS)",
                              c->file, nm, type, ggml_type_name(type));
    t->type = (nstf_type)type;
    int64_t blk = nstf_type_block_elems(t->type);
    if (t->ne[0] % blk != 0)
        return nstf_set_error(NSTF_ERR_FORMAT,
                              "%s: tensor '%s': ne[0] = %lld is not a multiple of the block size %lld of %s",
                              c->file, nm, (long long)t->ne[0], (long long)blk, nstf_type_name(type));
    uint64_t row;
    if (!nstf_type_row_bytes(t->type, t->ne[0], &row) ||
        !nstf_mul_ok(row, n_elems / (uint64_t)t->ne[0], &t->n_bytes))
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor '%s': byte size overflows", c->file, nm);
    NSTF_TRY(rd_u64(c, &t->offset, "tensor offset"));
    if (t->offset % G->alignment != 0)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor '%s': data offset %llu is not aligned to %llu",
                              c->file, nm, (ull)t->offset, (ull)G->alignment);
    return NSTF_OK;
}

typedef struct { uint64_t begin, end, idx; } range;
static int range_cmp(const void *a, const void *b) {
    const range *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static nstf_status check_data(nstf_gguf *G) {
    for (uint64_t i = 0; i < G->n_tensors; i++) {
        nstf_gguf_tensor *t = &G->tensors[i];
        uint64_t at, end;
        if (!nstf_add_ok(G->data_offset, t->offset, &at) || !nstf_add_ok(at, t->n_bytes, &end))
            return nstf_set_error(NSTF_ERR_FORMAT,
                                  "%s: tensor '%s': data offset %llu + size %llu overflows", G->path,
                                  show(t->name).s, (ull)t->offset, (ull)t->n_bytes);
        if (end > G->size)
            return nstf_set_error(NSTF_ERR_FORMAT,
                                  "%s: tensor '%s' data [offset %llu, %llu bytes] extends past end of "
                                  "file (size %llu)",
                                  G->path, show(t->name).s, (ull)at, (ull)t->n_bytes, (ull)G->size);
        t->data = G->base + at;
    }
    if (G->n_tensors < 2) return NSTF_OK;
    range *r = nstf_calloc((size_t)G->n_tensors, sizeof *r, "gguf tensor ranges");
    if (!r) return NSTF_ERR_OOM;
    for (uint64_t i = 0; i < G->n_tensors; i++)
        r[i] = (range){G->tensors[i].offset, G->tensors[i].offset + G->tensors[i].n_bytes, i};
    qsort(r, (size_t)G->n_tensors, sizeof *r, range_cmp);
    nstf_status st = NSTF_OK;
    for (uint64_t i = 1; i < G->n_tensors; i++)
        if (r[i].begin < r[i - 1].end) {
            const nstf_gguf_tensor *a = &G->tensors[r[i - 1].idx], *b = &G->tensors[r[i].idx];
            char an[sizeof(shown)];
            memcpy(an, show(a->name).s, sizeof an);
            st = nstf_set_error(NSTF_ERR_FORMAT,
                                "%s: tensor '%s' data [offset %llu, %llu bytes] overlaps tensor '%s' "
                                "[offset %llu, %llu bytes]",
                                G->path, show(b->name).s, (ull)(G->data_offset + b->offset),
                                (ull)b->n_bytes, an, (ull)(G->data_offset + a->offset), (ull)a->n_bytes);
            break;
        }
    nstf_free(r);
    return st;
}

static nstf_status parse(gguf_impl *g) {
    nstf_gguf *G = &g->pub;
    cursor c = {.b = G->base, .size = G->size, .pos = 0, .file = G->path};
    snprintf(c.ctx, sizeof c.ctx, "header");
    if (G->size == 0)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: empty file (0 bytes); not a GGUF file", G->path);
    if (G->size < 4 || memcmp(G->base, "GGUF", 4) != 0) {
        char m[4 * 4 + 1] = {0};
        for (uint64_t i = 0; i < 4 && i < G->size; i++) sprintf(m + 4 * i, "\\x%02x", G->base[i]);
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: bad magic \"%s\" (expected \"GGUF\"); not a GGUF file",
                              G->path, m);
    }
    c.pos = 4;
    NSTF_TRY(rd_u32(&c, &G->version, "version"));
    uint32_t v = G->version;
    uint32_t sw = (v >> 24) | ((v >> 8) & 0xff00) | ((v << 8) & 0xff0000) | (v << 24);
    if (v > 0xffff && sw <= 0xffff)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "%s: big-endian GGUF file (version reads as %u byte-swapped) is not "
                              "supported; convert it to little-endian",
                              G->path, sw);
    if (v == 0)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: invalid GGUF version 0", G->path);
    if (v == 1)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "%s: GGUF version 1 (32-bit counts) is not supported; re-convert the "
                              "model with a current converter (version 2 or 3)",
                              G->path);
    if (v > 3)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "%s: GGUF version %u is not supported (supported: 2, 3)", G->path, v);
    NSTF_TRY(rd_u64(&c, &G->n_tensors, "n_tensors"));
    NSTF_TRY(rd_u64(&c, &G->n_kv, "n_kv"));
    /* Each kv needs >= 8 (key len) + 1 (key) + 4 (type) + 1 bytes... count
     * 13; each tensor info >= 8 + 4 + 8 + 4 + 8 = 32 (empty name, 1 dim). */
    uint64_t left = G->size - c.pos;
    if (G->n_kv > left / 13)
        return nstf_set_error(NSTF_ERR_FORMAT,
                              "%s: n_kv = %llu is implausible: only %llu bytes follow the header and "
                              "each key/value needs at least 13",
                              G->path, (ull)G->n_kv, (ull)left);
    if (G->n_tensors > left / 32 || G->n_kv * 13 + G->n_tensors * 32 > left)
        return nstf_set_error(NSTF_ERR_FORMAT,
                              "%s: n_tensors = %llu is implausible: only %llu bytes follow the header "
                              "(%llu key/values need at least %llu) and each tensor info needs at "
                              "least 32",
                              G->path, (ull)G->n_tensors, (ull)left, (ull)G->n_kv, (ull)(G->n_kv * 13));
    if (G->n_kv) {
        G->kv = nstf_calloc((size_t)G->n_kv, sizeof *G->kv, "gguf key/values");
        if (!G->kv) return NSTF_ERR_OOM;
    }
    if (G->n_tensors) {
        G->tensors = nstf_calloc((size_t)G->n_tensors, sizeof *G->tensors, "gguf tensor infos");
        if (!G->tensors) return NSTF_ERR_OOM;
    }
    NSTF_TRY(parse_kvs(g, &c));
    NSTF_TRY(parse_alignment(G));
    for (uint64_t i = 0; i < G->n_tensors; i++) NSTF_TRY(parse_tensor_info(g, &c, i));
    uint64_t rem = c.pos % G->alignment;
    G->data_offset = c.pos + (rem ? G->alignment - rem : 0); /* pos <= size, alignment < 2^32 */
    /* A file without tensors may stop before its (empty) data section; a
     * large alignment would then put data_offset past the end of the file
     * (found by fuzz_gguf). Keep every offset handed out inside the file. */
    if (G->n_tensors == 0 && G->data_offset > G->size) G->data_offset = G->size;
    return check_data(G);
}

static nstf_status open_image(const uint8_t *base, uint64_t size, bool mapped, const char *name,
                              nstf_gguf **out) {
    *out = NULL;
    gguf_impl *g = nstf_calloc(1, sizeof *g, "gguf");
    if (!g) {
        if (mapped) nstf_unmap_file(base, size);
        return NSTF_ERR_OOM;
    }
    g->pub.base = base;
    g->pub.size = size;
    g->pub.mapped = mapped;
    g->pub.path = strdup(name ? name : "<memory>");
    if (!g->pub.path) {
        nstf_gguf_close(&g->pub);
        return nstf_set_error(NSTF_ERR_OOM, "out of host memory opening %s", name);
    }
    nstf_status st = parse(g);
    if (st != NSTF_OK) {
        nstf_gguf_close(&g->pub);
        return st;
    }
    *out = &g->pub;
    return NSTF_OK;
}

nstf_status nstf_gguf_open_memory(const void *data, uint64_t size, const char *name, nstf_gguf **out) {
    if (!out || (!data && size))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gguf_open_memory: NULL argument");
    static const uint8_t empty[1];
    return open_image(data ? data : empty, size, false, name, out);
}

nstf_status nstf_gguf_open(const char *path, nstf_gguf **out) {
    if (!out || !path) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gguf_open: NULL argument");
    *out = NULL;
    const uint8_t *m;
    uint64_t size;
    NSTF_TRY(nstf_map_file(path, "GGUF", &m, &size));
    return open_image(m, size, true, path, out);
}

/* One tensor of a view, checked as the file reader checks its infos. */
static nstf_status check_view_tensor(gguf_impl *g, uint64_t i) {
    nstf_gguf *G = &g->pub;
    nstf_gguf_tensor *t = &G->tensors[i];
    if (!t->name.ptr || t->name.len == 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "%s: view tensor #%llu has no name", G->path, (ull)i);
    shown name = show(t->name);
    const char *nm = name.s;
    const nstf_gguf_str *dup;
    NSTF_TRY(strset_insert(&g->names, &t->name, &dup));
    if (dup) return nstf_set_error(NSTF_ERR_INVALID_ARG, "%s: duplicate tensor name '%s'", G->path, nm);
    bool ok = t->n_dims >= 1 && t->n_dims <= NSTF_GGUF_MAX_DIMS && nstf_type_valid((uint32_t)t->type) && t->data;
    uint64_t n = 1, row = 0, bytes = 0;
    for (uint32_t d = 0; ok && d < NSTF_GGUF_MAX_DIMS; d++)
        ok = t->ne[d] >= 1 && (d < t->n_dims || t->ne[d] == 1) && nstf_mul_ok(n, (uint64_t)t->ne[d], &n);
    ok = ok && n <= (uint64_t)INT64_MAX && t->ne[0] % nstf_type_block_elems(t->type) == 0 &&
         nstf_type_row_bytes(t->type, t->ne[0], &row) && nstf_mul_ok(row, n / (uint64_t)t->ne[0], &bytes) &&
         n == t->n_elems && bytes == t->n_bytes;
    if (!ok)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "%s: view tensor '%s': inconsistent dims, type, sizes or data pointer", G->path, nm);
    return NSTF_OK;
}

nstf_status nstf_gguf_open_view(void *kv_image, uint64_t size, const char *path, const nstf_gguf_tensor *tensors,
                                uint64_t n_tensors, void (*release)(void *ctx), void *ctx, nstf_gguf **out) {
    nstf_gguf *G = NULL;
    nstf_status st = out && kv_image && (tensors || !n_tensors)
                         ? open_image(kv_image, size, false, path, &G)
                         : nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gguf_open_view: NULL argument");
    if (st == NSTF_OK && G->n_tensors)
        st = nstf_set_error(NSTF_ERR_INVALID_ARG, "%s: a view's key/value image holds tensors", path);
    if (st != NSTF_OK) {
        nstf_gguf_close(G);
        nstf_free(kv_image);
        if (release) release(ctx);
        return st;
    }
    gguf_impl *g = (gguf_impl *)G;
    g->owned_image = kv_image;
    g->release = release;
    g->release_ctx = ctx;
    G->data_offset = size;
    if (n_tensors) {
        G->tensors = nstf_calloc((size_t)n_tensors, sizeof *G->tensors, "gguf view tensors");
        if (!G->tensors) st = NSTF_ERR_OOM;
        else memcpy(G->tensors, tensors, (size_t)n_tensors * sizeof *tensors);
        G->n_tensors = G->tensors ? n_tensors : 0;
    }
    for (uint64_t i = 0; st == NSTF_OK && i < G->n_tensors; i++) st = check_view_tensor(g, i);
    if (st != NSTF_OK) {
        nstf_gguf_close(G);
        return st;
    }
    *out = G;
    return NSTF_OK;
}

void nstf_gguf_close(nstf_gguf *G) {
    if (!G) return;
    gguf_impl *g = (gguf_impl *)G;
    if (G->kv)
        for (uint64_t i = 0; i < G->n_kv; i++) nstf_free(G->kv[i].arr_strs);
    nstf_free(G->kv);
    nstf_free(G->tensors);
    nstf_free(g->keys.slot);
    nstf_free(g->names.slot);
    if (G->mapped) nstf_unmap_file(G->base, G->size);
    nstf_free(g->owned_image);
    if (g->release) g->release(g->release_ctx);
    free(G->path);
    nstf_free(g);
}

const nstf_gguf_kv *nstf_gguf_find_kv(const nstf_gguf *G, const char *key) {
    if (!G || !key) return NULL;
    const gguf_impl *g = (const gguf_impl *)G;
    return (const nstf_gguf_kv *)(const void *)strset_find(&g->keys, key, strlen(key));
}

const nstf_gguf_tensor *nstf_gguf_find_tensor(const nstf_gguf *G, const char *name) {
    if (!G || !name) return NULL;
    const gguf_impl *g = (const gguf_impl *)G;
    return (const nstf_gguf_tensor *)(const void *)strset_find(&g->names, name, strlen(name));
}

/* ---- typed getters ------------------------------------------------------- */

static nstf_status missing(const nstf_gguf *g, const char *key) {
    return nstf_set_error(NSTF_ERR_FORMAT, "%s: required key '%s' not found", g->path, key);
}
static nstf_status wrong_type(const nstf_gguf *g, const nstf_gguf_kv *kv, const char *want) {
    const char *t = nstf_gguf_vtype_name(kv->type);
    if (kv->type == NSTF_GGUF_ARRAY)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: key '%s' is an array of %s, expected %s", g->path,
                              show(kv->key).s, nstf_gguf_vtype_name(kv->arr_type), want);
    return nstf_set_error(NSTF_ERR_FORMAT, "%s: key '%s' has type %s, expected %s", g->path,
                          show(kv->key).s, t, want);
}

nstf_status nstf_gguf_get_u32(const nstf_gguf *g, const char *key, uint32_t *out) {
    const nstf_gguf_kv *kv = nstf_gguf_find_kv(g, key);
    if (!kv) return missing(g, key);
    if (!vtype_is_int(kv->type)) return wrong_type(g, kv, "an integer");
    bool neg = vtype_is_signed(kv->type) && kv->val.i64 < 0;
    if (neg || kv->val.u64 > UINT32_MAX)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: key '%s' = %s%llu does not fit in uint32", g->path,
                              key, neg ? "-" : "",
                              neg ? (ull)(-(kv->val.i64 + 1)) + 1 : (ull)kv->val.u64);
    *out = (uint32_t)kv->val.u64;
    return NSTF_OK;
}

nstf_status nstf_gguf_get_f32(const nstf_gguf *g, const char *key, float *out) {
    const nstf_gguf_kv *kv = nstf_gguf_find_kv(g, key);
    if (!kv) return missing(g, key);
    if (kv->type == NSTF_GGUF_FLOAT32 || kv->type == NSTF_GGUF_FLOAT64)
        *out = (float)kv->val.f64;
    else if (vtype_is_int(kv->type))
        *out = vtype_is_signed(kv->type) ? (float)kv->val.i64 : (float)kv->val.u64;
    else
        return wrong_type(g, kv, "a number");
    return NSTF_OK;
}

nstf_status nstf_gguf_get_bool(const nstf_gguf *g, const char *key, bool *out) {
    const nstf_gguf_kv *kv = nstf_gguf_find_kv(g, key);
    if (!kv) return missing(g, key);
    if (kv->type != NSTF_GGUF_BOOL) return wrong_type(g, kv, "bool");
    *out = kv->val.u64 != 0;
    return NSTF_OK;
}

nstf_status nstf_gguf_get_str(const nstf_gguf *g, const char *key, nstf_gguf_str *out) {
    const nstf_gguf_kv *kv = nstf_gguf_find_kv(g, key);
    if (!kv) return missing(g, key);
    if (kv->type != NSTF_GGUF_STRING) return wrong_type(g, kv, "string");
    *out = kv->val.str;
    return NSTF_OK;
}

/* The *_or variants return the default when the key is missing; a present
 * key of the wrong type or range is an error the caller sees through the
 * status-returning getter, so here it also yields the default. */
uint32_t nstf_gguf_get_u32_or(const nstf_gguf *g, const char *key, uint32_t dflt) {
    const nstf_gguf_kv *kv = nstf_gguf_find_kv(g, key);
    if (!kv || !vtype_is_int(kv->type) || (vtype_is_signed(kv->type) && kv->val.i64 < 0) ||
        kv->val.u64 > UINT32_MAX)
        return dflt;
    return (uint32_t)kv->val.u64;
}
float nstf_gguf_get_f32_or(const nstf_gguf *g, const char *key, float dflt) {
    const nstf_gguf_kv *kv = nstf_gguf_find_kv(g, key);
    if (!kv) return dflt;
    if (kv->type == NSTF_GGUF_FLOAT32 || kv->type == NSTF_GGUF_FLOAT64) return (float)kv->val.f64;
    if (vtype_is_int(kv->type))
        return vtype_is_signed(kv->type) ? (float)kv->val.i64 : (float)kv->val.u64;
    return dflt;
}
bool nstf_gguf_get_bool_or(const nstf_gguf *g, const char *key, bool dflt) {
    const nstf_gguf_kv *kv = nstf_gguf_find_kv(g, key);
    return kv && kv->type == NSTF_GGUF_BOOL ? kv->val.u64 != 0 : dflt;
}

nstf_status nstf_gguf_get_arr(const nstf_gguf *g, const char *key, nstf_gguf_vtype elem_type,
                              const nstf_gguf_kv **out) {
    const nstf_gguf_kv *kv = nstf_gguf_find_kv(g, key);
    if (!kv) return missing(g, key);
    if (kv->type != NSTF_GGUF_ARRAY || kv->arr_type != elem_type) {
        char want[48];
        snprintf(want, sizeof want, "an array of %s", nstf_gguf_vtype_name(elem_type));
        return wrong_type(g, kv, want);
    }
    *out = kv;
    return NSTF_OK;
}

/* ---- writer -------------------------------------------------------------- */

typedef struct {
    uint8_t *p;
    uint64_t n, cap;
} bytebuf;

static nstf_status bb_reserve(bytebuf *b, uint64_t more) {
    uint64_t need_n;
    if (!nstf_add_ok(b->n, more, &need_n) || need_n > SIZE_MAX)
        return nstf_set_error(NSTF_ERR_OOM, "gguf writer: buffer size overflows");
    if (need_n <= b->cap) return NSTF_OK;
    uint64_t cap = b->cap ? b->cap : 256;
    while (cap < need_n) cap = cap > UINT64_MAX / 2 ? need_n : cap * 2;
    uint8_t *p = realloc(b->p, (size_t)cap);
    if (!p) return nstf_set_error(NSTF_ERR_OOM, "gguf writer: out of memory (%llu bytes)", (ull)cap);
    b->p = p;
    b->cap = cap;
    return NSTF_OK;
}
static nstf_status bb_put(bytebuf *b, const void *d, uint64_t n) {
    NSTF_TRY(bb_reserve(b, n));
    if (n) memcpy(b->p + b->n, d, (size_t)n);
    b->n += n;
    return NSTF_OK;
}
static nstf_status bb_u32(bytebuf *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    return bb_put(b, x, 4);
}
static nstf_status bb_u64(bytebuf *b, uint64_t v) {
    NSTF_TRY(bb_u32(b, (uint32_t)v));
    return bb_u32(b, (uint32_t)(v >> 32));
}
static nstf_status bb_str(bytebuf *b, const char *s) {
    size_t n = strlen(s);
    NSTF_TRY(bb_u64(b, n));
    return bb_put(b, s, n);
}

typedef struct {
    char *name;
    nstf_type type;
    uint32_t n_dims;
    int64_t ne[NSTF_GGUF_MAX_DIMS];
    uint64_t n_bytes;
    void *data;            /* the copy (add_tensor), or NULL: */
    nstf_gguf_fill_fn fill; /* produced at write time (add_tensor_fill) */
    void *fill_ctx;
    uint64_t fill_index;
} wtensor;

struct nstf_gguf_writer {
    bytebuf kv; /* serialized key/values, in the order added */
    uint64_t n_kv;
    char **keys;
    uint64_t n_keys, cap_keys;
    wtensor *t;
    uint64_t n_t, cap_t;
    bool has_alignment; /* general.alignment was set with set_u32 */
    uint32_t alignment;
};

nstf_status nstf_gguf_writer_create(nstf_gguf_writer **out) {
    if (!out) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gguf_writer_create: NULL argument");
    *out = nstf_calloc(1, sizeof **out, "gguf writer");
    return *out ? NSTF_OK : NSTF_ERR_OOM;
}

void nstf_gguf_writer_free(nstf_gguf_writer *w) {
    if (!w) return;
    free(w->kv.p);
    for (uint64_t i = 0; i < w->n_keys; i++) free(w->keys[i]);
    free(w->keys);
    for (uint64_t i = 0; i < w->n_t; i++) {
        free(w->t[i].name);
        nstf_free(w->t[i].data);
    }
    free(w->t);
    nstf_free(w);
}

/* Checks the key, records it, and writes key + type; the caller writes the
 * value. On a failure after this point the kv buffer is rolled back by the
 * caller via kv_rollback. */
static nstf_status kv_begin(nstf_gguf_writer *w, const char *key, nstf_gguf_vtype type) {
    if (!w || !key) return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: NULL argument");
    if (!key[0]) return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: empty key");
    for (uint64_t i = 0; i < w->n_keys; i++)
        if (strcmp(w->keys[i], key) == 0)
            return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: duplicate key '%s'", key);
    if (strcmp(key, "general.alignment") == 0 && type != NSTF_GGUF_UINT32)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "gguf writer: general.alignment must be a uint32 (set_u32 or the "
                              "alignment argument of nstf_gguf_writer_write)");
    if (w->n_keys == w->cap_keys) {
        uint64_t cap = w->cap_keys ? w->cap_keys * 2 : 16;
        char **k = realloc(w->keys, (size_t)cap * sizeof *k);
        if (!k) return nstf_set_error(NSTF_ERR_OOM, "gguf writer: out of memory");
        w->keys = k;
        w->cap_keys = cap;
    }
    char *copy = strdup(key);
    if (!copy) return nstf_set_error(NSTF_ERR_OOM, "gguf writer: out of memory");
    uint64_t mark = w->kv.n;
    nstf_status st = bb_str(&w->kv, key);
    if (st == NSTF_OK) st = bb_u32(&w->kv, (uint32_t)type);
    if (st != NSTF_OK) {
        w->kv.n = mark;
        free(copy);
        return st;
    }
    w->keys[w->n_keys++] = copy;
    w->n_kv++;
    return NSTF_OK;
}
/* Undo the last kv_begin (value could not be written). */
static void kv_rollback(nstf_gguf_writer *w, uint64_t mark) {
    w->kv.n = mark;
    free(w->keys[--w->n_keys]);
    w->n_kv--;
}

static nstf_status set_scalar(nstf_gguf_writer *w, const char *key, nstf_gguf_vtype t, const void *v,
                              uint64_t n) {
    uint64_t mark = w ? w->kv.n : 0;
    NSTF_TRY(kv_begin(w, key, t));
    nstf_status st = bb_put(&w->kv, v, n);
    if (st != NSTF_OK) kv_rollback(w, mark);
    return st;
}

/* Values are stored little-endian; the engine targets little-endian hosts
 * (x86-64, aarch64), where the in-memory bytes are already that. */
nstf_status nstf_gguf_writer_set_u32(nstf_gguf_writer *w, const char *key, uint32_t v) {
    NSTF_TRY(set_scalar(w, key, NSTF_GGUF_UINT32, &v, 4));
    if (strcmp(key, "general.alignment") == 0) {
        w->has_alignment = true;
        w->alignment = v;
    }
    return NSTF_OK;
}
nstf_status nstf_gguf_writer_set_i32(nstf_gguf_writer *w, const char *key, int32_t v) {
    return set_scalar(w, key, NSTF_GGUF_INT32, &v, 4);
}
nstf_status nstf_gguf_writer_set_u64(nstf_gguf_writer *w, const char *key, uint64_t v) {
    return set_scalar(w, key, NSTF_GGUF_UINT64, &v, 8);
}
nstf_status nstf_gguf_writer_set_f32(nstf_gguf_writer *w, const char *key, float v) {
    return set_scalar(w, key, NSTF_GGUF_FLOAT32, &v, 4);
}
nstf_status nstf_gguf_writer_set_bool(nstf_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    return set_scalar(w, key, NSTF_GGUF_BOOL, &b, 1);
}
nstf_status nstf_gguf_writer_set_str(nstf_gguf_writer *w, const char *key, const char *v) {
    if (!v) return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: NULL string for key '%s'",
                                  key ? key : "?");
    uint64_t mark = w ? w->kv.n : 0;
    NSTF_TRY(kv_begin(w, key, NSTF_GGUF_STRING));
    nstf_status st = bb_str(&w->kv, v);
    if (st != NSTF_OK) kv_rollback(w, mark);
    return st;
}

nstf_status nstf_gguf_writer_set_arr(nstf_gguf_writer *w, const char *key, nstf_gguf_vtype elem,
                                     const void *data, uint64_t n) {
    uint64_t es = vtype_size((uint32_t)elem), bytes;
    if (!es)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "gguf writer: key '%s': array element type %s is not a fixed-size scalar "
                              "(use nstf_gguf_writer_set_arr_str for strings)",
                              key ? key : "?", nstf_gguf_vtype_name((uint32_t)elem));
    if (!nstf_mul_ok(n, es, &bytes) || (n && !data))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: key '%s': bad array (n = %llu)",
                              key ? key : "?", (ull)n);
    if (elem == NSTF_GGUF_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (((const uint8_t *)data)[i] > 1)
                return nstf_set_error(NSTF_ERR_INVALID_ARG,
                                      "gguf writer: key '%s': bool element %llu is not 0/1",
                                      key ? key : "?", (ull)i);
    uint64_t mark = w ? w->kv.n : 0;
    NSTF_TRY(kv_begin(w, key, NSTF_GGUF_ARRAY));
    nstf_status st = bb_u32(&w->kv, (uint32_t)elem);
    if (st == NSTF_OK) st = bb_u64(&w->kv, n);
    if (st == NSTF_OK) st = bb_put(&w->kv, data, bytes);
    if (st != NSTF_OK) kv_rollback(w, mark);
    return st;
}

nstf_status nstf_gguf_writer_set_arr_str(nstf_gguf_writer *w, const char *key,
                                         const char *const *strs, uint64_t n) {
    if (n && !strs)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: key '%s': NULL string array",
                              key ? key : "?");
    for (uint64_t i = 0; i < n; i++)
        if (!strs[i])
            return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: key '%s': string %llu is NULL",
                                  key ? key : "?", (ull)i);
    uint64_t mark = w ? w->kv.n : 0;
    NSTF_TRY(kv_begin(w, key, NSTF_GGUF_ARRAY));
    nstf_status st = bb_u32(&w->kv, NSTF_GGUF_STRING);
    if (st == NSTF_OK) st = bb_u64(&w->kv, n);
    for (uint64_t i = 0; i < n && st == NSTF_OK; i++) st = bb_str(&w->kv, strs[i]);
    if (st != NSTF_OK) kv_rollback(w, mark);
    return st;
}

/* Any key/value of an opened file, copied as it is (value type, strings
 * with their exact bytes, arrays of any element type). */
nstf_status nstf_gguf_writer_copy_kv(nstf_gguf_writer *w, const nstf_gguf_kv *kv) {
    if (!w || !kv) return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: copy_kv: NULL argument");
    char key[256];
    if (kv->key.len == 0 || kv->key.len >= sizeof key || memchr(kv->key.ptr, 0, (size_t)kv->key.len))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: copy_kv: key '%s' is empty, too long or has a NUL",
                              show(kv->key).s);
    memcpy(key, kv->key.ptr, (size_t)kv->key.len);
    key[kv->key.len] = 0;
    uint64_t es = vtype_size((uint32_t)kv->type);
    if (kv->type == NSTF_GGUF_ARRAY && kv->arr_type != NSTF_GGUF_STRING)
        return nstf_gguf_writer_set_arr(w, key, kv->arr_type, kv->arr_data, kv->arr_n);
    uint64_t mark = w->kv.n;
    NSTF_TRY(kv_begin(w, key, kv->type));
    nstf_status st = NSTF_OK;
    if (kv->type == NSTF_GGUF_ARRAY) { /* of strings */
        st = bb_u32(&w->kv, NSTF_GGUF_STRING);
        if (st == NSTF_OK) st = bb_u64(&w->kv, kv->arr_n);
        for (uint64_t i = 0; i < kv->arr_n && st == NSTF_OK; i++) {
            st = bb_u64(&w->kv, kv->arr_strs[i].len);
            if (st == NSTF_OK) st = bb_put(&w->kv, kv->arr_strs[i].ptr, kv->arr_strs[i].len);
        }
    } else if (kv->type == NSTF_GGUF_STRING) {
        st = bb_u64(&w->kv, kv->val.str.len);
        if (st == NSTF_OK) st = bb_put(&w->kv, kv->val.str.ptr, kv->val.str.len);
    } else if (es) { /* the value back in its own width (little-endian host) */
        union { uint8_t b[8]; uint64_t u; int64_t i; double d; float f; } v = {.u = kv->val.u64};
        if (kv->type == NSTF_GGUF_FLOAT32) v.f = (float)kv->val.f64;
        else if (kv->type == NSTF_GGUF_FLOAT64) v.d = kv->val.f64;
        st = bb_put(&w->kv, v.b, es);
    } else {
        st = nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: copy_kv: key '%s' has unknown type %u", key,
                            (unsigned)kv->type);
    }
    if (st != NSTF_OK) kv_rollback(w, mark);
    else if (strcmp(key, "general.alignment") == 0 && kv->type == NSTF_GGUF_UINT32) {
        w->has_alignment = true;
        w->alignment = (uint32_t)kv->val.u64;
    }
    return st;
}

/* Checks a tensor's name, type and dims and appends its entry (data and
 * fill left NULL); *out is the new entry. */
static nstf_status add_tensor_info(nstf_gguf_writer *w, const char *name, nstf_type type, uint32_t n_dims,
                                   const int64_t *ne, wtensor **out) {
    if (!w || !name || !ne) return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: add_tensor: NULL argument");
    if (!name[0]) return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: empty tensor name");
    for (uint64_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: duplicate tensor name '%s'", name);
    if (!nstf_type_valid((uint32_t)type))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: tensor '%s': unsupported type id %u",
                              name, (unsigned)type);
    if (n_dims < 1 || n_dims > NSTF_GGUF_MAX_DIMS)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: tensor '%s': n_dims %u out of range (1..%d)",
                              name, n_dims, NSTF_GGUF_MAX_DIMS);
    uint64_t n_elems = 1, row, bytes;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] < 1)
            return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: tensor '%s': dim %u = %lld (must be >= 1)",
                                  name, d, (long long)ne[d]);
        if (!nstf_mul_ok(n_elems, (uint64_t)ne[d], &n_elems) || n_elems > (uint64_t)INT64_MAX)
            return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: tensor '%s': element count overflows",
                                  name);
    }
    if (ne[0] % nstf_type_block_elems(type) != 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "gguf writer: tensor '%s': ne[0] = %lld is not a multiple of the block "
                              "size %lld of %s",
                              name, (long long)ne[0], (long long)nstf_type_block_elems(type),
                              nstf_type_name((uint32_t)type));
    if (!nstf_type_row_bytes(type, ne[0], &row) || !nstf_mul_ok(row, n_elems / (uint64_t)ne[0], &bytes) ||
        bytes > SIZE_MAX)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: tensor '%s': byte size overflows", name);
    if (w->n_t == w->cap_t) {
        uint64_t cap = w->cap_t ? w->cap_t * 2 : 16;
        wtensor *t = realloc(w->t, (size_t)cap * sizeof *t);
        if (!t) return nstf_set_error(NSTF_ERR_OOM, "gguf writer: out of memory");
        w->t = t;
        w->cap_t = cap;
    }
    wtensor t = {.type = type, .n_dims = n_dims, .n_bytes = bytes};
    for (uint32_t d = 0; d < NSTF_GGUF_MAX_DIMS; d++) t.ne[d] = d < n_dims ? ne[d] : 1;
    t.name = strdup(name);
    if (!t.name) return nstf_set_error(NSTF_ERR_OOM, "gguf writer: out of memory");
    w->t[w->n_t] = t;
    *out = &w->t[w->n_t++];
    return NSTF_OK;
}

nstf_status nstf_gguf_writer_add_tensor(nstf_gguf_writer *w, const char *name, nstf_type type,
                                        uint32_t n_dims, const int64_t *ne, const void *data) {
    if (!data) return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: add_tensor: NULL argument");
    wtensor *t;
    NSTF_TRY(add_tensor_info(w, name, type, n_dims, ne, &t));
    t->data = nstf_alloc((size_t)t->n_bytes, "gguf writer tensor copy");
    if (!t->data) {
        free(t->name);
        w->n_t--;
        return nstf_set_error(NSTF_ERR_OOM, "gguf writer: out of memory copying tensor '%s' (%llu bytes)",
                              name, (ull)t->n_bytes);
    }
    memcpy(t->data, data, (size_t)t->n_bytes);
    return NSTF_OK;
}

nstf_status nstf_gguf_writer_add_tensor_fill(nstf_gguf_writer *w, const char *name, nstf_type type, uint32_t n_dims,
                                             const int64_t *ne, nstf_gguf_fill_fn fill, void *ctx, uint64_t index) {
    if (!fill) return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: add_tensor_fill: NULL argument");
    wtensor *t;
    NSTF_TRY(add_tensor_info(w, name, type, n_dims, ne, &t));
    t->fill = fill;
    t->fill_ctx = ctx;
    t->fill_index = index;
    return NSTF_OK;
}

static uint64_t pad_to(uint64_t x, uint64_t a) { return (a - x % a) % a; }

/* Header, key/values, tensor infos and the padding up to the data section,
 * into `b`; resolves *alignment (0 = general.alignment if set, else 32). */
static nstf_status build_header(nstf_gguf_writer *w, uint32_t *alignment_io, bytebuf *b) {
    uint32_t alignment = *alignment_io;
    if (alignment == 0) alignment = w->has_alignment ? w->alignment : NSTF_GGUF_DEFAULT_ALIGNMENT;
    if (w->has_alignment && w->alignment != alignment)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "gguf writer: alignment %u differs from general.alignment = %u set earlier",
                              alignment, w->alignment);
    if (alignment == 0 || (alignment & (alignment - 1)) != 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: alignment %u is not a power of two",
                              alignment);
    *alignment_io = alignment;
    bool add_align = alignment != NSTF_GGUF_DEFAULT_ALIGNMENT && !w->has_alignment;
    nstf_status st = bb_put(b, "GGUF", 4);
    if (st == NSTF_OK) st = bb_u32(b, 3);
    if (st == NSTF_OK) st = bb_u64(b, w->n_t);
    if (st == NSTF_OK) st = bb_u64(b, w->n_kv + add_align);
    if (st == NSTF_OK) st = bb_put(b, w->kv.p, w->kv.n);
    if (st == NSTF_OK && add_align) {
        st = bb_str(b, "general.alignment");
        if (st == NSTF_OK) st = bb_u32(b, NSTF_GGUF_UINT32);
        if (st == NSTF_OK) st = bb_u32(b, alignment);
    }
    uint64_t off = 0;
    for (uint64_t i = 0; i < w->n_t && st == NSTF_OK; i++) {
        const wtensor *t = &w->t[i];
        st = bb_str(b, t->name);
        if (st == NSTF_OK) st = bb_u32(b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims && st == NSTF_OK; d++) st = bb_u64(b, (uint64_t)t->ne[d]);
        if (st == NSTF_OK) st = bb_u32(b, (uint32_t)t->type);
        if (st == NSTF_OK) st = bb_u64(b, off);
        if (st == NSTF_OK && (!nstf_add_ok(off, t->n_bytes + pad_to(t->n_bytes, alignment), &off)))
            st = nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: total data size overflows");
    }
    /* The padding in one piece: byte by byte, a large alignment (2^30) took
     * minutes (found by fuzz_gguf). */
    uint64_t pad = pad_to(b->n, alignment);
    if (st == NSTF_OK && pad) st = bb_reserve(b, pad);
    if (st == NSTF_OK && pad) {
        memset(b->p + b->n, 0, (size_t)pad);
        b->n += pad;
    }
    return st;
}

/* Where the data section goes: a byte buffer or a FILE. */
typedef struct {
    bytebuf *b;
    FILE *f;
    const char *path;
} sink;

static nstf_status sink_put(sink *s, const void *d, uint64_t n) {
    if (s->b) return bb_put(s->b, d, n);
    if (n && fwrite(d, 1, (size_t)n, s->f) != n)
        return nstf_set_error(NSTF_ERR_IO, "%s: write failed: %s", s->path, strerror(errno));
    return NSTF_OK;
}

/* Every tensor's bytes, each padded to the alignment; filled tensors go
 * through one buffer the size of the largest. */
static nstf_status emit_data(const nstf_gguf_writer *w, uint32_t alignment, sink *s) {
    static const uint8_t zeros[256];
    uint64_t most = 0;
    for (uint64_t i = 0; i < w->n_t; i++)
        if (w->t[i].fill && w->t[i].n_bytes > most) most = w->t[i].n_bytes;
    uint8_t *buf = NULL;
    if (most && !(buf = nstf_alloc((size_t)most, "gguf writer tensor buffer"))) return NSTF_ERR_OOM;
    nstf_status st = NSTF_OK;
    for (uint64_t i = 0; i < w->n_t && st == NSTF_OK; i++) {
        const wtensor *t = &w->t[i];
        const void *d = t->data;
        if (t->fill) {
            st = t->fill(t->fill_ctx, t->fill_index, buf, t->n_bytes);
            d = buf;
        }
        if (st == NSTF_OK) st = sink_put(s, d, t->n_bytes);
        for (uint64_t q = pad_to(t->n_bytes, alignment), k; q && st == NSTF_OK; q -= k) {
            k = q < sizeof zeros ? q : sizeof zeros;
            st = sink_put(s, zeros, k);
        }
    }
    nstf_free(buf);
    return st;
}

nstf_status nstf_gguf_writer_write_memory(nstf_gguf_writer *w, uint32_t alignment, void **out,
                                          uint64_t *size) {
    if (!w || !out || !size)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: write_memory: NULL argument");
    *out = NULL;
    *size = 0;
    bytebuf b = {0};
    nstf_status st = build_header(w, &alignment, &b);
    sink s = {.b = &b};
    if (st == NSTF_OK) st = emit_data(w, alignment, &s);
    if (st != NSTF_OK) {
        free(b.p);
        return st;
    }
    *out = b.p; /* malloc'd; nstf_free is free() */
    *size = b.n;
    return NSTF_OK;
}

/* Streams the data section to the file: no second copy of the weights. */
nstf_status nstf_gguf_writer_write(nstf_gguf_writer *w, const char *path, uint32_t alignment) {
    if (!w || !path) return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: write: NULL argument");
    bytebuf b = {0};
    nstf_status st = build_header(w, &alignment, &b);
    if (st != NSTF_OK) {
        free(b.p);
        return st;
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        int e = errno;
        free(b.p);
        return nstf_set_error(NSTF_ERR_IO, "%s: cannot create: %s", path, strerror(e));
    }
    sink s = {.f = f, .path = path};
    st = sink_put(&s, b.p, b.n);
    free(b.p);
    if (st == NSTF_OK) st = emit_data(w, alignment, &s);
    if (fclose(f) != 0 && st == NSTF_OK)
        st = nstf_set_error(NSTF_ERR_IO, "%s: close failed: %s", path, strerror(errno));
    return st;
}

nstf_status nstf_gguf_writer_write_replace(nstf_gguf_writer *w, const char *path, uint32_t alignment) {
    if (!w || !path) return nstf_set_error(NSTF_ERR_INVALID_ARG, "gguf writer: write: NULL argument");
    const size_t n = strlen(path) + 32;
    char *tmp = malloc(n);
    if (!tmp) return nstf_set_error(NSTF_ERR_OOM, "out of memory");
    snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
    nstf_status st = nstf_gguf_writer_write(w, tmp, alignment);
    if (st == NSTF_OK && rename(tmp, path) != 0)
        st = nstf_set_error(NSTF_ERR_IO, "%s: cannot rename the finished file into place: %s", path, strerror(errno));
    if (st != NSTF_OK) remove(tmp);
    free(tmp);
    return st;
}
