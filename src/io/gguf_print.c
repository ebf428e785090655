/* gguf_print.c — human-readable dump of an opened GGUF (for `nstf inspect`).
 *
 * Owns nstf_gguf_print: header facts, every key/value (arrays shown as
 * type[count] with their first elements), the tensor table, and the total
 * bytes per tensor type. Reads only what the reader already validated. */
#include <string.h>

#include "io/gguf.h"

#define PRINT_ARR_HEAD 8   /* array elements shown unless all_kv */
#define PRINT_STR_MAX 120  /* string bytes shown unless all_kv */

typedef unsigned long long ull;

/* A gguf string, quoted, with control bytes escaped; cut at `max` bytes. */
static void put_str(FILE *f, nstf_gguf_str s, uint64_t max) {
    uint64_t n = s.len < max ? s.len : max;
    fputc('"', f);
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c < 0x20 || c == 0x7f) fprintf(f, "\\x%02x", c);
        else fputc(c, f);
    }
    fputc('"', f);
    if (n < s.len) fprintf(f, "...(%llu bytes)", (ull)s.len);
}

/* One fixed-size element of type t at p (little-endian). */
static void put_elem(FILE *f, uint32_t t, const uint8_t *p) {
    uint64_t u = 0;
    for (uint64_t i = 0, n = (t == NSTF_GGUF_UINT64 || t == NSTF_GGUF_INT64 || t == NSTF_GGUF_FLOAT64) ? 8
                            : (t == NSTF_GGUF_UINT32 || t == NSTF_GGUF_INT32 || t == NSTF_GGUF_FLOAT32) ? 4
                            : (t == NSTF_GGUF_UINT16 || t == NSTF_GGUF_INT16) ? 2 : 1;
         i < n; i++)
        u |= (uint64_t)p[i] << (8 * i);
    switch ((nstf_gguf_vtype)t) {
    case NSTF_GGUF_UINT8: case NSTF_GGUF_UINT16: case NSTF_GGUF_UINT32: case NSTF_GGUF_UINT64:
        fprintf(f, "%llu", (ull)u); break;
    case NSTF_GGUF_INT8: fprintf(f, "%d", (int8_t)u); break;
    case NSTF_GGUF_INT16: fprintf(f, "%d", (int16_t)u); break;
    case NSTF_GGUF_INT32: fprintf(f, "%d", (int32_t)u); break;
    case NSTF_GGUF_INT64: fprintf(f, "%lld", (long long)(int64_t)u); break;
    case NSTF_GGUF_BOOL: fputs(u ? "true" : "false", f); break;
    case NSTF_GGUF_FLOAT32: { uint32_t b = (uint32_t)u; float x; memcpy(&x, &b, 4); fprintf(f, "%.9g", x); break; }
    case NSTF_GGUF_FLOAT64: { double x; memcpy(&x, &u, 8); fprintf(f, "%.17g", x); break; }
    case NSTF_GGUF_STRING: case NSTF_GGUF_ARRAY: fputs("?", f); break;
    }
}

static void put_value(FILE *f, const nstf_gguf_kv *kv, bool all) {
    uint64_t smax = all ? UINT64_MAX : PRINT_STR_MAX;
    switch (kv->type) {
    case NSTF_GGUF_STRING: put_str(f, kv->val.str, smax); return;
    case NSTF_GGUF_BOOL: fputs(kv->val.u64 ? "true" : "false", f); return;
    case NSTF_GGUF_FLOAT32: fprintf(f, "%.9g", kv->val.f64); return;
    case NSTF_GGUF_FLOAT64: fprintf(f, "%.17g", kv->val.f64); return;
    case NSTF_GGUF_INT8: case NSTF_GGUF_INT16: case NSTF_GGUF_INT32: case NSTF_GGUF_INT64:
        fprintf(f, "%lld", (long long)kv->val.i64); return;
    case NSTF_GGUF_UINT8: case NSTF_GGUF_UINT16: case NSTF_GGUF_UINT32: case NSTF_GGUF_UINT64:
        fprintf(f, "%llu", (ull)kv->val.u64); return;
    case NSTF_GGUF_ARRAY: break;
    }
    uint64_t show = all ? kv->arr_n : (kv->arr_n < PRINT_ARR_HEAD ? kv->arr_n : PRINT_ARR_HEAD);
    static const uint8_t esz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    fprintf(f, "%s[%llu] [", nstf_gguf_vtype_name(kv->arr_type), (ull)kv->arr_n);
    for (uint64_t i = 0; i < show; i++) {
        if (i) fputs(", ", f);
        if (kv->arr_type == NSTF_GGUF_STRING)
            put_str(f, kv->arr_strs[i], all ? UINT64_MAX : 40);
        else
            put_elem(f, kv->arr_type, (const uint8_t *)kv->arr_data + i * esz[kv->arr_type]);
    }
    fputs(show < kv->arr_n ? ", ...]" : "]", f);
}

nstf_status nstf_gguf_print(const nstf_gguf *g, FILE *f, bool all_kv) {
    if (!g || !f) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gguf_print: NULL argument");
    fprintf(f, "file:       %s\n", g->path);
    fprintf(f, "version:    %u\n", g->version);
    fprintf(f, "size:       %llu bytes\n", (ull)g->size);
    fprintf(f, "alignment:  %llu\n", (ull)g->alignment);
    fprintf(f, "data at:    %llu\n", (ull)g->data_offset);
    fprintf(f, "key/values: %llu\n", (ull)g->n_kv);
    fprintf(f, "tensors:    %llu\n\n", (ull)g->n_tensors);

    for (uint64_t i = 0; i < g->n_kv; i++) {
        const nstf_gguf_kv *kv = &g->kv[i];
        fprintf(f, "  %-44.*s %-8s ", (int)(kv->key.len < 200 ? kv->key.len : 200), kv->key.ptr,
                kv->type == NSTF_GGUF_ARRAY ? "array" : nstf_gguf_vtype_name(kv->type));
        put_value(f, kv, all_kv);
        fputc('\n', f);
    }

    fprintf(f, "\n  %-5s %-40s %-6s %-28s %12s %12s\n", "#", "name", "type", "dims", "bytes", "offset");
    uint64_t per_type[32] = {0}, n_per_type[32] = {0}, total = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const nstf_gguf_tensor *t = &g->tensors[i];
        char dims[96];
        int n = 0;
        for (uint32_t d = 0; d < t->n_dims; d++)
            n += snprintf(dims + n, sizeof dims - (size_t)n, d ? ", %lld" : "[%lld", (long long)t->ne[d]);
        snprintf(dims + n, sizeof dims - (size_t)n, "]");
        fprintf(f, "  %-5llu %-40.*s %-6s %-28s %12llu %12llu\n", (ull)i,
                (int)(t->name.len < 200 ? t->name.len : 200), t->name.ptr, nstf_type_name(t->type), dims,
                (ull)t->n_bytes, (ull)t->offset);
        if ((unsigned)t->type < 32) {
            per_type[t->type] += t->n_bytes;
            n_per_type[t->type]++;
        }
        total += t->n_bytes;
    }
    fprintf(f, "\n  bytes per type:\n");
    for (unsigned ty = 0; ty < 32; ty++)
        if (n_per_type[ty])
            fprintf(f, "    %-6s %6llu tensors %14llu bytes (%.2f MiB)\n", nstf_type_name(ty),
                    (ull)n_per_type[ty], (ull)per_type[ty], per_type[ty] / 1048576.0);
    fprintf(f, "    total  %6llu tensors %14llu bytes (%.2f MiB)\n", (ull)g->n_tensors, (ull)total,
            total / 1048576.0);
    return ferror(f) ? nstf_set_error(NSTF_ERR_IO, "%s: writing the listing failed", g->path) : NSTF_OK;
}
