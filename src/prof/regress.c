/* regress.c — load a saved benchmark (cJSON) and compare results to it. */
#include "prof/regress.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "prof/report.h"

const char *nstf_path_basename(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

bool nstf_parse_tolerance(const char *s, double *fraction) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno) return false;
    if (*end == '%') end++;
    if (*end || !isfinite(v) || v < 0 || v > 1000) return false;
    *fraction = v / 100.0;
    return true;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

void nstf_baseline_free(nstf_baseline *b) {
    if (!b) return;
    for (int64_t i = 0; i < b->n; i++) {
        free(b->entries[i].model);
        free(b->entries[i].test);
        free(b->entries[i].backend);
    }
    free(b->entries);
    b->entries = NULL;
    b->n = 0;
}

static nstf_status get_num(const cJSON *o, const char *key, const char *name, int64_t idx, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v))
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: entry %lld has no number '%s'", name, (long long)idx, key);
    *out = v->valuedouble;
    return NSTF_OK;
}

static nstf_status get_str(const cJSON *o, const char *key, const char *name, int64_t idx, const char **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v) || !v->valuestring)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: entry %lld has no string '%s'", name, (long long)idx, key);
    *out = v->valuestring;
    return NSTF_OK;
}

static nstf_status add_entry(nstf_baseline *b, const cJSON *o, const char *name, int64_t idx) {
    if (!cJSON_IsObject(o))
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: entry %lld is not a JSON object", name, (long long)idx);
    const char *model = NULL, *backend = NULL;
    double np = 0, ng = 0, nd = 0, nt = 0, ts = 0;
    NSTF_TRY(get_str(o, "model_filename", name, idx, &model));
    NSTF_TRY(get_str(o, "backends", name, idx, &backend));
    NSTF_TRY(get_num(o, "n_prompt", name, idx, &np));
    NSTF_TRY(get_num(o, "n_gen", name, idx, &ng));
    NSTF_TRY(get_num(o, "n_threads", name, idx, &nt));
    NSTF_TRY(get_num(o, "avg_ts", name, idx, &ts));
    /* n_depth is absent from llama-bench files older than depth support */
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(o, "n_depth");
    nd = cJSON_IsNumber(d) ? d->valuedouble : 0;
    if (np < 0 || ng < 0 || nd < 0 || np > 1e9 || ng > 1e9 || nd > 1e9 || nt < 0 || nt > 1e6 || !(ts >= 0))
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: entry %lld has out-of-range counts or rate", name, (long long)idx);
    nstf_baseline_entry *ne = realloc(b->entries, (size_t)(b->n + 1) * sizeof *ne);
    if (!ne) return nstf_set_error(NSTF_ERR_OOM, "out of memory reading %s", name);
    b->entries = ne;
    char test[96];
    nstf_bench_test_name((int)np, (int)ng, (int)nd, test, sizeof test);
    nstf_baseline_entry *e = &b->entries[b->n];
    e->model = dup_str(nstf_path_basename(model));
    e->test = dup_str(test);
    e->backend = dup_str(backend);
    e->n_threads = (int)nt;
    e->avg_ts = ts;
    b->n++;
    if (!e->model || !e->test || !e->backend) return nstf_set_error(NSTF_ERR_OOM, "out of memory reading %s", name);
    return NSTF_OK;
}

nstf_status nstf_baseline_parse(const char *text, size_t len, const char *name, nstf_baseline *out) {
    memset(out, 0, sizeof *out);
    size_t i = 0;
    while (i < len && (text[i] == ' ' || text[i] == '\n' || text[i] == '\r' || text[i] == '\t')) i++;
    nstf_status s = NSTF_OK;
    if (i < len && text[i] == '[') {
        cJSON *root = cJSON_ParseWithLength(text, len);
        if (!root) return nstf_set_error(NSTF_ERR_FORMAT, "%s: not valid JSON", name);
        int64_t idx = 0;
        const cJSON *o;
        cJSON_ArrayForEach(o, root) {
            s = add_entry(out, o, name, idx++);
            if (s != NSTF_OK) break;
        }
        cJSON_Delete(root);
    } else { /* JSON lines */
        int64_t line = 0;
        size_t p = 0;
        while (s == NSTF_OK && p < len) {
            size_t e = p;
            while (e < len && text[e] != '\n') e++;
            line++;
            size_t q = p;
            while (q < e && (text[q] == ' ' || text[q] == '\t' || text[q] == '\r')) q++;
            if (q < e) {
                cJSON *o = cJSON_ParseWithLength(text + p, e - p);
                if (!o) s = nstf_set_error(NSTF_ERR_FORMAT, "%s: line %lld is not valid JSON", name, (long long)line);
                else s = add_entry(out, o, name, line);
                cJSON_Delete(o);
            }
            p = e + 1;
        }
    }
    if (s == NSTF_OK && out->n == 0) s = nstf_set_error(NSTF_ERR_FORMAT, "%s: no benchmark results in the file", name);
    if (s != NSTF_OK) nstf_baseline_free(out);
    return s;
}

nstf_status nstf_baseline_load(const char *path, nstf_baseline *out) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) return nstf_set_error(NSTF_ERR_IO, "cannot open baseline '%s': %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    nstf_status s = NSTF_OK;
    while (buf) {
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (len < cap) break;
        if (cap >= (size_t)64 << 20) {
            s = nstf_set_error(NSTF_ERR_FORMAT, "baseline '%s' is larger than 64 MiB", path);
            break;
        }
        char *nb = realloc(buf, cap * 2);
        if (!nb) { free(buf); buf = NULL; break; }
        buf = nb;
        cap *= 2;
    }
    if (!buf) s = nstf_set_error(NSTF_ERR_OOM, "out of memory reading baseline '%s'", path);
    else if (s == NSTF_OK && ferror(f)) s = nstf_set_error(NSTF_ERR_IO, "error reading baseline '%s'", path);
    fclose(f);
    if (s == NSTF_OK) s = nstf_baseline_parse(buf, len, path, out);
    free(buf);
    return s;
}

nstf_compare nstf_baseline_compare(const nstf_baseline *b, const char *model_filename, const char *test,
                                   const char *backend, int n_threads, double avg_ts, double tolerance,
                                   char *msg, size_t cap) {
    const char *model = nstf_path_basename(model_filename);
    const nstf_baseline_entry *e = NULL;
    for (int64_t i = 0; i < b->n; i++) {
        const nstf_baseline_entry *c = &b->entries[i];
        if (!strcmp(c->model, model) && !strcmp(c->test, test) && !strcmp(c->backend, backend) &&
            c->n_threads == n_threads)
            e = c; /* the last matching entry wins (a file may hold several runs) */
    }
    if (!e) {
        snprintf(msg, cap, "%s on %s (%s, %d threads): %.1f t/s, not in the baseline", test, model, backend,
                 n_threads, avg_ts);
        return NSTF_COMPARE_MISSING;
    }
    double change = e->avg_ts > 0 ? (avg_ts - e->avg_ts) / e->avg_ts : 0.0;
    snprintf(msg, cap, "%s on %s (%s, %d threads): %.1f -> %.1f t/s (%+.1f%%, tolerance %g%%)", test, model,
             backend, n_threads, e->avg_ts, avg_ts, 100.0 * change, 100.0 * tolerance);
    if (change < -tolerance) return NSTF_COMPARE_REGRESSED;
    if (change > tolerance) return NSTF_COMPARE_IMPROVED;
    return NSTF_COMPARE_OK;
}
