/* gates.c — `nstf isa --check GATES.tsv`: the machine-code gates of the
 * GPU kernels (matrix instructions present, scratch bytes, occupancy floor
 * with the launch's LDS counted), each failure named with its kernel,
 * target, figure and gate row; a row that gates nothing fails too. */
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "isa.h"

/* The gate file is a TSV: kernel-glob, targets (comma list or *), matrix (yes|-), max scratch
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
    if (isa_parse_num(f, v)) return true;
    fprintf(stderr, "nstf isa: %s:%ld: %s '%s' is not a number or '-'\n", path, ln, what, f);
    return false;
}

static bool load_gates(const char *path, gate **out, size_t *n_out) {
    isa_reader rd;
    if (!isa_reader_open(&rd, path, "gates ")) return false;
    gate *g = NULL;
    size_t n = 0, cap = 0;
    bool ok = true;
    char *line;
    while (ok && (line = isa_reader_next(&rd))) {
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
        if (!isa_copy_str(r->kernel, sizeof r->kernel, fld[0], strlen(fld[0])) ||
            !isa_copy_str(r->targets, sizeof r->targets, fld[1], strlen(fld[1]))) {
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
    isa_reader_close(&rd);
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
    long pool = isa_starts(k->target, "gfx9") ? 65536 : 131072;
    if (lds > 65536) return -2;
    if (lds <= 0 || block <= 0 || k->wave <= 0) return ISA_UNK;
    long waves = (block + k->wave - 1) / k->wave;
    long occ = (pool / lds) * waves / 4;
    return occ < 1 ? 1 : occ;
}

int isa_run_gates(const isa_set *s, const char *path, bool verbose) {
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
            long have = k->amd ? (isa_starts(t, "gfx9") ? k->mfma : k->wmma) : k->mma + k->hgmma;
            const char *what = k->amd ? (isa_starts(t, "gfx9") ? "v_mfma" : "v_wmma") : "HMMA/HGMMA";
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
