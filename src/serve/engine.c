/* engine.c — the serving engine (engine.h): requests and their output,
 * the scheduler thread (admission, step planning, preemption, one forward
 * per step), sampling with log-probabilities, detokenization and stop
 * strings.
 *
 * Locking: one mutex (e->mu) guards the queues, every request's shared
 * part (output, state, reference count) and the statistics. The scheduler
 * holds it while it plans a step and while it hands out the step's
 * tokens, never during the forward; requests in the step cannot go away
 * meanwhile (the engine holds a reference to each request it runs). */
#include "serve/engine.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/mem.h"
#include "core/threadpool.h"
#include "model/session.h"
#include "serve/kv_pages.h"

enum { REQ_WAITING, REQ_RUNNING, REQ_DONE };

struct nstf_engine_req {
    nstf_engine *e;
    int refs;                        /* the engine's and the reader's */
    nstf_serve_gen_params gp;              /* gp.stop point into stop_copy */
    char *stop_copy[NSTF_MAX_STOP];
    int64_t n_prompt;
    double t_submit, t_first, t_last; /* ms, monotonic */
    /* the scheduler's own */
    int32_t *tokens;                 /* [cap] prompt, then what was generated */
    int64_t n_tokens, cap;
    int64_t n_computed;              /* leading positions whose K/V are in the cache */
    int slot;                        /* sequence slot while running, else -1 */
    int64_t order;                   /* admission order: the youngest is preempted first */
    int chunk;                       /* tokens this step */
    nstf_sampler smp;
    int64_t n_gen, n_cached;
    bool admitted;
    nstf_engine_req *prev, *next;    /* the waiting queue */
    /* shared with the reader, under e->mu */
    int state;
    atomic_bool cancel;
    char *text;                      /* output bytes; [0, stable) are final */
    int64_t n_text, cap_text, stable;
    nstf_gen_token *toks;            /* every emitted token, in text order */
    int64_t n_toks, cap_toks;
    int64_t read_text, read_toks;    /* what the reader has taken */
    const char *finish;
    nstf_engine_code error;
    char message[200];
    pthread_cond_t cv;
};

struct nstf_engine {
    nstf_engine_params p;
    nstf_session *s;
    nstf_kv_pages *pages;
    char name[256];
    int n_seq, block, n_batch;
    int64_t seq_ctx;
    int32_t n_vocab;
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t work, idle;
    bool stop, draining;
    nstf_engine_req *wait_head, *wait_tail;
    int n_waiting, n_running;
    nstf_engine_req **slots;         /* [n_seq] */
    int64_t next_order;
    /* one step (the scheduler's) */
    nstf_engine_req **plan;          /* [n_seq] running requests, oldest first */
    int32_t *bt, *bp, *bseq;         /* [n_batch] */
    int32_t *rows;                   /* [n_seq] rows sampled: those needing their logits first */
    nstf_engine_req **row_req;       /* [n_seq] */
    int32_t *rows_tmp;               /* [n_seq] (ordering the rows) */
    nstf_engine_req **req_tmp;       /* [n_seq] */
    float *logits;                   /* [n_seq, n_vocab] the rows that need them */
    int32_t *argmax;                 /* [n_seq] every sampled row's greedy token (from the backend) */
    nstf_engine_stats st;
};

static double now_ms(void) { return nstf_time_ms(); }

/* A condition variable on the monotonic clock, and a wait of at most ms. */
static void cond_init(pthread_cond_t *c) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
}

static void cond_wait_ms(pthread_cond_t *c, pthread_mutex_t *m, double ms) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const int64_t ns = (int64_t)ts.tv_nsec + (int64_t)(ms * 1e6);
    ts.tv_sec += (time_t)(ns / 1000000000);
    ts.tv_nsec = (long)(ns % 1000000000);
    pthread_cond_timedwait(c, m, &ts);
}

nstf_engine_params nstf_engine_default_params(void) {
    return (nstf_engine_params){.n_seq = 4, .n_ctx = 4096, .kv_block = 16, .n_batch = 256, .max_queue = 64,
                                .device = "auto"};
}

const char *nstf_engine_model_name(const nstf_engine *e) { return e->name; }
int64_t nstf_engine_n_ctx(const nstf_engine *e) { return e->seq_ctx; }
int32_t nstf_engine_n_vocab(const nstf_engine *e) { return e->n_vocab; }
int64_t nstf_engine_piece(const nstf_engine *e, int32_t id, char *buf, size_t cap) {
    return nstf_tokenizer_piece(e->s->tok, id, buf, cap);
}

/* ---- requests ------------------------------------------------------------------------ */

static void req_free(nstf_engine_req *r) {
    for (int i = 0; i < NSTF_MAX_STOP; i++) free(r->stop_copy[i]);
    nstf_sampler_free(&r->smp);
    free(r->tokens);
    free(r->text);
    free(r->toks);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* under e->mu */
static void req_unref(nstf_engine_req *r) {
    if (--r->refs == 0) req_free(r);
}

static void queue_unlink(nstf_engine *e, nstf_engine_req *r) {
    if (r->prev) r->prev->next = r->next;
    else e->wait_head = r->next;
    if (r->next) r->next->prev = r->prev;
    else e->wait_tail = r->prev;
    r->prev = r->next = NULL;
    e->n_waiting--;
}

static void queue_push(nstf_engine *e, nstf_engine_req *r, bool front) {
    r->prev = front ? NULL : e->wait_tail;
    r->next = front ? e->wait_head : NULL;
    if (front) {
        if (e->wait_head) e->wait_head->prev = r;
        else e->wait_tail = r;
        e->wait_head = r;
    } else {
        if (e->wait_tail) e->wait_tail->next = r;
        else e->wait_head = r;
        e->wait_tail = r;
    }
    e->n_waiting++;
}

/* Leave the running set: the sequence's blocks lose their user. */
static void unschedule(nstf_engine *e, nstf_engine_req *r) {
    if (r->slot >= 0) {
        nstf_kv_seq_end(e->pages, r->slot);
        e->slots[r->slot] = NULL;
        r->slot = -1;
        e->n_running--;
    } else if (r->state == REQ_WAITING) {
        queue_unlink(e, r);
    }
}

/* The request ends (under e->mu): everything it produced is final, its
 * reader is woken, the engine drops its reference. */
static void finish(nstf_engine *e, nstf_engine_req *r, const char *why, nstf_engine_code err, const char *msg) {
    unschedule(e, r);
    r->state = REQ_DONE;
    r->finish = err ? NULL : why;
    r->error = err;
    if (msg) snprintf(r->message, sizeof r->message, "%s", msg);
    r->stable = r->n_text;
    const double t = now_ms();
    if (err == NSTF_ENGINE_OK) {
        e->st.finished++;
        nstf_hist_add(&e->st.e2e, (t - r->t_submit) / 1e3);
    } else if (err == NSTF_ENGINE_TIMEOUT) {
        e->st.timed_out++;
    } else if (atomic_load(&r->cancel)) {
        e->st.cancelled++;
    } else {
        e->st.failed++;
    }
    pthread_cond_broadcast(&r->cv);
    req_unref(r);
    if (e->n_running == 0 && e->n_waiting == 0) pthread_cond_broadcast(&e->idle);
}

/* ---- text ----------------------------------------------------------------------------- */

static bool grow(void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return true;
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

/* Bytes at the end of t that begin a UTF-8 character not yet complete. */
static int64_t utf8_tail(const char *t, int64_t n) {
    for (int k = 1; k <= 3 && k <= n; k++) {
        const unsigned char c = (unsigned char)t[n - k];
        if ((c & 0xc0) == 0x80) continue;
        const int len = c >= 0xf0 && c < 0xf8 ? 4 : c >= 0xe0 && c < 0xf0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 1;
        return len > k ? k : 0;
    }
    return 0;
}

/* The longest end of t that is the beginning of a stop string. */
static int64_t stop_tail(const char *t, int64_t n, const nstf_serve_gen_params *gp) {
    int64_t hold = 0;
    for (int i = 0; i < gp->n_stop; i++) {
        const int64_t len = (int64_t)strlen(gp->stop[i]);
        for (int64_t k = len - 1 < n ? len - 1 : n; k > hold; k--)
            if (!memcmp(t + n - k, gp->stop[i], (size_t)k)) {
                hold = k;
                break;
            }
    }
    return hold;
}

/* The first stop string found in t[from..n), as its offset; -1: none. */
static int64_t stop_find(const char *t, int64_t n, int64_t from, const nstf_serve_gen_params *gp) {
    int64_t best = -1;
    for (int i = 0; i < gp->n_stop; i++) {
        const int64_t len = (int64_t)strlen(gp->stop[i]);
        for (int64_t at = from; at + len <= n && (best < 0 || at < best); at++)
            if (!memcmp(t + at, gp->stop[i], (size_t)len)) {
                best = at;
                break;
            }
    }
    return best;
}

/* ---- sampling --------------------------------------------------------------------------- */

/* The token's log-probability under the model and its k most likely
 * alternatives (ties: the lower id first). */
static void logprobs(const float *l, int nv, int32_t id, int k, nstf_gen_token *t) {
    float m = l[0];
    for (int i = 1; i < nv; i++) m = l[i] > m ? l[i] : m;
    double sum = 0;
    for (int i = 0; i < nv; i++) sum += exp((double)l[i] - m);
    const double lse = m + log(sum);
    t->logprob = (float)(l[id] - lse);
    t->n_top = 0;
    for (int i = 0; i < nv && k > 0; i++) { /* insertion into a sorted list of at most k */
        if (t->n_top == k && l[i] <= l[t->top_id[k - 1]]) continue;
        int j = t->n_top < k ? t->n_top++ : k - 1;
        while (j > 0 && l[t->top_id[j - 1]] < l[i]) {
            t->top_id[j] = t->top_id[j - 1];
            j--;
        }
        t->top_id[j] = i;
    }
    for (int j = 0; j < t->n_top; j++) t->top_logprob[j] = (float)(l[t->top_id[j]] - lse);
}

/* Whether a request's next token needs its row of logits on the host: a
 * draw, or log-probabilities. A greedy one without them needs only the
 * greedy token, which the backend computes (first index of the maximum,
 * as the sampler's greedy choice). */
static bool needs_logits(const nstf_engine_req *r) { return r->gp.temperature > 0.0f || r->gp.logprobs >= 0; }

/* One sampled token (under e->mu): emitted or the end. logits: the row's
 * logits when needs_logits(r), else NULL and greedy is the token. */
static void emit(nstf_engine *e, nstf_engine_req *r, const float *logits, int32_t greedy) {
    const nstf_tokenizer *tok = e->s->tok;
    nstf_gen_token t = {0};
    const int32_t id = logits ? nstf_sampler_sample(&r->smp, logits) : greedy;
    nstf_sampler_accept(&r->smp, id);
    if (logits && r->gp.logprobs >= 0) logprobs(logits, e->n_vocab, id, r->gp.logprobs, &t);
    const double now = now_ms();
    if (r->n_gen == 0 && r->t_first == 0) {
        r->t_first = now;
        nstf_hist_add(&e->st.ttft, (now - r->t_submit) / 1e3);
    } else if (r->t_last > 0) {
        nstf_hist_add(&e->st.itl, (now - r->t_last) / 1e3);
    }
    r->t_last = now;
    r->n_gen++;
    e->st.gen_tokens++;
    if (!r->gp.ignore_eos && nstf_tokenizer_is_eog(tok, id)) {
        finish(e, r, "stop", NSTF_ENGINE_OK, NULL);
        return;
    }
    char small[256], *piece = small;
    int64_t len = nstf_tokenizer_piece(tok, id, small, sizeof small);
    if (len > (int64_t)sizeof small) {
        piece = malloc((size_t)len);
        if (piece) len = nstf_tokenizer_piece(tok, id, piece, (size_t)len);
    }
    if (len < 0) len = 0;
    const int64_t before = r->n_text;
    if (!piece || !grow((void **)&r->text, &r->cap_text, r->n_text + len + 1, 1) ||
        !grow((void **)&r->toks, &r->cap_toks, r->n_toks + 1, sizeof *r->toks) ||
        !grow((void **)&r->tokens, &r->cap, r->n_tokens + 1, sizeof *r->tokens)) {
        if (piece != small) free(piece);
        finish(e, r, NULL, NSTF_ENGINE_FAILED, "out of memory holding the generated text");
        return;
    }
    memcpy(r->text + r->n_text, piece, (size_t)len);
    if (piece != small) free(piece);
    r->n_text += len;
    r->text[r->n_text] = 0;
    t.id = id;
    t.text_at = before;
    t.n_bytes = (int32_t)len;
    r->toks[r->n_toks++] = t;
    r->tokens[r->n_tokens++] = id;
    int64_t max_len = 0;
    for (int i = 0; i < r->gp.n_stop; i++) {
        const int64_t l = (int64_t)strlen(r->gp.stop[i]);
        max_len = l > max_len ? l : max_len;
    }
    const int64_t from = before - (max_len - 1) > 0 ? before - (max_len - 1) : 0;
    const int64_t at = r->gp.n_stop ? stop_find(r->text, r->n_text, from, &r->gp) : -1;
    if (at >= 0) {
        r->n_text = at;
        r->text[at] = 0;
        while (r->n_toks > 0 && r->toks[r->n_toks - 1].text_at >= at) r->n_toks--;
        finish(e, r, "stop", NSTF_ENGINE_OK, NULL);
        return;
    }
    /* a sampled token is fed back at its position: it must be in the context */
    if (r->n_gen >= r->gp.max_tokens || r->n_tokens > e->seq_ctx) {
        finish(e, r, "length", NSTF_ENGINE_OK, NULL);
        return;
    }
    const int64_t hold = utf8_tail(r->text, r->n_text), sh = stop_tail(r->text, r->n_text, &r->gp);
    const int64_t stable = r->n_text - (hold > sh ? hold : sh);
    if (stable > r->stable) r->stable = stable;
    pthread_cond_broadcast(&r->cv);
}

/* ---- the scheduler ---------------------------------------------------------------------- */

/* Cancelled and timed-out requests leave. */
static void reap(nstf_engine *e) {
    const double t = now_ms();
    for (int i = 0; i < e->n_seq; i++) {
        nstf_engine_req *r = e->slots[i];
        if (!r) continue;
        if (atomic_load(&r->cancel)) finish(e, r, NULL, NSTF_ENGINE_FAILED, "cancelled");
        else if (r->gp.timeout_s > 0 && t - r->t_submit > r->gp.timeout_s * 1e3)
            finish(e, r, NULL, NSTF_ENGINE_TIMEOUT, "the request ran past its time limit");
    }
    for (nstf_engine_req *r = e->wait_head, *next; r; r = next) {
        next = r->next;
        if (atomic_load(&r->cancel)) finish(e, r, NULL, NSTF_ENGINE_FAILED, "cancelled");
        else if (r->gp.timeout_s > 0 && t - r->t_submit > r->gp.timeout_s * 1e3)
            finish(e, r, NULL, NSTF_ENGINE_TIMEOUT, "the request ran past its time limit while it waited");
    }
}

/* Waiting requests take free slots in order while the pool has blocks for
 * their tokens beyond the prefix they share, plus one block of headroom
 * per running sequence (so that admitting does not force a preemption at
 * once). */
static void admit(nstf_engine *e) {
    while (e->wait_head && e->n_running < e->n_seq) {
        nstf_engine_req *r = e->wait_head;
        int idle = 0;
        const int shared = nstf_kv_pages_probe(e->pages, r->tokens, r->n_tokens, &idle);
        const int64_t need = (r->n_tokens + e->block - 1) / e->block - shared;
        if (nstf_kv_pages_available(e->pages) - idle < need + e->n_running) break;
        int slot = 0;
        while (e->slots[slot]) slot++;
        queue_unlink(e, r);
        r->slot = slot;
        e->slots[slot] = r;
        e->n_running++;
        r->state = REQ_RUNNING;
        r->order = e->next_order++;
        r->n_computed = nstf_kv_seq_begin(e->pages, slot, r->tokens, r->n_tokens);
        if (!r->admitted) {
            r->admitted = true;
            r->n_cached = r->n_computed;
            e->st.prompt_cached += r->n_computed;
            nstf_hist_add(&e->st.queue, (now_ms() - r->t_submit) / 1e3);
        }
    }
}

static int by_order(const void *a, const void *b) {
    const nstf_engine_req *x = *(nstf_engine_req *const *)a, *y = *(nstf_engine_req *const *)b;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* The youngest running request gives its blocks back and waits at the
 * head of the queue, to be recomputed with what it generated. */
static void preempt(nstf_engine *e, nstf_engine_req *r) {
    nstf_kv_seq_end(e->pages, r->slot);
    e->slots[r->slot] = NULL;
    r->slot = -1;
    e->n_running--;
    r->n_computed = 0;
    r->chunk = 0;
    r->state = REQ_WAITING;
    queue_push(e, r, true);
    e->st.preempted++;
}

/* This step's batch (under e->mu): decodes first, then prefill chunks,
 * oldest first, within n_batch tokens; blocks for every new position.
 * Returns the number of tokens (0: nothing to run); *n_rows the rows
 * whose logits are sampled, ordered so that the *n_host that need their
 * logits on the host come first; *prompt whether any row is a prompt's
 * (or a preempted request's recomputed) token. */
static int plan(nstf_engine *e, int *n_rows, int *n_host, int *n_plan, bool *prompt) {
    int np = 0;
    for (int i = 0; i < e->n_seq; i++)
        if (e->slots[i]) e->plan[np++] = e->slots[i];
    qsort(e->plan, (size_t)np, sizeof *e->plan, by_order);
    int budget = e->n_batch;
    for (int i = 0; i < np; i++) {
        nstf_engine_req *r = e->plan[i];
        r->chunk = r->n_tokens - r->n_computed == 1 ? 1 : 0;
        budget -= r->chunk;
    }
    for (int i = 0; i < np && budget > 0; i++) {
        nstf_engine_req *r = e->plan[i];
        const int64_t left = r->n_tokens - r->n_computed;
        if (left > 1) {
            r->chunk = (int)(left < budget ? left : budget);
            budget -= r->chunk;
        }
    }
    for (int i = 0; i < np; i++) {
        nstf_engine_req *r = e->plan[i];
        while (r->slot >= 0 && r->chunk > 0 && !nstf_kv_seq_reserve(e->pages, r->slot, r->n_computed + r->chunk)) {
            nstf_engine_req *victim = NULL;
            for (int j = np - 1; j >= i && !victim; j--)
                if (e->plan[j]->slot >= 0) victim = e->plan[j];
            preempt(e, victim);
        }
    }
    int n = 0, nr = 0, kept = 0;
    *prompt = false;
    for (int i = 0; i < np; i++) {
        nstf_engine_req *r = e->plan[i];
        if (r->slot < 0 || r->chunk == 0) continue;
        e->plan[kept++] = r;
        *prompt = *prompt || r->chunk > 1 || r->n_computed < r->n_prompt;
        for (int j = 0; j < r->chunk; j++) {
            e->bt[n] = r->tokens[r->n_computed + j];
            e->bp[n] = (int32_t)(r->n_computed + j);
            e->bseq[n] = r->slot;
            n++;
        }
        if (r->n_computed + r->chunk == r->n_tokens) {
            e->rows[nr] = n - 1;
            e->row_req[nr++] = r;
        }
    }
    int nh = 0, ng = 0;
    for (int i = 0; i < nr; i++) nh += needs_logits(e->row_req[i]);
    for (int i = 0, h = 0; i < nr; i++) { /* stable: those needing logits, then the greedy ones */
        const int at = needs_logits(e->row_req[i]) ? h++ : nh + ng++;
        e->rows_tmp[at] = e->rows[i];
        e->req_tmp[at] = e->row_req[i];
    }
    memcpy(e->rows, e->rows_tmp, (size_t)nr * sizeof *e->rows);
    memcpy(e->row_req, e->req_tmp, (size_t)nr * sizeof *e->row_req);
    *n_rows = nr;
    *n_host = nh;
    *n_plan = kept;
    return n;
}

static void *engine_main(void *arg) {
    nstf_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->stop && e->n_running == 0 && e->n_waiting == 0) pthread_cond_wait(&e->work, &e->mu);
        if (e->stop) break;
        reap(e);
        admit(e);
        int n_rows = 0, n_host = 0, n_plan = 0;
        bool prompt = false;
        const int n = plan(e, &n_rows, &n_host, &n_plan, &prompt);
        if (n == 0) { /* nothing could run (not expected): wait for a change rather than spin */
            cond_wait_ms(&e->work, &e->mu, 20);
            continue;
        }
        /* the sampled rows' greedy tokens come from the backend, and only
         * the rows that need their logits cross to the host; prompt rows
         * are computed alike whatever their count (a repeated request whose
         * prompt partly came from the prefix cache gives the same numbers) */
        const nstf_batch b = {.tokens = e->bt, .pos = e->bp, .seq = e->bseq, .n = n, .rows = n_rows ? e->rows : NULL,
                              .n_rows = n_rows, .blocks = nstf_kv_pages_table(e->pages), .argmax_rows = n_rows > 0,
                              .host_rows = n_host, .row_invariant = prompt};
        pthread_mutex_unlock(&e->mu);
        nstf_status st = nstf_llama_forward(e->s->run, &b, n_host ? e->logits : NULL, n_rows ? e->argmax : NULL);
        pthread_mutex_lock(&e->mu);
        e->st.steps++;
        e->st.step_tokens += n;
        nstf_hist_add(&e->st.batch_tokens, n);
        nstf_hist_add(&e->st.batch_seqs, n_plan);
        for (int i = 0; i < n_plan; i++) {
            nstf_engine_req *r = e->plan[i];
            if (st != NSTF_OK) {
                char msg[200];
                snprintf(msg, sizeof msg, "the forward failed: %s", nstf_last_error());
                finish(e, r, NULL, NSTF_ENGINE_FAILED, msg);
                continue;
            }
            r->n_computed += r->chunk;
            nstf_kv_seq_commit(e->pages, r->slot, r->tokens, r->n_computed);
        }
        for (int i = 0; st == NSTF_OK && i < n_rows; i++)
            emit(e, e->row_req[i], i < n_host ? e->logits + (size_t)i * (size_t)e->n_vocab : NULL, e->argmax[i]);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ---- the engine -------------------------------------------------------------------------- */

static const char *base_name(const char *path) {
    const char *b = path;
    for (const char *p = path; *p; p++)
        if (*p == '/' && p[1]) b = p + 1;
    return b;
}

/* The engine's session: the paged cache of p's shape (shared by
 * nstf_engine_create and nstf_engine_follow, whose ranks must match). */
static nstf_status open_session(const nstf_engine_params *p, nstf_session **out) {
    const int n_blocks = (int)(((int64_t)p->n_ctx + p->kv_block - 1) / p->kv_block);
    nstf_session_params sp = nstf_session_default_params();
    sp.n_threads = p->n_threads;
    sp.device = p->device ? p->device : "auto";
    sp.n_tp = p->n_tp;
    sp.gpus = p->gpus;
    if (p->tp_timeout_ms > 0) sp.tp_timeout_ms = p->tp_timeout_ms;
    sp.verbose = p->verbose;
    sp.n_batch = p->n_batch;
    sp.n_ctx = n_blocks * p->kv_block;
    const nstf_session_shape shape = {p->n_seq, p->kv_block, n_blocks};
    return nstf_session_open_shaped(p->model, &sp, &shape, out);
}

nstf_status nstf_engine_follow(const nstf_engine_params *pp) {
    const nstf_engine_params p = pp ? *pp : nstf_engine_default_params();
    nstf_session *s = NULL;
    nstf_status st = open_session(&p, &s);
    if (st == NSTF_OK) st = nstf_llama_tp_follow(s->run);
    nstf_session_close(s);
    return st;
}

nstf_status nstf_engine_create(const nstf_engine_params *pp, nstf_engine **out) {
    *out = NULL;
    nstf_engine_params p = *pp;
    if (!p.model) return nstf_set_error(NSTF_ERR_INVALID_ARG, "no model given");
    if (p.n_seq < 1 || p.n_seq > 4096 || p.kv_block < 1 || p.kv_block > 4096 || p.n_ctx < 1 || p.max_queue < 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "serving %d sequences over %d positions in blocks of %d with a queue of %d: each must be "
                              "positive (sequences and block at most 4096)",
                              p.n_seq, p.n_ctx, p.kv_block, p.max_queue);
    if (p.n_batch < p.n_seq)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "a step of %d tokens cannot decode %d sequences at once (raise the batch to at least -np)",
                              p.n_batch, p.n_seq);
    nstf_engine *e = nstf_calloc(1, sizeof *e, "serving engine");
    if (!e) return NSTF_ERR_OOM;
    e->p = p;
    pthread_mutex_init(&e->mu, NULL);
    cond_init(&e->work);
    cond_init(&e->idle);
    snprintf(e->name, sizeof e->name, "%s", base_name(p.model));
    e->block = p.kv_block;
    e->n_seq = p.n_seq;
    const int n_blocks = (int)(((int64_t)p.n_ctx + p.kv_block - 1) / p.kv_block);
    nstf_status st = open_session(&p, &e->s);
    /* under mpirun: this process leads the other ranks' forwards */
    if (st == NSTF_OK) st = nstf_llama_tp_lead(e->s->run);
    if (st == NSTF_OK) { /* a sequence's table spans the pool; its positions stop at the trained context */
        const int64_t train = e->s->model->cfg.n_ctx_train;
        e->seq_ctx = e->s->run->s.n_ctx;
        if (train > 0 && train < e->seq_ctx) e->seq_ctx = train;
        e->n_batch = e->s->run->s.n_batch;
        e->n_vocab = e->s->model->cfg.n_vocab;
        st = nstf_kv_pages_create(n_blocks, p.kv_block, p.n_seq, e->s->run->s.n_ctx / p.kv_block, &e->pages);
    }
    if (st == NSTF_OK) {
        e->slots = nstf_calloc((size_t)p.n_seq, sizeof *e->slots, "sequence slots");
        e->plan = nstf_calloc((size_t)p.n_seq, sizeof *e->plan, "step plan");
        e->row_req = nstf_calloc((size_t)p.n_seq, sizeof *e->row_req, "step rows");
        e->rows = nstf_calloc((size_t)p.n_seq, sizeof *e->rows, "step rows");
        e->req_tmp = nstf_calloc((size_t)p.n_seq, sizeof *e->req_tmp, "step rows");
        e->rows_tmp = nstf_calloc((size_t)p.n_seq, sizeof *e->rows_tmp, "step rows");
        e->argmax = nstf_calloc((size_t)p.n_seq, sizeof *e->argmax, "step greedy tokens");
        e->bt = nstf_calloc((size_t)e->n_batch, sizeof *e->bt, "step tokens");
        e->bp = nstf_calloc((size_t)e->n_batch, sizeof *e->bp, "step positions");
        e->bseq = nstf_calloc((size_t)e->n_batch, sizeof *e->bseq, "step slots");
        uint64_t nl = 0;
        if (!nstf_mul_ok((uint64_t)p.n_seq, (uint64_t)e->n_vocab, &nl) || nl > SIZE_MAX / sizeof(float))
            st = nstf_set_error(NSTF_ERR_RANGE, "logits of %d sequences overflow", p.n_seq);
        else e->logits = nstf_alloc((size_t)nl * sizeof(float), "step logits");
        if (st == NSTF_OK &&
            (!e->slots || !e->plan || !e->row_req || !e->rows || !e->req_tmp || !e->rows_tmp || !e->argmax || !e->bt ||
             !e->bp || !e->bseq || !e->logits))
            st = NSTF_ERR_OOM;
    }
    if (st == NSTF_OK) {
        nstf_hist_init(&e->st.ttft, nstf_hist_seconds, nstf_hist_n_seconds);
        nstf_hist_init(&e->st.itl, nstf_hist_seconds, nstf_hist_n_seconds);
        nstf_hist_init(&e->st.e2e, nstf_hist_seconds, nstf_hist_n_seconds);
        nstf_hist_init(&e->st.queue, nstf_hist_seconds, nstf_hist_n_seconds);
        nstf_hist_init(&e->st.batch_tokens, nstf_hist_sizes, nstf_hist_n_sizes);
        nstf_hist_init(&e->st.batch_seqs, nstf_hist_sizes, nstf_hist_n_sizes);
        if (nstf_thread_start(&e->thread, engine_main, e) != 0)
            st = nstf_set_error(NSTF_ERR_OOM, "cannot start the scheduler thread");
        else e->thread_started = true;
    }
    if (st != NSTF_OK) {
        nstf_engine_free(e);
        return st;
    }
    *out = e;
    return NSTF_OK;
}

void nstf_engine_free(nstf_engine *e) {
    if (!e) return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->stop = true;
        pthread_cond_broadcast(&e->work);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    pthread_mutex_lock(&e->mu);
    for (int i = 0; e->slots && i < e->n_seq; i++)
        if (e->slots[i]) finish(e, e->slots[i], NULL, NSTF_ENGINE_FAILED, "the server stopped");
    while (e->wait_head) finish(e, e->wait_head, NULL, NSTF_ENGINE_FAILED, "the server stopped");
    pthread_mutex_unlock(&e->mu);
    nstf_kv_pages_free(e->pages);
    /* a launch's other ranks leave their loop of forwards */
    if (e->s && nstf_llama_tp_lead_end(e->s->run) != NSTF_OK)
        fprintf(stderr, "nstf serve: the other ranks were not told to stop: %s\n", nstf_last_error());
    nstf_session_close(e->s);
    nstf_free(e->slots);
    nstf_free(e->plan);
    nstf_free(e->row_req);
    nstf_free(e->rows);
    nstf_free(e->req_tmp);
    nstf_free(e->rows_tmp);
    nstf_free(e->argmax);
    nstf_free(e->bt);
    nstf_free(e->bp);
    nstf_free(e->bseq);
    nstf_free(e->logits);
    pthread_cond_destroy(&e->work);
    pthread_cond_destroy(&e->idle);
    pthread_mutex_destroy(&e->mu);
    nstf_free(e);
}

nstf_status nstf_engine_tokenize(const nstf_engine *e, const char *text, bool chat, const nstf_chat_msg *msgs,
                                 int n_msgs, int32_t **ids, int64_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    char *rendered = NULL;
    if (chat) NSTF_TRY(nstf_chat_render(e->s->model->file, msgs, n_msgs, true, &rendered));
    const char *in = chat ? rendered : text;
    nstf_status st = nstf_tokenizer_encode(e->s->tok, in, strlen(in), nstf_tokenizer_wants_bos(e->s->tok), chat, ids,
                                           n_ids);
    free(rendered);
    if (st == NSTF_OK && *n_ids == 0) {
        free(*ids);
        *ids = NULL;
        st = nstf_set_error(NSTF_ERR_INVALID_ARG, "the prompt is empty and the model adds no BOS token");
    }
    return st;
}

nstf_engine_code nstf_engine_submit(nstf_engine *e, const nstf_serve_gen_params *gp, const int32_t *prompt, int64_t n,
                                    nstf_engine_req **out) {
    *out = NULL;
    if (n < 1 || n + gp->max_tokens - 1 > e->seq_ctx || gp->max_tokens < 1) return NSTF_ENGINE_TOO_LONG;
    nstf_engine_req *r = calloc(1, sizeof *r);
    if (!r) return NSTF_ENGINE_FAILED;
    r->e = e;
    r->gp = *gp;
    r->slot = -1;
    r->n_prompt = n;
    cond_init(&r->cv);
    atomic_init(&r->cancel, false);
    bool ok = grow((void **)&r->tokens, &r->cap, n + 1, sizeof *r->tokens);
    for (int i = 0; ok && i < gp->n_stop; i++) ok = (r->gp.stop[i] = r->stop_copy[i] = strdup(gp->stop[i])) != NULL;
    const nstf_sampler_params sp = {.temp = gp->temperature, .top_k = 0, .top_p = gp->top_p, .min_p = 0.0f,
                                    .repeat_penalty = 1.0f, .repeat_last_n = 0, .seed = gp->seed};
    if (ok && nstf_sampler_init(&r->smp, &sp, e->n_vocab) != NSTF_OK) ok = false;
    if (!ok) {
        req_free(r);
        return NSTF_ENGINE_FAILED;
    }
    memcpy(r->tokens, prompt, (size_t)n * sizeof *prompt);
    r->n_tokens = n;
    pthread_mutex_lock(&e->mu);
    nstf_engine_code code = NSTF_ENGINE_OK;
    if (e->draining || e->stop) code = NSTF_ENGINE_DRAINING;
    else if (e->n_waiting >= e->p.max_queue + (e->n_seq - e->n_running)) code = NSTF_ENGINE_FULL;
    if (code != NSTF_ENGINE_OK) {
        if (code == NSTF_ENGINE_FULL) e->st.rejected_full++;
        pthread_mutex_unlock(&e->mu);
        req_free(r);
        return code;
    }
    r->refs = 2;
    r->t_submit = now_ms();
    r->state = REQ_WAITING;
    queue_push(e, r, false);
    e->st.submitted++;
    e->st.prompt_tokens += n;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
    *out = r;
    return NSTF_ENGINE_OK;
}

bool nstf_engine_req_read(nstf_engine_req *r, int timeout_ms, nstf_gen_chunk *c) {
    nstf_engine *e = r->e;
    memset(c, 0, sizeof *c);
    pthread_mutex_lock(&e->mu);
    const double until = now_ms() + timeout_ms;
    int64_t vis = 0;
    for (;;) {
        vis = r->read_toks;
        while (vis < r->n_toks && (r->state == REQ_DONE || r->toks[vis].text_at < r->stable)) vis++;
        if (r->state == REQ_DONE || r->read_text < r->stable || vis > r->read_toks) break;
        const double left = until - now_ms();
        if (left <= 0) {
            pthread_mutex_unlock(&e->mu);
            return false;
        }
        cond_wait_ms(&r->cv, &e->mu, left);
    }
    const int64_t nt = r->stable - r->read_text, nk = vis - r->read_toks;
    c->text = malloc((size_t)nt + 1);
    c->toks = nk ? malloc((size_t)nk * sizeof *c->toks) : NULL;
    if (!c->text || (nk && !c->toks)) {
        free(c->text);
        free(c->toks);
        memset(c, 0, sizeof *c);
        c->done = true;
        c->error = NSTF_ENGINE_FAILED;
        snprintf(c->message, sizeof c->message, "out of memory handing out the generated text");
        pthread_mutex_unlock(&e->mu);
        return true;
    }
    if (nt) memcpy(c->text, r->text + r->read_text, (size_t)nt); /* no text yet: r->text may be NULL */
    c->text[nt] = 0;
    c->n_text = nt;
    if (nk) memcpy(c->toks, r->toks + r->read_toks, (size_t)nk * sizeof *c->toks);
    c->n_toks = (int)nk;
    r->read_text = r->stable;
    r->read_toks = vis;
    c->done = r->state == REQ_DONE;
    c->finish = r->finish;
    c->error = r->error;
    snprintf(c->message, sizeof c->message, "%s", r->message);
    c->n_prompt = r->n_prompt;
    c->n_gen = r->n_gen;
    c->n_cached = r->n_cached;
    pthread_mutex_unlock(&e->mu);
    return true;
}

void nstf_gen_chunk_free(nstf_gen_chunk *c) {
    free(c->text);
    free(c->toks);
    c->text = NULL;
    c->toks = NULL;
}

void nstf_engine_req_cancel(nstf_engine_req *r) {
    atomic_store(&r->cancel, true);
    pthread_mutex_lock(&r->e->mu);
    pthread_cond_signal(&r->e->work);
    pthread_mutex_unlock(&r->e->mu);
}

void nstf_engine_req_release(nstf_engine_req *r) {
    if (!r) return;
    nstf_engine *e = r->e;
    pthread_mutex_lock(&e->mu);
    req_unref(r);
    pthread_mutex_unlock(&e->mu);
}

bool nstf_engine_drain(nstf_engine *e, double timeout_s) {
    pthread_mutex_lock(&e->mu);
    e->draining = true;
    const double until = now_ms() + timeout_s * 1e3;
    while ((e->n_running > 0 || e->n_waiting > 0) && now_ms() < until) cond_wait_ms(&e->idle, &e->mu, until - now_ms());
    const bool empty = e->n_running == 0 && e->n_waiting == 0;
    pthread_mutex_unlock(&e->mu);
    return empty;
}

void nstf_engine_stats_get(nstf_engine *e, nstf_engine_stats *out) {
    pthread_mutex_lock(&e->mu);
    *out = e->st;
    nstf_kv_stats kv;
    nstf_kv_pages_stats(e->pages, &kv);
    out->n_seq = e->n_seq;
    out->running = e->n_running;
    out->waiting = e->n_waiting;
    out->max_queue = e->p.max_queue;
    out->kv_blocks = kv.n_blocks;
    out->kv_block = e->block;
    out->kv_used = kv.used;
    out->kv_cached = kv.cached;
    out->kv_hits = kv.hits;
    out->kv_evicted = kv.evicted;
    out->n_ctx_seq = e->seq_ctx;
    out->draining = e->draining;
    pthread_mutex_unlock(&e->mu);
}
