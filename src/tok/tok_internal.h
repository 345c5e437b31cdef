/* tok_internal.h — owns the private layout of struct tokenizer shared by tokenizer.c (core:
 * building, encoding, decoding, streaming), the front ends tok_gguf.c (GGUF metadata) and
 * tok_hf.c (tokenizer.json), and tok_chat.c (chat formatting).  Nothing outside src/tok
 * includes it. */
#ifndef LLMI_TOK_INTERNAL_H
#define LLMI_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include "tok/tokenizer.h"

#define TOK_MAX_VOCAB   (1 << 22)     /* ids beyond this are rejected as corrupt */
#define TOK_MAX_TOKLEN  4096          /* bytes in one vocab entry */
#define TOK_MAX_MERGES  (1 << 23)

enum {                                /* tokenizer.flags[id] bits */
    TOKF_SPECIAL = 1,                 /* hidden by skip_special; parsed only with parse_special */
    TOKF_ADDED = 2,                   /* split out of the text before the model sees it */
    TOKF_EOG = 4,
    TOKF_BYTE = 8,                    /* <0xNN> byte-fallback token: piece is one raw byte */
};

/* SPM_LEGACY: "▁" before the text and for every space (Llama-2's SentencePiece); SPM: spaces
 * only, no prefix (Gemma: add_dummy_prefix false). */
typedef enum { TOK_NORM_NONE = 0, TOK_NORM_NFC, TOK_NORM_SPM_LEGACY, TOK_NORM_SPM } tok_norm_kind;
typedef enum { TOK_MS_NONE = 0, TOK_MS_ALWAYS, TOK_MS_FIRST, TOK_MS_NEVER } tok_metaspace_kind;
typedef enum { TOK_DEC_BYTELEVEL = 0, TOK_DEC_SPM } tok_dec_kind;
typedef enum { TOK_CHAT_NONE = 0, TOK_CHAT_UNKNOWN, TOK_CHAT_CHATML, TOK_CHAT_LLAMA3, TOK_CHAT_LLAMA2,
               TOK_CHAT_MISTRAL, TOK_CHAT_GEMMA, TOK_CHAT_PHI3, TOK_CHAT_PHI4,
               TOK_CHAT_PHI4_MINI, TOK_CHAT_MISTRAL_TEKKEN, TOK_CHAT_MISTRAL_V7, TOK_CHAT_GRANITE,
               TOK_CHAT_GRANITE4 } tok_chat_kind;

typedef struct tok_added {
    int32_t id;
    uint32_t off, len;                /* content: bytes [off, off+len) of tokenizer.added_text */
    bool special, lstrip, rstrip, single_word, normalized;
} tok_added;

struct tokenizer {
    tok_model_kind model;
    tok_pre_kind pre;
    int n_vocab;

    char *text;                       /* (text_len) all vocab strings, spelled as in the vocab */
    uint32_t *str_off, *str_len;      /* (n_vocab) slice of text per id; len 0 = no token */
    uint8_t *flags;                   /* (n_vocab) TOKF_* */
    char *pieces;                     /* (pieces_len) decoded bytes of every token */
    uint32_t *piece_off, *piece_len;  /* (n_vocab) */
    size_t stream_cap;                /* bytes one tok_stream_push may write, worst case */

    int32_t *vh;                      /* (vh_cap) open-addressing string -> id, -1 empty */
    uint32_t vh_cap;
    uint64_t *mh_key;                 /* (mh_cap) (left << 32 | right), UINT64_MAX empty */
    int32_t *mh_rank, *mh_new;        /* (mh_cap) merge rank and the id it produces */
    uint32_t mh_cap;
    int n_merges;

    int32_t byte_sym[256];            /* byte-level: id of the alphabet char for byte b, or -1 */
    int32_t byte_tok[256];            /* <0xNN> ids for byte fallback, or -1 */
    bool byte_fallback, ignore_merges, fuse_unk;

    tok_added *added;                 /* (n_added), sorted by first byte then length desc */
    int n_added;
    char *added_text;                 /* contents of the added tokens, normalized form for normalized ones */
    uint32_t added_first[257];        /* added[added_first[b] .. added_first[b+1]) start with byte b */
    bool any_normalized_added;

    tok_norm_kind norm;
    tok_metaspace_kind metaspace;
    bool metaspace_split;
    bool digits_split;                /* Digits(individual_digits) before the regex */
    pcre2_code *re;                   /* pre-tokenizer regex or NULL (whole segment = one word) */
    tok_dec_kind dec;
    bool dec_strip_space;             /* SentencePiece: drop one leading space of a decode */

    int bos_id, eos_id, unk_id, pad_id;
    bool add_bos, add_eos;

    char *chat_template;              /* NUL-terminated, or NULL */
    tok_chat_kind chat;
};

typedef struct tok_merge_str { const char *a; uint32_t alen; const char *b; uint32_t blen; } tok_merge_str;

/* What the two front ends (GGUF spec, tokenizer.json) hand to the common builder. */
typedef struct tok_build {
    int n_vocab;
    const char *const *tokens;        /* (n_vocab) may contain NULL holes */
    const uint32_t *token_lens;       /* (n_vocab) */
    const uint8_t *flags;             /* (n_vocab) TOKF_* or NULL */
    const float *scores;              /* (n_vocab) SentencePiece scores when merges are absent */
    int n_merges;
    const tok_merge_str *merges;      /* (n_merges) left/right token strings, or NULL */
    int n_added;
    const tok_added *added;           /* (n_added) offsets into added_text */
    const char *added_text;
    const char *origin;               /* file name for messages */
} tok_build;

int tok_build_common(tokenizer *t, const tok_build *b, llmi_status *st);
/* Flags the end-of-generation tokens by llama.cpp's rule (tok_eog.c), adding to any the
 * front end flagged already; named: NULL or (TOK_EOG_ROLES) ids the file names, -1 for
 * none.  Needs the vocabulary built and t->eos_id set. */
void tok_eog_mark(tokenizer *t, const int32_t *named);
int tok_vocab_find(const tokenizer *t, const char *s, size_t n);
int tok_compile_regex(tokenizer *t, const char *pattern, const char *origin, llmi_status *st);
tokenizer *tok_alloc(void);
void tok_detect_chat(tokenizer *t);


#endif
