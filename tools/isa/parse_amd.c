/* parse_amd.c — `nstf isa`'s reader of AMD device assembly (<target>/<stem>.s,
 * from hipcc -save-temps or clang++ -S): the instructions of each kernel
 * body (matrix, memory by width, LDS, barriers, scratch), the "; Kernel
 * info" comments after it, the .amdhsa_kernel descriptor and the
 * amdgpu_metadata YAML (registers, spills, wave size, workgroup, segments). */
#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "isa.h"

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
        if (isa_starts(suffix, t[i].s)) return t[i].bits;
    if (isa_starts(suffix, "lds_")) return amd_mem_bits(suffix + 4);
    return 0;
}

static void amd_count_load(isa_kernel *k, const char *suffix) {
    int b = amd_mem_bits(suffix);
    k->gld[b == 0 ? 4 : b <= 32 ? 0 : b == 64 ? 1 : b == 96 ? 2 : 3]++;
}

/* One instruction line of a kernel body. */
static void amd_count(isa_kernel *k, const char *mn, const char *operands) {
    k->n_inst++;
    if (isa_starts(mn, "v_mfma")) k->mfma++;
    else if (isa_starts(mn, "v_wmma")) k->wmma++;
    else if (isa_starts(mn, "global_load_")) amd_count_load(k, mn + 12);
    else if (isa_starts(mn, "flat_load_")) amd_count_load(k, mn + 10);
    else if (isa_starts(mn, "global_store") || isa_starts(mn, "flat_store")) k->gst++;
    else if (isa_starts(mn, "buffer_")) {
        /* HIP kernels address the private (scratch) segment through the buffer
         * resource in s[0:3]; global memory goes through global_* / flat_*. */
        if (strstr(operands, "s[0:3]")) k->scratch_ops++;
        else if (isa_starts(mn, "buffer_load_")) amd_count_load(k, mn + 12);
        else if (isa_starts(mn, "buffer_store")) k->gst++;
    } else if (isa_starts(mn, "scratch_")) k->scratch_ops++;
    else if (isa_starts(mn, "ds_read") || isa_starts(mn, "ds_load")) k->ds_rd++;
    else if (isa_starts(mn, "ds_write") || isa_starts(mn, "ds_store")) k->ds_wr++;
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
    const char *s = isa_skip_ws(line + 1);
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        size_t n = strlen(keys[i].key);
        if (strncmp(s, keys[i].key, n) != 0) continue;
        const char *v = isa_skip_ws(s + n);
        if (*v != ':' && *v != '=') continue;
        long x;
        char buf[64];
        const char *e = isa_skip_ws(v + 1);
        size_t len = strcspn(e, " \t\r\n");
        if (isa_copy_str(buf, sizeof buf, e, len) && isa_parse_num(buf, &x)) *(long *)((char *)k + keys[i].off) = x;
    }
}

/* Target name out of `.amdgcn_target "amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-"`. */
static bool amd_target_of(const char *line, char *out, size_t cap) {
    const char *g = strstr(line, "--gfx");
    if (!g) return false;
    g += 2;
    size_t len = strspn(g, "abcdefghijklmnopqrstuvwxyz0123456789");
    return len > 3 && isa_copy_str(out, cap, g, len);
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
        if (!isa_copy_str(y->symbol, sizeof y->symbol, val, len)) {
            fprintf(stderr, "nstf isa: %s:%ld: symbol too long\n", where, line);
            return false;
        }
        return true;
    }
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!strcmp(key, keys[i].key)) {
            long x;
            if (!isa_parse_num(val, &x)) {
                fprintf(stderr, "nstf isa: %s:%ld: %s: not a number\n", where, line, key);
                return false;
            }
            *(long *)((char *)y + keys[i].off) = x;
        }
    return true;
}

bool isa_parse_amd_asm(isa_set *s, const char *path, const char *dir_target, const char *stem) {
    isa_reader rd;
    if (!isa_reader_open(&rd, path, "")) return false;
    char target[24];
    snprintf(target, sizeof target, "%s", dir_target);
    bool ok = true, in_yaml = false;
    isa_kernel *cur = NULL, *last = NULL; /* function being read; the one before its Kernel info */
    yaml_item y;
    yaml_item_reset(&y);
    char *line;
    while (ok && (line = isa_reader_next(&rd))) {
        const long ln = rd.ln;
        if (in_yaml) {
            if (isa_starts(isa_skip_ws(line), ".end_amdgpu_metadata")) {
                yaml_item_apply(s, target, &y);
                in_yaml = false;
                continue;
            }
            /* kernel list items open with "  - ." (indent 2); their keys sit at
             * indent 4; deeper lines belong to .args */
            const char *kv = NULL;
            if (isa_starts(line, "  - .")) {
                yaml_item_apply(s, target, &y);
                yaml_item_reset(&y);
                kv = line + 4;
            } else if (isa_starts(line, "    .")) {
                kv = line + 4;
            } else if (line[0] != ' ') {
                yaml_item_apply(s, target, &y);
                yaml_item_reset(&y);
            }
            if (kv) {
                const char *colon = strchr(kv, ':');
                char key[64];
                if (colon && isa_copy_str(key, sizeof key, kv, (size_t)(colon - kv)))
                    ok = yaml_key(&y, key, isa_skip_ws(colon + 1), path, ln);
            }
            continue;
        }
        if (line[0] == '\t' || line[0] == ' ') {
            const char *p = isa_skip_ws(line);
            if (isa_starts(p, ".amdgcn_target")) {
                char t[24];
                if (amd_target_of(p, t, sizeof t)) snprintf(target, sizeof target, "%s", t);
            } else if (isa_starts(p, ".amdgpu_metadata")) {
                in_yaml = true;
                yaml_item_reset(&y);
            } else if (isa_starts(p, ".amdhsa_kernel")) {
                p = isa_skip_ws(p + 14);
                size_t len = strcspn(p, " \t\r\n");
                isa_kernel *k = isa_get(s, target, stem, p, len, true, path, ln);
                if (!k) ok = false;
                else k->is_kernel = true;
            } else if (cur && islower((unsigned char)*p)) {
                char mn[64];
                size_t len = strcspn(p, " \t\r\n;");
                if (isa_copy_str(mn, sizeof mn, p, len)) amd_count(cur, mn, p + len);
            }
            continue;
        }
        if (line[0] == ';') {
            if (last && !cur) amd_kernel_info(last, line);
            continue;
        }
        if (isa_starts(line, ".Lfunc_end")) {
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
    isa_reader_close(&rd);
    return ok;
}
