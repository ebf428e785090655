/* cmd_run.c — `nstf run`: load a model, generate, report speed. Flags
 * follow llama.cpp's llama-cli where they exist. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "nstf.h"
#include "prof/memory.h"

int cmd_run(int argc, char **argv);

static void run_usage(FILE *f) {
    fprintf(f,
            "usage: nstf run -m MODEL (-p PROMPT | -f FILE) [options]\n"
            "\n"
            "  -m, --model FILE        GGUF model (Llama family; F32/F16/BF16/Q8_0/Q4_0/Q4_1)\n"
            "  -p, --prompt TEXT       prompt text\n"
            "  -f, --file FILE         read the prompt from FILE\n"
            "  -n, --n-predict N       tokens to generate (default 128)\n"
            "  -c, --ctx-size N        context size in tokens (default: min(trained, 4096))\n"
            "  -b, --batch-size N      prompt tokens per forward pass (default 512)\n"
            "  -t, --threads N         CPU threads (default: all cores)\n"
            "      --temp T            temperature; 0 = greedy (default 0.8)\n"
            "      --top-k K           keep the K most likely tokens; 0 = off (default 40)\n"
            "      --top-p P           nucleus sampling; 1.0 = off (default 0.95)\n"
            "      --min-p P           drop tokens below P x the best; 0 = off (default 0.05)\n"
            "      --repeat-penalty R  penalty for recent tokens; 1.0 = off (default 1.0)\n"
            "      --repeat-last-n N   tokens the penalty looks back over (default 64)\n"
            "  -s, --seed N            random seed (default: from the clock)\n"
            "      --chat              treat the prompt as one user turn in the model's chat template\n"
            "      --system TEXT       system message for --chat (default: the template's own)\n"
            "      --stream            print tokens as they are generated\n"
            "      --ignore-eos        keep generating past end-of-generation tokens\n"
            "      --device DEV        cpu, gpu or auto (default auto: GPU when present)\n"
            "      --deterministic     bitwise-identical output for any thread count and run\n"
            "      --precise           CPU: keep activations in fp32 in every matmul (slower;\n"
            "                          default quantizes them to 8-bit blocks, as llama.cpp does)\n"
            "  -v, --verbose           print model and device details\n"
            "  -h, --help              this text\n"
            "\n"
            "The generated text goes to stdout; the speed line goes to stderr.\n");
}

typedef struct {
    bool stream;
    char *buf;
    size_t len, cap;
    bool oom;
} out_state;

static bool on_piece(void *user, int32_t token, const char *piece, size_t len) {
    (void)token;
    out_state *o = user;
    if (o->stream) {
        fwrite(piece, 1, len, stdout);
        fflush(stdout);
        return true;
    }
    if (o->len + len + 1 > o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 4096;
        while (cap < o->len + len + 1) cap *= 2;
        char *nb = realloc(o->buf, cap);
        if (!nb) {
            o->oom = true;
            return false;
        }
        o->buf = nb;
        o->cap = cap;
    }
    memcpy(o->buf + o->len, piece, len);
    o->len += len;
    return true;
}

int cmd_run(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *prompt_file = NULL, *system = NULL;
    int n_predict = 128;
    bool chat = false, ignore_eos = false, seed_set = false;
    out_state o = {0};
    nstf_session_params sp = nstf_session_default_params();
    nstf_sampler_params smp = nstf_sampler_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
#define VAL() do { if (!(v = cli_value(argc, argv, &i))) return 2; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { run_usage(stdout); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { VAL(); model = v; }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { VAL(); prompt = v; }
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) { VAL(); prompt_file = v; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) { VAL(); if (!cli_parse_int(a, v, 1, 1 << 24, &n_predict)) return 2; }
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) { VAL(); if (!cli_parse_int(a, v, 1, 1 << 24, &sp.n_ctx)) return 2; }
        else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) { VAL(); if (!cli_parse_int(a, v, 1, 1 << 16, &sp.n_batch)) return 2; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { VAL(); if (!cli_parse_int(a, v, 1, 1024, &sp.n_threads)) return 2; }
        else if (!strcmp(a, "--temp")) { VAL(); if (!cli_parse_float(a, v, 0, 1e6, &smp.temp)) return 2; }
        else if (!strcmp(a, "--top-k")) { VAL(); if (!cli_parse_int(a, v, 0, 1 << 30, &smp.top_k)) return 2; }
        else if (!strcmp(a, "--top-p")) { VAL(); if (!cli_parse_float(a, v, 1e-9, 1, &smp.top_p)) return 2; }
        else if (!strcmp(a, "--min-p")) { VAL(); if (!cli_parse_float(a, v, 0, 1, &smp.min_p)) return 2; }
        else if (!strcmp(a, "--repeat-penalty")) { VAL(); if (!cli_parse_float(a, v, 1e-6, 1e6, &smp.repeat_penalty)) return 2; }
        else if (!strcmp(a, "--repeat-last-n")) { VAL(); if (!cli_parse_int(a, v, 0, 1 << 20, &smp.repeat_last_n)) return 2; }
        else if (!strcmp(a, "-s") || !strcmp(a, "--seed")) { VAL(); if (!cli_parse_u64(a, v, &smp.seed)) return 2; seed_set = true; }
        else if (!strcmp(a, "--chat")) chat = true;
        else if (!strcmp(a, "--system")) { VAL(); system = v; }
        else if (!strcmp(a, "--stream")) o.stream = true;
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = true;
        else if (!strcmp(a, "--device")) { VAL(); sp.device = v; }
        else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) sp.verbose = true;
        else if (!strcmp(a, "--precise")) sp.precise = true;
        else if (!strcmp(a, "--deterministic")) sp.deterministic = true;
        else { fprintf(stderr, "nstf run: unknown option '%s' (see nstf run --help)\n", a); return 2; }
#undef VAL
    }
    if (!model) { fprintf(stderr, "nstf run: no model given (-m FILE)\n"); return 2; }
    if (prompt && prompt_file) { fprintf(stderr, "nstf run: give -p or -f, not both\n"); return 2; }
    if (!prompt && !prompt_file) { fprintf(stderr, "nstf run: no prompt given (-p TEXT or -f FILE)\n"); return 2; }
    if (system && !chat) { fprintf(stderr, "nstf run: --system needs --chat\n"); return 2; }
    char *file_prompt = NULL;
    if (prompt_file && !(prompt = file_prompt = cli_read_file(prompt_file, "prompt file"))) return 1;
    if (!seed_set) smp.seed = (uint64_t)nstf_time_seed();

    nstf_session *s = NULL;
    nstf_status st = nstf_session_open(model, &sp, &s);
    if (st != NSTF_OK) {
        fprintf(stderr, "nstf: %s\n", nstf_last_error());
        free(file_prompt);
        return 1;
    }
    /* weights paged in with a progress bar on a terminal (a line with -v) */
    nstf_weights_touch(s, stderr, sp.verbose);
    nstf_mem_report mem;
    if (sp.verbose) {
        nstf_mem_report_session(s, &mem);
        nstf_mem_report_print(stderr, &mem);
        fprintf(stderr, "nstf: seed %llu\n", (unsigned long long)smp.seed);
    }
    nstf_gen_stats gs;
    st = nstf_session_generate(s, prompt, chat, system, &smp, n_predict, ignore_eos, on_piece, &o, &gs);
    if (!o.stream && o.buf) fwrite(o.buf, 1, o.len, stdout);
    if (o.len || o.stream) fputc('\n', stdout);
    fflush(stdout);
    int rc = 0;
    if (st != NSTF_OK) {
        fprintf(stderr, "nstf: %s\n", nstf_last_error());
        rc = 1;
    } else if (o.oom) {
        fprintf(stderr, "nstf: out of memory holding the generated text\n");
        rc = 1;
    } else {
        fprintf(stderr,
                "nstf: prompt %lld tokens in %.1f ms (%.1f tokens/s); generation %lld tokens, %lld decode steps in "
                "%.1f ms (%.1f tokens/s)\n",
                (long long)gs.n_prompt, gs.prompt_ms, gs.prompt_ms > 0 ? gs.n_prompt * 1e3 / gs.prompt_ms : 0.0,
                (long long)gs.n_gen, (long long)gs.n_decode, gs.gen_ms,
                gs.gen_ms > 0 && gs.n_decode > 0 ? gs.n_decode * 1e3 / gs.gen_ms : 0.0);
    }
    if (sp.verbose) {
        nstf_mem_report_session(s, &mem);
        nstf_mem_report_print(stderr, &mem);
    }
    free(o.buf);
    free(file_prompt);
    nstf_session_close(s);
    return rc;
}
