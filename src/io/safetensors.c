/* safetensors.c — safetensors reader: one file or a sharded set (see
 * safetensors.h for what is checked).
 *
 * Owns: the shard mappings, the parsed tensor table (sorted by name, names
 * copied out of cJSON), the __metadata__ strings, and the cross-checks of
 * model.safetensors.index.json against the shards it names. */
#include "io/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "io/json.h"
#include "io/mapfile.h"
#include "io/utf8.h"

typedef unsigned long long ull;

/* index.json and config files are small; a 10 000-shard index is ~1 MB */
#define MAX_INDEX_BYTES (64ull << 20)

/* The dtypes of the format (safetensors' Dtype enum); only the three
 * floats the engine computes with are supported. */
static const struct { const char *name; int size; int type; } k_dtypes[] = {
    {"F32", 4, NSTF_TYPE_F32}, {"F16", 2, NSTF_TYPE_F16}, {"BF16", 2, NSTF_TYPE_BF16},
    {"BOOL", 1, -1}, {"U8", 1, -1}, {"I8", 1, -1}, {"F8_E5M2", 1, -1}, {"F8_E4M3", 1, -1},
    {"F8_E8M0", 1, -1}, {"F4", 1, -1}, {"F6_E2M3", 1, -1}, {"F6_E3M2", 1, -1}, {"I16", 2, -1},
    {"U16", 2, -1}, {"I32", 4, -1}, {"U32", 4, -1}, {"F64", 8, -1}, {"I64", 8, -1}, {"U64", 8, -1},
    {"C64", 8, -1},
};

/* A printable, shortened copy of a name for messages (names are
 * attacker-controlled: no control bytes, at most 64 bytes shown). */
typedef struct { char s[72]; } shown;
static shown show(const char *v) {
    shown r;
    size_t n = strlen(v), k = n < 64 ? n : 64, i;
    for (i = 0; i < k; i++) {
        unsigned char c = (unsigned char)v[i];
        r.s[i] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    if (n > 64) { memcpy(r.s + i, "...", 3); i += 3; }
    r.s[i] = 0;
    return r;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const nstf_st_tensor *)a)->name, ((const nstf_st_tensor *)b)->name);
}

typedef struct { uint64_t begin, end; const char *name; } range;
static int cmp_range(const void *a, const void *b) {
    const range *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* ---- one tensor entry ------------------------------------------------------ */

static nstf_status parse_tensor(const nstf_st_shard *sh, const cJSON *e, nstf_st_tensor *t) {
    shown name = show(e->string);
    const char *f = sh->path, *nm = name.s;
    const char *why;
    if (nstf_utf8_check((const uint8_t *)e->string, strlen(e->string), &why) >= 0)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor name '%s' is not valid UTF-8 (%s)", f, nm, why);
    if (!cJSON_IsObject(e))
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor '%s': entry is not an object", f, nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shp = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(shp) || !cJSON_IsArray(off))
        return nstf_set_error(NSTF_ERR_FORMAT,
                              "%s: tensor '%s': needs \"dtype\" (a string), \"shape\" and \"data_offsets\" "
                              "(arrays)", f, nm);
    int k = -1;
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (strcmp(dt->valuestring, k_dtypes[i].name) == 0) k = (int)i;
    if (k < 0)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor '%s' has unknown dtype \"%s\"", f, nm,
                              show(dt->valuestring).s);
    if (k_dtypes[k].type < 0)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "%s: tensor '%s' has dtype %s, which is not supported (supported: F32, F16, BF16)",
                              f, nm, k_dtypes[k].name);
    t->type = (nstf_type)k_dtypes[k].type;
    int n_dims = cJSON_GetArraySize(shp);
    if (n_dims > NSTF_ST_MAX_DIMS)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor '%s' has %d dims (at most %d)", f, nm, n_dims,
                              NSTF_ST_MAX_DIMS);
    t->n_dims = (uint32_t)n_dims;
    uint64_t n_elems = 1;
    int d = 0;
    for (const cJSON *v = shp->child; v; v = v->next, d++) {
        uint64_t x;
        if (!nstf_json_uint(v, &x))
            return nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not an integer in [0, 2^53)", f,
                                  nm, d);
        if (!nstf_mul_ok(n_elems, x, &n_elems))
            return nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor '%s': element count overflows at shape[%d]", f, nm,
                                  d);
        t->shape[d] = (int64_t)x;
    }
    for (; d < NSTF_ST_MAX_DIMS; d++) t->shape[d] = 1;
    t->n_elems = n_elems;
    if (!nstf_mul_ok(n_elems, (uint64_t)k_dtypes[k].size, &t->n_bytes))
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor '%s': byte size overflows", f, nm);
    uint64_t b, en;
    if (cJSON_GetArraySize(off) != 2 || !nstf_json_uint(off->child, &b) || !nstf_json_uint(off->child->next, &en))
        return nstf_set_error(NSTF_ERR_FORMAT,
                              "%s: tensor '%s': data_offsets is not two integers in [0, 2^53)", f, nm);
    if (en < b)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin",
                              f, nm, (ull)b, (ull)en);
    if (en - b != t->n_bytes)
        return nstf_set_error(NSTF_ERR_FORMAT,
                              "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes, but %s of %llu "
                              "elements needs %llu",
                              f, nm, (ull)b, (ull)en, (ull)(en - b), k_dtypes[k].name, (ull)n_elems,
                              (ull)t->n_bytes);
    uint64_t data_size = sh->size - sh->data_start;
    if (en > data_size)
        return nstf_set_error(NSTF_ERR_FORMAT,
                              "%s: tensor '%s' data [%llu, %llu) extends past end of file (data section of %llu "
                              "bytes at offset %llu)",
                              f, nm, (ull)b, (ull)en, (ull)data_size, (ull)sh->data_start);
    if ((sh->data_start + b) % (uint64_t)k_dtypes[k].size != 0)
        return nstf_set_error(NSTF_ERR_FORMAT,
                              "%s: tensor '%s' data at file offset %llu is not aligned to its %d-byte elements", f,
                              nm, (ull)(sh->data_start + b), k_dtypes[k].size);
    t->begin = b;
    t->data = sh->base + sh->data_start + b;
    return NSTF_OK;
}

/* ---- one shard ----------------------------------------------------------------- */

/* A growing table of tensors over every shard. */
typedef struct {
    nstf_st_tensor *t;
    uint64_t n, cap;
} table;

static nstf_status table_push(table *tb, const nstf_st_tensor *t) {
    if (tb->n == tb->cap) {
        uint64_t cap = tb->cap ? tb->cap * 2 : 64;
        nstf_st_tensor *p = realloc(tb->t, (size_t)cap * sizeof *p);
        if (!p) return nstf_set_error(NSTF_ERR_OOM, "safetensors: out of memory for %llu tensors", (ull)cap);
        tb->t = p;
        tb->cap = cap;
    }
    tb->t[tb->n++] = *t;
    return NSTF_OK;
}

static nstf_status parse_meta(nstf_safetensors *st, const nstf_st_shard *sh, const cJSON *m, bool keep) {
    if (!cJSON_IsObject(m))
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: __metadata__ is not an object", sh->path);
    uint64_t n = 0;
    for (const cJSON *v = m->child; v; v = v->next, n++)
        if (!cJSON_IsString(v))
            return nstf_set_error(NSTF_ERR_FORMAT, "%s: __metadata__ value '%s' is not a string", sh->path,
                                  show(v->string).s);
    if (!keep || n == 0) return NSTF_OK;
    st->meta_keys = nstf_calloc((size_t)n, sizeof(char *), "safetensors metadata");
    st->meta_vals = nstf_calloc((size_t)n, sizeof(char *), "safetensors metadata");
    if (!st->meta_keys || !st->meta_vals) return NSTF_ERR_OOM;
    for (const cJSON *v = m->child; v; v = v->next) {
        char *k = strdup(v->string), *s = strdup(v->valuestring);
        st->meta_keys[st->n_meta] = k;
        st->meta_vals[st->n_meta++] = s;
        if (!k || !s) return nstf_set_error(NSTF_ERR_OOM, "safetensors: out of memory for metadata");
    }
    return NSTF_OK;
}

/* Every tensor range of one shard against the others of the same shard. */
static nstf_status check_overlaps(const nstf_st_shard *sh, const nstf_st_tensor *t, uint64_t n) {
    if (n < 2) return NSTF_OK;
    range *r = nstf_calloc((size_t)n, sizeof *r, "safetensors ranges");
    if (!r) return NSTF_ERR_OOM;
    uint64_t k = 0;
    for (uint64_t i = 0; i < n; i++)
        if (t[i].n_bytes) r[k++] = (range){t[i].begin, t[i].begin + t[i].n_bytes, t[i].name};
    qsort(r, (size_t)k, sizeof *r, cmp_range);
    nstf_status st = NSTF_OK;
    for (uint64_t i = 1; i < k; i++)
        if (r[i].begin < r[i - 1].end) {
            shown a = show(r[i - 1].name);
            st = nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor '%s' data [%llu, %llu) overlaps tensor '%s' [%llu, %llu)",
                                sh->path, show(r[i].name).s, (ull)r[i].begin, (ull)r[i].end, a.s,
                                (ull)r[i - 1].begin, (ull)r[i - 1].end);
            break;
        }
    nstf_free(r);
    return st;
}

/* Parse shard `si` (already mapped into st->shards[si]) into `tb`. */
static nstf_status parse_shard(nstf_safetensors *st, uint32_t si, table *tb) {
    nstf_st_shard *sh = &st->shards[si];
    const char *f = sh->path;
    if (sh->size == 0)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: empty file (0 bytes); not a safetensors file", f);
    if (sh->size < 8)
        return nstf_set_error(NSTF_ERR_FORMAT,
                              "%s: file of %llu bytes is too short for the 8-byte header length; not a "
                              "safetensors file", f, (ull)sh->size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | sh->base[i];
    if (n > NSTF_ST_MAX_HEADER)
        return nstf_set_error(NSTF_ERR_FORMAT,
                              "%s: header length %llu exceeds the limit of %llu bytes; not a safetensors file",
                              f, (ull)n, (ull)NSTF_ST_MAX_HEADER);
    if (n > sh->size - 8)
        return nstf_set_error(NSTF_ERR_FORMAT,
                              "%s: header length %llu extends past end of file (size %llu); the file is "
                              "truncated or not a safetensors file", f, (ull)n, (ull)sh->size);
    if (n < 2 || sh->base[8] != '{')
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: header does not start with '{'; not a safetensors file", f);
    sh->data_start = 8 + n;
    char what[600];
    snprintf(what, sizeof what, "%s: header", f);
    cJSON *root = NULL;
    NSTF_TRY(nstf_json_parse((const char *)sh->base + 8, (size_t)n, what, &root));
    nstf_status s = NSTF_OK;
    uint64_t first = tb->n;
    bool seen_meta = false;
    if (!cJSON_IsObject(root))
        s = nstf_set_error(NSTF_ERR_FORMAT, "%s: header is not a JSON object", f);
    for (const cJSON *e = root->child; s == NSTF_OK && e; e = e->next) {
        if (!e->string[0]) {
            s = nstf_set_error(NSTF_ERR_FORMAT, "%s: a tensor has an empty name", f);
        } else if (strcmp(e->string, "__metadata__") == 0) {
            if (seen_meta) s = nstf_set_error(NSTF_ERR_FORMAT, "%s: duplicate key '__metadata__'", f);
            else s = parse_meta(st, sh, e, si == 0);
            seen_meta = true;
        } else {
            nstf_st_tensor t = {.shard = si};
            s = parse_tensor(sh, e, &t);
            if (s == NSTF_OK) {
                char *name = strdup(e->string);
                if (!name) s = nstf_set_error(NSTF_ERR_OOM, "safetensors: out of memory for names");
                t.name = name;
                if (s == NSTF_OK) s = table_push(tb, &t);
                if (s != NSTF_OK) free(name);
            }
        }
    }
    cJSON_Delete(root);
    if (s == NSTF_OK && tb->n > first) s = check_overlaps(sh, tb->t + first, tb->n - first);
    return s;
}

/* ---- sets -------------------------------------------------------------------------- */

void nstf_safetensors_close(nstf_safetensors *st) {
    if (!st) return;
    for (uint64_t i = 0; i < st->n_tensors; i++) free((char *)st->tensors[i].name);
    free(st->tensors);
    for (uint32_t i = 0; i < st->n_shards; i++) {
        if (st->shards[i].mapped) nstf_unmap_file(st->shards[i].base, st->shards[i].size);
        free(st->shards[i].path);
    }
    nstf_free(st->shards);
    for (uint64_t i = 0; i < st->n_meta; i++) {
        free(st->meta_keys[i]);
        free(st->meta_vals[i]);
    }
    nstf_free(st->meta_keys);
    nstf_free(st->meta_vals);
    free(st->path);
    nstf_free(st);
}

static nstf_safetensors *set_new(const char *path, uint32_t n_shards) {
    nstf_safetensors *st = nstf_calloc(1, sizeof *st, "safetensors");
    if (!st) return NULL;
    st->path = strdup(path);
    st->shards = nstf_calloc(n_shards, sizeof *st->shards, "safetensors shards");
    st->n_shards = n_shards;
    if (!st->path || !st->shards) {
        nstf_safetensors_close(st);
        nstf_set_error(NSTF_ERR_OOM, "out of host memory opening %s", path);
        return NULL;
    }
    return st;
}

/* Parse every shard (mapped or borrowed already), sort by name, refuse
 * duplicates. Takes the set; on failure closes it. */
static nstf_status set_finish(nstf_safetensors *st, nstf_safetensors **out) {
    table tb = {0};
    nstf_status s = NSTF_OK;
    for (uint32_t i = 0; s == NSTF_OK && i < st->n_shards; i++) s = parse_shard(st, i, &tb);
    st->tensors = tb.t;
    st->n_tensors = tb.n;
    if (s == NSTF_OK && tb.n) qsort(tb.t, (size_t)tb.n, sizeof *tb.t, cmp_name);
    for (uint64_t i = 1; s == NSTF_OK && i < tb.n; i++)
        if (strcmp(tb.t[i - 1].name, tb.t[i].name) == 0) {
            const nstf_st_tensor *a = &tb.t[i - 1], *b = &tb.t[i];
            if (a->shard == b->shard)
                s = nstf_set_error(NSTF_ERR_FORMAT, "%s: duplicate tensor name '%s'", st->shards[a->shard].path,
                                   show(a->name).s);
            else
                s = nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor '%s' is in two shards: %s and %s", st->path,
                                   show(a->name).s, st->shards[a->shard].path, st->shards[b->shard].path);
        }
    if (s != NSTF_OK) {
        nstf_safetensors_close(st);
        return s;
    }
    *out = st;
    return NSTF_OK;
}

nstf_status nstf_safetensors_open_memory(const void *data, uint64_t size, const char *name,
                                         nstf_safetensors **out) {
    if (!out || (!data && size))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_safetensors_open_memory: NULL argument");
    *out = NULL;
    static const uint8_t empty[1];
    nstf_safetensors *st = set_new(name ? name : "<memory>", 1);
    if (!st) return NSTF_ERR_OOM;
    st->shards[0].path = strdup(st->path);
    if (!st->shards[0].path) {
        nstf_safetensors_close(st);
        return nstf_set_error(NSTF_ERR_OOM, "out of host memory");
    }
    st->shards[0].base = data ? data : empty;
    st->shards[0].size = size;
    return set_finish(st, out);
}

static nstf_status map_shard(nstf_st_shard *sh, const char *path) {
    sh->path = strdup(path);
    if (!sh->path) return nstf_set_error(NSTF_ERR_OOM, "out of host memory");
    NSTF_TRY(nstf_map_file(path, "safetensors", &sh->base, &sh->size));
    sh->mapped = true;
    return NSTF_OK;
}

nstf_status nstf_safetensors_open(const char *path, nstf_safetensors **out) {
    if (!out || !path) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_safetensors_open: NULL argument");
    *out = NULL;
    nstf_safetensors *st = set_new(path, 1);
    if (!st) return NSTF_ERR_OOM;
    nstf_status s = map_shard(&st->shards[0], path);
    if (s != NSTF_OK) {
        nstf_safetensors_close(st);
        return s;
    }
    return set_finish(st, out);
}

/* ---- sharded: model.safetensors.index.json ------------------------------------------ */

/* A shard name must be a plain file beside the index: no folders, no "..". */
static bool plain_file_name(const char *s) {
    return s[0] && strcmp(s, ".") != 0 && strcmp(s, "..") != 0 && !strchr(s, '/') && !strchr(s, '\\');
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

nstf_status nstf_safetensors_open_index(const char *index_path, nstf_safetensors **out) {
    if (!out || !index_path)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_safetensors_open_index: NULL argument");
    *out = NULL;
    cJSON *root;
    NSTF_TRY(nstf_json_read_file(index_path, MAX_INDEX_BYTES, &root));
    const char *f = index_path;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    nstf_status s = NSTF_OK;
    const char **files = NULL;
    uint64_t n_map = 0, n_files = 0;
    nstf_safetensors *st = NULL;
    if (!cJSON_IsObject(root) || !cJSON_IsObject(map) || !map->child)
        s = nstf_set_error(NSTF_ERR_FORMAT, "%s: no \"weight_map\" object with entries", f);
    for (const cJSON *e = s == NSTF_OK ? map->child : NULL; e && s == NSTF_OK; e = e->next, n_map++)
        if (!cJSON_IsString(e) || !plain_file_name(e->valuestring))
            s = nstf_set_error(NSTF_ERR_FORMAT,
                               "%s: weight_map entry '%s' is not the file name of a shard beside the index", f,
                               show(e->string).s);
    /* the distinct shard names, sorted */
    if (s == NSTF_OK) {
        files = nstf_calloc((size_t)n_map, sizeof *files, "safetensors index");
        if (!files) s = NSTF_ERR_OOM;
    }
    if (s == NSTF_OK) {
        uint64_t k = 0;
        for (const cJSON *e = map->child; e; e = e->next) files[k++] = e->valuestring;
        qsort(files, (size_t)n_map, sizeof *files, cmp_str);
        for (uint64_t i = 0; i < n_map; i++)
            if (i == 0 || strcmp(files[i], files[n_files - 1]) != 0) files[n_files++] = files[i];
        if (n_files > 100000)
            s = nstf_set_error(NSTF_ERR_FORMAT, "%s: %llu shards is implausible", f, (ull)n_files);
    }
    if (s == NSTF_OK) st = set_new(index_path, (uint32_t)n_files);
    if (s == NSTF_OK && !st) s = NSTF_ERR_OOM;
    /* the folder of the index */
    const char *slash = strrchr(index_path, '/');
    size_t dir_len = slash ? (size_t)(slash - index_path) + 1 : 0;
    for (uint64_t i = 0; s == NSTF_OK && i < n_files; i++) {
        size_t len = dir_len + strlen(files[i]) + 1;
        char *p = malloc(len);
        if (!p) { s = nstf_set_error(NSTF_ERR_OOM, "out of host memory"); break; }
        memcpy(p, index_path, dir_len);
        strcpy(p + dir_len, files[i]);
        s = map_shard(&st->shards[i], p);
        if (s != NSTF_OK) nstf_wrap_error(s, "%s names shard %s", f, files[i]);
        free(p);
    }
    if (s == NSTF_OK) {
        s = set_finish(st, &st);
        if (s != NSTF_OK) st = NULL; /* closed by set_finish */
    }
    /* the map and the shards agree, both ways */
    for (const cJSON *e = s == NSTF_OK ? map->child : NULL; e && s == NSTF_OK; e = e->next) {
        const nstf_st_tensor *t = nstf_safetensors_find(st, e->string);
        if (!t)
            s = nstf_set_error(NSTF_ERR_FORMAT, "%s: weight_map names tensor '%s' in %s, which does not hold it", f,
                               show(e->string).s, show(e->valuestring).s);
        else if (strcmp(st->shards[t->shard].path + dir_len, e->valuestring) != 0)
            s = nstf_set_error(NSTF_ERR_FORMAT, "%s: weight_map puts tensor '%s' in %s, but it is in %s", f,
                               show(e->string).s, show(e->valuestring).s, st->shards[t->shard].path + dir_len);
    }
    if (s == NSTF_OK && n_map != st->n_tensors) {
        /* every mapped name was found, and names are unique in both: so a
         * shard holds a tensor the map does not list (or the map repeats one) */
        for (uint64_t i = 0; i < st->n_tensors && s == NSTF_OK; i++) {
            const cJSON *e = cJSON_GetObjectItemCaseSensitive(map, st->tensors[i].name);
            if (!e)
                s = nstf_set_error(NSTF_ERR_FORMAT, "%s: tensor '%s' of %s is not in the weight_map", f,
                                   show(st->tensors[i].name).s, st->shards[st->tensors[i].shard].path + dir_len);
        }
        if (s == NSTF_OK)
            s = nstf_set_error(NSTF_ERR_FORMAT, "%s: weight_map has %llu entries for %llu tensors (a name repeats)",
                               f, (ull)n_map, (ull)st->n_tensors);
    }
    nstf_free(files);
    cJSON_Delete(root);
    if (s != NSTF_OK) {
        nstf_safetensors_close(st);
        return s;
    }
    *out = st;
    return NSTF_OK;
}

nstf_status nstf_safetensors_open_dir(const char *dir, nstf_safetensors **out) {
    if (!out || !dir) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_safetensors_open_dir: NULL argument");
    *out = NULL;
    size_t n = strlen(dir);
    char *p = malloc(n + 40);
    if (!p) return nstf_set_error(NSTF_ERR_OOM, "out of host memory");
    const char *sep = n && dir[n - 1] == '/' ? "" : "/";
    snprintf(p, n + 40, "%s%smodel.safetensors", dir, sep);
    FILE *fp = fopen(p, "rb");
    nstf_status s;
    if (fp) {
        fclose(fp);
        s = nstf_safetensors_open(p, out);
    } else {
        snprintf(p, n + 40, "%s%smodel.safetensors.index.json", dir, sep);
        fp = fopen(p, "rb");
        if (fp) {
            fclose(fp);
            s = nstf_safetensors_open_index(p, out);
        } else {
            s = nstf_set_error(NSTF_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json in the folder",
                               dir);
        }
    }
    free(p);
    return s;
}

const nstf_st_tensor *nstf_safetensors_find(const nstf_safetensors *st, const char *name) {
    if (!st || !name || !st->n_tensors) return NULL;
    nstf_st_tensor key = {.name = name};
    return bsearch(&key, st->tensors, (size_t)st->n_tensors, sizeof key, cmp_name);
}

const char *nstf_safetensors_meta(const nstf_safetensors *st, const char *key) {
    for (uint64_t i = 0; st && key && i < st->n_meta; i++)
        if (strcmp(st->meta_keys[i], key) == 0) return st->meta_vals[i];
    return NULL;
}
