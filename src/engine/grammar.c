/* grammar.c — GBNF parsing, parse states as interned pushdown stacks, and token masks over
 * a trie of the vocabulary (grammar.h says what each part owns). */
#include "engine/grammar.h"

#include <stdlib.h>
#include <string.h>
#include "core/grow.h"
#include "core/strmap.h"
#include "core/utf8.h"
#include "tok/tokenizer.h"

/* Bounds on untrusted grammars: each is far above what a hand-written or schema-made
 * grammar needs, and keeps a hostile one from exhausting memory. */
#define GRAMMAR_MAX_ELEMS (1 << 22)
#define GRAMMAR_MAX_RULES (1 << 18)
#define GRAMMAR_MAX_REPEAT 100000
#define GRAMMAR_MAX_NESTING 256
#define STATE_MAX_NODES (1 << 22)   /* interned stack nodes per request */
#define STATE_MAX_PARSES 4096       /* stacks alive at once */
#define MASK_CACHE 16               /* masks kept per request, (n_vocab / 8) bytes each */

/* ------------------------------------------------------------------ rules */

enum { GE_END = 0, GE_CHARS, GE_RULE };
typedef struct { int32_t type, arg; } gelem;   /* GE_CHARS: a charset; GE_RULE: a rule */
typedef struct { uint32_t lo, hi; } crange;
typedef struct { int32_t first, n; bool negate; } charset;   /* ranges[first, first + n), sorted, merged */

typedef struct grule {
    char *name;              /* NULL for rules made from groups and repetitions */
    int32_t origin;          /* the named rule a made rule came from, for messages */
    int32_t *alts;           /* (n_alts) index in elems of each alternative's first element */
    int32_t n_alts, cap_alts;
    bool defined;
    int32_t offset;          /* where in the text it was first referenced, for "undefined rule" */
} grule;

struct grammar {
    gelem *elems;            /* (n_elems) alternatives back to back, each ended by GE_END */
    int32_t n_elems, cap_elems;
    grule *rules;
    int32_t n_rules, cap_rules;
    crange *ranges;
    int32_t n_ranges, cap_ranges;
    charset *sets;
    int32_t n_sets, cap_sets;
    int32_t root;
};

void grammar_free(grammar *g) {
    if (!g) return;
    for (int32_t i = 0; i < g->n_rules; i++) {
        free(g->rules[i].name);
        free(g->rules[i].alts);
    }
    free(g->rules);
    free(g->elems);
    free(g->ranges);
    free(g->sets);
    free(g);
}

static bool charset_match(const grammar *g, int32_t set, uint32_t cp) {
    const charset *cs = &g->sets[set];
    bool in = false;
    for (int32_t i = 0; i < cs->n && !in; i++) {
        const crange *r = &g->ranges[cs->first + i];
        if (cp < r->lo) break;
        in = cp <= r->hi;
    }
    return in != cs->negate;
}

/* Whether some code point in [lo, hi] is in the set. */
static bool charset_meets(const grammar *g, int32_t set, uint32_t lo, uint32_t hi) {
    const charset *cs = &g->sets[set];
    for (int32_t i = 0; i < cs->n; i++) {
        const crange *r = &g->ranges[cs->first + i];
        if (cs->negate) {
            if (r->lo <= lo && hi <= r->hi) return false;   /* merged ranges: one covers it all or none does */
        } else if (r->lo <= hi && lo <= r->hi) {
            return true;
        }
    }
    return cs->negate;
}

/* ------------------------------------------------------------------ parser */

typedef struct gbuf { gelem *v; int32_t n, cap; } gbuf;

typedef struct gparser {
    const char *src, *p, *end;
    const char *what;
    grammar *g;
    llmi_status *st;
    int32_t cur_rule;        /* the named rule being parsed */
    int depth;
    strmap rule_ids;         /* rule name -> id; keys are the rules' own names */
} gparser;

static int perr(gparser *P, const char *msg, const char *detail) {
    int line = 1, col = 1;
    for (const char *q = P->src; q < P->p && q < P->end; q++) {
        if (*q == '\n') { line++; col = 1; } else { col++; }
    }
    return llmi_fail(P->st, LLMI_E_USAGE, "%s: line %d col %d: %s%s", P->what, line, col, msg, detail ? detail : "");
}

static int oom(gparser *P) { return llmi_fail(P->st, LLMI_E_RUNTIME, "%s: out of memory parsing the grammar", P->what); }

static void skip_space(gparser *P, bool newline_ok) {
    while (P->p < P->end) {
        char c = *P->p;
        if (c == '#') {
            while (P->p < P->end && *P->p != '\n' && *P->p != '\r') P->p++;
        } else if (c == ' ' || c == '\t' || (newline_ok && (c == '\n' || c == '\r'))) {
            P->p++;
        } else {
            break;
        }
    }
}

static bool is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

/* One UTF-8 code point of the grammar text. */
static int decode_utf8(gparser *P, uint32_t *cp) {
    int32_t c;
    int n = utf8_next(P->p, (size_t)(P->end - P->p), &c);
    if (!n) return perr(P, "invalid UTF-8", NULL);
    P->p += n;
    *cp = (uint32_t)c;
    return LLMI_OK;
}

static int parse_hex(gparser *P, int digits, uint32_t *cp) {
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        char c = P->p < P->end ? *P->p : '\0';
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return perr(P, digits == 2 ? "\\x needs 2 hex digits" : digits == 4 ? "\\u needs 4 hex digits" : "\\U needs 8 hex digits", NULL);
        v = (v << 4) | (uint32_t)d;
        P->p++;
    }
    *cp = v;
    return LLMI_OK;
}

/* One character of a literal or a class: an escape or a UTF-8 code point. */
static int parse_char(gparser *P, uint32_t *cp) {
    if (P->p >= P->end) return perr(P, "unexpected end of the grammar", NULL);
    if (*P->p != '\\') return decode_utf8(P, cp);
    if (P->p + 1 >= P->end) return perr(P, "unexpected end after '\\'", NULL);
    char c = P->p[1];
    P->p += 2;
    switch (c) {
    case 'x': return parse_hex(P, 2, cp);
    case 'u': return parse_hex(P, 4, cp);
    case 'U': return parse_hex(P, 8, cp);
    case 't': *cp = '\t'; return LLMI_OK;
    case 'r': *cp = '\r'; return LLMI_OK;
    case 'n': *cp = '\n'; return LLMI_OK;
    case '\\': case '"': case '[': case ']': case '-': *cp = (uint32_t)c; return LLMI_OK;
    default:
        P->p -= 2;
        return perr(P, "unknown escape", NULL);
    }
}

static int push_elem(gparser *P, gbuf *b, int32_t type, int32_t arg) {
    if (!grow_array((void **)&b->v, &b->cap, b->n + 1, sizeof *b->v)) return oom(P);
    b->v[b->n++] = (gelem){type, arg};
    return LLMI_OK;
}

static int cmp_range(const void *a, const void *b) {
    const crange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Makes the set of ranges[first, n_ranges): sorted and merged, so matching stops early. */
static int close_set(gparser *P, int32_t first, bool negate, int32_t *set) {
    grammar *g = P->g;
    int32_t n = g->n_ranges - first;
    if (n > 1) qsort(g->ranges + first, (size_t)n, sizeof *g->ranges, cmp_range);
    int32_t w = 0;
    for (int32_t i = 0; i < n; i++) {
        crange r = g->ranges[first + i];
        if (w > 0 && r.lo <= g->ranges[first + w - 1].hi + 1) {
            if (r.hi > g->ranges[first + w - 1].hi) g->ranges[first + w - 1].hi = r.hi;
        } else {
            g->ranges[first + w++] = r;
        }
    }
    g->n_ranges = first + w;
    if (!grow_array((void **)&g->sets, &g->cap_sets, g->n_sets + 1, sizeof *g->sets)) return oom(P);
    g->sets[g->n_sets] = (charset){first, w, negate};
    *set = g->n_sets++;
    return LLMI_OK;
}

static int add_range(gparser *P, uint32_t lo, uint32_t hi) {
    grammar *g = P->g;
    if (!grow_array((void **)&g->ranges, &g->cap_ranges, g->n_ranges + 1, sizeof *g->ranges)) return oom(P);
    g->ranges[g->n_ranges++] = (crange){lo, hi};
    return LLMI_OK;
}

static int new_rule(gparser *P, const char *name, size_t name_len, int32_t *id) {
    grammar *g = P->g;
    if (g->n_rules >= GRAMMAR_MAX_RULES) return perr(P, "too many rules", NULL);
    if (!grow_array((void **)&g->rules, &g->cap_rules, g->n_rules + 1, sizeof *g->rules)) return oom(P);
    grule *r = &g->rules[g->n_rules];
    memset(r, 0, sizeof *r);
    if (name) {
        r->name = malloc(name_len + 1);
        if (!r->name) return oom(P);
        memcpy(r->name, name, name_len);
        r->name[name_len] = '\0';
        if (!strmap_put(&P->rule_ids, r->name, name_len, g->n_rules)) {
            free(r->name);
            r->name = NULL;
            return oom(P);
        }
    }
    r->origin = name ? g->n_rules : P->cur_rule;
    r->offset = (int32_t)(P->p - P->src);   /* the line is counted only for a message */
    *id = g->n_rules++;
    return LLMI_OK;
}

static int rule_by_name(gparser *P, const char *name, size_t len, int32_t *id) {
    int found = strmap_get(&P->rule_ids, name, len);
    if (found >= 0) {
        *id = found;
        return LLMI_OK;
    }
    return new_rule(P, name, len, id);
}

/* Appends one alternative (seq's elements and an end) to rule. */
static int add_alt(gparser *P, int32_t rule, const gelem *seq, int32_t n) {
    grammar *g = P->g;
    if (g->n_elems + n + 1 > GRAMMAR_MAX_ELEMS) return perr(P, "grammar too large", NULL);
    if (!grow_array((void **)&g->elems, &g->cap_elems, g->n_elems + n + 1, sizeof *g->elems)) return oom(P);
    grule *r = &g->rules[rule];
    if (!grow_array((void **)&r->alts, &r->cap_alts, r->n_alts + 1, sizeof *r->alts)) return oom(P);
    r->alts[r->n_alts++] = g->n_elems;
    if (n) memcpy(g->elems + g->n_elems, seq, (size_t)n * sizeof *seq);
    g->n_elems += n;
    g->elems[g->n_elems++] = (gelem){GE_END, 0};
    return LLMI_OK;
}

/* Replaces seq's last symbol (from `last` on) by min..max copies of it (max < 0: no
 * bound), the optional ones as nested rules: x{2,4} is x x r1, r1 ::= x r2 |, r2 ::= x |. */
static int repeat(gparser *P, gbuf *seq, int32_t last, long min, long max) {
    int32_t n = seq->n - last;
    gelem *sym = malloc((size_t)n * sizeof *sym + 2 * sizeof *sym);
    if (!sym) return oom(P);
    if (n) memcpy(sym, seq->v + last, (size_t)n * sizeof *sym);
    seq->n = last;
    int rc = LLMI_OK;
    for (long i = 0; i < min && !rc; i++)
        for (int32_t j = 0; j < n && !rc; j++) rc = push_elem(P, seq, sym[j].type, sym[j].arg);
    if (!rc && max < 0) {
        int32_t r;
        if (!(rc = new_rule(P, NULL, 0, &r))) {
            sym[n] = (gelem){GE_RULE, r};
            if (!(rc = add_alt(P, r, sym, n + 1)) && !(rc = add_alt(P, r, NULL, 0))) rc = push_elem(P, seq, GE_RULE, r);
        }
    } else if (!rc && max > min) {
        int32_t inner = -1;
        for (long k = 0; k < max - min && !rc; k++) {
            int32_t r;
            if ((rc = new_rule(P, NULL, 0, &r))) break;
            if (inner >= 0) sym[n] = (gelem){GE_RULE, inner};
            if ((rc = add_alt(P, r, sym, n + (inner >= 0)))) break;
            rc = add_alt(P, r, NULL, 0);
            inner = r;
        }
        if (!rc) rc = push_elem(P, seq, GE_RULE, inner);
    }
    free(sym);
    return rc;
}

static int parse_alternates(gparser *P, int32_t rule, bool nested);

static int parse_int(gparser *P, long *v) {
    if (P->p >= P->end || *P->p < '0' || *P->p > '9') return perr(P, "expecting a number", NULL);
    long x = 0;
    while (P->p < P->end && *P->p >= '0' && *P->p <= '9') {
        x = x * 10 + (*P->p++ - '0');
        if (x > GRAMMAR_MAX_REPEAT) return perr(P, "repetition count too large (at most 100000)", NULL);
    }
    *v = x;
    return LLMI_OK;
}

static int parse_sequence(gparser *P, bool nested, gbuf *seq) {
    int32_t last = -1;
    int rc = LLMI_OK;
    while (!rc && P->p < P->end) {
        char c = *P->p;
        if (c == '"') {
            last = seq->n;
            P->p++;
            while (!rc && P->p < P->end && *P->p != '"') {
                uint32_t cp;
                int32_t set;
                if ((rc = parse_char(P, &cp)) || (rc = add_range(P, cp, cp)) ||
                    (rc = close_set(P, P->g->n_ranges - 1, false, &set)))
                    break;
                rc = push_elem(P, seq, GE_CHARS, set);
            }
            if (rc) break;
            if (P->p >= P->end) return perr(P, "unterminated string literal", NULL);
            P->p++;
        } else if (c == '[') {
            last = seq->n;
            P->p++;
            bool negate = P->p < P->end && *P->p == '^';
            if (negate) P->p++;
            int32_t first = P->g->n_ranges;
            while (!rc && P->p < P->end && *P->p != ']') {
                uint32_t lo, hi;
                const char *start = P->p;
                if ((rc = parse_char(P, &lo))) break;
                hi = lo;
                if (P->p + 1 < P->end && *P->p == '-' && P->p[1] != ']') {
                    P->p++;
                    if ((rc = parse_char(P, &hi))) break;
                    if (hi < lo) {
                        P->p = start;
                        return perr(P, "character range is empty (its end is below its start)", NULL);
                    }
                }
                rc = add_range(P, lo, hi);
            }
            if (rc) break;
            if (P->p >= P->end) return perr(P, "unterminated character class", NULL);
            P->p++;
            int32_t set;
            if ((rc = close_set(P, first, negate, &set))) break;
            rc = push_elem(P, seq, GE_CHARS, set);
        } else if (is_word(c)) {
            last = seq->n;
            const char *name = P->p;
            while (P->p < P->end && is_word(*P->p)) P->p++;
            int32_t r;
            if ((rc = rule_by_name(P, name, (size_t)(P->p - name), &r))) break;
            rc = push_elem(P, seq, GE_RULE, r);
        } else if (c == '(') {
            if (++P->depth > GRAMMAR_MAX_NESTING) return perr(P, "groups nested too deeply", NULL);
            last = seq->n;
            P->p++;
            skip_space(P, true);
            int32_t r;
            if ((rc = new_rule(P, NULL, 0, &r)) || (rc = parse_alternates(P, r, true))) break;
            if (P->p >= P->end || *P->p != ')') return perr(P, "expecting ')'", NULL);
            P->p++;
            P->depth--;
            rc = push_elem(P, seq, GE_RULE, r);
        } else if (c == '.') {
            last = seq->n;
            P->p++;
            int32_t set;
            if ((rc = close_set(P, P->g->n_ranges, true, &set))) break;
            rc = push_elem(P, seq, GE_CHARS, set);
        } else if (c == '*' || c == '+' || c == '?') {
            if (last < 0) return perr(P, "nothing before the repetition ", (char[]){c, '\0'});
            P->p++;
            rc = repeat(P, seq, last, c == '+', c == '?' ? 1 : -1);
            last = -1;   /* x** is an error, as in llama.cpp */
        } else if (c == '{') {
            if (last < 0) return perr(P, "nothing before the repetition {", NULL);
            P->p++;
            skip_space(P, nested);
            long min, max;
            if ((rc = parse_int(P, &min))) break;
            skip_space(P, nested);
            max = min;
            if (P->p < P->end && *P->p == ',') {
                P->p++;
                skip_space(P, nested);
                max = -1;
                if (P->p < P->end && *P->p >= '0' && *P->p <= '9' && (rc = parse_int(P, &max))) break;
                skip_space(P, nested);
            }
            if (P->p >= P->end || *P->p != '}') return perr(P, "expecting '}'", NULL);
            P->p++;
            if (max >= 0 && max < min) return perr(P, "repetition {m,n} with n below m", NULL);
            rc = repeat(P, seq, last, min, max);
            last = -1;
        } else if (c == '<' || c == '!') {
            return perr(P, "token references (<[id]>, <text>, !<...>) are not supported: llmi's grammars constrain text", NULL);
        } else {
            break;
        }
        if (!rc) skip_space(P, nested);
    }
    return rc;
}

static int parse_alternates(gparser *P, int32_t rule, bool nested) {
    gbuf seq = {0};
    int rc = LLMI_OK;
    for (;;) {
        seq.n = 0;
        if ((rc = parse_sequence(P, nested, &seq)) || (rc = add_alt(P, rule, seq.v, seq.n))) break;
        if (P->p >= P->end || *P->p != '|') break;
        P->p++;
        skip_space(P, true);
    }
    free(seq.v);
    return rc;
}

static int parse_rule(gparser *P) {
    const char *name = P->p;
    while (P->p < P->end && is_word(*P->p)) P->p++;
    if (P->p == name) return perr(P, "expecting a rule name", NULL);
    size_t len = (size_t)(P->p - name);
    int32_t r;
    int rc = rule_by_name(P, name, len, &r);
    if (rc) return rc;
    if (P->g->rules[r].defined) return perr(P, "rule defined twice: ", P->g->rules[r].name);
    P->g->rules[r].defined = true;
    P->cur_rule = r;
    skip_space(P, false);
    if (P->end - P->p < 3 || memcmp(P->p, "::=", 3) != 0) return perr(P, "expecting '::=' after the rule name", NULL);
    P->p += 3;
    skip_space(P, true);
    if ((rc = parse_alternates(P, r, false))) return rc;
    if (P->p < P->end && *P->p == '\r') P->p++;
    if (P->p < P->end && *P->p == '\n') P->p++;
    else if (P->p < P->end) return perr(P, "expecting the end of the line", NULL);
    skip_space(P, true);
    return LLMI_OK;
}

/* Rules that can match the empty text, then left recursion: a rule that can reach itself
 * without consuming a character would make parsing loop forever. */
static int check_left_recursion(gparser *P) {
    grammar *g = P->g;
    int32_t n = g->n_rules;
    bool *nullable = calloc((size_t)n, sizeof *nullable);
    uint8_t *color = calloc((size_t)n, 1);
    int32_t *stack = malloc((size_t)n * 3 * sizeof *stack);   /* (n, 3) frames: rule, alternative, element */
    if (!nullable || !color || !stack) {
        free(nullable), free(color), free(stack);
        return oom(P);
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < n; r++) {
            if (nullable[r]) continue;
            for (int32_t a = 0; a < g->rules[r].n_alts && !nullable[r]; a++) {
                const gelem *e = g->elems + g->rules[r].alts[a];
                while (e->type == GE_RULE && nullable[e->arg]) e++;
                if (e->type == GE_END) nullable[r] = changed = true;
            }
        }
    }
    int rc = LLMI_OK;
    /* Iterative depth-first search over "r can start with rule q" edges.  A frame is
     * (rule, alternative, element): where its walk over r's left corners resumes, so each
     * element is visited once in all. */
    for (int32_t s = 0; s < n && !rc; s++) {
        if (color[s]) continue;
        int32_t sp = 0;
        stack[sp++] = s, stack[sp++] = 0, stack[sp++] = -1;
        color[s] = 1;
        while (sp > 0 && !rc) {
            int32_t *fr = stack + sp - 3;
            const grule *r = &g->rules[fr[0]];
            /* the next left-corner rule reference of r */
            int32_t found = -1;
            while (found < 0 && fr[1] < r->n_alts) {
                if (fr[2] < 0) fr[2] = r->alts[fr[1]];
                const gelem *e = g->elems + fr[2];
                if (e->type == GE_RULE) {
                    found = e->arg;
                    if (nullable[e->arg]) { fr[2]++; continue; }
                }
                fr[1]++, fr[2] = -1;
            }
            if (found < 0) {
                color[fr[0]] = 2;
                sp -= 3;
                continue;
            }
            if (color[found] == 1) {
                const grule *o = &g->rules[g->rules[found].origin];
                rc = llmi_fail(P->st, LLMI_E_USAGE, "%s: left recursion in rule %s: it can reach itself without matching a character",
                               P->what, o->name ? o->name : "?");
            } else if (color[found] == 0) {
                color[found] = 1;
                stack[sp++] = found, stack[sp++] = 0, stack[sp++] = -1;
            }
        }
    }
    free(nullable), free(color), free(stack);
    return rc;
}

int grammar_parse(const char *text, size_t len, const char *what, grammar **out, llmi_status *st) {
    *out = NULL;
    grammar *g = calloc(1, sizeof *g);
    if (!g) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", what);
    gparser P = {.src = text, .p = text, .end = text + len, .what = what, .g = g, .st = st};
    int rc = LLMI_OK;
    skip_space(&P, true);
    while (!rc && P.p < P.end) rc = parse_rule(&P);
    g->root = -1;
    for (int32_t i = 0; !rc && i < g->n_rules; i++) {
        const grule *r = &g->rules[i];
        if (r->name && !r->defined) {
            int line = 1;
            for (int32_t k = 0; k < r->offset; k++) line += text[k] == '\n';
            rc = llmi_fail(st, LLMI_E_USAGE, "%s: line %d: rule %s is used but never defined", what, line, r->name);
        }
        if (r->name && strcmp(r->name, "root") == 0) g->root = i;
    }
    if (!rc && g->root < 0) rc = llmi_fail(st, LLMI_E_USAGE, "%s: no rule named root (the grammar's start)", what);
    if (!rc) rc = check_left_recursion(&P);
    strmap_free(&P.rule_ids);
    if (rc) {
        grammar_free(g);
        return rc;
    }
    *out = g;
    return LLMI_OK;
}

/* ------------------------------------------------------------------ vocabulary trie */

typedef struct tnode {
    int32_t first_child, next_sibling;
    int32_t first_tok;       /* tokens whose text ends here: tok_next links them; -1 none */
    int32_t parent;
    uint8_t byte;
    uint16_t depth;          /* bytes from the root */
} tnode;

struct grammar_vocab {
    int32_t n_vocab;
    tnode *nodes;            /* (n_nodes) node 0 is the root (the empty text) */
    int32_t n_nodes, cap_nodes;
    int32_t *tok_next;       /* (n_vocab) next token ending at the same node */
    int32_t *tok_node;       /* (n_vocab) node where the token's text ends; -1: never allowed */
    int32_t *eog;            /* (n_eog) end-of-generation ids */
    int32_t n_eog;
};

void grammar_vocab_free(grammar_vocab *v) {
    if (!v) return;
    free(v->nodes);
    free(v->tok_next);
    free(v->tok_node);
    free(v->eog);
    free(v);
}

int grammar_vocab_build(const tokenizer *t, grammar_vocab **out, llmi_status *st) {
    *out = NULL;
    int32_t V = tok_n_vocab(t);
    grammar_vocab *v = calloc(1, sizeof *v);
    size_t cap = tok_stream_cap(t) + 16;
    char *piece = malloc(cap);
    if (!v || !piece || !(v->tok_next = malloc((size_t)V * sizeof(int32_t))) ||
        !(v->tok_node = malloc((size_t)V * sizeof(int32_t))) || !(v->eog = malloc((size_t)V * sizeof(int32_t))) ||
        !grow_array((void **)&v->nodes, &v->cap_nodes, 1, sizeof *v->nodes))
        goto oom;
    v->n_vocab = V;
    v->nodes[0] = (tnode){-1, -1, -1, -1, 0, 0};
    v->n_nodes = 1;
    for (int32_t id = 0; id < V; id++) {
        v->tok_node[id] = -1;
        v->tok_next[id] = -1;
        if (tok_is_eog(t, id)) {
            v->eog[v->n_eog++] = id;
            continue;
        }
        if (tok_is_special(t, id)) continue;
        int n = tok_piece(t, id, piece, cap);
        if (n <= 0 || n > 65535) continue;   /* no text: it could never move the grammar on */
        int32_t node = 0;
        for (int i = 0; i < n; i++) {
            uint8_t b = (uint8_t)piece[i];
            int32_t c = v->nodes[node].first_child;
            while (c >= 0 && v->nodes[c].byte != b) c = v->nodes[c].next_sibling;
            if (c < 0) {
                if (!grow_array((void **)&v->nodes, &v->cap_nodes, v->n_nodes + 1, sizeof *v->nodes)) goto oom;
                c = v->n_nodes++;
                v->nodes[c] = (tnode){-1, v->nodes[node].first_child, -1, node, b, (uint16_t)(i + 1)};
                v->nodes[node].first_child = c;
            }
            node = c;
        }
        v->tok_node[id] = node;
        v->tok_next[id] = v->nodes[node].first_tok;
        v->nodes[node].first_tok = id;
    }
    free(piece);
    *out = v;
    return LLMI_OK;
oom:
    free(piece);
    grammar_vocab_free(v);
    return llmi_fail(st, LLMI_E_RUNTIME, "grammar: out of memory for the vocabulary's trie (%d tokens)", V);
}

/* ------------------------------------------------------------------ parse states */

/* A stack is a linked list of nodes (its top element, the node below); node 0 is the empty
 * stack, which means a whole sentence was matched.  A parse set is a sorted list of stack
 * nodes whose tops are all character sets (or the empty stack); set 0 is the empty set:
 * no parse left.  Both are interned, so equal states have equal ids and the move of a
 * set on a code point is computed once. */

/* A code point's UTF-8 read in part: the bits so far, the continuation bytes still to
 * come, and how many it has in all. */
typedef struct { uint32_t value; uint8_t left, len; } utf8_part;

typedef struct { uint64_t key; int32_t val; } hslot;
typedef struct { hslot *s; uint32_t cap, n; } hmap;   /* open addressing; key 0 is free */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static bool hmap_grow(hmap *h) {
    uint32_t cap = h->cap ? h->cap * 2 : 1024;
    hslot *ns = calloc(cap, sizeof *ns);
    if (!ns) return false;
    for (uint32_t i = 0; i < h->cap; i++) {
        if (!h->s[i].key) continue;
        uint32_t j = (uint32_t)mix64(h->s[i].key) & (cap - 1);
        while (ns[j].key) j = (j + 1) & (cap - 1);
        ns[j] = h->s[i];
    }
    free(h->s);
    h->s = ns;
    h->cap = cap;
    return true;
}

/* The slot for key (key != 0): found (val set) or where it goes. */
static hslot *hmap_slot(hmap *h, uint64_t key) {
    uint32_t j = (uint32_t)mix64(key) & (h->cap - 1);
    while (h->s[j].key && h->s[j].key != key) j = (j + 1) & (h->cap - 1);
    return &h->s[j];
}

struct grammar_state {
    const grammar *g;
    const grammar_vocab *v;
    int32_t *node_elem, *node_below;   /* (n_nodes) a stack node's top element and the node under it */
    int32_t n_nodes, cap_nodes, cap_below;
    hmap node_ids;                     /* (elem, below) -> node */
    int32_t *set_pool;                 /* members of every interned set, back to back */
    int32_t n_pool, cap_pool;
    int32_t *set_first, *set_n;        /* (n_sets) */
    int32_t n_sets, cap_first, cap_n, cap_chain;
    hmap set_ids;                      /* hash -> first set with it (chained by set_chain) */
    int32_t *set_chain;
    hmap moves;                        /* (set, code point) -> set */
    int32_t *work, *found;             /* scratch of expand/move */
    uint32_t *visited, visit_gen;      /* (cap_visited) expand_work's mark per node */
    int32_t cap_visited;
    int32_t cap_work, n_work, cap_found, n_found;
    /* where the text stands: a parse set and the UTF-8 bytes of a code point begun but not
     * finished by the last token (value so far, bytes still to come) */
    int32_t cur;
    utf8_part partial;
    struct dfs_frame { int32_t node, set; utf8_part u; } *dfs;
    /* Masks of recent states: a long output keeps coming back to the same few (inside a
     * string, between list items), and a hit costs a copy instead of a trie walk. */
    struct mask_entry { int32_t set; utf8_part u; int count; uint64_t last_use; uint8_t *bits; } masks[MASK_CACHE];
    uint64_t n_mask_calls;
    int32_t cap_dfs;
    llmi_status *st;                   /* the caller's, during one call */
    bool failed;
};

static int state_fail(grammar_state *s, const char *msg) {
    s->failed = true;
    return llmi_fail(s->st, LLMI_E_RUNTIME, "grammar: %s", msg);
}

static int32_t intern_node(grammar_state *s, int32_t elem, int32_t below) {
    uint64_t key = ((uint64_t)(uint32_t)elem << 32 | (uint32_t)below) + 1;
    if ((s->node_ids.n + 1) * 2 > s->node_ids.cap && !hmap_grow(&s->node_ids)) return state_fail(s, "out of memory"), -1;
    hslot *h = hmap_slot(&s->node_ids, key);
    if (h->key) return h->val;
    if (s->n_nodes >= STATE_MAX_NODES) return state_fail(s, "the grammar is too ambiguous to follow (too many parse states)"), -1;
    if (!grow_array((void **)&s->node_elem, &s->cap_nodes, s->n_nodes + 1, sizeof(int32_t)) ||
        !grow_array((void **)&s->node_below, &s->cap_below, s->n_nodes + 1, sizeof(int32_t)))
        return state_fail(s, "out of memory"), -1;
    s->node_elem[s->n_nodes] = elem;
    s->node_below[s->n_nodes] = below;
    h->key = key;
    h->val = s->n_nodes;
    s->node_ids.n++;
    return s->n_nodes++;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* Interns found[0, n_found) (sorted and deduplicated here) as a set. */
static int32_t intern_found(grammar_state *s) {
    int32_t n = s->n_found;
    if (n > 1) qsort(s->found, (size_t)n, sizeof *s->found, cmp_i32);
    int32_t w = 0;
    for (int32_t i = 0; i < n; i++)
        if (w == 0 || s->found[w - 1] != s->found[i]) s->found[w++] = s->found[i];
    n = w;
    if (n == 0) return 0;
    if (n > STATE_MAX_PARSES) return state_fail(s, "the grammar is too ambiguous to follow (more than 4096 parses at once)"), -1;
    uint64_t hsh = 1469598103934665603ULL;
    for (int32_t i = 0; i < n; i++) hsh = (hsh ^ (uint32_t)s->found[i]) * 1099511628211ULL;
    hsh |= 1;
    if ((s->set_ids.n + 1) * 2 > s->set_ids.cap && !hmap_grow(&s->set_ids)) return state_fail(s, "out of memory"), -1;
    hslot *h = hmap_slot(&s->set_ids, hsh);
    if (h->key) {
        for (int32_t id = h->val; id >= 0; id = s->set_chain[id])
            if (s->set_n[id] == n && memcmp(s->set_pool + s->set_first[id], s->found, (size_t)n * sizeof(int32_t)) == 0)
                return id;
    }
    if (!grow_array((void **)&s->set_pool, &s->cap_pool, s->n_pool + n, sizeof(int32_t)) ||
        !grow_array((void **)&s->set_first, &s->cap_first, s->n_sets + 1, sizeof(int32_t)) ||
        !grow_array((void **)&s->set_n, &s->cap_n, s->n_sets + 1, sizeof(int32_t)) ||
        !grow_array((void **)&s->set_chain, &s->cap_chain, s->n_sets + 1, sizeof(int32_t)))
        return state_fail(s, "out of memory"), -1;
    int32_t id = s->n_sets++;
    memcpy(s->set_pool + s->n_pool, s->found, (size_t)n * sizeof(int32_t));
    s->set_first[id] = s->n_pool;
    s->set_n[id] = n;
    s->n_pool += n;
    s->set_chain[id] = h->key ? h->val : -1;
    if (!h->key) s->set_ids.n++;
    h->key = hsh;
    h->val = id;
    return id;
}

static bool push_work(grammar_state *s, int32_t node) {
    if (!grow_array((void **)&s->work, &s->cap_work, s->n_work + 1, sizeof(int32_t))) return state_fail(s, "out of memory"), false;
    s->work[s->n_work++] = node;
    return true;
}

/* Expands the stacks on the work list until each top is a character set (or the stack is
 * empty), adding them to found.  Left recursion was refused, so this ends. */
static int expand_work(grammar_state *s) {
    const grammar *g = s->g;
    /* Each node is expanded once per call: paths through optional parts meet again at the
     * same continuation, and without this a chain of them would expand it once per path. */
    if (++s->visit_gen == 0) {
        memset(s->visited, 0, (size_t)s->cap_visited * sizeof *s->visited);
        s->visit_gen = 1;
    }
    while (s->n_work > 0) {
        int32_t node = s->work[--s->n_work];
        if (node >= s->cap_visited) {
            int32_t old = s->cap_visited;
            if (!grow_array((void **)&s->visited, &s->cap_visited, s->n_nodes, sizeof *s->visited))
                return state_fail(s, "out of memory");
            memset(s->visited + old, 0, (size_t)(s->cap_visited - old) * sizeof *s->visited);
        }
        if (s->visited[node] == s->visit_gen) continue;
        s->visited[node] = s->visit_gen;
        if (node == 0) goto emit;
        int32_t e = s->node_elem[node];
        const gelem *el = &g->elems[e];
        if (el->type == GE_END) {
            if (!push_work(s, s->node_below[node])) return -1;
            continue;
        }
        if (el->type == GE_RULE) {
            /* what follows the reference, unless nothing does */
            int32_t below = s->node_below[node];
            if (g->elems[e + 1].type != GE_END && (below = intern_node(s, e + 1, below)) < 0) return -1;
            const grule *r = &g->rules[el->arg];
            for (int32_t a = 0; a < r->n_alts; a++) {
                int32_t start = r->alts[a];
                int32_t nn = g->elems[start].type == GE_END ? below : intern_node(s, start, below);
                if (nn < 0 || !push_work(s, nn)) return -1;
            }
            continue;
        }
    emit:
        if (!grow_array((void **)&s->found, &s->cap_found, s->n_found + 1, sizeof(int32_t))) return state_fail(s, "out of memory");
        s->found[s->n_found++] = node;
    }
    return 0;
}

/* The set after set reads code point cp (0: no parse accepts it); -1 on failure. */
static int32_t move(grammar_state *s, int32_t set, uint32_t cp) {
    if (set == 0) return 0;
    uint64_t key = ((uint64_t)(uint32_t)set << 32 | cp) + 1;
    if ((s->moves.n + 1) * 2 > s->moves.cap && !hmap_grow(&s->moves)) return state_fail(s, "out of memory"), -1;
    hslot *h = hmap_slot(&s->moves, key);
    if (h->key) return h->val;
    s->n_found = 0;
    s->n_work = 0;
    for (int32_t i = 0; i < s->set_n[set]; i++) {
        int32_t node = s->set_pool[s->set_first[set] + i];
        if (node == 0 || !charset_match(s->g, s->g->elems[s->node_elem[node]].arg, cp)) continue;
        int32_t nn = intern_node(s, s->node_elem[node] + 1, s->node_below[node]);
        if (nn < 0 || !push_work(s, nn)) return -1;
        if (expand_work(s)) return -1;
    }
    int32_t out = intern_found(s);
    if (out < 0) return -1;
    h = hmap_slot(&s->moves, key);   /* interning may not touch moves, but keep it obvious */
    h->key = key;
    h->val = out;
    s->moves.n++;
    return out;
}

/* Whether some parse in set accepts a code point in [lo, hi]. */
static bool set_meets(const grammar_state *s, int32_t set, uint32_t lo, uint32_t hi) {
    for (int32_t i = 0; i < s->set_n[set]; i++) {
        int32_t node = s->set_pool[s->set_first[set] + i];
        if (node != 0 && charset_meets(s->g, s->g->elems[s->node_elem[node]].arg, lo, hi)) return true;
    }
    return false;
}

/* The code points of each UTF-8 length (continuation bytes 1..3), so that overlong forms,
 * surrogates and values past U+10FFFF are refused as they are read.  llama.cpp decodes
 * token text leniently: its masks let byte tokens such as 0xC1 through where a class
 * holds ASCII letters, and greedy decoding then writes invalid UTF-8. */
static const uint32_t k_utf8_min[4] = {0, 0x80, 0x800, 0x10000};
static const uint32_t k_utf8_max[4] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};

/* Whether some parse accepts a valid code point whose UTF-8 starts with the bytes read so
 * far: u->value holds their bits, u->left continuation bytes are still to come. */
static bool partial_ok(const grammar_state *s, int32_t set, const utf8_part *u) {
    uint32_t lo = u->value << (6 * u->left), hi = lo | ((1u << (6 * u->left)) - 1);
    if (lo < k_utf8_min[u->len]) lo = k_utf8_min[u->len];
    if (hi > k_utf8_max[u->len]) hi = k_utf8_max[u->len];
    if (lo > hi) return false;
    if (hi < 0xD800 || lo > 0xDFFF) return set_meets(s, set, lo, hi);
    return (lo < 0xD800 && set_meets(s, set, lo, 0xD7FF)) || (hi > 0xDFFF && set_meets(s, set, 0xE000, hi));
}

static bool set_complete(const grammar_state *s, int32_t set) {
    return set > 0 && s->set_pool[s->set_first[set]] == 0;   /* sorted: node 0 comes first */
}

/* Continuation bytes a lead byte announces, by its value: -1 for a byte that cannot start
 * a code point (a continuation byte, or 0xF8..0xFF). */
static int utf8_more(uint8_t b) { return b < 0x80 ? 0 : b < 0xC0 ? -1 : b < 0xE0 ? 1 : b < 0xF0 ? 2 : b < 0xF8 ? 3 : -1; }

/* Reads byte b in state (set, u): false when no parse can go on (or the bytes are not
 * UTF-8); *err when the state failed. */
static bool read_byte(grammar_state *s, int32_t *set, utf8_part *u, uint8_t b, bool *err) {
    uint32_t cp;
    if (u->left > 0) {
        if ((b >> 6) != 2) return false;
        u->value = (u->value << 6) | (b & 0x3Fu);
        if (--u->left > 0) return partial_ok(s, *set, u);
        cp = u->value;
        if (cp < k_utf8_min[u->len] || cp > k_utf8_max[u->len] || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    } else {
        if (b == 0) return false;   /* llama.cpp reads token text as a C string */
        int more = utf8_more(b);
        if (more < 0) return false;
        if (more > 0) {
            *u = (utf8_part){b & ((1u << (6 - more)) - 1), (uint8_t)more, (uint8_t)more};
            return partial_ok(s, *set, u);
        }
        cp = b;
    }
    int32_t ns = move(s, *set, cp);
    if (ns < 0) return *err = true, false;
    *set = ns;
    *u = (utf8_part){0, 0, 0};
    return ns != 0;
}

int grammar_state_create(const grammar *g, const grammar_vocab *v, grammar_state **out, llmi_status *st) {
    *out = NULL;
    grammar_state *s = calloc(1, sizeof *s);
    if (!s) return llmi_fail(st, LLMI_E_RUNTIME, "grammar: out of memory");
    s->g = g;
    s->v = v;
    s->st = st;
    if (!hmap_grow(&s->node_ids) || !hmap_grow(&s->set_ids) || !hmap_grow(&s->moves)) {
        grammar_state_free(s);
        return llmi_fail(st, LLMI_E_RUNTIME, "grammar: out of memory");
    }
    /* node 0: the empty stack; set 0: no parse */
    if (!grow_array((void **)&s->node_elem, &s->cap_nodes, 1, sizeof(int32_t)) ||
        !grow_array((void **)&s->node_below, &s->cap_below, 1, sizeof(int32_t)) ||
        !grow_array((void **)&s->set_first, &s->cap_first, 1, sizeof(int32_t)) ||
        !grow_array((void **)&s->set_n, &s->cap_n, 1, sizeof(int32_t)) ||
        !grow_array((void **)&s->set_chain, &s->cap_chain, 1, sizeof(int32_t)))
        goto fail;
    s->node_elem[0] = -1;
    s->node_below[0] = 0;
    s->n_nodes = 1;
    s->set_first[0] = s->set_n[0] = 0;
    s->set_chain[0] = -1;
    s->n_sets = 1;
    /* the start: root's alternatives */
    const grule *root = &g->rules[g->root];
    s->n_found = s->n_work = 0;
    for (int32_t a = 0; a < root->n_alts; a++) {
        int32_t start = root->alts[a];
        int32_t nn = g->elems[start].type == GE_END ? 0 : intern_node(s, start, 0);
        if (nn < 0 || !push_work(s, nn)) goto fail;
    }
    if (expand_work(s) || (s->cur = intern_found(s)) < 0) goto fail;
    *out = s;
    return LLMI_OK;
fail:
    grammar_state_free(s);
    return llmi_fail(st, LLMI_E_RUNTIME, "grammar: out of memory");
}

void grammar_state_free(grammar_state *s) {
    if (!s) return;
    free(s->node_elem), free(s->node_below), free(s->node_ids.s);
    free(s->set_pool), free(s->set_first), free(s->set_n), free(s->set_chain), free(s->set_ids.s);
    free(s->moves.s), free(s->work), free(s->found), free(s->dfs), free(s->visited);
    for (int i = 0; i < MASK_CACHE; i++) free(s->masks[i].bits);
    free(s);
}

bool grammar_state_complete(const grammar_state *s) { return s->partial.left == 0 && set_complete(s, s->cur); }

static void allow_tokens_at(const grammar_vocab *v, int32_t node, uint8_t *allowed, int *count) {
    for (int32_t id = v->nodes[node].first_tok; id >= 0; id = v->tok_next[id]) {
        allowed[id] = 1;
        (*count)++;
    }
}

static struct mask_entry *mask_cached(grammar_state *s) {
    for (int i = 0; i < MASK_CACHE; i++) {
        struct mask_entry *m = &s->masks[i];
        if (m->bits && m->set == s->cur && m->u.value == s->partial.value && m->u.left == s->partial.left &&
            m->u.len == s->partial.len)
            return m;
    }
    return NULL;
}

/* Keeps allowed (n_vocab bytes) as the mask of the current state, in the least recently
 * used slot. */
static void mask_keep(grammar_state *s, const uint8_t *allowed, int count) {
    struct mask_entry *m = &s->masks[0];
    for (int i = 1; i < MASK_CACHE && m->bits; i++)
        if (!s->masks[i].bits || s->masks[i].last_use < m->last_use) m = &s->masks[i];
    size_t nb = ((size_t)s->v->n_vocab + 7) / 8;
    if (!m->bits && !(m->bits = malloc(nb))) return;   /* no room: just not cached */
    memset(m->bits, 0, nb);
    for (int32_t t = 0; t < s->v->n_vocab; t++)
        if (allowed[t]) m->bits[t >> 3] |= (uint8_t)(1u << (t & 7));
    m->set = s->cur;
    m->u = s->partial;
    m->count = count;
    m->last_use = s->n_mask_calls;
}

/* Takes the end-of-generation ids out of a mask that has them (the text is complete). */
static int drop_eog(const grammar_vocab *v, uint8_t *allowed, int count) {
    for (int32_t i = 0; i < v->n_eog; i++) count -= allowed[v->eog[i]], allowed[v->eog[i]] = 0;
    return count;
}

int grammar_state_mask(grammar_state *s, bool allow_eog, uint8_t *allowed, llmi_status *st) {
    const grammar_vocab *v = s->v;
    s->st = st;
    s->n_mask_calls++;
    if (s->failed) return state_fail(s, "the state failed before"), -1;
    struct mask_entry *hit = mask_cached(s);
    if (hit) {
        hit->last_use = s->n_mask_calls;
        for (int32_t t = 0; t < v->n_vocab; t++) allowed[t] = (hit->bits[t >> 3] >> (t & 7)) & 1;
        return allow_eog ? hit->count : drop_eog(v, allowed, hit->count);
    }
    memset(allowed, 0, (size_t)v->n_vocab);
    int count = 0;
    if (grammar_state_complete(s))
        for (int32_t i = 0; i < v->n_eog; i++) allowed[v->eog[i]] = 1, count++;
    /* Depth-first over the trie: a frame is a node reached with the state after its bytes. */
    int32_t sp = 0;
    if (!grow_array((void **)&s->dfs, &s->cap_dfs, 1, sizeof *s->dfs)) return state_fail(s, "out of memory"), -1;
    s->dfs[sp++] = (struct dfs_frame){0, s->cur, s->partial};
    while (sp > 0) {
        struct dfs_frame f = s->dfs[--sp];
        if (f.node != 0) allow_tokens_at(v, f.node, allowed, &count);
        for (int32_t c = v->nodes[f.node].first_child; c >= 0; c = v->nodes[c].next_sibling) {
            int32_t set = f.set;
            utf8_part u = f.u;
            bool err = false;
            if (!read_byte(s, &set, &u, v->nodes[c].byte, &err)) {
                if (err) return -1;
                continue;
            }
            if (!grow_array((void **)&s->dfs, &s->cap_dfs, sp + 1, sizeof *s->dfs)) return state_fail(s, "out of memory"), -1;
            s->dfs[sp++] = (struct dfs_frame){c, set, u};
        }
    }
    mask_keep(s, allowed, count);
    return allow_eog ? count : drop_eog(v, allowed, count);
}

int grammar_state_accept(grammar_state *s, int32_t token, llmi_status *st) {
    const grammar_vocab *v = s->v;
    s->st = st;
    if (token < 0 || token >= v->n_vocab) return llmi_fail(st, LLMI_E_RUNTIME, "grammar: token %d outside the vocabulary", token);
    for (int32_t i = 0; i < v->n_eog; i++)
        if (v->eog[i] == token) return LLMI_OK;
    if (s->failed) return state_fail(s, "the state failed before");
    int32_t node = v->tok_node[token];
    if (node < 0) return llmi_fail(st, LLMI_E_RUNTIME, "grammar: token %d has no text the grammar could match", token);
    /* the token's bytes, leaf to root */
    int depth = v->nodes[node].depth;
    if (!grow_array((void **)&s->dfs, &s->cap_dfs, depth, sizeof *s->dfs)) return state_fail(s, "out of memory");
    for (int i = depth - 1, nd = node; i >= 0; i--, nd = v->nodes[nd].parent) s->dfs[i].node = nd;
    int32_t set = s->cur;
    utf8_part u = s->partial;
    for (int i = 0; i < depth; i++) {
        bool err = false;
        if (!read_byte(s, &set, &u, v->nodes[s->dfs[i].node].byte, &err)) {
            if (err) return st->code;
            return llmi_fail(st, LLMI_E_RUNTIME, "grammar: token %d does not continue the text", token);
        }
    }
    s->cur = set;
    s->partial = u;
    return LLMI_OK;
}
