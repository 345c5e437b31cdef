/* test_loader.c — the GGUF and Hugging Face loaders: synthetic files written here
 * (a GGUF writer and a safetensors writer), loaded back and compared value by value;
 * one case per attack in ../shared/docs/FORMATS.md, each of which must fail with a one-line message
 * naming the file; random corruption that must never crash; the real SmolLM2 GGUF. */
#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/gguf.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "test.h"
#include "tok/tokenizer.h"

/* ---------------------------------------------------------------- small utilities */

typedef struct rng { uint64_t s; } rng;
static uint64_t rng_next(rng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return r->s;
}
static float rng_f(rng *r) { return (float)((rng_next(r) >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f; }

typedef struct bbuf { uint8_t *p; size_t n, cap; } bbuf;
static void bb_put(bbuf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void bb_u32(bbuf *b, uint32_t v) { bb_put(b, &v, 4); }
static void bb_u64(bbuf *b, uint64_t v) { bb_put(b, &v, 8); }
static void bb_str(bbuf *b, const char *s) { bb_u64(b, strlen(s)); bb_put(b, s, strlen(s)); }
static void bb_zero(bbuf *b, size_t n) { while (n--) { uint8_t z = 0; bb_put(b, &z, 1); } }

static void write_file(const char *path, const void *d, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); abort(); }
    if (n) fwrite(d, 1, n, f);
    fclose(f);
}

static void write_text(const char *path, const char *s) { write_file(path, s, strlen(s)); }

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)len + 1);
    if (fread(p, 1, (size_t)len, f) != (size_t)len) { free(p); p = NULL; }
    fclose(f);
    *n = (size_t)len;
    return p;
}

static void rm_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) rm_tree(p);
        else unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static char *make_tmpdir(void) {
    char *d = strdup("/tmp/llmi_loader_XXXXXX");
    if (!mkdtemp(d)) { perror("mkdtemp"); abort(); }
    return d;
}

/* Loads path; the load must fail with one line naming path (and containing needle). */
static void expect_fail_at(test_ctx *t_, const char *path, bool no_tok, const char *needle, int line) {
    llmi_model m;
    llmi_status st;
    llmi_status_clear(&st);
    llmi_load_opts o = {.no_tokenizer = no_tok};
    int rc = model_load(path, &o, &m, &st);
    if (rc == 0) {
        fprintf(stderr, "  line %d: load of %s unexpectedly succeeded\n", line, path);
        t_->failures++;
        model_free(&m);
        return;
    }
    CHECK_MSG(st.code != 0, "line %d: status code not set", line);
    CHECK_MSG(strstr(st.msg, path) != NULL, "line %d: message does not name %s: %s", line, path, st.msg);
    CHECK_MSG(strchr(st.msg, '\n') == NULL, "line %d: message is not one line: %s", line, st.msg);
    if (needle) CHECK_MSG(strstr(st.msg, needle) != NULL, "line %d: message lacks \"%s\": %s", line, needle, st.msg);
    CHECK_MSG(m.layers == NULL && m.n_maps == 0 && m.tok_embd.data == NULL, "line %d: model not cleared", line);
}
#define EXPECT_FAIL(path, no_tok, needle) expect_fail_at(t_, path, no_tok, needle, __LINE__)

/* Loads without failing the test (random corruption): no crash is all we ask, plus the
 * message contract when it fails. */
static void load_any(test_ctx *t_, const char *path, bool no_tok) {
    llmi_model m;
    llmi_status st;
    llmi_status_clear(&st);
    llmi_load_opts o = {.no_tokenizer = no_tok};
    if (model_load(path, &o, &m, &st) == 0) {
        model_free(&m);
        return;
    }
    CHECK_MSG(strstr(st.msg, path) != NULL && strchr(st.msg, '\n') == NULL, "bad message: %s", st.msg);
}

/* ---------------------------------------------------------------- a tiny model */

/* GGUF type ids and geometry the writer needs (ggml-common.h). */
enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q8_0 = 8, T_Q8_1 = 9, T_BF16 = 30 };
static int64_t ty_blck(int t) { return (t == T_F32 || t == T_F16 || t == T_BF16) ? 1 : 32; }
static size_t ty_bytes(int t) {
    switch (t) {
    case T_F32: return 4;
    case T_F16: case T_BF16: return 2;
    case T_Q4_0: return 18;
    case T_Q4_1: return 20;
    case T_Q5_0: return 22;
    case T_Q8_0: return 34;
    case T_Q8_1: return 36;     /* a type llmi does not read */
    }
    return 0;
}
static const char *ty_st(int t) { return t == T_F32 ? "F32" : t == T_F16 ? "F16" : "BF16"; }

typedef struct ttensor {
    char gname[64], hname[96];
    int64_t rows, cols;      /* HF shape; vectors have rows = 0 */
    int type;
    uint8_t *hf;             /* (rows, cols) bytes in HF row order */
    size_t nbytes;
    int permute_heads;       /* > 0: GGUF stores rows permuted over this many heads */
} ttensor;

typedef struct tmodel {
    bool qwen, tied, bias;
    int dim, n_layers, n_heads, n_kv, hd, ffn, vocab, ctx;
    float eps, theta;
    ttensor t[128];
    int n;
} tmodel;

/* Random but valid contents: finite fp16 scales for the quantized blocks. */
static void fill_random(ttensor *x, rng *r) {
    int64_t rows = x->rows ? x->rows : 1;
    size_t rb = (size_t)(x->cols / ty_blck(x->type)) * ty_bytes(x->type);
    x->nbytes = (size_t)rows * rb;
    x->hf = malloc(x->nbytes);
    for (size_t i = 0; i < x->nbytes; i++) x->hf[i] = (uint8_t)rng_next(r);
    int64_t nb = rows * (x->cols / ty_blck(x->type));
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = x->hf + b * ty_bytes(x->type);
        uint16_t h;
        float f;
        switch (x->type) {
        case T_F32: f = rng_f(r); memcpy(p, &f, 4); break;
        case T_F16: h = f32_to_fp16(rng_f(r)); memcpy(p, &h, 2); break;
        case T_BF16: h = f32_to_bf16(rng_f(r)); memcpy(p, &h, 2); break;
        case T_Q4_1: h = f32_to_fp16(rng_f(r) * 0.5f); memcpy(p + 2, &h, 2); /* fall through */
        case T_Q4_0: case T_Q8_0: case T_Q5_0: case T_Q8_1: h = f32_to_fp16(rng_f(r) * 0.1f); memcpy(p, &h, 2); break;
        }
    }
}

static ttensor *add_t(tmodel *m, const char *gfmt, const char *hfmt, int layer, int64_t rows, int64_t cols, int type,
                      rng *r) {
    ttensor *x = &m->t[m->n++];
    memset(x, 0, sizeof *x);
    snprintf(x->gname, sizeof x->gname, gfmt, layer);
    snprintf(x->hname, sizeof x->hname, hfmt, layer);
    x->rows = rows;
    x->cols = cols;
    x->type = type;
    fill_random(x, r);
    return x;
}

/* dense: only F32/F16/BF16 (for safetensors); otherwise a mix of GGUF types. */
static void tmodel_init_v(tmodel *m, bool qwen, bool tied, bool bias, bool dense, int vocab, rng *r) {
    memset(m, 0, sizeof *m);
    m->qwen = qwen;
    m->tied = tied;
    m->bias = bias || qwen;
    m->dim = 64; m->n_layers = 2; m->n_heads = 4; m->n_kv = 2; m->hd = 16; m->ffn = 96; m->vocab = vocab;
    m->ctx = 256; m->eps = 1e-5f; m->theta = 10000.0f;
    int q = m->n_heads * m->hd, kv = m->n_kv * m->hd;
    int mat[7] = {T_Q4_0, T_Q4_1, T_F16, T_BF16, T_Q8_0, T_F32, T_Q4_1};
    int dmat[7] = {T_F32, T_BF16, T_F16, T_BF16, T_F16, T_F32, T_BF16};
    const int *ty = dense ? dmat : mat;
    add_t(m, "token_embd.weight", "model.embed_tokens.weight", 0, m->vocab, m->dim, dense ? T_F16 : T_Q8_0, r);
    add_t(m, "output_norm.weight", "model.norm.weight", 0, 0, m->dim, T_F32, r);
    if (!tied) add_t(m, "output.weight", "lm_head.weight", 0, m->vocab, m->dim, dense ? T_BF16 : T_Q4_0, r);
    for (int l = 0; l < m->n_layers; l++) {
        add_t(m, "blk.%d.attn_norm.weight", "model.layers.%d.input_layernorm.weight", l, 0, m->dim, T_F32, r);
        ttensor *x = add_t(m, "blk.%d.attn_q.weight", "model.layers.%d.self_attn.q_proj.weight", l, q, m->dim, ty[0], r);
        if (!qwen) x->permute_heads = m->n_heads;
        x = add_t(m, "blk.%d.attn_k.weight", "model.layers.%d.self_attn.k_proj.weight", l, kv, m->dim, ty[1], r);
        if (!qwen) x->permute_heads = m->n_kv;
        add_t(m, "blk.%d.attn_v.weight", "model.layers.%d.self_attn.v_proj.weight", l, kv, m->dim, ty[2], r);
        add_t(m, "blk.%d.attn_output.weight", "model.layers.%d.self_attn.o_proj.weight", l, m->dim, q, ty[3], r);
        if (m->bias) {
            x = add_t(m, "blk.%d.attn_q.bias", "model.layers.%d.self_attn.q_proj.bias", l, 0, q, T_F32, r);
            if (!qwen) x->permute_heads = m->n_heads;
            x = add_t(m, "blk.%d.attn_k.bias", "model.layers.%d.self_attn.k_proj.bias", l, 0, kv, dense ? T_BF16 : T_F32, r);
            if (!qwen) x->permute_heads = m->n_kv;
            add_t(m, "blk.%d.attn_v.bias", "model.layers.%d.self_attn.v_proj.bias", l, 0, kv, T_F32, r);
        }
        add_t(m, "blk.%d.ffn_norm.weight", "model.layers.%d.post_attention_layernorm.weight", l, 0, m->dim,
              l ? T_F16 : T_F32, r);
        add_t(m, "blk.%d.ffn_gate.weight", "model.layers.%d.mlp.gate_proj.weight", l, m->ffn, m->dim, ty[4], r);
        add_t(m, "blk.%d.ffn_up.weight", "model.layers.%d.mlp.up_proj.weight", l, m->ffn, m->dim, ty[5], r);
        add_t(m, "blk.%d.ffn_down.weight", "model.layers.%d.mlp.down_proj.weight", l, m->dim, m->ffn, ty[6], r);
    }
}

static void tmodel_init(tmodel *m, bool qwen, bool tied, bool bias, bool dense, rng *r) {
    tmodel_init_v(m, qwen, tied, bias, dense, 40, r);
}

static void tmodel_free(tmodel *m) {
    for (int i = 0; i < m->n; i++) free(m->t[i].hf);
}

static ttensor *tfind(tmodel *m, const char *gname) {
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->t[i].gname, gname)) return &m->t[i];
    return NULL;
}

/* The converter's permutation, written independently of the loader: view the rows of
 * each head as (2, hd/2), swap to (hd/2, 2). */
static void converter_permute(const uint8_t *src, uint8_t *dst, int n_head, int hd, size_t rb) {
    for (int h = 0; h < n_head; h++)
        for (int t = 0; t < 2; t++)
            for (int i = 0; i < hd / 2; i++)
                memcpy(dst + (size_t)(h * hd + i * 2 + t) * rb, src + (size_t)(h * hd + t * (hd / 2) + i) * rb, rb);
}

/* ---------------------------------------------------------------- GGUF writer */

typedef struct gguf_opts {
    uint32_t version;          /* 0 = 3 */
    const char *arch;          /* NULL = from the model */
    uint32_t alignment;        /* 0 = key absent (32) */
    int64_t block_count;       /* 0 = from the model */
    bool tokenizer;
    const char *skip;          /* tensor left out */
    const char *retype;        /* tensor written with type retype_to */
    int retype_to;
    const char *reshape;       /* tensor written with rows and cols swapped */
    bool dup_key, dup_tensor;
    const char *pre;           /* tokenizer.ggml.pre, NULL = smollm */
    int bos;                   /* 0 = 1 */
    int n_tokens;              /* 0 = vocab */
    bool scores_i32;           /* scores written as an i32 array (element type mismatch) */
    bool block_count_str;      /* block_count written as a string */
    bool spm;                  /* tokenizer model "llama" (SentencePiece): no merges, no pre, no ids */
    uint32_t pad_raw;          /* != 0: padding_token_id and eot_token_id written with this value */
    int rope_dim;              /* rope.dimension_count, 0 = head_dim */
} gguf_opts;

/* Offsets in the written file that the attack cases patch. */
typedef struct gguf_offs {
    size_t first_key_len, tokens_elem_type, tokens_count, tokens_first_len, block_count_val;
    size_t ti_first, ti_first_ndims, ti_first_dims, ti_first_type, ti_last_offset, data_start;
    size_t ti_q_ndims;         /* n_dims field of blk.0.attn_q.weight */
} gguf_offs;

static void kv_key(bbuf *b, const char *k, uint32_t type) { bb_str(b, k); bb_u32(b, type); }

static size_t gguf_write(const char *path, tmodel *m, const gguf_opts *o, gguf_offs *off) {
    gguf_offs dummy;
    if (!off) off = &dummy;
    memset(off, 0, sizeof *off);
    const char *arch = o->arch ? o->arch : m->qwen ? "qwen2" : "llama";
    bbuf b = {0};
    bb_put(&b, "GGUF", 4);
    bb_u32(&b, o->version ? o->version : 3);
    int n_tensors = 0;
    for (int i = 0; i < m->n; i++)
        if (!o->skip || strcmp(o->skip, m->t[i].gname)) n_tensors++;
    if (o->dup_tensor) n_tensors++;
    bb_u64(&b, (uint64_t)n_tensors);
    size_t nkv_pos = b.n;
    bb_u64(&b, 0);
    uint64_t nkv = 0;
    char k[128];
    off->first_key_len = b.n;
    kv_key(&b, "general.architecture", 8); bb_str(&b, arch); nkv++;
    kv_key(&b, "general.name", 8); bb_str(&b, "tiny test"); nkv++;
    if (o->alignment) { kv_key(&b, "general.alignment", 4); bb_u32(&b, o->alignment); nkv++; }
    snprintf(k, sizeof k, "%s.block_count", arch);
    if (o->block_count_str) {
        kv_key(&b, k, 8); bb_str(&b, "2");
    } else {
        kv_key(&b, k, 4);
        off->block_count_val = b.n;
        bb_u32(&b, (uint32_t)(o->block_count ? o->block_count : m->n_layers));
    }
    nkv++;
#define KV_U32(suffix, v) do { snprintf(k, sizeof k, "%s." suffix, arch); kv_key(&b, k, 4); bb_u32(&b, (uint32_t)(v)); nkv++; } while (0)
#define KV_F32(suffix, v) do { snprintf(k, sizeof k, "%s." suffix, arch); kv_key(&b, k, 6); float f_ = (v); bb_put(&b, &f_, 4); nkv++; } while (0)
    KV_U32("context_length", m->ctx);
    KV_U32("embedding_length", m->dim);
    KV_U32("feed_forward_length", m->ffn);
    KV_U32("attention.head_count", m->n_heads);
    KV_U32("attention.head_count_kv", m->n_kv);
    KV_F32("attention.layer_norm_rms_epsilon", m->eps);
    KV_F32("rope.freq_base", m->theta);
    KV_U32("rope.dimension_count", o->rope_dim ? o->rope_dim : m->hd);
    if (o->dup_key) KV_U32("embedding_length", m->dim);
    if (o->tokenizer) {
        int nt = o->n_tokens ? o->n_tokens : m->vocab;
        kv_key(&b, "tokenizer.ggml.model", 8); bb_str(&b, o->spm ? "llama" : "gpt2"); nkv++;
        if (!o->spm) { kv_key(&b, "tokenizer.ggml.pre", 8); bb_str(&b, o->pre ? o->pre : "smollm"); nkv++; }
        kv_key(&b, "tokenizer.ggml.tokens", 9);
        off->tokens_elem_type = b.n;
        bb_u32(&b, 8);
        off->tokens_count = b.n;
        bb_u64(&b, (uint64_t)nt);
        off->tokens_first_len = b.n;
        for (int i = 0; i < nt; i++) {
            char s[32];
            if (o->spm) snprintf(s, sizeof s, i == 0 ? "<unk>" : i == 1 ? "<s>" : i == 2 ? "</s>" : "\xe2\x96\x81t%d", i);
            else if (i == 0) snprintf(s, sizeof s, "<|endoftext|>");
            else if (i == 2) snprintf(s, sizeof s, "<|im_end|>");
            else if (i >= 3 && i <= 7) snprintf(s, sizeof s, "%s", (const char *[]){"t", "1", "t1", "2", "t2"}[i - 3]);
            else snprintf(s, sizeof s, "x%d", i);
            bb_str(&b, s);
        }
        nkv++;
        kv_key(&b, "tokenizer.ggml.token_type", 9); bb_u32(&b, 5); bb_u64(&b, (uint64_t)nt);
        for (int i = 0; i < nt; i++) bb_u32(&b, i == 0 && o->spm ? 2 : i < 3 ? 3 : 1);
        nkv++;
        kv_key(&b, "tokenizer.ggml.scores", 9); bb_u32(&b, o->scores_i32 ? 5 : 6); bb_u64(&b, (uint64_t)nt);
        for (int i = 0; i < nt; i++) { float f = (float)-i; bb_put(&b, &f, 4); }
        nkv++;
        if (!o->spm) {
            kv_key(&b, "tokenizer.ggml.merges", 9); bb_u32(&b, 8); bb_u64(&b, 2); bb_str(&b, "t 1"); bb_str(&b, "t 2"); nkv++;
            kv_key(&b, "tokenizer.ggml.bos_token_id", 4); bb_u32(&b, (uint32_t)(o->bos ? o->bos : 1)); nkv++;
            kv_key(&b, "tokenizer.ggml.eos_token_id", 4); bb_u32(&b, 2); nkv++;
            kv_key(&b, "tokenizer.ggml.add_bos_token", 7); { uint8_t z = 0; bb_put(&b, &z, 1); } nkv++;
        }
        kv_key(&b, "tokenizer.chat_template", 8); bb_str(&b, "{{ messages }}"); nkv++;
        if (o->pad_raw) {
            kv_key(&b, "tokenizer.ggml.padding_token_id", 4); bb_u32(&b, o->pad_raw); nkv++;
            kv_key(&b, "tokenizer.ggml.eot_token_id", 4); bb_u32(&b, o->pad_raw); nkv++;
        }
    }
#undef KV_U32
#undef KV_F32
    memcpy(b.p + nkv_pos, &nkv, 8);

    /* tensor infos; data offsets are the running padded sum */
    uint64_t align = o->alignment ? o->alignment : 32;
    if (align & (align - 1)) align = 32; /* the bad-alignment cases only need the key */
    uint64_t pos = 0;
    int n_written = 0;
    uint64_t offsets[130];
    int order[130];
    for (int i = 0; i < m->n; i++) {
        if (o->skip && !strcmp(o->skip, m->t[i].gname)) continue;
        order[n_written++] = i;
    }
    if (o->dup_tensor) order[n_written++] = order[0];
    for (int w = 0; w < n_written; w++) {
        ttensor *x = &m->t[order[w]];
        int type = (o->retype && !strcmp(o->retype, x->gname)) ? o->retype_to : x->type;
        int64_t nrows = x->rows ? x->rows : 1;
        int64_t cols = x->cols, rows = x->rows;
        if (o->reshape && !strcmp(o->reshape, x->gname)) { cols = x->rows; rows = x->cols; }
        size_t nbytes = (size_t)(nrows * x->cols / ty_blck(type)) * ty_bytes(type);
        if (w == 0) off->ti_first = b.n;
        bb_str(&b, x->gname);
        if (w == 0) off->ti_first_ndims = b.n;
        if (!strcmp(x->gname, "blk.0.attn_q.weight")) off->ti_q_ndims = b.n;
        bb_u32(&b, x->rows ? 2 : 1);
        if (w == 0) off->ti_first_dims = b.n;
        bb_u64(&b, (uint64_t)cols);
        if (x->rows) bb_u64(&b, (uint64_t)rows);
        if (w == 0) off->ti_first_type = b.n;
        bb_u32(&b, (uint32_t)type);
        if (w == n_written - 1) off->ti_last_offset = b.n;
        bb_u64(&b, pos);
        offsets[w] = pos;
        pos += (nbytes + align - 1) / align * align;
    }
    bb_zero(&b, (size_t)((align - b.n % align) % align));
    off->data_start = b.n;
    for (int w = 0; w < n_written; w++) {
        ttensor *x = &m->t[order[w]];
        int type = (o->retype && !strcmp(o->retype, x->gname)) ? o->retype_to : x->type;
        int64_t nrows = x->rows ? x->rows : 1;
        size_t nbytes = (size_t)(nrows * x->cols / ty_blck(type)) * ty_bytes(type);
        bb_zero(&b, (size_t)(off->data_start + offsets[w] - b.n));
        if (type != x->type) {
            uint8_t *tmp = calloc(1, nbytes);
            bb_put(&b, tmp, nbytes);
            free(tmp);
        } else if (x->permute_heads) {
            uint8_t *tmp = malloc(x->nbytes);
            size_t rb = x->nbytes / (size_t)(x->rows ? x->rows : x->cols);
            converter_permute(x->hf, tmp, x->permute_heads, m->hd, rb);
            bb_put(&b, tmp, x->nbytes);
            free(tmp);
        } else {
            bb_put(&b, x->hf, x->nbytes);
        }
    }
    bb_zero(&b, (size_t)((align - b.n % align) % align));
    write_file(path, b.p, b.n);
    size_t n = b.n;
    free(b.p);
    return n;
}

/* ---------------------------------------------------------------- checks of a loaded model */

static void dequant_ref(const uint8_t *row, int type, int64_t cols, float *out) {
    for (int64_t b = 0; b < cols / ty_blck(type); b++) {
        const uint8_t *p = row + b * ty_bytes(type);
        uint16_t h, hm;
        switch (type) {
        case T_F32: memcpy(&out[b], p, 4); break;
        case T_F16: memcpy(&h, p, 2); out[b] = fp16_to_f32(h); break;
        case T_BF16: memcpy(&h, p, 2); out[b] = bf16_to_f32(h); break;
        case T_Q8_0:
            memcpy(&h, p, 2);
            for (int j = 0; j < 32; j++) out[b * 32 + j] = (float)(int8_t)p[2 + j] * fp16_to_f32(h);
            break;
        case T_Q4_0:
            memcpy(&h, p, 2);
            for (int j = 0; j < 16; j++) {
                out[b * 32 + j] = (float)((p[2 + j] & 15) - 8) * fp16_to_f32(h);
                out[b * 32 + j + 16] = (float)((p[2 + j] >> 4) - 8) * fp16_to_f32(h);
            }
            break;
        case T_Q4_1:
            memcpy(&h, p, 2);
            memcpy(&hm, p + 2, 2);
            for (int j = 0; j < 16; j++) {
                out[b * 32 + j] = (float)(p[4 + j] & 15) * fp16_to_f32(h) + fp16_to_f32(hm);
                out[b * 32 + j + 16] = (float)(p[4 + j] >> 4) * fp16_to_f32(h) + fp16_to_f32(hm);
            }
            break;
        }
    }
}

/* The loaded matrix must hold exactly the HF-order bytes, and its dequantized rows
 * (tensor_dequant_row) must match the ../shared/docs/FORMATS.md formulas. */
static void check_matrix(test_ctx *t_, const llmi_tensor *lt, const ttensor *x) {
    CHECK_MSG(lt->rows == x->rows && lt->cols == x->cols, "%s: shape %lldx%lld", x->gname, (long long)lt->rows,
              (long long)lt->cols);
    if (lt->rows != x->rows || lt->cols != x->cols) return;
    CHECK_MSG(memcmp(lt->data, x->hf, x->nbytes) == 0, "%s: bytes differ from the HF-order original", x->gname);
    size_t rb = x->nbytes / (size_t)x->rows;
    CHECK(lt->row_bytes == rb);
    float *a = malloc((size_t)x->cols * sizeof *a), *r = malloc((size_t)x->cols * sizeof *r);
    for (int64_t row = 0; row < x->rows; row++) {
        tensor_dequant_row(lt, row, a);
        dequant_ref(x->hf + row * rb, x->type, x->cols, r);
        if (memcmp(a, r, (size_t)x->cols * sizeof *a) != 0) {
            CHECK_MSG(0, "%s row %lld: dequantized values differ", x->gname, (long long)row);
            break;
        }
    }
    free(a);
    free(r);
}

static void check_vector(test_ctx *t_, const float *v, const ttensor *x, int permute_hd) {
    CHECK_MSG(v != NULL, "%s missing", x->gname);
    if (!v) return;
    float *r = malloc((size_t)x->cols * sizeof *r);
    dequant_ref(x->hf, x->type, x->cols, r);
    CHECK_MSG(memcmp(v, r, (size_t)x->cols * sizeof *r) == 0, "%s: values differ", x->gname);
    (void)permute_hd;
    free(r);
}

static void check_model(test_ctx *t_, const llmi_model *lm, tmodel *m, bool gguf) {
    const llmi_config *c = &lm->cfg;
    CHECK(c->arch == (m->qwen ? LLMI_ARCH_QWEN2 : LLMI_ARCH_LLAMA));
    CHECK(c->dim == m->dim && c->n_layers == m->n_layers && c->n_heads == m->n_heads && c->n_kv_heads == m->n_kv);
    CHECK(c->head_dim == m->hd && c->ffn_dim == m->ffn && c->n_vocab == m->vocab && c->max_ctx == m->ctx);
    CHECK(c->rope_dim == m->hd);
    CHECK(fabsf(c->norm_eps - m->eps) < 1e-12f && c->rope_theta == m->theta);
    CHECK(c->tie_embeddings == m->tied && c->qkv_bias == m->bias);
    CHECK(strcmp(lm->format, gguf ? "gguf" : "safetensors") == 0);
    CHECK(lm->n_maps >= 1);
    size_t bytes = 0;
    for (int i = 0; i < m->n; i++) bytes += m->t[i].nbytes;
    CHECK_MSG(lm->weight_bytes == bytes, "weight_bytes %zu, expected %zu", lm->weight_bytes, bytes);
    check_matrix(t_, &lm->tok_embd, tfind(m, "token_embd.weight"));
    check_vector(t_, lm->out_norm, tfind(m, "output_norm.weight"), 0);
    if (m->tied) {
        CHECK(lm->lm_head.data == lm->tok_embd.data && lm->lm_head.owned == NULL);
        CHECK(lm->lm_head.rows == m->vocab && lm->lm_head.cols == m->dim);
    } else {
        check_matrix(t_, &lm->lm_head, tfind(m, "output.weight"));
    }
    char n[64];
    for (int l = 0; l < m->n_layers; l++) {
        const llmi_layer *L = &lm->layers[l];
#define M(field, nm) do { snprintf(n, sizeof n, nm, l); check_matrix(t_, &L->field, tfind(m, n)); } while (0)
#define V(field, nm) do { snprintf(n, sizeof n, nm, l); check_vector(t_, L->field, tfind(m, n), 0); } while (0)
        M(wq, "blk.%d.attn_q.weight"); M(wk, "blk.%d.attn_k.weight"); M(wv, "blk.%d.attn_v.weight");
        M(wo, "blk.%d.attn_output.weight"); M(w_gate, "blk.%d.ffn_gate.weight"); M(w_up, "blk.%d.ffn_up.weight");
        M(w_down, "blk.%d.ffn_down.weight");
        V(attn_norm, "blk.%d.attn_norm.weight"); V(ffn_norm, "blk.%d.ffn_norm.weight");
        if (m->bias) {
            V(bq, "blk.%d.attn_q.bias"); V(bk, "blk.%d.attn_k.bias"); V(bv, "blk.%d.attn_v.bias");
        } else {
            CHECK(L->bq == NULL && L->bk == NULL && L->bv == NULL);
        }
#undef M
#undef V
    }
}

static int load_ok(test_ctx *t_, const char *path, bool no_tok, llmi_model *lm) {
    llmi_status st;
    llmi_status_clear(&st);
    llmi_load_opts o = {.no_tokenizer = no_tok};
    int rc = model_load(path, &o, lm, &st);
    CHECK_MSG(rc == 0, "load of %s failed: %s", path, st.msg);
    return rc;
}

/* ================================================================ GGUF: valid files */

TEST(loader_gguf_permutation_roundtrip) {
    rng r = {test_seed() | 1};
    for (int trial = 0; trial < 20; trial++) {
        int n_head = 1 + (int)(rng_next(&r) % 6), hd = 2 * (1 + (int)(rng_next(&r) % 8));
        size_t rb = 4 * (1 + rng_next(&r) % 5);
        size_t n = (size_t)n_head * hd * rb;
        uint8_t *hf = malloc(n), *perm = malloc(n), *back = malloc(n);
        for (size_t i = 0; i < n; i++) hf[i] = (uint8_t)rng_next(&r);
        converter_permute(hf, perm, n_head, hd, rb);
        gguf_unpermute_rows(perm, back, n_head, hd, rb);
        CHECK_MSG(memcmp(back, hf, n) == 0, "n_head %d hd %d: un-permutation does not restore HF order", n_head, hd);
        if (hd > 2) CHECK(memcmp(perm, hf, n) != 0 || n_head * hd <= 2); /* the permutation really moves rows */
        free(hf);
        free(perm);
        free(back);
    }
    /* the documented example: hd 4, HF rows 0 1 2 3 -> GGUF rows 0 2 1 3 */
    float hf4[4] = {0, 1, 2, 3}, g4[4], b4[4];
    converter_permute((uint8_t *)hf4, (uint8_t *)g4, 1, 4, 4);
    CHECK(g4[0] == 0 && g4[1] == 2 && g4[2] == 1 && g4[3] == 3);
    gguf_unpermute_rows(g4, b4, 1, 4, 4);
    CHECK(b4[0] == 0 && b4[1] == 1 && b4[2] == 2 && b4[3] == 3);
}

static void gguf_roundtrip(test_ctx *t_, bool qwen, bool tied, bool bias, uint32_t align) {
    rng r = {test_seed() * 7 + 3};
    tmodel m;
    tmodel_init(&m, qwen, tied, bias, false, &r);
    char *dir = make_tmpdir(), path[512];
    snprintf(path, sizeof path, "%s/tiny.gguf", dir);
    gguf_opts o = {.alignment = align};
    gguf_write(path, &m, &o, NULL);
    llmi_model lm;
    if (load_ok(t_, path, true, &lm) == 0) {
        check_model(t_, &lm, &m, true);
        CHECK(strcmp(lm.source_path, path) == 0);
        CHECK(strcmp(lm.cfg.name, "tiny test") == 0);
        CHECK(lm.tok == NULL);
        model_free(&lm);
        CHECK(lm.layers == NULL && lm.n_maps == 0);
        model_free(&lm); /* twice is harmless */
    }
    tmodel_free(&m);
    rm_tree(dir);
    free(dir);
}

TEST(loader_gguf_llama_tied) { gguf_roundtrip(t_, false, true, false, 0); }
TEST(loader_gguf_llama_untied_bias_align64) { gguf_roundtrip(t_, false, false, true, 64); }
TEST(loader_gguf_qwen2) { gguf_roundtrip(t_, true, false, true, 0); }
TEST(loader_gguf_qwen2_tied_align1) { gguf_roundtrip(t_, true, true, true, 1); } /* misaligned data gets copied */

TEST(loader_gguf_version2_accepted) {
    rng r = {test_seed() + 11};
    tmodel m;
    tmodel_init(&m, false, true, false, false, &r);
    char *dir = make_tmpdir(), path[512];
    snprintf(path, sizeof path, "%s/v2.gguf", dir);
    gguf_opts o = {.version = 2};
    gguf_write(path, &m, &o, NULL);
    llmi_model lm;
    if (load_ok(t_, path, true, &lm) == 0) model_free(&lm);
    tmodel_free(&m);
    rm_tree(dir);
    free(dir);
}

/* ================================================================ GGUF: attacks */

typedef struct gguf_case { char *dir; char path[512]; uint8_t *bytes; size_t n; gguf_offs off; tmodel m; } gguf_case;

static void gcase_init(gguf_case *c, const gguf_opts *o, bool qwen) {
    rng r = {test_seed() * 3 + 1};
    tmodel_init(&c->m, qwen, true, false, false, &r);
    c->dir = make_tmpdir();
    snprintf(c->path, sizeof c->path, "%s/model.gguf", c->dir);
    gguf_opts def = {0};
    gguf_write(c->path, &c->m, o ? o : &def, &c->off);
    c->bytes = read_all(c->path, &c->n);
}
static void gcase_free(gguf_case *c) {
    free(c->bytes);
    tmodel_free(&c->m);
    rm_tree(c->dir);
    free(c->dir);
}
/* Writes the pristine bytes with one patch applied to path. */
static void gpatch(gguf_case *c, size_t off, const void *v, size_t n) {
    uint8_t *b = malloc(c->n);
    memcpy(b, c->bytes, c->n);
    memcpy(b + off, v, n);
    write_file(c->path, b, c->n);
    free(b);
}
static void gpatch32(gguf_case *c, size_t off, uint32_t v) { gpatch(c, off, &v, 4); }
static void gpatch64(gguf_case *c, size_t off, uint64_t v) { gpatch(c, off, &v, 8); }

TEST(loader_gguf_truncated_everywhere) {
    gguf_opts o = {.tokenizer = true};
    gguf_case c;
    gcase_init(&c, &o, false);
    int cuts = 0;
    /* every cut in the header and first keys, a fine stride through the rest of the
     * metadata and tensor infos, then a coarse one through the data (the last tensor
     * needs no padding, so every cut removes real bytes) */
    for (size_t cut = 0; cut < c.n; cut += cut < 256 ? 1 : cut < c.off.data_start + 64 ? 7 : 331) {
        write_file(c.path, c.bytes, cut);
        EXPECT_FAIL(c.path, cut % 2 == 0, NULL);
        cuts++;
    }
    CHECK(cuts > 250);
    /* one byte short: the last tensor's last byte is missing (bounds are exact, not off by one) */
    write_file(c.path, c.bytes, c.n - 1);
    EXPECT_FAIL(c.path, true, "past the end");
    gcase_free(&c);
}

TEST(loader_gguf_header_attacks) {
    gguf_case c;
    gcase_init(&c, NULL, false);
    gpatch(&c, 0, "GGUG", 4);
    EXPECT_FAIL(c.path, true, "not a GGUF file");
    gpatch32(&c, 4, 0); EXPECT_FAIL(c.path, true, "version 0");
    gpatch32(&c, 4, 1); EXPECT_FAIL(c.path, true, "version 1");
    gpatch32(&c, 4, 4); EXPECT_FAIL(c.path, true, "version 4");
    gpatch32(&c, 4, 0x03000000u); EXPECT_FAIL(c.path, true, "version");
    gpatch64(&c, 8, UINT64_MAX); EXPECT_FAIL(c.path, true, "tensor count");
    gpatch64(&c, 8, 1ull << 40); EXPECT_FAIL(c.path, true, "tensor count");
    gpatch64(&c, 16, UINT64_MAX / 2); EXPECT_FAIL(c.path, true, "key/value count");
    gpatch64(&c, 16, 1ull << 33); EXPECT_FAIL(c.path, true, "key/value count");
    /* a string length that would wrap or run past the end */
    gpatch64(&c, c.off.first_key_len, UINT64_MAX); EXPECT_FAIL(c.path, true, "past the end");
    gpatch64(&c, c.off.first_key_len, c.n + 1); EXPECT_FAIL(c.path, true, "past the end");
    gpatch64(&c, c.off.first_key_len, 0); EXPECT_FAIL(c.path, true, NULL);
    gcase_free(&c);
}

TEST(loader_gguf_array_attacks) {
    gguf_opts o = {.tokenizer = true};
    gguf_case c;
    gcase_init(&c, &o, false);
    gpatch64(&c, c.off.tokens_count, 1ull << 62); EXPECT_FAIL(c.path, true, "cannot fit");
    gpatch64(&c, c.off.tokens_count, UINT64_MAX); EXPECT_FAIL(c.path, true, NULL);
    gpatch64(&c, c.off.tokens_first_len, 1ull << 62); EXPECT_FAIL(c.path, true, "past the end");
    gpatch32(&c, c.off.tokens_elem_type, 9); EXPECT_FAIL(c.path, true, "element type");      /* nested array */
    gpatch32(&c, c.off.tokens_elem_type, 77); EXPECT_FAIL(c.path, true, "element type");
    /* tokens declared as u64 values: parses (the bytes happen to fit) or not, but the
     * tokenizer must refuse an array of the wrong element type */
    gpatch32(&c, c.off.tokens_elem_type, 10); EXPECT_FAIL(c.path, false, NULL);
    gcase_free(&c);

    /* scores as i32: a well-formed file whose array has the wrong element type */
    gguf_opts o2 = {.tokenizer = true, .scores_i32 = true};
    gcase_init(&c, &o2, false);
    EXPECT_FAIL(c.path, false, "tokenizer.ggml.scores");
    gcase_free(&c);
    gguf_opts o3 = {.block_count_str = true};
    gcase_init(&c, &o3, false);
    EXPECT_FAIL(c.path, true, "block_count");
    gcase_free(&c);
}

TEST(loader_gguf_tensor_info_attacks) {
    gguf_case c;
    gcase_init(&c, NULL, false);
    gpatch32(&c, c.off.ti_first_ndims, 5); EXPECT_FAIL(c.path, true, "dimensions");
    gpatch32(&c, c.off.ti_first_ndims, UINT32_MAX); EXPECT_FAIL(c.path, true, "dimensions");
    uint64_t big[2] = {1ull << 40, 1ull << 40};
    gpatch(&c, c.off.ti_first_dims, big, 16); EXPECT_FAIL(c.path, true, "overflow");
    gpatch64(&c, c.off.ti_first_dims, 1ull << 63); EXPECT_FAIL(c.path, true, "negative");
    uint64_t huge[2] = {1ull << 35, 1ull << 27}; /* no element overflow, far past the end */
    gpatch(&c, c.off.ti_first_dims, huge, 16); EXPECT_FAIL(c.path, true, NULL);
    gpatch64(&c, c.off.ti_first_dims, 48); EXPECT_FAIL(c.path, true, "multiple of the Q8_0 block");
    gpatch32(&c, c.off.ti_first_type, 4); EXPECT_FAIL(c.path, true, "invalid type");    /* removed Q4_2 */
    gpatch32(&c, c.off.ti_first_type, 1000); EXPECT_FAIL(c.path, true, "invalid type");
    gpatch64(&c, c.off.ti_last_offset, 1ull << 40); EXPECT_FAIL(c.path, true, "offset");
    gpatch64(&c, c.off.ti_last_offset, UINT64_MAX - 7); EXPECT_FAIL(c.path, true, "offset");
    gpatch64(&c, c.off.ti_last_offset, 0); EXPECT_FAIL(c.path, true, "offset");             /* overlap */
    /* a tensor name past the 63-byte limit */
    gpatch64(&c, c.off.ti_first, 64); EXPECT_FAIL(c.path, true, NULL);
    /* data cut short: the last tensor runs past the end of the file */
    write_file(c.path, c.bytes, c.n - 40);
    EXPECT_FAIL(c.path, true, "past the end");
    gcase_free(&c);
}

TEST(loader_gguf_alignment_attacks) {
    gguf_opts o = {.alignment = 64};
    gguf_case c;
    gcase_init(&c, &o, false);
    /* find the u32 value of general.alignment: the 64 right after its key and type */
    size_t at = 0;
    for (size_t i = 0; i + 17 < c.n; i++)
        if (!memcmp(c.bytes + i, "general.alignment", 17)) { at = i + 17 + 4; break; }
    CHECK(at != 0);
    gpatch32(&c, at, 0); EXPECT_FAIL(c.path, true, "power of two");
    gpatch32(&c, at, 3); EXPECT_FAIL(c.path, true, "power of two");
    gpatch32(&c, at, 48); EXPECT_FAIL(c.path, true, "power of two");
    gpatch32(&c, at, 1u << 31); EXPECT_FAIL(c.path, true, NULL); /* data start past the end */
    gpatch32(&c, at - 4, 5); EXPECT_FAIL(c.path, true, "general.alignment");  /* i32 instead of u32 */
    gcase_free(&c);
}

TEST(loader_gguf_model_attacks) {
    gguf_case c;
    gguf_opts o;
    memset(&o, 0, sizeof o);
    o.block_count = LLMI_MAX_LAYERS + 1;
    gcase_init(&c, &o, false); EXPECT_FAIL(c.path, true, "block_count"); gcase_free(&c);
    o.block_count = 3; /* more layers than the file has tensors for */
    gcase_init(&c, &o, false); EXPECT_FAIL(c.path, true, "missing tensor blk.2."); gcase_free(&c);
    gcase_init(&c, NULL, false);
    gpatch32(&c, c.off.block_count_val, 0x7fffffff); EXPECT_FAIL(c.path, true, "block_count");
    gcase_free(&c);
    memset(&o, 0, sizeof o);
    o.skip = "blk.1.ffn_up.weight";
    gcase_init(&c, &o, false); EXPECT_FAIL(c.path, true, "missing tensor blk.1.ffn_up.weight"); gcase_free(&c);
    o.skip = "output_norm.weight";
    gcase_init(&c, &o, false); EXPECT_FAIL(c.path, true, "missing tensor output_norm.weight"); gcase_free(&c);
    memset(&o, 0, sizeof o);
    o.retype = "blk.0.ffn_down.weight";
    o.retype_to = T_Q8_1;
    gcase_init(&c, &o, false); EXPECT_FAIL(c.path, true, "unsupported tensor type Q8_1 in blk.0.ffn_down.weight");
    gcase_free(&c);
    o.retype = "blk.1.attn_norm.weight";
    o.retype_to = T_Q8_0;
    gcase_init(&c, &o, false); EXPECT_FAIL(c.path, true, "blk.1.attn_norm.weight"); gcase_free(&c);
    memset(&o, 0, sizeof o);
    o.reshape = "blk.0.attn_k.weight";
    gcase_init(&c, &o, false); EXPECT_FAIL(c.path, true, "blk.0.attn_k.weight has shape"); gcase_free(&c);
    memset(&o, 0, sizeof o);
    o.arch = "gpt2";
    gcase_init(&c, &o, false); EXPECT_FAIL(c.path, true, "unsupported architecture gpt2"); gcase_free(&c);
    memset(&o, 0, sizeof o);
    o.dup_key = true;
    gcase_init(&c, &o, false); EXPECT_FAIL(c.path, true, "duplicate key"); gcase_free(&c);
    memset(&o, 0, sizeof o);
    o.dup_tensor = true;
    gcase_init(&c, &o, false); EXPECT_FAIL(c.path, true, "duplicate tensor"); gcase_free(&c);
    /* a partial RoPE is Phi-3's (Phi-4-mini); a llama file with one, or with rotated dims
     * odd or past head_dim, is refused */
    memset(&o, 0, sizeof o);
    o.rope_dim = 14;   /* of head_dim 16 */
    gcase_init(&c, &o, false); EXPECT_FAIL(c.path, true, "a partial RoPE is supported for phi3 only"); gcase_free(&c);
    o.rope_dim = 3;
    gcase_init(&c, &o, false); EXPECT_FAIL(c.path, true, "rope dimension 3 must be even"); gcase_free(&c);
    o.rope_dim = 32;
    gcase_init(&c, &o, false); EXPECT_FAIL(c.path, true, "must be even and in [2, head_dim"); gcase_free(&c);
    /* a matrix stored as 1-D: its shape must be rejected */
    gcase_init(&c, NULL, false);
    gpatch32(&c, c.off.ti_q_ndims, 1);
    EXPECT_FAIL(c.path, true, NULL);
    gcase_free(&c);
}

TEST(loader_gguf_tokenizer_metadata_attacks) {
    gguf_case c;
    gguf_opts o = {.tokenizer = true, .bos = 9999};
    gcase_init(&c, &o, false); EXPECT_FAIL(c.path, false, "bos_token_id"); gcase_free(&c);
    gguf_opts o2 = {.tokenizer = true, .pre = "klingon"};
    gcase_init(&c, &o2, false); EXPECT_FAIL(c.path, false, "pre-tokenizer"); gcase_free(&c);
    gguf_opts o3 = {.tokenizer = true, .n_tokens = 41}; /* one more token than embedding rows */
    gcase_init(&c, &o3, false); EXPECT_FAIL(c.path, false, "tokens"); gcase_free(&c);
}

/* Valid tokenizer metadata reaches tok_create with the ids, flags and end-of-generation
 * tokens the file implies (byte-level BPE with explicit ids; SentencePiece defaults). */
TEST(loader_gguf_tokenizer_spec) {
    gguf_case c;
    gguf_opts o = {.tokenizer = true};
    gcase_init(&c, &o, false);
    llmi_model lm;
    if (load_ok(t_, c.path, false, &lm) == 0) {
        CHECK(lm.tok != NULL);
        if (lm.tok) {
            CHECK(tok_n_vocab(lm.tok) == 40 && tok_bos(lm.tok) == 1 && tok_eos(lm.tok) == 2 && !tok_add_bos(lm.tok));
            CHECK(tok_is_eog(lm.tok, 2) && tok_is_eog(lm.tok, 0) && !tok_is_eog(lm.tok, 5));
        }
        model_free(&lm);
    }
    gcase_free(&c);
    /* optional ids out of range ("none" stored as -1 or as the vocab size) are dropped */
    const uint32_t pads[2] = {0xffffffffu, 40};
    for (int k = 0; k < 2; k++) {
        gguf_opts op = {.tokenizer = true, .pad_raw = pads[k]};
        gcase_init(&c, &op, false);
        if (load_ok(t_, c.path, false, &lm) == 0) {
            CHECK(lm.tok && tok_eos(lm.tok) == 2);
            model_free(&lm);
        }
        gcase_free(&c);
    }
    gguf_opts o2 = {.tokenizer = true, .spm = true};
    gcase_init(&c, &o2, false);
    if (load_ok(t_, c.path, false, &lm) == 0) {
        CHECK(lm.tok != NULL);
        if (lm.tok) {
            CHECK(tok_n_vocab(lm.tok) == 40 && tok_bos(lm.tok) == 1 && tok_eos(lm.tok) == 2 && tok_add_bos(lm.tok));
            CHECK(tok_is_eog(lm.tok, 2) && !tok_is_eog(lm.tok, 1));
        }
        model_free(&lm);
    }
    gcase_free(&c);
}

TEST(loader_gguf_random_corruption) {
    gguf_opts o = {.tokenizer = true};
    gguf_case c;
    gcase_init(&c, &o, false);
    unsigned long long seed = test_seed();
    rng r = {seed * 2654435761u + 17};
    uint8_t *b = malloc(c.n);
    for (int it = 0; it < 300; it++) {
        memcpy(b, c.bytes, c.n);
        int flips = 1 + (int)(rng_next(&r) % 8);
        /* mostly hit the metadata and infos, where the parser lives */
        size_t span = (rng_next(&r) % 4) ? c.off.data_start : c.n;
        for (int k = 0; k < flips; k++) {
            size_t at = (size_t)(rng_next(&r) % span);
            if (rng_next(&r) % 3 == 0) b[at] = (uint8_t)rng_next(&r);
            else b[at] ^= (uint8_t)(1u << (rng_next(&r) % 8));
            if (rng_next(&r) % 5 == 0 && at + 8 <= c.n) { uint64_t v = rng_next(&r); memcpy(b + at, &v, 8); }
        }
        size_t n = (rng_next(&r) % 10 == 0) ? (size_t)(rng_next(&r) % c.n) : c.n;
        write_file(c.path, b, n);
        load_any(t_, c.path, it % 2 == 0);
    }
    free(b);
    gcase_free(&c);
}

/* Llama-3 GGUFs carry rope scaling as rope_freqs.weight; the llama3 pattern (computed
 * here as the converter does) maps to LLMI_ROPE_SCALING_LLAMA3, anything else is refused. */
TEST(loader_gguf_rope_freqs) {
    rng r = {test_seed() + 21};
    for (int k = 0; k < 3; k++) {
        tmodel m;
        tmodel_init(&m, false, true, false, false, &r);
        m.theta = 500000.0f;
        ttensor *x = &m.t[m.n++];
        memset(x, 0, sizeof *x);
        snprintf(x->gname, sizeof x->gname, "rope_freqs.weight");
        x->cols = m.hd / 2;
        x->type = T_F32;
        x->nbytes = (size_t)x->cols * 4;
        x->hf = malloc(x->nbytes);
        float factor = k == 0 ? 8.0f : 32.0f;
        for (int i = 0; i < m.hd / 2; i++) {
            double freq = 1.0 / pow(500000.0, 2.0 * i / m.hd), wl = 2 * M_PI / freq, f;
            if (wl < 8192.0 / 4) f = 1;
            else if (wl > 8192.0 / 1) f = factor;
            else {
                double smooth = (8192.0 / wl - 1) / (4 - 1);
                f = 1 / ((1 - smooth) / factor + smooth);
            }
            float v = k == 2 ? 1.0f + (float)i : (float)f; /* k == 2: not a llama3 pattern */
            memcpy(x->hf + 4 * i, &v, 4);
        }
        char *dir = make_tmpdir(), path[512];
        snprintf(path, sizeof path, "%s/l3.gguf", dir);
        gguf_opts o = {0};
        gguf_write(path, &m, &o, NULL);
        if (k < 2) {
            llmi_model lm;
            if (load_ok(t_, path, true, &lm) == 0) {
                CHECK(lm.cfg.rope_scaling == LLMI_ROPE_SCALING_LLAMA3 && lm.cfg.rope_factor == factor);
                CHECK(lm.cfg.rope_low_freq_factor == 1.0f && lm.cfg.rope_high_freq_factor == 4.0f);
                CHECK(lm.cfg.rope_orig_max_pos == 8192 && lm.cfg.rope_theta == 500000.0f);
                model_free(&lm);
            }
        } else {
            EXPECT_FAIL(path, true, "does not match llama3");
        }
        tmodel_free(&m);
        rm_tree(dir);
        free(dir);
    }
}

/* ================================================================ safetensors writer */

typedef struct st_entry { const char *name; const char *dtype; int64_t shape[4]; int n_dims; const uint8_t *data; size_t n; } st_entry;

/* Builds a valid safetensors image of entries (data in entry order), header padded to 8. */
static size_t st_build(bbuf *out, const st_entry *e, int n) {
    char *h = malloc(65536);
    size_t hl = 0;
    uint64_t pos = 0;
    hl += (size_t)snprintf(h + hl, 65536 - hl, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        hl += (size_t)snprintf(h + hl, 65536 - hl, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", e[i].name, e[i].dtype);
        for (int d = 0; d < e[i].n_dims; d++)
            hl += (size_t)snprintf(h + hl, 65536 - hl, "%s%lld", d ? "," : "", (long long)e[i].shape[d]);
        hl += (size_t)snprintf(h + hl, 65536 - hl, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)pos,
                               (unsigned long long)(pos + e[i].n));
        pos += e[i].n;
    }
    h[hl++] = '}';
    while (hl % 8) h[hl++] = ' ';
    memset(out, 0, sizeof *out);
    bb_u64(out, hl);
    bb_put(out, h, hl);
    for (int i = 0; i < n; i++) bb_put(out, e[i].data, e[i].n);
    free(h);
    return out->n;
}

/* Writes a raw file: header JSON text as given, then n data bytes. */
static void st_raw(const char *path, const char *json, size_t data_n) {
    bbuf b = {0};
    bb_u64(&b, strlen(json));
    bb_put(&b, json, strlen(json));
    bb_zero(&b, data_n);
    write_file(path, b.p, b.n);
    free(b.p);
}

static void hf_config_text(char *buf, size_t cap, const tmodel *m, const char *extra) {
    snprintf(buf, cap,
             "{\"architectures\": [\"%s\"], \"hidden_size\": %d, \"num_hidden_layers\": %d, "
             "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"intermediate_size\": %d, "
             "\"vocab_size\": %d, \"max_position_embeddings\": %d, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, "
             "\"tie_word_embeddings\": %s, \"hidden_act\": \"silu\"%s%s%s}",
             m->qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM", m->dim, m->n_layers, m->n_heads, m->n_kv, m->ffn,
             m->vocab, m->ctx, m->tied ? "true" : "false",
             extra && strstr(extra, "rope_scaling") ? "" : ", \"rope_scaling\": null",
             m->bias && !m->qwen ? ", \"attention_bias\": true" : "", extra ? extra : "");
}

/* Writes the tiny model as a HF directory: one file, or two shards plus the index. */
static void hf_write(const char *dir, tmodel *m, bool sharded, const char *config_extra) {
    char p[768], cfg[2048];
    hf_config_text(cfg, sizeof cfg, m, config_extra);
    snprintf(p, sizeof p, "%s/config.json", dir);
    write_text(p, cfg);
    st_entry e[2][128];
    int ne[2] = {0, 0};
    for (int i = 0; i < m->n; i++) {
        ttensor *x = &m->t[i];
        int s = sharded ? (i % 2) : 0;
        st_entry *y = &e[s][ne[s]++];
        y->name = x->hname;
        y->dtype = ty_st(x->type);
        y->n_dims = x->rows ? 2 : 1;
        y->shape[0] = x->rows ? x->rows : x->cols;
        y->shape[1] = x->cols;
        y->data = x->hf;
        y->n = x->nbytes;
    }
    for (int s = 0; s < (sharded ? 2 : 1); s++) {
        bbuf b;
        st_build(&b, e[s], ne[s]);
        if (sharded) snprintf(p, sizeof p, "%s/model-0000%d-of-00002.safetensors", dir, s + 1);
        else snprintf(p, sizeof p, "%s/model.safetensors", dir);
        write_file(p, b.p, b.n);
        free(b.p);
    }
    if (sharded) {
        bbuf j = {0};
        const char *hd = "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {";
        bb_put(&j, hd, strlen(hd));
        for (int i = 0; i < m->n; i++) {
            char line[256];
            snprintf(line, sizeof line, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", i ? ", " : "", m->t[i].hname,
                     i % 2 + 1);
            bb_put(&j, line, strlen(line));
        }
        bb_put(&j, "}}", 3);
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
        write_text(p, (const char *)j.p);
        free(j.p);
    }
}

/* ================================================================ HF: valid directories */

static void hf_roundtrip(test_ctx *t_, bool qwen, bool tied, bool bias, bool sharded) {
    rng r = {test_seed() * 5 + 9};
    tmodel m;
    tmodel_init(&m, qwen, tied, bias, true, &r);
    char *dir = make_tmpdir();
    hf_write(dir, &m, sharded, NULL);
    llmi_model lm;
    if (load_ok(t_, dir, true, &lm) == 0) {
        check_model(t_, &lm, &m, false);
        CHECK(lm.n_maps == (sharded ? 2 : 1));
        CHECK(strcmp(lm.source_path, dir) == 0);
        CHECK(strncmp(lm.cfg.name, "llmi_loader_", 12) == 0);
        model_free(&lm);
    }
    tmodel_free(&m);
    rm_tree(dir);
    free(dir);
}

TEST(loader_hf_llama_tied) { hf_roundtrip(t_, false, true, false, false); }
TEST(loader_hf_llama_bias_untied) { hf_roundtrip(t_, false, false, true, false); }
TEST(loader_hf_qwen2_sharded) { hf_roundtrip(t_, true, false, true, true); }

TEST(loader_hf_config_fields) {
    rng r = {test_seed() + 5};
    tmodel m;
    tmodel_init(&m, false, true, false, true, &r);
    char *dir = make_tmpdir();
    hf_write(dir, &m, false, ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                             "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}");
    llmi_model lm;
    if (load_ok(t_, dir, true, &lm) == 0) {
        CHECK(lm.cfg.rope_scaling == LLMI_ROPE_SCALING_LLAMA3 && lm.cfg.rope_factor == 8.0f);
        CHECK(lm.cfg.rope_low_freq_factor == 1.0f && lm.cfg.rope_high_freq_factor == 4.0f);
        CHECK(lm.cfg.rope_orig_max_pos == 8192);
        model_free(&lm);
    }
    hf_write(dir, &m, false, ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}");
    if (load_ok(t_, dir, true, &lm) == 0) {
        CHECK(lm.cfg.rope_scaling == LLMI_ROPE_SCALING_LINEAR && lm.cfg.rope_factor == 2.0f);
        model_free(&lm);
    }
    /* YaRN's defaults and precedence, as transformers: the top-level original context wins over
     * rope_scaling's; factor absent = max_position_embeddings / original; mscale over
     * mscale_all_dim gives the attention factor; betas 0 mean the defaults */
    hf_write(dir, &m, false, ", \"original_max_position_embeddings\": 16, \"rope_scaling\": {\"type\": \"yarn\", "
                             "\"original_max_position_embeddings\": 8, \"mscale\": 2.0, \"mscale_all_dim\": 1.0, "
                             "\"beta_fast\": 0, \"beta_slow\": null}");
    if (load_ok(t_, dir, true, &lm) == 0) {
        const float f = (float)lm.cfg.max_ctx / 16.0f, want = (float)((0.2 * log(f) + 1) / (0.1 * log(f) + 1));
        CHECK(lm.cfg.rope_scaling == LLMI_ROPE_SCALING_YARN && lm.cfg.rope_orig_max_pos == 16);
        CHECK(lm.cfg.rope_factor == f && f > 1);
        CHECK(fabsf(lm.cfg.rope_attn_factor - want) < 1e-6f);
        CHECK(lm.cfg.rope_yarn_beta_fast == 32 && lm.cfg.rope_yarn_beta_slow == 1 && !lm.cfg.rope_yarn_no_truncate);
        model_free(&lm);
    }
    tmodel_free(&m);
    rm_tree(dir);
    free(dir);
}

/* config.json text cfg (cap bytes) with extra, ", \"key\": value" text, put before its
 * closing brace and the first "key" of cfg blanked ("xey"): cJSON keeps the first of
 * duplicate keys, so the blanking makes extra's the one read. */
static void config_override(char *cfg, size_t cap, const char *extra) {
    char key[64];
    const char *k0 = strchr(extra, '"'), *k1 = strchr(k0 + 1, '"');
    snprintf(key, sizeof key, "%.*s", (int)(k1 - k0 + 1), k0);
    char *at = strstr(cfg, key), *end = strrchr(cfg, '}');
    if (at) at[1] = 'x';
    if (end) snprintf(end, cap - (size_t)(end - cfg), "%s}", extra);
}

/* $TESTDATA/rel (testdata when unset) into buf. */
static const char *td_path(char *buf, size_t cap, const char *rel) {
    const char *td = getenv("TESTDATA");
    snprintf(buf, cap, "%s/%s", td ? td : "testdata", rel);
    return buf;
}

static bool copy_file(const char *from, const char *to) {
    size_t n;
    uint8_t *b = read_all(from, &n);
    if (!b) return false;
    write_file(to, b, n);
    free(b);
    return true;
}

/* config.json of testdata/hf/gemma2-classic (Gemma 2's released form, no soft-cap keys)
 * with extra (", \"key\": value" text, the key blanked in the original so the new one is
 * read; NULL: as committed), written into dir beside a copy of its weights. */
static void gemma2_config(const char *dir, const char *extra) {
    char src[600], dst[700];
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    if (access(dst, R_OK) != 0) copy_file(td_path(src, sizeof src, "hf/gemma2-classic/model.safetensors"), dst);
    td_path(src, sizeof src, "hf/gemma2-classic/config.json");
    size_t n;
    char *cfg = (char *)read_all(src, &n), *out = malloc(n + 512);
    if (!cfg || !out) { free(cfg); free(out); return; }
    memcpy(out, cfg, n);
    out[n] = '\0';
    if (extra) config_override(out, n + 512, extra);
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    write_text(dst, out);
    free(cfg);
    free(out);
}

/* Gemma 2's config.json as transformers reads it: absent soft caps are 50 (scores) and 30
 * (logits), null ones none; without layer_types the even layers slide, with it the list
 * decides; the scale is query_pre_attn_scalar^-1/2; one RoPE (rope_theta, 10000 when
 * absent) for every layer; no q/k norms.  Bad values: one line naming the key. */
TEST(loader_gemma2_config_fields) {
    char *dir = make_tmpdir();
    llmi_model lm;
    gemma2_config(dir, NULL);
    if (load_ok(t_, dir, true, &lm) == 0) {
        const llmi_config *c = &lm.cfg;
        CHECK(c->arch == LLMI_ARCH_GEMMA2 && c->attn_softcap == 50.0f && c->final_softcap == 30.0f);
        CHECK(c->sliding_window == 5 && c->layer_sliding[0] && !c->layer_sliding[1] && c->layer_sliding[2]);
        CHECK(fabsf(c->attn_scale - 1.0f / sqrtf(24.0f)) < 1e-7f && c->rope_theta == 10000.0f && c->rope_theta_local == 0);
        CHECK(!c->qk_norm && c->post_norms && c->act == LLMI_ACT_GELU_TANH && c->embed_scale == 8.0f);
        CHECK(lm.layers[0].q_norm == NULL && lm.layers[2].post_ffn_norm != NULL);
        model_free(&lm);
    }
    gemma2_config(dir, ", \"attn_logit_softcapping\": null, \"final_logit_softcapping\": 12.5, "
                       "\"layer_types\": [\"full_attention\", \"sliding_attention\", \"full_attention\"]");
    if (load_ok(t_, dir, true, &lm) == 0) {
        CHECK(lm.cfg.attn_softcap == 0 && lm.cfg.final_softcap == 12.5f);
        CHECK(!lm.cfg.layer_sliding[0] && lm.cfg.layer_sliding[1] && !lm.cfg.layer_sliding[2]);
        model_free(&lm);
    }
    gemma2_config(dir, ", \"sliding_window\": null");
    if (load_ok(t_, dir, true, &lm) == 0) {
        CHECK(config_layer_window(&lm.cfg, 0) == 0 && config_layer_window(&lm.cfg, 2) == 0);
        model_free(&lm);
    }
    gemma2_config(dir, ", \"attn_logit_softcapping\": 0");
    EXPECT_FAIL(dir, true, "attn_logit_softcapping must be > 0");
    gemma2_config(dir, ", \"final_logit_softcapping\": -30");
    EXPECT_FAIL(dir, true, "final_logit_softcapping must be > 0");
    gemma2_config(dir, ", \"final_logit_softcapping\": \"30\"");
    EXPECT_FAIL(dir, true, "final_logit_softcapping must be a finite number");
    gemma2_config(dir, ", \"attn_logit_softcapping\": 1e-9");
    EXPECT_FAIL(dir, true, "soft cap");
    gemma2_config(dir, ", \"hidden_activation\": \"silu\"");
    EXPECT_FAIL(dir, true, "gelu_pytorch_tanh");
    gemma2_config(dir, ", \"layer_types\": [\"full_attention\"]");
    EXPECT_FAIL(dir, true, "layer_types must list one type per layer (3)");
    rm_tree(dir);
    free(dir);
}

/* Gemma 2's GGUF keys as llama.cpp reads them (src/models/gemma2.cpp): with
 * attn_logit_softcapping, final_logit_softcapping and attention.sliding_window renamed out of
 * the way (the same bytes, one letter changed, so the file stays valid), the defaults 50, 30
 * and 4096; the even layers slide (pattern 2); 1/sqrt(head_dim) as the scale. */
TEST(loader_gemma2_gguf_defaults) {
    char src[600], dst[700];
    td_path(src, sizeof src, "hf/gemma2-capped.f32.gguf");
    size_t n;
    uint8_t *b = read_all(src, &n);
    CHECK_MSG(b != NULL, "%s: committed test data missing", src);
    if (!b) return;
    char *dir = make_tmpdir();
    snprintf(dst, sizeof dst, "%s/edited.gguf", dir);
    llmi_model lm;
    if (load_ok(t_, src, true, &lm) == 0) {   /* the file's own values */
        CHECK(lm.cfg.arch == LLMI_ARCH_GEMMA2 && lm.cfg.attn_softcap == 0.75f && lm.cfg.final_softcap == 2.5f);
        CHECK(lm.cfg.sliding_window == 6 && lm.cfg.layer_sliding[0] && !lm.cfg.layer_sliding[1] &&
              lm.cfg.layer_sliding[2] && !lm.cfg.layer_sliding[3]);
        CHECK(fabsf(lm.cfg.attn_scale - 1.0f / sqrtf(32.0f)) < 1e-7f && lm.cfg.rope_theta_local == 0 && !lm.cfg.qk_norm);
        model_free(&lm);
    }
    const char *keys[3] = {"gemma2.attn_logit_softcapping", "gemma2.final_logit_softcapping",
                           "gemma2.attention.sliding_window"};
    for (int k = 0; k < 3; k++) {
        uint8_t *at = memmem(b, n, keys[k], strlen(keys[k]));
        CHECK_MSG(at != NULL, "%s: no key %s", src, keys[k]);
        if (at) at[strlen(keys[k]) - 1] = 'X';
    }
    write_file(dst, b, n);
    if (load_ok(t_, dst, true, &lm) == 0) {
        CHECK(lm.cfg.attn_softcap == 50.0f && lm.cfg.final_softcap == 30.0f && lm.cfg.sliding_window == 4096);
        CHECK(lm.cfg.layer_sliding[0] && !lm.cfg.layer_sliding[1] && lm.cfg.layer_sliding[2] && !lm.cfg.layer_sliding[3]);
        model_free(&lm);
    }
    free(b);
    rm_tree(dir);
    free(dir);
}

/* A directory with the SmolLM2 tokenizer files: the tokenizer is built and must fit the
 * embedding; with too small an embedding the load must fail (ids would index past it). */
TEST(loader_hf_with_tokenizer) {
    const char *td = getenv("TESTDATA") ? getenv("TESTDATA") : "testdata";
    char src[600], dst[700];
    snprintf(src, sizeof src, "%s/tokenizer/smollm2/tokenizer.json", td);
    CHECK_MSG(access(src, R_OK) == 0, "%s: committed test data missing", src);
    if (access(src, R_OK) != 0) return;
    rng r = {test_seed() + 12};
    const int vocabs[2] = {49152, 40};
    for (int k = 0; k < 2; k++) {
        tmodel m;
        tmodel_init_v(&m, false, true, false, true, vocabs[k], &r);
        char *dir = make_tmpdir();
        hf_write(dir, &m, false, NULL);
        const char *files[3] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json"};
        for (int f = 0; f < 3; f++) {
            snprintf(src, sizeof src, "%s/tokenizer/smollm2/%s", td, files[f]);
            snprintf(dst, sizeof dst, "%s/%s", dir, files[f]);
            CHECK(copy_file(src, dst));
        }
        if (k == 0) {
            llmi_model lm;
            if (load_ok(t_, dir, false, &lm) == 0) {
                CHECK(lm.tok != NULL && tok_n_vocab(lm.tok) == 49152);
                check_model(t_, &lm, &m, false);
                model_free(&lm);
            }
        } else {
            EXPECT_FAIL(dir, false, "tokens but the embedding only 40 rows");
        }
        tmodel_free(&m);
        rm_tree(dir);
        free(dir);
    }
}

/* ================================================================ HF: attacks */

TEST(loader_hf_config_attacks) {
    rng r = {test_seed() + 6};
    tmodel m;
    tmodel_init(&m, false, true, false, true, &r);
    char *dir = make_tmpdir(), cfgp[600], cfg[2048];
    hf_write(dir, &m, false, NULL);
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    struct { const char *extra; const char *needle; } cases[] = {
        {", \"rope_scaling\": {\"rope_type\": \"longrope\", \"factor\": 4.0}", "rope_scaling type longrope is not supported"},
        {", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 0}", "yarn rope scaling factor 0"},
        {", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, \"beta_fast\": \"x\"}", "beta_fast must be a finite number"},
        {", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, \"beta_slow\": -1}", "beta_slow -1 must be finite and > 0"},
        {", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, \"truncate\": 1}", "truncate must be true or false"},
        {", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, \"attention_factor\": -2}", "yarn attention factor -2"},
        {", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, \"original_max_position_embeddings\": 0}", "original_max_position_embeddings"},
        {", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}", "llama3 rope_scaling needs"},
        {", \"quantization_config\": {\"quant_method\": \"bitsandbytes\"}", "bitsandbytes"},
        {", \"hidden_size\": -64", "hidden_size"},
        {", \"hidden_size\": 64.5", "hidden_size"},
        {", \"num_hidden_layers\": 513", "num_hidden_layers"},
        {", \"num_hidden_layers\": 1e300", "num_hidden_layers"},
        {", \"num_key_value_heads\": 3", "n_kv_heads"},
        {", \"num_attention_heads\": 5", "hidden_size 64 is not a multiple"},
        {", \"head_dim\": 15", "head_dim"},
        {", \"rms_norm_eps\": 0", "epsilon"},
        {", \"rope_theta\": \"big\"", "rope_theta"},
        {", \"vocab_size\": 99999999", "vocab"},
        {", \"tie_word_embeddings\": 1", "tie_word_embeddings"},
        {", \"hidden_act\": \"gelu\"", "hidden_act"},
        {", \"mlp_bias\": true", "mlp_bias"},
        {", \"architectures\": [\"GPT2LMHeadModel\"]", "unsupported architecture GPT2LMHeadModel"},
        {", \"architectures\": []", "architectures"},
        {", \"vocab_size\": 41", "model.embed_tokens.weight has shape"},
        {", \"intermediate_size\": 128", "has shape"},
        {", \"tie_word_embeddings\": false", "missing tensor lm_head.weight"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hf_config_text(cfg, sizeof cfg, &m, NULL);
        config_override(cfg, sizeof cfg, cases[i].extra);
        write_text(cfgp, cfg);
        EXPECT_FAIL(dir, true, cases[i].needle);
    }
    write_text(cfgp, "{\"architectures\": [\"LlamaForCausalLM\"], ");
    EXPECT_FAIL(dir, true, "not valid JSON");
    write_text(cfgp, "[1, 2]");
    EXPECT_FAIL(dir, true, NULL);
    unlink(cfgp);
    EXPECT_FAIL(dir, true, "config.json");
    /* a FIFO must be refused, not waited on */
    CHECK(mkfifo(cfgp, 0600) == 0);
    EXPECT_FAIL(dir, true, "not a regular file");
    char fifo[700];
    snprintf(fifo, sizeof fifo, "%s/model.gguf", dir);
    CHECK(mkfifo(fifo, 0600) == 0);
    EXPECT_FAIL(fifo, true, "not a regular file");
    llmi_model lm;
    llmi_status st;
    llmi_status_clear(&st);
    CHECK(model_load_gguf(fifo, NULL, &lm, &st) != 0 && strstr(st.msg, "not a regular file"));
    tmodel_free(&m);
    rm_tree(dir);
    free(dir);
}

static void st_fail_at(test_ctx *t_, const char *p, const char *needle, int line) {
    safetensors_file f;
    llmi_status st;
    llmi_status_clear(&st);
    int rc = safetensors_open(p, &f, &st);
    CHECK_MSG(rc != 0, "line %d: open of %s succeeded", line, p);
    if (rc == 0) {
        safetensors_close(&f);
        return;
    }
    CHECK_MSG(strstr(st.msg, p) && !strchr(st.msg, '\n'), "line %d: bad message: %s", line, st.msg);
    if (needle) CHECK_MSG(strstr(st.msg, needle) != NULL, "line %d: lacks %s: %s", line, needle, st.msg);
}

TEST(loader_safetensors_header_attacks) {
    char *dir = make_tmpdir(), p[600];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    safetensors_file f;
    llmi_status st;
    uint8_t four[8] = {0};
#define ST_FAIL(needle) st_fail_at(t_, p, needle, __LINE__)
    write_file(p, four, 4); ST_FAIL("truncated");
    write_file(p, four, 0); ST_FAIL("truncated");
    uint64_t hl = 1ull << 40;
    write_file(p, &hl, 8); ST_FAIL("exceeds");
    hl = 100000000ull + 1; write_file(p, &hl, 8); ST_FAIL("exceeds");
    hl = 64; write_file(p, &hl, 8); ST_FAIL("past the end");
    /* a header length one byte more than the bytes after the 8-byte length */
    uint8_t short_hdr[10];
    hl = 3;
    memcpy(short_hdr, &hl, 8);
    memcpy(short_hdr + 8, "{}", 2);
    write_file(p, short_hdr, 10); ST_FAIL("past the end");
    st_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]", 8); ST_FAIL("JSON");
    st_raw(p, "not json at all", 0); ST_FAIL("JSON");
    st_raw(p, "[1, 2, 3]", 0); ST_FAIL("object");
    st_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}} xx", 8); ST_FAIL("after");
    st_raw(p, "{\"\xff\xfe\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8); ST_FAIL("UTF-8");
    st_raw(p, "{\"\xc0\xaf\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8); ST_FAIL("UTF-8");
    /* offsets: gap, overlap, first not at 0, end < begin, wrong length, trailing bytes */
    st_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
              "\"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [12, 20]}}", 20); ST_FAIL("gap");
    st_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
              "\"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}", 12); ST_FAIL("overlap");
    st_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}", 12); ST_FAIL("gap");
    st_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 0]}}", 8); ST_FAIL("end");
    st_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", 8); ST_FAIL("need 12");
    st_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 9); ST_FAIL("holds 9");
    st_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 4); ST_FAIL("holds 4");
    st_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
              "\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}", 16); ST_FAIL("duplicate");
    st_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 8]}}", 8); ST_FAIL("shape");
    st_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,2], \"data_offsets\": [0, 8]}}", 8); ST_FAIL("rank");
    st_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 4], \"data_offsets\": [0, 8]}}", 8);
    ST_FAIL("overflow");
    st_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1e300], \"data_offsets\": [0, 8]}}", 8); ST_FAIL("shape");
    st_raw(p, "{\"a\": {\"dtype\": \"F33\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8); ST_FAIL("unknown dtype F33");
    st_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 18446744073709551615]}}", 8);
    ST_FAIL("data_offsets");
    st_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2]}}", 8); ST_FAIL("data_offsets");
    st_raw(p, "{\"a\": 5}", 0); ST_FAIL("not an object");
    st_raw(p, "{\"a\\nb\": 5}", 0); ST_FAIL(NULL); /* the newline in the name must not reach the message */
    st_raw(p, "{\"__metadata__\": {\"k\": 5}}", 0); ST_FAIL("__metadata__");
    /* within the 100 MB header limit but millions of tiny JSON values: refused before cJSON
     * would spend gigabytes on nodes */
    {
        size_t nz = 4100000;
        char *big = malloc(nz * 2 + 32);
        size_t k = (size_t)sprintf(big, "{\"a\": [");
        for (size_t i = 0; i < nz; i++) { big[k++] = '0'; big[k++] = ','; }
        k--;
        k += (size_t)sprintf(big + k, "]}");
        st_raw(p, big, 0);
        free(big);
        ST_FAIL("JSON values");
    }
    /* valid edge cases: empty header object, zero-size tensors, F4 pairs */
    st_raw(p, "{}", 0);
    llmi_status_clear(&st);
    CHECK_MSG(safetensors_open(p, &f, &st) == 0, "empty file rejected: %s", st.msg);
    if (st.code == 0) safetensors_close(&f);
    st_raw(p, "{\"z\": {\"dtype\": \"F32\", \"shape\": [0, 5], \"data_offsets\": [0, 0]}, "
              "\"a\": {\"dtype\": \"BF16\", \"shape\": [2, 2], \"data_offsets\": [0, 8]}}   ", 8);
    llmi_status_clear(&st);
    CHECK_MSG(safetensors_open(p, &f, &st) == 0, "valid file rejected: %s", st.msg);
    if (st.code == 0) {
        const safetensors_tensor *a = safetensors_find(&f, "a");
        CHECK(a && a->dtype == ST_BF16 && a->n_dims == 2 && a->shape[0] == 2 && a->data == f.map + 8 + f.size - 16);
        CHECK(safetensors_find(&f, "b") == NULL);
        safetensors_close(&f);
    }
#undef ST_FAIL
    rm_tree(dir);
    free(dir);
}

TEST(loader_hf_weight_attacks) {
    rng r = {test_seed() + 8};
    tmodel m;
    tmodel_init(&m, false, true, false, true, &r);
    char *dir = make_tmpdir(), p[600];
    hf_write(dir, &m, false, NULL);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    size_t n;
    uint8_t *orig = read_all(p, &n);
    /* every cut of the header, then a stride through the data */
    uint64_t hl;
    memcpy(&hl, orig, 8);
    for (size_t cut = 0; cut < n; cut += cut < 64 ? 1 : cut < hl + 16 ? 7 : 397) {
        write_file(p, orig, cut);
        EXPECT_FAIL(dir, true, NULL);
    }
    /* a weight in an unusable dtype, a missing weight, a wrong shape */
    char *h = malloc(hl + 1);
    memcpy(h, orig + 8, hl);
    h[hl] = '\0';
    struct { const char *from, *to, *needle; } subs[] = {
        {"\"model.layers.1.mlp.up_proj.weight\":{\"dtype\":\"F32\"", "\"model.layers.1.mlp.up_proj.weight\":{\"dtype\":\"I32\"",
         "unsupported tensor type I32 in model.layers.1.mlp.up_proj.weight"},
        {"\"model.layers.0.mlp.up_proj.weight\"", "\"model.layers.0.mlp.up_proj.weighx\"", "missing tensor model.layers.0.mlp.up_proj.weight"},
        {"\"model.norm.weight\"", "\"model.norm.weighx\"", "missing tensor model.norm.weight"},
        {"\"shape\":[96,64]", "\"shape\":[64,96]", "has shape [64, 96], expected [96, 64]"},
        {"\"shape\":[40,64]", "\"shape\":[2560] ", "model.embed_tokens.weight has shape"},
    };
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
        char *at = strstr(h, subs[i].from);
        CHECK_MSG(at != NULL, "pattern %s not in header", subs[i].from);
        if (!at || strlen(subs[i].from) != strlen(subs[i].to)) continue;
        uint8_t *b = malloc(n);
        memcpy(b, orig, n);
        memcpy(b + 8 + (at - h), subs[i].to, strlen(subs[i].to));
        write_file(p, b, n);
        free(b);
        EXPECT_FAIL(dir, true, subs[i].needle);
    }
    write_file(p, orig, n);
    unlink(p);
    EXPECT_FAIL(dir, true, "no model.safetensors");
    free(h);
    free(orig);
    tmodel_free(&m);
    rm_tree(dir);
    free(dir);
}

TEST(loader_hf_index_attacks) {
    rng r = {test_seed() + 10};
    tmodel m;
    tmodel_init(&m, true, false, true, true, &r);
    char *dir = make_tmpdir(), ip[600], sp[600];
    hf_write(dir, &m, true, NULL);
    snprintf(ip, sizeof ip, "%s/model.safetensors.index.json", dir);
    snprintf(sp, sizeof sp, "%s/model-00002-of-00002.safetensors", dir);
    size_t n;
    char *orig = (char *)read_all(ip, &n);
    orig[n] = '\0';
    struct { const char *from, *to, *needle; } subs[] = {
        {"model-00001-of-00002.safetensors\"", "../../../../etc/passwd\"", "plain file name"},
        {"model-00002-of-00002.safetensors\"", "model-00003-of-00002.safetensors\"", "model-00003-of-00002.safetensors"},
        {"\"model.norm.weight\": \"model-00002", "\"model.norm.weight\": \"model-00001", "no such tensor"},
        {"\"weight_map\"", "\"weight_mop\"", "weight_map"},
    };
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
        char *b = strdup(orig), *at = strstr(b, subs[i].from);
        CHECK_MSG(at != NULL, "pattern %s not in index", subs[i].from);
        if (at) {
            /* shorter replacements are padded with JSON whitespace */
            memset(at, ' ', strlen(subs[i].from));
            memcpy(at, subs[i].to, strlen(subs[i].to));
            write_text(ip, b);
            EXPECT_FAIL(dir, true, subs[i].needle);
        }
        free(b);
    }
    /* a tensor listed twice, a tensor the index does not list, a shard that is corrupt */
    char *b = malloc(n + 200);
    snprintf(b, n + 200, "%.*s, \"model.norm.weight\": \"model-00001-of-00002.safetensors\"}}", (int)(n - 2), orig);
    write_text(ip, b);
    EXPECT_FAIL(dir, true, "listed twice");
    char *at = strstr(orig, "\"model.norm.weight\": \"model-00002-of-00002.safetensors\", ");
    if (at) {
        snprintf(b, n + 200, "%.*s%s", (int)(at - orig), orig, at + strlen("\"model.norm.weight\": \"model-00002-of-00002.safetensors\", "));
        write_text(ip, b);
        EXPECT_FAIL(dir, true, "not mapped");
    }
    free(b);
    write_text(ip, orig);
    size_t sn;
    uint8_t *shard = read_all(sp, &sn);
    write_file(sp, shard, sn - 3);
    EXPECT_FAIL(dir, true, "model-00002-of-00002.safetensors");
    write_file(sp, shard, sn);
    llmi_model lm;
    if (load_ok(t_, dir, true, &lm) == 0) model_free(&lm); /* restored: loads again */
    free(shard);
    free(orig);
    tmodel_free(&m);
    rm_tree(dir);
    free(dir);
}

TEST(loader_hf_random_corruption) {
    rng r = {test_seed() * 31 + 7};
    tmodel m;
    tmodel_init(&m, false, true, false, true, &r);
    char *dir = make_tmpdir(), p[600];
    hf_write(dir, &m, false, NULL);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    size_t n;
    uint8_t *orig = read_all(p, &n), *b = malloc(n);
    uint64_t hl;
    memcpy(&hl, orig, 8);
    for (int it = 0; it < 300; it++) {
        memcpy(b, orig, n);
        int flips = 1 + (int)(rng_next(&r) % 6);
        for (int k = 0; k < flips; k++) {
            size_t at = (size_t)(rng_next(&r) % (rng_next(&r) % 4 ? hl + 8 : n));
            if (rng_next(&r) % 2) b[at] = "0123456789[]{},:\"-eE. "[rng_next(&r) % 22];
            else b[at] ^= (uint8_t)(1u << (rng_next(&r) % 8));
        }
        write_file(p, b, n);
        load_any(t_, dir, true);
    }
    free(b);
    free(orig);
    tmodel_free(&m);
    rm_tree(dir);
    free(dir);
}

/* ================================================================ config_validate */

TEST(loader_config_validate) {
    llmi_config ok = {.arch = LLMI_ARCH_LLAMA, .n_vocab = 100, .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                      .head_dim = 16, .ffn_dim = 96, .max_ctx = 128, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
                      .rope_dim = 16};
    llmi_status st;
    llmi_status_clear(&st);
    CHECK(config_validate(&ok, "cfg.json", &st) == 0);
#define CASE(body, nd) do { llmi_config c = ok; body; llmi_status_clear(&st); \
        CHECK_MSG(config_validate(&c, "cfg.json", &st) != 0, "accepted: %s", #body); \
        CHECK_MSG(strstr(st.msg, "cfg.json") && strstr(st.msg, nd), "%s -> %s", #body, st.msg); } while (0)
    CASE(c.n_layers = LLMI_MAX_LAYERS + 1, "n_layers");
    CASE(c.n_layers = 0, "n_layers");
    CASE(c.dim = (1 << 20) + 1, "hidden");
    CASE(c.n_heads = 3, "n_kv_heads");
    CASE(c.n_kv_heads = 0, "n_kv_heads");
    CASE(c.n_kv_heads = 8, "n_kv_heads");
    CASE(c.head_dim = 15; c.rope_dim = 15, "head_dim");
    CASE(c.n_vocab = (1 << 24) + 1, "vocab");
    CASE(c.norm_eps = 0, "epsilon");
    CASE(c.norm_eps = NAN, "epsilon");
    CASE(c.rope_theta = INFINITY, "theta");
    CASE(c.rope_dim = 8, "rope");
    CASE(c.max_ctx = 0, "context");
    CASE(c.rope_scaling = LLMI_ROPE_SCALING_LLAMA3; c.rope_factor = 8; c.rope_low_freq_factor = 4;
         c.rope_high_freq_factor = 4; c.rope_orig_max_pos = 8192, "high_freq_factor");
    CASE(c.rope_scaling = LLMI_ROPE_SCALING_LINEAR; c.rope_factor = -1, "factor");
    CASE(c.ffn_dim = -5, "ffn");
#undef CASE
}

/* ================================================================ the real model */

TEST(loader_real_smollm2_gguf) {
    const char *path = getenv("MODEL");
    if (!path) path = "/root/.cache/llmi/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (access(path, R_OK) != 0) SKIP("%s not present (scripts/fetch-model.sh)", path);
    /* expected values come from the file's own metadata, read with the bare reader */
    gguf_file g;
    llmi_status st;
    llmi_status_clear(&st);
    if (gguf_open(path, &g, &st) != 0) {
        CHECK_MSG(0, "%s", st.msg);
        return;
    }
    int64_t v;
    double d;
    CHECK(gguf_get_int(&g, "llama.embedding_length", 0, INT32_MAX, &v, &st) == 1 && v == 576);
    CHECK(gguf_get_int(&g, "llama.block_count", 0, INT32_MAX, &v, &st) == 1 && v == 30);
    CHECK(gguf_get_float(&g, "llama.rope.freq_base", &d, &st) == 1 && d == 100000.0);
    CHECK(gguf_find_tensor(&g, "output.weight") == NULL);
    const gguf_tensor_info *q = gguf_find_tensor(&g, "blk.0.attn_q.weight");
    CHECK(q && q->type == GGUF_TYPE_Q4_1 && q->dims[0] == 576 && q->dims[1] == 576);
    const char **toks;
    uint32_t *lens;
    uint64_t nt;
    CHECK(gguf_get_str_array(&g, "tokenizer.ggml.tokens", 1u << 24, &toks, &lens, &nt, &st) == 1 && nt == 49152);
    if (st.code == 0) {
        CHECK(lens[2] == 10 && memcmp(toks[2], "<|im_end|>", 10) == 0);
        free(toks);
        free(lens);
    }
    /* the blk.0 Q bytes as stored, to check the loader moved whole rows */
    uint8_t *stored = malloc(q->n_bytes);
    memcpy(stored, q->data, q->n_bytes);
    gguf_close(&g);

    llmi_model m;
    if (load_ok(t_, path, true, &m) != 0) { free(stored); return; }
    const llmi_config *c = &m.cfg;
    CHECK(c->arch == LLMI_ARCH_LLAMA && !strcmp(c->arch_name, "llama"));
    CHECK(c->dim == 576 && c->n_layers == 30 && c->n_heads == 9 && c->n_kv_heads == 3 && c->head_dim == 64);
    CHECK(c->ffn_dim == 1536 && c->n_vocab == 49152 && c->max_ctx == 8192 && c->rope_dim == 64);
    CHECK(c->tie_embeddings && !c->qkv_bias && c->rope_scaling == LLMI_ROPE_SCALING_NONE);
    CHECK(c->rope_theta == 100000.0f && fabsf(c->norm_eps - 1e-5f) < 1e-10f);
    CHECK(m.tok_embd.dtype == LLMI_Q8_0 && m.lm_head.data == m.tok_embd.data);
    CHECK(m.layers[0].wq.dtype == LLMI_Q4_1 && m.layers[0].wq.owned != NULL);
    CHECK(m.weight_bytes > 90000000 && m.weight_bytes < 98362432);
    /* HF row h*64 + t*32 + i came from GGUF row h*64 + 2i + t */
    size_t rb = m.layers[0].wq.row_bytes;
    CHECK(rb == 576 / 32 * 20);
    int bad = 0;
    for (int h = 0; h < 9; h++)
        for (int t = 0; t < 2; t++)
            for (int i = 0; i < 32; i++)
                bad += memcmp((const uint8_t *)m.layers[0].wq.data + (size_t)(h * 64 + t * 32 + i) * rb,
                              stored + (size_t)(h * 64 + 2 * i + t) * rb, rb) != 0;
    CHECK(bad == 0);
    free(stored);
    model_free(&m);
}
