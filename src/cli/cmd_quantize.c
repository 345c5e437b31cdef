/* cmd_quantize.c — owns `llmi quantize`: flags, calibration windows from a text file,
 * running RTN / GPTQ / AWQ (quant/quantize.c), the optional perplexity check, and writing
 * the Hugging Face directory (quant/write_hf.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <math.h>
#include "cli/bench_util.h"
#include "cli/cli.h"
#include "core/fileio.h"
#include "core/utf8.h"
#include "metrics/perplexity.h"
#include "quant/calib_stats.h"
#include "quant/quant_cuda.h"
#include "quant/write_hf.h"
#include "tok/tokenizer.h"

static const char *quant_help =
    "usage: llmi quantize -m MODEL --method gptq|awq|rtn -o OUTDIR [options]\n"
    "Quantizes the linear layers of MODEL (a GGUF file, dequantized first, or an HF directory of\n"
    "F32/F16/BF16 weights) to 4-bit groups and writes an HF directory that transformers, vLLM and\n"
    "llmi load: GPTQ v1 (gptq, rtn) or AWQ GEMM (awq) checkpoint, config.json with\n"
    "quantization_config, quantize_config.json (GPTQ), tokenizer files.  Layer by layer in bounded\n"
    "memory: the estimate is printed first, and a run that cannot fit is refused before any work.\n"
    "  --method M              gptq, awq or rtn (round to nearest, no calibration)\n"
    "  --bits N                weight bits (only 4)\n"
    "  --group-size N          input columns per scale/zero group (default 128)\n"
    "  -o, --output DIR        output directory (refused if it exists)\n"
    "  --force                 replace an existing output directory\n"
    "  --calib FILE            calibration text (gptq, awq)\n"
    "  --nsamples N            calibration windows (default 128)\n"
    "  --seqlen N              tokens per window (default 2048 gptq, 512 awq)\n"
    "  --seed N                which windows of the text are used (default 0)\n"
    "  --desc-act              GPTQ act-order (columns by descending Hessian diagonal; writes g_idx)\n"
    "  --sym / --asym          GPTQ symmetric (default) or asymmetric groups\n"
    "  --damp F                GPTQ dampening, fraction of mean diag(H) (default 0.01)\n"
    "  --no-clip               AWQ: skip the clipping search\n"
    "  --calib-dtype T         calibration hidden states between layers: bf16 (default), f16 or f32\n"
    "                          (f32: exactly the inference forward's; bf16/f16: half the memory)\n"
    "  --dry-run               print the plan and the memory estimate, quantize nothing\n"
    "  --save-stats FILE       write the calibration statistics (zstd) for --load-stats\n"
    "  --load-stats FILE       use saved statistics instead of a calibration pass\n"
    "  --eval-ppl FILE         after quantizing, perplexity of FILE with the quantized weights, by\n"
    "                          llama.cpp's rule (as llmi bench --ppl: second half of each window scored)\n"
    "  --eval-only             only the perplexity of the unquantized model (no -o needed)\n"
    "  --eval-chunks N         windows of FILE scored (default 16)\n"
    "  --eval-ctx N            tokens per window (default 512)\n";

typedef struct qc_args {
    cli_model_opts mo;
    quant_opts q;
    const char *out, *calib, *save_stats, *load_stats, *eval_file;
    bool force, eval_only, dry_run;
    long nsamples, seqlen, seed, eval_chunks, eval_ctx;
} qc_args;

static int qc_parse(int argc, char **argv, qc_args *a, llmi_status *st) {
    memset(a, 0, sizeof *a);
    cli_model_opts_init(&a->mo);
    a->q.method = -1;
    a->q.bits = 4;
    a->q.group_size = 128;
    a->q.sym = true;
    a->q.damp_percent = 0.01f;
    a->q.awq_grid = 20;
    a->q.awq_clip = true;
    a->q.hidden_dtype = LLMI_BF16;
    a->nsamples = 128;
    a->seqlen = 0;
    a->eval_chunks = 16;
    a->eval_ctx = 512;
    for (int i = 0; i < argc; i++) {
        int r = cli_parse_model_flag(&a->mo, argc, argv, &i, st);
        if (r < 0) return st->code;
        if (r > 0) continue;
        const char *f = argv[i], *v;
        long n;
        double d;
#define VAL() do { if (!(v = cli_flag_value(argc, argv, &i, st))) return st->code; } while (0)
        if (!strcmp(f, "--method")) {
            VAL();
            if (!strcmp(v, "gptq")) a->q.method = QUANT_GPTQ;
            else if (!strcmp(v, "awq")) a->q.method = QUANT_AWQ;
            else if (!strcmp(v, "rtn")) a->q.method = QUANT_RTN;
            else return llmi_fail(st, LLMI_E_USAGE, "--method: '%s' is not gptq, awq or rtn", v);
        } else if (!strcmp(f, "--bits")) {
            VAL();
            if (cli_parse_long(f, v, 1, 64, &n, st)) return st->code;
            if (n != 4) return llmi_fail(st, LLMI_E_USAGE, "--bits %ld: unsupported bit width (only 4)", n);
        } else if (!strcmp(f, "--group-size")) {
            VAL();
            if (cli_parse_long(f, v, 8, 1 << 16, &n, st)) return st->code;
            if (n % 8) return llmi_fail(st, LLMI_E_USAGE, "--group-size %ld: must be a multiple of 8", n);
            a->q.group_size = (int)n;
        } else if (!strcmp(f, "-o") || !strcmp(f, "--output")) {
            VAL();
            a->out = v;
        } else if (!strcmp(f, "--force")) {
            a->force = true;
        } else if (!strcmp(f, "--calib")) {
            VAL();
            a->calib = v;
        } else if (!strcmp(f, "--nsamples")) {
            VAL();
            if (cli_parse_long(f, v, 1, 1 << 16, &a->nsamples, st)) return st->code;
        } else if (!strcmp(f, "--seqlen")) {
            VAL();
            if (cli_parse_long(f, v, 2, 1 << 16, &a->seqlen, st)) return st->code;
        } else if (!strcmp(f, "--seed")) {
            VAL();
            if (cli_parse_long(f, v, 0, 0x7fffffffL, &a->seed, st)) return st->code;
        } else if (!strcmp(f, "--desc-act")) {
            a->q.desc_act = true;
        } else if (!strcmp(f, "--sym")) {
            a->q.sym = true;
        } else if (!strcmp(f, "--asym")) {
            a->q.sym = false;
        } else if (!strcmp(f, "--damp")) {
            VAL();
            if (cli_parse_float(f, v, 1e-6, 10, &d, st)) return st->code;
            a->q.damp_percent = (float)d;
        } else if (!strcmp(f, "--no-clip")) {
            a->q.awq_clip = false;
        } else if (!strcmp(f, "--calib-dtype")) {
            VAL();
            if (!strcmp(v, "bf16")) a->q.hidden_dtype = LLMI_BF16;
            else if (!strcmp(v, "f16")) a->q.hidden_dtype = LLMI_F16;
            else if (!strcmp(v, "f32")) a->q.hidden_dtype = LLMI_F32;
            else return llmi_fail(st, LLMI_E_USAGE, "--calib-dtype: '%s' is not bf16, f16 or f32", v);
        } else if (!strcmp(f, "--dry-run")) {
            a->dry_run = true;
        } else if (!strcmp(f, "--save-stats")) {
            VAL();
            a->save_stats = v;
        } else if (!strcmp(f, "--load-stats")) {
            VAL();
            a->load_stats = v;
        } else if (!strcmp(f, "--eval-ppl")) {
            VAL();
            a->eval_file = v;
        } else if (!strcmp(f, "--eval-only")) {
            a->eval_only = true;
        } else if (!strcmp(f, "--eval-chunks")) {
            VAL();
            if (cli_parse_long(f, v, 1, 1 << 20, &a->eval_chunks, st)) return st->code;
        } else if (!strcmp(f, "--eval-ctx")) {
            VAL();
            if (cli_parse_long(f, v, 2, 1 << 16, &a->eval_ctx, st)) return st->code;
        } else if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            fputs(quant_help, stdout);
            fputs(cli_model_flags_help(), stdout);
            return -1;
        } else {
            return llmi_fail(st, LLMI_E_USAGE, "quantize: unknown flag '%s' (llmi quantize --help)", f);
        }
#undef VAL
    }
    if (a->eval_only) {
        if (!a->eval_file) return llmi_fail(st, LLMI_E_USAGE, "--eval-only needs --eval-ppl FILE");
        return 0;
    }
    if ((int)a->q.method < 0) return llmi_fail(st, LLMI_E_USAGE, "quantize: --method gptq|awq|rtn is required");
    if (!a->out) return llmi_fail(st, LLMI_E_USAGE, "quantize: -o OUTDIR is required");
    if (a->q.method == QUANT_AWQ && !a->q.sym) { /* AWQ-GEMM is asymmetric by definition */ }
    if (a->q.method == QUANT_AWQ) a->q.sym = false;
    if (a->q.method != QUANT_GPTQ && a->q.desc_act)
        return llmi_fail(st, LLMI_E_USAGE, "--desc-act: only with --method gptq");
    if (a->q.method != QUANT_RTN && !a->calib && !a->load_stats)
        return llmi_fail(st, LLMI_E_USAGE, "--method %s needs --calib FILE (or --load-stats FILE)",
                         a->q.method == QUANT_GPTQ ? "gptq" : "awq");
    if (a->save_stats && a->load_stats)
        return llmi_fail(st, LLMI_E_USAGE, "--save-stats and --load-stats: give one or the other");
    if (a->save_stats && !a->calib)
        return llmi_fail(st, LLMI_E_USAGE, "--save-stats: needs a calibration run (--calib FILE)");
    if (!a->seqlen) a->seqlen = a->q.method == QUANT_AWQ ? 512 : 2048;
    return 0;
}

#define QC_MAX_TEXT (1u << 30)   /* calibration / evaluation text */

/* Calibration text must be text: not empty or blank, no NUL byte, valid UTF-8 (a binary
 * file would tokenize into byte soup and calibrate on nothing real). */
static int qc_check_text(const char *flag, const char *path, const char *text, size_t len, llmi_status *st) {
    size_t blank = 0;
    while (blank < len && (text[blank] == ' ' || text[blank] == '\n' || text[blank] == '\r' || text[blank] == '\t'))
        blank++;
    if (blank == len) return llmi_fail(st, LLMI_E_USAGE, "%s %s: the file is empty (%zu bytes, no text)", flag, path, len);
    const char *nul = memchr(text, 0, len);
    if (nul) return llmi_fail(st, LLMI_E_USAGE, "%s %s: not text (a NUL byte at offset %zu)", flag, path, (size_t)(nul - text));
    size_t valid = utf8_valid_prefix(text, len);
    if (valid < len) return llmi_fail(st, LLMI_E_USAGE, "%s %s: not text (invalid UTF-8 at offset %zu)", flag, path, valid);
    return 0;
}

/* Tokenizes path and picks n_windows distinct, non-overlapping windows of seqlen tokens
 * (random slots from seed).  *out (n_windows*seqlen). */
static int qc_windows(const llmi_model *m, const char *flag, const char *path, int n_windows, int seqlen, long seed,
                      int32_t **out, llmi_status *st) {
    if (!m->tok) return llmi_fail(st, LLMI_E_USAGE, "%s: the model has no tokenizer", flag);
    char *text = NULL;
    size_t len = 0;
    fileio_opts fo = {.flag = flag, .max_bytes = QC_MAX_TEXT};
    if (fileio_read(path, &fo, &text, &len, st)) return st->code;
    if (qc_check_text(flag, path, text, len, st)) {
        free(text);
        return st->code;
    }
    int32_t *ids = NULL;
    int n = 0;
    int rc = tok_encode(m->tok, text, len, false, false, &ids, &n, st);
    free(text);
    if (rc) return rc;
    long slots = n / seqlen;
    if (slots < n_windows) {
        free(ids);
        return llmi_fail(st, LLMI_E_USAGE,
                         "%s %s: %d tokens is too short for %d windows of %d tokens (need %lld; lower --nsamples or "
                         "--seqlen)", flag, path, n, n_windows, seqlen, (long long)n_windows * seqlen);
    }
    int *perm = malloc((size_t)slots * sizeof(int));
    *out = malloc((size_t)n_windows * seqlen * sizeof(int32_t));
    if (!perm || !*out) {
        free(perm), free(*out), free(ids);
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", flag);
    }
    for (long i = 0; i < slots; i++) perm[i] = (int)i;
    uint64_t s = 0x9E3779B97F4A7C15ull ^ (uint64_t)seed;
    for (long i = slots - 1; i > 0; i--) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        long j = (long)(s % (uint64_t)(i + 1));
        int t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int w = 0; w < n_windows; w++)
        memcpy(*out + (size_t)w * seqlen, ids + (size_t)perm[w] * seqlen, (size_t)seqlen * sizeof(int32_t));
    free(perm), free(ids);
    return 0;
}

/* The text of path tokenized as llmi bench --ppl does. */
static int qc_eval_tokens(const llmi_model *m, const char *path, int32_t **ids, int *n, llmi_status *st) {
    if (!m->tok) return llmi_fail(st, LLMI_E_USAGE, "--eval-ppl: the model has no tokenizer");
    char *text = NULL;
    size_t len = 0;
    fileio_opts fo = {.flag = "--eval-ppl", .max_bytes = QC_MAX_TEXT};
    if (fileio_read(path, &fo, &text, &len, st)) return st->code;
    int rc = ppl_tokenize(m->tok, text, len, ids, n, st);
    free(text);
    return rc;
}

/* Perplexity of m (the source model or a view of the quantized one) by llama.cpp's rule
 * (metrics/perplexity.h), on the CPU backend as `llmi bench --ppl` runs it.  bos: the
 * source's BOS id when its tokenizer adds one, else -1 (the quantized checkpoint is read
 * back without a tokenizer). */
static int qc_eval(const llmi_model *m, const qc_args *a, const int32_t *ids, int n, int bos, const char *label,
                   llmi_status *st) {
    const int ctx = (int)a->eval_ctx, bs = 16;
    llmi_backend_opts bo = a->mo.backend;
    bo.kv_dtype = LLMI_KV_F32;
    bo.block_size = bs;
    bo.max_batch_tokens = ctx;
    bo.max_seqs = 1;
    llmi_backend *b = NULL;
    if (backend_cpu_create(m, &bo, &b, st)) return st->code;
    int rc = b->kv_alloc(b, (ctx + bs - 1) / bs, st);
    ppl_opts po = {.n_ctx = ctx, .n_chunks = (int)a->eval_chunks, .n_batch = ctx, .progress = NULL};
    ppl_result res;
    if (!rc) rc = ppl_run(b, ids, n, bos, &po, &res, st);
    if (!rc)
        printf("ppl %.4f +/- %.4f  (%s, %s; %d windows x %d tokens, llama.cpp rule, %.1fs)\n", res.ppl,
               res.ppl_stderr, a->eval_file, label, res.chunks, res.ctx, res.seconds);
    b->destroy(b);
    return rc;
}

static double qc_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- progress: a bar per layer with ETA on a terminal, else one line per layer ---- */
typedef struct qc_prog {
    bool tty;
    double t0;
} qc_prog;

static void qc_eta(double s, char *buf, size_t n) {
    if (s >= 3600) snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
    else if (s >= 60) snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
    else snprintf(buf, n, "%ds", (int)s);
}

/* Appends to buf (cap bytes, a string) "LEAD name v, name v s" for the n values of at least
 * 0.05 s, or nothing when there is none. */
static void qc_times(char *buf, size_t cap, const char *lead, const char *const *names, const double *v, int n) {
    size_t len = strlen(buf), at = len;
    for (int i = 0; i < n && len < cap; i++)
        if (v[i] >= 0.05)
            len += (size_t)snprintf(buf + len, cap - len, "%s %s %.1f", len > at ? "," : lead, names[i], v[i]);
    if (len > at && len < cap) snprintf(buf + len, cap - len, " s");
}

static void qc_progress(quant_progress *p, int layer, int n_layers, int step, int n_steps, const char *what,
                        const double *errs, const quant_layer_times *times) {
    qc_prog *q = p->ctx;
    double done = layer + (double)step / n_steps, el = qc_now() - q->t0;
    char eta[32];
    qc_eta(done > 0 ? el / done * (n_layers - done) : 0, eta, sizeof eta);
    if (step < n_steps) {
        if (!q->tty) return;
        enum { W = 24 };
        char bar[W + 1];
        for (int i = 0; i < W; i++) bar[i] = i < W * step / n_steps ? '#' : '.';
        bar[W] = '\0';
        fprintf(stderr, "\r\033[Kquantize: layer %2d/%d [%s] %-9s ETA %s", layer + 1, n_layers, bar, what, eta);
        fflush(stderr);
        return;
    }
    static const char *const short_names[QL_COUNT] = {"q", "k", "v", "o", "gate", "up", "down"};
    if (q->tty) fputs("\r\033[K", stderr);
    fprintf(stderr, "quantize: layer %2d/%d", layer + 1, n_layers);
    for (int i = 0; i < QL_COUNT; i++)
        if (!isnan(errs[i])) fprintf(stderr, " %s %.2e", short_names[i], errs[i]);
    /* the stages that took time, so that a slow layer says where, and on --device cuda what
     * the device calls inside them waited for */
    static const char *const stage_names[QT_COUNT] = {"calibrate", "load", "solve", "quantize", "error", "serve",
                                                      "write"};
    char stages[320] = "";
    qc_times(stages, sizeof stages, ";", stage_names, times->stage, QT_COUNT);
    qc_times(stages, sizeof stages, "; gpu", quant_cuda_stage_names, times->gpu, QCT_COUNT);
    fprintf(stderr, "  (rel. output error; %.1fs, ETA %s%s)\n", times->total, layer + 1 < n_layers ? eta : "0s",
            stages);
    fflush(stderr);
}

/* ---- memory ---- */
static double qc_gib(size_t b) { return (double)b / 1073741824.0; }

/* MemAvailable from /proc/meminfo (page cache counts as reclaimable); 0 when unknown. */
static size_t qc_mem_available(void) {
    size_t avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
            avail = (size_t)kb * 1024;
            break;
        }
    fclose(f);
    return avail;
}

/* Prints the estimate; fails when it does not fit in what this process holds plus what
 * the machine has available. */
static int qc_memory(const llmi_model *m, const qc_args *a, bool calib, llmi_status *st) {
    quant_mem e;
    quant_memory_estimate(m, &a->q, (int)a->nsamples, (int)a->seqlen, calib, a->save_stats != NULL, &e);
    fprintf(stderr, "quantize: needs ~%.2f GiB: source weights %.2f (%s), calibration %.2f, layer %.2f, largest step "
            "%.2f, writer %.2f%s\n", qc_gib(e.total), qc_gib(e.source),
            model_weights_from_file(m) ? "one mapped layer at a time" : "all in memory", qc_gib(e.calib),
            qc_gib(e.layer), qc_gib(e.step), qc_gib(e.writer), e.stats ? ", --save-stats" : "");
    if (e.stats) fprintf(stderr, "quantize: --save-stats keeps every layer's Gram matrices: %.2f GiB\n", qc_gib(e.stats));
    size_t avail = qc_mem_available(), held = bench_peak_rss();
    if (avail && e.total > avail + held)
        return llmi_fail(st, LLMI_E_USAGE, "quantize: needs ~%.2f GiB but only %.2f GiB is available (%.2f free + "
                         "%.2f held); lower --nsamples or --seqlen, or use --calib-dtype bf16", qc_gib(e.total),
                         qc_gib(avail + held), qc_gib(avail), qc_gib(held));
    if (!a->q.cuda) return 0;
    size_t gpu_free = 0;
    if (quant_cuda_mem_free(a->q.cuda, &gpu_free, st)) return st->code;
    fprintf(stderr, "quantize: needs ~%.2f GiB on GPU %d (%.2f free): hidden states, the calibration forward's "
            "layer, Gram matrices, the largest step\n", qc_gib(e.device), quant_cuda_gpu(a->q.cuda), qc_gib(gpu_free));
    if (e.device > gpu_free)
        return llmi_fail(st, LLMI_E_USAGE, "quantize: needs ~%.2f GiB but only %.2f GiB is free on GPU %d (%s); lower "
                         "--nsamples or --seqlen, or use --calib-dtype bf16", qc_gib(e.device), qc_gib(gpu_free),
                         quant_cuda_gpu(a->q.cuda), quant_cuda_device_name(a->q.cuda));
    return 0;
}

/* --device: cuda (or auto with a GPU visible) puts the calibration forward (the CUDA
 * backend, one layer at a time), the Gram matrices, GPTQ's factorisation and column walk
 * and AWQ's scale search on the GPU. */
static int qc_device(const qc_args *a, quant_cuda **cuda, llmi_status *st) {
    const char *d = a->mo.device;
    *cuda = NULL;
    if (!strcmp(d, "cpu") || (!strcmp(d, "auto") && backend_cuda_device_count() == 0)) {
        fprintf(stderr, "quantize: device cpu\n");
        return 0;
    }
    if (quant_cuda_create(cuda, a->mo.backend.gpu_index, st)) return st->code;
    fprintf(stderr, "quantize: device cuda (%s): calibration forward, Gram matrices, GPTQ and AWQ's scale search "
            "on the GPU\n", quant_cuda_device_name(*cuda));
    return 0;
}

int cmd_quantize(int argc, char **argv, llmi_status *st) {
    qc_args a;
    int rc = qc_parse(argc, argv, &a, st);
    if (rc < 0) return 0; /* --help */
    if (rc) return rc;
    if (a.mo.rope_set)
        return llmi_fail(st, LLMI_E_USAGE, "--rope-scaling/--rope-scale/--rope-freq-base/--yarn-*: RoPE flags change "
                         "how a model runs, not its weights; give them to the run that loads the output");
    if (a.mo.control.n || a.mo.control_range_set)
        return llmi_fail(st, LLMI_E_USAGE, "--control-vector: a control vector is added at run time and is not part of "
                         "a quantized checkpoint; give it to the run that loads the output");
    if (!a.eval_only && !a.dry_run && quant_check_outdir(a.out, a.force, st)) return st->code;
    llmi_model m;
    /* The tokenizer is only needed to read text; RTN and --load-stats runs do without. */
    bool calib_text = !a.eval_only && (a.q.method != QUANT_RTN || a.calib) && !a.load_stats;
    bool need_tok = a.eval_file || (calib_text && !a.dry_run);
    if (a.mo.model_path && !a.mo.dummy) {
        llmi_load_opts lo = {.no_tokenizer = !need_tok};
        if (model_load(a.mo.model_path, &lo, &m, st) || cli_merge_loras(&a.mo, &m, st))
            return st->code ? st->code : LLMI_E_RUNTIME;
    } else if (cli_open_model(&a.mo, &m, st)) {
        return st->code ? st->code : LLMI_E_RUNTIME;
    }
    int32_t *calib = NULL, *evalt = NULL;
    quant_stats sin = {0}, sout = {0};
    quant_writer *w = NULL;
    quant_cuda *cuda = NULL;
    const char *input = a.mo.model_path ? a.mo.model_path : m.source_path;
    const char *method = a.q.method == QUANT_GPTQ ? "gptq" : a.q.method == QUANT_AWQ ? "awq" : "rtn";
    int n_evalt = 0;
    if (a.eval_file && (rc = qc_eval_tokens(&m, a.eval_file, &evalt, &n_evalt, st))) goto done;
    const int eval_bos = a.eval_file && tok_add_bos(m.tok) ? tok_bos(m.tok) : -1;
    if (a.eval_only) {
        rc = qc_eval(&m, &a, evalt, n_evalt, eval_bos, "unquantized", st);
        goto done;
    }
    /* Everything that can be wrong with the input is found before any work. */
    if ((rc = quant_check_shapes(&m.cfg, &a.q, st))) goto done;
    double t0 = qc_now();
    bool calib_run = (a.q.method != QUANT_RTN || a.calib) && !a.load_stats;
    fprintf(stderr, "quantize: %s %s, 4-bit groups of %d%s%s, %s\n", m.cfg.name, method, a.q.group_size,
            a.q.method == QUANT_GPTQ ? (a.q.sym ? ", sym" : ", asym") : "", a.q.desc_act ? ", act-order" : "",
            a.q.method == QUANT_RTN && !a.calib ? "no calibration"
            : a.load_stats                      ? "statistics from --load-stats"
            : a.q.method == QUANT_RTN           ? "calibration text only to report errors"
                                                : "calibrating");
    if (calib_run)
        fprintf(stderr, "quantize: %ld windows x %ld tokens of %s, hidden states in %s\n", a.nsamples, a.seqlen,
                a.calib, dtype_name(a.q.hidden_dtype));
    /* the device first: with cuda the calibration's hidden states are not the host's */
    if ((rc = qc_device(&a, &cuda, st))) goto done;
    a.q.cuda = cuda;
    if ((rc = qc_memory(&m, &a, calib_run, st)) || a.dry_run) goto done;
    if (a.q.method != QUANT_RTN || a.calib) {
        if (a.load_stats) {
            if ((rc = quant_stats_load(a.load_stats, &m.cfg, &sin, st))) goto done;
        } else {
            if ((rc = qc_windows(&m, "--calib", a.calib, (int)a.nsamples, (int)a.seqlen, a.seed, &calib, st))) goto done;
        }
        if (a.save_stats && (rc = quant_stats_init(&sout, &m.cfg, st))) goto done;
    }
    if ((rc = quant_writer_open(&w, a.out, a.force, &m, &a.q, input, st))) goto done;
    qc_prog prog = {.tty = isatty(STDERR_FILENO), .t0 = qc_now()};
    quant_progress qp = {.fn = qc_progress, .ctx = &prog};
    a.q.progress = &qp;
    a.q.cancel = cli_interrupted;
    if ((rc = quant_model_stream(&m, &a.q, calib, (int)a.nsamples, (int)a.seqlen, a.load_stats ? &sin : NULL,
                                 a.save_stats ? &sout : NULL, quant_writer_layer, w, st))) {
        if (st->code == LLMI_E_INTERRUPT) fprintf(stderr, "\nquantize: interrupted; %s not written\n", a.out);
        goto done;
    }
    fprintf(stderr, "quantize: %d layers in %.1fs; peak RSS %.2f GiB\n", m.cfg.n_layers, qc_now() - t0,
            qc_gib(bench_peak_rss()));
    if (a.save_stats && (rc = quant_stats_save(a.save_stats, &sout, st))) goto done;
    rc = quant_writer_finish(w, st);
    w = NULL;
    if (rc) goto done;
    fprintf(stderr, "quantize: wrote %s (%.1fs total)\n", a.out, qc_now() - t0);
    if (a.eval_file) {
        /* the checkpoint as written, read back as `llmi bench -m OUTDIR --ppl` would */
        llmi_model qm;
        llmi_load_opts lo = {.no_tokenizer = true};
        if ((rc = model_load(a.out, &lo, &qm, st))) goto done;
        rc = qc_eval(&qm, &a, evalt, n_evalt, eval_bos, method, st);
        model_free(&qm);
    }
done:
    if (w) quant_writer_abort(w);
    quant_cuda_destroy(cuda);
    free(calib), free(evalt);
    quant_stats_free(&sin);
    quant_stats_free(&sout);
    model_free(&m);
    return rc;
}
