/* cli_common.c — the flags every subcommand shares and opening model, backend and
 * engine from them (see cli.h). */
#include "cli/cli.h"
#include "model/control_vector.h"
#include "model/lora.h"
#include "engine/spec.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

volatile sig_atomic_t *cli_interrupted;

bool cli_was_interrupted(void) { return cli_interrupted && *cli_interrupted; }

void cli_model_opts_init(cli_model_opts *o) {
    memset(o, 0, sizeof *o);
    o->device = "auto";
    o->dummy_dtype = LLMI_BF16;
    o->engine = engine_opts_defaults();
    o->backend.n_threads = 0;
    o->backend.gpu_index = 0;
    o->backend.gpu_mem_util = (float)LLMI_GPU_MEM_UTIL_DEFAULT;
    o->backend.kv_dtype = LLMI_KV_F32;
    o->rope.scaling = -1;
}

const char *cli_flag_value(int argc, char **argv, int *i, llmi_status *st) {
    if (*i + 1 >= argc) {
        llmi_fail(st, LLMI_E_USAGE, "%s: missing value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int cli_parse_long(const char *flag, const char *val, long min, long max, long *out, llmi_status *st) {
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno || end == val || *end || isspace((unsigned char)*val))
        return llmi_fail(st, LLMI_E_USAGE, "%s: '%s' is not an integer", flag, val);
    if (v < min || v > max) return llmi_fail(st, LLMI_E_USAGE, "%s: %ld is outside %ld..%ld", flag, v, min, max);
    *out = v;
    return LLMI_OK;
}

int cli_parse_float(const char *flag, const char *val, double min, double max, double *out, llmi_status *st) {
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    if (errno || end == val || *end || isspace((unsigned char)*val) || !isfinite(v))
        return llmi_fail(st, LLMI_E_USAGE, "%s: '%s' is not a number", flag, val);
    if (v < min || v > max) return llmi_fail(st, LLMI_E_USAGE, "%s: %g is outside %g..%g", flag, v, min, max);
    *out = v;
    return LLMI_OK;
}

/* The one comma-list splitter: each item parsed by one() into the next elem_size bytes. */
typedef int (*list_item_fn)(const char *flag, const char *item, const double lim[2], void *dst, llmi_status *st);

static int parse_list(const char *flag, const char *val, const double lim[2], size_t elem_size, list_item_fn one,
                      void **out, int *n, llmi_status *st) {
    *out = NULL;
    *n = 0;
    int cap = 1;
    for (const char *p = val; *p; p++) cap += *p == ',';
    char *v = malloc((size_t)cap * elem_size);
    char *copy = strdup(val);
    if (!v || !copy) {
        free(v);
        free(copy);
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", flag);
    }
    int k = 0;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (one(flag, tok, lim, v + (size_t)k * elem_size, st)) {
            free(v);
            free(copy);
            return st->code;
        }
        k++;
    }
    free(copy);
    if (k == 0) {
        free(v);
        return llmi_fail(st, LLMI_E_USAGE, "%s: empty list", flag);
    }
    *out = v;
    *n = k;
    return LLMI_OK;
}

static int long_item(const char *flag, const char *item, const double lim[2], void *dst, llmi_status *st) {
    return cli_parse_long(flag, item, (long)lim[0], (long)lim[1], dst, st);
}

static int float_item(const char *flag, const char *item, const double lim[2], void *dst, llmi_status *st) {
    return cli_parse_float(flag, item, lim[0], lim[1], dst, st);
}

int cli_parse_long_list(const char *flag, const char *val, long min, long max, long **out, int *n,
                        llmi_status *st) {
    const double lim[2] = {(double)min, (double)max};
    void *v = NULL;
    int rc = parse_list(flag, val, lim, sizeof **out, long_item, &v, n, st);
    *out = v;
    return rc;
}

int cli_parse_float_list(const char *flag, const char *val, double min, double max, double **out, int *n,
                         llmi_status *st) {
    const double lim[2] = {min, max};
    void *v = NULL;
    int rc = parse_list(flag, val, lim, sizeof **out, float_item, &v, n, st);
    *out = v;
    return rc;
}

int cli_parse_spec_mode(const char *flag, const char *val, llmi_spec_mode *out, llmi_status *st) {
    if (!strcmp(val, "off")) *out = LLMI_SPEC_OFF;
    else if (!strcmp(val, "ngram")) *out = LLMI_SPEC_NGRAM;
    else if (!strcmp(val, "draft")) *out = LLMI_SPEC_DRAFT;
    else return llmi_fail(st, LLMI_E_USAGE, "%s: '%s' is not one of ngram, draft, off", flag, val);
    return LLMI_OK;
}

int cli_parse_spec_ngram(const char *flag, const char *val, llmi_spec_params *sp, llmi_status *st) {
    long *v = NULL;
    int n = 0;
    if (cli_parse_long_list(flag, val, 1, LLMI_SPEC_MAX_NGRAM, &v, &n, st)) return st->code;
    int rc = LLMI_OK;
    if (n > 2) rc = llmi_fail(st, LLMI_E_USAGE, "%s: give N or MIN,MAX (got %d values)", flag, n);
    else if (n == 2 && v[0] > v[1]) rc = llmi_fail(st, LLMI_E_USAGE, "%s: MIN %ld exceeds MAX %ld", flag, v[0], v[1]);
    else {
        sp->ngram_min = (int)v[0];
        sp->ngram_max = (int)v[n - 1];
    }
    free(v);
    return rc;
}

/* "512M", "2G", "1048576" -> bytes. */
static int parse_size(const char *flag, const char *val, size_t *out, llmi_status *st) {
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    double mult = 1;
    if (*end == 'K' || *end == 'k') mult = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') mult = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g') mult = 1024.0 * 1024 * 1024, end++;
    if (*end == 'i' || *end == 'B') end++;
    if (*end == 'B') end++;
    if (errno || end == val || *end || !(v > 0) || v * mult > 1e15)
        return llmi_fail(st, LLMI_E_USAGE, "%s: '%s' is not a size (e.g. 512M, 2G)", flag, val);
    *out = (size_t)(v * mult);
    return LLMI_OK;
}

#define CLI_STR_(x) #x
#define CLI_STR(x) CLI_STR_(x)

const char *cli_model_flags_help(void) {
    return "Model and device:\n"
           "  -m, --model PATH        GGUF file or Hugging Face directory (default: the fetched\n"
           "                          SmolLM2-135M-Instruct Q4_1, see scripts/fetch-model.sh; $LLMI_MODEL)\n"
           "  --dummy SPEC            synthetic weights instead of -m: a preset (smollm2-135m, llama-2-7b,\n"
           "                          llama-3-8b, mistral-7b, qwen2.5-7b) or a config.json path\n"
           "  --dummy-dtype T         weight dtype of --dummy: f32 f16 bf16 q8_0 q4_0 q4_1 (default bf16), or\n"
           "                          int4[-gN]: GPTQ/AWQ-style int4 linears, N columns a group (default 128)\n"
           "  --device D              cpu, cuda or auto (default auto: cuda when usable, else cpu)\n"
           "  -t, --threads N         CPU threads (default: every CPU in the affinity mask)\n"
           "  --gpu N                 CUDA device index (default 0)\n"
           "  --gpu-mem-util F        fraction of GPU memory to use (default " CLI_STR(LLMI_GPU_MEM_UTIL_DEFAULT) ")\n"
           "  --lora PATH             merge a LoRA adapter into the weights: a PEFT directory (adapter_config.json,\n"
           "                          adapter_model.safetensors) or a llama.cpp GGUF adapter file; W += (alpha / r) B A,\n"
           "                          as PEFT's merge_and_unload; quantized linears become bf16 first (repeatable, up to 8)\n"
           "  --lora-scaled PATH S    the same with the adapter's product scaled by S (llama.cpp's flag; its\n"
           "                          one-argument forms too: --lora A,B and --lora-scaled A:S1,B:S2)\n"
           "  --control-vector FILE   add a llama.cpp control vector (GGUF, direction.N tensors) to the output of\n"
           "                          layer N, as llama.cpp does (repeatable, up to 8; FILE,FILE2 too)\n"
           "  --control-vector-scaled FILE S   the same scaled by S (or FILE:S[,FILE2:S2]); files add up\n"
           "  --control-vector-layer-range START END   layers the control vectors apply to, inclusive\n"
           "                          (default 1 to the last; there is never one for layer 0)\n"
           "  --rope-scaling T        RoPE scaling over the model file's: none, linear or yarn (llama.cpp's flags)\n"
           "  --rope-scale N          context scale factor (or --rope-freq-scale 1/N); --rope-freq-base N: RoPE base\n"
           "  --yarn-orig-ctx N       YaRN's original context (default: the model's); --yarn-beta-fast N,\n"
           "                          --yarn-beta-slow N: its correction range (default 32 and 1)\n"
           "Engine:\n"
           "  -c, --ctx-size N        context length (default: the model's)\n"
           "  --kv-type T             KV cache dtype: f32, f16, bf16, q8, fp8 (default f32 on cpu, bf16 on cuda)\n"
           "  --block-size N          tokens per KV block (default 16)\n"
           "  --num-blocks N          KV blocks (default: from --kv-mem or the device's memory)\n"
           "  --kv-mem SIZE           KV cache budget, e.g. 512M, 4G (default: 1G on cpu, the\n"
           "                          --gpu-mem-util share of free memory on cuda)\n"
           "  --max-batch-tokens N    tokens per engine step (default 512 on cpu, 2048 on cuda)\n"
           "  --prefill-chunk N       longest prompt piece of one sequence per step (default: no limit)\n"
           "  --max-seqs N            sequences running at once (default 256)\n"
           "  --sched P               scheduling policy: fifo or prefill-first (default fifo; bench's\n"
           "                          sweep and profile: prefill-first, every prompt before decoding)\n"
           "  --no-prefix-cache       recompute every prompt (default: reuse the K/V of cached prefixes)\n"
           "  --prompt-cache DIR      also keep prefix K/V in DIR across runs (zstd files, one per block)\n"
           "  --prompt-cache-max SIZE cap on DIR's size, least recently used entries go first (default 4G)\n";
}

static int parse_dtype(const char *flag, const char *v, llmi_dtype *out, llmi_status *st) {
    static const struct { const char *name; llmi_dtype t; } names[] = {
        {"f32", LLMI_F32}, {"f16", LLMI_F16}, {"bf16", LLMI_BF16},
        {"q8_0", LLMI_Q8_0}, {"q4_0", LLMI_Q4_0}, {"q4_1", LLMI_Q4_1},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcasecmp(v, names[i].name)) {
            *out = names[i].t;
            return LLMI_OK;
        }
    return llmi_fail(st, LLMI_E_USAGE, "%s: unknown dtype '%s' (f32, f16, bf16, q8_0, q4_0, q4_1)", flag, v);
}

int cli_parse_sampling_flag(llmi_sampling *s, int argc, char **argv, int *i, llmi_status *st) {
    static const struct { const char *flag; double min, max; bool integer; size_t at; } flags[] = {
        {"--temp", 0, 100, false, offsetof(llmi_sampling, temperature)},
        {"--top-k", 0, 1 << 24, true, offsetof(llmi_sampling, top_k)},
        {"--top-p", 0, 1, false, offsetof(llmi_sampling, top_p)},
        {"--min-p", 0, 1, false, offsetof(llmi_sampling, min_p)},
        {"--typical", 0, 1, false, offsetof(llmi_sampling, typical_p)},
        {"--top-nsigma", -1, 100, false, offsetof(llmi_sampling, top_n_sigma)},
        {"--xtc-probability", 0, 1, false, offsetof(llmi_sampling, xtc_probability)},
        {"--xtc-threshold", 0, 1, false, offsetof(llmi_sampling, xtc_threshold)},
        /* 0 would divide repeated tokens' positive logits by zero: +inf, repeated forever */
        {"--repeat-penalty", 0.01, 100, false, offsetof(llmi_sampling, repeat_penalty)},
        {"--frequency-penalty", -100, 100, false, offsetof(llmi_sampling, frequency_penalty)},
        {"--presence-penalty", -100, 100, false, offsetof(llmi_sampling, presence_penalty)},
        {"--repeat-last-n", -1, 1 << 24, true, offsetof(llmi_sampling, repeat_last_n)},
        {"--dry-multiplier", 0, 100, false, offsetof(llmi_sampling, dry_multiplier)},
        {"--dry-base", 0, 100, false, offsetof(llmi_sampling, dry_base)},
        {"--dry-allowed-length", 0, 1 << 20, true, offsetof(llmi_sampling, dry_allowed_length)},
        {"--dry-penalty-last-n", -1, 1 << 24, true, offsetof(llmi_sampling, dry_penalty_last_n)},
        {"--mirostat", 0, 2, true, offsetof(llmi_sampling, mirostat)},
        {"--mirostat-lr", 0, 100, false, offsetof(llmi_sampling, mirostat_eta)},
        {"--mirostat-ent", 0, 100, false, offsetof(llmi_sampling, mirostat_tau)},
    };
    const char *a = argv[*i];
    for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++) {
        if (strcmp(a, flags[k].flag)) continue;
        const char *v = cli_flag_value(argc, argv, i, st);
        if (!v) return -1;
        char *dst = (char *)s + flags[k].at;
        if (flags[k].integer) {
            long n;
            if (cli_parse_long(a, v, (long)flags[k].min, (long)flags[k].max, &n, st)) return -1;
            *(int *)dst = (int)n;
        } else {
            double f;
            if (cli_parse_float(a, v, flags[k].min, flags[k].max, &f, st)) return -1;
            *(float *)dst = (float)f;
        }
        return 1;
    }
    return 0;
}

/* "PATH:SCALE" with SCALE a number: llama.cpp's one-argument --lora-scaled and
 * --control-vector-scaled element. */
static bool has_scale(const char *v) {
    const char *colon = strrchr(v, ':');
    if (!colon || colon == v || !colon[1]) return false;
    char *end;
    (void)strtod(colon + 1, &end);
    return *end == '\0' || *end == ',';
}

static int add_scaled(cli_scaled_files *l, const char *flag, const char *path, size_t len, double scale,
                      llmi_status *st) {
    if (l->n >= LLMI_MAX_LORA) return llmi_fail(st, LLMI_E_USAGE, "%s: at most %d files", flag, LLMI_MAX_LORA);
    if (len == 0) return llmi_fail(st, LLMI_E_USAGE, "%s: an empty path", flag);
    if (len >= sizeof l->path[0]) return llmi_fail(st, LLMI_E_USAGE, "%s: path too long", flag);
    memcpy(l->path[l->n], path, len);
    l->path[l->n][len] = '\0';
    l->scale[l->n++] = (float)scale;
    return LLMI_OK;
}

/* llama.cpp's current forms: --lora A[,B...] and --lora-scaled A:SCALE[,B:SCALE...] (the same
 * for --control-vector and --control-vector-scaled). */
static int add_scaled_list(cli_scaled_files *l, const char *flag, const char *v, bool scaled, llmi_status *st) {
    for (const char *p = v;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        double scale = 1;
        if (scaled) {
            const char *colon = memrchr(p, ':', len);
            char num[64];
            size_t nl = colon ? len - (size_t)(colon + 1 - p) : 0;
            if (!colon || colon == p || nl == 0 || nl >= sizeof num)
                return llmi_fail(st, LLMI_E_USAGE, "%s: \"%.*s\" is not PATH:SCALE", flag, (int)(len < 200 ? len : 200), p);
            memcpy(num, colon + 1, nl);
            num[nl] = '\0';
            if (cli_parse_float(flag, num, -1e4, 1e4, &scale, st)) return st->code;
            len = (size_t)(colon - p);
        }
        if (add_scaled(l, flag, p, len, scale, st)) return st->code;
        if (!comma) return LLMI_OK;
        p = comma + 1;
    }
}

/* --lora / --lora-scaled (or --control-vector / --control-vector-scaled, `scaled` saying
 * which) into l: llama.cpp's one-argument forms, and --*-scaled's earlier two-argument form
 * PATH SCALE.  Returns 0, or -1 with st set. */
static int parse_scaled_flag(cli_scaled_files *l, bool scaled, int argc, char **argv, int *i, llmi_status *st) {
    const char *a = argv[*i], *v = cli_flag_value(argc, argv, i, st);
    if (!v) return -1;
    if (scaled && !has_scale(v)) {
        const char *path = v;
        double f;
        if (!(v = cli_flag_value(argc, argv, i, st)) || cli_parse_float(a, v, -1e4, 1e4, &f, st) ||
            add_scaled(l, a, path, strlen(path), f, st))
            return -1;
        return 0;
    }
    return add_scaled_list(l, a, v, scaled, st) ? -1 : 0;
}

int cli_parse_model_flag(cli_model_opts *o, int argc, char **argv, int *i, llmi_status *st) {
    const char *a = argv[*i];
    const char *v;
    long n;
    double f;
#define VALUE() do { if (!(v = cli_flag_value(argc, argv, i, st))) return -1; } while (0)
#define IS(x) (!strcmp(a, x))
    if (IS("-m") || IS("--model")) {
        VALUE();
        o->model_path = v;
    } else if (IS("--dummy")) {
        VALUE();
        o->dummy = v;
    } else if (IS("--dummy-dtype")) {
        VALUE();
        if (!strncasecmp(v, "int4", 4)) {
            /* int4 or int4-gN: a GPTQ/AWQ-style int4 grid of N columns a group */
            o->dummy_dtype = LLMI_I4G;
            o->dummy_group = 128;
            if (v[4] && (strncasecmp(v + 4, "-g", 2) || cli_parse_long(a, v + 6, 2, 1 << 16, &n, st))) {
                if (!st->code) llmi_fail(st, LLMI_E_USAGE, "%s: '%s' is not int4 or int4-gN (e.g. int4-g128)", a, v);
                return -1;
            }
            if (v[4]) o->dummy_group = (int)n;
        } else if (parse_dtype(a, v, &o->dummy_dtype, st)) {
            return -1;
        }
    } else if (IS("--device")) {
        VALUE();
        if (strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "auto")) {
            llmi_fail(st, LLMI_E_USAGE, "--device: '%s' is not cpu, cuda or auto", v);
            return -1;
        }
        o->device = v;
    } else if (IS("-t") || IS("--threads")) {
        VALUE();
        if (cli_parse_long(a, v, 1, 1024, &n, st)) return -1;
        o->backend.n_threads = (int)n;
    } else if (IS("--gpu")) {
        VALUE();
        if (cli_parse_long(a, v, 0, 63, &n, st)) return -1;
        o->backend.gpu_index = (int)n;
    } else if (IS("--gpu-mem-util")) {
        VALUE();
        if (cli_parse_float(a, v, 0.05, 1.0, &f, st)) return -1;
        o->backend.gpu_mem_util = (float)f;
    } else if (IS("--lora") || IS("--lora-scaled")) {
        if (parse_scaled_flag(&o->lora, IS("--lora-scaled"), argc, argv, i, st)) return -1;
    } else if (IS("--control-vector") || IS("--control-vector-scaled")) {
        if (parse_scaled_flag(&o->control, IS("--control-vector-scaled"), argc, argv, i, st)) return -1;
    } else if (IS("--control-vector-layer-range")) {
        /* llama.cpp's two values, START and END, inclusive; 0 or less: the default */
        long lo, hi;
        VALUE();
        if (cli_parse_long(a, v, -1, 1 << 20, &lo, st)) return -1;
        VALUE();
        if (cli_parse_long(a, v, -1, 1 << 20, &hi, st)) return -1;
        o->control_start = (int)lo, o->control_end = (int)hi;
        o->control_range_set = true;
    } else if (IS("--rope-scaling")) {
        VALUE();
        if (!strcmp(v, "none")) o->rope.scaling = LLMI_ROPE_SCALING_NONE;
        else if (!strcmp(v, "linear")) o->rope.scaling = LLMI_ROPE_SCALING_LINEAR;
        else if (!strcmp(v, "yarn")) o->rope.scaling = LLMI_ROPE_SCALING_YARN;
        else return llmi_fail(st, LLMI_E_USAGE, "--rope-scaling: '%s' is not none, linear or yarn", v), -1;
        o->rope_set = true;
    } else if (IS("--rope-scale") || IS("--rope-freq-scale")) {
        VALUE();
        if (cli_parse_float(a, v, 1e-4, 1e4, &f, st)) return -1;
        o->rope.factor = (float)(IS("--rope-scale") ? f : 1.0 / f);   /* llama.cpp: freq scale = 1 / scale */
        o->rope_set = true;
    } else if (IS("--rope-freq-base")) {
        VALUE();
        if (cli_parse_float(a, v, 1, 1e12, &f, st)) return -1;
        o->rope.freq_base = (float)f;
        o->rope_set = true;
    } else if (IS("--yarn-orig-ctx")) {
        VALUE();
        if (cli_parse_long(a, v, 1, 1 << 24, &n, st)) return -1;
        o->rope.orig_ctx = (int)n;
        o->rope_set = true;
    } else if (IS("--yarn-beta-fast") || IS("--yarn-beta-slow")) {
        VALUE();
        if (cli_parse_float(a, v, 1e-4, 1e4, &f, st)) return -1;
        *(IS("--yarn-beta-fast") ? &o->rope.beta_fast : &o->rope.beta_slow) = (float)f;
        o->rope_set = true;
    } else if (IS("-c") || IS("--ctx-size")) {
        VALUE();
        if (cli_parse_long(a, v, 1, 1 << 24, &n, st)) return -1;
        o->engine.max_ctx = (int)n;
    } else if (IS("--kv-type")) {
        VALUE();
        if (kv_dtype_parse(v, &o->backend.kv_dtype)) {
            llmi_fail(st, LLMI_E_USAGE, "--kv-type: '%s' is not f32, f16, bf16, q8 or fp8", v);
            return -1;
        }
        o->kv_type_set = true;
    } else if (IS("--block-size")) {
        VALUE();
        if (cli_parse_long(a, v, 1, 1024, &n, st)) return -1;
        o->engine.block_size = (int)n;
    } else if (IS("--num-blocks")) {
        VALUE();
        if (cli_parse_long(a, v, 1, 1 << 30, &n, st)) return -1;
        o->engine.num_blocks = (int)n;
    } else if (IS("--kv-mem")) {
        VALUE();
        if (parse_size(a, v, &o->engine.kv_mem_bytes, st)) return -1;
    } else if (IS("--max-batch-tokens")) {
        VALUE();
        if (cli_parse_long(a, v, 1, 1 << 20, &n, st)) return -1;
        o->engine.max_batch_tokens = (int)n;
        o->max_batch_tokens_set = true;
    } else if (IS("--prefill-chunk")) {
        VALUE();
        if (cli_parse_long(a, v, 0, 1 << 24, &n, st)) return -1;
        o->engine.prefill_chunk = (int)n;
    } else if (IS("--max-seqs")) {
        VALUE();
        if (cli_parse_long(a, v, 1, 1 << 16, &n, st)) return -1;
        o->engine.max_seqs = (int)n;
    } else if (IS("--no-prefix-cache")) {
        o->engine.prefix_cache = false;
        return 1;
    } else if (IS("--prompt-cache")) {
        VALUE();
        if (!*v) {
            llmi_fail(st, LLMI_E_USAGE, "--prompt-cache: empty directory name");
            return -1;
        }
        o->engine.prompt_cache_dir = v;
    } else if (IS("--prompt-cache-max")) {
        VALUE();
        if (parse_size(a, v, &o->engine.prompt_cache_max, st)) return -1;
    } else if (IS("--sched")) {
        VALUE();
        if (!strcmp(v, sched_policy_name(SCHED_FIFO))) o->engine.policy = SCHED_FIFO;
        else if (!strcmp(v, sched_policy_name(SCHED_PREFILL_FIRST))) o->engine.policy = SCHED_PREFILL_FIRST;
        else {
            llmi_fail(st, LLMI_E_USAGE, "--sched: '%s' is not fifo or prefill-first", v);
            return -1;
        }
        o->sched_set = true;
    } else {
        return 0;
    }
#undef VALUE
#undef IS
    return 1;
}

const char *cli_default_model_path(char *buf, size_t cap) {
    const char *env = getenv("LLMI_MODEL");
    if (env && *env) {
        snprintf(buf, cap, "%s", env);
        return buf;
    }
    const char *cache = getenv("LLMI_CACHE");
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (cache && *cache) snprintf(buf, cap, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", cache);
    else if (xdg && *xdg) snprintf(buf, cap, "%s/llmi/SmolLM2-135M-Instruct.Q4_1.gguf", xdg);
    else snprintf(buf, cap, "%s/.cache/llmi/SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : ".");
    return buf;
}

int cli_merge_loras(const cli_model_opts *o, llmi_model *m, llmi_status *st) {
    for (int i = 0; i < o->lora.n; i++)
        if (model_merge_lora(m, o->lora.path[i], o->lora.scale[i], st)) {
            model_free(m);
            return st->code;
        }
    return LLMI_OK;
}

/* The RoPE flags applied (and longrope's factors chosen for -c), the --lora adapters
 * merged, then the control vectors added; on failure m is freed. */
static int apply_adapters(const cli_model_opts *o, llmi_model *m, llmi_status *st) {
    if (o->rope_set && model_override_rope(m, &o->rope, st)) {
        model_free(m);
        return st->code;
    }
    model_select_longrope(m, o->engine.max_ctx);
    if (cli_merge_loras(o, m, st)) return st->code;
    if (!o->control.n && !o->control_range_set) return LLMI_OK;
    const char *paths[LLMI_MAX_LORA];
    for (int i = 0; i < o->control.n; i++) paths[i] = o->control.path[i];
    if (model_add_control_vectors(m, paths, o->control.scale, o->control.n, o->control_start, o->control_end, st)) {
        model_free(m);
        return st->code;
    }
    return LLMI_OK;
}

int cli_open_model(const cli_model_opts *o, llmi_model *m, llmi_status *st) {
    memset(m, 0, sizeof *m);
    if (o->dummy) {
        if (o->model_path) return llmi_fail(st, LLMI_E_USAGE, "--dummy and -m: give one or the other");
        if (model_load_dummy(o->dummy, o->dummy_dtype, o->dummy_group, m, st)) return st->code;
        return apply_adapters(o, m, st);
    }
    char def[1024];
    const char *path = o->model_path;
    if (!path) {
        path = cli_default_model_path(def, sizeof def);
        struct stat sb;
        if (stat(path, &sb) != 0)
            return llmi_fail(st, LLMI_E_USAGE,
                             "-m: no model given and the default model is not at %s (run scripts/fetch-model.sh)",
                             path);
    }
    llmi_load_opts lo = {0};
    if (model_load(path, &lo, m, st)) return st->code;
    return apply_adapters(o, m, st);
}

int cli_open_backend(const cli_model_opts *o, const llmi_model *m, llmi_backend **b, llmi_status *st) {
    llmi_backend_opts bo = o->backend;
    bo.block_size = o->engine.block_size;
    bo.max_seqs = o->engine.max_seqs;
    bo.max_batch_tokens = o->engine.max_batch_tokens;
    bo.max_ctx = o->engine.max_ctx;
    bool want_cuda = !strcmp(o->device, "cuda");
    bool auto_dev = !strcmp(o->device, "auto");
    /* auto picks cuda only where a GPU is visible; a GPU that is there but cannot be
     * used is reported before the CPU takes over. */
    if (want_cuda || (auto_dev && backend_cuda_device_count() > 0)) {
        if (!o->max_batch_tokens_set) bo.max_batch_tokens = 2048;
        if (!o->kv_type_set) bo.kv_dtype = LLMI_KV_BF16;
        llmi_status cst = {0};
        if (backend_cuda_create(m, &bo, b, &cst) == LLMI_OK) return LLMI_OK;
        if (want_cuda) return llmi_fail(st, cst.code, "%s", cst.msg);
        /* auto: say why the GPU was not used, then run on the CPU as asked. */
        fprintf(stderr, "llmi: --device auto: using cpu (%s)\n", cst.msg);
        bo.max_batch_tokens = o->engine.max_batch_tokens;
        bo.kv_dtype = o->backend.kv_dtype;
    }
    if (!o->max_batch_tokens_set) bo.max_batch_tokens = 512;
    return backend_cpu_create(m, &bo, b, st);
}

/* The KV cache size: the flags' when given, else what the workload needs when the
 * backend can hold it, else the backend's budget (capped on the cpu).  More than the
 * backend can hold (many long requests) leaves the budget: requests queue or get
 * preempted. */
static void kv_size(const llmi_backend *b, const llmi_backend *db, const cli_engine_fit *fit, llmi_engine_opts *eo) {
    if (eo->num_blocks != 0 || eo->kv_mem_bytes != 0) return;
    if (fit && fit->need_blocks > 0) {
        long need = fit->need_blocks < (1L << 30) ? fit->need_blocks : (1L << 30);
        size_t per_block = b->kv_block_bytes(b) + (db ? db->kv_block_bytes(db) : 0);
        if (!per_block || (size_t)need <= b->kv_budget_bytes(b) / per_block) {
            eo->num_blocks = (int)need;
            return;
        }
    }
    if (!strcmp(b->name, "cpu")) {
        size_t budget = b->kv_budget_bytes(b);
        eo->kv_mem_bytes = budget < CLI_CPU_KV_DEFAULT_BYTES ? budget : CLI_CPU_KV_DEFAULT_BYTES;
    }
}

static void close_draft(llmi_model *dm, llmi_backend *db) {
    if (db) db->destroy(db);
    if (dm) model_free(dm);
    free(dm);
}

/* Loads --draft-model, checks it can propose for m (before its weights go anywhere), and
 * makes its backend: target's kind (b->name) with the options the target resolved. */
static int open_draft(const char *path, const cli_model_opts *fo, const llmi_model *m, const llmi_backend *b,
                      llmi_model **dm_out, llmi_backend **db_out, llmi_status *st) {
    llmi_model *dm = calloc(1, sizeof *dm);
    if (!dm) return llmi_fail(st, LLMI_E_RUNTIME, "--draft-model: out of memory");
    llmi_status lst = {0};
    llmi_load_opts lo = {0};
    if (model_load(path, &lo, dm, &lst)) {
        free(dm);
        return llmi_fail(st, lst.code, "--draft-model: %s", lst.msg);
    }
    *dm_out = dm;
    int max_ctx = fo->engine.max_ctx > 0 ? fo->engine.max_ctx : m->cfg.max_ctx;
    model_select_longrope(dm, max_ctx);
    if (spec_draft_check(m, dm, max_ctx, st)) return st->code;
    cli_model_opts dopts = *fo;
    dopts.device = b->name;
    dopts.backend = b->opts;
    dopts.kv_type_set = true;
    dopts.engine.max_batch_tokens = b->opts.max_batch_tokens;
    dopts.max_batch_tokens_set = true;
    if (cli_open_backend(&dopts, dm, db_out, &lst)) return llmi_fail(st, lst.code, "--draft-model %s: %s", path, lst.msg);
    return LLMI_OK;
}

int cli_open_engine(const cli_model_opts *o, const llmi_model *m, const cli_engine_fit *fit, llmi_backend **b,
                    llmi_engine **e, llmi_status *st) {
    *b = NULL;
    *e = NULL;
    cli_model_opts fo = *o;
    if (fit && fit->kv_dtype_set) {
        fo.backend.kv_dtype = fit->kv_dtype;
        fo.kv_type_set = true;
    }
    if (fit && fit->block_size > 0) fo.engine.block_size = fit->block_size;
    if (fit && fo.engine.max_seqs < fit->min_seqs) fo.engine.max_seqs = fit->min_seqs;
    if (fit && fit->decode_together && !o->sched_set) fo.engine.policy = SCHED_PREFILL_FIRST;
    if (cli_open_backend(&fo, m, b, st)) return st->code;
    llmi_engine_opts eo = fo.engine;
    eo.max_batch_tokens = (*b)->opts.max_batch_tokens;
    llmi_model *dm = NULL;
    llmi_backend *db = NULL;
    if (o->draft_model && open_draft(o->draft_model, &fo, m, *b, &dm, &db, st)) goto fail;
    eo.draft_model = dm;
    eo.draft_backend = db;
    kv_size(*b, db, fit, &eo);
    if (engine_create(m, *b, &eo, e, st)) goto fail;
    return LLMI_OK;
fail:
    close_draft(dm, db);
    (*b)->destroy(*b);
    *b = NULL;
    return st->code;
}

void cli_close_engine(llmi_backend *b, llmi_engine *e) {
    const llmi_engine_opts *eo = e ? engine_options(e) : NULL;
    llmi_model *dm = eo ? (llmi_model *)eo->draft_model : NULL;
    llmi_backend *db = eo ? eo->draft_backend : NULL;
    engine_destroy(e);
    close_draft(dm, db);
    if (b) b->destroy(b);
}

int cli_check_draft_flags(const cli_model_opts *o, bool any_draft, llmi_status *st) {
    if (any_draft && !o->draft_model) return llmi_fail(st, LLMI_E_USAGE, "--spec draft: needs --draft-model PATH");
    if (!any_draft && o->draft_model)
        return llmi_fail(st, LLMI_E_USAGE, "--draft-model: only with --spec draft (no request uses it)");
    return LLMI_OK;
}
