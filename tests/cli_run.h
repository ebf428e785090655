/* cli_run.h — run the built nstf binary the way a user does (posix_spawn,
 * no shell quoting), capturing stdout and stderr through files in the
 * test's temporary folder g_dir, with stdin from g_stdin (a file) or empty,
 * and expect_error() for bad input. Shared
 * by the CLI-level tests. */
#ifndef NSTF_TEST_CLI_RUN_H
#define NSTF_TEST_CLI_RUN_H

#include <fcntl.h>
#include <stdbool.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "test_util.h"

extern char **environ;

#define NSTF_BIN NSTF_BUILD_DIR "/nstf"

static char g_dir[256];
static const char *g_stdin; /* a file run() feeds as stdin (NULL: /dev/null) */
static char g_err[16384], g_out[1 << 18];

/* Run nstf with args (NULL-terminated); capture stdout/stderr into g_out
 * and g_err; return the exit status (-1 if it died from a signal). */
static int run(const char *const *args) {
    char out_path[300], err_path[300];
    snprintf(out_path, sizeof out_path, "%s/stdout", g_dir);
    snprintf(err_path, sizeof err_path, "%s/stderr", g_dir);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    /* stdin: empty, as a user's closed pipe (a prompt may come from stdin) */
    posix_spawn_file_actions_addopen(&fa, 0, g_stdin ? g_stdin : "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    char *argv[64];
    int n = 0;
    argv[n++] = (char *)NSTF_BIN;
    for (; args[n - 1] && n < 63; n++) argv[n] = (char *)args[n - 1];
    argv[n] = NULL;
    pid_t pid;
    int rc = posix_spawn(&pid, NSTF_BIN, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return -2;
    int status;
    waitpid(pid, &status, 0);
    FILE *f = fopen(err_path, "rb");
    size_t k = f ? fread(g_err, 1, sizeof g_err - 1, f) : 0;
    g_err[k] = 0;
    if (f) fclose(f);
    f = fopen(out_path, "rb");
    k = f ? fread(g_out, 1, sizeof g_out - 1, f) : 0;
    g_out[k] = 0;
    if (f) fclose(f);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The whole file, NUL-terminated (NULL when missing); *n its size. */
static inline unsigned char *cli_file(const char *path, long *n) {
    FILE *f = fopen(path, "rb");
    *n = 0;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)*n + 1);
    if (b && fread(b, 1, (size_t)*n, f) != (size_t)*n) {
        free(b);
        b = NULL;
    }
    if (b) b[*n] = 0;
    fclose(f);
    return b;
}

static inline bool cli_same_file(const char *a, const char *b) {
    long na, nb;
    unsigned char *x = cli_file(a, &na), *y = cli_file(b, &nb);
    const bool same = x && y && na == nb && memcmp(x, y, (size_t)na) == 0;
    free(x), free(y);
    return same;
}

/* Each step's loss and gradient norm of a `nstf train --log` file as
 * printed, one "loss norm" line per step into buf; the count of steps
 * whose norm is above clip into *clipped; returns the steps. */
static inline int cli_loss_norms(const char *log, double clip, char *buf, size_t cap, int *clipped) {
    long n;
    char *s = (char *)cli_file(log, &n);
    int k = 0;
    size_t at = 0;
    buf[0] = 0;
    *clipped = 0;
    for (char *p = s; p && (p = strstr(p, "\"loss\": ")); p++, k++) {
        const char *g = strstr(p, "\"grad_norm\": ");
        if (!g) break;
        const int nl = (int)strcspn(p + 8, ","), ng = (int)strcspn(g + 13, ",");
        *clipped += strtod(g + 13, NULL) > clip;
        at += (size_t)snprintf(buf + at, at < cap ? cap - at : 0, "%.*s %.*s\n", nl, p + 8, ng, g + 13);
    }
    free(s);
    return k;
}

/* The training tests' text: 300 lines of 10 words drawn (seed 42) from 19. */
static inline void cli_write_words(const char *path) {
    static const char *words[] = {"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while",
                                  "seven", "wise", "owls", "watch", "from", "an", "old", "oak", "tree"};
    FILE *f = fopen(path, "wb");
    test_rng r = {42};
    for (int i = 0; f && i < 300; i++) {
        for (int w = 0; w < 10; w++) fprintf(f, "%s%s", w ? " " : "", words[rng_next(&r) % 19]);
        fputs(".\n", f);
    }
    if (f) fclose(f);
}

static inline int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* Bad input: non-zero exit (not a crash), one line on stderr naming the
 * problem (`want` is a substring of it). */
static inline void expect_error(const char *what, const char *want, const char *const *args) {
    int rc = run(args);
    CHECK(rc > 0, "%s: exit %d (want a non-zero exit, no crash)", what, rc);
    CHECK(count_lines(g_err) == 1, "%s: %d lines on stderr: %s", what, count_lines(g_err), g_err);
    CHECK(strstr(g_err, want) != NULL, "%s: stderr lacks '%s': %s", what, want, g_err);
}

#endif
