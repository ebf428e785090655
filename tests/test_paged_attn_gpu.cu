/* test_paged_attn_gpu.cu — nstf_gpu_paged_attention (the paged KV cache of
 * continuous batches) against an fp64 host reference of causal GQA
 * attention, on the same bf16-rounded inputs. Each case is one mixed batch:
 * several sequences with their own histories in a shuffled block pool,
 * prefill chunks and single decode tokens interleaved in one batch, two
 * sequences sharing their first blocks (a common prompt prefix), block
 * sizes that do and do not divide the tile (16, 5), head_dim 64 and 128,
 * GQA ratios 1, 3, 4, 8, 16 (the kernel's largest group), head_dim 30
 * (key rows not 16-byte aligned), padded token strides; and a decode batch
 * of 64 sequences of different lengths.
 *
 * Metric (tests/gpu_harness.h): the bf16 rule, NMSE of the bf16 output vs
 * the fp64 reference at most 2x the NMSE of a naive host implementation in
 * the kernel's precision (bf16 inputs, fp32 scores, softmax and probabilities,
 * fp32 sequential accumulation, bf16 output). Checked exactly: the pool
 * after the call (each token's k, v rows in the row its position maps to;
 * every other row, unassigned ones included, unchanged). Guards after each
 * launch, NaN/Inf (unassigned rows hold NaN: a kernel that reads one
 * fails). Argument validation and an out-of-pool block id (skipped, no
 * out-of-bounds access). Exit 77 = no GPU. */
#include "gpu_harness.h"

#include <algorithm>

static float bf2f(uint16_t b) { return nstf_bf16_to_f32(b); }
static uint16_t f2bf(float f) { return nstf_f32_to_bf16(f); }

struct seq_spec {
    int64_t hist, n_new; /* positions already cached; tokens of this batch */
};

struct paged_case {
    std::vector<seq_spec> seqs;
    int n_kv, group, hd, block_size;
    int share_from; /* sequence whose first blocks the last sequence shares (-1: none) */
    int window;     /* sliding window (0: none) */
};

static void run_case(const paged_case &tc, uint64_t seed) {
    const int n_seq = (int)tc.seqs.size(), n_kv = tc.n_kv, H = n_kv * tc.group, D = tc.hd, BS = tc.block_size;
    const int64_t kvd = (int64_t)n_kv * D;
    test_rng rng = {seed};
    int64_t longest = 0, n_tok = 0;
    for (const seq_spec &s : tc.seqs) {
        longest = std::max(longest, s.hist + s.n_new);
        n_tok += s.n_new;
    }
    const int64_t bps = (longest + 3 + BS - 1) / BS, n_ctx = bps * BS;
    /* block tables: each sequence's blocks from a shuffled pool with spares */
    const int shared = tc.share_from >= 0 ? (int)(std::min(tc.seqs[tc.share_from].hist, tc.seqs.back().hist) / BS) : 0;
    std::vector<int32_t> tbl((size_t)n_seq * bps, -1);
    int64_t n_used = 0;
    for (int s = 0; s < n_seq; s++) n_used += (tc.seqs[s].hist + tc.seqs[s].n_new + BS - 1) / BS;
    const int64_t n_blocks = n_used + 3;
    std::vector<int32_t> ids(n_blocks);
    for (int64_t i = 0; i < n_blocks; i++) ids[i] = (int32_t)i;
    for (int64_t i = n_blocks - 1; i > 0; i--) std::swap(ids[i], ids[rng_next(&rng) % (uint64_t)(i + 1)]);
    int64_t next = 0;
    for (int s = 0; s < n_seq; s++) {
        const int64_t nb = (tc.seqs[s].hist + tc.seqs[s].n_new + BS - 1) / BS;
        for (int64_t b = 0; b < nb; b++)
            tbl[(size_t)s * bps + b] = s == n_seq - 1 && b < shared ? tbl[(size_t)tc.share_from * bps + b] : ids[next++];
    }
    auto row_of = [&](int s, int64_t p) { return (int64_t)tbl[(size_t)s * bps + p / BS] * BS + p % BS; };

    /* the pool: histories random, every other row NaN */
    const int64_t pool_rows = n_blocks * BS;
    std::vector<uint16_t> kc(pool_rows * kvd, 0xffff), vc(pool_rows * kvd, 0xffff);
    for (int s = 0; s < n_seq; s++)
        for (int64_t p = 0; p < tc.seqs[s].hist; p++) {
            if (s == n_seq - 1 && p < (int64_t)shared * BS) continue; /* the shared prefix is the other's */
            for (int64_t i = 0; i < kvd; i++) {
                kc[row_of(s, p) * kvd + i] = f2bf(rng_uniform(&rng));
                vc[row_of(s, p) * kvd + i] = f2bf(rng_uniform(&rng));
            }
        }
    /* the batch: tokens of all sequences, interleaved */
    std::vector<int32_t> pos, seq;
    for (int s = 0; s < n_seq; s++)
        for (int64_t i = 0; i < tc.seqs[s].n_new; i++) {
            pos.push_back((int32_t)(tc.seqs[s].hist + i));
            seq.push_back(s);
        }
    for (int64_t i = n_tok - 1; i > 0; i--) {
        const int64_t j = (int64_t)(rng_next(&rng) % (uint64_t)(i + 1));
        std::swap(pos[i], pos[j]);
        std::swap(seq[i], seq[j]);
    }
    const int64_t q_stride = (int64_t)H * D + 8, kv_stride = kvd + 16, out_stride = (int64_t)H * D + 24;
    const float scale = 1.0f / sqrtf((float)D);
    std::vector<uint16_t> q(n_tok * q_stride, 0), k(n_tok * kv_stride, 0), v(n_tok * kv_stride, 0);
    std::vector<uint16_t> kc_want = kc, vc_want = vc;
    for (int64_t t = 0; t < n_tok; t++) {
        for (int64_t i = 0; i < (int64_t)H * D; i++) q[t * q_stride + i] = f2bf(3.0f * rng_uniform(&rng));
        for (int64_t i = 0; i < kvd; i++) {
            k[t * kv_stride + i] = kc_want[row_of(seq[t], pos[t]) * kvd + i] = f2bf(rng_uniform(&rng));
            v[t * kv_stride + i] = vc_want[row_of(seq[t], pos[t]) * kvd + i] = f2bf(rng_uniform(&rng));
        }
    }

    gh_begin("paged n_seq=%-2d n_tok=%-3lld block=%-2d heads=%2d/%d hd=%-3d window=%-3d%s", n_seq, (long long)n_tok, BS,
             H, n_kv, D, tc.window, shared ? " shared" : "");
    gh_buf dq = gh_alloc(q.size() * 2, q.data()), dk = gh_alloc(k.size() * 2, k.data());
    gh_buf dv = gh_alloc(v.size() * 2, v.data()), dkc = gh_alloc(kc.size() * 2, kc.data());
    gh_buf dvc = gh_alloc(vc.size() * 2, vc.data()), dout = gh_alloc((size_t)n_tok * out_stride * 2, nullptr);
    gh_buf dpos = gh_alloc(pos.size() * 4, pos.data()), dseq = gh_alloc(seq.size() * 4, seq.data());
    gh_buf dtbl = gh_alloc(tbl.size() * 4, tbl.data());
    const nstf_status st = nstf_gpu_paged_attention(
        dq.as<uint16_t>(), q_stride, dk.as<uint16_t>(), kv_stride, dv.as<uint16_t>(), kv_stride, dkc.as<uint16_t>(),
        dvc.as<uint16_t>(), dout.as<uint16_t>(), out_stride, dpos.as<int32_t>(), dseq.as<int32_t>(),
        dtbl.as<int32_t>(), n_tok, n_ctx, n_seq, BS, n_blocks, H, n_kv, D, scale, tc.window, NULL);
    gh_launched(st, "paged_attention");
    std::vector<uint16_t> out(n_tok * out_stride), kc2(kc.size()), vc2(vc.size());
    gh_fetch(dout, out.data());
    gh_fetch(dkc, kc2.data());
    gh_fetch(dvc, vc2.data());
    int64_t pool_bad = 0;
    for (size_t i = 0; i < kc.size(); i++) pool_bad += kc2[i] != kc_want[i] || vc2[i] != vc_want[i];

    /* reference, naive and kernel, every token and head */
    const int64_t n_val = n_tok * H * D;
    std::vector<double> ref(n_val), sd(n_ctx);
    std::vector<float> got(n_val), naive(n_val), sf(n_ctx);
    int64_t vi = 0;
    for (int64_t t = 0; t < n_tok; t++)
        for (int h = 0; h < H; h++) {
            const int hk = h / tc.group;
            const int64_t n_keys = pos[t] + 1;
            const int64_t p_lo = tc.window > 0 && n_keys > tc.window ? n_keys - tc.window : 0;
            const uint16_t *qr = &q[t * q_stride + (int64_t)h * D];
            double md = -1e300;
            float mf = -INFINITY;
            for (int64_t p = 0; p < n_keys; p++) {
                if (p < p_lo) { /* outside the window: weight 0 */
                    sd[p] = -1e300;
                    sf[p] = -INFINITY;
                    continue;
                }
                const uint16_t *kr = &kc_want[row_of(seq[t], p) * kvd + (int64_t)hk * D];
                double a = 0;
                float b = 0;
                for (int d = 0; d < D; d++) {
                    a += (double)bf2f(qr[d]) * bf2f(kr[d]);
                    b = fmaf(bf2f(qr[d]), bf2f(kr[d]), b);
                }
                sd[p] = a / sqrt((double)D);
                sf[p] = b * scale;
                md = std::max(md, sd[p]);
                mf = fmaxf(mf, sf[p]);
            }
            double ld;
            float lf;
            gh_softmax_exp(sd.data(), sf.data(), n_keys, md, mf, &ld, &lf);
            for (int d = 0; d < D; d++) {
                double od = 0;
                float of = 0;
                for (int64_t p = 0; p < n_keys; p++) {
                    const float x = bf2f(vc_want[row_of(seq[t], p) * kvd + (int64_t)hk * D + d]);
                    od += sd[p] * x;
                    of = fmaf(sf[p], x, of);
                }
                ref[vi] = od / ld;
                naive[vi] = gh_bf(of / lf);
                got[vi] = bf2f(out[t * out_stride + (int64_t)h * D + d]);
                vi++;
            }
        }
    gh_compare("out", got.data(), ref.data(), n_val, gh_tol_naive(naive.data()));
    CHECK(pool_bad == 0, "%lld pool values wrong", (long long)pool_bad);
    gh_note("pool wrong=%lld", (long long)pool_bad);
    gh_free(dq); gh_free(dk); gh_free(dv); gh_free(dkc); gh_free(dvc); gh_free(dout);
    gh_free(dpos); gh_free(dseq); gh_free(dtbl);
    gh_end();
}

/* Bad arguments are refused; a block id outside the pool is skipped. */
static void check_arguments(void) {
    gh_begin("paged attention: argument validation, out-of-pool block id");
    const int D = 64, H = 2, BS = 4, n_ctx = 16;
    gh_buf b = gh_alloc(1 << 16, nullptr), o = gh_alloc((size_t)H * D * 2, nullptr);
    uint16_t *d = b.as<uint16_t>();
    const int32_t host[6] = {9, 0, 1, 3, 7, -1}; /* pos 9; seq 0; table: blocks 1, 3, then 7 (of 4), -1 */
    gh_buf ib = gh_alloc(sizeof host, host);
    const int32_t *pos = ib.as<int32_t>(), *seq = pos + 1, *tbl = pos + 2;
    CHECK(nstf_gpu_paged_attention(d, H * D, d, D, d, D, d, d, d, H * D, pos, seq, tbl, 1, n_ctx, 1, BS, 4, H, 1, 300,
                                   0.1f, 0, NULL) == NSTF_ERR_UNSUPPORTED, "head_dim 300 must be refused");
    CHECK(nstf_gpu_paged_attention(d, H * D, d, D, d, D, d, d, d, H * D, pos, seq, tbl, 1, 18, 1, BS, 4, H, 1, D, 0.1f, 0,
                                   NULL) == NSTF_ERR_INVALID_ARG, "a context of 18 in blocks of 4 must be refused");
    CHECK(nstf_gpu_paged_attention(d, H * D, d, D, d, D, d, d, d, H * D, pos, seq, tbl, 1, n_ctx, 1, BS, 4, 3, 2, D,
                                   0.1f, 0, NULL) == NSTF_ERR_INVALID_ARG, "3 heads over 2 kv heads must be refused");
    CHECK(nstf_gpu_paged_attention(d, D, d, D, d, D, d, d, d, H * D, pos, seq, tbl, 1, n_ctx, 1, BS, 4, H, 1, D, 0.1f, 0,
                                   NULL) == NSTF_ERR_INVALID_ARG, "a q stride shorter than its row must be refused");
    CHECK(nstf_gpu_paged_attention(d, 17 * 16, d, 16, d, 16, d, d, d, 17 * 16, pos, seq, tbl, 1, n_ctx, 1, BS, 4, 17,
                                   1, 16, 0.1f, 0, NULL) == NSTF_ERR_UNSUPPORTED,
          "17 query heads per kv head must be refused");
    /* position 9 lies in the third block, 7, outside the pool of 4: nothing
     * is written there and keys 8, 9 are not there; keys 0..7 (q = 0, every
     * v = 1) average to exactly 1. A slot outside [0, n_seq): zeros. */
    gh_must(nstf_gpu_memset(d, 0, 1 << 16, nullptr), "memset");
    const std::vector<uint16_t> ones(4 * BS * D, 0x3f80); /* bf16 1.0 */
    gh_must(nstf_gpu_memcpy_h2d(d + 8192, ones.data(), ones.size() * 2, nullptr), "h2d");
    gh_must(nstf_gpu_stream_sync(nullptr), "sync");
    std::vector<uint16_t> out(H * D), vc(ones.size());
    for (int slot_ok = 1; slot_ok >= 0; slot_ok--) {
        gh_launched(nstf_gpu_paged_attention(d, H * D, d, D, d, D, d + 4096, d + 8192, o.as<uint16_t>(), H * D, pos,
                                             slot_ok ? seq : tbl /* slot 1 */, tbl, 1, n_ctx, 1, BS, 4, H, 1, D, 0.1f,
                                             0, NULL),
                    slot_ok ? "paged_attention (block out of the pool)" : "paged_attention (slot out of range)");
        gh_fetch(o, out.data());
        int64_t bad = 0;
        for (uint16_t x : out) bad += x != (slot_ok ? 0x3f80 : 0);
        CHECK(bad == 0, "%s: %lld outputs wrong", slot_ok ? "block 7 of 4" : "slot 1 of 1", (long long)bad);
    }
    gh_must(nstf_gpu_memcpy_d2h(vc.data(), d + 8192, vc.size() * 2, nullptr), "d2h");
    CHECK(vc == ones, "the pool was written through a block or slot outside it");
    gh_note("head_dim 300, context not whole blocks, heads/kv, short stride, 17 heads per kv head refused; block 7 of 4, slot 1 of 1 skipped");
    gh_free(b); gh_free(o); gh_free(ib);
}

int main(void) {
    if (!gh_init("test_paged_attn_gpu")) return TEST_SKIP;
    uint64_t seed = 900;
    const int groups[] = {1, 4, 8}, hds[] = {64, 128}, bss[] = {16, 5};
    /* prefill chunks beside decode tokens; the last sequence shares sequence 1's first blocks */
    const std::vector<seq_spec> mixed = {{0, 6}, {37, 1}, {1, 3}, {260, 1}, {37, 1}, {130, 40}};
    for (int hd : hds)
        for (int g : groups)
            for (int bs : bss) run_case({mixed, 2, g, hd, bs, 1, 0}, seed++);
    /* a decode batch of 64 sequences, 1..1000 cached positions each */
    std::vector<seq_spec> decode;
    test_rng r = {77};
    for (int i = 0; i < 64; i++) decode.push_back({1 + (int64_t)(rng_next(&r) % 1000), 1});
    run_case({decode, 8, 4, 64, 16, -1, 0}, seed++);
    run_case({decode, 2, 8, 128, 16, -1, 0}, seed++);
    /* sliding windows (Mistral): shorter than some histories, longer than others */
    run_case({mixed, 2, 3, 64, 16, 1, 50}, seed++);
    /* 16 query heads per kv head (the kernel's largest group), odd head
     * sizes (rows not 16-byte aligned: the scalar key reads) */
    run_case({mixed, 1, 16, 128, 16, 1, 0}, seed++);
    run_case({mixed, 2, 4, 30, 5, 1, 0}, seed++);
    run_case({decode, 2, 4, 64, 16, -1, 100}, seed++);
    check_arguments();
    return gh_finish("test_paged_attn_gpu");
}
