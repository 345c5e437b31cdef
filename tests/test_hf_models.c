/* test_hf_models.c — end-to-end acceptance against Hugging Face transformers: the tiny
 * random-weight checkpoints in testdata/hf (GQA + llama3 rope scaling, q/k/v bias + tied
 * embeddings in bf16, sharded f16 mistral, explicit head_dim, llama attention_bias, qwen3's
 * q/k norm, YaRN; qwen3 also as a GGUF from llama.cpp's converter) are loaded
 * by model_load and run by the CPU backend; the logits must match transformers' fp32
 * logits (testdata/hf/ref, written by scripts/make-hf-test-models.py) to fp32 tolerance,
 * and the tokenizer loaded from the same directory must encode like HF tokenizers. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "backend/backend.h"
#include "model/model.h"
#include "test.h"
#include "tok/tokenizer.h"

#define HF_BLOCK 16       /* KV block size in tokens */
#define HF_MAX_TOKENS 256 /* longest reference sequence is 130 */
#define HF_MAX_SEQS 3

static const char *const hf_models[] = {"llama-gqa-rope3", "qwen2-bias-tied", "mistral-sharded", "llama-headdim",
                                        "llama-attn-bias", "qwen3-qknorm"};
/* Gemma 3 (text): 6 layers, sliding windows of 8 keys on layers 0-4 with their own RoPE base,
 * bf16 (and as llama.cpp's converter writes it); and 2 layers in transformers 5's config form
 * with query_pre_attn_scalar != head_dim and linear rope scaling on the global layer, f32.
 * Their tokenizer is Gemma's kind (SentencePiece-style BPE, no space prefix). */
static const char *const hf_gemma[] = {"gemma3-swa", "gemma3-scaled"};
#define HF_GEMMA3_GGUF "gemma3-swa.bf16.gguf"
/* Gemma 2 (scripts/make-gemma2-test-models.py): 4 layers alternating sliding (6 keys) and
 * global, soft caps 0.75 on the scores and 2.5 on the logits (bending most of them), f32,
 * transformers 5's config form (and as llama.cpp's converter writes it); and 3 layers in the
 * released config form with no soft-cap keys (the defaults 50 and 30),
 * query_pre_attn_scalar != head_dim, bf16. */
static const char *const hf_gemma2[] = {"gemma2-capped", "gemma2-classic"};
#define HF_GEMMA2_GGUF "gemma2-capped.f32.gguf"
/* Phi-3 (q/k/v in one qkv_proj, gate/up in one gate_up_proj): f32 without a window (and as
 * llama.cpp's converter writes it: attn_qkv, ffn_up of both halves), and bf16 in the
 * released mini-4k form with a sliding window of 8 keys on every layer. */
static const char *const hf_phi3[] = {"phi3-fused", "phi3-swa"};
#define HF_PHI3_GGUF "phi3-fused.f32.gguf"
/* Phi-3.5's longrope on an original context of 64: transformers took the short factors for
 * the 7- and 33-token sequences and the long ones for the 130-token one; llmi takes them by
 * the context, so the first two run with a context of 64 and the last with 256. */
#define HF_LONGROPE "phi3-longrope"
#define HF_LONGROPE_GGUF "phi3-longrope.f32.gguf"
/* Phi-4-mini's partial RoPE (the first 24 of each head's 32 values rotated) with longrope
 * as phi3-longrope's, tied embeddings, the released config form; and its GGUF by llama.cpp's
 * converter (rope.dimension_count 24, 12 factors each). */
/* SmolLM3: 4 layers, the last without RoPE, tied embeddings, f32; and as llama.cpp's
 * converter writes it (arch smollm3, q/k permuted as llama's, every 4th layer NoPE). */
#define HF_NOPE "smollm3-nope"
#define HF_NOPE_GGUF "smollm3-nope.f32.gguf"
/* Granite 3: the four multipliers (embeddings x12, q.k x0.125, residual x0.22, logits /8),
 * q/k/v and o_proj biases, tied, bf16; and as llama.cpp's converter writes it (arch granite,
 * embedding_scale, attention.scale, residual_scale, logit_scale; q/k permuted as llama's). */
#define HF_GRANITE "granite-mult"
#define HF_GRANITE_GGUF "granite-mult.f32.gguf"
/* GraniteMoe: Granite's multipliers and Mixtral's routing (4 experts, top-2), every expert's
 * gate|up in one input_linear; and as llama.cpp's converter writes it (arch granitemoe, the
 * gate and up halves split into ffn_gate_exps and ffn_up_exps). */
#define HF_GRANITEMOE "granitemoe-tiny"
#define HF_GRANITEMOE_GGUF "granitemoe-tiny.f32.gguf"
#define HF_PARTIAL "phi4mini-partial"
#define HF_PARTIAL_GGUF "phi4mini-partial.f32.gguf"
static void hf_check_model_seqs(test_ctx *t_, const char *name, const char *file, bool cuda, bool int8_act, int n_ctx,
                                int s_lo, int s_hi);
static void hf_check_longrope(test_ctx *t_, const char *name, const char *file, bool cuda) {
    hf_check_model_seqs(t_, name, file, cuda, false, 64, 0, 2);
    hf_check_model_seqs(t_, name, file, cuda, false, 256, 2, 3);
}
/* Mixtures of experts (scripts/make-moe-test-models.py): Qwen3-MoE with 8 experts, 2 per
 * token, renormalised, in the released config form, bf16; Qwen3-MoE with 6 experts, 3 per
 * token, not renormalised (norm_topk_prob false), in transformers 5's form
 * (num_local_experts), f32; Mixtral with 4 experts, 2 per token, f32.  Their routers are
 * drawn so that no reference token is near a tie between its k-th and (k+1)-th expert. */
static const char *const hf_moe[] = {"qwen3moe-tiny", "qwen3moe-nonorm", "mixtral-tiny"};
/* the first and the last as llama.cpp's converter writes them (stacked experts, F32 routers) */
static const char *const hf_moe_gguf[] = {"qwen3moe-tiny.bf16.gguf", "mixtral-tiny.f32.gguf"};
/* YaRN rope scaling (130-token sequences on an original context of 32 and 24): Qwen2.5's
 * config form with the defaults, and llama with every parameter set in transformers 5's
 * rope_parameters (betas 16 and 2, attention_factor 1.25, truncate false), f32. */
static const char *const hf_yarn[] = {"qwen2-yarn", "llama-yarn-params"};
/* qwen2-yarn as llama.cpp's converter writes it (f32; rope.scaling.type "yarn", factor,
 * original_context_length). */
#define HF_YARN_GGUF "qwen2-yarn.f32.gguf"
/* qwen3-qknorm as llama.cpp's convert_hf_to_gguf.py writes it (bf16, the same values). */
#define HF_QWEN3_GGUF "qwen3-qknorm.bf16.gguf"
/* llama-quantize's k-quant mixes of a tiny Qwen3 (hidden 256), whose references are
 * transformers' logits from those files (scripts/make-kquant-models.py). */
static const char *const hf_kquant[] = {"qwen3-kq.Q4_K_M", "qwen3-kq.Q5_K_M", "qwen3-kq.Q3_K_M", "qwen3-kq.IQ4_XS",
                                        "qwen3-kq.IQ4_NL", "qwen3-kq.Q2_K"};
typedef struct hf_seq {
    int n_tokens;
    int32_t ids[HF_MAX_TOKENS];   /* (n_tokens) */
    float *logits;                /* (n_tokens, n_vocab) transformers' fp32 logits */
} hf_seq;

typedef struct hf_ref {
    int n_vocab;
    int n_seqs;
    hf_seq seqs[HF_MAX_SEQS];
} hf_ref;

static const char *hf_testdata(void) {
    const char *d = getenv("TESTDATA");
    return d && *d ? d : "testdata";
}

/* Reads a whole file; *len bytes, NUL-terminated. */
static char *hf_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) != NULL) {
        if (fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
        else { buf[n] = '\0'; if (len) *len = (size_t)n; }
    }
    fclose(f);
    return buf;
}

static void hf_ref_free(hf_ref *r) {
    for (int s = 0; s < r->n_seqs; s++) free(r->seqs[s].logits);
    r->n_seqs = 0;
}

/* Loads ref/<name>.json and its .f32 logits files; returns 0 or -1 with a message. */
static int hf_ref_load(const char *name, hf_ref *r, char *err, size_t errcap) {
    memset(r, 0, sizeof *r);
    char path[512];
    snprintf(path, sizeof path, "%s/hf/ref/%s.json", hf_testdata(), name);
    char *txt = hf_read_file(path, NULL);
    if (!txt) { snprintf(err, errcap, "%s: %s", path, strerror(errno)); return -1; }
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    int rc = -1;
    const cJSON *nv = cJSON_GetObjectItemCaseSensitive(j, "n_vocab");
    const cJSON *seqs = cJSON_GetObjectItemCaseSensitive(j, "seqs");
    if (!cJSON_IsNumber(nv) || !cJSON_IsArray(seqs) || cJSON_GetArraySize(seqs) > HF_MAX_SEQS) {
        snprintf(err, errcap, "%s: want n_vocab and at most %d seqs", path, HF_MAX_SEQS);
        goto done;
    }
    r->n_vocab = nv->valueint;
    const cJSON *sq;
    cJSON_ArrayForEach(sq, seqs) {
        hf_seq *s = &r->seqs[r->n_seqs];
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(sq, "ids");
        const cJSON *file = cJSON_GetObjectItemCaseSensitive(sq, "file");
        int n = cJSON_GetArraySize(ids);
        if (!cJSON_IsArray(ids) || n < 1 || n > HF_MAX_TOKENS || !cJSON_IsString(file)) {
            snprintf(err, errcap, "%s: seq %d: bad ids or file", path, r->n_seqs);
            goto done;
        }
        s->n_tokens = n;
        int k = 0;
        const cJSON *id;
        cJSON_ArrayForEach(id, ids) s->ids[k++] = (int32_t)id->valueint;
        char fpath[512];
        snprintf(fpath, sizeof fpath, "%s/hf/ref/%s", hf_testdata(), file->valuestring);
        size_t len = 0;
        unsigned char *raw = (unsigned char *)hf_read_file(fpath, &len);
        if (!raw || len != (size_t)n * (size_t)r->n_vocab * 4) {
            snprintf(err, errcap, "%s: want %d x %d little-endian float32", fpath, n, r->n_vocab);
            free(raw);
            goto done;
        }
        s->logits = malloc(len);
        for (size_t i = 0; i < len / 4; i++) {
            uint32_t u = (uint32_t)raw[4 * i] | (uint32_t)raw[4 * i + 1] << 8 |
                         (uint32_t)raw[4 * i + 2] << 16 | (uint32_t)raw[4 * i + 3] << 24;
            memcpy(&s->logits[i], &u, 4);
        }
        free(raw);
        r->n_seqs++;
    }
    rc = 0;
done:
    cJSON_Delete(j);
    if (rc) hf_ref_free(r);
    return rc;
}

/* One forward of tokens [pos0, pos0+n) of one sequence whose earlier positions are
 * already cached; logits of all n tokens go to out (n, n_vocab). */
static int hf_forward(llmi_backend *b, const int32_t *ids, int pos0, int n, const int32_t *table, int n_blocks,
                      float *out, llmi_status *st) {
    int32_t pos[HF_MAX_TOKENS], slot[HF_MAX_TOKENS], seq[HF_MAX_TOKENS], rows[HF_MAX_TOKENS];
    for (int i = 0; i < n; i++) {
        int p = pos0 + i;
        pos[i] = p;
        slot[i] = table[p / HF_BLOCK] * HF_BLOCK + p % HF_BLOCK;
        seq[i] = 0;
        rows[i] = i;
    }
    int32_t qs[2] = {0, n};
    llmi_batch bt = {
        .n_tokens = n, .tokens = ids + pos0, .positions = pos, .slot_mapping = slot, .seq_of_token = seq,
        .n_seqs = 1, .query_start = qs, .block_tables = table,
        .max_blocks_per_seq = n_blocks, .n_logits = n, .logit_rows = rows,
    };
    return b->forward(b, &bt, out, st);
}

/* Compares rows [r0, r0+n) of the reference: max |diff| under rel_tol * max(|ref|, 1)
 * per row, the same argmax unless the reference's own top-2 gap is within the error;
 * returns failures and raises *worst. */
static int hf_compare(const char *what, const float *got, const float *ref, int r0, int n, int V, double rel_tol,
                      double *worst, int *ties) {
    int bad = 0;
    for (int r = r0; r < r0 + n; r++) {
        const float *g = got + (size_t)(r - r0) * V, *e = ref + (size_t)r * V;
        double maxref = 0, maxdiff = 0;
        int ag = 0, ae = 0;
        for (int v = 0; v < V; v++) {
            double d = (double)g[v] - e[v];
            if (d < 0) d = -d;
            if (d != d) d = 1e30;  /* NaN fails */
            if (d > maxdiff) maxdiff = d;
            if (fabs(e[v]) > maxref) maxref = fabs(e[v]);
            if (g[v] > g[ag]) ag = v;
            if (e[v] > e[ae]) ae = v;
        }
        double tol = rel_tol * (maxref > 1 ? maxref : 1);
        if (maxdiff > *worst) *worst = maxdiff;
        if (maxdiff >= tol) {
            if (bad++ < 3) fprintf(stderr, "  %s: position %d: max |logit diff| %g >= %g\n", what, r, maxdiff, tol);
            continue;
        }
        if (ag != ae) {
            /* A genuine tie: the reference's own top-2 gap is within the observed error. */
            double gap = (double)e[ae] - e[ag];
            if (gap <= 2 * maxdiff) { (*ties)++; continue; }
            if (bad++ < 3) fprintf(stderr, "  %s: position %d: argmax %d, transformers %d (gap %g)\n", what, r, ag, ae, gap);
        }
    }
    return bad;
}

/* Teacher-forced logits of every reference sequence, whole and as prefill + decode steps,
 * on the CPU backend (fp32: 1e-3 of the logits' scale) or the CUDA one (bf16 weights,
 * activations and KV cache: rel_tol 5e-2 of the scale, and 1e-3 NMSE per sequence; bf16
 * rounding of the weights and cache alone gives about 1e-2 and 6e-5 on these models).
 * int8_act: the CPU multiplies this model's weights with int8 activations (llama.cpp's
 * rule, which transformers does not apply), held to the CUDA bounds. */
static void hf_check_model_on(test_ctx *t_, const char *name, const char *file, bool cuda, bool int8_act) {
    hf_check_model_seqs(t_, name, file, cuda, int8_act, 0, 0, HF_MAX_SEQS);
}
/* The same on reference sequences [s_lo, s_hi) only, with longrope's factors chosen for a
 * context of n_ctx (0: none chosen, the short ones). */
static void hf_check_model_seqs(test_ctx *t_, const char *name, const char *file, bool cuda, bool int8_act, int n_ctx,
                                int s_lo, int s_hi) {
    char dir[512], err[2048];
    snprintf(dir, sizeof dir, "%s/hf/%s", hf_testdata(), file ? file : name);   /* file: a GGUF of name's weights */
    hf_ref ref;
    if (hf_ref_load(name, &ref, err, sizeof err)) { CHECK_MSG(0, "%s", err); return; }
    llmi_model m;
    memset(&m, 0, sizeof m);
    llmi_load_opts lo = {.no_tokenizer = true};
    llmi_status st = {0};
    int rc = model_load(dir, &lo, &m, &st);
    CHECK_MSG(rc == 0, "model_load(%s): %s", dir, st.msg);
    if (rc) { hf_ref_free(&ref); return; }
    if (n_ctx) model_select_longrope(&m, n_ctx);
    CHECK_MSG(m.cfg.n_vocab == ref.n_vocab, "%s: n_vocab %d, reference %d", name, m.cfg.n_vocab, ref.n_vocab);
    CHECK(m.cfg.n_layers <= 6 && (m.cfg.dim == 64 || m.cfg.dim == 256));
    llmi_backend_opts bo = {.n_threads = 2, .kv_dtype = cuda ? LLMI_KV_BF16 : LLMI_KV_F32, .block_size = HF_BLOCK,
                            .max_batch_tokens = HF_MAX_TOKENS, .max_seqs = 1, .gpu_mem_util = 0.5f};
    const bool loose = cuda || int8_act;
    const double rel_tol = loose ? 5e-2 : 1e-3;
    llmi_backend *b = NULL;
    rc = cuda ? backend_cuda_create(&m, &bo, &b, &st) : backend_cpu_create(&m, &bo, &b, &st);
    CHECK_MSG(rc == 0, "backend %s create (%s): %s", cuda ? "cuda" : "cpu", name, st.msg);
    const int n_blocks = HF_MAX_TOKENS / HF_BLOCK;
    if (rc == 0) {
        rc = b->kv_alloc(b, 2 * n_blocks, &st);
        CHECK_MSG(rc == 0, "kv_alloc(%s): %s", name, st.msg);
    }
    if (rc == 0 && m.cfg.n_vocab == ref.n_vocab) {
        int V = ref.n_vocab;
        float *got = malloc(sizeof(float) * HF_MAX_TOKENS * (size_t)V);
        /* Identity block table for the whole-sequence pass; a scattered one (odd blocks,
         * high first) for the chunked pass, so paging bugs cannot hide behind it. */
        int32_t ident[HF_MAX_TOKENS / HF_BLOCK], scat[HF_MAX_TOKENS / HF_BLOCK];
        for (int i = 0; i < n_blocks; i++) { ident[i] = i; scat[i] = 2 * (n_blocks - 1 - i) + 1; }
        for (int s = s_lo; s < ref.n_seqs && s < s_hi; s++) {
            hf_seq *q = &ref.seqs[s];
            double worst = 0;
            int ties = 0, bad;
            char what[160];
            snprintf(what, sizeof what, "%s seq %d (n=%d) whole", name, s, q->n_tokens);
            st = (llmi_status){0};
            rc = hf_forward(b, q->ids, 0, q->n_tokens, ident, n_blocks, got, &st);
            CHECK_MSG(rc == 0, "%s: forward: %s", what, st.msg);
            if (rc) break;
            bad = hf_compare(what, got, q->logits, 0, q->n_tokens, V, rel_tol, &worst, &ties);
            CHECK_MSG(bad == 0, "%s: %d positions differ from transformers", what, bad);
            double nmse = test_nmse(got, q->logits, (long)q->n_tokens * V);
            if (loose) CHECK_MSG(nmse <= 1e-3, "%s: logits nmse %g", what, nmse);
            /* Same sequence as a prefill of about 2/3 then one token at a time: the
             * decode path reads what the prefill wrote to the cache. */
            int split = q->n_tokens * 2 / 3;
            snprintf(what, sizeof what, "%s seq %d (n=%d) prefill %d + decode", name, s, q->n_tokens, split);
            rc = hf_forward(b, q->ids, 0, split, scat, n_blocks, got, &st);
            CHECK_MSG(rc == 0, "%s: forward: %s", what, st.msg);
            if (rc) break;
            bad = hf_compare(what, got, q->logits, 0, split, V, rel_tol, &worst, &ties);
            for (int p = split; p < q->n_tokens && rc == 0; p++) {
                rc = hf_forward(b, q->ids, p, 1, scat, n_blocks, got, &st);
                CHECK_MSG(rc == 0, "%s: decode at %d: %s", what, p, st.msg);
                if (rc == 0) bad += hf_compare(what, got, q->logits, p, 1, V, rel_tol, &worst, &ties);
            }
            CHECK_MSG(bad == 0, "%s: %d positions differ from transformers", what, bad);
            fprintf(stderr, "  %s%s seq %d: n=%d max |logit diff| %.3g, nmse %.3g%s\n", cuda ? "cuda " : "", name, s,
                    q->n_tokens, worst, nmse, ties ? " (argmax ties within error skipped)" : "");
        }
        free(got);
    }
    if (b) b->destroy(b);
    model_free(&m);
    hf_ref_free(&ref);
}

static void hf_check_model(test_ctx *t_, const char *name) { hf_check_model_on(t_, name, NULL, false, false); }

/* name.gguf against transformers' logits from that file */
static void hf_check_kquant(test_ctx *t_, const char *name, bool cuda) {
    char file[128];
    snprintf(file, sizeof file, "%s.gguf", name);
    hf_check_model_on(t_, name, file, cuda, true);
}

TEST(hf_llama_gqa_llama3_rope_vs_transformers) { hf_check_model(t_, hf_models[0]); }
TEST(hf_qwen2_bias_tied_bf16_vs_transformers) { hf_check_model(t_, hf_models[1]); }
TEST(hf_mistral_sharded_f16_vs_transformers) { hf_check_model(t_, hf_models[2]); }
TEST(hf_llama_head_dim_vs_transformers) { hf_check_model(t_, hf_models[3]); }
TEST(hf_llama_attention_bias_vs_transformers) { hf_check_model(t_, hf_models[4]); }
TEST(hf_qwen3_qk_norm_vs_transformers) { hf_check_model(t_, hf_models[5]); }
TEST(hf_qwen3_gguf_vs_transformers) { hf_check_model_on(t_, hf_models[5], HF_QWEN3_GGUF, false, false); }
TEST(hf_qwen2_yarn_vs_transformers) { hf_check_model(t_, hf_yarn[0]); }
TEST(hf_llama_yarn_all_params_v5_config_vs_transformers) { hf_check_model(t_, hf_yarn[1]); }
TEST(hf_qwen2_yarn_gguf_vs_transformers) { hf_check_model_on(t_, hf_yarn[0], HF_YARN_GGUF, false, false); }
TEST(hf_gemma3_sliding_window_vs_transformers) { hf_check_model(t_, hf_gemma[0]); }
TEST(hf_gemma3_scaled_v5_config_vs_transformers) { hf_check_model(t_, hf_gemma[1]); }
TEST(hf_gemma3_gguf_vs_transformers) { hf_check_model_on(t_, hf_gemma[0], HF_GEMMA3_GGUF, false, false); }
TEST(hf_gemma2_soft_caps_v5_config_vs_transformers) { hf_check_model(t_, hf_gemma2[0]); }
TEST(hf_gemma2_default_caps_classic_config_vs_transformers) { hf_check_model(t_, hf_gemma2[1]); }
TEST(hf_gemma2_gguf_vs_transformers) { hf_check_model_on(t_, hf_gemma2[0], HF_GEMMA2_GGUF, false, false); }
TEST(hf_phi3_fused_vs_transformers) { hf_check_model(t_, hf_phi3[0]); }
TEST(hf_phi3_sliding_window_bf16_vs_transformers) { hf_check_model(t_, hf_phi3[1]); }
TEST(hf_phi3_gguf_vs_transformers) { hf_check_model_on(t_, hf_phi3[0], HF_PHI3_GGUF, false, false); }
TEST(hf_phi3_longrope_vs_transformers) { hf_check_longrope(t_, HF_LONGROPE, NULL, false); }
TEST(hf_phi3_longrope_gguf_vs_transformers) { hf_check_longrope(t_, HF_LONGROPE, HF_LONGROPE_GGUF, false); }
TEST(hf_smollm3_nope_vs_transformers) { hf_check_model(t_, HF_NOPE); }
TEST(hf_smollm3_nope_gguf_vs_transformers) { hf_check_model_on(t_, HF_NOPE, HF_NOPE_GGUF, false, false); }
TEST(hf_granite_multipliers_vs_transformers) { hf_check_model(t_, HF_GRANITE); }
TEST(hf_granite_gguf_vs_transformers) { hf_check_model_on(t_, HF_GRANITE, HF_GRANITE_GGUF, false, false); }
TEST(hf_granitemoe_fused_experts_vs_transformers) { hf_check_model(t_, HF_GRANITEMOE); }
TEST(hf_granitemoe_gguf_vs_transformers) { hf_check_model_on(t_, HF_GRANITEMOE, HF_GRANITEMOE_GGUF, false, false); }
TEST(hf_phi4mini_partial_rope_vs_transformers) { hf_check_longrope(t_, HF_PARTIAL, NULL, false); }
TEST(hf_phi4mini_partial_rope_gguf_vs_transformers) { hf_check_longrope(t_, HF_PARTIAL, HF_PARTIAL_GGUF, false); }
TEST(hf_qwen3moe_bf16_vs_transformers) { hf_check_model(t_, hf_moe[0]); }
TEST(hf_qwen3moe_no_topk_norm_v5_config_vs_transformers) { hf_check_model(t_, hf_moe[1]); }
TEST(hf_mixtral_vs_transformers) { hf_check_model(t_, hf_moe[2]); }
TEST(hf_qwen3moe_gguf_vs_transformers) { hf_check_model_on(t_, hf_moe[0], hf_moe_gguf[0], false, false); }
TEST(hf_mixtral_gguf_vs_transformers) { hf_check_model_on(t_, hf_moe[2], hf_moe_gguf[1], false, false); }
TEST(hf_gguf_q4_k_m_vs_transformers) { hf_check_kquant(t_, hf_kquant[0], false); }
TEST(hf_gguf_q5_k_m_vs_transformers) { hf_check_kquant(t_, hf_kquant[1], false); }
TEST(hf_gguf_q3_k_m_vs_transformers) { hf_check_kquant(t_, hf_kquant[2], false); }
TEST(hf_gguf_iq4_xs_vs_transformers) { hf_check_kquant(t_, hf_kquant[3], false); }
TEST(hf_gguf_iq4_nl_vs_transformers) { hf_check_kquant(t_, hf_kquant[4], false); }
TEST(hf_gguf_q2_k_vs_transformers) { hf_check_kquant(t_, hf_kquant[5], false); }

#ifdef LLMI_CUDA
/* The CUDA backend on the same references: only in the CUDA build (as test_cuda_ops.c),
 * and a skip, never a pass, when no device is visible. */
static void hf_check_model_cuda(test_ctx *t_, const char *name) {
    if (backend_cuda_device_count() == 0) SKIP("no CUDA device");
    hf_check_model_on(t_, name, NULL, true, false);
}

TEST(hf_cuda_llama_gqa_llama3_rope_vs_transformers) { hf_check_model_cuda(t_, hf_models[0]); }
TEST(hf_cuda_qwen2_bias_tied_bf16_vs_transformers) { hf_check_model_cuda(t_, hf_models[1]); }
TEST(hf_cuda_mistral_sharded_f16_vs_transformers) { hf_check_model_cuda(t_, hf_models[2]); }
TEST(hf_cuda_llama_head_dim_vs_transformers) { hf_check_model_cuda(t_, hf_models[3]); }
TEST(hf_cuda_llama_attention_bias_vs_transformers) { hf_check_model_cuda(t_, hf_models[4]); }
TEST(hf_cuda_qwen3_qk_norm_vs_transformers) { hf_check_model_cuda(t_, hf_models[5]); }
TEST(hf_cuda_qwen2_yarn_vs_transformers) { hf_check_model_cuda(t_, hf_yarn[0]); }
TEST(hf_cuda_llama_yarn_all_params_vs_transformers) { hf_check_model_cuda(t_, hf_yarn[1]); }
TEST(hf_cuda_gemma3_sliding_window_vs_transformers) { hf_check_model_cuda(t_, hf_gemma[0]); }
TEST(hf_cuda_gemma3_scaled_v5_config_vs_transformers) { hf_check_model_cuda(t_, hf_gemma[1]); }
TEST(hf_cuda_gemma2_soft_caps_v5_config_vs_transformers) { hf_check_model_cuda(t_, hf_gemma2[0]); }
TEST(hf_cuda_gemma2_default_caps_classic_config_vs_transformers) { hf_check_model_cuda(t_, hf_gemma2[1]); }
TEST(hf_cuda_phi3_fused_vs_transformers) { hf_check_model_cuda(t_, hf_phi3[0]); }
TEST(hf_cuda_phi3_sliding_window_bf16_vs_transformers) { hf_check_model_cuda(t_, hf_phi3[1]); }
TEST(hf_cuda_phi3_longrope_vs_transformers) {
    if (backend_cuda_device_count() == 0) SKIP("no CUDA device");
    hf_check_longrope(t_, HF_LONGROPE, NULL, true);
}
TEST(hf_cuda_smollm3_nope_vs_transformers) { hf_check_model_cuda(t_, HF_NOPE); }
TEST(hf_cuda_granite_multipliers_vs_transformers) { hf_check_model_cuda(t_, HF_GRANITE); }
TEST(hf_cuda_granitemoe_fused_experts_vs_transformers) { hf_check_model_cuda(t_, HF_GRANITEMOE); }
TEST(hf_cuda_phi4mini_partial_rope_vs_transformers) {
    if (backend_cuda_device_count() == 0) SKIP("no CUDA device");
    hf_check_longrope(t_, HF_PARTIAL, NULL, true);
}
TEST(hf_cuda_qwen3moe_bf16_vs_transformers) { hf_check_model_cuda(t_, hf_moe[0]); }
TEST(hf_cuda_qwen3moe_no_topk_norm_v5_config_vs_transformers) { hf_check_model_cuda(t_, hf_moe[1]); }
TEST(hf_cuda_mixtral_vs_transformers) { hf_check_model_cuda(t_, hf_moe[2]); }
static void hf_check_kquant_cuda(test_ctx *t_, const char *name) {
    if (backend_cuda_device_count() == 0) SKIP("no CUDA device");
    hf_check_kquant(t_, name, true);
}
TEST(hf_cuda_gguf_q4_k_m_vs_transformers) { hf_check_kquant_cuda(t_, hf_kquant[0]); }
TEST(hf_cuda_gguf_q5_k_m_vs_transformers) { hf_check_kquant_cuda(t_, hf_kquant[1]); }
TEST(hf_cuda_gguf_q3_k_m_vs_transformers) { hf_check_kquant_cuda(t_, hf_kquant[2]); }
TEST(hf_cuda_gguf_iq4_xs_vs_transformers) { hf_check_kquant_cuda(t_, hf_kquant[3]); }
TEST(hf_cuda_gguf_iq4_nl_vs_transformers) { hf_check_kquant_cuda(t_, hf_kquant[4]); }
TEST(hf_cuda_gguf_q2_k_vs_transformers) { hf_check_kquant_cuda(t_, hf_kquant[5]); }
#endif

/* The same directories with their tokenizer: tokenizer.json trained by HF tokenizers
 * (byte-level BPE), encoded with the model's default special-token rule. */
TEST(hf_models_tokenizer_vs_hf_tokenizers) {
    char path[1024];
    snprintf(path, sizeof path, "%s/hf/ref/tokenizer.json", hf_testdata());
    char *txt = hf_read_file(path, NULL);
    CHECK_MSG(txt != NULL, "%s: %s", path, strerror(errno));
    if (!txt) return;
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "text");
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(j, "ids");
    CHECK(cJSON_IsString(text) && cJSON_IsArray(ids));
    CHECK_MSG(cJSON_IsString(text) && cJSON_IsArray(ids), "%s: no \"text\" string and \"ids\" list", path);
    if (!cJSON_IsString(text) || !cJSON_IsArray(ids)) { cJSON_Delete(j); return; }
    for (size_t k = 0; k < sizeof hf_models / sizeof hf_models[0]; k++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/hf/%s", hf_testdata(), hf_models[k]);
        llmi_model m;
        memset(&m, 0, sizeof m);
        llmi_load_opts lo = {.no_tokenizer = false};
        llmi_status st = {0};
        int rc = model_load(dir, &lo, &m, &st);
        CHECK_MSG(rc == 0 && m.tok, "model_load(%s) with tokenizer: %s", dir, st.msg);
        if (rc) continue;
        if (m.tok) {
            int32_t *got = NULL;
            int n = 0;
            rc = tok_encode(m.tok, text->valuestring, strlen(text->valuestring), true, false, &got, &n, &st);
            CHECK_MSG(rc == 0, "%s: tok_encode: %s", dir, st.msg);
            int want = cJSON_GetArraySize(ids), first = -1;
            for (int i = 0; rc == 0 && i < want && i < n && first < 0; i++)
                if (got[i] != cJSON_GetArrayItem(ids, i)->valueint) first = i;
            CHECK_MSG(rc != 0 || (n == want && first < 0), "%s: encode gives %d ids, HF %d; first difference at %d",
                      dir, n, want, first);
            free(got);
        }
        model_free(&m);
    }
    cJSON_Delete(j);
}

/* Gemma's kind of tokenizer (testdata/hf/gemma3-swa: SentencePiece-style BPE with byte
 * fallback, spaces as "▁" and no prefix, <start_of_turn>/<end_of_turn> specials) against HF
 * tokenizers' encodings with the BOS it adds, and decoded back to HF's text; its chat
 * template is Gemma 3's and <end_of_turn> ends generation. */
TEST(hf_gemma3_tokenizer_vs_hf_tokenizers) {
    char path[1024], dir[1024];
    snprintf(path, sizeof path, "%s/hf/ref/gemma3-tokenizer.json", hf_testdata());
    snprintf(dir, sizeof dir, "%s/hf/%s", hf_testdata(), hf_gemma[0]);
    char *txt = hf_read_file(path, NULL);
    CHECK_MSG(txt != NULL, "%s: %s", path, strerror(errno));
    if (!txt) return;
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(j, "cases"), *c;
    CHECK_MSG(cJSON_GetArraySize(cases) >= 5, "%s: no cases", path);
    llmi_model m;
    memset(&m, 0, sizeof m);
    llmi_status st = {0};
    int rc = model_load(dir, &(llmi_load_opts){.no_tokenizer = false}, &m, &st);
    CHECK_MSG(rc == 0 && m.tok, "model_load(%s) with tokenizer: %s", dir, st.msg);
    int n_cases = 0;
    cJSON_ArrayForEach(c, cases) {
        if (rc || !m.tok) break;
        const char *text = cJSON_GetObjectItemCaseSensitive(c, "text")->valuestring;
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(c, "ids");
        const char *decoded = cJSON_GetObjectItemCaseSensitive(c, "decoded")->valuestring;
        int32_t *got = NULL;
        int n = 0, want = cJSON_GetArraySize(ids), first = -1;
        CHECK(tok_encode(m.tok, text, strlen(text), true, true, &got, &n, &st) == 0);
        for (int i = 0; i < want && i < n && first < 0; i++)
            if (got[i] != cJSON_GetArrayItem(ids, i)->valueint) first = i;
        CHECK_MSG(n == want && first < 0, "case %d (%.30s...): %d ids, HF %d; first difference at %d", n_cases, text, n,
                  want, first);
        char *back = NULL;
        size_t blen = 0;
        CHECK(tok_decode(m.tok, got, n, false, &back, &blen, &st) == 0);
        CHECK_MSG(back && strcmp(back, decoded) == 0, "case %d: decodes to \"%s\", HF \"%s\"", n_cases, back ? back : "",
                  decoded);
        free(back);
        free(got);
        n_cases++;
    }
    if (m.tok) {
        CHECK(strcmp(tok_chat_template_name(m.tok), "gemma") == 0);
        int32_t *eot = NULL;
        int n = 0;
        CHECK(tok_encode(m.tok, "<end_of_turn>", 13, false, true, &eot, &n, &st) == 0 && n == 1 && tok_is_eog(m.tok, eot[0]));
        free(eot);
    }
    fprintf(stderr, "  %s: %d strings encode and decode as HF tokenizers\n", dir, n_cases);
    model_free(&m);
    cJSON_Delete(j);
}
