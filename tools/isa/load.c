/* load.c — `nstf isa`'s walk over a build folder: every <target>/ folder
 * (gfx* for AMD, sm_* for CUDA), its files in sorted order through the
 * parser of their suffix, then the records of kernels kept and completed. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "isa.h"

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

bool isa_load(isa_set *s, const char *dir) {
    size_t nt = 0;
    char **targets = list_dir(dir, &nt);
    if (!targets) return false;
    bool ok = true;
    for (size_t t = 0; ok && t < nt; t++) {
        const char *tg = targets[t];
        bool amd = isa_starts(tg, "gfx"), cuda = isa_starts(tg, "sm_");
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
                if (!has_suffix(files[i], suf, &sl) || !isa_copy_str(stem, sizeof stem, files[i], sl)) continue;
                if (snprintf(path, sizeof path, "%s/%s", sub, files[i]) >= (int)sizeof path) continue;
                if (amd) ok = isa_parse_amd_asm(s, path, tg, stem);
                else if (pass == 0) ok = isa_parse_ptxas(s, path, tg, stem);
                else if (pass == 1) ok = isa_parse_sass(s, path, tg, stem);
                else ok = isa_parse_ptx(s, path, tg, stem);
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
        if (k->amd && k->wave == ISA_UNK) k->wave = isa_starts(k->target, "gfx9") ? 64 : 32;
        if (k->amd && k->agpr == ISA_UNK && !isa_starts(k->target, "gfx90a") && !isa_starts(k->target, "gfx94"))
            k->agpr = 0; /* no AGPRs outside CDNA2/3 */
    }
    return true;
}
