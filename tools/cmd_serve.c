/* cmd_serve.c — `nstf serve`: the OpenAI-compatible HTTP server
 * (serve/server.h). Flags follow llama.cpp's llama-server where they
 * exist. SIGTERM or SIGINT stops accepting completions and lets the
 * running ones finish (a second signal, or --drain-timeout, cuts them
 * short); then the server exits 0. Under mpirun (one tensor-parallel
 * rank per process) rank 0 serves and the others follow its forwards. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_util.h"
#include "core/switches.h"
#include "dist/proc.h"
#include "nstf.h"
#include "serve/server.h"

int cmd_serve(int argc, char **argv);

static void serve_usage(FILE *f, const nstf_server_params *d) {
    fprintf(f,
            "usage: nstf serve -m MODEL [options]\n"
            "\n"
            "An OpenAI-compatible HTTP server: POST /v1/chat/completions and /v1/completions\n"
            "(\"stream\": true for server-sent events), GET /v1/models, /health and /metrics\n"
            "(Prometheus). Requests are decoded together by continuous batching over a paged\n"
            "KV cache; identical prompt prefixes share their cache blocks.\n"
            "\n"
            "  -m, --model FILE        GGUF model or HF model folder\n"
            "      --alias NAME        the model's name in the API (default: the file's name)\n"
            "      --host ADDR         address to listen on (default %s; 0.0.0.0: every interface)\n"
            "      --port N            port (default %d; 0: any free port, printed at start)\n"
            "      --api-key KEY       require 'Authorization: Bearer KEY' on every request\n"
            "                          (default: $NSTF_API_KEY if set, else no key)\n"
            "  -np, --parallel N       sequences decoded together (default %d)\n"
            "  -c, --ctx-size N        KV cache positions, shared by all sequences (default %d);\n"
            "                          one request may use all of it, up to the trained context\n"
            "  -b, --batch-size N      tokens per scheduler step: decodes plus prefill chunks\n"
            "                          (default %d; at least -np)\n"
            "      --kv-block N        positions per KV cache block (default %d)\n"
            "      --queue N           requests that may wait beyond the free slots; more get 503\n"
            "                          with Retry-After (default %d)\n"
            "  -t, --threads N         CPU threads (default: all cores)\n"
            "      --device DEV        cpu, gpu or auto (default auto: the GPU when the build has\n"
            "                          one and a device answers)\n"
            "      --tp N              tensor parallel: the model split over N GPUs (or, with --device\n"
            "                          cpu, N CPU ranks), two all-reduces per layer (NCCL / RCCL)\n"
            "      --gpus LIST         the GPUs of --tp, such as 0,1 (default 0..N-1)\n"
            "      --tp-timeout MS     a rank that makes no progress this long fails the step with\n"
            "                          an error naming it (default 30000)\n"
            "                          Or one process per rank: mpirun -np N nstf serve ... (rank 0\n"
            "                          serves; each process's GPU is its place on its machine)\n"
            "      --max-body BYTES    largest request body (default %lld)\n"
            "      --max-tokens N      most tokens one request may generate (default %d)\n"
            "      --timeout S         a request still running S seconds after it arrived ends\n"
            "                          with a timeout error (default %g)\n"
            "      --read-timeout S    a connection must deliver each whole request within S\n"
            "                          seconds (also the keep-alive idle limit; default %g)\n"
            "      --max-conns N       open connections (default %d)\n"
            "      --drain-timeout S   on SIGTERM, how long running requests may finish (default 60)\n"
            "  -v, --verbose           model, device and HTTP details on stderr\n"
            "  -h, --help              this text\n",
            d->host, d->port, d->n_seq, d->n_ctx, d->n_batch, d->kv_block, d->max_queue, (long long)d->max_body,
            d->max_tokens, d->timeout_s, d->read_timeout_s, d->max_conns);
}

static int serve(const nstf_server_params *pp, float drain_s);

static int elapsed_ms(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int)((t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000);
}

int cmd_serve(int argc, char **argv) {
    nstf_server_params p = nstf_server_default_params();
    float drain_s = 60, timeout = (float)p.timeout_s, read_timeout = (float)p.read_timeout_s;
    uint64_t max_body = (uint64_t)p.max_body;
    p.api_key = nstf_switch_str(NSTF_SW_API_KEY);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
#define VAL() do { if (!(v = cli_value(argc, argv, &i))) return 2; } while (0)
#define INT(lo, hi, dst) do { VAL(); if (!cli_parse_int(a, v, lo, hi, dst)) return 2; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { serve_usage(stdout, &p); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { VAL(); p.model = v; }
        else if (!strcmp(a, "--alias")) { VAL(); p.alias = v; }
        else if (!strcmp(a, "--host")) { VAL(); p.host = v; }
        else if (!strcmp(a, "--port")) INT(0, 65535, &p.port);
        else if (!strcmp(a, "--api-key")) { VAL(); p.api_key = *v ? v : NULL; }
        else if (!strcmp(a, "-np") || !strcmp(a, "--parallel")) INT(1, 4096, &p.n_seq);
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) INT(1, 1 << 24, &p.n_ctx);
        else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) INT(1, 1 << 16, &p.n_batch);
        else if (!strcmp(a, "--kv-block")) INT(1, 4096, &p.kv_block);
        else if (!strcmp(a, "--queue")) INT(0, 1 << 20, &p.max_queue);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) INT(1, 1024, &p.n_threads);
        else if (!strcmp(a, "--device")) { VAL(); p.device = v; }
        else if (!strcmp(a, "--tp")) INT(1, 16, &p.n_tp);
        else if (!strcmp(a, "--gpus")) { VAL(); p.gpus = v; }
        else if (!strcmp(a, "--tp-timeout")) INT(1, 86400000, &p.tp_timeout_ms);
        else if (!strcmp(a, "--max-body")) { VAL(); if (!cli_parse_u64(a, v, &max_body) || max_body < 16 || max_body > (1ull << 34)) { fprintf(stderr, "nstf serve: --max-body takes 16 .. 2^34 bytes\n"); return 2; } }
        else if (!strcmp(a, "--max-tokens")) INT(1, 1 << 24, &p.max_tokens);
        else if (!strcmp(a, "--timeout")) { VAL(); if (!cli_parse_float(a, v, 0.001, 1e7, &timeout)) return 2; }
        else if (!strcmp(a, "--read-timeout")) { VAL(); if (!cli_parse_float(a, v, 0.001, 1e7, &read_timeout)) return 2; }
        else if (!strcmp(a, "--max-conns")) INT(1, 1 << 16, &p.max_conns);
        else if (!strcmp(a, "--drain-timeout")) { VAL(); if (!cli_parse_float(a, v, 0, 1e7, &drain_s)) return 2; }
        else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) p.verbose = true;
        else { fprintf(stderr, "nstf serve: unknown option '%s' (see nstf serve --help)\n", a); return 2; }
#undef INT
#undef VAL
    }
    if (!p.model) { fprintf(stderr, "nstf serve: no model given (-m FILE)\n"); return 2; }
    p.max_body = (int64_t)max_body;
    p.timeout_s = timeout;
    p.read_timeout_s = read_timeout;
    /* under mpirun: one tensor-parallel rank per process; rank 0 serves,
     * the others run the forwards it sends */
    const int lrc = cli_launch_tp(&p.n_tp, NULL);
    if (lrc >= 0) return lrc;
    if (nstf_proc_active() && nstf_proc_rank() > 0) {
        /* mpirun hands a SIGTERM or SIGINT to every rank: these leave when
         * rank 0, draining, says so */
        signal(SIGTERM, SIG_IGN);
        signal(SIGINT, SIG_IGN);
        if (nstf_server_follow(&p) != NSTF_OK) {
            fprintf(stderr, "nstf serve: rank %d: %s\n", nstf_proc_rank(), nstf_last_error());
            return cli_launch_end(1);
        }
        return cli_launch_end(0);
    }
    return cli_launch_end(serve(&p, drain_s));
}

/* Rank 0's (or the only process's) server until a signal. */
static int serve(const nstf_server_params *pp, float drain_s) {
    const nstf_server_params p = *pp;

    /* the signals are taken by sigwait below, in this thread only: every
     * thread started from here on inherits the mask */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    nstf_server *s = NULL;
    nstf_status st = nstf_server_start(&p, &s);
    if (st != NSTF_OK) {
        fprintf(stderr, "nstf serve: %s\n", nstf_last_error());
        return 1;
    }
    fprintf(stderr, "nstf serve: listening on http://%s:%d (%d sequences, %d KV positions in blocks of %d%s)\n",
            strchr(p.host, ':') ? "[::]" : p.host, nstf_server_port(s), p.n_seq, p.n_ctx, p.kv_block,
            p.api_key ? ", API key required" : "");
    fflush(stderr);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "nstf serve: %s: finishing the running requests (at most %g s; a second signal stops at once)\n",
            sig == SIGTERM ? "SIGTERM" : "SIGINT", (double)drain_s);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    bool drained = false;
    for (;;) {
        drained = nstf_server_drain(s, 0.2);
        if (drained || elapsed_ms(&t0) >= (int)(drain_s * 1000)) break;
        const struct timespec zero = {0, 0};
        if (sigtimedwait(&set, NULL, &zero) > 0) break;
    }
    if (!drained) fprintf(stderr, "nstf serve: stopping with requests still running (they are cancelled)\n");
    nstf_server_stop(s);
    fprintf(stderr, "nstf serve: stopped\n");
    return 0;
}
