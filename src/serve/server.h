/* server.h — `nstf serve`: an OpenAI-compatible HTTP server (libmicrohttpd)
 * over the serving engine (serve/engine.h). What the command-line tool
 * sees: the options, start, the bound address, drain and stop.
 *
 * Endpoints: POST /v1/chat/completions and /v1/completions (server-sent
 * events with "stream": true), GET /v1/models, /health, /metrics
 * (Prometheus text). With an API key every request must carry
 * "Authorization: Bearer KEY" (else 401). Errors are OpenAI's JSON shape.
 *
 * Limits: a body over max_body bytes is refused (413) as soon as its
 * length is known; a connection that has not delivered a whole request
 * within read_timeout_s is closed (slow clients cannot hold threads); at
 * most max_conns connections are open; a generation stops at max_tokens
 * and ends with a timeout error past timeout_s; a client that goes away
 * cancels its request, whose KV blocks are freed. */
#ifndef NSTF_SERVE_SERVER_H
#define NSTF_SERVE_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "nstf.h"

typedef struct nstf_server nstf_server;

typedef struct nstf_server_params {
    const char *model;      /* GGUF file or HF folder */
    const char *alias;      /* the model's name in the API (default: the file's base name) */
    const char *host;       /* address to bind (default 127.0.0.1) */
    int port;               /* default 8080; 0: any free port (nstf_server_port says which) */
    const char *api_key;    /* NULL: no authentication */
    int n_seq;              /* sequences decoded together (-np, default 4) */
    int n_ctx;              /* KV cache positions in all (-c, default 4096) */
    int kv_block;           /* positions per KV block (default 16) */
    int n_batch;            /* tokens per scheduler step (-b, default 256) */
    int max_queue;          /* requests waiting beyond the free slots (default 64) */
    int n_threads;          /* CPU threads (0: every core) */
    const char *device;     /* cpu, gpu or auto */
    int64_t max_body;       /* bytes (default 1 MiB) */
    int max_tokens;         /* most tokens one request may generate (default 4096) */
    double timeout_s;       /* per request, from arrival (default 600) */
    double read_timeout_s;  /* to receive one whole request, and idle keep-alive (default 30) */
    int max_conns;          /* open connections (default 256) */
    int n_tp;               /* tensor parallel over n_tp devices (0 or 1: none) */
    const char *gpus;       /* the GPUs of n_tp ("0,1"; NULL: 0..n_tp-1) */
    int tp_timeout_ms;      /* a tensor-parallel rank this long without progress is an error (0: default) */
    bool verbose;
} nstf_server_params;

nstf_server_params nstf_server_default_params(void);
/* Load the model, start the engine, bind and listen. */
nstf_status nstf_server_start(const nstf_server_params *p, nstf_server **out);
/* Under mpirun with one tensor-parallel rank per process, the ranks above
 * 0: load the same model shard and run the forwards rank 0's server sends
 * until it stops (rank 0 calls nstf_server_start as usual). */
nstf_status nstf_server_follow(const nstf_server_params *p);
int nstf_server_port(const nstf_server *s);
/* Refuse new completions (503) and wait for the accepted ones to finish
 * and their answers (a stream's last chunks) to be sent, at most
 * timeout_s; false when some were still running. */
bool nstf_server_drain(nstf_server *s, double timeout_s);
/* Close every connection (requests still running are cancelled) and free. */
void nstf_server_stop(nstf_server *s);

#endif
