/* report.c — `nstf isa`'s tables: one markdown table per target, or one
 * JSON array of every kernel record (unknown figures "?" / null), filtered
 * by --match globs and --target names, in isa_cmp_kernel's order. */
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "isa.h"

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

int isa_cmp_kernel(const void *a, const void *b) {
    const isa_kernel *x = a, *y = b;
    /* AMD targets first (gfx90a < gfx942 < gfx1100 by number), then CUDA */
    if (x->amd != y->amd) return x->amd ? -1 : 1;
    long nx = strtol(x->target + 3, NULL, 16), ny = strtol(y->target + 3, NULL, 16);
    if (strcmp(x->target, y->target)) return nx < ny ? -1 : nx > ny ? 1 : strcmp(x->target, y->target);
    int c = strcmp(x->file, y->file);
    return c ? c : strcmp(x->pretty, y->pretty);
}

void isa_print_md(FILE *o, const isa_set *s, char **match, int n_match, char **tgt, int n_tgt) {
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

void isa_print_json(FILE *o, const isa_set *s, char **match, int n_match, char **tgt, int n_tgt) {
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
