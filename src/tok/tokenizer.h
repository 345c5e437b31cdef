/* tokenizer.h — owns text <-> token ids: byte-level BPE (GPT-2, SmolLM2, Llama-3, Qwen2
 * pre-tokenizers) and SentencePiece-style BPE with byte fallback, added/special tokens,
 * BOS/EOS rules, the streaming detokenizer, and chat formatting for instruct models.
 *
 * Built either from GGUF metadata (tok_load_gguf, through a tok_spec) or from a Hugging
 * Face directory (tok_load_hf: tokenizer.json, tokenizer_config.json, generation_config.json).
 * The reference is Hugging Face `tokenizers`; ids must match it exactly. */
#ifndef LLMI_TOKENIZER_H
#define LLMI_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "core/status.h"

typedef struct tokenizer tokenizer;

typedef enum { TOK_MODEL_BYTELEVEL_BPE = 0, TOK_MODEL_SPM_BPE } tok_model_kind;
/* GPT-2's ByteLevel regex (SmolLM: with digits split first), Llama-3's, Qwen2's, none (or
 * SentencePiece), GPT-4o's o200k (Phi-4-mini) and Mistral's Tekken (Nemo, Small 3) */
typedef enum { TOK_PRE_GPT2 = 0, TOK_PRE_SMOLLM, TOK_PRE_LLAMA3, TOK_PRE_QWEN2, TOK_PRE_NONE, TOK_PRE_O200K,
               TOK_PRE_TEKKEN, TOK_PRE_KINDS } tok_pre_kind;

/* The end-of-generation roles a GGUF file may name an id for (tokenizer.ggml.*_token_id). */
typedef enum { TOK_EOG_EOT = 0, TOK_EOG_EOM, TOK_EOG_FIM_PAD, TOK_EOG_FIM_REP, TOK_EOG_FIM_SEP, TOK_EOG_ROLES } tok_eog_role;

/* What a GGUF file says about its tokenizer; arrays are borrowed for the call only.
 * Token strings are given with explicit lengths: they are untrusted bytes. */
typedef struct tok_spec {
    tok_model_kind model;
    tok_pre_kind pre;
    int n_tokens;
    const char *const *tokens;        /* (n_tokens) */
    const uint32_t *token_lens;       /* (n_tokens) */
    const float *scores;              /* (n_tokens) or NULL */
    const int32_t *token_types;       /* (n_tokens) or NULL: 1 normal 2 unk 3 control 4 user 5 unused 6 byte */
    int n_merges;
    const char *const *merges;        /* (n_merges) "a b", or NULL for SentencePiece scores */
    const uint32_t *merge_lens;       /* (n_merges) */
    int bos_id, eos_id, unk_id, pad_id;   /* -1 when absent */
    const int32_t *eog_ids;           /* NULL, or (TOK_EOG_ROLES) the id named per tok_eog_role, -1 for none */
    bool add_bos, add_eos;
    bool no_space_prefix;             /* SentencePiece without the "▁" before the text (Gemma) */
    const char *chat_template;        /* or NULL */
} tok_spec;

/* The pre-tokenizer regex of each kind (NULL for TOK_PRE_NONE), spelled exactly as the
 * models' tokenizer.json files have it: a Split pattern is recognised by this text. */
const char *tok_pre_regex(tok_pre_kind k);
/* llama.cpp's tokenizer.ggml.pre name (src/llama-vocab.cpp's list) of a pre-tokenizer llmi
 * reads: its kind, and whether llama.cpp adds BOS by default with it; false for a name
 * llmi does not know. */
bool tok_gguf_pre_of(const char *name, size_t len, tok_pre_kind *kind, bool *add_bos);
/* Whether a kind's BPE takes a whole pre-token found in the vocabulary before merging
 * (llama.cpp's ignore_merges: Llama-3's and Tekken's). */
bool tok_pre_ignores_merges(tok_pre_kind k);

int tok_create(const tok_spec *spec, tokenizer **out, llmi_status *st);
struct gguf_file;
/* Reads a GGUF file's tokenizer.ggml.* metadata into a tok_spec and builds it (tok_gguf.c);
 * errors name the file. */
int tok_load_gguf(const struct gguf_file *g, tokenizer **out, llmi_status *st);
/* dir holds tokenizer.json and optionally tokenizer_config.json, generation_config.json. */
int tok_load_hf(const char *dir, tokenizer **out, llmi_status *st);
void tok_free(tokenizer *t);

int tok_n_vocab(const tokenizer *t);
int tok_bos(const tokenizer *t);                     /* -1 if none */
int tok_eos(const tokenizer *t);                     /* -1 if none */
bool tok_add_bos(const tokenizer *t);                /* the model's default */
tok_pre_kind tok_pre(const tokenizer *t);           /* the pre-tokenizer recognised (TOK_PRE_NONE: none or SentencePiece) */
bool tok_is_eog(const tokenizer *t, int32_t id);     /* eos or any end-of-generation id */
bool tok_is_special(const tokenizer *t, int32_t id); /* control/special: hidden by skip_special */

/* Encodes text.  add_special adds BOS/EOS as the model's rules say; parse_special lets
 * special-token strings in the text become their ids.  *ids is malloc'ed (caller frees). */
int tok_encode(const tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
               int32_t **ids, int *n_ids, llmi_status *st);
/* One-shot decode to a malloc'ed NUL-terminated string (*len bytes, may contain NUL). */
int tok_decode(const tokenizer *t, const int32_t *ids, int n, bool skip_special, char **out, size_t *len,
               llmi_status *st);
/* The raw text of one token as it appears in a decode (byte tokens as their byte,
 * "▁" as space, byte-level symbols as bytes), for --logprobs and --verbose-prompt. */
int tok_piece(const tokenizer *t, int32_t id, char *buf, size_t cap);   /* returns bytes written */

/* Streaming detokenizer: never emits a partial UTF-8 sequence; the concatenation of all
 * pushes plus the final flush equals tok_decode of the same ids. */
typedef struct tok_stream {
    const tokenizer *t;
    bool skip_special;
    bool first;          /* SentencePiece strips one leading space at the very start */
    char pending[8];     /* incomplete UTF-8 bytes held back */
    int n_pending;
} tok_stream;
void tok_stream_init(tok_stream *s, const tokenizer *t, bool skip_special);
/* Writes the bytes this token completes into buf; returns count.  cap >= tok_stream_cap(t) is
 * always enough (<= 256 for SmolLM2, Llama, Qwen2 vocabularies; a few have longer tokens). */
int tok_stream_push(tok_stream *s, int32_t id, char *buf, size_t cap);
size_t tok_stream_cap(const tokenizer *t);
int tok_stream_flush(tok_stream *s, char *buf, size_t cap);

/* Chat formatting (--chat/--system): recognises ChatML, Llama-3, Llama-2, Mistral and Gemma from
 * the model's template text.  *out is malloc'ed; it ends with the assistant turn opened. */
int tok_chat_format(const tokenizer *t, const char *system, const char *user, char **out, llmi_status *st);
const char *tok_chat_template_name(const tokenizer *t);  /* "chatml", "llama3", ... or "none" */
/* What follows an assistant answer's content to go on with one more user turn: the
 * assistant turn closed, the user turn, the assistant turn opened, as the template renders
 * [..., assistant(answer), user(user)] after the answer.  *out is malloc'ed. */
int tok_chat_next_turn(const tokenizer *t, const char *user, char **out, llmi_status *st);
/* A whole conversation as the template renders it with the assistant turn opened: system
 * (NULL: none), then turns[0, n_turns) alternating user, assistant, ..., user (n_turns odd).
 * An assistant message is written as the template writes one in the history (trimmed,
 * stripped, a reasoning block dropped: per family), then tok_chat_next_turn's text. */
int tok_chat_messages(const tokenizer *t, const char *system, const char *const *turns, int n_turns, char **out,
                      llmi_status *st);

/* The template's pieces around user messages, as tokens, for conversations built turn by
 * turn on the tokens so far (bench --turns, generate --conversation): cut from
 * tok_chat_format and tok_chat_next_turn renderings around a marker message, so the format
 * stays theirs.  A conversation is first + user 1 + after, then per later turn the
 * answer's tokens (without its end-of-generation token) + next + user k + after_next. */
typedef struct tok_chat_pieces {
    int32_t *first, *after, *next, *after_next;   /* (n_first), (n_after), (n_next), (n_after_next) */
    int n_first;          /* before the first user message (system turn, user turn opened) */
    int n_after;          /* after a user message of the first turn (assistant turn opened) */
    int n_next;           /* after an answer, before the next user message */
    int n_after_next;     /* after a later user message */
} tok_chat_pieces;
int tok_chat_pieces_make(const tokenizer *t, const char *system, tok_chat_pieces *c, llmi_status *st);
void tok_chat_pieces_free(tok_chat_pieces *c);

#endif
