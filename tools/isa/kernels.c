/* kernels.c — `nstf isa`'s kernel set (isa.h): one record per (target,
 * symbol), found or created by the parsers, each with its name demangled by
 * a tiny Itanium demangler. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "isa.h"

void isa_kernel_reset(isa_kernel *k) {
    memset(k, 0, sizeof *k);
    long *unk[] = {&k->vgpr, &k->agpr, &k->sgpr, &k->lds, &k->scratch, &k->occupancy, &k->wave, &k->max_wg,
                   &k->vgpr_spill, &k->sgpr_spill, &k->code_bytes, &k->regs, &k->stack, &k->spill_st,
                   &k->spill_ld, &k->smem};
    for (size_t i = 0; i < sizeof unk / sizeof unk[0]; i++) *unk[i] = ISA_UNK;
}

/* ---- a tiny Itanium demangler for kernel names --------------------------- *
 * Enough for `_Z<len><name>I<args>E...`: integer/bool literals and simple
 * named or builtin types as template arguments. Anything else keeps the
 * mangled name (the report stays correct, only less pretty). */
typedef struct dm {
    const char *p;
    char *out;
    size_t n, cap;
    bool ok;
} dm;

static void dm_put(dm *d, const char *s, size_t len) {
    if (d->n + len + 1 > d->cap) {
        d->ok = false;
        return;
    }
    memcpy(d->out + d->n, s, len);
    d->n += len;
    d->out[d->n] = 0;
}

static bool dm_source_name(dm *d) {
    if (!isdigit((unsigned char)*d->p)) return false;
    long len = 0;
    while (isdigit((unsigned char)*d->p)) {
        len = len * 10 + (*d->p++ - '0');
        if (len > 4096) return false;
    }
    if ((long)strnlen(d->p, (size_t)len) < len) return false;
    dm_put(d, d->p, (size_t)len);
    d->p += len;
    return true;
}

static const char *dm_builtin(char c) {
    switch (c) {
    case 'b': return "bool";
    case 'c': return "char";
    case 'h': return "unsigned char";
    case 'i': return "int";
    case 'j': return "unsigned";
    case 'l': return "long";
    case 'm': return "unsigned long";
    case 's': return "short";
    case 't': return "unsigned short";
    case 'f': return "float";
    case 'd': return "double";
    case 'x': return "long long";
    case 'y': return "unsigned long long";
    default: return NULL;
    }
}

static bool dm_template_args(dm *d);

static bool dm_type(dm *d) {
    const char *b = dm_builtin(*d->p);
    if (b) {
        d->p++;
        dm_put(d, b, strlen(b));
        return true;
    }
    if (!dm_source_name(d)) return false;
    if (*d->p == 'I') return dm_template_args(d);
    return true;
}

static bool dm_template_args(dm *d) {
    if (*d->p != 'I') return false;
    d->p++;
    dm_put(d, "<", 1);
    bool first = true;
    while (*d->p && *d->p != 'E') {
        if (!first) dm_put(d, ",", 1);
        first = false;
        if (*d->p == 'L') { /* literal: L <type> <value> E */
            d->p++;
            char t = *d->p;
            if (dm_builtin(t)) {
                d->p++;
            } else if (isdigit((unsigned char)t)) { /* enum type: skip its name */
                dm tmp = *d;
                char buf[256];
                tmp.out = buf;
                tmp.n = 0;
                tmp.cap = sizeof buf;
                if (!dm_source_name(&tmp)) return false;
                d->p = tmp.p;
            } else {
                return false;
            }
            bool neg = false;
            if (*d->p == 'n') {
                neg = true;
                d->p++;
            }
            const char *v0 = d->p;
            while (isdigit((unsigned char)*d->p)) d->p++;
            if (d->p == v0 || *d->p != 'E') return false;
            if (t == 'b') {
                dm_put(d, *v0 == '1' ? "true" : "false", *v0 == '1' ? 4 : 5);
            } else {
                if (neg) dm_put(d, "-", 1);
                dm_put(d, v0, (size_t)(d->p - v0));
            }
            d->p++; /* E */
        } else if (!dm_type(d)) {
            return false;
        }
    }
    if (*d->p != 'E') return false;
    d->p++;
    dm_put(d, ">", 1);
    return true;
}

static void isa_demangle(const char *mangled, char *out, size_t cap) {
    dm d = {mangled + 2, out, 0, cap, true};
    out[0] = 0;
    if (isa_starts(mangled, "_Z") && dm_source_name(&d) && (*d.p != 'I' || dm_template_args(&d)) && d.ok) return;
    snprintf(out, cap, "%s", mangled);
}

isa_kernel *isa_find(isa_set *s, const char *target, const char *name) {
    for (size_t i = s->n; i-- > 0;)
        if (!strcmp(s->k[i].name, name) && !strcmp(s->k[i].target, target)) return &s->k[i];
    return NULL;
}

isa_kernel *isa_get(isa_set *s, const char *target, const char *file, const char *name, size_t name_len,
                    bool amd, const char *where, long line) {
    char nm[ISA_NAME_MAX];
    if (!isa_copy_str(nm, sizeof nm, name, name_len)) {
        fprintf(stderr, "nstf isa: %s:%ld: symbol longer than %d characters\n", where, line, ISA_NAME_MAX - 1);
        return NULL;
    }
    isa_kernel *k = isa_find(s, target, nm);
    if (k) return k;
    if (s->n == ISA_MAX_KERNELS) {
        fprintf(stderr, "nstf isa: %s: more than %d kernels\n", where, ISA_MAX_KERNELS);
        return NULL;
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        isa_kernel *nk = realloc(s->k, cap * sizeof *nk);
        if (!nk) {
            fprintf(stderr, "nstf isa: out of memory\n");
            return NULL;
        }
        s->k = nk;
        s->cap = cap;
    }
    k = &s->k[s->n++];
    isa_kernel_reset(k);
    snprintf(k->target, sizeof k->target, "%s", target);
    snprintf(k->file, sizeof k->file, "%s", file);
    memcpy(k->name, nm, name_len + 1);
    isa_demangle(k->name, k->pretty, sizeof k->pretty);
    k->amd = amd;
    return k;
}
