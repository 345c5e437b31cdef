/* lora.c — LoRA adapters merged into the weights (see lora.h). */
#include "model/lora.h"

#include <cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/dtype.h"
#include "core/fileio.h"
#include "core/tensor.h"
#include "model/gguf.h"
#include "model/safetensors.h"

#define LORA_MAX_JSON (1u << 20)
#define LORA_MAX_RANK 4096

/* The seven linears of a decoder layer an adapter may target, by the name PEFT gives their
 * module under model.layers.N. */
static const char *const lora_targets[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                           "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                           "mlp.down_proj"};
enum { N_TARGETS = sizeof lora_targets / sizeof lora_targets[0], FIRST_MLP_TARGET = 4 };
/* The same linears by the name llama.cpp's GGUF gives their weight under blk.N. */
static const char *const gguf_targets[N_TARGETS] = {"attn_q", "attn_k",   "attn_v",  "attn_output",
                                                    "ffn_gate", "ffn_up", "ffn_down"};

static llmi_tensor *target_tensor(llmi_layer *L, int t) {
    llmi_tensor *w[N_TARGETS] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    return w[t];
}

/* One factor as the adapter stores it: (rows, cols) row-major, in a float type or ggml's
 * Q8_0 (blocks of 32 along a row: an fp16 scale and 32 int8, as convert_lora_to_gguf.py
 * --outtype q8_0 writes them). */
typedef enum { FACTOR_F32, FACTOR_F16, FACTOR_BF16, FACTOR_Q8_0 } factor_type;
typedef struct lora_factor {
    const char *name;
    int64_t rows, cols;
    factor_type type;
    const uint8_t *data;          /* inside the adapter file's mapping */
} lora_factor;

/* One adapted linear: its layer and target, and the adapter's A (r, in) and B (out, r). */
typedef struct lora_pair {
    int layer, target;
    bool has_a, has_b;
    lora_factor a, b;
} lora_pair;

/* What an adapter file says besides its factors.  PEFT: one rank r for every pair and
 * s = lora_alpha / r (/ sqrt(r) with use_rslora).  GGUF (llama.cpp's llama_adapter_lora):
 * each pair's own rank, s = alpha / rank, or 1 when alpha is 0; Q/K rows of a llama
 * adapter in the converter's permuted order (the merge puts them back). */
typedef struct lora_cfg {
    int r;                        /* 0: each pair's A rows */
    double alpha;
    bool rslora;
    bool gguf;
} lora_cfg;

static int cfg_fail(const char *path, const char *why, llmi_status *st) {
    return llmi_fail(st, LLMI_E_USAGE, "--lora %s: %s", path, why);
}

/* A field that must be absent, null, false, or an empty list or object (anything else asks
 * for what the merge does not do). */
static bool field_unused(const cJSON *root, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    return !v || cJSON_IsNull(v) || cJSON_IsFalse(v) ||
           ((cJSON_IsArray(v) || cJSON_IsObject(v)) && cJSON_GetArraySize(v) == 0);
}

/* PEFT's options that change what the adapted model computes beyond W + s B A (an
 * activated LoRA's invocation tokens, a bias on B, replicated layers, trained token rows,
 * adapters on raw parameters, quantization-aware or routed variants): refused by name.
 * Initialisation methods (LoftQ, EVA, CorDA, LoRA-GA) only chose the saved factors. */
static int refuse_variants(const cJSON *root, const char *path, llmi_status *st) {
    static const char *const keys[] = {"lora_bias", "layer_replication", "alora_invocation_tokens", "use_qalora",
                                       "use_bdlora", "trainable_token_indices", "target_parameters", "arrow_config",
                                       "monteclora_config", "kasa_config", "velora_config", "megatron_config"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!field_unused(root, keys[i]))
            return llmi_fail(st, LLMI_E_USAGE, "--lora %s: \"%s\" is set; that LoRA variant is not supported", path,
                             keys[i]);
    return LLMI_OK;
}

static int read_config(const char *dir, lora_cfg *c, llmi_status *st) {
    char path[2048];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *buf;
    size_t len;
    fileio_opts fo = {.flag = "--lora", .max_bytes = LORA_MAX_JSON};
    if (fileio_read(path, &fo, &buf, &len, st)) return st->code;
    cJSON *root = cJSON_ParseWithLength(buf, len);
    free(buf);
    int rc = LLMI_OK;
    if (!cJSON_IsObject(root)) {
        rc = cfg_fail(path, "not a JSON object", st);
        goto out;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "peft_type");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, "r");
    const cJSON *alpha = cJSON_GetObjectItemCaseSensitive(root, "lora_alpha");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "use_rslora");
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(root, "bias");
    if (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "LORA"))) {
        rc = cfg_fail(path, "peft_type is not \"LORA\"", st);
    } else if (!cJSON_IsNumber(r) || r->valuedouble != floor(r->valuedouble) || r->valuedouble < 1 ||
               r->valuedouble > LORA_MAX_RANK) {
        rc = llmi_fail(st, LLMI_E_USAGE, "--lora %s: \"r\" must be an integer in 1..%d", path, LORA_MAX_RANK);
    } else if (!cJSON_IsNumber(alpha) || !isfinite(alpha->valuedouble) || fabs(alpha->valuedouble) > 1e6) {
        rc = cfg_fail(path, "\"lora_alpha\" must be a finite number", st);
    } else if (rs && !cJSON_IsBool(rs)) {
        rc = cfg_fail(path, "\"use_rslora\" must be true or false", st);
    } else if (bias && !cJSON_IsNull(bias) && !(cJSON_IsString(bias) && !strcmp(bias->valuestring, "none"))) {
        rc = cfg_fail(path, "\"bias\" is not \"none\": trained biases are not merged", st);
    } else if (!field_unused(root, "use_dora")) {
        rc = cfg_fail(path, "use_dora: DoRA adapters are not supported", st);
    } else if (!field_unused(root, "fan_in_fan_out")) {
        rc = cfg_fail(path, "fan_in_fan_out: the adapter is for transposed (Conv1D) weights", st);
    } else if (!field_unused(root, "modules_to_save")) {
        rc = cfg_fail(path, "modules_to_save: the adapter replaces whole modules, which is not supported", st);
    } else if (!field_unused(root, "rank_pattern") || !field_unused(root, "alpha_pattern")) {
        rc = cfg_fail(path, "rank_pattern / alpha_pattern: per-module ranks are not supported", st);
    } else if ((rc = refuse_variants(root, path, st))) {
    } else {
        c->r = (int)r->valuedouble;
        c->alpha = alpha->valuedouble;
        c->rslora = cJSON_IsTrue(rs);
    }
out:
    cJSON_Delete(root);
    return rc;
}

/* "<prefix>N.<target><suffix A or B>" -> layer, target, A or B: the one name pattern of
 * both files, PEFT's "model.layers.N.self_attn.q_proj.lora_A.weight" and GGUF's
 * "blk.N.attn_q.weight.lora_a". */
static bool parse_factor_name(const char *name, const char *prefix, const char *const *targets, const char *suffix_a,
                              const char *suffix_b, int *layer, int *target, bool *is_b) {
    size_t np = strlen(prefix);
    if (strncmp(name, prefix, np)) return false;
    const char *p = name + np;
    if (*p < '0' || *p > '9') return false;
    char *end;
    long l = strtol(p, &end, 10);
    if (*end != '.' || l < 0 || l >= LLMI_MAX_LAYERS || (p[0] == '0' && end - p > 1)) return false;
    p = end + 1;
    for (int t = 0; t < N_TARGETS; t++) {
        size_t n = strlen(targets[t]);
        if (strncmp(p, targets[t], n)) continue;
        if (!strcmp(p + n, suffix_a) || !strcmp(p + n, suffix_b)) {
            *layer = (int)l;
            *target = t;
            *is_b = !strcmp(p + n, suffix_b);
            return true;
        }
    }
    return false;
}

/* PEFT's names, with or without its "base_model.model." prefix. */
static bool parse_name(const char *name, int *layer, int *target, bool *is_b) {
    if (!strncmp(name, "base_model.model.", 17)) name += 17;
    return parse_factor_name(name, "model.layers.", lora_targets, ".lora_A.weight", ".lora_B.weight", layer, target,
                             is_b);
}

static bool float_dtype(safetensors_dtype d) { return d == ST_F32 || d == ST_F16 || d == ST_BF16; }

static float factor_value(const lora_factor *t, int64_t i) {
    uint16_t h;
    switch (t->type) {
    case FACTOR_F32: {
        float f;
        memcpy(&f, t->data + 4 * i, 4);
        return f;
    }
    case FACTOR_F16: memcpy(&h, t->data + 2 * i, 2); return fp16_to_f32(h);
    case FACTOR_BF16: memcpy(&h, t->data + 2 * i, 2); return bf16_to_f32(h);
    case FACTOR_Q8_0: {
        const uint8_t *blk = t->data + (i / 32) * 34;   /* rows are whole blocks (cols % 32 == 0) */
        memcpy(&h, blk, 2);
        return fp16_to_f32(h) * (float)(int8_t)blk[2 + i % 32];
    }
    }
    return NAN;
}

/* Index of t's first non-finite value, or -1. */
static int64_t first_non_finite(const lora_factor *t) {
    for (int64_t i = 0; i < t->rows * t->cols; i++)
        if (!isfinite(factor_value(t, i))) return i;
    return -1;
}

/* t's values as floats (malloc'ed), or NULL. */
static float *factor_floats(const lora_factor *t) {
    float *x = malloc((size_t)(t->rows * t->cols) * sizeof *x);
    for (int64_t i = 0; x && i < t->rows * t->cols; i++) x[i] = factor_value(t, i);
    return x;
}

/* w (rows, cols) in its dtype += s * b a: each row in fp32, rounded back once, as PEFT adds
 * the fp32 product to a bf16 or f16 weight.  Returns how many sums left the dtype's range
 * (finite factors can still overflow it). */
static long merge_rows(llmi_tensor *w, const float *a, const float *b, int r, float s, float *acc_all) {
    const int64_t rows = w->rows, cols = w->cols;
    uint8_t *base = w->owned;
    long overflow = 0;
    #pragma omp parallel reduction(+ : overflow)
    {
        float *acc = acc_all + (size_t)omp_get_thread_num() * (size_t)cols;   /* (cols) this thread's row of B A */
        #pragma omp for schedule(static)
        for (int64_t o = 0; o < rows; o++) {
            memset(acc, 0, (size_t)cols * sizeof *acc);
            for (int k = 0; k < r; k++) {
                const float bk = b[o * r + k];
                const float *ak = a + (size_t)k * cols;
                for (int64_t i = 0; i < cols; i++) acc[i] += bk * ak[i];
            }
            uint8_t *row = base + (size_t)o * w->row_bytes;
            for (int64_t i = 0; i < cols; i++) {
                float x;
                if (w->dtype == LLMI_F32) {
                    float *y = (float *)row + i;
                    x = *y += s * acc[i];
                } else {
                    uint16_t *h = (uint16_t *)row + i;
                    *h = w->dtype == LLMI_F16 ? f32_to_fp16((fp16_to_f32(*h) + s * acc[i]))
                                              : f32_to_bf16(bf16_to_f32(*h) + s * acc[i]);
                    x = w->dtype == LLMI_F16 ? fp16_to_f32(*h) : bf16_to_f32(*h);
                }
                overflow += !isfinite(x);
            }
        }
    }
    return overflow;
}

/* Bytes t holds as loaded: its rows, and an int4 grid's scales, zeros and group map. */
static size_t stored_bytes(const llmi_tensor *t) {
    size_t b = (size_t)t->rows * t->row_bytes;
    if (t->dtype == LLMI_I4G) b += (size_t)t->n_groups * (size_t)t->rows * 3 + (t->g_idx ? (size_t)t->cols * 4 : 0);
    return b;
}

/* Makes w a private copy the merge may write: f32/f16/bf16 as they are, any quantized
 * dtype dequantized into bf16 (the sum needs a float type; bf16 keeps the range and adds
 * 2^-9 relative rounding, far below 4-bit quantization's error).  m->weight_bytes follows. */
static int writable_float_copy(llmi_model *m, llmi_tensor *w, const char *path, int layer, const char *what,
                               llmi_status *st) {
    const bool keep = w->dtype == LLMI_F32 || w->dtype == LLMI_F16 || w->dtype == LLMI_BF16;
    if (keep && w->owned && w->data == w->owned) return LLMI_OK;
    size_t row_bytes = keep ? w->row_bytes : (size_t)w->cols * 2, bytes = (size_t)w->rows * row_bytes;
    uint8_t *copy = malloc(bytes ? bytes : 1);
    float *row = keep ? NULL : malloc((size_t)w->cols * sizeof *row);   /* (cols) one dequantized row */
    if (!copy || (!keep && !row)) {
        free(copy), free(row);
        return llmi_fail(st, LLMI_E_RUNTIME, "--lora %s: out of memory copying layer %d %s", path, layer, what);
    }
    if (keep) {
        memcpy(copy, w->data, bytes);
    } else {
        for (int64_t r = 0; r < w->rows; r++) {
            tensor_dequant_row(w, r, row);
            uint16_t *dst = (uint16_t *)(copy + (size_t)r * row_bytes);
            for (int64_t i = 0; i < w->cols; i++) dst[i] = f32_to_bf16(row[i]);
        }
        free(row);
    }
    m->weight_bytes = m->weight_bytes - stored_bytes(w) + bytes;
    free(w->owned);   /* the int4 grid's scales and zeros live there too */
    *w = (llmi_tensor){.dtype = keep ? w->dtype : LLMI_BF16, .layout = LLMI_LAYOUT_ROWS, .rows = w->rows,
                       .cols = w->cols, .row_bytes = row_bytes, .data = copy, .owned = copy};
    return LLMI_OK;
}

static int cmp_pair(const void *x, const void *y) {
    const lora_pair *a = x, *b = y;
    return a->layer != b->layer ? a->layer - b->layer : a->target - b->target;
}

/* Files the factors come from, kept mapped until the merge is done. */
typedef struct lora_files {
    safetensors_file st;
    gguf_file gg;
    bool st_open, gg_open;
} lora_files;

/* Files one factor under its pair (layer, target), refusing a second copy. */
static int add_factor(lora_pair *pairs, int *n, int layer, int target, bool is_b, lora_factor f, const char *path,
                      llmi_status *st) {
    int k = 0;
    while (k < *n && !(pairs[k].layer == layer && pairs[k].target == target)) k++;
    if (k == *n) pairs[(*n)++] = (lora_pair){.layer = layer, .target = target};
    if (is_b ? pairs[k].has_b : pairs[k].has_a)
        return llmi_fail(st, LLMI_E_USAGE, "--lora %s: %s appears twice", path, f.name);
    if (is_b) pairs[k].b = f, pairs[k].has_b = true;
    else pairs[k].a = f, pairs[k].has_a = true;
    return LLMI_OK;
}

/* A PEFT directory: adapter_config.json, then every tensor of adapter_model.safetensors
 * must be one half of an adapted linear. */
static int read_peft(const char *dir, lora_cfg *c, lora_files *fl, lora_pair **pairs_out, int *n_out, char *path,
                     size_t path_cap, llmi_status *st) {
    if (read_config(dir, c, st)) return st->code;
    snprintf(path, path_cap, "%s/adapter_model.safetensors", dir);
    if (safetensors_open(path, &fl->st, st)) return st->code;
    fl->st_open = true;
    lora_pair *pairs = calloc((size_t)fl->st.n_tensors + 1, sizeof *pairs);
    if (!pairs) return llmi_fail(st, LLMI_E_RUNTIME, "--lora %s: out of memory", path);
    *pairs_out = pairs;
    for (int i = 0; i < fl->st.n_tensors; i++) {
        const safetensors_tensor *t = &fl->st.tensors[i];
        int layer, target;
        bool is_b;
        if (!parse_name(t->name, &layer, &target, &is_b))
            return llmi_fail(st, LLMI_E_USAGE, "--lora %s: tensor \"%.200s\" is not a LoRA factor of a decoder layer's "
                             "q/k/v/o/gate/up/down projection", path, t->name);
        if (!float_dtype(t->dtype) || t->n_dims != 2)
            return llmi_fail(st, LLMI_E_USAGE, "--lora %s: %s must be a 2-d f32, f16 or bf16 tensor (is %d-d %s)", path,
                             t->name, t->n_dims, safetensors_dtype_name(t->dtype));
        lora_factor f = {.name = t->name, .rows = t->shape[0], .cols = t->shape[1], .data = t->data,
                         .type = t->dtype == ST_F32 ? FACTOR_F32 : t->dtype == ST_F16 ? FACTOR_F16 : FACTOR_BF16};
        if (add_factor(pairs, n_out, layer, target, is_b, f, path, st)) return st->code;
    }
    return LLMI_OK;
}

/* llama.cpp's architecture name for m, as an adapter's general.architecture gives it. */
static const char *model_arch_name(const llmi_model *m) {
    switch (m->cfg.arch) {
    case LLMI_ARCH_LLAMA: return "llama";
    case LLMI_ARCH_QWEN2: return "qwen2";
    case LLMI_ARCH_QWEN3: return m->cfg.n_experts > 0 ? "qwen3moe" : "qwen3";
    case LLMI_ARCH_GEMMA2: return "gemma2";
    case LLMI_ARCH_GEMMA3: return "gemma3";
    case LLMI_ARCH_PHI3: return "phi3";
    }
    return "?";
}

/* A GGUF adapter as llama.cpp's convert_lora_to_gguf.py writes it and llama_adapter_lora_init
 * reads it: general.type "adapter", adapter.type "lora", the model's architecture,
 * adapter.lora.alpha, and "<weight name>.lora_a" (ggml dims [in, r]) / ".lora_b" ([r, out])
 * pairs, which are PEFT's A (r, in) and B (out, r) row-major. */
static int read_gguf(const char *path, const llmi_model *m, lora_cfg *c, lora_files *fl, lora_pair **pairs_out,
                     int *n_out, llmi_status *st) {
    if (gguf_open(path, &fl->gg, st)) {
        char why[sizeof st->msg];
        snprintf(why, sizeof why, "%s", st->msg);
        llmi_status_clear(st);
        return llmi_fail(st, LLMI_E_USAGE, "--lora %s", why);
    }
    fl->gg_open = true;
    const gguf_file *g = &fl->gg;
    gguf_str type = {0}, atype = {0}, arch = {0};
    int rc;
    if ((rc = gguf_get_str(g, "general.type", &type, st)) < 0) return llmi_fail(st, LLMI_E_USAGE, "--lora %s", path);
    if (rc == 0 || !gguf_str_eq(type, "adapter"))
        return llmi_fail(st, LLMI_E_USAGE, "--lora %s: not a LoRA adapter (general.type is \"%.*s\", not \"adapter\"): "
                         "a model goes to -m", path, (int)(type.len < 40 ? type.len : 40), type.p ? type.p : "");
    if (gguf_get_str(g, "adapter.type", &atype, st) <= 0 || !gguf_str_eq(atype, "lora"))
        return llmi_fail(st, LLMI_E_USAGE, "--lora %s: adapter.type is not \"lora\" (a control vector or another "
                         "adapter kind is not supported)", path);
    const char *want = model_arch_name(m);
    if (gguf_get_str(g, "general.architecture", &arch, st) <= 0 || !gguf_str_eq(arch, want))
        return llmi_fail(st, LLMI_E_USAGE, "--lora %s: the adapter is for architecture \"%.*s\"; the model is %s", path,
                         (int)(arch.len < 40 ? arch.len : 40), arch.p ? arch.p : "", want);
    if (gguf_find_kv(g, "adapter.alora.invocation_tokens"))
        return llmi_fail(st, LLMI_E_USAGE, "--lora %s: adapter.alora.invocation_tokens is set; activated LoRA is not "
                         "supported", path);
    double alpha = 0;
    if (gguf_get_float(g, "adapter.lora.alpha", &alpha, st) < 0) return llmi_fail(st, LLMI_E_USAGE, "--lora %s", path);
    if (!isfinite(alpha) || fabs(alpha) > 1e6)
        return llmi_fail(st, LLMI_E_USAGE, "--lora %s: adapter.lora.alpha must be a finite number", path);
    *c = (lora_cfg){.alpha = alpha, .gguf = true};
    lora_pair *pairs = calloc((size_t)g->n_tensors + 1, sizeof *pairs);
    if (!pairs) return llmi_fail(st, LLMI_E_RUNTIME, "--lora %s: out of memory", path);
    *pairs_out = pairs;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor_info *t = &g->tensors[i];
        int layer, target;
        bool is_b;
        if (!parse_factor_name(t->name, "blk.", gguf_targets, ".weight.lora_a", ".weight.lora_b", &layer, &target,
                               &is_b))
            return llmi_fail(st, LLMI_E_USAGE, "--lora %s: tensor \"%s\" is not a LoRA factor of a decoder layer's "
                             "attn_q/attn_k/attn_v/attn_output/ffn_gate/ffn_up/ffn_down weight", path, t->name);
        const uint32_t ty = t->type;
        if (t->n_dims != 2 || !(ty == GGUF_TYPE_F32 || ty == GGUF_TYPE_F16 || ty == GGUF_TYPE_BF16 || ty == GGUF_TYPE_Q8_0))
            return llmi_fail(st, LLMI_E_USAGE, "--lora %s: %s must be a 2-d F32, F16, BF16 or Q8_0 tensor (is %u-d %s)",
                             path, t->name, t->n_dims, gguf_type_name(ty));
        lora_factor f = {.name = t->name, .rows = t->dims[1], .cols = t->dims[0], .data = t->data,
                         .type = ty == GGUF_TYPE_F32 ? FACTOR_F32 : ty == GGUF_TYPE_F16 ? FACTOR_F16
                               : ty == GGUF_TYPE_BF16 ? FACTOR_BF16 : FACTOR_Q8_0};
        if (add_factor(pairs, n_out, layer, target, is_b, f, path, st)) return st->code;
    }
    return LLMI_OK;
}

/* Every pair complete, of the model's shapes, its rank the adapter's, its values finite. */
static int check_pairs(const llmi_model *m, const lora_cfg *c, const lora_pair *pairs, int n, const char *path,
                       int64_t *max_cols, llmi_status *st) {
    if (n == 0) return llmi_fail(st, LLMI_E_USAGE, "--lora %s: no LoRA factors in the file", path);
    *max_cols = 1;
    for (int k = 0; k < n; k++) {
        const lora_pair *q = &pairs[k];
        const char *what = lora_targets[q->target];
        const char *name = q->has_a ? q->a.name : q->b.name;
        if (q->layer >= m->cfg.n_layers)
            return llmi_fail(st, LLMI_E_USAGE, "--lora %s: %s is for layer %d; the model has %d", path, name, q->layer,
                             m->cfg.n_layers);
        const llmi_tensor *w = target_tensor(&m->layers[q->layer], q->target);
        if (q->target >= FIRST_MLP_TARGET && m->cfg.n_experts > 0)
            return llmi_fail(st, LLMI_E_USAGE, "--lora %s: %s targets a dense MLP; this model's MLPs are experts", path,
                             name);
        if (!q->has_a || !q->has_b)
            return llmi_fail(st, LLMI_E_USAGE, "--lora %s: layer %d %s has lora_%s without lora_%s", path, q->layer,
                             what, q->has_a ? "A" : "B", q->has_a ? "B" : "A");
        const int64_t r = c->r ? c->r : q->a.rows;
        if (r < 1 || r > LORA_MAX_RANK)
            return llmi_fail(st, LLMI_E_USAGE, "--lora %s: layer %d %s: rank %lld is outside 1..%d", path, q->layer,
                             what, (long long)r, LORA_MAX_RANK);
        if (q->a.rows != r || q->b.cols != r || q->a.cols != w->cols || q->b.rows != w->rows)
            return llmi_fail(st, LLMI_E_USAGE,
                             "--lora %s: layer %d %s: lora_A is %lldx%lld and lora_B %lldx%lld; the weight is %lldx%lld "
                             "and r %lld, so they must be %lldx%lld and %lldx%lld",
                             path, q->layer, what, (long long)q->a.rows, (long long)q->a.cols, (long long)q->b.rows,
                             (long long)q->b.cols, (long long)w->rows, (long long)w->cols, (long long)r, (long long)r,
                             (long long)w->cols, (long long)w->rows, (long long)r);
        if (w->layout != LLMI_LAYOUT_ROWS)
            return llmi_fail(st, LLMI_E_RUNTIME, "--lora %s: layer %d %s is packed for a backend already", path,
                             q->layer, what);
        for (int h = 0; h < 2; h++) {
            const lora_factor *t = h ? &q->b : &q->a;
            int64_t bad = first_non_finite(t);
            if (bad >= 0)
                return llmi_fail(st, LLMI_E_USAGE, "--lora %s: %s holds a non-finite value (element %lld)", path,
                                 t->name, (long long)bad);
        }
        if (w->cols > *max_cols) *max_cols = w->cols;
    }
    return LLMI_OK;
}

/* The factor the pair's weight gets: s = scale times the adapter's own multiplier. */
static float pair_scale(const lora_cfg *c, const lora_pair *q, float scale) {
    if (c->gguf) return c->alpha ? (float)((double)scale * (c->alpha / (double)q->a.rows)) : scale;
    return (float)((double)scale * (c->rslora ? c->alpha / sqrt((double)c->r) : c->alpha / c->r));
}

int model_merge_lora(llmi_model *m, const char *path_in, float scale, llmi_status *st) {
    if (m->n_lora >= LLMI_MAX_LORA)
        return llmi_fail(st, LLMI_E_USAGE, "--lora %s: at most %d adapters", path_in, LLMI_MAX_LORA);
    if (!isfinite(scale)) return llmi_fail(st, LLMI_E_USAGE, "--lora-scaled %s: the scale must be finite", path_in);
    if (!model_weights_from_file(m))
        return llmi_fail(st, LLMI_E_USAGE, "--lora %s: the model's weights are synthetic (--dummy): no adapter fits them",
                         path_in);
    if (m->cfg.arch == LLMI_ARCH_PHI3)   /* its linears are views into fused qkv_proj / gate_up_proj */
        return llmi_fail(st, LLMI_E_USAGE, "--lora %s: adapters on Phi-3's fused qkv_proj and gate_up_proj are not "
                         "supported", path_in);
    struct stat sb;
    if (stat(path_in, &sb) != 0)
        return llmi_fail(st, LLMI_E_USAGE, "--lora %s: no such file or directory (give a PEFT adapter directory or a "
                         "GGUF adapter file)", path_in);
    const bool is_dir = S_ISDIR(sb.st_mode);
    lora_cfg c = {0};
    lora_files fl = {0};
    lora_pair *pairs = NULL;
    int n = 0;
    float *a = NULL, *b = NULL, *tmp = NULL, *acc = NULL;
    char path[2048];
    snprintf(path, sizeof path, "%s", path_in);
    int rc = is_dir ? read_peft(path_in, &c, &fl, &pairs, &n, path, sizeof path, st)
                    : read_gguf(path_in, m, &c, &fl, &pairs, &n, st);
    int64_t max_cols = 1;
    if (!rc) qsort(pairs, (size_t)n, sizeof *pairs, cmp_pair);   /* errors and merges in layer order */
    if (!rc) rc = check_pairs(m, &c, pairs, n, path, &max_cols, st);
    acc = rc ? NULL : malloc((size_t)omp_get_max_threads() * (size_t)max_cols * sizeof *acc);
    if (!rc && !acc) rc = llmi_fail(st, LLMI_E_RUNTIME, "--lora %s: out of memory", path);
    /* Checked: now merge, each weight copied out of its read-only mapping first (only running
     * out of memory can stop it half way, and then the caller ends anyway). */
    for (int k = 0; k < n && !rc; k++) {
        const lora_pair *q = &pairs[k];
        llmi_tensor *w = target_tensor(&m->layers[q->layer], q->target);
        const int r = (int)q->a.rows;
        if ((rc = writable_float_copy(m, w, path, q->layer, lora_targets[q->target], st))) break;
        if (!(a = factor_floats(&q->a)) || !(b = factor_floats(&q->b))) {
            rc = llmi_fail(st, LLMI_E_RUNTIME, "--lora %s: out of memory for layer %d's factors", path, q->layer);
            break;
        }
        if (c.gguf && m->cfg.arch == LLMI_ARCH_LLAMA && q->target <= 1) {
            /* llama.cpp's converter permuted B's rows as it permutes the weight's; the weights
             * here are in Hugging Face's order (model.c un-permutes a llama GGUF's) */
            const int heads = q->target == 0 ? m->cfg.n_heads : m->cfg.n_kv_heads;
            if (!(tmp = malloc((size_t)w->rows * (size_t)r * sizeof *tmp))) {
                rc = llmi_fail(st, LLMI_E_RUNTIME, "--lora %s: out of memory for layer %d's factors", path, q->layer);
                break;
            }
            gguf_unpermute_rows(b, tmp, heads, m->cfg.head_dim, (size_t)r * sizeof *tmp);
            free(b);
            b = tmp;
            tmp = NULL;
        }
        long bad = merge_rows(w, a, b, r, pair_scale(&c, q, scale), acc);
        if (bad) {
            rc = llmi_fail(st, LLMI_E_USAGE, "--lora %s: layer %d %s: %ld merged weights overflow %s (the factors or "
                           "the scale are far too large)", path, q->layer, lora_targets[q->target], bad,
                           dtype_name(w->dtype));
            break;
        }
        free(a), free(b);
        a = b = NULL;
    }
    if (!rc) {
        llmi_lora_applied *ap = &m->lora[m->n_lora++];
        snprintf(ap->path, sizeof ap->path, "%s", path_in);
        ap->scale = scale;
        ap->n_linears = n;
        ap->is_file = !is_dir;
    }
    free(a), free(b), free(tmp);
    free(acc);
    free(pairs);
    if (fl.st_open) safetensors_close(&fl.st);
    if (fl.gg_open) gguf_close(&fl.gg);
    return rc;
}
