/* config_json.c — Hugging Face config.json -> llmi_config (see config_json.h). */
#include "model/config_json.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "model/model_internal.h"

#define CONFIG_JSON_MAX_BYTES (64u << 20)   /* real config.json files are a few KB */

typedef enum {
    CJ_WINDOW_NONE = 0,    /* LlamaConfig has no sliding window: the key is ignored */
    CJ_WINDOW_MISTRAL,     /* sliding_window on every layer (absent: the family's default; null: none) */
    CJ_WINDOW_QWEN2,       /* only with use_sliding_window, on layers >= max_window_layers */
    CJ_WINDOW_QWEN3_MOE,   /* only with use_sliding_window, on every layer */
} cj_window;

typedef enum {
    CJ_MOE_NONE = 0,
    CJ_MOE_MIXTRAL,        /* num_local_experts of intermediate_size, top-k always renormalised (Mixtral;
                              GraniteMoe's softmax over the top-k logits is the same) */
    CJ_MOE_QWEN3,          /* num_experts of moe_intermediate_size, renormalised with norm_topk_prob */
} cj_moe;

/* What transformers' config class of each family assumes for an absent key. */
typedef struct cj_family {
    const char *model_type;    /* config.json "model_type" (the config class) */
    const char *arch_class;    /* architectures[0] (the model class) */
    llmi_arch arch;
    int max_ctx;               /* max_position_embeddings */
    int n_kv_heads;            /* num_key_value_heads when absent; 0 = num_attention_heads */
    int head_dim;              /* head_dim when absent; 0 = hidden_size / num_attention_heads */
    cj_window window;
    int window_default;        /* sliding_window when absent */
    cj_moe moe;
    float norm_eps;            /* rms_norm_eps when absent; 0 = CJ_NORM_EPS */
    float rope_theta;          /* the config class's default_theta; 0 = CJ_ROPE_THETA */
    bool tied;                 /* tie_word_embeddings when absent */
    bool nope;                 /* SmolLM3's layers without RoPE (cj_smollm3) */
    bool granite;              /* Granite's four multipliers (cj_granite) */
} cj_family;

#define CJ_QWEN3_HEAD_DIM 128      /* Qwen3Config's head_dim (not hidden_size / heads) */
#define CJ_GEMMA_HEAD_DIM 256     /* Gemma2Config's and Gemma3TextConfig's head_dim and query_pre_attn_scalar */
#define CJ_WINDOW        4096      /* sliding_window of MistralConfig, Qwen2Config and Qwen3(Moe)Config */

static const cj_family k_families[] = {
    {.model_type = "llama", .arch_class = "LlamaForCausalLM", .arch = LLMI_ARCH_LLAMA, .max_ctx = 2048},
    {.model_type = "mistral", .arch_class = "MistralForCausalLM", .arch = LLMI_ARCH_LLAMA, .max_ctx = 4096 * 32,
     .n_kv_heads = 8, .window = CJ_WINDOW_MISTRAL, .window_default = CJ_WINDOW},
    {.model_type = "mixtral", .arch_class = "MixtralForCausalLM", .arch = LLMI_ARCH_LLAMA, .max_ctx = 4096 * 32,
     .n_kv_heads = 8, .window = CJ_WINDOW_MISTRAL, .moe = CJ_MOE_MIXTRAL, .norm_eps = 1e-5f, .rope_theta = 1e6f},
    {.model_type = "qwen2", .arch_class = "Qwen2ForCausalLM", .arch = LLMI_ARCH_QWEN2, .max_ctx = 32768,
     .n_kv_heads = 32, .window = CJ_WINDOW_QWEN2, .window_default = CJ_WINDOW},
    {.model_type = "qwen3", .arch_class = "Qwen3ForCausalLM", .arch = LLMI_ARCH_QWEN3, .max_ctx = 32768,
     .n_kv_heads = 32, .head_dim = CJ_QWEN3_HEAD_DIM, .window = CJ_WINDOW_QWEN2, .window_default = CJ_WINDOW},
    /* Qwen3MoeConfig has no head_dim: the model takes hidden_size / heads when the file has none */
    {.model_type = "qwen3_moe", .arch_class = "Qwen3MoeForCausalLM", .arch = LLMI_ARCH_QWEN3, .max_ctx = 32768,
     .n_kv_heads = 4, .window = CJ_WINDOW_QWEN3_MOE, .window_default = CJ_WINDOW, .moe = CJ_MOE_QWEN3},
    /* Phi3Config: no window unless sliding_window says (then every layer), rms_norm_eps 1e-5 */
    {.model_type = "phi3", .arch_class = "Phi3ForCausalLM", .arch = LLMI_ARCH_PHI3, .max_ctx = 4096,
     .window = CJ_WINDOW_MISTRAL, .norm_eps = 1e-5f},
    /* SmolLM3Config: llama's layers, every no_rope_layer_interval-th without RoPE; windows:
     * cj_smollm3 */
    {.model_type = "smollm3", .arch_class = "SmolLM3ForCausalLM", .arch = LLMI_ARCH_LLAMA, .max_ctx = 32768,
     .n_kv_heads = 4, .rope_theta = 2e6f, .tied = true, .nope = true},
    /* GraniteConfig: llama's layers and defaults, plus its multipliers (cj_granite) */
    {.model_type = "granite", .arch_class = "GraniteForCausalLM", .arch = LLMI_ARCH_LLAMA, .max_ctx = 2048,
     .granite = true},
    /* GraniteMoeConfig: Granite's with Mixtral's experts (8, top-2) */
    {.model_type = "granitemoe", .arch_class = "GraniteMoeForCausalLM", .arch = LLMI_ARCH_LLAMA, .max_ctx = 2048,
     .granite = true, .moe = CJ_MOE_MIXTRAL},
    {.model_type = "gemma2", .arch_class = "Gemma2ForCausalLM", .arch = LLMI_ARCH_GEMMA2, .max_ctx = 8192,
     .n_kv_heads = 4, .head_dim = CJ_GEMMA_HEAD_DIM},   /* windows: cj_gemma */
    {.model_type = "gemma3_text", .arch_class = "Gemma3ForCausalLM", .arch = LLMI_ARCH_GEMMA3, .max_ctx = 131072,
     .n_kv_heads = 4, .head_dim = CJ_GEMMA_HEAD_DIM},   /* windows: cj_gemma */
};
#define N_FAMILIES ((int)(sizeof k_families / sizeof k_families[0]))

#define CJ_NORM_EPS      1e-6f     /* rms_norm_eps of every config class but Mixtral's */
#define CJ_ROPE_THETA    10000.0f
#define CJ_WINDOW_LAYERS 28        /* max_window_layers of Qwen2Config and Qwen3Config */
/* Gemma3TextConfig's and Gemma2Config's defaults */
#define CJ_GEMMA_WINDOW 4096
#define CJ_GEMMA3_PATTERN 6        /* sliding_window_pattern: every 6th layer global */
#define CJ_GEMMA2_PATTERN 2        /* layer_types' default: even layers slide, odd ones are global */
#define CJ_GEMMA3_THETA 1000000.0f
#define CJ_GEMMA3_THETA_LOCAL 10000.0f
#define CJ_GEMMA2_ATTN_SOFTCAP 50.0f
#define CJ_GEMMA2_FINAL_SOFTCAP 30.0f

/* ---------------------------------------------------------------- typed fields */

static cJSON *json_item(const cJSON *o, const char *key) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return (j && !cJSON_IsNull(j)) ? (cJSON *)j : NULL;
}

/* 1 set, 0 absent (null counts as absent), < 0 error naming file and field. */
static int json_int(const cJSON *o, const char *key, int64_t lo, int64_t hi, int *out, const char *file,
                    llmi_status *st) {
    const cJSON *j = json_item(o, key);
    if (!j) return 0;
    double d = cJSON_IsNumber(j) ? j->valuedouble : NAN;
    if (!(d >= (double)lo && d <= (double)hi) || d != floor(d)) {
        llmi_fail(st, LLMI_E_RUNTIME, "%s: %s must be an integer in [%lld, %lld]", file, key, (long long)lo,
                  (long long)hi);
        return -LLMI_E_RUNTIME;
    }
    *out = (int)d;
    return 1;
}

static int json_num(const cJSON *o, const char *key, float *out, const char *file, llmi_status *st) {
    const cJSON *j = json_item(o, key);
    if (!j) return 0;
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble)) {
        llmi_fail(st, LLMI_E_RUNTIME, "%s: %s must be a finite number", file, key);
        return -LLMI_E_RUNTIME;
    }
    *out = model_to_f32(j->valuedouble);
    return 1;
}

static int json_bool(const cJSON *o, const char *key, bool *out, const char *file, llmi_status *st) {
    const cJSON *j = json_item(o, key);
    if (!j) return 0;
    if (!cJSON_IsBool(j)) {
        llmi_fail(st, LLMI_E_RUNTIME, "%s: %s must be true or false", file, key);
        return -LLMI_E_RUNTIME;
    }
    *out = cJSON_IsTrue(j);
    return 1;
}

static int json_req_int(const cJSON *o, const char *key, int *out, const char *file, llmi_status *st) {
    int rc = json_int(o, key, 1, INT32_MAX, out, file, st);
    if (rc == 0) return llmi_fail(st, LLMI_E_RUNTIME, "%s: missing %s", file, key);
    return rc < 0 ? LLMI_E_RUNTIME : 0;
}

/* A string from the file, shortened and with control bytes masked, for a message. */
static void printable(char *dst, size_t cap, const char *s) {
    snprintf(dst, cap, "%s", s);
    for (char *p = dst; *p; p++)
        if ((unsigned char)*p < 0x20) *p = '?';
}

/* ---------------------------------------------------------------- sections */

static int cj_family_of(const cJSON *j, const char *file, const cj_family **out, llmi_status *st) {
    const cJSON *mt = json_item(j, "model_type");
    const cJSON *archs = json_item(j, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    char b[64], b2[64];
    if (!cJSON_IsString(a0)) a0 = NULL;
    if (mt) {
        if (!cJSON_IsString(mt)) return llmi_fail(st, LLMI_E_RUNTIME, "%s: model_type must be a string", file);
        for (int i = 0; i < N_FAMILIES; i++) {
            if (strcmp(mt->valuestring, k_families[i].model_type) != 0) continue;
            if (a0 && strcmp(a0->valuestring, k_families[i].arch_class) != 0) {
                printable(b, sizeof b, a0->valuestring);
                return llmi_fail(st, LLMI_E_RUNTIME, "%s: architectures[0] %s does not match model_type %s (%s)", file,
                                 b, k_families[i].model_type, k_families[i].arch_class);
            }
            *out = &k_families[i];
            return 0;
        }
        printable(b, sizeof b, mt->valuestring);
        if (strcmp(mt->valuestring, "gemma3") == 0)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: model_type gemma3 (Gemma3ForConditionalGeneration, text and vision) "
                             "is not supported: use a text-only checkpoint (gemma3_text) or a GGUF", file);
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: unsupported model_type %s (supported: llama, mistral, mixtral, qwen2, "
                         "qwen3, qwen3_moe, smollm3, granite, granitemoe, gemma2, gemma3_text, phi3)", file, b);
    }
    if (!a0)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: no model_type and no architectures[0]: which model is this?", file);
    for (int i = 0; i < N_FAMILIES; i++) {
        if (strcmp(a0->valuestring, k_families[i].arch_class) == 0) {
            *out = &k_families[i];
            return 0;
        }
    }
    printable(b2, sizeof b2, a0->valuestring);
    return llmi_fail(st, LLMI_E_RUNTIME,
                     "%s: unsupported architecture %s (supported: LlamaForCausalLM, MistralForCausalLM, "
                     "MixtralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, SmolLM3ForCausalLM, "
                     "GraniteForCausalLM, GraniteMoeForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM)",
                     file, b2);
}

/* The shapes: required sizes, then the head geometry. */
static int cj_shapes(const cJSON *j, const cj_family *f, llmi_config *c, const char *file, llmi_status *st) {
    if (json_req_int(j, "hidden_size", &c->dim, file, st) ||
        json_req_int(j, "num_hidden_layers", &c->n_layers, file, st) ||
        json_req_int(j, "num_attention_heads", &c->n_heads, file, st) ||
        json_req_int(j, "intermediate_size", &c->ffn_dim, file, st) ||
        json_req_int(j, "vocab_size", &c->n_vocab, file, st))
        return LLMI_E_RUNTIME;
    if (c->n_layers > LLMI_MAX_LAYERS)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: num_hidden_layers %d exceeds the limit of %d layers", file,
                         c->n_layers, LLMI_MAX_LAYERS);
    /* an explicit null means "as many as attention heads" in every family */
    bool kv_given = cJSON_GetObjectItemCaseSensitive(j, "num_key_value_heads") != NULL;
    c->n_kv_heads = !kv_given && f->n_kv_heads ? f->n_kv_heads : c->n_heads;
    if (json_int(j, "num_key_value_heads", 1, INT32_MAX, &c->n_kv_heads, file, st) < 0) return LLMI_E_RUNTIME;
    int hrc = json_int(j, "head_dim", 1, INT32_MAX, &c->head_dim, file, st);
    if (hrc == 0 && f->head_dim) {
        c->head_dim = f->head_dim;   /* not hidden_size / heads */
        hrc = 1;
    }
    if (hrc < 0 || (hrc == 0 && model_head_dim(c, file, "hidden_size", "num_attention_heads", st)))
        return LLMI_E_RUNTIME;
    c->rope_dim = c->head_dim;
    return 0;
}

/* layer_types (transformers' per-layer "sliding_attention" / "full_attention") into
 * c->layer_sliding: 1 read, 0 absent, < 0 error naming the file. */
static int cj_layer_types(const cJSON *j, llmi_config *c, const char *file, llmi_status *st) {
    const cJSON *types = json_item(j, "layer_types");
    if (!types) return 0;
    if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != c->n_layers) {
        llmi_fail(st, LLMI_E_RUNTIME, "%s: layer_types must list one type per layer (%d)", file, c->n_layers);
        return -LLMI_E_RUNTIME;
    }
    for (int l = 0; l < c->n_layers; l++) {
        const cJSON *t = cJSON_GetArrayItem(types, l);
        const char *name = cJSON_IsString(t) ? t->valuestring : "";
        if (strcmp(name, "sliding_attention") != 0 && strcmp(name, "full_attention") != 0) {
            llmi_fail(st, LLMI_E_RUNTIME, "%s: layer_types[%d] must be sliding_attention or full_attention", file, l);
            return -LLMI_E_RUNTIME;
        }
        c->layer_sliding[l] = name[0] == 's';
    }
    return 1;
}

/* The attention window a family applies to this config: c->sliding_window (0 for none)
 * and which layers slide (Mistral, Mixtral: all; Qwen2/Qwen3: layer_types, else the layers
 * from max_window_layers on, and only with use_sliding_window; Qwen3-MoE: all, only with
 * use_sliding_window). */
static int cj_window_of(const cJSON *j, const cj_family *f, llmi_config *c, const char *file, llmi_status *st) {
    c->sliding_window = 0;
    if (f->window == CJ_WINDOW_NONE) return 0;
    bool given = cJSON_GetObjectItemCaseSensitive(j, "sliding_window") != NULL;
    int w = given ? 0 : f->window_default;   /* an explicit null: no window */
    if (json_int(j, "sliding_window", 1, INT32_MAX, &w, file, st) < 0) return LLMI_E_RUNTIME;
    for (int l = 0; l < c->n_layers; l++) c->layer_sliding[l] = true;
    if (f->window == CJ_WINDOW_QWEN3_MOE) {
        bool use = false;
        if (json_bool(j, "use_sliding_window", &use, file, st) < 0) return LLMI_E_RUNTIME;
        if (!use) w = 0;
    }
    if (f->window == CJ_WINDOW_QWEN2) {
        bool use = false;
        int full_layers = CJ_WINDOW_LAYERS;
        if (json_bool(j, "use_sliding_window", &use, file, st) < 0 ||
            json_int(j, "max_window_layers", 0, INT32_MAX, &full_layers, file, st) < 0)
            return LLMI_E_RUNTIME;
        int typed = cj_layer_types(j, c, file, st);
        if (typed < 0) return LLMI_E_RUNTIME;
        for (int l = 0; l < c->n_layers && !typed; l++) c->layer_sliding[l] = l >= full_layers;
        if (!use) w = 0;
    }
    c->sliding_window = w;
    return 0;
}

/* transformers' _compute_yarn_parameters and the standardisation before it: the original
 * context is the config's top-level original_max_position_embeddings, else rope_scaling's,
 * else max_position_embeddings; the factor, when absent, their ratio; the attention factor,
 * when absent, get_mscale(factor) (with mscale and mscale_all_dim: their quotient); betas 32
 * and 1 unless set (0 counts as unset, as transformers' `or`). */
static int cj_yarn(const cJSON *j, const cJSON *rs, llmi_config *c, const char *file, llmi_status *st) {
    c->rope_scaling = LLMI_ROPE_SCALING_YARN;
    c->rope_orig_max_pos = c->max_ctx;
    int top = json_int(j, "original_max_position_embeddings", 1, INT32_MAX, &c->rope_orig_max_pos, file, st);
    if (top < 0 || (top == 0 && json_int(rs, "original_max_position_embeddings", 1, INT32_MAX, &c->rope_orig_max_pos,
                                         file, st) < 0))
        return LLMI_E_RUNTIME;
    int has_factor = json_num(rs, "factor", &c->rope_factor, file, st);
    if (has_factor < 0) return LLMI_E_RUNTIME;
    if (has_factor == 0) c->rope_factor = (float)c->max_ctx / (float)c->rope_orig_max_pos;
    float af = 0, ms = 0, msa = 0;
    bool truncate = true;
    c->rope_yarn_beta_fast = c->rope_yarn_beta_slow = 0;
    if (json_num(rs, "attention_factor", &af, file, st) < 0 || json_num(rs, "mscale", &ms, file, st) < 0 ||
        json_num(rs, "mscale_all_dim", &msa, file, st) < 0 ||
        json_num(rs, "beta_fast", &c->rope_yarn_beta_fast, file, st) < 0 ||
        json_num(rs, "beta_slow", &c->rope_yarn_beta_slow, file, st) < 0 || json_bool(rs, "truncate", &truncate, file, st) < 0)
        return LLMI_E_RUNTIME;
    if (c->rope_yarn_beta_fast == 0) c->rope_yarn_beta_fast = 32;
    if (c->rope_yarn_beta_slow == 0) c->rope_yarn_beta_slow = 1;
    c->rope_yarn_no_truncate = !truncate;
    if (af == 0)
        af = (float)(ms != 0 && msa != 0 ? config_yarn_mscale(c->rope_factor, ms) / config_yarn_mscale(c->rope_factor, msa)
                                         : config_yarn_mscale(c->rope_factor, 1));
    c->rope_attn_factor = af;
    config_yarn_context(c);
    return 0;
}

static int cj_rope_scaling(const cJSON *j, const cJSON *rs, llmi_config *c, const char *file, llmi_status *st) {
    if (!rs) return 0;
    if (!cJSON_IsObject(rs)) return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope_scaling must be an object or null", file);
    const cJSON *t = json_item(rs, "rope_type");
    if (!t) t = json_item(rs, "type");
    if (!t || !cJSON_IsString(t)) return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope_scaling has no rope_type", file);
    if (strcmp(t->valuestring, "default") == 0) return 0;
    if (strcmp(t->valuestring, "linear") == 0) {
        c->rope_scaling = LLMI_ROPE_SCALING_LINEAR;
        if (json_num(rs, "factor", &c->rope_factor, file, st) <= 0)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope_scaling.factor is required for linear scaling", file);
        return 0;
    }
    if (strcmp(t->valuestring, "llama3") == 0) {
        c->rope_scaling = LLMI_ROPE_SCALING_LLAMA3;
        if (json_num(rs, "factor", &c->rope_factor, file, st) <= 0 ||
            json_num(rs, "low_freq_factor", &c->rope_low_freq_factor, file, st) <= 0 ||
            json_num(rs, "high_freq_factor", &c->rope_high_freq_factor, file, st) <= 0 ||
            json_int(rs, "original_max_position_embeddings", 1, INT32_MAX, &c->rope_orig_max_pos, file, st) <= 0)
            return llmi_fail(st, LLMI_E_RUNTIME,
                             "%s: llama3 rope_scaling needs factor, low_freq_factor, high_freq_factor and "
                             "original_max_position_embeddings", file);
        return 0;
    }
    if (strcmp(t->valuestring, "yarn") == 0) return cj_yarn(j, rs, c, file, st);
    char b[40];
    printable(b, sizeof b, t->valuestring);
    return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope_scaling type %s is not supported", file, b);
}

/* RoPE of a config whose layers share one: transformers 5 moved theta and scaling into
 * rope_parameters, transformers 4 has rope_theta and rope_scaling at the top level. */
static int cj_rope_flat(const cJSON *j, llmi_config *c, const char *file, llmi_status *st) {
    const cJSON *rp = json_item(j, "rope_parameters"), *rs = json_item(j, "rope_scaling");
    if (rp && cJSON_IsObject(rp)) {
        if (json_num(rp, "rope_theta", &c->rope_theta, file, st) < 0) return LLMI_E_RUNTIME;
        if (!rs) rs = rp;
    }
    return cj_rope_scaling(j, rs, c, file, st);
}

/* n positive finite numbers of the list o[key] (longrope's factors). */
static int json_factors(const cJSON *o, const char *key, int n, float *out, const char *file, llmi_status *st) {
    const cJSON *a = json_item(o, key);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope_scaling.%s must list %d numbers (one per rotated pair)", file, key, n);
    for (int i = 0; i < n; i++) {
        const cJSON *x = cJSON_GetArrayItem(a, i);
        if (!cJSON_IsNumber(x) || !(x->valuedouble > 0) || !isfinite(x->valuedouble) || x->valuedouble > 1e6)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope_scaling.%s[%d] must be a number in (0, 1e6]", file, key, i);
        out[i] = (float)x->valuedouble;
    }
    return 0;
}

/* Phi3Config (transformers' configuration_phi3.py): llama's layers (the fused projections
 * are model_bind_weights' business); a partial RoPE where partial_rotary_factor says (the
 * rotated dims int(head_dim * factor), Phi-4-mini's 96 of 128; read from rope_scaling, else
 * rope_parameters, else the top level, as convert_rope_params_to_dict); and longrope for any
 * rope_scaling type ("su", "yarn" and "longrope" all mean it to Phi3Config), read as
 * _compute_longrope_parameters does: short_factor and long_factor, one per rotated pair; the
 * original context from the top level (4096 when absent; rope_scaling's is overridden); factor, else
 * max_position_embeddings / original; attention_factor, else sqrt(1 + ln(factor) /
 * ln(original)) (1 for a factor <= 1).  The short factors until model_select_longrope says. */
static int cj_phi3(const cJSON *j, llmi_config *c, const char *file, llmi_status *st) {
    const cJSON *rp = json_item(j, "rope_parameters"), *rs = json_item(j, "rope_scaling");
    if (!cJSON_IsObject(rp)) rp = NULL;
    if (!cJSON_IsObject(rs)) rs = NULL;
    const cJSON *scal = rs ? rs : rp;   /* Phi3Config: rope_scaling, else rope_parameters */
    const cJSON *prf = scal ? json_item(scal, "partial_rotary_factor") : NULL;
    if (!prf) prf = json_item(j, "partial_rotary_factor");
    if (prf) {
        if (!cJSON_IsNumber(prf) || !(prf->valuedouble > 0) || !(prf->valuedouble <= 1))
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: partial_rotary_factor must be a number in (0, 1]", file);
        /* Python's int(head_dim * factor) in double, as transformers computes the rotated dims */
        c->rope_dim = (int)((double)c->head_dim * prf->valuedouble);
        if (c->rope_dim < 2 || c->rope_dim % 2)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: partial_rotary_factor %g rotates %d of head_dim %d: an even "
                             "count >= 2 is needed", file, prf->valuedouble, c->rope_dim, c->head_dim);
    }
    if (rp && json_num(rp, "rope_theta", &c->rope_theta, file, st) < 0) return LLMI_E_RUNTIME;
    const cJSON *t = scal ? json_item(scal, "rope_type") : NULL;
    if (!t && scal) t = json_item(scal, "type");
    if (!t || (cJSON_IsString(t) && strcmp(t->valuestring, "default") == 0)) return 0;
    if (!cJSON_IsString(t) || (strcmp(t->valuestring, "longrope") != 0 && strcmp(t->valuestring, "su") != 0 &&
                               strcmp(t->valuestring, "yarn") != 0))
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope_scaling type must be longrope (or su, yarn: the same to Phi-3)",
                         file);
    /* standardize_rope_params: Phi3Config's own original_max_position_embeddings (the top
     * level's, 4096 when absent) replaces whatever rope_scaling says */
    c->rope_orig_max_pos = 4096;
    if (json_int(j, "original_max_position_embeddings", 1, INT32_MAX, &c->rope_orig_max_pos, file, st) < 0)
        return LLMI_E_RUNTIME;
    const int half = c->rope_dim / 2;
    if (half > LLMI_ROPE_MAX_FACTORS)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: longrope with %d rotated dims is more than llmi holds", file,
                         c->rope_dim);
    if (json_factors(scal, "short_factor", half, c->rope_short, file, st) ||
        json_factors(scal, "long_factor", half, c->rope_long, file, st))
        return LLMI_E_RUNTIME;
    c->rope_factor = (float)((double)c->max_ctx / c->rope_orig_max_pos);
    if (json_num(scal, "factor", &c->rope_factor, file, st) < 0) return LLMI_E_RUNTIME;
    const double f = c->rope_factor;
    c->rope_attn_factor = f <= 1 ? 1.0f : (float)sqrt(1 + log(f) / log((double)c->rope_orig_max_pos));
    if (json_num(scal, "attention_factor", &c->rope_attn_factor, file, st) < 0) return LLMI_E_RUNTIME;
    c->rope_scaling = LLMI_ROPE_SCALING_LONGROPE;
    c->rope_long_active = false;
    return 0;
}

/* A soft cap of config.json: the family's default when absent, none when null. */
static int cj_softcap(const cJSON *j, const char *key, float dflt, float *out, const char *file, llmi_status *st) {
    *out = cJSON_GetObjectItemCaseSensitive(j, key) ? 0.0f : dflt;
    int rc = json_num(j, key, out, file, st);
    if (rc < 0) return LLMI_E_RUNTIME;
    if (rc > 0 && !(*out > 0)) return llmi_fail(st, LLMI_E_RUNTIME, "%s: %s must be > 0 (null: none)", file, key);
    return 0;
}

/* Gemma2Config and Gemma3TextConfig (transformers' configuration_gemma2/3.py and
 * modeling_gemma2/3.py): GeGLU (gelu_pytorch_tanh), embeddings times sqrt(hidden_size),
 * sandwich norms, q.k scaled by query_pre_attn_scalar^-1/2, the scores and the final logits
 * soft-capped by attn_logit_softcapping and final_logit_softcapping (Gemma 2: 50 and 30 by
 * default; Gemma 3: none), and the layers of layer_types global, the rest attending to the
 * last sliding_window keys; without layer_types, Gemma 2's even layers slide and Gemma 3's
 * all but every sliding_window_pattern-th.  Gemma 3 only: q/k norms, and its sliding layers'
 * own RoPE base rope_local_base_freq, unscaled; rope_scaling (or
 * rope_parameters.full_attention) scales only the global layers. */
static int cj_gemma(const cJSON *j, llmi_config *c, const char *file, llmi_status *st) {
    const bool g3 = c->arch == LLMI_ARCH_GEMMA3;
    c->act = LLMI_ACT_GELU_TANH;
    c->qk_norm = g3;
    c->post_norms = true;
    c->embed_scale = sqrtf((float)c->dim);
    c->tie_embeddings = true;
    if (g3) {
        c->rope_theta = CJ_GEMMA3_THETA;
        c->rope_theta_local = CJ_GEMMA3_THETA_LOCAL;
    }
    const cJSON *act = json_item(j, "hidden_activation");
    if (!act) act = json_item(j, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "gelu_pytorch_tanh") != 0))
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: hidden_activation must be gelu_pytorch_tanh", file);
    if (cj_softcap(j, "attn_logit_softcapping", g3 ? 0.0f : CJ_GEMMA2_ATTN_SOFTCAP, &c->attn_softcap, file, st) ||
        cj_softcap(j, "final_logit_softcapping", g3 ? 0.0f : CJ_GEMMA2_FINAL_SOFTCAP, &c->final_softcap, file, st))
        return LLMI_E_RUNTIME;
    bool bidir = false;
    if (json_bool(j, "use_bidirectional_attention", &bidir, file, st) < 0) return LLMI_E_RUNTIME;
    if (bidir) return llmi_fail(st, LLMI_E_RUNTIME, "%s: use_bidirectional_attention is not supported", file);
    int qpas = CJ_GEMMA_HEAD_DIM, pattern = g3 ? CJ_GEMMA3_PATTERN : CJ_GEMMA2_PATTERN;
    bool given = cJSON_GetObjectItemCaseSensitive(j, "sliding_window") != NULL;
    c->sliding_window = given ? 0 : CJ_GEMMA_WINDOW;   /* an explicit null: no window */
    if (json_int(j, "query_pre_attn_scalar", 1, INT32_MAX, &qpas, file, st) < 0 ||
        json_int(j, "sliding_window", 1, INT32_MAX, &c->sliding_window, file, st) < 0 ||
        (g3 && json_int(j, "sliding_window_pattern", 1, LLMI_MAX_LAYERS, &pattern, file, st) < 0) ||
        json_bool(j, "tie_word_embeddings", &c->tie_embeddings, file, st) < 0 ||
        json_num(j, "rope_theta", &c->rope_theta, file, st) < 0 ||
        (g3 && json_num(j, "rope_local_base_freq", &c->rope_theta_local, file, st) < 0))
        return LLMI_E_RUNTIME;
    c->attn_scale = model_to_f32(1.0 / sqrt((double)qpas));
    int typed = cj_layer_types(j, c, file, st);
    if (typed < 0) return LLMI_E_RUNTIME;
    for (int l = 0; l < c->n_layers && !typed; l++) c->layer_sliding[l] = (l + 1) % pattern != 0;
    if (!g3) return cj_rope_flat(j, c, file, st);
    const cJSON *rp = json_item(j, "rope_parameters"), *rs = json_item(j, "rope_scaling");
    /* transformers 5: rope_parameters per layer type */
    if (rp) {
        const cJSON *full = json_item(rp, "full_attention"), *slide = json_item(rp, "sliding_attention");
        if (!cJSON_IsObject(rp) || (full && !cJSON_IsObject(full)) || (slide && !cJSON_IsObject(slide)))
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope_parameters must map full_attention and sliding_attention to "
                             "objects", file);
        if ((full && json_num(full, "rope_theta", &c->rope_theta, file, st) < 0) ||
            (slide && json_num(slide, "rope_theta", &c->rope_theta_local, file, st) < 0))
            return LLMI_E_RUNTIME;
        const cJSON *stype = slide ? json_item(slide, "rope_type") : NULL;
        if (stype && (!cJSON_IsString(stype) || strcmp(stype->valuestring, "default") != 0))
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope_parameters.sliding_attention must be the default rope", file);
        if (!rs) rs = full;
    }
    return cj_rope_scaling(j, rs, c, file, st);
}

/* The experts (MixtralConfig, Qwen3MoeConfig and their modeling files' routing): a softmax
 * over every expert's router logit, the top num_experts_per_tok, renormalised always
 * (Mixtral) or with norm_topk_prob (Qwen3-MoE, false when absent).  Qwen3-MoE's dense
 * layers (mlp_only_layers, decoder_sparse_step > 1) are refused: no released checkpoint
 * has them. */
static int cj_moe_of(const cJSON *j, const cj_family *f, llmi_config *c, const char *file, llmi_status *st) {
    if (f->moe == CJ_MOE_NONE) return 0;
    const bool mixtral = f->moe == CJ_MOE_MIXTRAL;
    c->n_experts = mixtral ? 8 : 128;
    c->n_experts_used = mixtral ? 2 : 8;
    c->moe_norm_topk = mixtral;
    int step = 1, local = 0, named = 0;
    /* both config classes map num_experts to num_local_experts (attribute_map): the released
     * Qwen3-MoE files say num_experts, transformers 5 writes num_local_experts */
    int has_local = json_int(j, "num_local_experts", 1, CFG_MAX_EXPERTS, &local, file, st);
    int has_named = has_local < 0 ? -1 : json_int(j, "num_experts", 1, CFG_MAX_EXPERTS, &named, file, st);
    if (has_local < 0 || has_named < 0 ||
        json_int(j, "num_experts_per_tok", 1, CFG_MAX_EXPERTS, &c->n_experts_used, file, st) < 0)
        return LLMI_E_RUNTIME;
    if (has_local && has_named && local != named)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: num_local_experts %d and num_experts %d disagree", file, local, named);
    if (has_local || has_named) c->n_experts = has_local ? local : named;
    if (mixtral) return 0;
    c->ffn_dim = 768;
    if (json_int(j, "moe_intermediate_size", 1, INT32_MAX, &c->ffn_dim, file, st) < 0 ||
        json_bool(j, "norm_topk_prob", &c->moe_norm_topk, file, st) < 0 ||
        json_int(j, "decoder_sparse_step", 1, INT32_MAX, &step, file, st) < 0)
        return LLMI_E_RUNTIME;
    const cJSON *dense = json_item(j, "mlp_only_layers");
    if (step != 1 || (dense && (!cJSON_IsArray(dense) || cJSON_GetArraySize(dense) > 0)))
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: dense MLP layers in a MoE model (mlp_only_layers, decoder_sparse_step "
                         "%d) are not supported", file, step);
    return 0;
}

/* SmolLM3Config (transformers' configuration_smollm3.py): no_rope_layers, one 0 (no RoPE)
 * or 1 per layer, else a NoPE layer every no_rope_layer_interval (4) layers, the last of
 * each interval; with use_sliding_window and a sliding_window, the layers of layer_types'
 * "sliding_attention", else the NoPE ones, slide. */
static int cj_smollm3(const cJSON *j, llmi_config *c, const char *file, llmi_status *st) {
    const cJSON *nr = json_item(j, "no_rope_layers");
    if (nr) {
        if (!cJSON_IsArray(nr) || cJSON_GetArraySize(nr) != c->n_layers)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: no_rope_layers must list one 0 or 1 per layer (%d)", file,
                             c->n_layers);
        for (int l = 0; l < c->n_layers; l++) {
            const cJSON *x = cJSON_GetArrayItem(nr, l);
            if (!cJSON_IsNumber(x) || (x->valuedouble != 0 && x->valuedouble != 1))
                return llmi_fail(st, LLMI_E_RUNTIME, "%s: no_rope_layers[%d] must be 0 or 1", file, l);
            c->layer_nope[l] = x->valuedouble == 0;
        }
    } else {
        int every = 4;
        if (json_int(j, "no_rope_layer_interval", 1, INT32_MAX, &every, file, st) < 0) return LLMI_E_RUNTIME;
        config_nope_every(c, every);
    }
    bool use = false;
    c->sliding_window = 0;
    if (json_bool(j, "use_sliding_window", &use, file, st) < 0 ||
        json_int(j, "sliding_window", 1, INT32_MAX, &c->sliding_window, file, st) < 0)
        return LLMI_E_RUNTIME;
    if (!use) c->sliding_window = 0;
    int typed = cj_layer_types(j, c, file, st);
    if (typed < 0) return LLMI_E_RUNTIME;
    for (int l = 0; l < c->n_layers && !typed; l++) c->layer_sliding[l] = c->layer_nope[l];
    return 0;
}

/* GraniteConfig's multipliers (transformers' modeling_granite.py), each 1 when absent: the
 * embeddings times embedding_multiplier, q.k times attention_multiplier (in place of
 * 1/sqrt(head_dim)), each attention and MLP output times residual_multiplier before the
 * residual add, the logits divided by logits_scaling. */
static int cj_granite(const cJSON *j, llmi_config *c, const char *file, llmi_status *st) {
    static const char *const keys[4] = {"embedding_multiplier", "attention_multiplier", "residual_multiplier",
                                        "logits_scaling"};
    float *const dst[4] = {&c->embed_scale, &c->attn_scale, &c->residual_scale, &c->logit_scale};
    for (int i = 0; i < 4; i++) {
        *dst[i] = 1.0f;
        if (json_num(j, keys[i], dst[i], file, st) < 0) return LLMI_E_RUNTIME;
        if (!(*dst[i] > 0)) return llmi_fail(st, LLMI_E_RUNTIME, "%s: %s must be > 0", file, keys[i]);
    }
    return 0;
}

/* Everything after the shapes: norms, positions, biases, activation, RoPE. */
static int cj_rest(const cJSON *j, const cj_family *f, llmi_config *c, const char *file, llmi_status *st) {
    c->norm_eps = f->norm_eps > 0 ? f->norm_eps : CJ_NORM_EPS;
    c->rope_theta = f->rope_theta > 0 ? f->rope_theta : CJ_ROPE_THETA;
    c->max_ctx = f->max_ctx;
    c->tie_embeddings = f->tied;
    if (json_num(j, "rms_norm_eps", &c->norm_eps, file, st) < 0 ||
        json_num(j, "rope_theta", &c->rope_theta, file, st) < 0 ||
        json_int(j, "max_position_embeddings", 1, INT32_MAX, &c->max_ctx, file, st) < 0 ||
        json_bool(j, "tie_word_embeddings", &c->tie_embeddings, file, st) < 0)
        return LLMI_E_RUNTIME;
    if (cj_window_of(j, f, c, file, st) || cj_moe_of(j, f, c, file, st)) return LLMI_E_RUNTIME;
    c->qkv_bias = c->arch == LLMI_ARCH_QWEN2;   /* Qwen2 always; Llama and Qwen3 by attention_bias */
    if (c->arch != LLMI_ARCH_QWEN2 && json_bool(j, "attention_bias", &c->qkv_bias, file, st) < 0) return LLMI_E_RUNTIME;
    c->qk_norm = c->arch == LLMI_ARCH_QWEN3;
    bool mlp_bias = false;
    if (json_bool(j, "mlp_bias", &mlp_bias, file, st) < 0) return LLMI_E_RUNTIME;
    if (mlp_bias) return llmi_fail(st, LLMI_E_RUNTIME, "%s: mlp_bias is not supported", file);
    if (config_is_gemma(c)) return cj_gemma(j, c, file, st);
    const cJSON *hact = json_item(j, "hidden_act");
    if (hact && (!cJSON_IsString(hact) || strcmp(hact->valuestring, "silu") != 0))
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: hidden_act must be silu", file);
    if (c->arch == LLMI_ARCH_PHI3) return cj_phi3(j, c, file, st);
    if (f->nope && cj_smollm3(j, c, file, st)) return LLMI_E_RUNTIME;
    if (f->granite && cj_granite(j, c, file, st)) return LLMI_E_RUNTIME;
    return cj_rope_flat(j, c, file, st);
}

/* ---------------------------------------------------------------- entry */

int config_json_read(const char *path, const char *flag, llmi_config *c, cJSON **root, llmi_status *st) {
    if (root) *root = NULL;
    memset(c, 0, sizeof *c);
    char *buf;
    size_t len;
    fileio_opts fo = {.flag = flag, .max_bytes = CONFIG_JSON_MAX_BYTES};
    if (fileio_read(path, &fo, &buf, &len, st)) return st->code;
    cJSON *j = cJSON_ParseWithLength(buf, len);
    free(buf);
    if (!j) return llmi_fail(st, LLMI_E_RUNTIME, "%s: not valid JSON", path);
    const cj_family *f = NULL;
    int rc = LLMI_E_RUNTIME;
    if (!cJSON_IsObject(j)) {
        llmi_fail(st, LLMI_E_RUNTIME, "%s: not a JSON object", path);
    } else if (!cj_family_of(j, path, &f, st)) {
        c->arch = f->arch;
        snprintf(c->arch_name, sizeof c->arch_name, "%s", f->model_type);
        if (!cj_shapes(j, f, c, path, st) && !cj_rest(j, f, c, path, st)) rc = config_validate(c, path, st);
    }
    if (rc || !root) cJSON_Delete(j);
    else *root = j;
    return rc;
}
