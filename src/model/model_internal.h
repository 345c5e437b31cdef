/* model_internal.h — owns what the format loaders share behind model.h: the table of
 * weight roles, the source-neutral view of a stored tensor, and the binding of every
 * weight into llmi_model (model.c).  Each format (model_gguf.c, model_hf.c) supplies
 * only its tensor names and a lookup.  Nothing outside src/model includes it. */
#ifndef LLMI_MODEL_INTERNAL_H
#define LLMI_MODEL_INTERNAL_H

#include <float.h>
#include <math.h>
#include "model/model.h"
#include "model/gptq_awq.h"

/* YaRN's context: the larger of max_ctx and original context x factor (vLLM's derived
 * maximum length; a Qwen2.5 config keeps max_position_embeddings at the original), at most
 * CFG_MAX_CTX.  For every reader of a YaRN config and for the RoPE flags. */
void config_yarn_context(llmi_config *c);
/* Bounds config_validate puts on a model (a file claiming more is corrupt or hostile). */
#define CFG_MAX_DIM     (1 << 20)
#define CFG_MAX_VOCAB   (1 << 24)
#define CFG_MAX_HEADS   4096
#define CFG_MAX_CTX     (1 << 24)
#define CFG_MAX_EXPERTS 1024

/* Every weight the model reads, named per format by a table of W_COUNT patterns.  A MoE
 * layer's experts come either stacked, one 3-d tensor per matrix (W_*_EXPS: GGUF's
 * ffn_gate_exps, ...), or one tensor per expert (W_*_EXP, patterns with the layer and then
 * the expert as their two %d: Hugging Face's experts.E.gate_proj, ...); NULL where a
 * format has no such name. */
typedef enum {
    W_EMBD, W_OUT_NORM, W_LM_HEAD, W_ATTN_NORM, W_Q, W_K, W_V, W_O, W_BQ, W_BK, W_BV, W_BO,
    W_FFN_NORM, W_GATE, W_UP, W_DOWN, W_Q_NORM, W_K_NORM, W_POST_ATTN_NORM, W_POST_FFN_NORM,
    W_ROUTER, W_GATE_EXPS, W_UP_EXPS, W_DOWN_EXPS, W_GATE_EXP, W_UP_EXP, W_DOWN_EXP,
    W_QKV, W_GATE_UP,   /* Phi-3's fused q/k/v rows and gate/up rows (LLMI_ARCH_PHI3) */
    W_GATE_UP_EXPS,     /* GraniteMoe's experts' gate and up rows, one 3-d tensor (n_exp, 2 ffn, dim) */
    W_COUNT
} weight_role;

/* One stored tensor as either format describes it, shape in HF order (shape[0] slowest). */
typedef struct src_tensor {
    const char *file;          /* the file holding it, for messages */
    bool dtype_ok;             /* maps to an llmi_dtype */
    llmi_dtype dtype;
    const char *type_name;     /* the format's own name for its type */
    int n_dims;
    int64_t shape[4];
    const uint8_t *data;       /* (n_bytes) inside a mapping */
    uint64_t n_bytes;
} src_tensor;

typedef struct weight_src weight_src;
struct weight_src {
    const char *const *names;  /* (W_COUNT) printf patterns with the layer as %d (W_*_EXP: layer, expert) */
    const char *what;          /* the file or directory, for messages */
    const void *ctx;
    /* 1 found (out filled), 0 absent, < 0 error (st filled) */
    int (*find)(const weight_src *w, const char *name, src_tensor *out, llmi_status *st);
    const quant_config *qc;    /* GPTQ/AWQ checkpoint: linears are read by quant_load_linear */
    quant_find_fn find_st;     /* its raw tensor lookup (HF only) */
    float norm_shift;          /* added to every RMSNorm weight read: 1 for a Gemma checkpoint, whose
                                  norms multiply by 1 + w (llama.cpp's converter adds it to its GGUFs) */
};

/* Reads the optional tensor of a role: 1 found, 0 absent (or no name in this format), < 0 error. */
int model_find_role(const weight_src *w, weight_role r, int layer, src_tensor *t, char *name, size_t cap,
                    llmi_status *st);
/* Binds every weight of m (cfg already validated).  permute_qk: the source is a llama-arch
 * GGUF whose Q/K rows (and biases) are in the converter's interleaved order. */
int model_bind_weights(const weight_src *w, llmi_model *m, bool permute_qk, llmi_status *st);
/* Hands a mapping to m (unmapped by model_free); unmaps it when m has no room left. */
int model_add_map(llmi_model *m, void *addr, size_t len, const char *what, llmi_status *st);
/* head_dim where the file gives none: dim / n_heads, which must divide (the message
 * names the file's own keys for the two). */
int model_head_dim(llmi_config *c, const char *what, const char *dim_key, const char *heads_key, llmi_status *st);
/* The last path component of path, for cfg.name. */
void model_set_name(char *dst, size_t cap, const char *path);
/* Checks the tokenizer a loader has just built into m->tok (its result rc and status tst):
 * the error named with what, or a vocabulary larger than the embedding. */
int model_tok_check(const llmi_model *m, int rc, const llmi_status *tst, const char *what, llmi_status *st);

/* Values read as double and stored as float must not overflow the conversion. */
static inline float model_to_f32(double d) {
    if (isnan(d)) return NAN;
    return d > FLT_MAX ? INFINITY : d < -FLT_MAX ? -INFINITY : (float)d;
}

#endif
