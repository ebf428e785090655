/* cmd_isa.c — `nstf isa`: the machine-code report of the GPU backend.
 *
 * Reads what the AMD/CUDA ISA build leaves in a folder (default build-amd/,
 * made by scripts/build_hip.sh and scripts/build_cuda_isa.sh):
 *   <target>/<stem>.s            AMD device assembly (gfx90a, gfx942, gfx1100):
 *                                the per-kernel "; Kernel info" comments, the
 *                                .amdhsa_kernel descriptor and the amdgpu_metadata
 *                                YAML, plus the instructions of each kernel body;
 *   sm_NN/<stem>.ptxas.txt        `nvcc -Xptxas -v` output (registers, stack, spills);
 *   sm_NN/<stem>.sass             `cuobjdump --dump-sass` (instruction counts), or
 *   sm_NN/<stem>.ptx              the PTX, counted instead when no SASS was made.
 * Prints one table per target (markdown, or JSON with --json), and with
 * --check GATES.tsv checks the gates of that table (matrix instructions
 * present, scratch bytes, occupancy floor) and exits 1 naming each failure.
 *
 * Input is text written by compilers, but it is still validated: numbers are
 * parsed strictly, names are length-limited, and any malformed line that the
 * report depends on is an error with file:line, never a crash. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli_util.h"

int cmd_isa(int argc, char **argv);

#define ISA_NAME_MAX 512     /* longest kernel symbol kept */
#define ISA_MAX_KERNELS 20000 /* per report: far above any real build */
#define ISA_UNK (-1L)        /* a figure the input did not give */

typedef struct isa_kernel {
    char target[24];          /* gfx90a, gfx942, gfx1100, sm_90a */
    char file[64];            /* source stem: gemm, flash_attn, ... */
    char name[ISA_NAME_MAX];  /* mangled symbol */
    char pretty[ISA_NAME_MAX]; /* gemm_bf16_kernel<128,128,64,32> */
    bool amd, is_kernel;
    /* AMD: resources */
    long vgpr, agpr, sgpr, lds, scratch, occupancy, wave, max_wg, vgpr_spill, sgpr_spill, code_bytes;
    /* CUDA: resources (ptxas -v) */
    long regs, stack, spill_st, spill_ld, smem;
    /* instruction mix */
    long n_inst;
    long mfma, wmma;              /* AMD matrix instructions */
    long gld[5];                  /* global/flat/buffer loads by width: <=32, 64, 96, 128, other */
    long gst, ds_rd, ds_wr, barrier, scratch_ops;
    long mma, hgmma, ldg128, ldg_other, lds_ops; /* CUDA: HMMA (or mma.sync), HGMMA (wgmma), LDG.128, other LDG, LDS/LDSM */
    long ldgsts;                  /* CUDA: LDGSTS (cp.async) in SASS, cp.async in PTX */
    const char *counted_from;     /* "asm", "sass", "ptx", or NULL when no body was seen */
} isa_kernel;

typedef struct isa_set {
    isa_kernel *k;
    size_t n, cap;
} isa_set;

/* ---- small helpers ------------------------------------------------------- */

static void isa_kernel_reset(isa_kernel *k) {
    memset(k, 0, sizeof *k);
    long *unk[] = {&k->vgpr, &k->agpr, &k->sgpr, &k->lds, &k->scratch, &k->occupancy, &k->wave, &k->max_wg,
                   &k->vgpr_spill, &k->sgpr_spill, &k->code_bytes, &k->regs, &k->stack, &k->spill_st,
                   &k->spill_ld, &k->smem};
    for (size_t i = 0; i < sizeof unk / sizeof unk[0]; i++) *unk[i] = ISA_UNK;
}

static bool copy_str(char *dst, size_t cap, const char *src, size_t len) {
    if (len >= cap) return false;
    memcpy(dst, src, len);
    dst[len] = 0;
    return true;
}

/* Strict non-negative decimal (or 0x hex) number that ends the token. */
static bool parse_num(const char *s, long *out) {
    while (*s == ' ' || *s == '\t') s++;
    if (!isdigit((unsigned char)*s)) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 0);
    if (errno || v < 0) return false;
    while (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n') end++;
    if (*end && strncmp(end, "bytes", 5) != 0) return false;
    *out = v;
    return true;
}

static const char *skip_ws(const char *s) {
    while (*s == ' ' || *s == '\t') s++;
    return s;
}

static bool starts(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

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
    if (starts(mangled, "_Z") && dm_source_name(&d) && (*d.p != 'I' || dm_template_args(&d)) && d.ok) return;
    snprintf(out, cap, "%s", mangled);
}

/* ---- the kernel set ------------------------------------------------------- */

static isa_kernel *isa_find(isa_set *s, const char *target, const char *name) {
    for (size_t i = s->n; i-- > 0;)
        if (!strcmp(s->k[i].name, name) && !strcmp(s->k[i].target, target)) return &s->k[i];
    return NULL;
}

/* The record of (target, name), created when new. NULL (with a message) on
 * a name too long or too many kernels. */
static isa_kernel *isa_get(isa_set *s, const char *target, const char *file, const char *name, size_t name_len,
                           bool amd, const char *where, long line) {
    char nm[ISA_NAME_MAX];
    if (!copy_str(nm, sizeof nm, name, name_len)) {
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

/* ---- AMD assembly ---------------------------------------------------------- */

/* Bits moved by a load mnemonic's suffix (global_load_dwordx4 -> 128,
 * global_load_b64 -> 64, global_load_ushort -> 16); 0 when unknown. */
static int amd_mem_bits(const char *suffix) {
    static const struct {
        const char *s;
        int bits;
    } t[] = {{"dwordx4", 128}, {"dwordx3", 96}, {"dwordx2", 64}, {"dword", 32}, {"b128", 128}, {"b96", 96},
             {"b64", 64},      {"b32", 32},     {"ubyte", 8},    {"sbyte", 8},  {"u8", 8},     {"i8", 8},
             {"ushort", 16},   {"sshort", 16},  {"u16", 16},     {"i16", 16},   {"short", 16}, {"b16", 16},
             {"byte", 8}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (starts(suffix, t[i].s)) return t[i].bits;
    if (starts(suffix, "lds_")) return amd_mem_bits(suffix + 4);
    return 0;
}

static void amd_count_load(isa_kernel *k, const char *suffix) {
    int b = amd_mem_bits(suffix);
    k->gld[b == 0 ? 4 : b <= 32 ? 0 : b == 64 ? 1 : b == 96 ? 2 : 3]++;
}

/* One instruction line of a kernel body. */
static void amd_count(isa_kernel *k, const char *mn, const char *operands) {
    k->n_inst++;
    if (starts(mn, "v_mfma")) k->mfma++;
    else if (starts(mn, "v_wmma")) k->wmma++;
    else if (starts(mn, "global_load_")) amd_count_load(k, mn + 12);
    else if (starts(mn, "flat_load_")) amd_count_load(k, mn + 10);
    else if (starts(mn, "global_store") || starts(mn, "flat_store")) k->gst++;
    else if (starts(mn, "buffer_")) {
        /* HIP kernels address the private (scratch) segment through the buffer
         * resource in s[0:3]; global memory goes through global_* / flat_*. */
        if (strstr(operands, "s[0:3]")) k->scratch_ops++;
        else if (starts(mn, "buffer_load_")) amd_count_load(k, mn + 12);
        else if (starts(mn, "buffer_store")) k->gst++;
    } else if (starts(mn, "scratch_")) k->scratch_ops++;
    else if (starts(mn, "ds_read") || starts(mn, "ds_load")) k->ds_rd++;
    else if (starts(mn, "ds_write") || starts(mn, "ds_store")) k->ds_wr++;
    else if (!strcmp(mn, "s_barrier")) k->barrier++;
}

/* "; Key: value" (or "; Key = value") lines after a kernel. */
static void amd_kernel_info(isa_kernel *k, const char *line) {
    static const struct {
        const char *key;
        size_t off;
    } keys[] = {{"NumSgprs", offsetof(isa_kernel, sgpr)},        {"NumVgprs", offsetof(isa_kernel, vgpr)},
                {"NumAgprs", offsetof(isa_kernel, agpr)},        {"ScratchSize", offsetof(isa_kernel, scratch)},
                {"Occupancy", offsetof(isa_kernel, occupancy)}, {"LDSByteSize", offsetof(isa_kernel, lds)},
                {"codeLenInByte", offsetof(isa_kernel, code_bytes)}};
    const char *s = skip_ws(line + 1);
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        size_t n = strlen(keys[i].key);
        if (strncmp(s, keys[i].key, n) != 0) continue;
        const char *v = skip_ws(s + n);
        if (*v != ':' && *v != '=') continue;
        long x;
        char buf[64];
        const char *e = skip_ws(v + 1);
        size_t len = strcspn(e, " \t\r\n");
        if (copy_str(buf, sizeof buf, e, len) && parse_num(buf, &x)) *(long *)((char *)k + keys[i].off) = x;
    }
}

/* Target name out of `.amdgcn_target "amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-"`. */
static bool amd_target_of(const char *line, char *out, size_t cap) {
    const char *g = strstr(line, "--gfx");
    if (!g) return false;
    g += 2;
    size_t len = strspn(g, "abcdefghijklmnopqrstuvwxyz0123456789");
    return len > 3 && copy_str(out, cap, g, len);
}

typedef struct yaml_item {
    char symbol[ISA_NAME_MAX];
    long agpr, vgpr, sgpr, vgpr_spill, sgpr_spill, wave, max_wg, priv, group;
} yaml_item;

static void yaml_item_reset(yaml_item *y) {
    y->symbol[0] = 0;
    y->agpr = y->vgpr = y->sgpr = y->vgpr_spill = y->sgpr_spill = y->wave = y->max_wg = y->priv = y->group =
        ISA_UNK;
}

static void yaml_item_apply(isa_set *s, const char *target, const yaml_item *y) {
    if (!y->symbol[0]) return;
    isa_kernel *k = isa_find(s, target, y->symbol);
    if (!k) return;
    k->is_kernel = true;
    if (y->agpr != ISA_UNK) k->agpr = y->agpr;
    if (y->vgpr != ISA_UNK && k->vgpr == ISA_UNK) k->vgpr = y->vgpr;
    if (y->sgpr != ISA_UNK && k->sgpr == ISA_UNK) k->sgpr = y->sgpr;
    if (y->vgpr_spill != ISA_UNK) k->vgpr_spill = y->vgpr_spill;
    if (y->sgpr_spill != ISA_UNK) k->sgpr_spill = y->sgpr_spill;
    if (y->wave != ISA_UNK) k->wave = y->wave;
    if (y->max_wg != ISA_UNK) k->max_wg = y->max_wg;
    if (y->priv != ISA_UNK && k->scratch == ISA_UNK) k->scratch = y->priv;
    if (y->group != ISA_UNK && k->lds == ISA_UNK) k->lds = y->group;
}

static bool yaml_key(yaml_item *y, const char *key, const char *val, const char *where, long line) {
    static const struct {
        const char *key;
        size_t off;
    } keys[] = {{".agpr_count", offsetof(yaml_item, agpr)},
                {".vgpr_count", offsetof(yaml_item, vgpr)},
                {".sgpr_count", offsetof(yaml_item, sgpr)},
                {".vgpr_spill_count", offsetof(yaml_item, vgpr_spill)},
                {".sgpr_spill_count", offsetof(yaml_item, sgpr_spill)},
                {".wavefront_size", offsetof(yaml_item, wave)},
                {".max_flat_workgroup_size", offsetof(yaml_item, max_wg)},
                {".private_segment_fixed_size", offsetof(yaml_item, priv)},
                {".group_segment_fixed_size", offsetof(yaml_item, group)}};
    if (!strcmp(key, ".symbol")) {
        size_t len = strcspn(val, " \t\r\n");
        if (len > 3 && !strncmp(val + len - 3, ".kd", 3)) len -= 3;
        if (!copy_str(y->symbol, sizeof y->symbol, val, len)) {
            fprintf(stderr, "nstf isa: %s:%ld: symbol too long\n", where, line);
            return false;
        }
        return true;
    }
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!strcmp(key, keys[i].key)) {
            long x;
            if (!parse_num(val, &x)) {
                fprintf(stderr, "nstf isa: %s:%ld: %s: not a number\n", where, line, key);
                return false;
            }
            *(long *)((char *)y + keys[i].off) = x;
        }
    return true;
}

/* A text file read line by line, the line number kept for messages. */
typedef struct line_reader {
    FILE *f;
    char *line;
    size_t cap;
    long ln;
} line_reader;

/* Opens path; says "cannot open <what><path>" on failure. */
static bool reader_open(line_reader *r, const char *path, const char *what) {
    r->line = NULL;
    r->cap = 0;
    r->ln = 0;
    r->f = fopen(path, "r");
    if (!r->f) fprintf(stderr, "nstf isa: cannot open %s%s: %s\n", what, path, strerror(errno));
    return r->f != NULL;
}

/* The next line (ending newline kept; the buffer is reused), or NULL at the end. */
static char *reader_next(line_reader *r) {
    if (getline(&r->line, &r->cap, r->f) == -1) return NULL;
    r->ln++;
    return r->line;
}

static void reader_close(line_reader *r) {
    free(r->line);
    fclose(r->f);
}

static bool parse_amd_asm(isa_set *s, const char *path, const char *dir_target, const char *stem) {
    line_reader rd;
    if (!reader_open(&rd, path, "")) return false;
    char target[24];
    snprintf(target, sizeof target, "%s", dir_target);
    bool ok = true, in_yaml = false;
    isa_kernel *cur = NULL, *last = NULL; /* function being read; the one before its Kernel info */
    yaml_item y;
    yaml_item_reset(&y);
    char *line;
    while (ok && (line = reader_next(&rd))) {
        const long ln = rd.ln;
        if (in_yaml) {
            if (starts(skip_ws(line), ".end_amdgpu_metadata")) {
                yaml_item_apply(s, target, &y);
                in_yaml = false;
                continue;
            }
            /* kernel list items open with "  - ." (indent 2); their keys sit at
             * indent 4; deeper lines belong to .args */
            const char *kv = NULL;
            if (starts(line, "  - .")) {
                yaml_item_apply(s, target, &y);
                yaml_item_reset(&y);
                kv = line + 4;
            } else if (starts(line, "    .")) {
                kv = line + 4;
            } else if (line[0] != ' ') {
                yaml_item_apply(s, target, &y);
                yaml_item_reset(&y);
            }
            if (kv) {
                const char *colon = strchr(kv, ':');
                char key[64];
                if (colon && copy_str(key, sizeof key, kv, (size_t)(colon - kv)))
                    ok = yaml_key(&y, key, skip_ws(colon + 1), path, ln);
            }
            continue;
        }
        if (line[0] == '\t' || line[0] == ' ') {
            const char *p = skip_ws(line);
            if (starts(p, ".amdgcn_target")) {
                char t[24];
                if (amd_target_of(p, t, sizeof t)) snprintf(target, sizeof target, "%s", t);
            } else if (starts(p, ".amdgpu_metadata")) {
                in_yaml = true;
                yaml_item_reset(&y);
            } else if (starts(p, ".amdhsa_kernel")) {
                p = skip_ws(p + 14);
                size_t len = strcspn(p, " \t\r\n");
                isa_kernel *k = isa_get(s, target, stem, p, len, true, path, ln);
                if (!k) ok = false;
                else k->is_kernel = true;
            } else if (cur && islower((unsigned char)*p)) {
                char mn[64];
                size_t len = strcspn(p, " \t\r\n;");
                if (copy_str(mn, sizeof mn, p, len)) amd_count(cur, mn, p + len);
            }
            continue;
        }
        if (line[0] == ';') {
            if (last && !cur) amd_kernel_info(last, line);
            continue;
        }
        if (starts(line, ".Lfunc_end")) {
            last = cur;
            cur = NULL;
            continue;
        }
        if (line[0] != '.' && line[0] != '\n' && line[0] != '#') {
            /* "name:" (maybe followed by " ; @name") opens a function body */
            size_t len = strcspn(line, ": \t\r\n");
            if (len && line[len] == ':') {
                cur = isa_get(s, target, stem, line, len, true, path, ln);
                if (!cur) ok = false;
                else cur->counted_from = "asm";
                last = NULL;
            }
        }
    }
    if (ok && ferror(rd.f)) {
        fprintf(stderr, "nstf isa: read error on %s\n", path);
        ok = false;
    }
    if (ok && in_yaml) {
        fprintf(stderr, "nstf isa: %s: amdgpu_metadata block not closed (truncated file?)\n", path);
        ok = false;
    }
    reader_close(&rd);
    return ok;
}

/* ---- CUDA: ptxas -v, SASS, PTX -------------------------------------------- */

/* The quoted name after `key '` on a line; NULL when absent. */
static const char *quoted_after(const char *line, const char *key, size_t *len) {
    const char *p = strstr(line, key);
    if (!p) return NULL;
    p += strlen(key);
    const char *e = strchr(p, '\'');
    if (!e) return NULL;
    *len = (size_t)(e - p);
    return p;
}

/* "N <word>" anywhere after `after` in line, e.g. "Used 22 registers" -> 22. */
static long number_before(const char *line, const char *word) {
    const char *w = strstr(line, word);
    if (!w || w == line) return ISA_UNK;
    const char *p = w;
    while (p > line && p[-1] == ' ') p--;
    const char *e = p;
    while (p > line && isdigit((unsigned char)p[-1])) p--;
    if (p == e) return ISA_UNK;
    char buf[32];
    long v;
    if (!copy_str(buf, sizeof buf, p, (size_t)(e - p)) || !parse_num(buf, &v)) return ISA_UNK;
    return v;
}

static bool parse_ptxas(isa_set *s, const char *path, const char *target, const char *stem) {
    line_reader rd;
    if (!reader_open(&rd, path, "")) return false;
    bool ok = true;
    isa_kernel *cur = NULL, *props = NULL;
    char *line;
    while (ok && (line = reader_next(&rd))) {
        const long ln = rd.ln;
        size_t len;
        const char *nm;
        if ((nm = quoted_after(line, "Compiling entry function '", &len))) {
            cur = isa_get(s, target, stem, nm, len, false, path, ln);
            if (!cur) ok = false;
            else cur->is_kernel = true;
            props = NULL;
        } else if ((nm = strstr(line, "Function properties for "))) {
            nm += 24;
            len = strcspn(nm, " \t\r\n");
            char buf[ISA_NAME_MAX];
            props = copy_str(buf, sizeof buf, nm, len) ? isa_find(s, target, buf) : NULL;
        } else if (props && strstr(line, "bytes stack frame")) {
            props->stack = number_before(line, "bytes stack frame");
            props->spill_st = number_before(line, "bytes spill stores");
            props->spill_ld = number_before(line, "bytes spill loads");
            if (props->stack == ISA_UNK || props->spill_st == ISA_UNK || props->spill_ld == ISA_UNK) {
                fprintf(stderr, "nstf isa: %s:%ld: malformed stack/spill line\n", path, ln);
                ok = false;
            }
            props = NULL;
        } else if (cur && strstr(line, "Used ") && strstr(line, "registers")) {
            cur->regs = number_before(line, "registers");
            long sm = number_before(line, "bytes smem");
            cur->smem = sm == ISA_UNK ? 0 : sm;
            if (cur->regs == ISA_UNK) {
                fprintf(stderr, "nstf isa: %s:%ld: malformed register line\n", path, ln);
                ok = false;
            }
        }
    }
    reader_close(&rd);
    return ok;
}

static void sass_count(isa_kernel *k, const char *op) {
    k->n_inst++;
    if (starts(op, "HMMA")) k->mma++;
    else if (starts(op, "HGMMA")) k->hgmma++;
    else if (starts(op, "LDGSTS")) k->ldgsts++;
    else if (starts(op, "LDG")) {
        if (strstr(op, ".128")) k->ldg128++;
        else k->ldg_other++;
    } else if (starts(op, "LDS") || starts(op, "LDSM")) k->lds_ops++;
    else if (starts(op, "STG")) k->gst++;
    else if (starts(op, "BAR")) k->barrier++;
}

static bool parse_sass(isa_set *s, const char *path, const char *target, const char *stem) {
    line_reader rd;
    if (!reader_open(&rd, path, "")) return false;
    bool ok = true;
    isa_kernel *cur = NULL;
    char *line;
    while (ok && (line = reader_next(&rd))) {
        const long ln = rd.ln;
        const char *p = skip_ws(line);
        if (starts(p, "Function : ")) {
            p += 11;
            cur = isa_get(s, target, stem, p, strcspn(p, " \t\r\n"), false, path, ln);
            if (!cur) ok = false;
            else {
                cur->is_kernel = true;
                cur->counted_from = "sass";
                cur->n_inst = cur->mma = cur->hgmma = cur->ldg128 = cur->ldg_other = cur->lds_ops = 0;
                cur->gst = cur->barrier = cur->ldgsts = 0;
            }
        } else if (cur && starts(p, "/*") && isxdigit((unsigned char)p[2])) {
            const char *e = strstr(p, "*/");
            if (!e) continue;
            p = skip_ws(e + 2);
            if (*p == '@') p += strcspn(p, " \t"); /* predicate */
            p = skip_ws(p);
            if (!isupper((unsigned char)*p)) continue; /* the encoding half-line */
            char op[64];
            size_t len = strcspn(p, " \t;");
            if (copy_str(op, sizeof op, p, len)) sass_count(cur, op);
        } else if (starts(p, ".L_x_") || starts(p, "......")) {
            continue;
        }
    }
    reader_close(&rd);
    return ok;
}

/* Width in bits of a PTX load like ld.global.nc.v4.u32 (vector x element). */
static int ptx_ld_bits(const char *op) {
    int vec = strstr(op, ".v4") ? 4 : strstr(op, ".v2") ? 2 : 1;
    const char *last = strrchr(op, '.');
    if (!last || !isdigit((unsigned char)last[2])) return 0;
    return vec * atoi(last + 2);
}

static bool parse_ptx(isa_set *s, const char *path, const char *target, const char *stem) {
    line_reader rd;
    if (!reader_open(&rd, path, "")) return false;
    bool ok = true;
    isa_kernel *cur = NULL;
    int depth = 0;
    char *line;
    while (ok && (line = reader_next(&rd))) {
        const long ln = rd.ln;
        const char *p = skip_ws(line);
        const char *e = strstr(line, ".entry ");
        if (e && (starts(p, ".visible") || starts(p, ".entry") || starts(p, ".weak"))) {
            e = skip_ws(e + 7);
            cur = isa_get(s, target, stem, e, strcspn(e, "( \t\r\n"), false, path, ln);
            if (!cur) {
                ok = false;
                break;
            }
            cur->is_kernel = true;
            if (cur->counted_from && !strcmp(cur->counted_from, "sass")) cur = NULL; /* SASS is better */
            else cur->counted_from = "ptx";
            depth = 0;
            continue;
        }
        if (!cur) continue;
        for (const char *c = p; *c; c++) {
            if (*c == '{') depth++;
            if (*c == '}' && --depth == 0) {
                cur = NULL;
                break;
            }
        }
        if (!cur || *p == '/' || *p == '.' || *p == '$' || *p == '{' || *p == '}') continue;
        if (*p == '@') p = skip_ws(p + strcspn(p, " \t"));
        char op[64];
        if (!copy_str(op, sizeof op, p, strcspn(p, " \t;"))) continue;
        cur->n_inst++;
        if (starts(op, "mma.sync")) cur->mma++;
        else if (starts(op, "wgmma.mma_async")) cur->hgmma++;
        else if (starts(op, "cp.async.cg") || starts(op, "cp.async.ca")) cur->ldgsts++;
        else if (starts(op, "ld.global")) {
            if (ptx_ld_bits(op) == 128) cur->ldg128++;
            else cur->ldg_other++;
        } else if (starts(op, "ld.shared") || starts(op, "ldmatrix")) cur->lds_ops++;
        else if (starts(op, "st.global")) cur->gst++;
        else if (starts(op, "bar.sync") || starts(op, "barrier.sync")) cur->barrier++;
    }
    reader_close(&rd);
    return ok;
}

/* ---- the folder ---------------------------------------------------------- */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sorted names in dir (regular entries, no dot files); NULL on error. */
static char **list_dir(const char *dir, size_t *n_out) {
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "nstf isa: cannot open folder %s: %s\n", dir, strerror(errno));
        return NULL;
    }
    char **v = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    bool ok = true;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 32;
            char **nv = realloc(v, cap * sizeof *nv);
            if (!nv) {
                ok = false;
                break;
            }
            v = nv;
        }
        if (!(v[n] = strdup(e->d_name))) {
            ok = false;
            break;
        }
        n++;
    }
    closedir(d);
    if (!ok) {
        for (size_t i = 0; i < n; i++) free(v[i]);
        free(v);
        fprintf(stderr, "nstf isa: out of memory\n");
        return NULL;
    }
    if (n) qsort(v, n, sizeof *v, cmp_str);
    *n_out = n;
    if (!v) v = calloc(1, sizeof *v);
    return v;
}

static void free_list(char **v, size_t n) {
    for (size_t i = 0; i < n; i++) free(v[i]);
    free(v);
}

static bool has_suffix(const char *s, const char *suf, size_t *stem_len) {
    size_t n = strlen(s), m = strlen(suf);
    if (n <= m || strcmp(s + n - m, suf) != 0) return false;
    *stem_len = n - m;
    return true;
}

static bool is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Reads every <target>/ folder under dir. */
static bool isa_load(isa_set *s, const char *dir) {
    size_t nt = 0;
    char **targets = list_dir(dir, &nt);
    if (!targets) return false;
    bool ok = true;
    for (size_t t = 0; ok && t < nt; t++) {
        const char *tg = targets[t];
        bool amd = starts(tg, "gfx"), cuda = starts(tg, "sm_");
        char sub[4096];
        if ((!amd && !cuda) || strlen(tg) >= 24) continue;
        if (snprintf(sub, sizeof sub, "%s/%s", dir, tg) >= (int)sizeof sub || !is_dir(sub)) continue;
        size_t nf = 0;
        char **files = list_dir(sub, &nf);
        if (!files) {
            ok = false;
            break;
        }
        /* CUDA: ptxas first (creates the kernels), then SASS, then PTX */
        static const char *cuda_order[] = {".ptxas.txt", ".sass", ".ptx"};
        for (int pass = 0; ok && pass < (amd ? 1 : 3); pass++)
            for (size_t i = 0; ok && i < nf; i++) {
                size_t sl;
                char stem[64], path[4096];
                const char *suf = amd ? ".s" : cuda_order[pass];
                if (!has_suffix(files[i], suf, &sl) || !copy_str(stem, sizeof stem, files[i], sl)) continue;
                if (snprintf(path, sizeof path, "%s/%s", sub, files[i]) >= (int)sizeof path) continue;
                if (amd) ok = parse_amd_asm(s, path, tg, stem);
                else if (pass == 0) ok = parse_ptxas(s, path, tg, stem);
                else if (pass == 1) ok = parse_sass(s, path, tg, stem);
                else ok = parse_ptx(s, path, tg, stem);
            }
        free_list(files, nf);
    }
    free_list(targets, nt);
    if (!ok) return false;
    /* keep kernels only */
    size_t w = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->k[i].is_kernel) s->k[w++] = s->k[i];
    s->n = w;
    for (size_t i = 0; i < s->n; i++) {
        isa_kernel *k = &s->k[i];
        if (k->amd && k->wave == ISA_UNK) k->wave = starts(k->target, "gfx9") ? 64 : 32;
        if (k->amd && k->agpr == ISA_UNK && !starts(k->target, "gfx90a") && !starts(k->target, "gfx94"))
            k->agpr = 0; /* no AGPRs outside CDNA2/3 */
    }
    return true;
}

/* ---- output ---------------------------------------------------------------- */

static void put_num(FILE *o, long v) {
    if (v == ISA_UNK) fputs("?", o);
    else fprintf(o, "%ld", v);
}

static bool want(const isa_kernel *k, char **match, int n_match, char **tgt, int n_tgt) {
    bool m = n_match == 0, t = n_tgt == 0;
    for (int i = 0; i < n_match && !m; i++) m = fnmatch(match[i], k->pretty, 0) == 0;
    for (int i = 0; i < n_tgt && !t; i++) t = !strcmp(tgt[i], k->target);
    return m && t;
}

static int cmp_kernel(const void *a, const void *b) {
    const isa_kernel *x = a, *y = b;
    /* AMD targets first (gfx90a < gfx942 < gfx1100 by number), then CUDA */
    if (x->amd != y->amd) return x->amd ? -1 : 1;
    long nx = strtol(x->target + 3, NULL, 16), ny = strtol(y->target + 3, NULL, 16);
    if (strcmp(x->target, y->target)) return nx < ny ? -1 : nx > ny ? 1 : strcmp(x->target, y->target);
    int c = strcmp(x->file, y->file);
    return c ? c : strcmp(x->pretty, y->pretty);
}

static void print_md(FILE *o, const isa_set *s, char **match, int n_match, char **tgt, int n_tgt) {
    const char *shown = "";
    for (size_t i = 0; i < s->n; i++) {
        const isa_kernel *k = &s->k[i];
        if (!want(k, match, n_match, tgt, n_tgt)) continue;
        if (strcmp(shown, k->target)) {
            shown = k->target;
            if (k->amd)
                fprintf(o,
                        "\n### %s\n\n| kernel | file | wave | VGPR | AGPR | SGPR | LDS | scratch | occ | MFMA | WMMA "
                        "| gld ≤32/64/96/128 | gst | ds rd/wr | barrier | insts |\n"
                        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|---|--:|--:|\n",
                        k->target);
            else
                fprintf(o,
                        "\n### %s\n\n| kernel | file | regs | stack | spill st/ld | smem | HMMA | HGMMA | LDG.128 | "
                        "LDG other | LDGSTS | LDS | STG | BAR | insts | counted from |\n"
                        "|---|---|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n",
                        k->target);
        }
        fprintf(o, "| `%s` | %s | ", k->pretty, k->file);
        if (k->amd) {
            const long *v[] = {&k->wave, &k->vgpr, &k->agpr, &k->sgpr, &k->lds, &k->scratch, &k->occupancy,
                               &k->mfma, &k->wmma};
            for (size_t j = 0; j < sizeof v / sizeof v[0]; j++) {
                put_num(o, *v[j]);
                fputs(" | ", o);
            }
            fprintf(o, "%ld/%ld/%ld/%ld", k->gld[0], k->gld[1], k->gld[2], k->gld[3]);
            if (k->gld[4]) fprintf(o, " (+%ld)", k->gld[4]);
            fprintf(o, " | %ld | %ld/%ld | %ld | %ld |\n", k->gst, k->ds_rd, k->ds_wr, k->barrier, k->n_inst);
        } else {
            put_num(o, k->regs);
            fputs(" | ", o);
            put_num(o, k->stack);
            fputs(" | ", o);
            put_num(o, k->spill_st);
            fputs("/", o);
            put_num(o, k->spill_ld);
            fputs(" | ", o);
            put_num(o, k->smem);
            fprintf(o, " | %ld | %ld | %ld | %ld | %ld | %ld | %ld | %ld | %ld | %s |\n", k->mma, k->hgmma,
                    k->ldg128, k->ldg_other, k->ldgsts, k->lds_ops, k->gst, k->barrier, k->n_inst,
                    k->counted_from ? k->counted_from : "-");
        }
    }
}

static void json_str(FILE *o, const char *s) {
    fputc('"', o);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(o, "\\%c", c);
        else if (c < 0x20) fprintf(o, "\\u%04x", c);
        else fputc(c, o);
    }
    fputc('"', o);
}

static void json_num(FILE *o, const char *key, long v) {
    fprintf(o, ", \"%s\": ", key);
    if (v == ISA_UNK) fputs("null", o);
    else fprintf(o, "%ld", v);
}

static void print_json(FILE *o, const isa_set *s, char **match, int n_match, char **tgt, int n_tgt) {
    fputs("[", o);
    bool first = true;
    for (size_t i = 0; i < s->n; i++) {
        const isa_kernel *k = &s->k[i];
        if (!want(k, match, n_match, tgt, n_tgt)) continue;
        fputs(first ? "\n  {" : ",\n  {", o);
        first = false;
        fputs("\"target\": ", o);
        json_str(o, k->target);
        fputs(", \"file\": ", o);
        json_str(o, k->file);
        fputs(", \"kernel\": ", o);
        json_str(o, k->pretty);
        fputs(", \"symbol\": ", o);
        json_str(o, k->name);
        if (k->amd) {
            json_num(o, "wave", k->wave);
            json_num(o, "vgpr", k->vgpr);
            json_num(o, "agpr", k->agpr);
            json_num(o, "sgpr", k->sgpr);
            json_num(o, "lds_bytes", k->lds);
            json_num(o, "scratch_bytes", k->scratch);
            json_num(o, "vgpr_spill", k->vgpr_spill);
            json_num(o, "sgpr_spill", k->sgpr_spill);
            json_num(o, "occupancy", k->occupancy);
            json_num(o, "max_workgroup", k->max_wg);
            json_num(o, "code_bytes", k->code_bytes);
            json_num(o, "mfma", k->mfma);
            json_num(o, "wmma", k->wmma);
            json_num(o, "global_load_b32", k->gld[0]);
            json_num(o, "global_load_b64", k->gld[1]);
            json_num(o, "global_load_b96", k->gld[2]);
            json_num(o, "global_load_b128", k->gld[3]);
            json_num(o, "global_load_other", k->gld[4]);
            json_num(o, "global_store", k->gst);
            json_num(o, "ds_read", k->ds_rd);
            json_num(o, "ds_write", k->ds_wr);
            json_num(o, "scratch_ops", k->scratch_ops);
        } else {
            json_num(o, "regs", k->regs);
            json_num(o, "stack_bytes", k->stack);
            json_num(o, "spill_store_bytes", k->spill_st);
            json_num(o, "spill_load_bytes", k->spill_ld);
            json_num(o, "smem_bytes", k->smem);
            json_num(o, "mma", k->mma);
            json_num(o, "hgmma", k->hgmma);
            json_num(o, "ldg_128", k->ldg128);
            json_num(o, "ldg_other", k->ldg_other);
            json_num(o, "ldgsts", k->ldgsts);
            json_num(o, "shared_loads", k->lds_ops);
            json_num(o, "global_store", k->gst);
        }
        json_num(o, "barrier", k->barrier);
        json_num(o, "instructions", k->n_inst);
        fputs(", \"counted_from\": ", o);
        if (k->counted_from) json_str(o, k->counted_from);
        else fputs("null", o);
        fputs("}", o);
    }
    fputs(first ? "]\n" : "\n]\n", o);
}

/* ---- gates ------------------------------------------------------------------ *
 * A TSV: kernel-glob, targets (comma list or *), matrix (yes|-), max scratch
 * bytes (or -), min occupancy in waves per SIMD (or -), dynamic LDS bytes at
 * launch (or -), block threads at launch (or -), reason. For each (kernel,
 * target) the last matching row applies, so an exception follows its rule. */
typedef struct gate {
    char kernel[256];
    char targets[128];
    bool matrix;
    long max_scratch, min_occ, dyn_lds, block;
    long line;
    long hits;
} gate;

static bool gate_field(const char *f, long *v, const char *path, long ln, const char *what) {
    if (!strcmp(f, "-")) {
        *v = ISA_UNK;
        return true;
    }
    if (parse_num(f, v)) return true;
    fprintf(stderr, "nstf isa: %s:%ld: %s '%s' is not a number or '-'\n", path, ln, what, f);
    return false;
}

static bool load_gates(const char *path, gate **out, size_t *n_out) {
    line_reader rd;
    if (!reader_open(&rd, path, "gates ")) return false;
    gate *g = NULL;
    size_t n = 0, cap = 0;
    bool ok = true;
    char *line;
    while (ok && (line = reader_next(&rd))) {
        const long ln = rd.ln;
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0] || line[0] == '#') continue;
        char *fld[8];
        int nf = 0;
        char *p = line;
        while (nf < 8) {
            fld[nf++] = p;
            char *tab = strchr(p, '\t');
            if (!tab) break;
            *tab = 0;
            p = tab + 1;
        }
        if (nf < 7) {
            fprintf(stderr, "nstf isa: %s:%ld: want 7 or 8 tab-separated fields, got %d\n", path, ln, nf);
            ok = false;
            break;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 32;
            gate *ng = realloc(g, cap * sizeof *ng);
            if (!ng) {
                fprintf(stderr, "nstf isa: out of memory\n");
                ok = false;
                break;
            }
            g = ng;
        }
        gate *r = &g[n];
        memset(r, 0, sizeof *r);
        r->line = ln;
        if (!copy_str(r->kernel, sizeof r->kernel, fld[0], strlen(fld[0])) ||
            !copy_str(r->targets, sizeof r->targets, fld[1], strlen(fld[1]))) {
            fprintf(stderr, "nstf isa: %s:%ld: kernel or target field too long\n", path, ln);
            ok = false;
            break;
        }
        if (!strcmp(fld[2], "yes")) r->matrix = true;
        else if (strcmp(fld[2], "-")) {
            fprintf(stderr, "nstf isa: %s:%ld: matrix field '%s' (want yes or -)\n", path, ln, fld[2]);
            ok = false;
            break;
        }
        ok = gate_field(fld[3], &r->max_scratch, path, ln, "max_scratch") &&
             gate_field(fld[4], &r->min_occ, path, ln, "min_occ") &&
             gate_field(fld[5], &r->dyn_lds, path, ln, "dyn_lds") && gate_field(fld[6], &r->block, path, ln, "block");
        if (ok) n++;
    }
    reader_close(&rd);
    if (!ok) {
        free(g);
        return false;
    }
    *out = g;
    *n_out = n;
    return true;
}

static bool target_in(const char *list, const char *t) {
    if (!strcmp(list, "*")) return true;
    size_t tl = strlen(t);
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, ",");
        if (len == tl && !strncmp(p, t, len)) return true;
        p += len;
        if (*p == ',') p++;
    }
    return false;
}

/* Waves per SIMD once the LDS of a whole launch is counted: gfx9 CUs have
 * 64 KiB for 4 SIMDs; gfx11 WGPs (the default mode) 128 KiB for 4 SIMD32s.
 * A workgroup may use at most 64 KiB on all three. -2: does not fit. */
static long lds_occupancy(const isa_kernel *k, long lds, long block) {
    long pool = starts(k->target, "gfx9") ? 65536 : 131072;
    if (lds > 65536) return -2;
    if (lds <= 0 || block <= 0 || k->wave <= 0) return ISA_UNK;
    long waves = (block + k->wave - 1) / k->wave;
    long occ = (pool / lds) * waves / 4;
    return occ < 1 ? 1 : occ;
}

static int run_gates(const isa_set *s, const char *path, bool verbose) {
    gate *g = NULL;
    size_t ng = 0;
    if (!load_gates(path, &g, &ng)) return 2;
    long n_checks = 0, n_fail = 0, n_kernels = 0;
    for (size_t i = 0; i < s->n; i++) {
        const isa_kernel *k = &s->k[i];
        gate *r = NULL;
        for (size_t j = 0; j < ng; j++)
            if (target_in(g[j].targets, k->target) && fnmatch(g[j].kernel, k->pretty, 0) == 0) r = &g[j];
        if (!r) continue;
        r->hits++;
        n_kernels++;
        const char *t = k->target;
        if (r->matrix) {
            n_checks++;
            long have = k->amd ? (starts(t, "gfx9") ? k->mfma : k->wmma) : k->mma + k->hgmma;
            const char *what = k->amd ? (starts(t, "gfx9") ? "v_mfma" : "v_wmma") : "HMMA/HGMMA";
            if (have <= 0) {
                printf("FAIL %s on %s: %ld %s instructions (a matrix kernel must use them) [%s:%ld]\n", k->pretty,
                       t, have, what, path, r->line);
                n_fail++;
            }
        }
        if (r->max_scratch != ISA_UNK) {
            n_checks++;
            long sc = k->amd ? k->scratch : (k->stack == ISA_UNK ? ISA_UNK : k->stack);
            long spill = k->amd ? (k->vgpr_spill > 0 ? k->vgpr_spill : 0) + (k->sgpr_spill > 0 ? k->sgpr_spill : 0)
                                : (k->spill_st > 0 ? k->spill_st : 0);
            if (sc == ISA_UNK) {
                printf("FAIL %s on %s: scratch size unknown (no resource info in the build output) [%s:%ld]\n",
                       k->pretty, t, path, r->line);
                n_fail++;
            } else if (sc > r->max_scratch) {
                printf("FAIL %s on %s: scratch %ld bytes > %ld allowed (%ld spilled %s) [%s:%ld]\n", k->pretty, t,
                       sc, r->max_scratch, spill, k->amd ? "registers" : "bytes", path, r->line);
                n_fail++;
            }
        }
        if (k->amd && (r->min_occ != ISA_UNK || r->dyn_lds != ISA_UNK)) {
            long occ = k->occupancy;
            long lds = (k->lds > 0 ? k->lds : 0) + (r->dyn_lds > 0 ? r->dyn_lds : 0);
            long block = r->block != ISA_UNK ? r->block : k->max_wg;
            long lo = lds_occupancy(k, lds, block);
            n_checks++;
            if (lo == -2) {
                printf("FAIL %s on %s: %ld bytes of LDS per workgroup > 64 KiB: cannot launch [%s:%ld]\n",
                       k->pretty, t, lds, path, r->line);
                n_fail++;
                continue;
            }
            if (lo != ISA_UNK && (occ == ISA_UNK || lo < occ)) occ = lo;
            if (verbose)
                printf("     %s on %s: occupancy %ld waves/SIMD (floor %ld; LDS %ld B at launch), scratch %ld\n",
                       k->pretty, t, occ, r->min_occ, lds, k->scratch);
            if (r->min_occ != ISA_UNK) {
                if (occ == ISA_UNK) {
                    printf("FAIL %s on %s: occupancy unknown [%s:%ld]\n", k->pretty, t, path, r->line);
                    n_fail++;
                } else if (occ < r->min_occ) {
                    printf("FAIL %s on %s: occupancy %ld waves/SIMD < floor %ld (VGPR %ld, AGPR %ld, LDS %ld B) "
                           "[%s:%ld]\n",
                           k->pretty, t, occ, r->min_occ, k->vgpr, k->agpr, lds, path, r->line);
                    n_fail++;
                }
            }
        }
    }
    /* a row that gates nothing is stale, or the build output is missing */
    for (size_t j = 0; j < ng; j++) {
        const char *p = g[j].targets;
        if (!g[j].hits) {
            printf("FAIL gate row %s:%ld (%s on %s) matches no kernel in the build output\n", path, g[j].line,
                   g[j].kernel, g[j].targets);
            n_fail++;
            continue;
        }
        if (!strcmp(p, "*")) continue;
        while (*p) { /* every named target must have been seen */
            size_t len = strcspn(p, ",");
            bool seen = false;
            for (size_t i = 0; i < s->n && !seen; i++)
                seen = strlen(s->k[i].target) == len && !strncmp(s->k[i].target, p, len) &&
                       fnmatch(g[j].kernel, s->k[i].pretty, 0) == 0;
            if (!seen) {
                printf("FAIL gate row %s:%ld: no %s kernel for target %.*s in the build output\n", path, g[j].line,
                       g[j].kernel, (int)len, p);
                n_fail++;
            }
            p += len;
            if (*p == ',') p++;
        }
    }
    free(g);
    printf("nstf isa: %ld gate checks on %ld kernel builds: %ld failed\n", n_checks, n_kernels, n_fail);
    return n_fail ? 1 : 0;
}

/* ---- the command ------------------------------------------------------------ */

static void isa_usage(FILE *f) {
    fprintf(f, "usage: nstf isa [--dir DIR] [--json] [--match GLOB]... [--target T]... [--check GATES.tsv]\n"
               "  Machine-code report of the GPU kernels built by `make amd` (default DIR: build-amd):\n"
               "  registers, LDS, scratch, occupancy and instruction mix per kernel and target.\n"
               "  --json          JSON instead of markdown\n"
               "  --match GLOB    only kernels whose name matches (e.g. 'gemm*', 'gemv_kernel<0,1,*>')\n"
               "  --target T      only this target (gfx90a, gfx942, gfx1100, sm_90a)\n"
               "  --check FILE    check the gates in FILE (docs/amd_gates.tsv); exit 1 on any failure\n"
               "  -v              with --check: also print each gated kernel's occupancy and scratch\n");
}

int cmd_isa(int argc, char **argv) {
    const char *dir = "build-amd", *gates = NULL;
    bool json = false, verbose = false;
    char *match[32], *tgt[16];
    int n_match = 0, n_tgt = 0;
    cli_expand_args(&argc, &argv, isa_usage);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            isa_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            verbose = true;
        } else if (!strcmp(a, "--dir") || !strcmp(a, "--check") || !strcmp(a, "--match") || !strcmp(a, "--target")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "nstf isa: %s needs a value\n", a);
                return 2;
            }
            const char *v = argv[++i];
            if (!strcmp(a, "--dir")) dir = v;
            else if (!strcmp(a, "--check")) gates = v;
            else if (!strcmp(a, "--match")) {
                if (n_match == 32) {
                    fprintf(stderr, "nstf isa: at most 32 --match\n");
                    return 2;
                }
                match[n_match++] = argv[i];
            } else {
                if (n_tgt == 16) {
                    fprintf(stderr, "nstf isa: at most 16 --target\n");
                    return 2;
                }
                tgt[n_tgt++] = argv[i];
            }
        } else {
            return cli_unknown_option(a, isa_usage);
        }
    }
    isa_set s = {0};
    if (!isa_load(&s, dir)) {
        free(s.k);
        return 1;
    }
    if (s.n == 0) {
        fprintf(stderr,
                "nstf isa: no kernels under %s (want <target>/<file>.s for AMD or sm_*/<file>.ptxas.txt for CUDA; "
                "run `make amd` first)\n",
                dir);
        free(s.k);
        return 1;
    }
    qsort(s.k, s.n, sizeof *s.k, cmp_kernel);
    int rc = 0;
    if (gates) rc = run_gates(&s, gates, verbose);
    else if (json) print_json(stdout, &s, match, n_match, tgt, n_tgt);
    else print_md(stdout, &s, match, n_match, tgt, n_tgt);
    free(s.k);
    return rc;
}
