/* lora.c — LoRA adapters merged into the weights (see lora.h). */
#include "model/lora.h"

#include <cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/fileio.h"
#include "core/tensor.h"
#include "model/safetensors.h"

#define LORA_MAX_JSON (1u << 20)
#define LORA_MAX_RANK 4096

/* The seven linears of a decoder layer an adapter may target, by the name PEFT gives their
 * module under model.layers.N. */
static const char *const lora_targets[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                           "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                           "mlp.down_proj"};
enum { N_TARGETS = sizeof lora_targets / sizeof lora_targets[0], FIRST_MLP_TARGET = 4 };

static llmi_tensor *target_tensor(llmi_layer *L, int t) {
    llmi_tensor *w[N_TARGETS] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    return w[t];
}

/* One adapted linear: its layer and target, and the adapter's A (r, in) and B (out, r). */
typedef struct lora_pair {
    int layer, target;
    const safetensors_tensor *a, *b;
} lora_pair;

typedef struct lora_cfg {
    int r;
    double alpha;
    bool rslora;
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

/* "[base_model.model.]model.layers.N.<target>.lora_{A,B}.weight" -> layer, target, A or B. */
static bool parse_name(const char *name, int *layer, int *target, bool *is_b) {
    const char *p = name;
    if (!strncmp(p, "base_model.model.", 17)) p += 17;
    if (strncmp(p, "model.layers.", 13)) return false;
    p += 13;
    if (*p < '0' || *p > '9') return false;
    char *end;
    long l = strtol(p, &end, 10);
    if (end == p || *end != '.' || l < 0 || l >= LLMI_MAX_LAYERS || (p[0] == '0' && end - p > 1)) return false;
    p = end + 1;
    for (int t = 0; t < N_TARGETS; t++) {
        size_t n = strlen(lora_targets[t]);
        if (strncmp(p, lora_targets[t], n)) continue;
        if (!strcmp(p + n, ".lora_A.weight") || !strcmp(p + n, ".lora_B.weight")) {
            *layer = (int)l;
            *target = t;
            *is_b = p[n + 6] == 'B';
            return true;
        }
    }
    return false;
}

static bool float_dtype(safetensors_dtype d) { return d == ST_F32 || d == ST_F16 || d == ST_BF16; }

static float st_value(const safetensors_tensor *t, int64_t i) {
    if (t->dtype == ST_F32) {
        float f;
        memcpy(&f, t->data + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, t->data + 2 * i, 2);
    return t->dtype == ST_F16 ? fp16_to_f32(h) : bf16_to_f32(h);
}

/* Index of t's first non-finite value, or -1. */
static int64_t first_non_finite(const safetensors_tensor *t) {
    for (int64_t i = 0; i < t->n_elements; i++)
        if (!isfinite(st_value(t, i))) return i;
    return -1;
}

/* t's values as floats (malloc'ed), or NULL. */
static float *factor_floats(const safetensors_tensor *t) {
    float *x = malloc((size_t)t->n_elements * sizeof *x);
    for (int64_t i = 0; x && i < t->n_elements; i++) x[i] = st_value(t, i);
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

int model_merge_lora(llmi_model *m, const char *dir, float scale, llmi_status *st) {
    if (m->n_lora >= LLMI_MAX_LORA)
        return llmi_fail(st, LLMI_E_USAGE, "--lora %s: at most %d adapters", dir, LLMI_MAX_LORA);
    if (!isfinite(scale)) return llmi_fail(st, LLMI_E_USAGE, "--lora-scaled %s: the scale must be finite", dir);
    if (!model_weights_from_file(m))
        return llmi_fail(st, LLMI_E_USAGE, "--lora %s: the model's weights are synthetic (--dummy): no adapter fits them",
                         dir);
    lora_cfg c = {0};
    if (read_config(dir, &c, st)) return st->code;
    char path[2048];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    safetensors_file f;
    if (safetensors_open(path, &f, st)) return st->code;
    int rc = LLMI_OK;
    lora_pair *pairs = calloc((size_t)f.n_tensors + 1, sizeof *pairs);
    float *a = NULL, *b = NULL, *acc = NULL;
    int n = 0;
    if (!pairs) {
        rc = llmi_fail(st, LLMI_E_RUNTIME, "--lora %s: out of memory", path);
        goto out;
    }
    /* Every tensor must be one half of an adapted linear the model has. */
    for (int i = 0; i < f.n_tensors && !rc; i++) {
        const safetensors_tensor *t = &f.tensors[i];
        int layer, target;
        bool is_b;
        if (!parse_name(t->name, &layer, &target, &is_b)) {
            rc = llmi_fail(st, LLMI_E_USAGE, "--lora %s: tensor \"%.200s\" is not a LoRA factor of a decoder layer's "
                           "q/k/v/o/gate/up/down projection", path, t->name);
            break;
        }
        if (layer >= m->cfg.n_layers) {
            rc = llmi_fail(st, LLMI_E_USAGE, "--lora %s: %s is for layer %d; the model has %d", path, t->name, layer,
                           m->cfg.n_layers);
            break;
        }
        if (target >= FIRST_MLP_TARGET && m->cfg.n_experts > 0) {
            rc = llmi_fail(st, LLMI_E_USAGE, "--lora %s: %s targets a dense MLP; this model's MLPs are experts", path,
                           t->name);
            break;
        }
        if (!float_dtype(t->dtype) || t->n_dims != 2) {
            rc = llmi_fail(st, LLMI_E_USAGE, "--lora %s: %s must be a 2-d f32, f16 or bf16 tensor (is %d-d %s)", path,
                           t->name, t->n_dims, safetensors_dtype_name(t->dtype));
            break;
        }
        int k = 0;
        while (k < n && !(pairs[k].layer == layer && pairs[k].target == target)) k++;
        if (k == n) pairs[n++] = (lora_pair){.layer = layer, .target = target};
        if (is_b ? pairs[k].b != NULL : pairs[k].a != NULL) {
            rc = llmi_fail(st, LLMI_E_USAGE, "--lora %s: %s appears twice", path, t->name);
            break;
        }
        if (is_b) pairs[k].b = t;
        else pairs[k].a = t;
    }
    if (!rc && n == 0) rc = llmi_fail(st, LLMI_E_USAGE, "--lora %s: no LoRA factors in the file", path);
    qsort(pairs, (size_t)n, sizeof *pairs, cmp_pair);
    int64_t max_cols = 1;
    for (int k = 0; k < n && !rc; k++) {
        const lora_pair *q = &pairs[k];
        const llmi_tensor *w = target_tensor(&m->layers[q->layer], q->target);
        const char *what = lora_targets[q->target];
        if (!q->a || !q->b) {
            rc = llmi_fail(st, LLMI_E_USAGE, "--lora %s: layer %d %s has lora_%s without lora_%s", path, q->layer, what,
                           q->a ? "A" : "B", q->a ? "B" : "A");
        } else if (q->a->shape[0] != c.r || q->b->shape[1] != c.r || q->a->shape[1] != w->cols ||
                   q->b->shape[0] != w->rows) {
            rc = llmi_fail(st, LLMI_E_USAGE,
                           "--lora %s: layer %d %s: lora_A is %lldx%lld and lora_B %lldx%lld; the weight is %lldx%lld and "
                           "r %d, so they must be %dx%lld and %lldx%d",
                           path, q->layer, what, (long long)q->a->shape[0], (long long)q->a->shape[1],
                           (long long)q->b->shape[0], (long long)q->b->shape[1], (long long)w->rows, (long long)w->cols,
                           c.r, c.r, (long long)w->cols, (long long)w->rows, c.r);
        } else if (w->layout != LLMI_LAYOUT_ROWS) {
            rc = llmi_fail(st, LLMI_E_RUNTIME, "--lora %s: layer %d %s is packed for a backend already", path, q->layer,
                           what);
        } else {
            for (int h = 0; h < 2 && !rc; h++) {
                const safetensors_tensor *t = h ? q->b : q->a;
                int64_t bad = first_non_finite(t);
                if (bad >= 0)
                    rc = llmi_fail(st, LLMI_E_USAGE, "--lora %s: %s holds a non-finite value (element %lld)", path,
                                   t->name, (long long)bad);
            }
        }
        if (!rc && w->cols > max_cols) max_cols = w->cols;
    }
    acc = rc ? NULL : malloc((size_t)omp_get_max_threads() * (size_t)max_cols * sizeof *acc);
    if (!rc && !acc) rc = llmi_fail(st, LLMI_E_RUNTIME, "--lora %s: out of memory", path);
    /* Checked: now merge, each weight copied out of its read-only mapping first (only running
     * out of memory can stop it half way, and then the caller ends anyway). */
    const float s = (float)((double)scale * (c.rslora ? c.alpha / sqrt((double)c.r) : c.alpha / c.r));
    for (int k = 0; k < n && !rc; k++) {
        const lora_pair *q = &pairs[k];
        llmi_tensor *w = target_tensor(&m->layers[q->layer], q->target);
        if ((rc = writable_float_copy(m, w, path, q->layer, lora_targets[q->target], st))) break;
        if (!(a = factor_floats(q->a)) || !(b = factor_floats(q->b))) {
            rc = llmi_fail(st, LLMI_E_RUNTIME, "--lora %s: out of memory for layer %d's factors", path, q->layer);
            break;
        }
        long bad = merge_rows(w, a, b, c.r, s, acc);
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
        snprintf(ap->path, sizeof ap->path, "%s", dir);
        ap->scale = scale;
        ap->n_linears = n;
    }
out:
    free(a), free(b);
    free(acc);
    free(pairs);
    safetensors_close(&f);
    return rc;
}
