/* hostile_corpus.h — the harness of the checked-in hostile-file corpora
 * (tests/data/hostile/ for GGUF, tests/data/hostile/safetensors/): a byte
 * builder, a table of cases (how to build the bytes, the status and the
 * distinctive part of the message each must be refused with), the checks
 * from memory (an exactly-sized heap copy, so ASan sees any read past the
 * end) and from the checked-in files (which must equal what the test
 * builds, and be the only ones), and the writer that regenerates a corpus
 * with its README. Shared by test_gguf.c and test_safetensors.c. */
#ifndef NSTF_TEST_HOSTILE_CORPUS_H
#define NSTF_TEST_HOSTILE_CORPUS_H

#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nstf.h"
#include "test_util.h"

/* ---- byte builder ------------------------------------------------------------ */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} bb;

static inline void bb_put(bb *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) { fprintf(stderr, "test: out of memory\n"); exit(2); }
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}
static inline void bb_u8(bb *b, uint8_t v) { bb_put(b, &v, 1); }
static inline void bb_u32(bb *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    bb_put(b, x, 4);
}
static inline void bb_u64(bb *b, uint64_t v) { bb_u32(b, (uint32_t)v); bb_u32(b, (uint32_t)(v >> 32)); }

/* ---- the corpus ---------------------------------------------------------------- */

typedef struct {
    const char *name; /* file name without the extension */
    void (*make)(bb *);
    nstf_status status;
    const char *msg;  /* distinctive part of the message */
} hostile_case;

typedef struct {
    const hostile_case *cases;
    size_t n;
    const char *ext;    /* ".gguf" */
    const char *dir;    /* the checked-in corpus */
    const char *title;  /* README heading */
    const char *intro;  /* README text before the regeneration command */
    const char *regen;  /* the regeneration command */
    const char *test;   /* "test_gguf.c", for messages */
    const char *verbose_env; /* print every message when set */
    nstf_status (*open_memory)(const void *data, uint64_t size, const char *name, void **out);
    nstf_status (*open_path)(const char *path, void **out);
    void (*close)(void *);
} hostile_corpus;

static inline const char *hostile_status_name(nstf_status s) {
    switch (s) {
    case NSTF_OK: return "NSTF_OK";
    case NSTF_ERR_FORMAT: return "NSTF_ERR_FORMAT";
    case NSTF_ERR_UNSUPPORTED: return "NSTF_ERR_UNSUPPORTED";
    case NSTF_ERR_IO: return "NSTF_ERR_IO";
    default: return nstf_status_str(s);
    }
}

static inline int hostile_write_file(const char *path, const void *d, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = n ? fwrite(d, 1, n, f) : 0;
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

/* The status, the message's part, and that the message names the file. */
static inline void hostile_expect_fail(const hostile_corpus *c, nstf_status st, void *out, const hostile_case *k,
                                       const char *name) {
    const char *msg = nstf_last_error();
    if (getenv(c->verbose_env)) printf("  %-28s %s\n", k->name, msg);
    CHECK(st == k->status, "%s: status %s, expected %s (%s)", name, hostile_status_name(st),
          hostile_status_name(k->status), msg);
    CHECK(out == NULL, "%s: out pointer not NULL on failure", name);
    CHECK(strstr(msg, k->msg) != NULL, "%s: message \"%s\" lacks \"%s\"", name, msg, k->msg);
    CHECK(strstr(msg, name) != NULL, "%s: message \"%s\" does not name the file", name, msg);
    if (out) c->close(out);
}

static inline void hostile_check_memory(const hostile_corpus *c) {
    for (size_t i = 0; i < c->n; i++) {
        bb b = {0};
        c->cases[i].make(&b);
        uint8_t *p = malloc(b.n ? b.n : 1); /* exact size so ASan sees overreads */
        if (b.n) memcpy(p, b.p, b.n);
        char name[96];
        snprintf(name, sizeof name, "%s%s", c->cases[i].name, c->ext);
        void *out = NULL;
        nstf_status st = c->open_memory(p, b.n, name, &out);
        hostile_expect_fail(c, st, out, &c->cases[i], name);
        free(p);
        free(b.p);
    }
    printf("hostile (memory): %zu cases\n", c->n);
}

static inline int hostile_write(const hostile_corpus *c, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/README.md", dir);
    FILE *md = fopen(path, "w");
    if (!md) { fprintf(stderr, "%s: %s\n", path, strerror(errno)); return 1; }
    fprintf(md, "# %s\n\n%s\n\n    %s\n\n| file | expected status | message contains |\n|---|---|---|\n", c->title,
            c->intro, c->regen);
    for (size_t i = 0; i < c->n; i++) {
        bb b = {0};
        c->cases[i].make(&b);
        snprintf(path, sizeof path, "%s/%s%s", dir, c->cases[i].name, c->ext);
        if (hostile_write_file(path, b.p, b.n) != 0) { fprintf(stderr, "%s: %s\n", path, strerror(errno)); return 1; }
        fprintf(md, "| %s%s | %s | `", c->cases[i].name, c->ext, hostile_status_name(c->cases[i].status));
        for (const char *s = c->cases[i].msg; *s; s++) {
            if (*s == '|') fputc('\\', md);
            fputc(*s, md);
        }
        fputs("` |\n", md);
        free(b.p);
    }
    fclose(md);
    printf("wrote %zu hostile files and README.md to %s\n", c->n, dir);
    return 0;
}

static inline void hostile_check_disk(const hostile_corpus *c) {
    char path[4096];
    for (size_t i = 0; i < c->n; i++) {
        snprintf(path, sizeof path, "%s/%s%s", c->dir, c->cases[i].name, c->ext);
        bb b = {0};
        c->cases[i].make(&b);
        FILE *f = fopen(path, "rb");
        CHECK(f != NULL, "%s missing: regenerate with %s", path, c->regen);
        if (f) {
            uint8_t *d = malloc(b.n + 1);
            size_t n = fread(d, 1, b.n + 1, f);
            fclose(f);
            CHECK(n == b.n && (b.n == 0 || memcmp(d, b.p, b.n) == 0), "%s differs from the generator: regenerate with %s",
                  path, c->regen);
            free(d);
        }
        void *out = NULL;
        nstf_status st = c->open_path(path, &out);
        hostile_expect_fail(c, st, out, &c->cases[i], path);
        free(b.p);
    }
    /* every checked-in file is a known case (no stale files) */
    DIR *dp = opendir(c->dir);
    CHECK(dp != NULL, "%s: %s", c->dir, strerror(errno));
    int n_files = 0;
    const size_t le = strlen(c->ext);
    for (struct dirent *e; dp && (e = readdir(dp));) {
        size_t len = strlen(e->d_name);
        if (len < le || strcmp(e->d_name + len - le, c->ext) != 0) continue;
        n_files++;
        bool known = false;
        for (size_t i = 0; i < c->n; i++)
            if (strlen(c->cases[i].name) == len - le && strncmp(c->cases[i].name, e->d_name, len - le) == 0) known = true;
        CHECK(known, "%s/%s is not a case of %s", c->dir, e->d_name, c->test);
    }
    if (dp) closedir(dp);
    CHECK(n_files == (int)c->n, "%d files in %s, %zu cases", n_files, c->dir, c->n);
    printf("hostile (disk): %d files\n", n_files);
}

#endif
