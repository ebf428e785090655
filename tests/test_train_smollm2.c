/* test_train_smollm2.c — fine-tuning the real model on the CPU, as a user
 * would: `nstf train` with LoRA (rank 8 on every matrix) on the frozen
 * Q4_1 SmolLM2-135M-Instruct (models/SmolLM2-135M-Instruct.Q4_1.gguf; skipped,
 * exit 77, when it has not been fetched), four steps on one sentence of
 * 32 tokens and its next tokens (a batch it sees every step), then the
 * merged model exported and run.
 * Checks: the loss falls by at least 1 nat over the four steps (3.85 ->
 * 1.56 when this was written: a sentence the model memorizes); the
 * exported GGUF loads in `nstf run` and generates 12 tokens; the adapters
 * file holds rank-8 A and B for every matrix of every layer. */
#define _GNU_SOURCE
#include <sys/stat.h>

#include "io/gguf.h"
#include "test_util.h"

#include "cli_run.h"

#define SMOL NSTF_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf"

static double loss_at(const char *log, int which) { /* which 0: first, 1: last */
    FILE *f = fopen(log, "rb");
    static char buf[1 << 16];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    double v = NAN;
    for (char *p = buf; (p = strstr(p, "\"loss\": ")); p++) {
        v = strtod(p + 8, NULL);
        if (which == 0) break;
    }
    return v;
}

int main(void) {
    struct stat sb;
    if (stat(SMOL, &sb) != 0) {
        printf("test_train_smollm2: %s not found (make model); skipped\n", SMOL);
        return 77;
    }
    snprintf(g_dir, sizeof g_dir, "/tmp/nstf_test_smol_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    char text[300], log[300], merged[300], adapters[300];
    snprintf(text, sizeof text, "%s/para.txt", g_dir);
    snprintf(log, sizeof log, "%s/log.jsonl", g_dir);
    snprintf(merged, sizeof merged, "%s/merged.gguf", g_dir);
    snprintf(adapters, sizeof adapters, "%s/adapters.gguf", g_dir);
    FILE *f = fopen(text, "wb");
    if (f) {
        fputs("The lighthouse keeper wrote in his logbook every evening: the wind, the waves, the ships that passed, "
              "and the gulls that came to rest on the rail.\n",
              f);
        fclose(f);
    }
    int rc = run((const char *const[]){"train", "-m", SMOL, "--data", text, "--batch", "1", "--seq", "32", "--steps",
                                       "4", "--lr", "2e-3", "--warmup", "0", "--min-lr", "2e-3", "--lora", "8",
                                       "--device", "cpu", "-t", "2", "-q", "--log", log, "--out", merged,
                                       "--lora-out", adapters, NULL});
    const double l0 = loss_at(log, 0), l1 = loss_at(log, 1);
    CHECK(rc == 0, "train: exit %d: %s", rc, g_err);
    CHECK(l1 < l0 - 1.0, "the loss fell from %.4f to %.4f only (want at least 1 nat)", l0, l1);
    printf("  LoRA rank 8 on SmolLM2-135M Q4_1: loss %.4f -> %.4f in 4 steps\n", l0, l1);
    rc = run((const char *const[]){"run", "-m", merged, "-p", "The lighthouse keeper", "-n", "12", "--temp", "0", "-t",
                                   "2", NULL});
    CHECK(rc == 0 && strstr(g_err, "generation 12 tokens") && strlen(g_out) > 0,
          "run on the exported model: exit %d: %s", rc, g_err);
    printf("  the exported model: \"The lighthouse keeper%s\"\n", g_out);
    nstf_gguf *ad = NULL;
    CHECK(nstf_gguf_open(adapters, &ad) == NSTF_OK, "%s", nstf_last_error());
    CHECK(ad && ad->n_tensors == 30 * 7 * 2, "adapters: %llu tensors (want 420)",
          ad ? (unsigned long long)ad->n_tensors : 0ull);
    const nstf_gguf_tensor *b = ad ? nstf_gguf_find_tensor(ad, "blk.29.ffn_up.weight.lora_b") : NULL;
    CHECK(b && b->ne[0] == 8 && b->ne[1] == 1536, "blk.29.ffn_up.weight.lora_b is not [8, 1536]");
    nstf_gguf_close(ad);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return test_finish("test_train_smollm2");
}
