/* grammar.h — owns grammar-constrained decoding: GBNF text (llama.cpp's grammar format,
 * its grammars/README.md) parsed into rules; per request, where the output so far stands
 * in the grammar (a set of pushdown stacks over Unicode code points, as llama.cpp keeps);
 * and per step, which vocabulary tokens may come next.
 *
 * The mask walks a trie of the vocabulary's token texts (grammar_vocab, built once per
 * tokenizer), so tokens that share a prefix share its work and a prefix no parse accepts
 * cuts off every token below it.  Parse states are interned and their moves on a code
 * point memoised per request, so the steps of a long output keep getting cheaper.
 *
 * What a grammar constrains is text.  Control tokens other than end-of-generation never
 * match (llama.cpp lets "<|im_start|>" match its literal text; its masks otherwise agree
 * token for token, tests/test_grammar.c).  An end-of-generation token is allowed exactly
 * when the text so far is a whole sentence of the grammar.  A token may end inside a
 * UTF-8 sequence: it is allowed when some parse accepts a code point starting with those
 * bytes, and the next token must complete it. */
#ifndef LLMI_GRAMMAR_H
#define LLMI_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "core/status.h"

struct tokenizer;
typedef struct grammar grammar;             /* parsed rules; immutable, shared by requests */
typedef struct grammar_vocab grammar_vocab; /* the token trie of one tokenizer */
typedef struct grammar_state grammar_state; /* one request's place in its grammar */

/* Parses GBNF with start rule "root".  what names the source in messages ("--grammar",
 * "--grammar-file g.gbnf", "prompts.jsonl:3: grammar"); errors give line and column.
 * Refused: undefined or twice-defined rules, left recursion (it cannot terminate), and
 * llama.cpp's token references (<[id]>, <text>), which constrain tokens, not text. */
int grammar_parse(const char *text, size_t len, const char *what, grammar **out, llmi_status *st);
void grammar_free(grammar *g);

int grammar_vocab_build(const struct tokenizer *t, grammar_vocab **out, llmi_status *st);
void grammar_vocab_free(grammar_vocab *v);

/* g and v are borrowed and must outlive the state. */
int grammar_state_create(const grammar *g, const grammar_vocab *v, grammar_state **out, llmi_status *st);
void grammar_state_free(grammar_state *s);
/* allowed (n_vocab): 1 for each token that may come next, end-of-generation ids included
 * when the text is complete and allow_eog (false for a request that ignores EOS); 0 for
 * the rest.  Returns how many are allowed (0: a dead end, nothing in the vocabulary
 * continues the text), or -1 when the grammar is too ambiguous to follow (more parses at
 * once than the state's bound), with st set. */
int grammar_state_mask(grammar_state *s, bool allow_eog, uint8_t *allowed, llmi_status *st);
/* Moves past token, which the last mask allowed; end-of-generation ids leave the state as
 * it is.  Fails (st set) for a token the grammar does not allow. */
int grammar_state_accept(grammar_state *s, int32_t token, llmi_status *st);
/* The text so far is a whole sentence of the grammar (it may still go on). */
bool grammar_state_complete(const grammar_state *s);

#endif
