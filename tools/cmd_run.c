/* cmd_run.c — `nstf run` (load a model, stream a completion, report speed)
 * and `nstf chat` (the conversation loop of chat.c) with the options they
 * share. Flags follow llama.cpp's llama-cli where they mean something
 * here, long and short forms, --flag=value included. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_util.h"
#include "dist/proc.h"
#include "nstf.h"
#include "nstf_tools.h"
#include "prof/memory.h"
#include "run_opts.h"

int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);

static void usage_common(FILE *f) {
    fprintf(f,
            "model and device:\n"
            "  -m, --model FILE          GGUF model or HF model folder (Llama family)\n"
            "  -c, --ctx-size N          context size in tokens (default: min(trained, 4096))\n"
            "  -b, --batch-size N        prompt tokens per forward pass (default 2048 on a GPU, 512\n"
            "                            where that does not fit and on the CPU)\n"
            "  -t, --threads N           CPU threads (default: the physical cores)\n"
            "      --device DEV          cpu, gpu or auto (default auto: the GPU when present)\n"
            "  -ngl, --n-gpu-layers N    layers on the GPU: 0 = none (CPU), -1 or >= the layer count =\n"
            "                            all (the default), N between: the first N there, the rest and\n"
            "                            the output on the CPU (--gpu-layers too; -v shows the split)\n"
            "      --tp N                tensor parallel: the model split over N GPUs (or, with --device\n"
            "                            cpu, N CPU ranks): heads, feed-forward and vocabulary shared\n"
            "                            out, two all-reduces per layer (NCCL / RCCL between GPUs)\n"
            "      --gpus LIST           the GPUs of --tp, such as 0,1 (default 0..N-1)\n"
            "      --tp-timeout MS       a rank that makes no progress this long ends the run with an\n"
            "                            error naming it (default 30000)\n"
            "                            Or one process per rank: mpirun -np N nstf run ... (rank 0\n"
            "                            reads stdin and shares it; each process's GPU is its place on\n"
            "                            its machine)\n"
            "  -fa, --flash-attn [on|auto] accepted: attention is always flash attention here\n"
            "  -ctk, --cache-type-k T    KV cache type: the device's own (f32 on the CPU, bf16 on a GPU;\n"
            "                            the default) or q8_0 (int8 with a scale per 32: 1.06 bytes a\n"
            "                            value, half of bf16); give K and V the same type\n"
            "  -ctv, --cache-type-v T    the same for V\n"
            "      --act-bits N          CPU activations of quantized matmuls: 16 (default: as close to\n"
            "                            fp32 as --precise, docs/PERFORMANCE.md), 8 (fastest; llama.cpp's\n"
            "                            accuracy) or 32\n"
            "      --precise             CPU: fp32 activations in every matmul (--act-bits 32)\n"
            "      --deterministic       bitwise-identical output for any thread count and run\n"
            "      --sparse-attn K[,W]   sparse decode attention in every layer: each generated token\n"
            "                            attends to block 0, the last W positions (default 64) and the K\n"
            "                            blocks of the cache with the largest score bound (Quest); the\n"
            "                            prompt stays dense. Default: the model file's plan if it has\n"
            "                            one (nstf.plan.attn_sparse), else dense\n"
            "      --sparse-block N      positions per block of the sparse attention (4..64; default 16)\n"
            "      --dense-attn          dense attention even where the model file plans sparse\n"
            "\n"
            "generation:\n"
            "  -n, --n-predict N         tokens to generate (default %s; -1 = until the model ends,\n"
            "                            -2 = until the context is full; --predict too)\n"
            "      --temp T              temperature; 0 = greedy (default 0.8)\n"
            "      --top-k K             keep the K most likely tokens; 0 = off (default 40)\n"
            "      --top-p P             nucleus sampling; 1.0 = off (default 0.95)\n"
            "      --min-p P             drop tokens below P x the best; 0 = off (default 0.05)\n"
            "      --repeat-penalty R    penalty for recent tokens; 1.0 = off (default 1.0)\n"
            "      --repeat-last-n N     tokens the penalty looks back over (default 64)\n"
            "  -s, --seed N              random seed; -1 = from the clock (default)\n"
            "  -r, --reverse-prompt S    stop when the output ends with S (repeatable)\n"
            "      --ignore-eos          keep generating past end-of-generation tokens\n"
            "      --context-shift       when the context is full, drop the oldest half of the tokens after\n"
            "                            the first --keep and go on (default: stop, saying so)\n"
            "      --no-context-shift    the default\n"
            "      --keep N              tokens a context shift keeps at the start (-1 = the whole prompt)\n"
            "  -sys, --system-prompt S   system message (--system too; default: the template's own)\n"
            "      --chat-template NAME  chatml, llama3, llama2, mistral-v1, mistral-v3, mistral-v3-tekken or mistral-v7\n"
            "                            (default: the model's; ChatML without one)\n"
            "  -v, --verbose             model, device, template and memory details\n"
            "  -h, --help                this text\n",
            "128");
}

static void run_usage(FILE *f) {
    fprintf(f,
            "usage: nstf run -m MODEL [-p PROMPT | -f FILE] [options]\n"
            "\n"
            "Streams the completion of PROMPT (or FILE; -f - or a pipe: stdin) to stdout; the speed\n"
            "line goes to stderr. Ctrl-C stops and prints the speed of what was done.\n"
            "\n"
            "prompt:\n"
            "  -p, --prompt TEXT         prompt text\n"
            "  -f, --file FILE           read the prompt from FILE (- = stdin)\n"
            "      --chat                the prompt is one user turn in the model's chat template\n"
            "  -sp, --special            special tokens written in the prompt (<|im_start|>...) are those\n"
            "                            tokens, not text\n"
            "  -i, --interactive         converse (nstf chat); the prompt is the first turn\n"
            "  -cnv, --conversation      the same; -no-cnv, --no-conversation: the default\n"
            "      --display-prompt      echo the prompt before the output (--no-display-prompt: the default)\n"
            "      --verbose-prompt      print the prompt's tokens to stderr before generating\n"
            "      --stream              accepted: the output is always streamed\n"
            "\n");
    usage_common(f);
}

static void chat_usage(FILE *f) {
    fprintf(f,
            "usage: nstf chat -m MODEL [options]\n"
            "\n"
            "A conversation: each line you type is a user turn, the answer is streamed and the history\n"
            "stays in the KV cache (each turn evaluates only its new tokens). On a terminal: line\n"
            "editing and history (libedit), Ctrl-C stops an answer (at the prompt, or twice: quits),\n"
            "Ctrl-D quits. From a pipe: one turn per line until end of input, each answer printed.\n"
            "A line ending in \\ continues on the next one.\n"
            "\n"
            "commands: /clear  /save FILE  /load FILE  /system TEXT (empty: the default)  /help  /exit\n"
            "\n"
            "  -p, --prompt TEXT         a first user turn\n"
            "\n");
    usage_common(f);
}

/* ---- reading prompts ---------------------------------------------------------------- */

static char *read_stream(FILE *f, const char *name) {
    size_t cap = 4096, len = 0, n;
    char *buf = malloc(cap);
    while (buf && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len - 1 == 0) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    if (buf && ferror(f)) {
        cli_err("error reading %s: %s", name, strerror(errno));
        free(buf);
        return NULL;
    }
    if (!buf) {
        cli_err("out of memory reading %s", name);
        return NULL;
    }
    buf[len] = 0;
    if (strlen(buf) != len) {
        cli_err("%s contains NUL bytes", name);
        free(buf);
        return NULL;
    }
    return buf;
}

static char *read_prompt_file(const char *path) {
    if (!strcmp(path, "-")) return read_stream(stdin, "the prompt on stdin");
    FILE *f = fopen(path, "rb");
    if (!f) {
        cli_err("cannot open prompt file '%s': %s", path, strerror(errno));
        return NULL;
    }
    char name[320];
    snprintf(name, sizeof name, "prompt file '%s'", path);
    char *s = read_stream(f, name);
    fclose(f);
    return s;
}

/* ---- options ------------------------------------------------------------------------- */

static bool is(const char *a, const char *x, const char *y, const char *z) {
    return !strcmp(a, x) || (y && !strcmp(a, y)) || (z && !strcmp(a, z));
}

static const char *const k_cache_types[] = {"auto", "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"};

/* Parses argv into o; returns -1 to go on, else the exit status. */
static int parse(int argc, char **argv, run_opts *o, bool chat_cmd, cli_usage_fn usage) {
    memset(o, 0, sizeof *o);
    o->sp = nstf_session_default_params();
    o->smp = nstf_sampler_default_params();
    o->gp = nstf_gen_default_params();
    o->gp.stop = o->stop;
    o->n_gpu_layers = -2;
    o->interactive = chat_cmd;
    cli_expand_args(&argc, &argv, usage);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
#define VAL()                                             \
    do {                                                  \
        if (!(v = cli_value(argc, argv, &i))) return 2;   \
    } while (0)
#define INT(lo, hi, dst)                                                   \
    do {                                                                   \
        VAL();                                                             \
        if (!cli_parse_int(a, v, lo, hi, dst)) return 2;                   \
    } while (0)
#define FLT(lo, hi, dst)                                                   \
    do {                                                                   \
        VAL();                                                             \
        if (!cli_parse_float(a, v, lo, hi, dst)) return 2;                 \
    } while (0)
        if (is(a, "-h", "--help", NULL)) {
            usage(stdout);
            return 0;
        } else if (is(a, "-m", "--model", NULL)) { VAL(); o->model = v; }
        else if (is(a, "-p", "--prompt", NULL)) { VAL(); o->prompt = v; }
        else if (is(a, "-f", "--file", NULL)) { VAL(); o->prompt_file = v; }
        else if (is(a, "-n", "--n-predict", "--predict")) INT(-2, 1 << 30, &o->gp.n_predict);
        else if (is(a, "-c", "--ctx-size", NULL)) INT(1, 1 << 24, &o->sp.n_ctx);
        else if (is(a, "-b", "--batch-size", NULL)) INT(1, 1 << 16, &o->sp.n_batch);
        else if (is(a, "-t", "--threads", NULL)) INT(1, 1024, &o->sp.n_threads);
        else if (is(a, "--temp", "--temperature", NULL)) FLT(0, 1e6, &o->smp.temp);
        else if (is(a, "--top-k", NULL, NULL)) INT(0, 1 << 30, &o->smp.top_k);
        else if (is(a, "--top-p", NULL, NULL)) FLT(1e-9, 1, &o->smp.top_p);
        else if (is(a, "--min-p", NULL, NULL)) FLT(0, 1, &o->smp.min_p);
        else if (is(a, "--repeat-penalty", NULL, NULL)) FLT(1e-6, 1e6, &o->smp.repeat_penalty);
        else if (is(a, "--repeat-last-n", NULL, NULL)) INT(0, 1 << 20, &o->smp.repeat_last_n);
        else if (is(a, "-s", "--seed", NULL)) {
            VAL();
            if (!strcmp(v, "-1")) o->seed_set = false; /* llama.cpp: -1 = random */
            else if (!cli_parse_u64(a, v, &o->smp.seed)) return 2;
            else o->seed_set = true;
        } else if (is(a, "--chat", NULL, NULL)) o->chat = true;
        else if (is(a, "-sys", "--system-prompt", "--system")) { VAL(); o->system = v; }
        else if (is(a, "--chat-template", NULL, NULL)) {
            VAL();
            if (!nstf_chat_template_known(v)) {
                cli_err("--chat-template '%s': use %s", v, NSTF_CHAT_TEMPLATE_NAMES);
                return 2;
            }
            o->sp.chat_template = v;
        } else if (is(a, "-i", "--interactive", "-if") || is(a, "--interactive-first", "-cnv", "--conversation"))
            o->interactive = true;
        else if (is(a, "-no-cnv", "--no-conversation", NULL)) {
            if (chat_cmd) {
                cli_err("%s: nstf chat is a conversation (use nstf run)", a);
                return 2;
            }
        } else if (is(a, "-r", "--reverse-prompt", NULL)) {
            VAL();
            if (o->gp.n_stop == RUN_MAX_STOP) {
                cli_err("at most %d reverse prompts (-r)", RUN_MAX_STOP);
                return 2;
            }
            if (!*v) {
                cli_err("%s: the reverse prompt is empty", a);
                return 2;
            }
            o->stop[o->gp.n_stop++] = v;
        } else if (is(a, "-sp", "--special", NULL)) o->special = true;
        else if (is(a, "--ignore-eos", NULL, NULL)) o->gp.ignore_eos = true;
        else if (is(a, "--context-shift", NULL, NULL)) o->gp.context_shift = true;
        else if (is(a, "--no-context-shift", NULL, NULL)) o->gp.context_shift = false;
        else if (is(a, "--keep", NULL, NULL)) INT(-1, 1 << 24, &o->gp.n_keep);
        else if (is(a, "--verbose-prompt", NULL, NULL)) o->verbose_prompt = true;
        else if (is(a, "--display-prompt", NULL, NULL)) o->display_prompt = true;
        else if (is(a, "--no-display-prompt", NULL, NULL)) o->display_prompt = false;
        else if (is(a, "--stream", NULL, NULL)) {
        } else if (is(a, "--device", NULL, NULL)) { VAL(); o->sp.device = v; }
        else if (is(a, "-ngl", "--n-gpu-layers", "--gpu-layers")) INT(-1, 1 << 20, &o->n_gpu_layers);
        else if (is(a, "--tp", NULL, NULL)) INT(1, 16, &o->sp.n_tp);
        else if (is(a, "--gpus", NULL, NULL)) { VAL(); o->sp.gpus = v; }
        else if (is(a, "--tp-timeout", NULL, NULL)) INT(1, 86400000, &o->sp.tp_timeout_ms);
        else if (is(a, "-fa", "--flash-attn", NULL)) {
            /* llama.cpp takes -fa alone (older) or -fa on|off|auto */
            if (i + 1 < argc && (!strcmp(argv[i + 1], "on") || !strcmp(argv[i + 1], "auto"))) i++;
            else if (i + 1 < argc && !strcmp(argv[i + 1], "off")) {
                cli_err("-fa off: attention here is always flash attention (the results are the same)");
                return 2;
            }
        } else if (is(a, "-ctk", "--cache-type-k", NULL) || is(a, "-ctv", "--cache-type-v", NULL)) {
            VAL();
            bool known = false;
            for (size_t k = 0; k < sizeof k_cache_types / sizeof *k_cache_types; k++) known |= !strcmp(v, k_cache_types[k]);
            if (!known) {
                cli_err("%s '%s': not a cache type (q8_0, or the device's own: f32 on the CPU, bf16 on a GPU)", a, v);
                return 2;
            }
            const bool key = is(a, "-ctk", "--cache-type-k", NULL);
            if (key) o->cache_k = v;
            else o->cache_v = v;
            /* q8_0 is asked of the session; the rest must be the device's own (checked once open) */
            if (!strcmp(v, "q8_0")) *(key ? &o->sp.cache_type_k : &o->sp.cache_type_v) = v;
        } else if (is(a, "--act-bits", NULL, NULL)) {
            VAL();
            if (!cli_parse_act_bits(a, v, &o->sp.cpu_act_bits)) return 2;
        } else if (is(a, "--precise", NULL, NULL)) o->sp.precise = true;
        else if (is(a, "--deterministic", NULL, NULL)) o->sp.deterministic = true;
        else if (is(a, "--sparse-attn", NULL, NULL)) {
            VAL();
            if (!cli_parse_sparse(a, v, &o->sp.sparse_topk, &o->sp.sparse_window)) return 2;
            o->sp.sparse_attn = 1;
        } else if (is(a, "--sparse-block", NULL, NULL)) INT(4, 64, &o->sp.sparse_block);
        else if (is(a, "--dense-attn", NULL, NULL)) o->sp.sparse_attn = -1;
        else if (is(a, "-v", "--verbose", NULL)) o->sp.verbose = true;
        else return cli_unknown_option(a, usage);
#undef FLT
#undef INT
#undef VAL
    }
    if (!o->model || !*o->model) {
        cli_err("no model given (-m FILE)");
        return 2;
    }
    if (o->prompt && o->prompt_file) {
        cli_err("give -p or -f, not both");
        return 2;
    }
    if (o->chat && o->interactive) o->chat = false; /* a conversation renders every turn */
    if (o->system && !o->chat && !o->interactive) {
        cli_err("%s needs --chat or a conversation (-cnv, nstf chat)", "--system-prompt");
        return 2;
    }
    if (o->sp.precise && o->sp.cpu_act_bits && o->sp.cpu_act_bits != 32) {
        cli_err("--precise is --act-bits 32; not both with --act-bits %d", o->sp.cpu_act_bits);
        return 2;
    }
    if ((o->sp.cache_type_k != NULL) != (o->sp.cache_type_v != NULL)) {
        cli_err("%s q8_0 without %s q8_0: keys and values take the same cache type here",
                o->sp.cache_type_k ? "-ctk" : "-ctv", o->sp.cache_type_k ? "-ctv" : "-ctk");
        return 2;
    }
    if (o->n_gpu_layers != -2) {
        const bool explicit_dev = strcmp(o->sp.device, "auto") != 0;
        if (o->n_gpu_layers == 0) {
            if (explicit_dev && strcmp(o->sp.device, "cpu")) {
                cli_err("-ngl 0 puts every layer on the CPU, but --device %s", o->sp.device);
                return 2;
            }
            o->sp.device = "cpu";
        } else if (explicit_dev && !strcmp(o->sp.device, "cpu")) {
            cli_err("-ngl %d puts layers on a GPU, but --device cpu", o->n_gpu_layers);
            return 2;
        } else {
            o->sp.n_gpu_layers = o->n_gpu_layers > 0 ? o->n_gpu_layers : 0; /* -1: all (0 in the session) */
        }
    }
    if (o->sp.n_threads) cli_check_threads(o->sp.n_threads);
    if (!o->seed_set) o->smp.seed = (uint64_t)nstf_time_seed();
    return -1;
}

static int check_cache_types(const run_opts *o, nstf_session *s) {
    const char *have = nstf_session_kv_type(s);
    const char *asked[2] = {o->cache_k, o->cache_v}, *flag[2] = {"-ctk", "-ctv"};
    for (int i = 0; i < 2; i++)
        if (asked[i] && strcmp(asked[i], "auto") && strcmp(asked[i], have)) {
            cli_err("%s %s: the %s backend keeps the KV cache in %s (%s %s, or leave it out)", flag[i], asked[i],
                    nstf_session_backend_name(s), have, flag[i], have);
            return 2;
        }
    return -1;
}

/* The chat template in use: with -v, and always when the model has none. */
static void say_template(const run_opts *o, nstf_session *s) {
    bool from_model = false;
    const char *t = nstf_session_chat_template(s, &from_model);
    if (!t) return; /* rendering will fail with the reason */
    if (o->sp.chat_template) {
        if (o->sp.verbose) fprintf(stderr, "nstf %s: chat template: %s (--chat-template)\n", cli_cmd, t);
    } else if (!from_model) {
        fprintf(stderr, "nstf %s: the model has no chat template; using %s (choose with --chat-template)\n", cli_cmd, t);
    } else if (o->sp.verbose) {
        fprintf(stderr, "nstf %s: chat template: %s (the model's)\n", cli_cmd, t);
    }
}

void run_print_speed(const nstf_gen_stats *gs) {
    fprintf(stderr,
            "nstf %s: prompt %lld tokens in %.1f ms (%.1f tokens/s); generation %lld tokens, %lld decode steps in %.1f "
            "ms (%.1f tokens/s)\n",
            cli_cmd, (long long)gs->n_prompt, gs->prompt_ms, gs->prompt_ms > 0 ? gs->n_prompt * 1e3 / gs->prompt_ms : 0.0,
            (long long)gs->n_gen, (long long)gs->n_decode, gs->gen_ms,
            gs->gen_ms > 0 && gs->n_decode > 0 ? gs->n_decode * 1e3 / gs->gen_ms : 0.0);
}

static bool on_piece(void *user, int32_t token, const char *piece, size_t len) {
    (void)token;
    *(size_t *)user += len;
    fwrite(piece, 1, len, stdout);
    fflush(stdout);
    return true;
}

static void print_prompt_tokens(nstf_session *s, const run_opts *o, const char *prompt) {
    int32_t *ids = NULL;
    int64_t n = 0;
    if (nstf_session_prompt_tokens(s, prompt, o->chat, o->system, o->special, &ids, &n) != NSTF_OK) return;
    fprintf(stderr, "nstf %s: prompt: %lld tokens\n", cli_cmd, (long long)n);
    for (int64_t i = 0; i < n; i++) {
        char piece[64];
        int64_t k = nstf_session_token_piece(s, ids[i], piece, sizeof piece - 1);
        piece[k < 0 ? 0 : k < (int64_t)sizeof piece - 1 ? k : (int64_t)sizeof piece - 1] = 0;
        for (char *c = piece; *c; c++)
            if (*c == '\n') *c = ' ';
        fprintf(stderr, "%6d -> '%s'\n", ids[i], piece);
    }
    free(ids);
}

/* Open the session (and check what depends on it); NULL with *rc set. */
static nstf_session *open_session(const run_opts *o, int *rc) {
    nstf_session *s = NULL;
    if (nstf_session_open(o->model, &o->sp, &s) != NSTF_OK) {
        cli_lib_err();
        *rc = 1;
        return NULL;
    }
    if ((*rc = check_cache_types(o, s)) >= 0) {
        nstf_session_close(s);
        return NULL;
    }
    *rc = 0;
    if (o->n_gpu_layers > 0 && !nstf_session_on_gpu(s))
        fprintf(stderr, "nstf %s: warning: -ngl %d: no GPU in use (%s); running on the CPU\n", cli_cmd,
                o->n_gpu_layers, nstf_gpu_runtime() ? "no device answered" : "this build has no GPU backend");
    /* weights paged in with a progress bar on a terminal (a line with -v) */
    nstf_weights_touch(s, stderr, o->sp.verbose);
    if (o->sp.verbose) {
        nstf_mem_report_print_session(stderr, s);
        fprintf(stderr, "nstf %s: seed %llu, %d threads\n", cli_cmd, (unsigned long long)o->smp.seed,
                nstf_session_threads(s));
    }
    if ((o->chat || o->interactive) && (!nstf_proc_active() || nstf_proc_rank() == 0)) say_template(o, s);
    return s;
}

static int run_one(run_opts o);

static int run_main(int argc, char **argv, bool chat_cmd) {
    run_opts o;
    int rc = parse(argc, argv, &o, chat_cmd, chat_cmd ? chat_usage : run_usage);
    if (rc >= 0) return rc;
    /* under mpirun: one tensor-parallel rank per process */
    if ((rc = cli_launch_tp(&o.sp.n_tp, &o.smp.seed)) >= 0) return rc;
    return cli_launch_end(run_one(o));
}

/* The prompt of -f FILE, or of stdin (-f -, or a pipe without -p) into
 * o->prompt (*owned its memory). Under mpirun stdin reaches rank 0 only:
 * rank 0 reads it and every rank gets its text. -1 to go on, else the
 * exit status. */
static int read_prompt(run_opts *o, char **owned) {
    const bool launched = nstf_proc_active(), lead = !launched || nstf_proc_rank() == 0;
    const bool from_stdin =
        o->prompt_file ? !strcmp(o->prompt_file, "-") : !o->interactive && !o->prompt && (launched || !isatty(STDIN_FILENO));
    if (o->prompt_file && !from_stdin) {
        if (!(o->prompt = *owned = read_prompt_file(o->prompt_file))) return 1;
    } else if (from_stdin) {
        char *text = NULL;
        bool failed = false;
        if (lead && (o->prompt_file || !isatty(STDIN_FILENO)))
            failed = !(text = read_prompt_file("-"));
        if (launched && cli_launch_share(&text, CLI_LAUNCH_WAIT_MS)) {
            free(text);
            return 1;
        }
        if (failed) return 1;
        o->prompt = *owned = text;
    }
    if (!o->interactive && (!o->prompt || !*o->prompt)) {
        if (lead) cli_err("no prompt given (-p TEXT, -f FILE, or text on stdin)");
        return 2;
    }
    return -1;
}

static int run_one(run_opts o) {
    int rc = 0;
    char *owned = NULL;
    if ((rc = read_prompt(&o, &owned)) >= 0) {
        free(owned);
        return rc;
    }
    rc = 0;
    cli_sigint_install(true); /* a Ctrl-C while loading stops before the first token */
    nstf_session *s = open_session(&o, &rc);
    if (!s) {
        free(owned);
        return rc;
    }
    if (o.interactive) {
        rc = cli_sigint ? 130 : chat_loop(s, &o);
    } else {
        /* under mpirun every rank must stop at the same token: no Ctrl-C
         * stop there (mpirun ends the launch on one) */
        o.gp.interrupt = nstf_proc_active() ? NULL : (const volatile int *)&cli_sigint;
        if (o.verbose_prompt) print_prompt_tokens(s, &o, o.prompt);
        if (o.display_prompt) {
            fputs(o.prompt, stdout);
            fflush(stdout);
        }
        nstf_gen_stats gs;
        size_t printed = o.display_prompt ? strlen(o.prompt) : 0;
        nstf_status st =
            nstf_session_complete(s, o.prompt, o.chat, o.system, o.special, &o.smp, &o.gp, on_piece, &printed, &gs);
        if (printed) fputc('\n', stdout);
        fflush(stdout);
        if (st != NSTF_OK) {
            cli_lib_err();
            rc = 1;
        } else {
            if (gs.stop == NSTF_STOP_CONTEXT_FULL)
                cli_err("the context is full (%lld tokens): generation stopped; raise -c, or use --context-shift to "
                        "go on",
                        (long long)gs.n_past);
            if (!nstf_proc_active() || nstf_proc_rank() == 0) run_print_speed(&gs);
            if (gs.stop == NSTF_STOP_INTERRUPTED) rc = 130;
        }
        if (o.sp.verbose) nstf_mem_report_print_session(stderr, s);
    }
    free(owned);
    nstf_session_close(s);
    return rc;
}

int cmd_run(int argc, char **argv) { return run_main(argc, argv, false); }
int cmd_chat(int argc, char **argv) { return run_main(argc, argv, true); }
