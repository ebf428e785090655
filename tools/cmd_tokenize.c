/* cmd_tokenize.c — `nstf tokenize -m MODEL FILE... -o DIR`: text files to
 * token shards for `nstf train --data DIR` (io/tokshard.h). Each file is
 * one document (BOS first when the model wants one, EOS last); the
 * documents are concatenated and cut into shards of at most
 * --shard-tokens tokens, DIR/shard-00000.tok, ... */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli_util.h"
#include "core/mem.h"
#include "io/hf_model.h"
#include "io/tokenizer.h"
#include "io/tokshard.h"

int cmd_tokenize(int argc, char **argv);

static int flush_shard(const char *dir, int *idx, int32_t *buf, int64_t *n, int32_t vocab) {
    char path[1100];
    snprintf(path, sizeof path, "%s/shard-%05d.tok", dir, *idx);
    if (nstf_tokshard_write(path, buf, *n, vocab) != NSTF_OK) {
        fprintf(stderr, "nstf: %s\n", nstf_last_error());
        return 1;
    }
    fprintf(stderr, "nstf tokenize: %s: %lld tokens\n", path, (long long)*n);
    (*idx)++;
    *n = 0;
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *dir = NULL;
    uint64_t per_shard = 100000000;
    const char **files = calloc((size_t)argc, sizeof *files);
    int n_files = 0;
    if (!files) return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: nstf tokenize -m MODEL FILE... -o DIR [--shard-tokens N]\n"
                   "  writes the text FILEs as token shards DIR/shard-NNNNN.tok with MODEL's tokenizer\n"
                   "  (header: magic, version, vocabulary size, token width, count; uint16 tokens for\n"
                   "  vocabularies up to 65536, else uint32), at most N tokens each (default 1e8)\n");
            free(files);
            return 0;
        }
        if (a[0] != '-') {
            files[n_files++] = a;
            continue;
        }
        if (!(v = cli_value(argc, argv, &i))) return free(files), 2;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) dir = v;
        else if (!strcmp(a, "--shard-tokens")) {
            if (!cli_parse_u64(a, v, &per_shard) || per_shard < 1) return free(files), 2;
        } else {
            fprintf(stderr, "nstf tokenize: unknown option '%s'\n", a);
            return free(files), 2;
        }
    }
    if (!model || !dir || n_files == 0) {
        fprintf(stderr, "nstf tokenize: -m MODEL, -o DIR and at least one FILE are required (see --help)\n");
        return free(files), 2;
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "nstf: %s: %s\n", dir, strerror(errno));
        return free(files), 1;
    }
    nstf_gguf *g = NULL;
    nstf_tokenizer *tok = NULL;
    if (nstf_model_file_open(model, &g) != NSTF_OK || nstf_tokenizer_from_gguf(g, &tok) != NSTF_OK) {
        fprintf(stderr, "nstf: %s\n", nstf_last_error());
        nstf_gguf_close(g);
        return free(files), 1;
    }
    const int32_t vocab = nstf_tokenizer_n_vocab(tok);
    int32_t *buf = NULL;
    int64_t n = 0, cap = 0, total = 0;
    int idx = 0, rc = 0;
    cli_progress bar;
    cli_progress_init(&bar, "tokenizing", "files", 1.0);
    for (int f = 0; rc == 0 && f < n_files; f++) {
        int32_t *ids = NULL;
        int64_t k = 0;
        if (nstf_tokenize_file(tok, files[f], &ids, &k) != NSTF_OK) {
            fprintf(stderr, "nstf: %s\n", nstf_last_error());
            rc = 1;
            break;
        }
        for (int64_t i = 0; rc == 0 && i < k; i++) {
            if (n == cap) {
                cap = cap ? 2 * cap : 1 << 16;
                if (cap > (int64_t)per_shard) cap = (int64_t)per_shard;
                int32_t *nb = realloc(buf, (size_t)cap * sizeof *nb);
                if (!nb) { fprintf(stderr, "nstf: out of memory\n"); rc = 1; break; }
                buf = nb;
            }
            buf[n++] = ids[i];
            if (n == (int64_t)per_shard) rc = flush_shard(dir, &idx, buf, &n, vocab);
        }
        total += k;
        free(ids);
        cli_progress_cb(&bar, (uint64_t)f + 1, (uint64_t)n_files);
    }
    cli_progress_end(&bar);
    if (rc == 0 && n > 0) rc = flush_shard(dir, &idx, buf, &n, vocab);
    if (rc == 0) fprintf(stderr, "nstf tokenize: %d files, %lld tokens, %d shards in %s\n", n_files, (long long)total, idx, dir);
    free(buf);
    free(files);
    nstf_tokenizer_free(tok);
    nstf_gguf_close(g);
    return rc;
}
