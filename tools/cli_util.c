/* cli_util.c — the nstf commands' shared pieces: error prefix, strict
 * number parsing, --flag=value, "did you mean", threads, progress bar,
 * Ctrl-C. */
#define _GNU_SOURCE
#include "cli_util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist/proc.h"
#include "nstf.h"
#include "nstf_tools.h"

const char *cli_cmd = "";

void cli_err(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "nstf%s%s: ", *cli_cmd ? " " : "", cli_cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void cli_lib_err(void) { cli_err("%s", nstf_last_error()); }

bool cli_parse_int(const char *flag, const char *s, long min, long max, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno) {
        cli_err("%s expects an integer, got '%s'", flag, s);
        return false;
    }
    if (v < min || v > max) {
        cli_err("%s %ld is out of range (%ld..%ld)", flag, v, min, max);
        return false;
    }
    *out = (int)v;
    return true;
}

bool cli_parse_sparse(const char *flag, const char *s, int *topk, int *window) {
    char k[32];
    const char *comma = strchr(s, ',');
    const size_t kl = comma ? (size_t)(comma - s) : strlen(s);
    if (kl == 0 || kl >= sizeof k) {
        cli_err("%s '%s': expected K or K,W (top-k blocks, window positions)", flag, s);
        return false;
    }
    memcpy(k, s, kl);
    k[kl] = 0;
    if (!cli_parse_int(flag, k, 1, 1024, topk)) return false;
    return !comma || cli_parse_int(flag, comma + 1, 1, 1 << 24, window);
}

bool cli_parse_act_bits(const char *flag, const char *s, int *out) {
    if (strcmp(s, "8") && strcmp(s, "16") && strcmp(s, "32")) {
        cli_err("%s '%s': use 8, 16 or 32", flag, s);
        return false;
    }
    *out = atoi(s);
    return true;
}

bool cli_parse_u64(const char *flag, const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    /* Digits only: strtoull would skip blanks and negate after a '-', so
     * " -1" would come back as 2^64 - 1. */
    if (*s < '0' || *s > '9' || *end || errno) {
        cli_err("%s expects a non-negative integer, got '%s'", flag, s);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_float(const char *flag, const char *s, double min, double max, float *out) {
    double v;
    if (!cli_parse_double(flag, s, min, max, &v)) return false;
    *out = (float)v;
    return true;
}

bool cli_parse_types(const char *flag, const char *list, nstf_type *out, int *n, int cap, bool need_quantizer) {
    char buf[256];
    *n = 0;
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n >= cap || !nstf_type_from_name(t, &out[*n]) || (need_quantizer && !nstf_type_can_quantize(out[*n]))) {
            cli_err("%s: '%s' is not a type%s (%d at most)", flag, t, need_quantizer ? " with a quantizer" : "", cap);
            return false;
        }
        (*n)++;
    }
    if (!*n) cli_err("%s: no type in '%s'", flag, list);
    return *n > 0;
}

bool cli_parse_percent(const char *flag, const char *s, double min, double max, double *fraction) {
    char buf[64];
    snprintf(buf, sizeof buf, "%s", s);
    size_t k = strlen(buf);
    if (k && buf[k - 1] == '%') buf[k - 1] = 0;
    if (!cli_parse_double(flag, buf, min, max, fraction)) return false;
    *fraction /= 100.0;
    return true;
}

bool cli_parse_double(const char *flag, const char *s, double min, double max, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v)) {
        cli_err("%s expects a number, got '%s'", flag, s);
        return false;
    }
    if (v < min || v > max) {
        cli_err("%s %g is out of range (%g..%g)", flag, v, min, max);
        return false;
    }
    *out = v;
    return true;
}

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        cli_err("%s needs a value (see nstf help %s)", argv[*i], *cli_cmd ? cli_cmd : "");
        return NULL;
    }
    return argv[++*i];
}

/* The whole text file at path, NUL-terminated (malloc), or NULL with a
 * line on stderr naming `what`. */
char *cli_read_file(const char *path, const char *what) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        cli_err("cannot open %s '%s': %s", what, path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len - 1 == 0) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
    }
    if (buf && ferror(f)) {
        cli_err("error reading %s '%s': %s", what, path, strerror(errno));
        free(buf);
        buf = NULL;
    } else if (!buf) {
        cli_err("out of memory reading '%s'", path);
    } else {
        buf[len] = 0;
        if (strlen(buf) != len) {
            cli_err("%s '%s' contains NUL bytes", what, path);
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    return buf;
}

/* ---- flags named by a command's help ----------------------------------------- */

/* The help text (malloc'd), or NULL. */
static char *usage_text(cli_usage_fn usage) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    usage(f);
    fclose(f);
    return buf;
}

/* Calls fn(flag, n, user) for every "-x" / "--xyz" word of the help text;
 * fn returns false to stop. */
static void each_flag(const char *text, bool (*fn)(const char *flag, size_t n, void *user), void *user) {
    for (const char *p = text; p && *p; p++) {
        if (*p != '-' || (p > text && !strchr(" \t\n,(|[", p[-1]))) continue;
        const char *q = p + (p[1] == '-' ? 2 : 1);
        if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z'))) continue;
        while ((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') || *q == '-') q++;
        if (!fn(p, (size_t)(q - p), user)) return;
        p = q - 1;
    }
}

typedef struct {
    const char *name;
    size_t n;
    bool found;
} find_ctx;

static bool find_fn(const char *flag, size_t n, void *user) {
    find_ctx *c = user;
    if (n == c->n && !strncmp(flag, c->name, n)) c->found = true;
    return !c->found;
}

/* The expanded argv and its flag names (one block), freed at exit. */
static char **g_args, *g_names;

static void free_expanded(void) {
    free(g_args);
    free(g_names);
    g_args = NULL;
    g_names = NULL;
}

void cli_expand_args(int *argc, char ***argv, cli_usage_fn usage) {
    int extra = 0;
    size_t name_bytes = 0;
    for (int i = 1; i < *argc; i++)
        if (!strncmp((*argv)[i], "--", 2) && strchr((*argv)[i], '=') != NULL) {
            extra++;
            name_bytes += strlen((*argv)[i]) + 1;
        }
    if (!extra || g_args) return; /* once per process */
    char *text = usage_text(usage);
    char **out = malloc((size_t)(*argc + extra + 1) * sizeof *out);
    char *names = malloc(name_bytes), *np = names;
    if (!text || !out || !names) {
        free(text);
        free(out);
        free(names);
        return;
    }
    int n = 0;
    for (int i = 0; i < *argc; i++) {
        char *a = (*argv)[i], *eq = i > 0 && !strncmp(a, "--", 2) ? strchr(a, '=') : NULL;
        find_ctx c = {a, eq ? (size_t)(eq - a) : 0, false};
        if (eq) each_flag(text, find_fn, &c);
        /* a value that looks like --flag=x after a flag is left alone: it is
         * that flag's value (-p --x=y) only if the flag before takes one,
         * which the help cannot tell; flags named by the help win */
        if (c.found) {
            memcpy(np, a, c.n);
            np[c.n] = 0;
            out[n++] = np;
            np += c.n + 1;
            out[n++] = eq + 1;
        } else {
            out[n++] = a;
        }
    }
    out[n] = NULL;
    free(text);
    g_args = out;
    g_names = names;
    atexit(free_expanded);
    *argc = n;
    *argv = out;
}

static size_t edit_distance(const char *a, size_t na, const char *b, size_t nb) {
    size_t row[64];
    if (na >= 63 || nb >= 63) return 99;
    for (size_t j = 0; j <= nb; j++) row[j] = j;
    for (size_t i = 1; i <= na; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[nb];
}

typedef struct {
    const char *arg;
    size_t n, best_d;
    char best[64];
} near_ctx;

static bool near_fn(const char *flag, size_t n, void *user) {
    near_ctx *c = user;
    size_t d = edit_distance(c->arg, c->n, flag, n);
    /* a prefix of a long flag counts as close: --ctx for --ctx-size */
    if (c->n >= 4 && n > c->n && !strncmp(flag, c->arg, c->n)) d = 1;
    if (d < c->best_d && n < sizeof c->best) {
        c->best_d = d;
        memcpy(c->best, flag, n);
        c->best[n] = 0;
    }
    return true;
}

int cli_unknown_option(const char *arg, cli_usage_fn usage) {
    char *text = usage_text(usage);
    const char *eq = strchr(arg, '=');
    near_ctx c = {arg, eq ? (size_t)(eq - arg) : strlen(arg), 99, ""};
    each_flag(text, near_fn, &c);
    free(text);
    const size_t limit = c.n <= 4 ? 1 : c.n / 3 + 1;
    if (c.best[0] && c.best_d <= limit)
        cli_err("unknown option '%s' (did you mean %s? see nstf help %s)", arg, c.best, cli_cmd);
    else
        cli_err("unknown option '%s' (see nstf help %s)", arg, cli_cmd);
    return 2;
}

/* ---- threads ------------------------------------------------------------------- */

int cli_default_threads(void) { return nstf_cpu_physical_count(); }

bool cli_parse_threads(const char *flag, const char *v, int *n) {
    if (!cli_parse_int(flag, v, 1, 1024, n)) return false;
    cli_check_threads(*n);
    return true;
}

void cli_check_threads(int n) {
    const int cpus = nstf_cpu_count(), cores = nstf_cpu_physical_count();
    if (n > cpus)
        fprintf(stderr,
                "nstf %s: warning: %d threads on %d processor%s (%d physical core%s): threads will wait for each "
                "other; -t %d is usually fastest\n",
                cli_cmd, n, cpus, cpus == 1 ? "" : "s", cores, cores == 1 ? "" : "s", cores);
}

/* ---- progress bar ------------------------------------------------------------------ */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cli_progress_init(cli_progress *p, const char *label, const char *unit, double scale) {
    *p = (cli_progress){label, unit, scale, now_s(), 0, isatty(fileno(stderr)) != 0, false};
}

void cli_progress_cb(void *user, uint64_t done, uint64_t total) { cli_progress_show(user, done, total, NULL); }

void cli_progress_show(cli_progress *p, uint64_t done, uint64_t total, const char *note) {
    if (!p->tty) return;
    const double t = now_s();
    if (done < total && t - p->last < 0.1) return;
    p->last = t;
    const double frac = total ? (double)done / (double)total : 1.0, el = t - p->t0;
    const double rate = el > 0 ? (double)done * p->scale / el : 0.0, eta = frac > 0 ? el * (1.0 - frac) / frac : 0.0;
    char fill[31];
    const int w = 30, k = (int)(frac * w);
    for (int i = 0; i < w; i++) fill[i] = i < k ? '=' : i == k ? '>' : ' ';
    fill[w] = 0;
    fprintf(stderr, "\r%s [%s] %3.0f%% ", p->label, fill, 100 * frac);
    if (p->unit) fprintf(stderr, "%8.1f %s/s ", rate, p->unit);
    if (note) fprintf(stderr, "%s ", note);
    const int e = eta < 1e8 ? (int)eta : 99999999;
    if (e >= 3600) fprintf(stderr, "ETA %d:%02d:%02d", e / 3600, e / 60 % 60, e % 60);
    else fprintf(stderr, "ETA %d:%02d", e / 60, e % 60);
    fputs("\x1b[K", stderr); /* erase what a longer line left */
    fflush(stderr);
    p->drawn = true;
}

void cli_progress_end(cli_progress *p) {
    if (p->drawn) fputc('\n', stderr);
    p->drawn = false;
}

void cli_stages_init(cli_stages *s, const char *tenths) {
    *s = (cli_stages){.tenths = tenths};
    cli_progress_init(&s->bar, "", NULL, 1.0);
}

void cli_stages_cb(void *user, const char *stage, int done, int total, const char *what) {
    cli_stages *s = user;
    if (strcmp(s->stage, stage)) { /* a new stage: its own bar and clock */
        cli_progress_end(&s->bar);
        snprintf(s->stage, sizeof s->stage, "%s", stage);
        cli_progress_init(&s->bar, s->stage, NULL, 1.0);
    }
    if (s->bar.tty) {
        cli_progress_show(&s->bar, done > 0 ? (uint64_t)done : 0, total > 0 ? (uint64_t)total : 0, what);
        if (done >= total) cli_progress_end(&s->bar);
        return;
    }
    const int n = total > 0 ? total : 1;
    if (done >= total || !s->tenths || strcmp(stage, s->tenths) || 10 * done / n != 10 * (done - 1) / n) {
        const double el = now_s() - s->bar.t0, eta = done > 0 ? el * (total - done) / done : 0;
        fprintf(stderr, "%s: %d/%d (%.0f s, ETA %.0f s) %s\n", stage, done, total, el, eta, what);
        fflush(stderr);
    }
}

void cli_stages_end(cli_stages *s) { cli_progress_end(&s->bar); }

/* ---- Ctrl-C ---------------------------------------------------------------------------- */

_Static_assert(sizeof(sig_atomic_t) == sizeof(int), "the library's stop flag is an int");

volatile sig_atomic_t cli_sigint;
static bool g_quit_on_second;

static void on_sigint(int sig) {
    (void)sig;
    if (cli_sigint && g_quit_on_second) {
        static const char msg[] = "\n";
        ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)w;
        _exit(130);
    }
    cli_sigint = cli_sigint + 1;
}

void cli_sigint_install(bool quit_on_second) {
    g_quit_on_second = quit_on_second;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

int cli_launch_join(void) {
    if (!nstf_proc_launched()) return -1;
    if (nstf_proc_join() != NSTF_OK) {
        cli_lib_err();
        return 1;
    }
    return -1;
}

int cli_launch_tp(int *n_tp, uint64_t *seed) {
    if (!nstf_proc_launched()) return -1;
    const int jrc = cli_launch_join();
    if (jrc >= 0) return jrc;
    const int n = nstf_proc_size(), rank = nstf_proc_rank();
    if (*n_tp > 1 && *n_tp != n) {
        cli_err("--tp %d: mpirun launched %d processes, one tensor-parallel rank each (leave --tp out, or give %d)",
                *n_tp, n, n);
        return cli_launch_end(2);
    }
    *n_tp = n;
    if (seed && nstf_proc_bcast0(seed, sizeof *seed, 30000) != NSTF_OK) {
        cli_lib_err();
        return cli_launch_end(1);
    }
    if (rank > 0 && !freopen("/dev/null", "w", stdout)) {
        cli_err("rank %d: cannot quiet stdout", rank);
        return cli_launch_end(1);
    }
    return -1;
}

int cli_launch_share(char **text, int timeout_ms) {
    const int rank = nstf_proc_rank();
    int64_t len = rank == 0 ? (*text ? (int64_t)strlen(*text) : -1) : 0;
    if (nstf_proc_bcast0(&len, sizeof len, timeout_ms) != NSTF_OK) {
        cli_lib_err();
        return 1;
    }
    if (len > INT32_MAX - 1) {
        cli_err("%lld bytes of input to share between the ranks: at most %d", (long long)len, INT32_MAX - 1);
        return 1;
    }
    if (rank != 0) {
        free(*text);
        *text = NULL;
    }
    if (len < 0) return 0; /* none */
    if (rank != 0 && !(*text = calloc((size_t)len + 1, 1))) {
        cli_err("out of memory sharing %lld bytes of input between the ranks", (long long)len);
        return 1;
    }
    if (nstf_proc_bcast0(*text, (size_t)len, timeout_ms) != NSTF_OK) {
        cli_lib_err();
        return 1;
    }
    return 0;
}

int cli_launch_end(int rc) {
    if (!nstf_proc_active()) return rc;
    if (rc != 0 && rc != 130) {
        fflush(stdout);
        fflush(stderr);
        nstf_proc_abort(rc);
    }
    nstf_proc_leave(30000);
    return rc;
}
