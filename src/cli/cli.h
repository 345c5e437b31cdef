/* cli.h — owns what the subcommands share on the command line: the model/device/engine
 * flags (one spelling everywhere, llama.cpp's names where one exists), value parsing
 * with one-line errors naming the flag, and opening model + backend + engine from them.
 * Each subcommand's entry point returns a process exit code; only main.c exits. */
#ifndef LLMI_CLI_H
#define LLMI_CLI_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include "backend/backend.h"
#include "engine/engine.h"
#include "model/model.h"
#include "core/status.h"

/* Files given with a scale each (--lora, --control-vector), in the order given. */
typedef struct cli_scaled_files {
    char path[LLMI_MAX_LORA][1024];
    float scale[LLMI_MAX_LORA];
    int n;
} cli_scaled_files;

typedef struct cli_model_opts {
    const char *model_path;       /* -m; NULL = the default model (scripts/fetch-model.sh's cache path) */
    const char *dummy;            /* --dummy PRESET|config.json: synthetic weights, no tokenizer */
    llmi_dtype dummy_dtype;       /* --dummy-dtype: weight dtype of synthetic models (default BF16) */
    int dummy_group;              /* --dummy-dtype int4-gN: N (0: 128) */
    const char *device;           /* --device cpu|cuda|auto */
    llmi_backend_opts backend;    /* -t, --gpu, --gpu-mem-util, --kv-type */
    llmi_engine_opts engine;      /* --block-size, --num-blocks, --kv-mem, --max-batch-tokens, --prefill-chunk,
                                     --max-seqs, --sched, -c */
    const char *draft_model;      /* --draft-model PATH (generate, bench): loaded by cli_open_engine, or NULL */
    cli_scaled_files lora;        /* --lora PATH / --lora-scaled PATH SCALE: adapters (PEFT dirs, GGUF files)
                                     merged into the weights by cli_open_model, in order */
    cli_scaled_files control;     /* --control-vector FILE / --control-vector-scaled FILE SCALE: added to the
                                     layers' outputs by cli_open_model */
    int control_start, control_end;   /* --control-vector-layer-range (0: the defaults) */
    bool control_range_set;
    llmi_rope_override rope;      /* --rope-scaling, --rope-scale/--rope-freq-scale, --rope-freq-base, --yarn-* */
    bool rope_set;
    bool max_batch_tokens_set;    /* else the backend's default: 512 on cpu, 2048 on cuda */
    bool kv_type_set;             /* else the backend's default: f32 on cpu, bf16 on cuda */
    bool sched_set;               /* --sched given; else fifo, or prefill-first where the workload asks */
} cli_model_opts;

void cli_model_opts_init(cli_model_opts *o);
/* If argv[*i] is one of the shared flags, consumes it and its value (advancing *i) and
 * returns 1; returns 0 when it is not a shared flag; returns -1 with st set on a bad value. */
int cli_parse_model_flag(cli_model_opts *o, int argc, char **argv, int *i, llmi_status *st);
/* The sampling flags generate and bench share (--temp, --top-k, --top-p, --min-p, --typical,
 * --top-nsigma, --xtc-probability, --xtc-threshold, --repeat-penalty, --frequency-penalty,
 * --presence-penalty, --repeat-last-n, --dry-multiplier, --dry-base, --dry-allowed-length,
 * --dry-penalty-last-n) into s, as cli_parse_model_flag: 1 consumed, 0 not
 * one of them, -1 a bad value (st set). */
int cli_parse_sampling_flag(llmi_sampling *s, int argc, char **argv, int *i, llmi_status *st);
/* Help text of the shared flags, for each subcommand's --help. */
const char *cli_model_flags_help(void);

/* Loads the model (-m, or the default model) or builds the --dummy one, then merges the
 * --lora adapters and adds the control vectors. */
int cli_open_model(const cli_model_opts *o, llmi_model *m, llmi_status *st);
/* Merges o's --lora adapters into m (cli_open_model does; quantize, which loads its own way,
 * calls it).  On failure m is freed. */
int cli_merge_loras(const cli_model_opts *o, llmi_model *m, llmi_status *st);
/* Creates the backend the options ask for (auto = cuda when usable, else cpu; cuda asked
 * for and missing = error), with no KV cache yet (perplexity and quantize drive it directly). */
int cli_open_backend(const cli_model_opts *o, const llmi_model *m, llmi_backend **b, llmi_status *st);

/* A CPU process shares its memory with everything else on the machine: unless asked,
 * hold 1 GiB of KV (tens of thousands of tokens for small models), not half the RAM.
 * (The --kv-mem help text says "1G".) */
#define CLI_CPU_KV_DEFAULT_BYTES ((size_t)1 << 30)

/* What a workload asks of the engine beyond the flags (bench's sweep lists, profile's
 * -b); NULL asks nothing. */
typedef struct cli_engine_fit {
    bool kv_dtype_set;             /* kv_dtype replaces --kv-type (one entry of bench's list) */
    llmi_kv_dtype kv_dtype;
    int block_size;                /* > 0: replaces --block-size */
    long need_blocks;              /* > 0: KV blocks the workload needs at once */
    int min_seqs;                  /* --max-seqs raised to at least this many sequences */
    /* The workload's requests run together and its decode rate is read as that of all of
     * them (bench's sweep, profile): unless --sched was given, prefill-first, so that every
     * prompt is prefilled before decoding starts and each decode step runs every sequence
     * (llama-batched-bench's PP then TG).  Under fifo, b prompts longer than one step's
     * token budget overlap their prefill with the first requests' decode, whose steps then
     * run a fraction of the b sequences. */
    bool decode_together;
} cli_engine_fit;

/* The one way the subcommands open backend + engine over a loaded model.  The KV cache
 * is --num-blocks or --kv-mem when given; else fit->need_blocks when the backend can hold
 * them; else the backend's budget, capped at CLI_CPU_KV_DEFAULT_BYTES on the cpu.  With
 * o->draft_model it also loads the draft (checked against m's vocabulary before its
 * backend is made), runs it on a backend of the target's kind and options, and the engine
 * splits that KV budget between the two (engine.h); cli_close_engine frees it. */
int cli_open_engine(const cli_model_opts *o, const llmi_model *m, const cli_engine_fit *fit, llmi_backend **b,
                    llmi_engine **e, llmi_status *st);
void cli_close_engine(llmi_backend *b, llmi_engine *e);
/* --spec draft on some request and --draft-model agree (each needs the other); what names
 * the requests' modes in the message is where. */
int cli_check_draft_flags(const cli_model_opts *o, bool any_draft, llmi_status *st);

/* Strict value parsers: the whole string must parse and lie in [min, max]. */
int cli_parse_long(const char *flag, const char *val, long min, long max, long *out, llmi_status *st);
int cli_parse_float(const char *flag, const char *val, double min, double max, double *out, llmi_status *st);
/* "1,8,32" -> values (malloc'ed, caller frees); every value in [min, max]. */
int cli_parse_long_list(const char *flag, const char *val, long min, long max, long **out, int *n,
                        llmi_status *st);
int cli_parse_float_list(const char *flag, const char *val, double min, double max, double **out, int *n,
                         llmi_status *st);
/* --spec: "ngram", "draft" or "off". */
int cli_parse_spec_mode(const char *flag, const char *val, llmi_spec_mode *out, llmi_status *st);
/* --spec-ngram: "N" (MIN = MAX = N) or "MIN,MAX", 1 <= MIN <= MAX <= LLMI_SPEC_MAX_NGRAM. */
int cli_parse_spec_ngram(const char *flag, const char *val, llmi_spec_params *sp, llmi_status *st);
/* Returns argv[*i + 1] after checking it exists, else fails naming the flag. */
const char *cli_flag_value(int argc, char **argv, int *i, llmi_status *st);

const char *cli_default_model_path(char *buf, size_t cap);
/* Set by main.c's SIGINT handler; subcommands poll it between engine steps. */
extern volatile sig_atomic_t *cli_interrupted;
bool cli_was_interrupted(void);

int cmd_generate(int argc, char **argv, llmi_status *st);
int cmd_bench(int argc, char **argv, llmi_status *st);
int cmd_profile(int argc, char **argv, llmi_status *st);
int cmd_quantize(int argc, char **argv, llmi_status *st);

#endif
