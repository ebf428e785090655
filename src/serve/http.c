/* http.c — the HTTP face of `nstf serve` (server.h) on libmicrohttpd.
 *
 * Thread per connection: a handler may block while its request
 * generates (non-stream answers), and a stream's content reader blocks
 * until the engine hands out more text; both wake every 100 ms to see
 * whether the client is still there (a peek at the socket: end of file
 * or an error means it left), and cancel the request if not.
 *
 * Connections are tracked from open to close (notify-connection): a
 * watchdog thread shuts down the socket of any connection that has not
 * delivered a whole request within read_timeout_s of opening or of its
 * previous answer (slow-loris clients, idle keep-alive), which
 * libmicrohttpd's idle timeout alone does not bound. The socket is shut
 * down under the registry's lock, and a connection leaves the registry
 * before libmicrohttpd closes its socket, so no other socket is hit. */
#include "serve/server.h"

#include <errno.h>
#include <stdarg.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "core/clock.h"
#include "core/threadpool.h"
#include "serve/api.h"
#include "serve/engine.h"
#include "serve/metrics.h"

enum { R_NONE, R_CHAT, R_COMPLETIONS, R_MODELS, R_HEALTH, R_METRICS, R_COUNT };
static const char *const k_route_name[R_COUNT] = {"other", "/v1/chat/completions", "/v1/completions", "/v1/models",
                                                  "/health", "/metrics"};
#define N_CODES 16

/* A connection, from open to close. */
typedef struct conn {
    int fd;
    double since;        /* ms: opened, or its last answer went out */
    bool busy;           /* a whole request is in: it is being answered */
    bool cut;            /* the watchdog shut it down */
    struct conn *prev, *next;
} conn;

struct nstf_server {
    nstf_server_params p;
    nstf_engine *e;
    struct MHD_Daemon *d;
    int port;
    char model[256];
    int64_t created;
    atomic_bool draining, stopping;
    atomic_ullong next_id;
    uint64_t id_salt;
    /* connections and the watchdog */
    pthread_mutex_t mu;
    conn *conns;
    int n_conns;
    int64_t n_cut;
    pthread_t watchdog;
    bool watchdog_started;
    pthread_cond_t wake;
    /* answers by route and status, under mu */
    struct { int route, status; uint64_t n; } codes[R_COUNT * N_CODES];
    int n_codes;
};

/* One request on a connection (libmicrohttpd's con_cls). */
typedef struct req {
    nstf_server *srv;
    conn *c;
    int route;
    int fd;
    char *body;
    size_t n_body, cap_body;
    nstf_api_error early; /* status != 0: answer this once the request is in */
    int status;           /* what was answered */
} req;

/* A stream's state: owned by its libmicrohttpd response. */
typedef struct stream {
    nstf_server *srv;
    nstf_engine_req *er;
    int fd;
    nstf_api_out o;
    char id[48];
    nstf_sbuf out;
    size_t off;
    bool role_sent, ended;
} stream;

/* ---- small things ---------------------------------------------------------------------- */

static double now_ms(void) { return nstf_time_ms(); }

/* The client closed its end (or the socket failed): a peek reads end of
 * file or an error other than "nothing yet". */
static bool client_gone(int fd) {
    char b;
    const ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static void count_answer(nstf_server *s, int route, int status) {
    pthread_mutex_lock(&s->mu);
    int i = 0;
    while (i < s->n_codes && (s->codes[i].route != route || s->codes[i].status != status)) i++;
    if (i == s->n_codes && i < (int)(sizeof s->codes / sizeof s->codes[0])) {
        s->codes[i].route = route;
        s->codes[i].status = status;
        s->codes[i].n = 0;
        s->n_codes++;
    }
    if (i < s->n_codes) s->codes[i].n++;
    pthread_mutex_unlock(&s->mu);
}

static enum MHD_Result send_text(req *q, struct MHD_Connection *c, int status, char *body, const char *type,
                                 const char *retry_after) {
    if (!body) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
                                  "\"code\":null}}";
        body = strdup(oom);
        status = 500;
        type = "application/json";
        if (!body) return MHD_NO;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (retry_after) MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, retry_after);
    if (status == MHD_HTTP_UNAUTHORIZED) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, q->route == R_CHAT || q->route == R_COMPLETIONS ? "POST" : "GET");
    const enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    q->status = status;
    return ok;
}

static enum MHD_Result send_error(req *q, struct MHD_Connection *c, const nstf_api_error *err) {
    return send_text(q, c, err->status, nstf_api_error_json(err), "application/json",
                     err->status == MHD_HTTP_SERVICE_UNAVAILABLE ? "1" : NULL);
}

/* ---- connections and the watchdog ----------------------------------------------------------- */

static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    nstf_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        conn *c = calloc(1, sizeof *c);
        if (!c) return;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        c->fd = ci ? ci->connect_fd : -1;
        c->since = now_ms();
        pthread_mutex_lock(&s->mu);
        c->next = s->conns;
        if (s->conns) s->conns->prev = c;
        s->conns = c;
        s->n_conns++;
        pthread_mutex_unlock(&s->mu);
        *socket_context = c;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context) {
        conn *c = *socket_context;
        pthread_mutex_lock(&s->mu);
        if (c->prev) c->prev->next = c->next;
        else s->conns = c->next;
        if (c->next) c->next->prev = c->prev;
        s->n_conns--;
        pthread_mutex_unlock(&s->mu);
        free(c);
        *socket_context = NULL;
    }
}

static void *watchdog_main(void *arg) {
    nstf_server *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!atomic_load(&s->stopping)) {
        const double t = now_ms(), limit = s->p.read_timeout_s * 1e3;
        for (conn *c = s->conns; c; c = c->next)
            if (!c->busy && !c->cut && c->fd >= 0 && t - c->since > limit) {
                shutdown(c->fd, SHUT_RDWR);
                c->cut = true;
                s->n_cut++;
            }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 200000000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&s->wake, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void set_busy(nstf_server *s, conn *c, bool busy) {
    if (!c) return;
    pthread_mutex_lock(&s->mu);
    c->busy = busy;
    c->since = now_ms();
    pthread_mutex_unlock(&s->mu);
}

/* ---- completions ------------------------------------------------------------------------------ */

static int64_t piece(void *user, int32_t id, char *buf, size_t cap) {
    return nstf_engine_piece((const nstf_engine *)user, id, buf, cap);
}

/* Prompt tokens of a parsed request, its generation parameters, and the
 * engine's request; false fills err. */
static bool start(nstf_server *s, const nstf_api_req *ar, nstf_engine_req **out, int64_t *n_prompt, nstf_api_error *err) {
    int32_t *ids = NULL;
    int64_t n = 0;
    nstf_status st = NSTF_OK;
    if (ar->kind == NSTF_API_CHAT) st = nstf_engine_tokenize(s->e, NULL, true, ar->msgs, ar->n_msgs, &ids, &n);
    else if (ar->prompt) st = nstf_engine_tokenize(s->e, ar->prompt, false, NULL, 0, &ids, &n);
    else if (!(ids = malloc((size_t)ar->n_prompt_ids * sizeof *ids))) st = NSTF_ERR_OOM;
    else memcpy(ids, ar->prompt_ids, (size_t)(n = ar->n_prompt_ids) * sizeof *ids);
    if (st != NSTF_OK) {
        nstf_api_error_set(err, st == NSTF_ERR_OOM ? 500 : 400, st == NSTF_ERR_OOM ? "server_error" : "invalid_request_error",
                           NULL, ar->kind == NSTF_API_CHAT ? "messages" : "prompt", "%s", nstf_last_error());
        return false;
    }
    const int64_t ctx = nstf_engine_n_ctx(s->e);
    const char *what = ar->kind == NSTF_API_CHAT ? "messages" : "prompt";
    int64_t max = ar->max_tokens;
    bool ok = true;
    if (n >= ctx || (max > 0 && n + max > ctx)) {
        nstf_api_error_set(err, 400, "invalid_request_error", "context_length_exceeded", what,
                           "This model's maximum context length is %lld tokens. However, you requested %lld tokens "
                           "(%lld in the %s, %lld in the completion). Please reduce the length of the %s or "
                           "completion.",
                           (long long)ctx, (long long)(n + (max > 0 ? max : 0)), (long long)n, what,
                           (long long)(max > 0 ? max : 0), what);
        ok = false;
    } else if (max > s->p.max_tokens) {
        nstf_api_error_set(err, 400, "invalid_request_error", NULL, "max_tokens",
                           "max_tokens is %lld; this server generates at most %d tokens per request", (long long)max,
                           s->p.max_tokens);
        ok = false;
    }
    if (max < 0) max = ctx - n < s->p.max_tokens ? ctx - n : s->p.max_tokens;
    nstf_serve_gen_params gp = {.temperature = ar->top_p == 0 ? 0 : ar->temperature, .top_p = ar->top_p > 0 ? ar->top_p : 1,
                          .seed = ar->has_seed ? ar->seed : nstf_time_seed() ^ atomic_fetch_add(&s->next_id, 1),
                          .max_tokens = (int)max, .n_stop = ar->n_stop, .logprobs = ar->logprobs,
                          .timeout_s = s->p.timeout_s, .ignore_eos = ar->ignore_eos};
    for (int i = 0; i < ar->n_stop; i++) gp.stop[i] = ar->stop[i];
    if (ok && atomic_load(&s->draining)) {
        nstf_api_error_set(err, 503, "server_error", "shutting_down", NULL, "the server is shutting down");
        ok = false;
    }
    const nstf_engine_code code = ok ? nstf_engine_submit(s->e, &gp, ids, n, out) : NSTF_ENGINE_OK;
    free(ids);
    *n_prompt = n;
    if (!ok) return false;
    switch (code) {
    case NSTF_ENGINE_OK: return true;
    case NSTF_ENGINE_FULL:
        nstf_api_error_set(err, 503, "server_error", "overloaded", NULL,
                           "the server is busy (every sequence slot and the whole queue are taken); retry later");
        return false;
    case NSTF_ENGINE_DRAINING:
        nstf_api_error_set(err, 503, "server_error", "shutting_down", NULL, "the server is shutting down");
        return false;
    case NSTF_ENGINE_TOO_LONG:
        nstf_api_error_set(err, 400, "invalid_request_error", "context_length_exceeded", what,
                           "the %s and the completion do not fit the context of %lld tokens", what, (long long)ctx);
        return false;
    default:
        nstf_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory queueing the request");
        return false;
    }
}

static void api_out(nstf_server *s, nstf_api_out *o, const nstf_api_req *ar, char *id, size_t cap) {
    const unsigned long long k = atomic_fetch_add(&s->next_id, 1);
    snprintf(id, cap, "%s-%016llx%08llx", ar->kind == NSTF_API_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)s->id_salt, k);
    *o = (nstf_api_out){.kind = ar->kind, .id = id, .created = (int64_t)time(NULL), .model = s->model,
                        .logprobs = ar->logprobs, .usage = ar->include_usage, .piece = piece, .piece_user = s->e};
}

static void engine_error(const nstf_gen_chunk *c, nstf_api_error *err) {
    if (c->error == NSTF_ENGINE_TIMEOUT)
        nstf_api_error_set(err, 504, "server_error", "timeout", NULL, "%s", c->message);
    else nstf_api_error_set(err, 500, "server_error", NULL, NULL, "%s", c->message);
}

/* A whole answer: wait for the end (or for the client to leave). */
static enum MHD_Result answer_whole(req *q, struct MHD_Connection *mc, const nstf_api_req *ar, nstf_engine_req *er,
                                    int64_t n_prompt) {
    nstf_server *s = q->srv;
    nstf_sbuf text = {0};
    nstf_gen_token *toks = NULL;
    int64_t n_toks = 0;
    bool oom = false;
    for (;;) {
        nstf_gen_chunk c;
        if (!nstf_engine_req_read(er, 100, &c)) {
            if (client_gone(q->fd) || atomic_load(&s->stopping)) {
                nstf_engine_req_cancel(er);
                nstf_engine_req_release(er);
                nstf_sbuf_free(&text);
                free(toks);
                q->status = 499; /* the client closed the request */
                return MHD_NO;
            }
            continue;
        }
        nstf_sbuf_add(&text, c.text, (size_t)c.n_text);
        if (c.n_toks) {
            nstf_gen_token *t = realloc(toks, (size_t)(n_toks + c.n_toks) * sizeof *t);
            if (t) memcpy(t + n_toks, c.toks, (size_t)c.n_toks * sizeof *t), toks = t, n_toks += c.n_toks;
            else oom = true;
        }
        if (!c.done) {
            nstf_gen_chunk_free(&c);
            continue;
        }
        enum MHD_Result r;
        if (c.error || oom || text.oom) {
            nstf_api_error err;
            if (c.error) engine_error(&c, &err);
            else nstf_api_error_set(&err, 500, "server_error", NULL, NULL, "out of memory holding the answer");
            r = send_error(q, mc, &err);
        } else {
            nstf_api_out o;
            char id[48];
            api_out(s, &o, ar, id, sizeof id);
            o.text = text.p ? text.p : "";
            o.n_text = (int64_t)text.n;
            o.toks = toks;
            o.n_toks = (int)n_toks;
            o.finish = c.finish;
            o.n_prompt = n_prompt;
            o.n_gen = c.n_gen;
            o.n_cached = c.n_cached;
            r = send_text(q, mc, 200, nstf_api_response_json(&o), "application/json", NULL);
        }
        nstf_gen_chunk_free(&c);
        nstf_engine_req_release(er);
        nstf_sbuf_free(&text);
        free(toks);
        return r;
    }
}

static void sse(stream *st, char *json) {
    if (!json) {
        st->out.oom = true;
        return;
    }
    nstf_sbuf_add(&st->out, "data: ", 6);
    nstf_sbuf_add(&st->out, json, strlen(json));
    nstf_sbuf_add(&st->out, "\n\n", 2);
    free(json);
}

/* libmicrohttpd asks for the next bytes of a stream: wait for the engine. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *st = cls;
    while (st->off == st->out.n) {
        if (st->ended || st->out.oom) return st->ended && !st->out.oom ? MHD_CONTENT_READER_END_OF_STREAM
                                                                        : MHD_CONTENT_READER_END_WITH_ERROR;
        st->out.n = 0;
        st->off = 0;
        if (!st->role_sent) {
            st->role_sent = true;
            if (st->o.kind == NSTF_API_CHAT) {
                nstf_api_out o = st->o;
                o.role = true;
                sse(st, nstf_api_chunk_json(&o));
            }
            continue;
        }
        nstf_gen_chunk c;
        if (!nstf_engine_req_read(st->er, 100, &c)) {
            if (client_gone(st->fd) || atomic_load(&st->srv->stopping)) {
                nstf_engine_req_cancel(st->er);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            continue;
        }
        nstf_api_out o = st->o;
        o.text = c.text;
        o.n_text = c.n_text;
        o.toks = c.toks;
        o.n_toks = c.n_toks;
        if (c.n_text > 0 || c.n_toks > 0) sse(st, nstf_api_chunk_json(&o));
        if (c.done) {
            if (c.error) {
                nstf_api_error err;
                engine_error(&c, &err);
                sse(st, nstf_api_error_json(&err));
            } else {
                o.text = NULL, o.n_text = 0, o.toks = NULL, o.n_toks = 0;
                o.finish = c.finish;
                sse(st, nstf_api_chunk_json(&o));
                if (st->o.usage) {
                    o.n_gen = c.n_gen;
                    o.n_cached = c.n_cached;
                    sse(st, nstf_api_usage_chunk_json(&o));
                }
            }
            nstf_sbuf_add(&st->out, "data: [DONE]\n\n", 14);
            st->ended = true;
        }
        nstf_gen_chunk_free(&c);
    }
    const size_t n = st->out.n - st->off < max ? st->out.n - st->off : max;
    memcpy(buf, st->out.p + st->off, n);
    st->off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    stream *st = cls;
    if (!st->ended) nstf_engine_req_cancel(st->er); /* the client left mid-stream */
    nstf_engine_req_release(st->er);
    nstf_sbuf_free(&st->out);
    free(st);
}

static enum MHD_Result answer_stream(req *q, struct MHD_Connection *mc, const nstf_api_req *ar, nstf_engine_req *er,
                                     int64_t n_prompt) {
    stream *st = calloc(1, sizeof *st);
    struct MHD_Response *r = NULL;
    if (st) {
        st->srv = q->srv;
        st->er = er;
        st->fd = q->fd;
        api_out(q->srv, &st->o, ar, st->id, sizeof st->id);
        st->o.n_prompt = n_prompt;
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st, stream_free);
    }
    if (!r) {
        if (st) free(st);
        nstf_engine_req_cancel(er);
        nstf_engine_req_release(er);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    const enum MHD_Result ok = MHD_queue_response(mc, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    q->status = 200;
    return ok;
}

static enum MHD_Result completion(req *q, struct MHD_Connection *mc) {
    nstf_server *s = q->srv;
    nstf_api_req ar;
    nstf_api_error err;
    const nstf_api_kind kind = q->route == R_CHAT ? NSTF_API_CHAT : NSTF_API_COMPLETION;
    if (!nstf_api_parse(kind, q->body ? q->body : "", q->n_body, nstf_engine_n_vocab(s->e), &ar, &err))
        return send_error(q, mc, &err);
    nstf_engine_req *er = NULL;
    int64_t n_prompt = 0;
    enum MHD_Result r;
    if (!start(s, &ar, &er, &n_prompt, &err)) r = send_error(q, mc, &err);
    else if (ar.stream) r = answer_stream(q, mc, &ar, er, n_prompt);
    else r = answer_whole(q, mc, &ar, er, n_prompt);
    nstf_api_req_free(&ar);
    return r;
}

/* ---- metrics ----------------------------------------------------------------------------------- */

static char *metrics_text(nstf_server *s) {
    nstf_engine_stats st;
    nstf_engine_stats_get(s->e, &st);
    nstf_sbuf b = {0};
    nstf_prom_family(&b, "nstf_http_requests_total", "counter", "HTTP answers by route and status code");
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_codes; i++)
        nstf_sbuf_printf(&b, "nstf_http_requests_total{route=\"%s\",code=\"%d\"} %llu\n",
                         k_route_name[s->codes[i].route], s->codes[i].status, (unsigned long long)s->codes[i].n);
    const int n_conns = s->n_conns;
    const int64_t n_cut = s->n_cut;
    pthread_mutex_unlock(&s->mu);
    nstf_prom_gauge(&b, "nstf_http_connections", "open HTTP connections", n_conns);
    nstf_prom_counter(&b, "nstf_http_connections_cut_total",
                      "connections closed for not delivering a request within the read timeout", (double)n_cut);
    nstf_prom_counter(&b, "nstf_requests_submitted_total", "generation requests accepted", (double)st.submitted);
    nstf_prom_counter(&b, "nstf_requests_finished_total", "generation requests that ended normally", (double)st.finished);
    nstf_prom_counter(&b, "nstf_requests_cancelled_total", "requests cancelled by their client leaving", (double)st.cancelled);
    nstf_prom_counter(&b, "nstf_requests_timed_out_total", "requests ended by the per-request time limit", (double)st.timed_out);
    nstf_prom_counter(&b, "nstf_requests_failed_total", "requests ended by an error", (double)st.failed);
    nstf_prom_counter(&b, "nstf_requests_rejected_total", "requests refused with 503: queue full", (double)st.rejected_full);
    nstf_prom_counter(&b, "nstf_requests_preempted_total", "times a running request gave its KV blocks back to be recomputed",
                      (double)st.preempted);
    nstf_prom_gauge(&b, "nstf_requests_running", "requests holding a sequence slot", st.running);
    nstf_prom_gauge(&b, "nstf_requests_waiting", "requests in the queue (the queue length)", st.waiting);
    nstf_prom_gauge(&b, "nstf_sequence_slots", "sequences decoded together (-np)", st.n_seq);
    nstf_prom_gauge(&b, "nstf_queue_capacity", "requests that may wait beyond the free slots", st.max_queue);
    nstf_prom_counter(&b, "nstf_prompt_tokens_total", "prompt tokens of accepted requests", (double)st.prompt_tokens);
    nstf_prom_counter(&b, "nstf_prompt_tokens_cached_total", "prompt tokens whose KV came from the prefix cache",
                      (double)st.prompt_cached);
    nstf_prom_counter(&b, "nstf_generation_tokens_total", "tokens generated", (double)st.gen_tokens);
    nstf_prom_counter(&b, "nstf_steps_total", "scheduler steps (one forward each)", (double)st.steps);
    nstf_prom_counter(&b, "nstf_step_tokens_total", "tokens run through the model (prefill and decode)",
                      (double)st.step_tokens);
    nstf_prom_hist(&b, "nstf_batch_tokens", "tokens per step", &st.batch_tokens);
    nstf_prom_hist(&b, "nstf_batch_sequences", "sequences per step (the batch size)", &st.batch_seqs);
    nstf_prom_gauge(&b, "nstf_kv_blocks_total", "KV cache blocks", st.kv_blocks);
    nstf_prom_gauge(&b, "nstf_kv_block_size", "positions per KV block", st.kv_block);
    nstf_prom_gauge(&b, "nstf_kv_blocks_used", "KV blocks held by running sequences", st.kv_used);
    nstf_prom_gauge(&b, "nstf_kv_blocks_cached", "free KV blocks still holding a reusable prefix", st.kv_cached);
    nstf_prom_gauge(&b, "nstf_kv_cache_usage_ratio", "KV blocks used / blocks", st.kv_blocks ? (double)st.kv_used / st.kv_blocks : 0);
    nstf_prom_counter(&b, "nstf_kv_prefix_hits_total", "KV blocks taken from the prefix cache", (double)st.kv_hits);
    nstf_prom_counter(&b, "nstf_kv_evictions_total", "cached prefix blocks reclaimed for other contents",
                      (double)st.kv_evicted);
    nstf_prom_gauge(&b, "nstf_context_tokens", "positions one request may use", (double)st.n_ctx_seq);
    nstf_prom_hist(&b, "nstf_time_to_first_token_seconds", "arrival to first generated token", &st.ttft);
    nstf_prom_hist(&b, "nstf_inter_token_latency_seconds", "time between a request's consecutive tokens", &st.itl);
    nstf_prom_hist(&b, "nstf_request_duration_seconds", "arrival to the end, of requests that ended normally", &st.e2e);
    nstf_prom_hist(&b, "nstf_queue_time_seconds", "arrival to first admission", &st.queue);
    nstf_prom_gauge(&b, "nstf_draining", "1 while the server shuts down", st.draining);
    if (b.oom) {
        nstf_sbuf_free(&b);
        return NULL;
    }
    return b.p;
}

/* ---- routing ------------------------------------------------------------------------------------ */

static int route_of(const char *url) {
    static const struct { const char *path; int route; } routes[] = {
        {"/v1/chat/completions", R_CHAT}, {"/v1/completions", R_COMPLETIONS}, {"/v1/models", R_MODELS},
        {"/health", R_HEALTH},           {"/metrics", R_METRICS},
    };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(url, routes[i].path)) return routes[i].route;
    return R_NONE;
}

static bool key_ok(const nstf_server *s, struct MHD_Connection *mc) {
    if (!s->p.api_key) return true;
    const char *h = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7) != 0) return false;
    const char *k = h + 7, *want = s->p.api_key;
    const size_t n = strlen(k), m = strlen(want);
    unsigned diff = (unsigned)(n != m);
    for (size_t i = 0; i < m; i++) diff |= (unsigned char)want[i] ^ (unsigned char)(i < n ? k[i] : 0);
    return diff == 0;
}

/* What is wrong with a request before its body is read (0: nothing). */
static void check_head(req *q, struct MHD_Connection *mc, const char *method) {
    nstf_server *s = q->srv;
    const bool post = q->route == R_CHAT || q->route == R_COMPLETIONS;
    nstf_api_error *e = &q->early;
    if (!key_ok(s, mc)) {
        nstf_api_error_set(e, 401, "invalid_request_error", "invalid_api_key", NULL,
                           "Incorrect API key provided: give it as 'Authorization: Bearer KEY'");
        return;
    }
    if (q->route == R_NONE) {
        nstf_api_error_set(e, 404, "invalid_request_error", "not_found", NULL, "no such endpoint");
        return;
    }
    if (strcmp(method, post ? "POST" : "GET") != 0) {
        nstf_api_error_set(e, 405, "invalid_request_error", "method_not_allowed", NULL, "%s takes %s",
                           k_route_name[q->route], post ? "POST" : "GET");
        return;
    }
    const char *len = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (len) {
        char *end;
        errno = 0;
        const unsigned long long v = strtoull(len, &end, 10);
        if (errno || *end || v > (unsigned long long)s->p.max_body)
            nstf_api_error_set(e, 413, "invalid_request_error", "request_too_large", NULL,
                               "the body is larger than the %lld bytes this server takes", (long long)s->p.max_body);
    }
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    nstf_server *s = cls;
    req *q = *con_cls;
    if (!q) { /* the head is in */
        if (!(q = calloc(1, sizeof *q))) return MHD_NO;
        q->srv = s;
        q->route = route_of(url);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        q->c = ci ? ci->socket_context : NULL;
        ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        q->fd = ci ? ci->connect_fd : -1;
        *con_cls = q;
        check_head(q, mc, method);
        /* refuse at once: the body is not read (the connection closes after the answer) */
        if (q->early.status) return send_error(q, mc, &q->early);
        return MHD_YES;
    }
    if (*upload_size) { /* body bytes */
        const size_t n = *upload_size;
        *upload_size = 0;
        if (q->early.status) return MHD_YES;
        if (q->n_body + n > (size_t)s->p.max_body) { /* a chunked body grew too large: the rest is dropped as
                                                        it comes (the read timeout bounds it), the answer follows */
            nstf_api_error_set(&q->early, 413, "invalid_request_error", "request_too_large", NULL,
                               "the body is larger than the %lld bytes this server takes", (long long)s->p.max_body);
            free(q->body);
            q->body = NULL;
            q->n_body = q->cap_body = 0;
            return MHD_YES;
        }
        if (q->n_body + n + 1 > q->cap_body) {
            size_t cap = q->cap_body ? q->cap_body : 4096;
            while (cap < q->n_body + n + 1) cap *= 2;
            char *b = realloc(q->body, cap);
            if (!b) return MHD_NO;
            q->body = b;
            q->cap_body = cap;
        }
        memcpy(q->body + q->n_body, upload, n);
        q->n_body += n;
        return MHD_YES;
    }
    if (q->status) return MHD_YES; /* answered already */
    if (q->early.status) return send_error(q, mc, &q->early);
    set_busy(s, q->c, true);
    switch (q->route) {
    case R_HEALTH: {
        const bool d = atomic_load(&s->draining);
        return send_text(q, mc, d ? 503 : 200, strdup(d ? "{\"status\":\"shutting down\"}" : "{\"status\":\"ok\"}"),
                         "application/json", d ? "1" : NULL);
    }
    case R_MODELS:
        return send_text(q, mc, 200, nstf_api_models_json(s->model, s->created, nstf_engine_n_ctx(s->e)),
                         "application/json", NULL);
    case R_METRICS: return send_text(q, mc, 200, metrics_text(s), "text/plain; version=0.0.4; charset=utf-8", NULL);
    default: return completion(q, mc);
    }
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode why) {
    (void)mc;
    nstf_server *s = cls;
    req *q = *con_cls;
    if (!q) return;
    (void)why; /* a stream the client left is counted by its status; the engine counts the cancel */
    count_answer(s, q->route, q->status ? q->status : 499); /* 499: the client left before an answer */
    set_busy(s, q->c, false);
    free(q->body);
    free(q);
    *con_cls = NULL;
}

/* ---- the server ----------------------------------------------------------------------------------- */

nstf_server_params nstf_server_default_params(void) {
    return (nstf_server_params){.host = "127.0.0.1", .port = 8080, .n_seq = 4, .n_ctx = 4096, .kv_block = 16,
                                .n_batch = 256, .max_queue = 64, .device = "auto", .max_body = 1 << 20,
                                .max_tokens = 4096, .timeout_s = 600, .read_timeout_s = 30, .max_conns = 256};
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    const nstf_server *s = cls;
    if (!s->p.verbose) return;
    fprintf(stderr, "nstf serve: http: ");
    vfprintf(stderr, fmt, ap);
}

/* The engine's parameters of a server's. */
static nstf_engine_params engine_params(const nstf_server_params *p) {
    nstf_engine_params ep = nstf_engine_default_params();
    ep.model = p->model;
    ep.n_seq = p->n_seq;
    ep.n_ctx = p->n_ctx;
    ep.kv_block = p->kv_block;
    ep.n_batch = p->n_batch;
    ep.max_queue = p->max_queue;
    ep.n_threads = p->n_threads;
    ep.device = p->device;
    ep.n_tp = p->n_tp;
    ep.gpus = p->gpus;
    ep.tp_timeout_ms = p->tp_timeout_ms;
    ep.verbose = p->verbose;
    return ep;
}

nstf_status nstf_server_follow(const nstf_server_params *pp) {
    const nstf_server_params p = pp ? *pp : nstf_server_default_params();
    const nstf_engine_params ep = engine_params(&p);
    return nstf_engine_follow(&ep);
}

nstf_status nstf_server_start(const nstf_server_params *pp, nstf_server **out) {
    *out = NULL;
    const nstf_server_params p = *pp;
    if (p.port < 0 || p.port > 65535) return nstf_set_error(NSTF_ERR_INVALID_ARG, "port %d is not 0..65535", p.port);
    if (p.max_body < 16 || p.max_tokens < 1 || !(p.timeout_s > 0) || !(p.read_timeout_s > 0) || p.max_conns < 1)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "limits: body %lld bytes, %d tokens, %g s, read %g s, %d connections",
                              (long long)p.max_body, p.max_tokens, p.timeout_s, p.read_timeout_s, p.max_conns);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", p.port);
    const int gai = getaddrinfo(p.host ? p.host : "127.0.0.1", port, &hints, &ai);
    if (gai != 0 || !ai)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "--host %s: %s", p.host ? p.host : "", gai_strerror(gai));
    nstf_server *s = calloc(1, sizeof *s);
    if (!s) {
        freeaddrinfo(ai);
        return NSTF_ERR_OOM;
    }
    s->p = p;
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->wake, &ca);
    pthread_condattr_destroy(&ca);
    s->created = (int64_t)time(NULL);
    s->id_salt = nstf_time_seed();
    const nstf_engine_params ep = engine_params(&p);
    nstf_status st = nstf_engine_create(&ep, &s->e);
    if (st == NSTF_OK) {
        snprintf(s->model, sizeof s->model, "%s", p.alias ? p.alias : nstf_engine_model_name(s->e));
        if (nstf_thread_start(&s->watchdog, watchdog_main, s) != 0)
            st = nstf_set_error(NSTF_ERR_OOM, "cannot start the connection watchdog");
        else s->watchdog_started = true;
    }
    if (st == NSTF_OK) {
        const unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG |
                               MHD_USE_ITC | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
        s->d = MHD_start_daemon(flags, (uint16_t)p.port, NULL, NULL, handle, s,
                                MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                                MHD_OPTION_CONNECTION_LIMIT, (unsigned)p.max_conns,
                                MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(p.read_timeout_s + 1),
                                MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                                MHD_OPTION_THREAD_STACK_SIZE, (size_t)(512 * 1024),
                                MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                                MHD_OPTION_END);
        if (!s->d)
            st = nstf_set_error(NSTF_ERR_IO, "cannot listen on %s port %d (%s)", p.host ? p.host : "127.0.0.1", p.port,
                                errno ? strerror(errno) : "address in use or not available");
    }
    freeaddrinfo(ai);
    if (st == NSTF_OK) {
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
        s->port = di ? di->port : p.port;
    }
    if (st != NSTF_OK) {
        nstf_server_stop(s);
        return st;
    }
    *out = s;
    return NSTF_OK;
}

int nstf_server_port(const nstf_server *s) { return s->port; }

/* Whether some connection is still answering a request. */
static bool answering(nstf_server *s) {
    bool any = false;
    pthread_mutex_lock(&s->mu);
    for (const conn *c = s->conns; c && !any; c = c->next) any = c->busy;
    pthread_mutex_unlock(&s->mu);
    return any;
}

bool nstf_server_drain(nstf_server *s, double timeout_s) {
    atomic_store(&s->draining, true);
    const double until = now_ms() + timeout_s * 1e3;
    if (!nstf_engine_drain(s->e, timeout_s)) return false;
    /* the engine is done, but a stream's last tokens and [DONE] may still
     * be on their way out: wait for every answer to be sent */
    while (answering(s)) {
        if (now_ms() >= until) return false;
        const struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return true;
}

void nstf_server_stop(nstf_server *s) {
    if (!s) return;
    atomic_store(&s->draining, true);
    atomic_store(&s->stopping, true); /* handlers and streams cancel what still runs */
    if (s->d) MHD_stop_daemon(s->d);
    if (s->watchdog_started) {
        pthread_mutex_lock(&s->mu);
        pthread_cond_broadcast(&s->wake);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->watchdog, NULL);
    }
    nstf_engine_free(s->e);
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
