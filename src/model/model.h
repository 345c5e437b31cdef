/* model.h — owns llmi_config (the architecture hyper-parameters), llmi_model (the
 * weights of a decoder-only transformer in one backend-neutral layout) and the loaders
 * that fill them from a GGUF file, a Hugging Face directory, or synthetic weights.
 *
 * One loader per format behind the one struct: model_gguf.c, model_hf.c (config.json through
 * config_json.c), model_dummy.c; model.c holds what they share.  Loaders validate everything
 * they read, a model file being untrusted input (the formats: ggml's docs/gguf.md and
 * huggingface/safetensors; our notes on them and their attacks: ../shared/docs/FORMATS.md,
 * outside this repository).  Supported architectures: llama (Llama, Mistral, Mixtral, SmolLM2), qwen2, qwen3
 * (dense and MoE), gemma2, gemma3 (text), phi3 (Phi-3, Phi-4: llama's layers with q/k/v and
 * gate/up stored fused, split at load into views of the fused tensors). */
#ifndef LLMI_MODEL_H
#define LLMI_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "core/status.h"
#include "core/tensor.h"

#define LLMI_MAX_LAYERS 512

typedef enum {
    LLMI_ARCH_LLAMA = 0, LLMI_ARCH_QWEN2, LLMI_ARCH_QWEN3, LLMI_ARCH_GEMMA2, LLMI_ARCH_GEMMA3, LLMI_ARCH_PHI3
} llmi_arch;
/* The MLP's gate activation: SwiGLU (silu(gate) * up) or GeGLU with the tanh approximation of
 * gelu (Gemma's gelu_pytorch_tanh). */
typedef enum { LLMI_ACT_SILU = 0, LLMI_ACT_GELU_TANH } llmi_act;
typedef enum {
    LLMI_ROPE_SCALING_NONE = 0, LLMI_ROPE_SCALING_LLAMA3, LLMI_ROPE_SCALING_LINEAR, LLMI_ROPE_SCALING_YARN,
    LLMI_ROPE_SCALING_LONGROPE
} llmi_rope_scaling_type;
#define LLMI_ROPE_MAX_FACTORS 256   /* longrope's per-pair factors: rope_dim / 2 of them */

typedef struct llmi_config {
    llmi_arch arch;
    char arch_name[32];        /* "llama", "qwen2", "qwen3", "mistral" (as the source named it) */
    char name[128];            /* general.name or the directory name, for reports */
    int n_vocab;
    int dim;                   /* hidden size */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;              /* usually dim / n_heads, but config.json may set it */
    int ffn_dim;               /* intermediate size (of each expert in a MoE model) */
    int max_ctx;               /* max_position_embeddings / context_length */
    float norm_eps;
    float rope_theta;
    int rope_dim;              /* rotated dims per head: head_dim, or fewer (Phi-4-mini's partial RoPE:
                                  the first rope_dim of each head rotate, the rest pass through) */
    llmi_rope_scaling_type rope_scaling;
    float rope_factor;
    float rope_low_freq_factor;
    float rope_high_freq_factor;
    int rope_orig_max_pos;
    /* YaRN (transformers' _compute_yarn_parameters): dimensions between the correction range
     * of beta_fast and beta_slow rotations over rope_orig_max_pos ramp from interpolated
     * (divided by rope_factor) to extrapolated frequencies; cos and sin are multiplied by
     * rope_attn_factor (config_rope_mscale; the YaRN paper's "attention temperature") */
    float rope_yarn_beta_fast, rope_yarn_beta_slow;
    bool rope_yarn_no_truncate;   /* transformers' truncate false: the range's ends not rounded */
    float rope_attn_factor;       /* 0 = 1 (YaRN's and longrope's) */
    /* Phi-3's longrope (transformers' _compute_longrope_parameters): frequency i is divided
     * by rope_short[i] or rope_long[i] (rope_dim / 2 each), long where the context may pass
     * rope_orig_max_pos (rope_long_active, set by model_select_longrope: llama.cpp's choice
     * by the context size; transformers picks per forward by its longest position); cos/sin
     * times rope_attn_factor */
    float rope_short[LLMI_ROPE_MAX_FACTORS], rope_long[LLMI_ROPE_MAX_FACTORS];
    bool rope_long_active;
    bool tie_embeddings;
    bool qkv_bias;
    bool qk_norm;              /* RMSNorm of each q and k head before RoPE (Qwen3, Gemma 3) */
    llmi_act act;
    float embed_scale;         /* the embedding rows are multiplied by this (Gemma: sqrt(dim)); 0 = 1 */
    float attn_scale;          /* q.k scale (Gemma: query_pre_attn_scalar^-1/2); 0 = 1/sqrt(head_dim) */
    /* Gemma 2's tanh soft caps: a scaled q.k score s becomes cap * tanh(s / cap) before the mask
     * and softmax, and so does each final logit; 0 = none */
    float attn_softcap;
    float final_softcap;
    bool post_norms;           /* Gemma 2 and 3: each sub-block's output is RMS-normed before the residual add */
    /* Granite's multipliers (with embed_scale and attn_scale): each sub-block's output times
     * residual_scale before the residual add (after a post-norm, before a control vector),
     * the final logits divided by logit_scale (before a soft cap); 0 = 1 */
    float residual_scale;
    float logit_scale;
    int sliding_window;        /* keys a sliding layer's query attends to, itself included (HF: key > query -
                                  window); 0 = no layer slides */
    float rope_theta_local;    /* RoPE base of the sliding layers, unscaled (Gemma 3); 0 = the global RoPE */
    bool layer_sliding[LLMI_MAX_LAYERS];   /* (n_layers) which layers slide when sliding_window > 0 */
    bool layer_nope[LLMI_MAX_LAYERS];      /* (n_layers) SmolLM3's layers without RoPE (q and k as projected) */
    /* Mixture of experts (Mixtral, Qwen3-MoE): every layer's MLP is n_experts SwiGLU experts of
     * ffn_dim; a token's router logits go through a softmax over all experts, the
     * n_experts_used largest probabilities pick its experts, and its MLP output is their
     * outputs weighted by those probabilities (renormalised to sum 1 when moe_norm_topk). */
    int n_experts;             /* 0 = a dense MLP */
    int n_experts_used;        /* top-k */
    bool moe_norm_topk;        /* Mixtral: always; Qwen3-MoE: norm_topk_prob */
} llmi_config;

/* Layer l's attention window in keys (0 = the whole context). */
static inline int config_layer_window(const llmi_config *c, int l) {
    return c->sliding_window > 0 && c->layer_sliding[l] ? c->sliding_window : 0;
}
/* Whether layer l takes the local RoPE table (backend_rope_inv_freq_local). */
static inline bool config_layer_rope_local(const llmi_config *c, int l) {
    return c->rope_theta_local > 0 && config_layer_window(c, l) > 0;
}
/* The factor a RoPE multiplies cos and sin by, as transformers' rotary embeddings: YaRN's
 * and longrope's attention factor for the scaled RoPE, 1 for the sliding layers' own
 * (local: config_layer_rope_local).  On the rotated dims only, so a partial RoPE's
 * passed-through dims keep their scale (it is not q.k's scale). */
static inline float config_rope_mscale(const llmi_config *c, bool local) {
    return c->rope_attn_factor > 0 && !local ? c->rope_attn_factor : 1.0f;
}
/* SmolLM3's schedule: the last layer of every `every` without RoPE (no_rope_layer_interval). */
static inline void config_nope_every(llmi_config *c, int every) {
    for (int l = 0; l < c->n_layers; l++) c->layer_nope[l] = (l + 1) % every == 0;
}
/* Values of each head layer l rotates: rope_dim, 0 for a layer without RoPE (SmolLM3's NoPE). */
static inline int config_layer_rope_dim(const llmi_config *c, int l) { return c->layer_nope[l] ? 0 : c->rope_dim; }
/* Experts of each layer's MLP (1 for a dense model): the stacking factor of w_gate, w_up, w_down. */
static inline int config_experts(const llmi_config *c) { return c->n_experts > 0 ? c->n_experts : 1; }
static inline float config_embed_scale(const llmi_config *c) { return c->embed_scale > 0 ? c->embed_scale : 1.0f; }
static inline float config_residual_scale(const llmi_config *c) {
    return c->residual_scale > 0 ? c->residual_scale : 1.0f;
}
static inline float config_logit_scale(const llmi_config *c) { return c->logit_scale > 0 ? c->logit_scale : 1.0f; }
/* Gemma 2 or 3: the family whose RMSNorms multiply by 1 + w and whose checkpoints name the
 * MLP's norm pre_feedforward_layernorm. */
static inline bool config_is_gemma(const llmi_config *c) {
    return c->arch == LLMI_ARCH_GEMMA2 || c->arch == LLMI_ARCH_GEMMA3;
}
float config_attn_scale(const llmi_config *c);
/* transformers' get_mscale: YaRN's attention factor for a context scale (0.1 mscale ln(scale)
 * + 1, or 1 for scale <= 1); the default attention factor is config_yarn_mscale(factor, 1). */
double config_yarn_mscale(double scale, double mscale);

typedef struct llmi_layer {
    float *attn_norm;                     /* (dim) */
    llmi_tensor wq;                       /* (n_heads*head_dim, dim) rows in HF order */
    llmi_tensor wk;                       /* (n_kv_heads*head_dim, dim) rows in HF order */
    llmi_tensor wv;                       /* (n_kv_heads*head_dim, dim) */
    llmi_tensor wo;                       /* (dim, n_heads*head_dim) */
    float *bq, *bk, *bv;                  /* (n_heads*head_dim), (kv), (kv); NULL without bias */
    float *bo;                            /* (dim) o_proj bias (HF llama attention_bias) or NULL */
    float *q_norm, *k_norm;               /* (head_dim) each: per-head RMSNorm weights; NULL without qk_norm */
    float *ffn_norm;                      /* (dim) */
    float *post_attn_norm, *post_ffn_norm; /* (dim) each: norms of o_proj's and down_proj's outputs; NULL
                                             without post_norms */
    float *control;                       /* (dim) added to the layer's output (after post_ffn_norm and the
                                             residual add): llama.cpp's control vector (control_vector.h);
                                             NULL where none applies */
    /* A MoE layer stacks its experts' matrices (as GGUF's *_exps tensors do): expert e's gate and
     * up are rows [e * ffn_dim, (e + 1) * ffn_dim), its down rows [e * dim, (e + 1) * dim). */
    llmi_tensor w_gate;                   /* (ffn_dim, dim); MoE: (n_experts * ffn_dim, dim) */
    llmi_tensor w_up;                     /* (ffn_dim, dim); MoE: (n_experts * ffn_dim, dim) */
    llmi_tensor w_down;                   /* (dim, ffn_dim); MoE: (n_experts * dim, ffn_dim) */
    llmi_tensor w_router;                 /* (n_experts, dim) MoE only: the router's logits */
} llmi_layer;

/* from_file: a model file mapped read-only, whose dropped pages fault back in from the
 * file; false for --dummy's anonymous memory, which holds the only copy. */
typedef struct llmi_mapping { void *addr; size_t len; bool from_file; } llmi_mapping;

struct tokenizer;

#define LLMI_MAX_LORA 8
/* A LoRA adapter merged into the weights (lora.h): part of what the weights are, so the
 * prompt cache's fingerprint of the model covers it. */
typedef struct llmi_lora_applied {
    char path[1024];
    float scale;
    int n_linears;                        /* linears it changed */
    bool is_file;                         /* a GGUF adapter file, not a PEFT directory */
} llmi_lora_applied;

typedef struct llmi_model {
    llmi_config cfg;
    llmi_tensor tok_embd;                 /* (n_vocab, dim) */
    llmi_layer *layers;                   /* (n_layers) */
    float *out_norm;                      /* (dim) */
    llmi_tensor lm_head;                  /* (n_vocab, dim); aliases tok_embd data when tied */
    struct tokenizer *tok;                /* NULL for --dummy models */
    char source_path[1024];
    char format[16];                      /* "gguf", "safetensors", "dummy" */
    llmi_mapping maps[64];                /* the weights' mappings (files, or --dummy's memory), unmapped by model_free */
    int n_maps;
    size_t weight_bytes;                  /* bytes of all weight tensors as stored */
    llmi_lora_applied lora[LLMI_MAX_LORA];   /* (n_lora) adapters merged, in order */
    int n_lora;
} llmi_model;

typedef struct llmi_load_opts {
    bool no_tokenizer;                    /* skip the tokenizer (tests of weights only) */
} llmi_load_opts;

/* Loads a GGUF file or a Hugging Face directory (decided by what path is). */
int model_load(const char *path, const llmi_load_opts *opts, llmi_model *m, llmi_status *st);
int model_load_gguf(const char *path, const llmi_load_opts *opts, llmi_model *m, llmi_status *st);
int model_load_hf(const char *dir, const llmi_load_opts *opts, llmi_model *m, llmi_status *st);
void model_free(llmi_model *m);
/* Synthetic weights (like vLLM's dummy load format): spec is a preset name
 * (smollm2-135m, llama-2-7b, llama-3-8b, mistral-7b, qwen2.5-7b) or a config.json path.
 * Deterministic random values, no tokenizer.  dtype LLMI_I4G: the linears as a GPTQ/AWQ
 * checkpoint's int4 grid of group_size columns (0: 128), no act order, embeddings and
 * lm_head bf16; group_size is unused for the other dtypes. */
int model_load_dummy(const char *spec, llmi_dtype dtype, int group_size, llmi_model *m, llmi_status *st);

/* Whether the weights are mapped model files (GGUF, safetensors) rather than memory that
 * holds their only copy (--dummy). */
bool model_weights_from_file(const llmi_model *m);
/* Drops this process's pages of [p, p + len) (whole pages only) where the range lies in a
 * mapped model file: read again, they fault back in from the file (the page cache).  Does
 * nothing elsewhere: dropped anonymous pages (--dummy) would come back as zeros. */
void model_release_pages(const llmi_model *m, const void *p, size_t len);

/* Checks the hyper-parameters for consistency and bounds (called by every loader). */
int config_validate(const llmi_config *c, const char *what, llmi_status *st);

/* llama.cpp's RoPE flags over what the model file says (--rope-scaling, --rope-scale or
 * --rope-freq-scale, --rope-freq-base, --yarn-orig-ctx, --yarn-beta-fast, --yarn-beta-slow);
 * a zero field keeps the file's value. */
typedef struct llmi_rope_override {
    int scaling;               /* -1: the file's type; else LLMI_ROPE_SCALING_NONE, _LINEAR or _YARN */
    float factor;              /* context scale: --rope-scale N, or 1 / --rope-freq-scale */
    float freq_base;
    int orig_ctx;              /* YaRN's original context */
    float beta_fast, beta_slow;
} llmi_rope_override;
/* Applies o to m's config as llama.cpp's context does (llama-context.cpp): the type, when
 * not given, is the file's (linear for a file without scaling); none drops the factor;
 * linear and yarn take the given factor or the file's; yarn's original context, betas and
 * truncation are the given ones, else the file's yarn values, else the training context,
 * 32, 1 and truncated; its attention factor the file's while the factor is, else
 * get_mscale(factor).  Refused for llama3 scaling and Gemma 3's second RoPE; the result is
 * checked as a loaded config is. */
int model_override_rope(llmi_model *m, const llmi_rope_override *o, llmi_status *st);
/* Longrope's factors for a context of n_ctx positions (0: the model's max_ctx): the long
 * ones past the original context, else the short ones, as llama.cpp chooses them.  Nothing
 * for other models.  Before the backend is made (its RoPE tables are built from them). */
void model_select_longrope(llmi_model *m, int n_ctx);

#endif
