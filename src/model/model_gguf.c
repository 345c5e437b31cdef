/* model_gguf.c — the GGUF loader behind model.h: the hyper-parameters from the
 * "<arch>.*" metadata keys (with llama.cpp's defaults and its rope_freqs form of Llama-3
 * scaling) and the weights by their ggml names; the tokenizer is tok_load_gguf's.
 * Everything read from the file is untrusted; errors name the file. */
#include "model/model_internal.h"

#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "tok/tokenizer.h"

static const char *const gguf_names[W_COUNT] = {
    "token_embd.weight", "output_norm.weight", "output.weight", "blk.%d.attn_norm.weight",
    "blk.%d.attn_q.weight", "blk.%d.attn_k.weight", "blk.%d.attn_v.weight", "blk.%d.attn_output.weight",
    "blk.%d.attn_q.bias", "blk.%d.attn_k.bias", "blk.%d.attn_v.bias", "blk.%d.attn_output.bias",
    "blk.%d.ffn_norm.weight", "blk.%d.ffn_gate.weight", "blk.%d.ffn_up.weight", "blk.%d.ffn_down.weight",
    "blk.%d.attn_q_norm.weight", "blk.%d.attn_k_norm.weight", "blk.%d.post_attention_norm.weight",
    "blk.%d.post_ffw_norm.weight", "blk.%d.ffn_gate_inp.weight", "blk.%d.ffn_gate_exps.weight",
    "blk.%d.ffn_up_exps.weight", "blk.%d.ffn_down_exps.weight",
    /* the first Mixtral GGUFs' one tensor per expert, which llama.cpp still reads */
    "blk.%d.ffn_gate.%d.weight", "blk.%d.ffn_up.%d.weight", "blk.%d.ffn_down.%d.weight",
    "blk.%d.attn_qkv.weight", "blk.%d.ffn_up.weight",   /* phi3: the fused q/k/v, and gate/up stacked in ffn_up */
    NULL,   /* llama.cpp's converter splits GraniteMoe's input_linear into ffn_gate_exps and ffn_up_exps */
};

static int gguf_find_src(const weight_src *w, const char *name, src_tensor *out, llmi_status *st) {
    const gguf_file *g = w->ctx;
    const gguf_tensor_info *ti = gguf_find_tensor(g, name);
    if (!ti) return 0;
    out->file = g->path;
    out->type_name = gguf_type_name(ti->type);
    out->dtype_ok = true;
    switch (ti->type) {
    case GGUF_TYPE_F32: out->dtype = LLMI_F32; break;
    case GGUF_TYPE_F16: out->dtype = LLMI_F16; break;
    case GGUF_TYPE_BF16: out->dtype = LLMI_BF16; break;
    case GGUF_TYPE_Q8_0: out->dtype = LLMI_Q8_0; break;
    case GGUF_TYPE_Q4_0: out->dtype = LLMI_Q4_0; break;
    case GGUF_TYPE_Q4_1: out->dtype = LLMI_Q4_1; break;
    case GGUF_TYPE_Q5_0: out->dtype = LLMI_Q5_0; break;
    case GGUF_TYPE_Q5_1: out->dtype = LLMI_Q5_1; break;
    case GGUF_TYPE_Q4_K: out->dtype = LLMI_Q4_K; break;
    case GGUF_TYPE_Q5_K: out->dtype = LLMI_Q5_K; break;
    case GGUF_TYPE_Q6_K: out->dtype = LLMI_Q6_K; break;
    case GGUF_TYPE_Q2_K: out->dtype = LLMI_Q2_K; break;
    case GGUF_TYPE_Q3_K: out->dtype = LLMI_Q3_K; break;
    case GGUF_TYPE_IQ4_NL: out->dtype = LLMI_IQ4_NL; break;
    case GGUF_TYPE_IQ4_XS: out->dtype = LLMI_IQ4_XS; break;
    default: out->dtype_ok = false; break;
    }
    /* trailing unit dims carry no shape; GGUF lists dims fastest first, HF slowest first */
    int nd = (int)ti->n_dims;
    while (nd > 1 && ti->dims[nd - 1] == 1) nd--;
    out->n_dims = nd;
    for (int d = 0; d < nd; d++) out->shape[d] = ti->dims[nd - 1 - d];
    out->data = ti->data;
    out->n_bytes = ti->n_bytes;
    (void)st;
    return 1;
}

/* gguf_get_* wrappers with the architecture prefix: 1 set, 0 absent, < 0 error. */
/* The result rc of a gguf_get_* for key, with a missing required key an error. */
static int arch_found(const gguf_file *g, const char *key, int rc, bool required, llmi_status *st) {
    if (rc == 0 && required) {
        llmi_fail(st, LLMI_E_RUNTIME, "%s: missing metadata key %s", g->path, key);
        return -LLMI_E_RUNTIME;
    }
    return rc;
}

static int arch_int(const gguf_file *g, const char *arch, const char *suffix, bool required, int64_t lo, int64_t hi,
                    int *out, llmi_status *st) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v;
    int rc = arch_found(g, key, gguf_get_int(g, key, lo, hi, &v, st), required, st);
    if (rc > 0) *out = (int)v;
    return rc;
}

static int arch_float(const gguf_file *g, const char *arch, const char *suffix, bool required, float *out,
                      llmi_status *st) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    double v;
    int rc = arch_found(g, key, gguf_get_float(g, key, &v, st), required, st);
    if (rc > 0) *out = model_to_f32(v);
    return rc;
}

/* YaRN as llama.cpp's converter writes it from transformers' rope_scaling (conversion/base.py):
 * rope.scaling.factor, .original_context_length (absent: the training context, as llama.cpp),
 * .yarn_beta_fast / .yarn_beta_slow (32 and 1), .yarn_attn_factor (transformers'
 * attention_factor; absent: get_mscale(factor)).  The file's attention factor is taken as
 * transformers meant it (llama.cpp 0c1e570 recomputes it from the factor); a DeepSeek-style
 * yarn_log_multiplier and a yarn_ext_factor other than 1 are refused. */
static int gguf_yarn(const gguf_file *g, const char *arch, const char *path, llmi_config *c, llmi_status *st) {
    float ext = 1, log_mul = 0, af = 0;
    c->rope_scaling = LLMI_ROPE_SCALING_YARN;
    c->rope_factor = 0;
    c->rope_yarn_beta_fast = 32, c->rope_yarn_beta_slow = 1;
    if (c->rope_orig_max_pos <= 0) c->rope_orig_max_pos = c->max_ctx;
    if (arch_float(g, arch, "rope.scaling.factor", true, &c->rope_factor, st) < 0 ||
        arch_float(g, arch, "rope.scaling.yarn_beta_fast", false, &c->rope_yarn_beta_fast, st) < 0 ||
        arch_float(g, arch, "rope.scaling.yarn_beta_slow", false, &c->rope_yarn_beta_slow, st) < 0 ||
        arch_float(g, arch, "rope.scaling.yarn_attn_factor", false, &af, st) < 0 ||
        arch_float(g, arch, "rope.scaling.yarn_ext_factor", false, &ext, st) < 0 ||
        arch_float(g, arch, "rope.scaling.yarn_log_multiplier", false, &log_mul, st) < 0)
        return LLMI_E_RUNTIME;
    if (log_mul != 0 || ext != 1)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: yarn with %s is not supported", path,
                         log_mul != 0 ? "a yarn_log_multiplier (DeepSeek's mscale)" : "a yarn_ext_factor other than 1");
    c->rope_attn_factor = af != 0 ? af : (float)config_yarn_mscale(c->rope_factor, 1);
    config_yarn_context(c);
    return 0;
}

/* Llama-3 GGUFs carry their rope scaling as rope_freqs.weight (per-frequency divisors)
 * instead of keys.  We recognise the llama3 pattern with the parameters every Llama 3.x
 * release uses and reject anything else rather than run with wrong positions. */
static int gguf_rope_freqs(const gguf_file *g, llmi_config *c, llmi_status *st) {
    const gguf_tensor_info *ti = gguf_find_tensor(g, "rope_freqs.weight");
    if (!ti) return 0;
    int64_t half = c->rope_dim / 2;
    if (ti->type != GGUF_TYPE_F32 || ti->n_elements != half)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope_freqs.weight must be %lld F32 values", g->path, (long long)half);
    float mx = 0;
    bool all_one = true;
    for (int64_t i = 0; i < half; i++) {
        float f;
        memcpy(&f, ti->data + 4 * i, 4);
        if (!(f > 0) || !isfinite(f))
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope_freqs.weight[%lld] = %g is not a positive factor", g->path,
                             (long long)i, (double)f);
        if (f != 1.0f) all_one = false;
        if (f > mx) mx = f;
    }
    if (all_one) return 0;
    if (c->rope_scaling != LLMI_ROPE_SCALING_NONE)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope_freqs.weight together with linear rope scaling is not supported",
                         g->path);
    llmi_config t = *c;
    t.rope_scaling = LLMI_ROPE_SCALING_LLAMA3;
    t.rope_factor = mx;
    t.rope_low_freq_factor = 1.0f;
    t.rope_high_freq_factor = 4.0f;
    if (t.rope_orig_max_pos <= 0) t.rope_orig_max_pos = 8192;
    double lo_wl = t.rope_orig_max_pos / t.rope_low_freq_factor, hi_wl = t.rope_orig_max_pos / t.rope_high_freq_factor;
    for (int64_t i = 0; i < half; i++) {
        double freq = pow(t.rope_theta, -(double)(2 * i) / c->head_dim), wl = 2 * M_PI / freq, want;
        if (wl < hi_wl) want = 1;
        else if (wl > lo_wl) want = t.rope_factor;
        else {
            double smooth = (t.rope_orig_max_pos / wl - t.rope_low_freq_factor) /
                            (t.rope_high_freq_factor - t.rope_low_freq_factor);
            want = 1 / ((1 - smooth) / t.rope_factor + smooth);
        }
        float f;
        memcpy(&f, ti->data + 4 * i, 4);
        if (fabs(f - want) > 1e-3 * want)
            return llmi_fail(st, LLMI_E_RUNTIME,
                             "%s: rope_freqs.weight does not match llama3 scaling (factor %g, low 1, high 4, original "
                             "context %d); not supported", g->path, (double)t.rope_factor, t.rope_orig_max_pos);
    }
    *c = t;
    return 0;
}

/* Gemma 2 and 3 as llama.cpp reads them (src/models/gemma2.cpp, gemma3.cpp): GeGLU,
 * sqrt(dim) embedding scale, sandwich norms (their 1 + w already in the file), the final
 * logits soft-capped by final_logit_softcapping (Gemma 2: 30 when absent; Gemma 3: none),
 * and the layers sliding in the pattern attention.sliding_window_pattern (a period, 2 or 6
 * when absent: every 2nd or 6th layer global; or one bool per layer) over the last
 * attention.sliding_window keys (Gemma 2: 4096 when absent; Gemma 3: no window), with RoPE
 * base rope.freq_base_swa (Gemma 2: rope.freq_base when absent; Gemma 3: 10000), unscaled.
 * Gemma 2 only: the q.k scores soft-capped by attn_logit_softcapping (50 when absent).  The
 * attention scale is 1/sqrt(head_dim) except for the 27B models (Gemma 2's 46 layers, Gemma
 * 3's 62), whose query_pre_attn_scalar is dim / n_heads. */
static int gguf_gemma(const gguf_file *g, const char *arch, llmi_config *c, llmi_status *st) {
    const int64_t I = INT32_MAX;
    const bool g3 = c->arch == LLMI_ARCH_GEMMA3;
    c->act = LLMI_ACT_GELU_TANH;
    c->embed_scale = sqrtf((float)c->dim);
    c->post_norms = true;
    const bool is_27b = c->n_layers == (g3 ? 62 : 46);
    c->attn_scale = is_27b ? 1.0f / sqrtf((float)(c->dim / c->n_heads)) : 1.0f / sqrtf((float)c->head_dim);
    c->final_softcap = g3 ? 0.0f : 30.0f;
    c->attn_softcap = g3 ? 0.0f : 50.0f;
    if (arch_float(g, arch, "final_logit_softcapping", false, &c->final_softcap, st) < 0 ||
        (!g3 && arch_float(g, arch, "attn_logit_softcapping", false, &c->attn_softcap, st) < 0))
        return LLMI_E_RUNTIME;
    int window = g3 ? 0 : 4096;
    if (arch_int(g, arch, "attention.sliding_window", false, 0, I, &window, st) < 0) return LLMI_E_RUNTIME;
    if (window == 0) return 0;
    c->sliding_window = window;
    c->rope_theta_local = g3 ? 10000.0f : 0.0f;
    if (arch_float(g, arch, "rope.freq_base_swa", false, &c->rope_theta_local, st) < 0) return LLMI_E_RUNTIME;
    char key[64];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", arch);
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (kv && kv->type == GGUF_ARRAY)   /* one flag per layer */
        return gguf_get_bool_array(g, key, c->layer_sliding, (uint64_t)c->n_layers, st) < 0 ? LLMI_E_RUNTIME : 0;
    int period = g3 ? 6 : 2;
    if (arch_int(g, arch, "attention.sliding_window_pattern", false, 0, I, &period, st) < 0) return LLMI_E_RUNTIME;
    for (int l = 0; l < c->n_layers; l++) c->layer_sliding[l] = period == 0 || l % period < period - 1;
    return 0;
}

/* Mixture of experts as llama.cpp runs it for llama (Mixtral) and qwen3moe: expert_count
 * experts, expert_used_count per token, softmax gating with the chosen weights
 * renormalised (build_moe_ffn's norm_w; a file's expert_weights_norm false says otherwise),
 * qwen3moe's expert size in expert_feed_forward_length.  Sigmoid gating and shared experts
 * (other architectures' keys) are refused. */
static int gguf_moe(const gguf_file *g, const char *arch, llmi_config *c, llmi_status *st) {
    const int64_t I = INT32_MAX;
    int rc = arch_int(g, arch, "expert_count", false, 0, I, &c->n_experts, st);
    if (rc < 0) return LLMI_E_RUNTIME;
    if (c->n_experts == 0) return 0;
    if (config_is_gemma(c) || c->arch == LLMI_ARCH_QWEN2)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: %s.expert_count: mixture of experts is supported for llama and "
                         "qwen3moe only", g->path, arch);
    if (arch_int(g, arch, "expert_used_count", true, 1, I, &c->n_experts_used, st) < 0 ||
        arch_int(g, arch, "expert_feed_forward_length", false, 1, I, &c->ffn_dim, st) < 0)
        return LLMI_E_RUNTIME;
    int shared = 0, gating = 1;
    if (arch_int(g, arch, "expert_shared_count", false, 0, I, &shared, st) < 0 ||
        arch_int(g, arch, "expert_gating_func", false, 0, I, &gating, st) < 0)
        return LLMI_E_RUNTIME;
    if (shared > 0) return llmi_fail(st, LLMI_E_RUNTIME, "%s: %s.expert_shared_count %d: shared experts are not supported",
                                     g->path, arch, shared);
    if (gating != 1)   /* llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX */
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: %s.expert_gating_func %d: only softmax gating (1) is supported", g->path,
                         arch, gating);
    char key[128];
    snprintf(key, sizeof key, "%s.expert_weights_norm", arch);
    c->moe_norm_topk = true;
    return gguf_get_bool(g, key, &c->moe_norm_topk, st) < 0 ? LLMI_E_RUNTIME : 0;
}

/* Phi-3's longrope as llama.cpp's converter writes it: rope_factors_short.weight and
 * rope_factors_long.weight (rope.dimension_count / 2 F32 each), rope.scaling.original_context_length,
 * and rope.scaling.attn_factor (when absent: sqrt(1 + ln(s) / ln(original)) with s the
 * context over the original, the converter's formula). */
static int gguf_longrope(const gguf_file *g, const char *arch, llmi_config *c, llmi_status *st) {
    const gguf_tensor_info *lf = gguf_find_tensor(g, "rope_factors_long.weight");
    const gguf_tensor_info *sf = gguf_find_tensor(g, "rope_factors_short.weight");
    if (!lf && !sf) return 0;
    if (c->arch != LLMI_ARCH_PHI3)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope_factors_long/short (longrope) are read for phi3 only", g->path);
    const int64_t half = c->rope_dim / 2;
    if (!lf || !sf || lf->type != GGUF_TYPE_F32 || sf->type != GGUF_TYPE_F32 || lf->n_elements != half ||
        sf->n_elements != half || half > LLMI_ROPE_MAX_FACTORS)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope_factors_long.weight and rope_factors_short.weight must both be "
                         "%lld F32 values", g->path, (long long)half);
    if (c->rope_scaling != LLMI_ROPE_SCALING_NONE)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: longrope factors together with other rope scaling are not supported",
                         g->path);
    if (c->rope_orig_max_pos <= 0)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: longrope factors need %s.rope.scaling.original_context_length",
                         g->path, arch);
    memcpy(c->rope_long, lf->data, (size_t)half * sizeof(float));
    memcpy(c->rope_short, sf->data, (size_t)half * sizeof(float));
    const double s = (double)c->max_ctx / c->rope_orig_max_pos;
    c->rope_attn_factor = s <= 1 ? 1.0f : (float)sqrt(1 + log(s) / log((double)c->rope_orig_max_pos));
    if (arch_float(g, arch, "rope.scaling.attn_factor", false, &c->rope_attn_factor, st) < 0) return LLMI_E_RUNTIME;
    c->rope_scaling = LLMI_ROPE_SCALING_LONGROPE;
    c->rope_factor = (float)s;
    c->rope_long_active = false;
    return 0;
}

/* granite and granitemoe (arch): the multipliers as llama.cpp's converter names them
 * (GraniteModel: attention_multiplier -> attention.scale, embedding_multiplier ->
 * embedding_scale, residual_multiplier -> residual_scale, logits_scaling -> logit_scale),
 * read as src/models/granite.cpp does: the logit scale required, the others optional with 0
 * for none (q.k then 1/sqrt(head_dim)); a file that switches RoPE off
 * (rope.scaling.finetuned false) and GraniteMoeShared's shared expert
 * (expert_shared_feed_forward_length) are refused. */
static int gguf_granite(const gguf_file *g, const char *arch, llmi_config *c, llmi_status *st) {
    int shared = 0;
    if (arch_float(g, arch, "logit_scale", true, &c->logit_scale, st) < 0 ||
        arch_float(g, arch, "embedding_scale", false, &c->embed_scale, st) < 0 ||
        arch_float(g, arch, "residual_scale", false, &c->residual_scale, st) < 0 ||
        arch_float(g, arch, "attention.scale", false, &c->attn_scale, st) < 0 ||
        arch_int(g, arch, "expert_shared_feed_forward_length", false, 0, INT32_MAX, &shared, st) < 0)
        return LLMI_E_RUNTIME;
    if (!(c->logit_scale > 0))
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: %s.logit_scale %g must be > 0", g->path, arch, (double)c->logit_scale);
    if (shared > 0)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: %s.expert_shared_feed_forward_length %d: GraniteMoeShared's shared "
                         "expert is not supported", g->path, arch, shared);
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.finetuned", arch);
    bool rope = true;
    if (gguf_get_bool(g, key, &rope, st) < 0) return LLMI_E_RUNTIME;
    if (!rope)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: %s without RoPE (rope.scaling.finetuned false) is not supported",
                         g->path, arch);
    return 0;
}

/* The general.architecture values llmi reads, each as its family (the prefix of its keys is the
 * name itself); smollm3 and granite(moe) with llama's tensors and their own additions. */
static const struct {
    const char *name;
    llmi_arch arch;
    bool granite;   /* gguf_granite's scales */
} k_gguf_archs[] = {
    {"llama", LLMI_ARCH_LLAMA, false},     {"smollm3", LLMI_ARCH_LLAMA, false}, {"granite", LLMI_ARCH_LLAMA, true},
    {"granitemoe", LLMI_ARCH_LLAMA, true}, {"qwen2", LLMI_ARCH_QWEN2, false},   {"qwen3", LLMI_ARCH_QWEN3, false},
    {"qwen3moe", LLMI_ARCH_QWEN3, false},  {"gemma2", LLMI_ARCH_GEMMA2, false}, {"gemma3", LLMI_ARCH_GEMMA3, false},
    {"phi3", LLMI_ARCH_PHI3, false},
};
#define N_GGUF_ARCHS ((int)(sizeof k_gguf_archs / sizeof k_gguf_archs[0]))

static int gguf_config(const gguf_file *g, llmi_config *c, bool *has_output, llmi_status *st) {
    const char *path = g->path;
    gguf_str a;
    int rc = gguf_get_str(g, "general.architecture", &a, st);
    if (rc < 0) return LLMI_E_RUNTIME;
    if (rc == 0) return llmi_fail(st, LLMI_E_RUNTIME, "%s: missing metadata key general.architecture", path);
    int fam = 0;
    while (fam < N_GGUF_ARCHS && !gguf_str_eq(a, k_gguf_archs[fam].name)) fam++;
    if (fam == N_GGUF_ARCHS) {
        char b[40];
        size_t n = 0;
        for (uint64_t i = 0; i < a.len && n < sizeof b - 1; i++)
            b[n++] = (a.p[i] >= 0x20 && a.p[i] < 0x7f) ? a.p[i] : '?';
        b[n] = '\0';
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: unsupported architecture %s (supported: llama, smollm3, granite, granitemoe, "
                         "qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3)", path, b);
    }
    c->arch = k_gguf_archs[fam].arch;
    const char *arch = k_gguf_archs[fam].name;
    snprintf(c->arch_name, sizeof c->arch_name, "%s", arch);
    gguf_str nm;
    rc = gguf_get_str(g, "general.name", &nm, st);
    if (rc < 0) return LLMI_E_RUNTIME;
    if (rc > 0) {
        size_t n = 0;
        for (uint64_t i = 0; i < nm.len && n < sizeof c->name - 1; i++)
            c->name[n++] = ((unsigned char)nm.p[i] >= 0x20 && nm.p[i] != 0x7f) ? nm.p[i] : '?';
        c->name[n] = '\0';
    } else {
        model_set_name(c->name, sizeof c->name, path);
    }
    const int64_t I = INT32_MAX;
    if (arch_int(g, arch, "embedding_length", true, 1, I, &c->dim, st) < 0 ||
        arch_int(g, arch, "block_count", true, 1, I, &c->n_layers, st) < 0 ||
        arch_int(g, arch, "feed_forward_length", true, 1, I, &c->ffn_dim, st) < 0 ||
        arch_int(g, arch, "attention.head_count", true, 1, I, &c->n_heads, st) < 0 ||
        arch_int(g, arch, "context_length", true, 1, I, &c->max_ctx, st) < 0 ||
        arch_float(g, arch, "attention.layer_norm_rms_epsilon", true, &c->norm_eps, st) < 0)
        return LLMI_E_RUNTIME;
    c->n_kv_heads = c->n_heads;
    if (arch_int(g, arch, "attention.head_count_kv", false, 1, I, &c->n_kv_heads, st) < 0) return LLMI_E_RUNTIME;
    if (c->n_layers > LLMI_MAX_LAYERS)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: %s.block_count %d exceeds the limit of %d layers", path, arch,
                         c->n_layers, LLMI_MAX_LAYERS);
    rc = arch_int(g, arch, "attention.key_length", false, 1, I, &c->head_dim, st);
    if (rc < 0 || (rc == 0 && model_head_dim(c, path, "embedding_length", "head_count", st))) return LLMI_E_RUNTIME;
    int vlen = c->head_dim;
    if (arch_int(g, arch, "attention.value_length", false, 1, I, &vlen, st) < 0) return LLMI_E_RUNTIME;
    if (vlen != c->head_dim)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: %s.attention.value_length %d differs from key_length %d", path, arch,
                         vlen, c->head_dim);
    c->rope_dim = c->head_dim;
    if (arch_int(g, arch, "rope.dimension_count", false, 1, I, &c->rope_dim, st) < 0) return LLMI_E_RUNTIME;
    c->rope_theta = 10000.0f;
    if (arch_float(g, arch, "rope.freq_base", false, &c->rope_theta, st) < 0) return LLMI_E_RUNTIME;

    /* rope scaling: linear and yarn are expressible; longrope is not */
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    gguf_str stype;
    rc = gguf_get_str(g, key, &stype, st);
    if (rc < 0) return LLMI_E_RUNTIME;
    if (arch_int(g, arch, "rope.scaling.original_context_length", false, 1, I, &c->rope_orig_max_pos, st) < 0)
        return LLMI_E_RUNTIME;
    /* llama.cpp's reading: the type defaults to linear, which only matters with a factor */
    if (rc > 0 && gguf_str_eq(stype, "yarn")) {
        if (gguf_yarn(g, arch, path, c, st)) return LLMI_E_RUNTIME;
    } else if (rc > 0 && !gguf_str_eq(stype, "none") && !gguf_str_eq(stype, "linear")) {
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope scaling type %.*s is not supported", path,
                         (int)(stype.len > 32 ? 32 : stype.len), stype.p);
    }
    if (rc == 0 || gguf_str_eq(stype, "linear")) {
        float f = 0;
        int frc = arch_float(g, arch, "rope.scaling.factor", false, &f, st);
        if (frc == 0) frc = arch_float(g, arch, "rope.scale_linear", false, &f, st);
        if (frc < 0) return LLMI_E_RUNTIME;
        if (frc > 0 && f != 0 && f != 1) {
            c->rope_scaling = LLMI_ROPE_SCALING_LINEAR;
            c->rope_factor = f;
        }
    }

    /* vocab: the key, else the embedding's rows; checked against the tensor later */
    const gguf_tensor_info *emb = gguf_find_tensor(g, "token_embd.weight");
    rc = arch_int(g, arch, "vocab_size", false, 1, I, &c->n_vocab, st);
    if (rc < 0) return LLMI_E_RUNTIME;
    if (rc == 0) {
        if (emb && emb->n_dims == 2 && emb->dims[1] <= INT32_MAX) c->n_vocab = (int)emb->dims[1];
        else {
            const gguf_kv *kv = gguf_find_kv(g, "tokenizer.ggml.tokens");
            if (kv && kv->type == GGUF_ARRAY && kv->n <= CFG_MAX_VOCAB) c->n_vocab = (int)kv->n;
        }
    }
    c->qkv_bias = c->arch == LLMI_ARCH_QWEN2 || gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
    c->qk_norm = c->arch == LLMI_ARCH_QWEN3 || c->arch == LLMI_ARCH_GEMMA3;
    if (config_is_gemma(c) && gguf_gemma(g, arch, c, st)) return LLMI_E_RUNTIME;
    /* phi3: attention.sliding_window is read by nobody (llama.cpp runs Phi without a
     * window: src/models/phi3.cpp), so neither does llmi */
    if (gguf_longrope(g, arch, c, st)) return LLMI_E_RUNTIME;
    if (gguf_moe(g, arch, c, st)) return LLMI_E_RUNTIME;
    /* smollm3: llama.cpp's every 4th layer without RoPE (src/models/smollm3.cpp's fixed
     * n_no_rope_layer_step; the file has no key for it) */
    if (strcmp(arch, "smollm3") == 0) config_nope_every(c, 4);
    if (k_gguf_archs[fam].granite && gguf_granite(g, arch, c, st)) return LLMI_E_RUNTIME;
    *has_output = gguf_find_tensor(g, "output.weight") != NULL;
    c->tie_embeddings = !*has_output;
    if (config_validate(c, path, st)) return LLMI_E_RUNTIME;
    if (gguf_rope_freqs(g, c, st)) return LLMI_E_RUNTIME;
    return config_validate(c, path, st);
}

int model_load_gguf(const char *path, const llmi_load_opts *opts, llmi_model *m, llmi_status *st) {
    memset(m, 0, sizeof *m);
    gguf_file g;
    if (gguf_open(path, &g, st)) return LLMI_E_RUNTIME;
    bool has_output = false;
    weight_src w = {gguf_names, path, &g, gguf_find_src, NULL, NULL, 0.0f};   /* the converter added Gemma's 1 */
    if (gguf_config(&g, &m->cfg, &has_output, st) ||
        model_bind_weights(&w, m, m->cfg.arch == LLMI_ARCH_LLAMA, st))
        goto fail;
    snprintf(m->source_path, sizeof m->source_path, "%s", path);
    snprintf(m->format, sizeof m->format, "gguf");
    void *addr;
    size_t len;
    gguf_take_map(&g, &addr, &len);
    if (model_add_map(m, addr, len, path, st)) goto fail;
    if (!(opts && opts->no_tokenizer)) {
        llmi_status tst = {0};
        if (model_tok_check(m, tok_load_gguf(&g, &m->tok, &tst), &tst, path, st)) goto fail;
    }
    gguf_close(&g);
    return 0;
fail:
    model_free(m);
    gguf_close(&g);
    return LLMI_E_RUNTIME;
}
