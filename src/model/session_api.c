/* session_api.c — the public entry points a binding needs beside
 * generation (nstf.h): the model's facts, tokenize / detokenize into
 * caller buffers, and teacher-forced evaluation to host logits. Each
 * checks its arguments and fails with a message; none allocates beyond
 * the tokenizer's own result. */
#include <stdlib.h>
#include <string.h>

#include "model/session.h"

nstf_status nstf_session_info(const nstf_session *s, nstf_model_info *out) {
    if (!s || !out) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_session_info: NULL session or output");
    const nstf_llama_config *c = &s->model->cfg;
    memset(out, 0, sizeof *out);
    out->n_vocab = c->n_vocab;
    out->n_ctx = s->n_ctx;
    out->n_ctx_train = c->n_ctx_train;
    out->n_layers = c->n_layers;
    out->dim = c->dim;
    out->n_heads = c->n_heads;
    out->n_kv_heads = c->n_kv_heads;
    out->head_dim = c->head_dim;
    out->ffn_dim = c->ffn_dim;
    out->bos = nstf_tokenizer_bos(s->tok);
    out->eos = nstf_tokenizer_eos(s->tok);
    out->add_bos = nstf_tokenizer_wants_bos(s->tok);
    out->backend = s->be->vt->name;
    out->device = s->be->device;
    out->n_batch = s->n_batch;
    return NSTF_OK;
}

nstf_status nstf_session_tokenize(nstf_session *s, const char *text, size_t len, int add_bos, bool parse_special,
                                  int32_t *ids, int64_t cap, int64_t *n_ids) {
    if (!s || (!text && len) || !n_ids || cap < 0 || (!ids && cap))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_session_tokenize: bad argument");
    if (add_bos < -1 || add_bos > 1)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_session_tokenize: add_bos %d (want -1, 0 or 1)", add_bos);
    *n_ids = 0;
    const bool bos = add_bos < 0 ? nstf_tokenizer_wants_bos(s->tok) : add_bos == 1;
    int32_t *tmp = NULL;
    int64_t n = 0;
    NSTF_TRY(nstf_tokenizer_encode(s->tok, text ? text : "", len, bos, parse_special, &tmp, &n));
    *n_ids = n;
    nstf_status st = NSTF_OK;
    if (n > cap)
        st = nstf_set_error(NSTF_ERR_RANGE, "nstf_session_tokenize: the text is %lld tokens but the buffer holds %lld",
                            (long long)n, (long long)cap);
    else if (n)
        memcpy(ids, tmp, (size_t)n * sizeof *ids);
    free(tmp);
    return st;
}

nstf_status nstf_session_detokenize(nstf_session *s, const int32_t *ids, int64_t n, char *buf, size_t cap,
                                    size_t *len) {
    if (!s || (!ids && n) || n < 0 || !len || (!buf && cap))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_session_detokenize: bad argument");
    *len = 0;
    char *text = NULL;
    size_t n_bytes = 0;
    NSTF_TRY(nstf_tokenizer_decode(s->tok, ids, n, &text, &n_bytes));
    *len = n_bytes;
    nstf_status st = NSTF_OK;
    if (n_bytes > cap)
        st = nstf_set_error(NSTF_ERR_RANGE, "nstf_session_detokenize: the text is %zu bytes but the buffer holds %zu",
                            n_bytes, cap);
    else if (n_bytes)
        memcpy(buf, text, n_bytes);
    free(text);
    return st;
}

nstf_status nstf_session_eval(nstf_session *s, const int32_t *tokens, int64_t n, bool all_logits, float *logits) {
    if (!s || !tokens || !logits) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_session_eval: NULL argument");
    if (n < 1 || n > s->n_ctx)
        return nstf_set_error(NSTF_ERR_RANGE, "nstf_session_eval: %lld tokens (the context holds 1 to %d)", (long long)n,
                              s->n_ctx);
    const int32_t n_vocab = s->model->cfg.n_vocab;
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= n_vocab)
            return nstf_set_error(NSTF_ERR_RANGE, "nstf_session_eval: token id %d at %lld is outside [0, %d)",
                                  tokens[i], (long long)i, n_vocab);
    if (all_logits) return nstf_session_eval_all(s, tokens, (int)n, logits);
    NSTF_TRY(nstf_session_prefill(s, tokens, (int)n, 0));
    memcpy(logits, s->logits, (size_t)n_vocab * sizeof *logits);
    return NSTF_OK;
}
