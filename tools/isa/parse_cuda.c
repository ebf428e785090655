/* parse_cuda.c — `nstf isa`'s readers of the CUDA build output (sm_NN/):
 * the `nvcc -Xptxas -v` log (registers, stack, spills, shared memory per
 * entry), `cuobjdump --dump-sass` (instruction counts), and the PTX, counted
 * instead when no SASS was made. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "isa.h"

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
    if (!isa_copy_str(buf, sizeof buf, p, (size_t)(e - p)) || !isa_parse_num(buf, &v)) return ISA_UNK;
    return v;
}

bool isa_parse_ptxas(isa_set *s, const char *path, const char *target, const char *stem) {
    isa_reader rd;
    if (!isa_reader_open(&rd, path, "")) return false;
    bool ok = true;
    isa_kernel *cur = NULL, *props = NULL;
    char *line;
    while (ok && (line = isa_reader_next(&rd))) {
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
            props = isa_copy_str(buf, sizeof buf, nm, len) ? isa_find(s, target, buf) : NULL;
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
    isa_reader_close(&rd);
    return ok;
}

static void sass_count(isa_kernel *k, const char *op) {
    k->n_inst++;
    if (isa_starts(op, "HMMA")) k->mma++;
    else if (isa_starts(op, "HGMMA")) k->hgmma++;
    else if (isa_starts(op, "LDGSTS")) k->ldgsts++;
    else if (isa_starts(op, "LDG")) {
        if (strstr(op, ".128")) k->ldg128++;
        else k->ldg_other++;
    } else if (isa_starts(op, "LDS") || isa_starts(op, "LDSM")) k->lds_ops++;
    else if (isa_starts(op, "STG")) k->gst++;
    else if (isa_starts(op, "BAR")) k->barrier++;
}

bool isa_parse_sass(isa_set *s, const char *path, const char *target, const char *stem) {
    isa_reader rd;
    if (!isa_reader_open(&rd, path, "")) return false;
    bool ok = true;
    isa_kernel *cur = NULL;
    char *line;
    while (ok && (line = isa_reader_next(&rd))) {
        const long ln = rd.ln;
        const char *p = isa_skip_ws(line);
        if (isa_starts(p, "Function : ")) {
            p += 11;
            cur = isa_get(s, target, stem, p, strcspn(p, " \t\r\n"), false, path, ln);
            if (!cur) ok = false;
            else {
                cur->is_kernel = true;
                cur->counted_from = "sass";
                cur->n_inst = cur->mma = cur->hgmma = cur->ldg128 = cur->ldg_other = cur->lds_ops = 0;
                cur->gst = cur->barrier = cur->ldgsts = 0;
            }
        } else if (cur && isa_starts(p, "/*") && isxdigit((unsigned char)p[2])) {
            const char *e = strstr(p, "*/");
            if (!e) continue;
            p = isa_skip_ws(e + 2);
            if (*p == '@') p += strcspn(p, " \t"); /* predicate */
            p = isa_skip_ws(p);
            if (!isupper((unsigned char)*p)) continue; /* the encoding half-line */
            char op[64];
            size_t len = strcspn(p, " \t;");
            if (isa_copy_str(op, sizeof op, p, len)) sass_count(cur, op);
        } else if (isa_starts(p, ".L_x_") || isa_starts(p, "......")) {
            continue;
        }
    }
    isa_reader_close(&rd);
    return ok;
}

/* Width in bits of a PTX load like ld.global.nc.v4.u32 (vector x element). */
static int ptx_ld_bits(const char *op) {
    int vec = strstr(op, ".v4") ? 4 : strstr(op, ".v2") ? 2 : 1;
    const char *last = strrchr(op, '.');
    if (!last || !isdigit((unsigned char)last[2])) return 0;
    return vec * atoi(last + 2);
}

bool isa_parse_ptx(isa_set *s, const char *path, const char *target, const char *stem) {
    isa_reader rd;
    if (!isa_reader_open(&rd, path, "")) return false;
    bool ok = true;
    isa_kernel *cur = NULL;
    int depth = 0;
    char *line;
    while (ok && (line = isa_reader_next(&rd))) {
        const long ln = rd.ln;
        const char *p = isa_skip_ws(line);
        const char *e = strstr(line, ".entry ");
        if (e && (isa_starts(p, ".visible") || isa_starts(p, ".entry") || isa_starts(p, ".weak"))) {
            e = isa_skip_ws(e + 7);
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
        if (*p == '@') p = isa_skip_ws(p + strcspn(p, " \t"));
        char op[64];
        if (!isa_copy_str(op, sizeof op, p, strcspn(p, " \t;"))) continue;
        cur->n_inst++;
        if (isa_starts(op, "mma.sync")) cur->mma++;
        else if (isa_starts(op, "wgmma.mma_async")) cur->hgmma++;
        else if (isa_starts(op, "cp.async.cg") || isa_starts(op, "cp.async.ca")) cur->ldgsts++;
        else if (isa_starts(op, "ld.global")) {
            if (ptx_ld_bits(op) == 128) cur->ldg128++;
            else cur->ldg_other++;
        } else if (isa_starts(op, "ld.shared") || isa_starts(op, "ldmatrix")) cur->lds_ops++;
        else if (isa_starts(op, "st.global")) cur->gst++;
        else if (isa_starts(op, "bar.sync") || isa_starts(op, "barrier.sync")) cur->barrier++;
    }
    isa_reader_close(&rd);
    return ok;
}
