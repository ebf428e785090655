/* test_switches.c — the environment switch registry (core/switches.h):
 *  - every row is complete (name, description, a default that its own parser
 *    accepts);
 *  - the environment is read once, on the first use, by several threads at
 *    once: all of them see the values set before it, invalid and empty
 *    values give the default, and a later change of the environment has no
 *    effect;
 *  - nstf_switch_set parses each kind as documented and refuses what it
 *    must (bad values, string switches, unknown ids);
 *  - `nstf devices --verbose` lists every switch with its value, default and
 *    source (a secret's value as "(set)" only), warns once on stderr about an invalid value, and plain
 *    `nstf devices` does not list them (works with or without a GPU
 *    backend). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/switches.h"
#include "test_util.h"

#include "cli_run.h"

/* The line of g_out that starts with "  NAME " (NULL if none), copied. */
static const char *listing_line(const char *name, char *buf, size_t cap) {
    char key[64];
    snprintf(key, sizeof key, "\n  %s ", name);
    const char *p = strstr(g_out, key);
    if (!p) return NULL;
    p += 1;
    const char *e = strchr(p, '\n');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if (n >= cap) n = cap - 1;
    memcpy(buf, p, n);
    buf[n] = 0;
    return buf;
}

/* Whitespace-separated field k (0-based) of line, copied. */
static const char *field(const char *line, int k, char *buf, size_t cap) {
    buf[0] = 0;
    for (int i = 0; *line; i++) {
        while (*line == ' ') line++;
        size_t n = strcspn(line, " ");
        if (i == k) {
            if (n >= cap) n = cap - 1;
            memcpy(buf, line, n);
            buf[n] = 0;
            return buf;
        }
        line += n;
    }
    return buf;
}

static void check_table(void) {
    for (int i = 0; i < NSTF_SW_COUNT; i++) {
        const nstf_switch_def *d = nstf_switch_def_of((nstf_switch_id)i);
        CHECK(d && d->name && d->name[0] && d->desc && d->desc[0], "switch %d: row incomplete", i);
        if (!d || !d->name) continue;
        for (int j = 0; j < i; j++)
            CHECK(strcmp(d->name, nstf_switch_def_of((nstf_switch_id)j)->name) != 0, "%s listed twice", d->name);
        if (d->kind == NSTF_SWITCH_ENUM) {
            int has_def = 0, n = 0;
            for (const nstf_switch_choice *c = d->choices; c && c->name; c++, n++) has_def |= c->value == d->def;
            CHECK(n >= 2 && has_def, "%s: %d choices, default among them: %d", d->name, n, has_def);
        }
        if (d->kind == NSTF_SWITCH_INT)
            CHECK(d->min <= d->max && (d->def == NSTF_SWITCH_AUTO || (d->def >= d->min && d->def <= d->max)),
                  "%s: default %d outside %d..%d", d->name, d->def, d->min, d->max);
        if (d->kind == NSTF_SWITCH_BOOL) CHECK(d->def == 0 || d->def == 1, "%s: default %d", d->name, d->def);
    }
    CHECK(nstf_switch_def_of(NSTF_SW_COUNT) == NULL, "id out of range has a row");
    CHECK(nstf_switch_def_of((nstf_switch_id)-1) == NULL, "negative id has a row");
}

static void *first_read(void *arg) {
    int *out = arg;
    out[0] = nstf_switch_int(NSTF_SW_GEMM);
    out[1] = nstf_switch_int(NSTF_SW_PF_BYTES);
    out[2] = nstf_switch_int(NSTF_SW_PDL);
    return NULL;
}

/* The environment of the first read (set by main before any use). */
static void check_first_read(void) {
    enum { NT = 4 };
    pthread_t th[NT];
    int got[NT][3];
    for (int t = 0; t < NT; t++) pthread_create(&th[t], NULL, first_read, got[t]);
    for (int t = 0; t < NT; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < NT; t++)
        CHECK(got[t][0] == 64 && got[t][1] == 4096 && got[t][2] == 0, "thread %d read %d %d %d (want 64 4096 0)", t,
              got[t][0], got[t][1], got[t][2]);
    CHECK(nstf_switch_source_of(NSTF_SW_GEMM) == NSTF_SWITCH_FROM_ENV, "NSTF_GEMM source %d",
          (int)nstf_switch_source_of(NSTF_SW_GEMM));
    /* invalid: the default, marked */
    CHECK(nstf_switch_int(NSTF_SW_GEMV_ROWS) == NSTF_SWITCH_AUTO, "bad NSTF_GEMV_ROWS gave %d",
          nstf_switch_int(NSTF_SW_GEMV_ROWS));
    CHECK(nstf_switch_source_of(NSTF_SW_GEMV_ROWS) == NSTF_SWITCH_FROM_BAD_ENV, "bad value source %d",
          (int)nstf_switch_source_of(NSTF_SW_GEMV_ROWS));
    /* empty: unset */
    CHECK(nstf_switch_int(NSTF_SW_FD_EARLY) == 1 && nstf_switch_source_of(NSTF_SW_FD_EARLY) == NSTF_SWITCH_FROM_DEFAULT,
          "empty NSTF_FD_EARLY: %d", nstf_switch_int(NSTF_SW_FD_EARLY));
    CHECK(nstf_switch_int(NSTF_SW_GEMV_PRE) == 1, "unset NSTF_GEMV_PRE: %d", nstf_switch_int(NSTF_SW_GEMV_PRE));
    const char *h = nstf_switch_str(NSTF_SW_XDG_CACHE_HOME);
    CHECK(h && !strcmp(h, "/nonexistent/cache"), "XDG_CACHE_HOME: %s", h ? h : "(null)");
    CHECK(nstf_switch_str(NSTF_SW_GEMM) == NULL, "string of an enum switch");
    CHECK(nstf_switch_int(NSTF_SW_HOME) == 0, "int of a string switch");
    /* read once: a later change of the environment is not seen */
    setenv("NSTF_GEMM", "mma", 1);
    setenv("XDG_CACHE_HOME", "/elsewhere", 1);
    CHECK(nstf_switch_int(NSTF_SW_GEMM) == 64, "environment re-read: %d", nstf_switch_int(NSTF_SW_GEMM));
    h = nstf_switch_str(NSTF_SW_XDG_CACHE_HOME);
    CHECK(h && !strcmp(h, "/nonexistent/cache"), "XDG_CACHE_HOME re-read: %s", h ? h : "(null)");
    setenv("NSTF_GEMM", "wgmma64", 1);
    setenv("XDG_CACHE_HOME", "/nonexistent/cache", 1);
}

static void expect_set(nstf_switch_id id, const char *text, nstf_status want, int want_value) {
    nstf_status st = nstf_switch_set(id, text);
    CHECK(st == want, "%s <- '%s': status %d, want %d (%s)", nstf_switch_def_of(id)->name, text ? text : "(null)",
          (int)st, (int)want, nstf_last_error());
    if (want == NSTF_OK && st == NSTF_OK)
        CHECK(nstf_switch_int(id) == want_value, "%s <- '%s': %d, want %d", nstf_switch_def_of(id)->name,
              text ? text : "(null)", nstf_switch_int(id), want_value);
}

static void check_set(void) {
    const char *yes[] = {"1", "on", "true", "yes", "ON", "True"}, *no[] = {"0", "off", "false", "no", "OFF", "No"};
    for (int i = 0; i < 6; i++) {
        expect_set(NSTF_SW_PDL, yes[i], NSTF_OK, 1);
        expect_set(NSTF_SW_PDL, no[i], NSTF_OK, 0);
    }
    const char *bad_bool[] = {"2", "0x", "maybe", " 1", "-1"};
    for (int i = 0; i < 5; i++) expect_set(NSTF_SW_PDL, bad_bool[i], NSTF_ERR_INVALID_ARG, 0);
    CHECK(nstf_switch_int(NSTF_SW_PDL) == 0, "a refused value changed the switch");
    expect_set(NSTF_SW_PDL, NULL, NSTF_OK, 1);
    CHECK(nstf_switch_source_of(NSTF_SW_PDL) == NSTF_SWITCH_FROM_DEFAULT, "NULL: source %d",
          (int)nstf_switch_source_of(NSTF_SW_PDL));

    expect_set(NSTF_SW_PF_BYTES, "0", NSTF_OK, 0);
    expect_set(NSTF_SW_PF_BYTES, "2147483647", NSTF_OK, 2147483647);
    expect_set(NSTF_SW_PF_BYTES, "auto", NSTF_OK, NSTF_SWITCH_AUTO);
    expect_set(NSTF_SW_PF_BYTES, "512", NSTF_OK, 512);
    CHECK(nstf_switch_source_of(NSTF_SW_PF_BYTES) == NSTF_SWITCH_FROM_SET, "set: source %d",
          (int)nstf_switch_source_of(NSTF_SW_PF_BYTES));
    const char *bad_int[] = {"-3", "2147483648", "12abc", "", "1e3", "99999999999999999999"};
    for (int i = 0; i < 6; i++) expect_set(NSTF_SW_PF_BYTES, bad_int[i], NSTF_ERR_INVALID_ARG, 0);
    CHECK(strstr(nstf_last_error(), "NSTF_PF_BYTES") && strstr(nstf_last_error(), "0..2147483647|auto"),
          "message names the switch and what it accepts: %s", nstf_last_error());

    expect_set(NSTF_SW_GEMM, "mma", NSTF_OK, 0);
    expect_set(NSTF_SW_GEMM, "wgmma128", NSTF_OK, 128);
    expect_set(NSTF_SW_GEMM, "auto", NSTF_OK, NSTF_SWITCH_AUTO);
    expect_set(NSTF_SW_GEMM, "MMA", NSTF_ERR_INVALID_ARG, 0);
    expect_set(NSTF_SW_GEMM, "wgmma32", NSTF_ERR_INVALID_ARG, 0);
    expect_set(NSTF_SW_GEMV_ROWS, "16", NSTF_OK, 16);
    expect_set(NSTF_SW_GEMV_ROWS, "12", NSTF_ERR_INVALID_ARG, 0);
    expect_set(NSTF_SW_GEMV_ROWS, NULL, NSTF_OK, NSTF_SWITCH_AUTO);

    CHECK(nstf_switch_set(NSTF_SW_HOME, "/tmp") == NSTF_ERR_UNSUPPORTED, "string switches are read-only");
    CHECK(nstf_switch_set(NSTF_SW_COUNT, "1") == NSTF_ERR_INVALID_ARG, "unknown id accepted");

    char buf[160];
    nstf_switch_format(NSTF_SW_GEMM, 256, buf, sizeof buf);
    CHECK(!strcmp(buf, "wgmma256"), "format: %s", buf);
    nstf_switch_format(NSTF_SW_PF_BYTES, NSTF_SWITCH_AUTO, buf, sizeof buf);
    CHECK(!strcmp(buf, "auto"), "format: %s", buf);
    nstf_switch_allowed_text(NSTF_SW_GEMV_ROWS, buf, sizeof buf);
    CHECK(!strcmp(buf, "auto|8|16|32"), "allowed: %s", buf);
    nstf_switch_allowed_text(NSTF_SW_GEMM, buf, 8); /* truncated, still terminated */
    CHECK(strlen(buf) == 7, "truncated allowed text: '%s'", buf);
    /* back to what the environment said, for the CLI part */
    CHECK(nstf_switch_set(NSTF_SW_GEMM, "wgmma64") == NSTF_OK, "%s", nstf_last_error());
    CHECK(nstf_switch_set(NSTF_SW_PF_BYTES, "4096") == NSTF_OK, "%s", nstf_last_error());
}

static void check_cli(void) {
    char line[512], f[128];
    int rc = run((const char *const[]){"devices", "--verbose", NULL});
    CHECK(rc == 0, "devices --verbose: exit %d: %s", rc, g_err);
    CHECK(strstr(g_out, "environment switches") != NULL, "no switch listing: %s", g_out);
    for (int i = 0; i < NSTF_SW_COUNT; i++) {
        const nstf_switch_def *d = nstf_switch_def_of((nstf_switch_id)i);
        CHECK(listing_line(d->name, line, sizeof line) != NULL, "%s not listed", d->name);
    }
    /* name value default from: set by the environment, unset, invalid */
    if (listing_line("NSTF_GEMM", line, sizeof line)) {
        CHECK(!strcmp(field(line, 1, f, sizeof f), "wgmma64"), "NSTF_GEMM value: %s", line);
        CHECK(!strcmp(field(line, 2, f, sizeof f), "auto"), "NSTF_GEMM default: %s", line);
        CHECK(!strcmp(field(line, 3, f, sizeof f), "environment"), "NSTF_GEMM source: %s", line);
        CHECK(strstr(line, "auto|mma|wgmma256|wgmma192|wgmma128|wgmma64") != NULL, "NSTF_GEMM accepted: %s", line);
    }
    if (listing_line("NSTF_PF_BYTES", line, sizeof line))
        CHECK(!strcmp(field(line, 1, f, sizeof f), "4096"), "NSTF_PF_BYTES value: %s", line);
    if (listing_line("NSTF_PDL", line, sizeof line))
        CHECK(!strcmp(field(line, 1, f, sizeof f), "0") && !strcmp(field(line, 2, f, sizeof f), "1"),
              "NSTF_PDL value/default: %s", line);
    if (listing_line("NSTF_GEMV_PRE", line, sizeof line))
        CHECK(!strcmp(field(line, 1, f, sizeof f), "1") && !strcmp(field(line, 3, f, sizeof f), "default"),
              "NSTF_GEMV_PRE: %s", line);
    if (listing_line("NSTF_GEMV_ROWS", line, sizeof line))
        CHECK(!strcmp(field(line, 1, f, sizeof f), "auto") && strstr(line, "env value invalid"), "NSTF_GEMV_ROWS: %s",
              line);
    if (listing_line("XDG_CACHE_HOME", line, sizeof line))
        CHECK(!strcmp(field(line, 1, f, sizeof f), "/nonexistent/cache"), "XDG_CACHE_HOME: %s", line);
    /* a secret is read but never shown */
    const char *key = nstf_switch_str(NSTF_SW_API_KEY);
    CHECK(key && !strcmp(key, "sk-never-shown"), "NSTF_API_KEY: %s", key ? key : "(null)");
    if (listing_line("NSTF_API_KEY", line, sizeof line))
        CHECK(!strcmp(field(line, 1, f, sizeof f), "(set)"), "NSTF_API_KEY value: %s", line);
    CHECK(!strstr(g_out, "sk-never-shown") && !strstr(g_err, "sk-never-shown"), "the API key is listed: %s", g_out);
    /* exactly one warning line, for the invalid value */
    CHECK(count_lines(g_err) == 1 && strstr(g_err, "NSTF_GEMV_ROWS='bogus'") && strstr(g_err, "auto|8|16|32"),
          "stderr: %s", g_err);

    rc = run((const char *const[]){"devices", NULL});
    CHECK(rc == 0 && !strstr(g_out, "environment switches"), "plain devices lists switches (exit %d): %s", rc, g_out);
    unsetenv("NSTF_GEMV_ROWS");
    rc = run((const char *const[]){"devices", "-v", NULL});
    CHECK(rc == 0 && g_err[0] == 0, "a clean environment warns (exit %d): %s", rc, g_err);
    rc = run((const char *const[]){"devices", "--bogus", NULL});
    CHECK(rc == 2, "unknown option: exit %d", rc);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/nstf_test_switches_XXXXXX");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 1; }
    /* the environment of the first read: nothing may read a switch before */
    for (int i = 0; i < NSTF_SW_COUNT; i++) unsetenv(nstf_switch_def_of((nstf_switch_id)i)->name);
    setenv("NSTF_GEMM", "wgmma64", 1);
    setenv("NSTF_PF_BYTES", "4096", 1);
    setenv("NSTF_PDL", "off", 1);
    setenv("NSTF_GEMV_ROWS", "bogus", 1);
    setenv("NSTF_FD_EARLY", "", 1);
    setenv("XDG_CACHE_HOME", "/nonexistent/cache", 1);
    setenv("NSTF_API_KEY", "sk-never-shown", 1);

    check_table();
    check_first_read();
    check_set();
    check_cli();

    char path[300];
    snprintf(path, sizeof path, "%s/stdout", g_dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/stderr", g_dir);
    unlink(path);
    rmdir(g_dir);
    return test_finish("test_switches");
}
