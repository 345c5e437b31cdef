/* TEMPORARY stub so the tree links while the tokenizer is written; removed by it. */
#include <stdlib.h>
#include "tokenizer.h"
int tok_create(const tok_spec *spec, tokenizer **out, llmi_status *st) { (void)spec; *out = NULL; return llmi_fail(st, LLMI_E_RUNTIME, "tokenizer: not built yet"); }
int tok_load_hf(const char *dir, tokenizer **out, llmi_status *st) { (void)dir; *out = NULL; return llmi_fail(st, LLMI_E_RUNTIME, "tokenizer: not built yet"); }
void tok_free(tokenizer *t) { (void)t; }
int tok_n_vocab(const tokenizer *t) { (void)t; return 0; }
int tok_bos(const tokenizer *t) { (void)t; return -1; }
int tok_eos(const tokenizer *t) { (void)t; return -1; }
bool tok_add_bos(const tokenizer *t) { (void)t; return false; }
bool tok_is_eog(const tokenizer *t, int32_t id) { (void)t; (void)id; return false; }
bool tok_is_special(const tokenizer *t, int32_t id) { (void)t; (void)id; return false; }
int tok_encode(const tokenizer *t, const char *text, size_t len, bool a, bool p, int32_t **ids, int *n, llmi_status *st) { (void)t; (void)text; (void)len; (void)a; (void)p; *ids = NULL; *n = 0; return llmi_fail(st, LLMI_E_RUNTIME, "tokenizer: not built yet"); }
int tok_decode(const tokenizer *t, const int32_t *ids, int n, bool s, char **out, size_t *len, llmi_status *st) { (void)t; (void)ids; (void)n; (void)s; *out = NULL; *len = 0; return llmi_fail(st, LLMI_E_RUNTIME, "tokenizer: not built yet"); }
int tok_piece(const tokenizer *t, int32_t id, char *buf, size_t cap) { (void)t; (void)id; (void)buf; (void)cap; return 0; }
void tok_stream_init(tok_stream *s, const tokenizer *t, bool skip) { s->t = t; s->skip_special = skip; s->first = true; s->n_pending = 0; }
int tok_stream_push(tok_stream *s, int32_t id, char *buf, size_t cap) { (void)s; (void)id; (void)buf; (void)cap; return 0; }
int tok_stream_flush(tok_stream *s, char *buf, size_t cap) { (void)s; (void)buf; (void)cap; return 0; }
int tok_chat_format(const tokenizer *t, const char *sys, const char *user, char **out, llmi_status *st) { (void)t; (void)sys; (void)user; *out = NULL; return llmi_fail(st, LLMI_E_RUNTIME, "tokenizer: not built yet"); }
const char *tok_chat_template_name(const tokenizer *t) { (void)t; return "none"; }
