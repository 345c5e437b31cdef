/* json_schema.c — JSON Schema -> GBNF in llama.cpp's language (json_schema.h says what is
 * supported and what is refused).
 *
 * One pass over the schema.  Each schema object becomes a rule named after where it is
 * ("root", "age", "tags-item", "ref-defs-Node"), made of its parts' rules; a $ref target
 * becomes one rule, reserved before its target is converted, so a recursive schema refers
 * to it by name.  The shared rules (space, char, string, number, value, date, ...) are
 * written once, at the end, when used.  Which keyword wins when several are present
 * follows llama.cpp (common/json-schema.cpp build_node): $ref, then oneOf/anyOf, then
 * const/enum, then the type; every other keyword of that object must be one the chosen
 * reading uses, or an annotation, or the conversion fails naming it.
 *
 * The text variant checks what cJSON lets through but llama.cpp's parser (nlohmann::json)
 * refuses (01, 1., raw control characters in strings, invalid UTF-8) and keeps each
 * number's text, so that const/enum values are written as llama.cpp writes them (1.0 stays
 * 1.0, 1e2 becomes 100.0). */
#include "engine/json_schema.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/strbuf.h"
#include "core/strmap.h"
#include "core/utf8.h"

#define JS_MAX_DEPTH 100            /* nested schemas (subschemas and $ref hops) */
#define JS_MAX_JSON_DEPTH 1000      /* JSON nesting anywhere in the document, as cJSON's limit */
#define JS_MAX_PATTERN_DEPTH 100    /* regex groups, as llama.cpp */
#define JS_MAX_REPEAT 100000        /* counts and {m,n}: grammar.c's bound on repetitions */
#define JS_MAX_GRAMMAR (16u << 20)  /* bytes of grammar text */
#define JS_MAX_BOUND 1000000000000000000LL   /* |minimum|, |maximum| with both bounds */
#define JS_MAX_BOUND_ONE_SIDED 1000000000000000LL /* with one: llama.cpp's digit counts need < 10^15 */

/* ------------------------------------------------------------------ names */

/* Keys here are NUL-terminated (cJSON's strings and the converter's own names). */
static int smap_get(const strmap *m, const char *k) { return strmap_get(m, k, strlen(k)); }
static bool smap_put(strmap *m, const char *k, int v) { return strmap_put(m, k, strlen(k), v); }

/* ------------------------------------------------------------------ UTF-8 */

/* core/utf8 with the converter's types: code points here are unsigned.  Its input is
 * checked before (utf8_valid), so 0 is not expected; *cp is then the byte. */
static int utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    int32_t c = n ? s[0] : 0;
    int l = utf8_next((const char *)s, n, &c);
    *cp = (uint32_t)c;
    return l;
}

static void utf8_put(strbuf *b, uint32_t cp) {
    char u[4];
    strbuf_put(b, u, (size_t)utf8_encode((int32_t)cp, u));
}

/* ------------------------------------------------------------------ GBNF text */

/* One code point inside a GBNF literal ("...") or character class ([...]): escaped where
 * the grammar syntax or readability needs it, raw UTF-8 otherwise. */
static void gbnf_cp(strbuf *b, uint32_t cp, bool in_class) {
    if (cp == '"') strbuf_puts(b, "\\\"");
    else if (cp == '\\') strbuf_puts(b, "\\\\");
    else if (in_class && (cp == ']' || cp == '[' || cp == '-')) { strbuf_putc(b, '\\'); strbuf_putc(b, (char)cp); }
    else if (in_class && cp == '^') strbuf_puts(b, "\\x5E");
    else if (cp == '\n') strbuf_puts(b, "\\n");
    else if (cp == '\r') strbuf_puts(b, "\\r");
    else if (cp == '\t') strbuf_puts(b, "\\t");
    else if (cp < 0x20 || cp == 0x7F) strbuf_printf(b, "\\x%02X", (unsigned)cp);
    else if (cp < 0x80) strbuf_putc(b, (char)cp);
    else if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) strbuf_printf(b, cp > 0xFFFF ? "\\U%08X" : "\\u%04X", (unsigned)cp);
    else utf8_put(b, cp);
}

/* A GBNF literal matching exactly the UTF-8 bytes s[0, n) (well-formed). */
static void gbnf_lit(strbuf *b, const char *s, size_t n) {
    strbuf_putc(b, '"');
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (!l) { cp = (unsigned char)s[i]; l = 1; }   /* not reached: input is checked */
        gbnf_cp(b, cp, false);
        i += (size_t)l;
    }
    strbuf_putc(b, '"');
}

typedef struct { uint32_t lo, hi; } cprange;

/* [ranges] or [^ranges]; an empty negated class is any character. */
static void gbnf_class(strbuf *b, bool negate, const cprange *r, size_t n) {
    strbuf_puts(b, negate ? "[^" : "[");
    for (size_t i = 0; i < n; i++) {
        gbnf_cp(b, r[i].lo, true);
        if (r[i].hi != r[i].lo) {
            strbuf_putc(b, '-');
            gbnf_cp(b, r[i].hi, true);
        }
    }
    strbuf_putc(b, ']');
}

/* The set llama.cpp's grammar parser makes of the raw class text "[" cps "]": a '-' between
 * two characters makes a range, whatever they are (llama.cpp writes property names into
 * classes unescaped); a reversed range matches nothing, so it is dropped. */
static size_t class_ranges_raw(const uint32_t *cps, size_t n, cprange *out) {
    size_t k = 0;
    for (size_t j = 0; j < n;) {
        uint32_t lo = cps[j], hi = lo;
        if (j + 2 < n && cps[j + 1] == '-') { hi = cps[j + 2]; j += 3; }
        else j++;
        if (hi >= lo) out[k++] = (cprange){lo, hi};
    }
    return k;
}

/* ------------------------------------------------------------------ the converter */

typedef struct js_rule {
    char *name;
    char *body;                  /* NULL: reserved */
    int next_suffix;             /* the next "-N" to try for a rule named after this one's name */
} js_rule;
typedef struct js_ref {
    char *ref;                   /* the $ref string */
    char *lc_name;               /* the rule name llama.cpp gives it */
    int rule;                    /* index in rules */
    bool done;                   /* converted (else in progress) */
    int barriers;                /* js.barriers when its conversion began */
} js_ref;
typedef struct js_num { const cJSON *node; const char *text; size_t len; } js_num;

/* The shared rules, llama.cpp's PRIMITIVE_RULES and STRING_FORMAT_RULES. */
enum {
    P_SPACE, P_CHAR, P_STRING, P_INTEGRAL, P_DECIMAL, P_NUMBER, P_INTEGER, P_BOOLEAN, P_NULL,
    P_VALUE, P_OBJECT, P_ARRAY, P_UUID, P_DATE, P_TIME, P_DATETIME, P_DOT, P_COUNT
};
#define PB(p) (1u << (p))
static const struct { const char *name, *body; unsigned deps; } k_prims[P_COUNT] = {
    [P_SPACE] = {"space", "| \" \" | \"\\n\"{1,2} [ \\t]{0,20}", 0},
    [P_CHAR] = {"char", "[^\"\\\\\\x7F\\x00-\\x1F] | [\\\\] ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4})", 0},
    [P_STRING] = {"string", "\"\\\"\" char* \"\\\"\"", PB(P_CHAR)},
    [P_INTEGRAL] = {"integral-part", "[0] | [1-9] [0-9]{0,15}", 0},
    [P_DECIMAL] = {"decimal-part", "[0-9]{1,16}", 0},
    [P_NUMBER] = {"number", "(\"-\"? integral-part) (\".\" decimal-part)? ([eE] [-+]? integral-part)?",
                  PB(P_INTEGRAL) | PB(P_DECIMAL)},
    [P_INTEGER] = {"integer", "(\"-\"? integral-part)", PB(P_INTEGRAL)},
    [P_BOOLEAN] = {"boolean", "(\"true\" | \"false\")", 0},
    [P_NULL] = {"null", "\"null\"", 0},
    [P_VALUE] = {"value", "object | array | string | number | boolean | null",
                 PB(P_OBJECT) | PB(P_ARRAY) | PB(P_STRING) | PB(P_NUMBER) | PB(P_BOOLEAN) | PB(P_NULL)},
    [P_OBJECT] = {"object", "\"{\" space ( string \":\" space value (\",\" space string \":\" space value)* )? space \"}\"",
                  PB(P_SPACE) | PB(P_STRING) | PB(P_VALUE)},
    [P_ARRAY] = {"array", "\"[\" space ( value (\",\" space value)* )? space \"]\"", PB(P_SPACE) | PB(P_VALUE)},
    [P_UUID] = {"uuid", "\"\\\"\" [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
                        "[0-9a-fA-F]{12} \"\\\"\"", 0},
    [P_DATE] = {"date", "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | [1-2] [0-9] | \"3\" [0-1] )", 0},
    [P_TIME] = {"time", "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{3} )? "
                        "( \"Z\" | ( \"+\" | \"-\" ) ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )", 0},
    [P_DATETIME] = {"date-time", "date \"T\" time", PB(P_DATE) | PB(P_TIME)},
    [P_DOT] = {"dot", "[^\\x0A\\x0D]", 0},
};

typedef struct js {
    const cJSON *doc;
    llmi_status *st;
    js_rule *rules;              /* (n_rules) rules[0] is root */
    int n_rules, cap_rules;
    strmap names;                  /* rule name -> index in rules; shared rule p -> -2 - p */
    js_ref *refs;                /* (n_refs) the $refs met so far */
    int n_refs, cap_refs;
    strmap ref_ix;                 /* $ref string -> index in refs */
    strmap lc_ref_names;           /* llama.cpp's rule name of a $ref -> index in refs */
    const cJSON *merging[2 * JS_MAX_DEPTH];  /* allOf $ref targets being merged, outermost first */
    int n_merging;
    const js_num *nums;          /* (n_nums) number texts sorted by node; NULL for a cJSON input */
    size_t n_nums;
    unsigned prims;              /* PB() of the shared rules used */
    int prim_next_suffix[P_COUNT];
    int depth;                   /* nested schemas being converted */
    int barriers;                /* text-consuming constructs on the current path (left recursion) */
    size_t bytes;                /* grammar text so far */
} js;

/* Where a schema or keyword is: a chain of keys and indexes up to "#" or a $ref string. */
typedef struct js_path {
    const struct js_path *up;
    const char *key;             /* NULL: index */
    int index;
    const char *base;            /* non-NULL ends the chain */
} js_path;

static void path_render(const js_path *p, strbuf *b) {
    if (p->base) { strbuf_puts(b, p->base); return; }
    path_render(p->up, b);
    strbuf_putc(b, '/');
    if (!p->key) { strbuf_printf(b, "%d", p->index); return; }
    for (const char *k = p->key; *k; k++) {
        if (*k == '~') strbuf_puts(b, "~0");
        else if (*k == '/') strbuf_puts(b, "~1");
        else strbuf_putc(b, *k);
    }
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int js_err(js *c, const js_path *p, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    strbuf b = {0};
    path_render(p, &b);
    const char *ps = b.p && !b.oom ? b.p : "#";
    size_t n = strlen(ps);
    int rc = n > 160 ? llmi_fail(c->st, LLMI_E_USAGE, "json-schema: ...%s: %s", ps + n - 157, msg)
                     : llmi_fail(c->st, LLMI_E_USAGE, "json-schema: %s: %s", ps, msg);
    free(b.p);
    return rc;
}

static int js_oom(js *c) { return llmi_fail(c->st, LLMI_E_RUNTIME, "json-schema: out of memory"); }

/* A new rule named after hint, made unique; its body comes later (js_define). Returns its
 * index, -1 when out of memory. */
static int js_rule_new(js *c, const char *hint) {
    char base[96];
    size_t n = 0;
    for (const char *h = hint; *h && n < 80; h++) {
        char ch = *h;
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-';
        if (ok) base[n++] = ch;
        else if (n == 0 || base[n - 1] != '-') base[n++] = '-';
    }
    if (n == 0) base[n++] = 'r';
    base[n] = '\0';
    char name[112];
    snprintf(name, sizeof name, "%s", base);
    /* a taken name: try name-N from where the last rule named after it stopped, so that many
     * rules with one base stay linear */
    int owner = smap_get(&c->names, name);
    if (owner != -1) {
        int *next = owner >= 0 ? &c->rules[owner].next_suffix : &c->prim_next_suffix[-owner - 2];
        if (*next < 1) *next = 1;
        do snprintf(name, sizeof name, "%s-%d", base, (*next)++);
        while (smap_get(&c->names, name) != -1);
    }
    if (c->n_rules == c->cap_rules) {
        int cap = c->cap_rules ? 2 * c->cap_rules : 64;
        js_rule *r = realloc(c->rules, (size_t)cap * sizeof *r);
        if (!r) return -1;
        c->rules = r;
        c->cap_rules = cap;
    }
    char *nm = strdup(name);
    if (!nm) return -1;
    c->rules[c->n_rules] = (js_rule){nm, NULL, 1};
    if (!smap_put(&c->names, nm, c->n_rules)) { free(nm); return -1; }
    return c->n_rules++;
}

/* Gives rule `want` (or, when want < 0, a new rule named after hint) the body in b.
 * *name gets the rule's name. */
static int js_define(js *c, int want, const char *hint, strbuf *b, const char **name) {
    char *body = strbuf_take(b);
    if (!body) return js_oom(c);
    int r = want >= 0 ? want : js_rule_new(c, hint);
    if (r < 0) { free(body); return js_oom(c); }
    c->bytes += strlen(c->rules[r].name) + strlen(body) + 6;
    if (c->bytes > JS_MAX_GRAMMAR) {
        free(body);
        return llmi_fail(c->st, LLMI_E_USAGE, "json-schema: the grammar would be larger than %u MiB", JS_MAX_GRAMMAR >> 20);
    }
    c->rules[r].body = body;
    *name = c->rules[r].name;
    return LLMI_OK;
}

/* Makes rule `want` an alias of rule `name`, or, with no rule wanted, passes name on. */
static int js_alias(js *c, int want, const char *name, const char **out) {
    if (want < 0) { *out = name; return LLMI_OK; }
    strbuf b = {0};
    strbuf_puts(&b, name);
    return js_define(c, want, NULL, &b, out);
}

static const char *js_prim(js *c, int p) {
    c->prims |= PB(p);
    return k_prims[p].name;
}

/* hint for a part of the schema named by parent: "parent-suffix", or "suffix" at the root. */
static char *js_hint(const char *parent, const char *suffix) {
    size_t a = strlen(parent), b = strlen(suffix);
    if (a > 200) a = 200;
    if (b > 200) b = 200;
    char *h = malloc(a + b + 2);
    if (!h) return NULL;
    memcpy(h, parent, a);
    size_t n = a;
    if (a) h[n++] = '-';
    memcpy(h + n, suffix, b);
    h[n + b] = '\0';
    return h;
}

/* ------------------------------------------------------------------ numbers */

static int js_num_cmp(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)((const js_num *)a)->node, y = (uintptr_t)((const js_num *)b)->node;
    return x < y ? -1 : x > y;
}

/* A number as llama.cpp's parser holds it: an integer when its text has no '.', 'e' or
 * 'E' and fits 64 bits, else a double. */
typedef struct { bool is_int, neg; uint64_t mag; double d; } js_number;

static js_number js_number_of(const js *c, const cJSON *v) {
    js_number r = {.d = v->valuedouble};
    if (c->nums) {
        js_num key = {.node = v};
        const js_num *t = bsearch(&key, c->nums, c->n_nums, sizeof key, js_num_cmp);
        if (!t) return r;
        const char *s = t->text;
        size_t n = t->len, i = 0;
        if (memchr(s, '.', n) || memchr(s, 'e', n) || memchr(s, 'E', n)) return r;
        r.neg = s[0] == '-';
        i = r.neg;
        uint64_t m = 0;
        for (; i < n; i++) {
            unsigned d = (unsigned)(s[i] - '0');
            if (m > (UINT64_MAX - d) / 10) return (js_number){.d = v->valuedouble};
            m = m * 10 + d;
        }
        if (r.neg && m > (uint64_t)INT64_MAX + 1) return (js_number){.d = v->valuedouble};
        r.is_int = true;
        r.mag = m;
        return r;
    }
    double d = v->valuedouble;
    if (isfinite(d) && d == floor(d) && fabs(d) < 9.2e18) {
        r.is_int = true;
        r.neg = d < 0;
        r.mag = (uint64_t)fabs(d);
    }
    return r;
}

static bool js_is_integral(const js *c, const cJSON *v) {
    js_number n = js_number_of(c, v);
    return n.is_int || (isfinite(n.d) && n.d == floor(n.d));
}

/* nlohmann::json's dump of a double: the shortest digits that read back (nlohmann uses
 * Grisu2, which is the shortest in all but rare cases), written as digits.0, d.ddd,
 * 0.000ddd or d.ddde+XX. */
static void js_dump_double(strbuf *b, double v) {
    if (v == 0) { strbuf_puts(b, signbit(v) ? "-0.0" : "0.0"); return; }
    if (v < 0) { strbuf_putc(b, '-'); v = -v; }
    char buf[48];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, v);
        if (strtod(buf, NULL) == v) break;
    }
    char dig[24];
    int k = 0;
    const char *q = buf;
    for (; *q && *q != 'e' && k < 20; q++)
        if (*q >= '0' && *q <= '9') dig[k++] = *q;
    int n = atoi(q + 1) + 1;   /* the decimal point sits after n digits */
    if (k <= n && n <= 15) {
        strbuf_put(b, dig, (size_t)k);
        for (int i = k; i < n; i++) strbuf_putc(b, '0');
        strbuf_puts(b, ".0");
    } else if (0 < n && n <= 15) {
        strbuf_put(b, dig, (size_t)n);
        strbuf_putc(b, '.');
        strbuf_put(b, dig + n, (size_t)(k - n));
    } else if (-4 < n && n <= 0) {
        strbuf_puts(b, "0.");
        for (int i = n; i < 0; i++) strbuf_putc(b, '0');
        strbuf_put(b, dig, (size_t)k);
    } else {
        strbuf_putc(b, dig[0]);
        if (k > 1) { strbuf_putc(b, '.'); strbuf_put(b, dig + 1, (size_t)(k - 1)); }
        int e = n - 1;
        strbuf_printf(b, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
}

static void js_dump_number(const js *c, strbuf *b, const cJSON *v) {
    js_number n = js_number_of(c, v);
    if (!n.is_int) { js_dump_double(b, n.d); return; }
    if (n.neg && n.mag) strbuf_putc(b, '-');
    strbuf_printf(b, "%llu", (unsigned long long)n.mag);
}

/* nlohmann::json's dump of a string: ", \ and control characters escaped, the rest raw. */
static void js_dump_string(strbuf *b, const char *s) {
    strbuf_putc(b, '"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': strbuf_puts(b, "\\\""); break;
        case '\\': strbuf_puts(b, "\\\\"); break;
        case '\b': strbuf_puts(b, "\\b"); break;
        case '\f': strbuf_puts(b, "\\f"); break;
        case '\n': strbuf_puts(b, "\\n"); break;
        case '\r': strbuf_puts(b, "\\r"); break;
        case '\t': strbuf_puts(b, "\\t"); break;
        default:
            if (*p < 0x20) strbuf_printf(b, "\\u%04x", *p);
            else strbuf_putc(b, (char)*p);
        }
    }
    strbuf_putc(b, '"');
}

/* A JSON value as nlohmann::json dumps it: compact, keys in document order. */
static void js_dump(const js *c, strbuf *b, const cJSON *v) {
    if (cJSON_IsNull(v)) strbuf_puts(b, "null");
    else if (cJSON_IsTrue(v)) strbuf_puts(b, "true");
    else if (cJSON_IsFalse(v)) strbuf_puts(b, "false");
    else if (cJSON_IsNumber(v)) js_dump_number(c, b, v);
    else if (cJSON_IsString(v)) js_dump_string(b, v->valuestring);
    else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        bool obj = cJSON_IsObject(v);
        strbuf_putc(b, obj ? '{' : '[');
        for (const cJSON *e = v->child; e; e = e->next) {
            if (e != v->child) strbuf_putc(b, ',');
            if (obj) { js_dump_string(b, e->string); strbuf_putc(b, ':'); }
            js_dump(c, b, e);
        }
        strbuf_putc(b, obj ? '}' : ']');
    }
}

/* Significant digits of the shortest decimal that reads back as d. */
static int js_digits(double d) {
    char buf[48];
    int prec = 1;
    for (; prec < 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, fabs(d));
        if (strtod(buf, NULL) == fabs(d)) break;
    }
    return prec;
}

/* A const/enum value whose dump may differ from nlohmann's: a double that needs 16 or more
 * significant digits (up to 15 the shortest digits are unique, so Grisu2 finds the same;
 * beyond, it may pick another of several).  Returns that number, or NULL. */
static const cJSON *js_inexact_number(const js *c, const cJSON *v) {
    if (cJSON_IsNumber(v)) return !js_number_of(c, v).is_int && v->valuedouble != 0 && js_digits(v->valuedouble) >= 16 ? v : NULL;
    for (const cJSON *e = (cJSON_IsArray(v) || cJSON_IsObject(v)) ? v->child : NULL; e; e = e->next) {
        const cJSON *x = js_inexact_number(c, e);
        if (x) return x;
    }
    return NULL;
}

/* The GBNF literal of a value's dump: the text llama.cpp's const/enum rules match. */
static void js_value_lit(const js *c, strbuf *b, const cJSON *v) {
    strbuf d = {0};
    js_dump(c, &d, v);
    if (d.oom) { b->oom = true; free(d.p); return; }
    gbnf_lit(b, d.p ? d.p : "", d.n);
    free(d.p);
}

/* ------------------------------------------------------------------ the document */

static int js_key_cmp(const void *a, const void *b) {
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

/* What every value of the document must be, wherever it is: objects without repeated keys
 * (nlohmann keeps the last, cJSON the first), well-formed UTF-8, finite numbers. */
static int js_check_doc(js *c, const cJSON *v, const js_path *p, int depth) {
    if (depth > JS_MAX_JSON_DEPTH) return js_err(c, p, "JSON nested deeper than %d levels", JS_MAX_JSON_DEPTH);
    if (cJSON_IsString(v) && !utf8_valid(v->valuestring, strlen(v->valuestring))) return js_err(c, p, "a string is not valid UTF-8");
    if (cJSON_IsNumber(v) && !isfinite(v->valuedouble)) return js_err(c, p, "a number is out of range");
    if (cJSON_IsRaw(v) || cJSON_IsInvalid(v)) return js_err(c, p, "not a JSON value");
    if (!cJSON_IsArray(v) && !cJSON_IsObject(v)) return LLMI_OK;
    bool obj = cJSON_IsObject(v);
    size_t n = 0;
    for (const cJSON *e = v->child; e; e = e->next) n++;
    if (obj && n > 1) {
        const cJSON **keys = malloc(n * sizeof *keys);
        if (!keys) return js_oom(c);
        size_t i = 0;
        for (const cJSON *e = v->child; e; e = e->next) keys[i++] = e;
        qsort(keys, n, sizeof *keys, js_key_cmp);
        for (i = 1; i < n && strcmp(keys[i - 1]->string, keys[i]->string); i++) {}
        if (i < n) {
            int rc = js_err(c, p, "the key \"%.60s\" appears twice", keys[i]->string);
            free(keys);
            return rc;
        }
        free(keys);
    }
    int idx = 0;
    for (const cJSON *e = v->child; e; e = e->next, idx++) {
        if (obj && !utf8_valid(e->string, strlen(e->string))) return js_err(c, p, "a key is not valid UTF-8");
        js_path cp = {.up = p, .key = obj ? e->string : NULL, .index = idx};
        int rc = js_check_doc(c, e, &cp, depth + 1);
        if (rc) return rc;
    }
    return LLMI_OK;
}

/* JSON text checks, and the text of every number in document order.  Runs after cJSON
 * accepted the text, so only what cJSON is lax about is looked at. */
static int js_lex(llmi_status *st, const char *t, size_t n, js_num **out, size_t *n_out) {
    js_num *nums = NULL;
    size_t k = 0, cap = 0;
    const unsigned char *s = (const unsigned char *)t;
    size_t i = 0;
    const char *why = NULL;
    if (n >= 3 && s[0] == 0xEF && s[1] == 0xBB && s[2] == 0xBF) i = 3;   /* a BOM, as both parsers skip */
    while (i < n && !why) {
        unsigned char ch = s[i];
        if (ch == '"') {
            for (i++; i < n && s[i] != '"';) {
                if (s[i] == '\\') {
                    if (i + 1 < n && s[i + 1] == 'u' && i + 5 < n && !memcmp(s + i + 2, "0000", 4)) {
                        why = "\\u0000 in a string is not supported";
                        break;
                    }
                    i += i + 1 < n && s[i + 1] == 'u' ? 6 : 2;
                } else if (s[i] < 0x20) {
                    why = "a control character in a string must be escaped";
                    break;
                } else {
                    uint32_t cp;
                    int l = utf8_decode(s + i, n - i, &cp);
                    if (!l) { why = "invalid UTF-8"; break; }
                    i += (size_t)l;
                }
            }
            if (!why) i++;
        } else if (ch == '-' || (ch >= '0' && ch <= '9')) {
            size_t b = i;
            if (s[i] == '-') i++;
            if (i < n && s[i] == '0') i++;
            else if (i < n && s[i] >= '1' && s[i] <= '9') while (i < n && s[i] >= '0' && s[i] <= '9') i++;
            else { why = "invalid number"; i = b; break; }
            if (i < n && s[i] == '.') {
                size_t d = ++i;
                while (i < n && s[i] >= '0' && s[i] <= '9') i++;
                if (i == d) { why = "invalid number"; i = b; break; }
            }
            if (i < n && (s[i] == 'e' || s[i] == 'E')) {
                i++;
                if (i < n && (s[i] == '+' || s[i] == '-')) i++;
                size_t d = i;
                while (i < n && s[i] >= '0' && s[i] <= '9') i++;
                if (i == d) { why = "invalid number"; i = b; break; }
            }
            if (i < n && ((s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == 'e' || s[i] == 'E' || s[i] == '+' ||
                          s[i] == '-')) {
                why = "invalid number";
                i = b;
                break;
            }
            if (k == cap) {
                cap = cap ? 2 * cap : 64;
                js_num *m = realloc(nums, cap * sizeof *m);
                if (!m) { free(nums); return llmi_fail(st, LLMI_E_RUNTIME, "json-schema: out of memory"); }
                nums = m;
            }
            nums[k++] = (js_num){NULL, t + b, i - b};
        } else if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '{' || ch == '}' || ch == '[' ||
                   ch == ']' || ch == ':' || ch == ',') {
            i++;
        } else if (ch >= 'a' && ch <= 'z') {
            while (i < n && s[i] >= 'a' && s[i] <= 'z') i++;
        } else {
            why = "unexpected character";
        }
    }
    if (why) {
        free(nums);
        return llmi_fail(st, LLMI_E_USAGE, "json-schema: invalid JSON at offset %zu: %s", i, why);
    }
    *out = nums;
    *n_out = k;
    return LLMI_OK;
}

static void js_collect_numbers(const cJSON *v, js_num *nums, size_t n, size_t *k) {
    if (cJSON_IsNumber(v)) {
        if (*k < n) nums[*k].node = v;
        (*k)++;
    }
    for (const cJSON *e = (cJSON_IsArray(v) || cJSON_IsObject(v)) ? v->child : NULL; e; e = e->next)
        js_collect_numbers(e, nums, n, k);
}

/* ------------------------------------------------------------------ keywords */

enum {
    KW_REF, KW_ANYOF, KW_ONEOF, KW_ALLOF, KW_CONST, KW_ENUM, KW_TYPE, KW_PROPERTIES, KW_REQUIRED, KW_ADDPROPS,
    KW_ITEMS, KW_PREFIXITEMS, KW_MINITEMS, KW_MAXITEMS, KW_PATTERN, KW_FORMAT, KW_MINLENGTH, KW_MAXLENGTH,
    KW_MINIMUM, KW_MAXIMUM, KW_EXMIN, KW_EXMAX, KW_COUNT
};
#define KB(k) (1u << (k))
static const char *const k_keywords[KW_COUNT] = {
    "$ref", "anyOf", "oneOf", "allOf", "const", "enum", "type", "properties", "required", "additionalProperties",
    "items", "prefixItems", "minItems", "maxItems", "pattern", "format", "minLength", "maxLength",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
};
/* Annotations, and the containers of $ref targets: they constrain nothing. */
static const char *const k_ignored[] = {
    "title", "description", "examples", "default", "$schema", "$id", "$comment",
    "readOnly", "writeOnly", "deprecated", "$defs", "definitions",
};

static int kw_id(const char *key) {
    for (int k = 0; k < KW_COUNT; k++)
        if (!strcmp(key, k_keywords[k])) return k;
    for (size_t i = 0; i < sizeof k_ignored / sizeof k_ignored[0]; i++)
        if (!strcmp(key, k_ignored[i])) return KW_COUNT;
    return -1;
}

/* What a schema object is read as, in llama.cpp's order of precedence. */
typedef enum {
    K_REF, K_ANYOF, K_ONEOF, K_CONST, K_ENUM, K_TYPES, K_OBJECT, K_ALLOF, K_ARRAY, K_TUPLE, K_STRING, K_INTEGER,
    K_NUMBER, K_BOOLEAN, K_NULL, K_ANY, K_BADTYPE
} js_kind;

static const char *const k_kind_where[] = {
    [K_REF] = "beside $ref", [K_ANYOF] = "beside anyOf", [K_ONEOF] = "beside oneOf", [K_CONST] = "beside const",
    [K_ENUM] = "beside enum", [K_TYPES] = "for a list of types", [K_OBJECT] = "for type object",
    [K_ALLOF] = "beside allOf", [K_ARRAY] = "for type array", [K_TUPLE] = "for a tuple (items as an array)",
    [K_STRING] = "for type string", [K_INTEGER] = "for type integer", [K_NUMBER] = "for type number",
    [K_BOOLEAN] = "for type boolean", [K_NULL] = "for type null", [K_ANY] = "without a type", [K_BADTYPE] = "",
};

static bool js_known_format(const char *f) {
    return !strcmp(f, "date") || !strcmp(f, "time") || !strcmp(f, "date-time") || !strcmp(f, "uuid") ||
           (strlen(f) == 5 && !strncmp(f, "uuid", 4) && f[4] >= '1' && f[4] <= '5');
}

/* type overrides the object's "type" for one member of a type list. */
static js_kind js_kind_of(const cJSON *s, const char *type) {
    if (cJSON_GetObjectItemCaseSensitive(s, "$ref")) return K_REF;
    if (cJSON_GetObjectItemCaseSensitive(s, "oneOf")) return K_ONEOF;
    if (cJSON_GetObjectItemCaseSensitive(s, "anyOf")) return K_ANYOF;
    if (cJSON_GetObjectItemCaseSensitive(s, "const")) return K_CONST;
    if (cJSON_GetObjectItemCaseSensitive(s, "enum")) return K_ENUM;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (!type && t) {
        if (cJSON_IsArray(t)) return K_TYPES;
        if (!cJSON_IsString(t)) return K_BADTYPE;
        type = t->valuestring;
    }
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    bool has_props = cJSON_GetObjectItemCaseSensitive(s, "properties") || (addl && !cJSON_IsTrue(addl));
    bool all_of = cJSON_GetObjectItemCaseSensitive(s, "allOf") != NULL;
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    bool tuple = items ? cJSON_IsArray(items) : prefix && cJSON_IsArray(prefix);
    if (!type) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(s, "format");
        if (has_props) return K_OBJECT;
        if (all_of) return K_ALLOF;
        if (items || prefix) return tuple ? K_TUPLE : K_ARRAY;
        if (cJSON_GetObjectItemCaseSensitive(s, "pattern") || cJSON_GetObjectItemCaseSensitive(s, "minLength") ||
            cJSON_GetObjectItemCaseSensitive(s, "maxLength") || (cJSON_IsString(f) && js_known_format(f->valuestring)))
            return K_STRING;
        return K_ANY;
    }
    if (!strcmp(type, "object")) return !has_props && all_of ? K_ALLOF : K_OBJECT;
    if (!strcmp(type, "string")) return all_of ? K_ALLOF : K_STRING;
    if (!strcmp(type, "array")) return tuple ? K_TUPLE : K_ARRAY;
    if (!strcmp(type, "integer")) return K_INTEGER;
    if (!strcmp(type, "number")) return K_NUMBER;
    if (!strcmp(type, "boolean")) return K_BOOLEAN;
    if (!strcmp(type, "null")) return K_NULL;
    return K_BADTYPE;
}

/* The keywords a reading uses; any other one present is refused. */
static unsigned js_kind_uses(js_kind k, const cJSON *s) {
    switch (k) {
    case K_REF: return KB(KW_REF);
    case K_ANYOF: return KB(KW_ANYOF);
    case K_ONEOF: return KB(KW_ONEOF);
    case K_CONST: return KB(KW_CONST) | KB(KW_TYPE);
    case K_ENUM: return KB(KW_ENUM) | KB(KW_TYPE);
    case K_TYPES: return KB(KW_TYPE);
    case K_OBJECT: return KB(KW_TYPE) | KB(KW_PROPERTIES) | KB(KW_REQUIRED) | KB(KW_ADDPROPS);
    case K_ALLOF: return KB(KW_TYPE) | KB(KW_ALLOF);
    case K_ARRAY: return KB(KW_TYPE) | KB(KW_ITEMS) | KB(KW_PREFIXITEMS) | KB(KW_MINITEMS) | KB(KW_MAXITEMS);
    case K_TUPLE: return KB(KW_TYPE) | KB(KW_ITEMS) | KB(KW_PREFIXITEMS);
    case K_STRING: return KB(KW_TYPE) | KB(KW_PATTERN) | KB(KW_FORMAT) | KB(KW_MINLENGTH) | KB(KW_MAXLENGTH);
    case K_INTEGER: return KB(KW_TYPE) | KB(KW_MINIMUM) | KB(KW_MAXIMUM) | KB(KW_EXMIN) | KB(KW_EXMAX);
    case K_NUMBER: case K_BOOLEAN: case K_NULL: case K_BADTYPE: return KB(KW_TYPE);
    case K_ANY: {
        /* additionalProperties: true adds nothing to "any value" */
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
        return a && cJSON_IsTrue(a) ? KB(KW_ADDPROPS) : 0;
    }
    }
    return 0;
}

/* JSON types as a bit set, for "type" lists and for checking enum values against "type". */
enum { T_NULL = 1, T_BOOLEAN = 2, T_INTEGER = 4, T_NUMBER = 8, T_STRING = 16, T_ARRAY = 32, T_OBJECT = 64 };
static const char *const k_type_names[] = {"null", "boolean", "integer", "number", "string", "array", "object"};

static int js_type_bit(const char *name) {
    for (int i = 0; i < 7; i++)
        if (!strcmp(name, k_type_names[i])) return 1 << i;
    return 0;
}

/* "type" (a name or a non-empty list of distinct names) as a bit set. */
static int js_types(js *c, const cJSON *t, const js_path *p, unsigned *mask) {
    *mask = 0;
    if (cJSON_IsString(t)) {
        int b = js_type_bit(t->valuestring);
        if (!b) return js_err(c, p, "unknown type \"%.40s\"", t->valuestring);
        *mask = (unsigned)b;
        return LLMI_OK;
    }
    if (!cJSON_IsArray(t) || !t->child) return js_err(c, p, "type must be a type name or a non-empty list of them");
    for (const cJSON *e = t->child; e; e = e->next) {
        int b = cJSON_IsString(e) ? js_type_bit(e->valuestring) : 0;
        if (!b) return js_err(c, p, "type lists %s, which is not a type name", cJSON_IsString(e) ? e->valuestring : "a non-string");
        if (*mask & (unsigned)b) return js_err(c, p, "type lists \"%s\" twice", e->valuestring);
        *mask |= (unsigned)b;
    }
    return LLMI_OK;
}

static unsigned js_value_types(const js *c, const cJSON *v) {
    if (cJSON_IsNull(v)) return T_NULL;
    if (cJSON_IsBool(v)) return T_BOOLEAN;
    if (cJSON_IsNumber(v)) return js_is_integral(c, v) ? T_INTEGER | T_NUMBER : T_NUMBER;
    if (cJSON_IsString(v)) return T_STRING;
    if (cJSON_IsArray(v)) return T_ARRAY;
    return T_OBJECT;
}

/* ------------------------------------------------------------------ repetitions */

/* llama.cpp's build_repetition: item min..max times (max < 0: unbounded), separated by sep
 * when given. */
static void js_repeat(strbuf *b, const char *item, long min, long max, const char *sep) {
    if (max == 0) return;
    if (min == 0 && max == 1) { strbuf_puts(b, item); strbuf_putc(b, '?'); return; }
    if (!sep) {
        strbuf_puts(b, item);
        if (min == 1 && max < 0) strbuf_putc(b, '+');
        else if (min == 0 && max < 0) strbuf_putc(b, '*');
        else if (max < 0) strbuf_printf(b, "{%ld,}", min);
        else strbuf_printf(b, "{%ld,%ld}", min, max);
        return;
    }
    strbuf tail = {0};
    strbuf_puts(&tail, "(");
    strbuf_puts(&tail, sep);
    strbuf_puts(&tail, " ");
    strbuf_puts(&tail, item);
    strbuf_puts(&tail, ")");
    if (min == 0) strbuf_puts(b, "(");
    strbuf_puts(b, item);
    strbuf_putc(b, ' ');
    if (tail.oom) b->oom = true;
    else js_repeat(b, tail.p, min == 0 ? 0 : min - 1, max < 0 ? -1 : max - 1, NULL);
    free(tail.p);
    if (min == 0) strbuf_puts(b, ")?");
}

/* A non-negative integer count (minItems, maxLength, ...): *v = -1 when absent. */
static int js_count(js *c, const cJSON *s, const char *key, const js_path *p, long *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, key);
    *v = -1;
    if (!x) return LLMI_OK;
    js_number n = cJSON_IsNumber(x) ? js_number_of(c, x) : (js_number){0};
    if (!cJSON_IsNumber(x) || !n.is_int || (n.neg && n.mag)) return js_err(c, p, "%s must be a non-negative integer", key);
    if (n.mag > JS_MAX_REPEAT) return js_err(c, p, "%s above %d is not supported", key, JS_MAX_REPEAT);
    *v = (long)n.mag;
    return LLMI_OK;
}

static int js_count_pair(js *c, const cJSON *s, const char *kmin, const char *kmax, const js_path *p, long *min, long *max) {
    int rc = js_count(c, s, kmin, p, min);
    if (!rc) rc = js_count(c, s, kmax, p, max);
    if (rc) return rc;
    if (*min < 0) *min = 0;
    if (*max >= 0 && *min > *max) return js_err(c, p, "%s %ld is above %s %ld", kmin, *min, kmax, *max);
    return LLMI_OK;
}

/* ------------------------------------------------------------------ integer ranges */

/* The integers llama.cpp's build_min_max_int accepts, built the same way (so with its
 * quirks: "-0" is accepted when the range crosses zero, and a one-sided bound of 10 or
 * more only constrains the first digit and the length). */
static const char k_zeros[] = "0000000000000000000000", k_nines[] = "9999999999999999999999";

static void ir_digits(strbuf *b, char lo, char hi) {
    if (lo == hi) strbuf_printf(b, "[%c]", lo);
    else strbuf_printf(b, "[%c-%c]", lo, hi);
}

static void ir_more(strbuf *b, int lo, int hi) {
    strbuf_puts(b, "[0-9]");
    if (lo == hi && lo == 1) return;
    if (lo == hi) strbuf_printf(b, "{%d}", lo);
    else strbuf_printf(b, "{%d,%d}", lo, hi);
}

/* Numbers from `from` to `to`, both len digits long. */
static void ir_same_len(strbuf *b, const char *from, const char *to, size_t len) {
    size_t i = 0;
    while (i < len && from[i] == to[i]) i++;
    if (i > 0) { strbuf_putc(b, '"'); strbuf_put(b, from, i); strbuf_putc(b, '"'); }
    if (i == len) return;
    if (i > 0) strbuf_putc(b, ' ');
    size_t rest = len - i - 1;
    if (rest == 0) { strbuf_printf(b, "[%c-%c]", from[i], to[i]); return; }
    const char *fs = from + i + 1, *ts = to + i + 1;
    bool from_zeros = !strncmp(fs, k_zeros, rest), to_nines = !strncmp(ts, k_nines, rest), to_done = false;
    strbuf_putc(b, '(');
    if (from_zeros) {
        ir_digits(b, from[i], (char)(to[i] - 1));
        strbuf_putc(b, ' ');
        ir_more(b, (int)rest, (int)rest);
    } else {
        strbuf_printf(b, "[%c] (", from[i]);
        ir_same_len(b, fs, k_nines, rest);
        strbuf_putc(b, ')');
        if (from[i] < to[i] - 1) {
            strbuf_puts(b, " | ");
            to_done = to_nines;
            ir_digits(b, (char)(from[i] + 1), to_nines ? to[i] : (char)(to[i] - 1));
            strbuf_putc(b, ' ');
            ir_more(b, (int)rest, (int)rest);
        }
    }
    if (!to_done) {
        strbuf_puts(b, " | ");
        ir_digits(b, to[i], to[i]);
        strbuf_putc(b, ' ');
        ir_same_len(b, k_zeros, ts, rest);
    }
    strbuf_putc(b, ')');
}

static void ir_range(strbuf *b, bool has_lo, int64_t lo, bool has_hi, int64_t hi, int decimals, bool top);

static void ir_both(strbuf *b, int64_t lo, int64_t hi, int decimals) {
    if (lo < 0 && hi < 0) {
        strbuf_puts(b, "\"-\" (");
        ir_range(b, true, -hi, true, -lo, decimals, true);
        strbuf_putc(b, ')');
        return;
    }
    if (lo < 0) {
        strbuf_puts(b, "\"-\" (");
        ir_range(b, true, 0, true, -lo, decimals, true);
        strbuf_puts(b, ") | ");
        lo = 0;
    }
    char a[24], z[24];
    snprintf(a, sizeof a, "%lld", (long long)lo);
    snprintf(z, sizeof z, "%lld", (long long)hi);
    size_t la = strlen(a), lz = strlen(z);
    for (size_t d = la; d < lz; d++) {
        ir_same_len(b, a, k_nines, d);
        a[0] = '1';
        memset(a + 1, '0', d);
        a[d + 1] = '\0';
        strbuf_puts(b, " | ");
    }
    ir_same_len(b, a, z, lz);
}

static void ir_from(strbuf *b, int64_t lo, int decimals, bool top) {
    int less = decimals > 2 ? decimals - 1 : 1;
    if (lo < 0) {
        strbuf_puts(b, "\"-\" (");
        ir_range(b, false, 0, true, -lo, decimals, false);
        strbuf_puts(b, ") | [0] | [1-9] ");
        ir_more(b, 0, decimals - 1);
    } else if (lo == 0) {
        if (top) { strbuf_puts(b, "[0] | [1-9] "); ir_more(b, 0, less); }
        else ir_more(b, 1, decimals);
    } else if (lo <= 9) {
        char d = (char)('0' + lo), start = top ? '1' : '0';
        if (d > start) {
            ir_digits(b, start, (char)(d - 1));
            strbuf_putc(b, ' ');
            ir_more(b, 1, less);
            strbuf_puts(b, " | ");
        }
        ir_digits(b, d, '9');
        strbuf_putc(b, ' ');
        ir_more(b, 0, less);
    } else {
        char s[24];
        snprintf(s, sizeof s, "%lld", (long long)lo);
        int len = (int)strlen(s);
        char d = s[0];
        if (d > '1') {
            ir_digits(b, top ? '1' : '0', (char)(d - 1));
            strbuf_putc(b, ' ');
            ir_more(b, len, less);
            strbuf_puts(b, " | ");
        }
        ir_digits(b, d, d);
        strbuf_puts(b, " (");
        ir_range(b, true, strtoll(s + 1, NULL, 10), false, 0, less, false);
        strbuf_putc(b, ')');
        if (d < '9') {
            strbuf_puts(b, " | ");
            ir_digits(b, (char)(d + 1), '9');
            strbuf_putc(b, ' ');
            ir_more(b, len - 1, less);
        }
    }
}

/* Whether llama.cpp's grammar for a bound on one side only is the integers it says.  It
 * drops the leading zeros of the digits left after the first (105 is read as 1, then 5 or
 * more: 104 passes), skips longer numbers with a 0 after a middle 1 (minimum 110 refuses
 * 1000), and lets "-0123" through below zero.  Found exhaustively up to 10^5 against the
 * canonical integers (tests/test_json_schema.c keeps a sample). */
static bool ir_one_sided_exact(bool is_min, int64_t v) {
    if (is_min ? v <= 99 : v >= 0) return true;
    char s[24];
    snprintf(s, sizeof s, "%lld", (long long)llabs(v));
    size_t n = strlen(s);
    if (!is_min && (n < 2 || s[0] != '1')) return false;
    for (size_t i = 1; i + 1 < n; i++)
        if (s[i] < '2') return false;
    return true;
}

static void ir_range(strbuf *b, bool has_lo, int64_t lo, bool has_hi, int64_t hi, int decimals, bool top) {
    if (has_lo && has_hi) { ir_both(b, lo, hi, decimals); return; }
    if (has_lo) { ir_from(b, lo, decimals, top); return; }
    int less = decimals > 2 ? decimals - 1 : 1;
    if (hi >= 0) {
        if (top) { strbuf_puts(b, "\"-\" [1-9] "); ir_more(b, 0, less); strbuf_puts(b, " | "); }
        ir_range(b, true, 0, true, hi, decimals, true);
    } else {
        strbuf_puts(b, "\"-\" (");
        ir_range(b, true, -hi, false, 0, decimals, false);
        strbuf_putc(b, ')');
    }
}

/* ------------------------------------------------------------------ patterns */

/* A regular expression ^...$ turned into GBNF as llama.cpp's _visit_pattern does: literal
 * runs, [classes] in GBNF's syntax, (groups), (?:groups), |, ., and the quantifiers * + ?
 * {m} {m,} {m,n}.  Where llama.cpp would give up (and accept any string) or build a
 * grammar that means something else, this fails instead. */
enum { PI_LIT, PI_ATOM, PI_BAR, PI_QUANT };
typedef struct { int kind; strbuf text; size_t n_cps; } pat_item;   /* PI_LIT: escaped literal body, n_cps characters */

typedef struct pat {
    js *c;
    const js_path *p;
    const char *s;               /* between ^ and $ */
    size_t n, i;
    int depth;
} pat;

static int pat_fail(pat *P, const char *why) {
    return js_err(P->c, P->p, "pattern: %s (at character %zu of the pattern)", why, P->i + 2);
}

static bool pat_special(char ch) { return ch && strchr("|.()[]{}*+?^$", ch) != NULL; }

/* A GBNF escape at s[i] ('\\'): \xHH \uHHHH \UHHHHHHHH \t \r \n \\ \" \[ \] \-.  Returns
 * its length, 0 when it is not one. */
static size_t pat_gbnf_escape(const char *s, size_t n, size_t i, uint32_t *cp) {
    if (i + 1 >= n || s[i] != '\\') return 0;
    int hex = 0;
    switch (s[i + 1]) {
    case 'x': hex = 2; break;
    case 'u': hex = 4; break;
    case 'U': hex = 8; break;
    case 't': *cp = '\t'; return 2;
    case 'r': *cp = '\r'; return 2;
    case 'n': *cp = '\n'; return 2;
    case '\\': case '"': case '[': case ']': case '-': *cp = (unsigned char)s[i + 1]; return 2;
    default: return 0;
    }
    if (i + 2 + (size_t)hex > n) return 0;
    uint32_t v = 0;
    for (int k = 0; k < hex; k++) {
        char h = s[i + 2 + (size_t)k];
        int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (d < 0) return 0;
        v = (v << 4) | (uint32_t)d;
    }
    *cp = v;
    return 2 + (size_t)hex;
}

static int pat_push(pat *P, pat_item **items, size_t *n, size_t *cap, pat_item it) {
    if (*n == *cap) {
        size_t c2 = *cap ? 2 * *cap : 16;
        pat_item *m = realloc(*items, c2 * sizeof *m);
        if (!m) { free(it.text.p); return js_oom(P->c); }
        *items = m;
        *cap = c2;
    }
    (*items)[(*n)++] = it;
    return LLMI_OK;
}

static int pat_class(pat *P, strbuf *out) {
    typedef struct { uint32_t cp; bool raw; } cit;
    cit *it = NULL;
    size_t n = 0, cap = 0;
    int rc = LLMI_OK;
    P->i++;
    while (!rc && P->i < P->n && P->s[P->i] != ']') {
        uint32_t cp;
        bool raw = P->s[P->i] != '\\';
        size_t l;
        if (!raw) {
            l = pat_gbnf_escape(P->s, P->n, P->i, &cp);
            if (!l) {
                rc = pat_fail(P, "this escape in a character class is not supported "
                                 "(only \\x \\u \\U \\t \\r \\n \\\\ \\\" \\[ \\] \\-)");
                break;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) { rc = pat_fail(P, "escaped code point out of range"); break; }
        } else {
            l = (size_t)utf8_decode((const unsigned char *)P->s + P->i, P->n - P->i, &cp);
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            cit *m = realloc(it, cap * sizeof *m);
            if (!m) { rc = js_oom(P->c); break; }
            it = m;
        }
        it[n++] = (cit){cp, raw};
        P->i += l;
    }
    if (!rc && P->i >= P->n) rc = pat_fail(P, "unterminated character class");
    bool negate = !rc && n > 0 && it[0].raw && it[0].cp == '^';
    size_t first = negate ? 1 : 0;
    if (!rc && n == first && !negate) rc = pat_fail(P, "empty character class");
    cprange *r = rc ? NULL : malloc((n + 1) * sizeof *r);
    if (!rc && !r) rc = js_oom(P->c);
    size_t k = 0;
    for (size_t j = first; !rc && j < n;) {
        uint32_t lo = it[j].cp, hi = lo;
        if (j + 2 < n && it[j + 1].raw && it[j + 1].cp == '-') { hi = it[j + 2].cp; j += 3; }
        else j++;
        if (hi < lo) rc = pat_fail(P, "reversed range in a character class");
        r[k++] = (cprange){lo, hi};
    }
    if (!rc) {
        P->i++;
        gbnf_class(out, negate, r, k);
    }
    free(r);
    free(it);
    return rc;
}

/* A run of literal characters, split where llama.cpp splits it, so that a quantifier after
 * it applies to what it applies to there. */
static int pat_literal(pat *P, pat_item *lit) {
    *lit = (pat_item){.kind = PI_LIT};
    while (P->i < P->n) {
        const char *s = P->s;
        size_t i = P->i;
        char ch = s[i];
        uint32_t cp;
        if (ch == '\\') {
            if (i + 1 == P->n) return pat_fail(P, "trailing backslash");
            if (pat_special(s[i + 1])) { cp = (unsigned char)s[i + 1]; P->i += 2; }
            else {
                size_t l = pat_gbnf_escape(s, P->n, i, &cp);
                if (!l) return pat_fail(P, "this escape is not supported (only \\x \\u \\U \\t \\r \\n \\\\ \\\" \\- and escaped punctuation)");
                if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return pat_fail(P, "escaped code point out of range");
                P->i += l;
            }
        } else if (ch == '"') {
            cp = '"';
            P->i++;
        } else if (!pat_special(ch) && (i + 1 == P->n || lit->n_cps == 0 || s[i + 1] == '.' || !pat_special(s[i + 1]))) {
            int l = utf8_decode((const unsigned char *)s + i, P->n - i, &cp);
            P->i += (size_t)l;
            if (l > 1 && P->i < P->n && strchr("*+?{", s[P->i]))
                return pat_fail(P, "a quantifier after a non-ASCII character is not supported (llama.cpp splits the character)");
        } else {
            break;
        }
        gbnf_cp(&lit->text, cp, false);
        lit->n_cps++;
    }
    if (lit->n_cps == 0) {
        char msg[64];
        snprintf(msg, sizeof msg, "unsupported character '%c'", P->s[P->i]);
        return pat_fail(P, msg);
    }
    return LLMI_OK;
}

/* Applies the quantifier at s[i] to the last item. */
static int pat_quantify(pat *P, pat_item *items, size_t n) {
    char q = P->s[P->i];
    long min = 0, max = -1;
    if (q == '{') {
        size_t b = ++P->i;
        while (P->i < P->n && P->s[P->i] != '}') P->i++;
        if (P->i >= P->n) return pat_fail(P, "unterminated {");
        const char *t = P->s + b, *e = P->s + P->i;
        P->i++;
        const char *comma = memchr(t, ',', (size_t)(e - t));
        bool ok = e > t;
        for (const char *x = t; x < e && ok; x++) ok = (*x >= '0' && *x <= '9') || (x == comma);
        if (!ok || (!comma && e == t)) return pat_fail(P, "invalid repetition {...}");
        for (const char *x = t; x < e; x++)
            if (*x != ',' && (x - t > 7 || (comma && x > comma && x - comma > 7))) return pat_fail(P, "repetition count too large");
        min = comma == t ? 0 : strtol(t, NULL, 10);
        max = !comma ? min : comma + 1 == e ? -1 : strtol(comma + 1, NULL, 10);
        if (min > JS_MAX_REPEAT || max > JS_MAX_REPEAT) return pat_fail(P, "repetition count above 100000");
        if (max >= 0 && min > max) return pat_fail(P, "repetition {m,n} with n below m");
    } else {
        P->i++;
        min = q == '+';
        max = q == '?' ? 1 : -1;
    }
    if (n == 0 || items[n - 1].kind == PI_BAR) return pat_fail(P, "nothing to repeat");
    pat_item *last = &items[n - 1];
    if (last->kind == PI_QUANT) return pat_fail(P, "a quantifier after a quantifier (lazy or possessive) is not supported");
    if (last->kind == PI_LIT && last->n_cps > 1)
        return pat_fail(P, "a quantifier after an escaped character or '\"' that follows other characters is not supported "
                           "(llama.cpp repeats the whole run)");
    strbuf atom = {0};
    if (last->kind == PI_LIT) { strbuf_putc(&atom, '"'); strbuf_puts(&atom, last->text.p); strbuf_putc(&atom, '"'); }
    else strbuf_puts(&atom, last->text.p);
    free(last->text.p);
    *last = (pat_item){.kind = PI_QUANT};
    if (!atom.oom) js_repeat(&last->text, atom.p, min, max, NULL);
    if (atom.oom) last->text.oom = true;
    free(atom.p);
    if (!last->text.p) strbuf_puts(&last->text, "");
    return last->text.oom ? js_oom(P->c) : LLMI_OK;
}

/* A sequence up to ')' (nested) or the end, as GBNF in out. */
static int pat_seq(pat *P, bool nested, strbuf *out) {
    pat_item *items = NULL;
    size_t n = 0, cap = 0;
    bool closed = false;
    int rc = LLMI_OK;
    while (!rc && P->i < P->n) {
        char ch = P->s[P->i];
        if (ch == '.') {
            pat_item it = {.kind = PI_ATOM};
            strbuf_puts(&it.text, js_prim(P->c, P_DOT));
            P->i++;
            rc = pat_push(P, &items, &n, &cap, it);
        } else if (ch == '(') {
            P->i++;
            if (P->i < P->n && P->s[P->i] == '?') {
                if (P->i + 1 < P->n && P->s[P->i + 1] == ':') P->i += 2;
                else { rc = pat_fail(P, "(?...) groups other than (?:...) are not supported"); break; }
            }
            if (++P->depth > JS_MAX_PATTERN_DEPTH) { rc = pat_fail(P, "groups nested too deeply"); break; }
            pat_item it = {.kind = PI_ATOM};
            strbuf_putc(&it.text, '(');
            rc = pat_seq(P, true, &it.text);
            P->depth--;
            strbuf_putc(&it.text, ')');
            if (rc) { free(it.text.p); break; }
            rc = pat_push(P, &items, &n, &cap, it);
        } else if (ch == ')') {
            if (!nested) { rc = pat_fail(P, "unbalanced parentheses"); break; }
            P->i++;
            closed = true;
            break;
        } else if (ch == '^' || ch == '$') {
            rc = pat_fail(P, "anchors inside the pattern are not supported");
        } else if (ch == '[') {
            pat_item it = {.kind = PI_ATOM};
            rc = pat_class(P, &it.text);
            if (rc) free(it.text.p);
            else rc = pat_push(P, &items, &n, &cap, it);
        } else if (ch == '|') {
            P->i++;
            rc = pat_push(P, &items, &n, &cap, (pat_item){.kind = PI_BAR});
        } else if (ch == '*' || ch == '+' || ch == '?' || ch == '{') {
            rc = pat_quantify(P, items, n);
        } else {
            pat_item it;
            rc = pat_literal(P, &it);
            if (rc) free(it.text.p);
            else rc = pat_push(P, &items, &n, &cap, it);
        }
    }
    if (!rc && nested && !closed) rc = pat_fail(P, "unbalanced parentheses");
    /* join: neighbouring literal runs become one literal */
    bool first = true;
    for (size_t k = 0; !rc && k < n; k++) {
        pat_item *it = &items[k];
        if (it->text.oom) { rc = js_oom(P->c); break; }
        if (it->kind == PI_QUANT && (!it->text.p || !*it->text.p)) continue;
        if (!first) strbuf_putc(out, ' ');
        first = false;
        if (it->kind == PI_BAR) strbuf_putc(out, '|');
        else if (it->kind != PI_LIT) strbuf_puts(out, it->text.p);
        else {
            strbuf_putc(out, '"');
            for (; k < n && items[k].kind == PI_LIT; k++) strbuf_puts(out, items[k].text.p ? items[k].text.p : "");
            k--;
            strbuf_putc(out, '"');
        }
    }
    for (size_t k = 0; k < n; k++) free(items[k].text.p);
    free(items);
    return rc;
}

static int js_pattern(js *c, const cJSON *pv, const js_path *p, strbuf *body) {
    if (!cJSON_IsString(pv)) return js_err(c, p, "pattern must be a string");
    const char *s = pv->valuestring;
    size_t n = strlen(s);
    if (n < 2 || s[0] != '^' || s[n - 1] != '$')
        return js_err(c, p, "pattern must start with ^ and end with $ (llama.cpp would accept any string)");
    pat P = {.c = c, .p = p, .s = s + 1, .n = n - 2};
    strbuf_puts(body, "\"\\\"\" (");
    int rc = pat_seq(&P, false, body);
    strbuf_puts(body, ") \"\\\"\"");
    return rc;
}

/* ------------------------------------------------------------------ keys other than the properties */

/* llama.cpp's _not_strings: a JSON string that is none of names, over a trie of their
 * characters, one rule per inner trie node:
 *   ["] ( [a] k1 | [b] char+ | [^"ab] char* )? ["]   k1 ::= [x] char+ | [^"x] char*
 * with llama.cpp's reading of its own class text (a '-' among the rejected first
 * characters makes a range). */
typedef struct { uint32_t *cp; int *kid; int n, cap; bool end; } trie_node;

static int js_not_strings(js *c, const char **names, int n_names, const char *hint, const js_path *p, const char **rule) {
    trie_node *t = calloc(1, sizeof *t);
    int n_nodes = 1, cap_nodes = 1, rc = LLMI_OK;
    if (!t) return js_oom(c);
    for (int k = 0; k < n_names && !rc; k++) {
        const unsigned char *s = (const unsigned char *)names[k];
        size_t len = strlen(names[k]);
        if (strpbrk(names[k], "]\\"))
            rc = js_err(c, p, "additionalProperties beside a property name with ']' or '\\' is not supported "
                              "(llama.cpp's grammar for it is broken): \"%.40s\"", names[k]);
        int at = 0;
        for (size_t i = 0; i < len && !rc;) {
            uint32_t cp;
            int l = utf8_decode(s + i, len - i, &cp);
            i += (size_t)(l ? l : 1);
            trie_node *nd = &t[at];
            int lo = 0, hi = nd->n;
            while (lo < hi) {
                int mid = (lo + hi) / 2;
                if (nd->cp[mid] < cp) lo = mid + 1;
                else hi = mid;
            }
            if (lo < nd->n && nd->cp[lo] == cp) { at = nd->kid[lo]; continue; }
            if (n_nodes == cap_nodes) {
                trie_node *m = realloc(t, 2 * (size_t)cap_nodes * sizeof *m);
                if (!m) { rc = js_oom(c); break; }
                t = m;
                cap_nodes *= 2;
                nd = &t[at];
            }
            if (nd->n == nd->cap) {
                int cap = nd->cap ? 2 * nd->cap : 4;
                uint32_t *a = realloc(nd->cp, (size_t)cap * sizeof *a);
                if (a) nd->cp = a;
                int *b = a ? realloc(nd->kid, (size_t)cap * sizeof *b) : NULL;
                if (b) nd->kid = b;
                if (!a || !b) { rc = js_oom(c); break; }
                nd->cap = cap;
            }
            memmove(nd->cp + lo + 1, nd->cp + lo, (size_t)(nd->n - lo) * sizeof *nd->cp);
            memmove(nd->kid + lo + 1, nd->kid + lo, (size_t)(nd->n - lo) * sizeof *nd->kid);
            nd->cp[lo] = cp;
            nd->kid[lo] = n_nodes;
            nd->n++;
            t[n_nodes] = (trie_node){0};
            at = n_nodes++;
        }
        if (!rc) t[at].end = true;
    }
    /* inner nodes' rules, children first (they come later in the array) */
    const char **node_rule = rc ? NULL : calloc((size_t)n_nodes, sizeof *node_rule);
    if (!rc && !node_rule) rc = js_oom(c);
    const char *ch = js_prim(c, P_CHAR);
    char *node_hint = rc ? NULL : js_hint(hint, "node");
    if (!rc && !node_hint) rc = js_oom(c);
    for (int k = n_nodes - 1; k >= 0 && !rc; k--) {
        trie_node *nd = &t[k];
        if (nd->n == 0) continue;
        strbuf b = {0};
        for (int j = 0; j < nd->n; j++) {
            if (j) strbuf_puts(&b, " | ");
            if (nd->cp[j] == '^') strbuf_puts(&b, "[^]");   /* llama.cpp writes "[^]": any character */
            else gbnf_class(&b, false, &(cprange){nd->cp[j], nd->cp[j]}, 1);
            strbuf_putc(&b, ' ');
            strbuf_puts(&b, node_rule[nd->kid[j]] ? node_rule[nd->kid[j]] : ch);
            if (!node_rule[nd->kid[j]]) strbuf_putc(&b, '+');
        }
        uint32_t *rej = malloc(((size_t)nd->n + 1) * sizeof *rej);
        cprange *r = malloc(((size_t)nd->n + 1) * sizeof *r);
        if (!rej || !r) b.oom = true;
        else {
            rej[0] = '"';
            memcpy(rej + 1, nd->cp, (size_t)nd->n * sizeof *rej);
            strbuf_puts(&b, " | ");
            gbnf_class(&b, true, r, class_ranges_raw(rej, (size_t)nd->n + 1, r));
            strbuf_putc(&b, ' ');
            strbuf_puts(&b, ch);
            strbuf_putc(&b, '*');
        }
        free(rej);
        free(r);
        if (k == 0) {
            strbuf w = {0};
            strbuf_puts(&w, "[\"] ( ");
            strbuf_puts(&w, b.p ? b.p : "");
            strbuf_puts(&w, t[0].end ? " ) [\"]" : " )? [\"]");
            if (b.oom) w.oom = true;
            free(b.p);
            b = w;
        }
        rc = js_define(c, -1, k == 0 ? hint : node_hint, &b, &node_rule[k]);
        if (k == 0) *rule = node_rule[0];
    }
    if (!rc && t[0].n == 0) {   /* the only name is "": llama.cpp's rule matches just "" */
        strbuf b = {0};
        strbuf_puts(&b, "[\"] [\"]");
        rc = js_define(c, -1, hint, &b, rule);
    }
    for (int k = 0; k < n_nodes; k++) { free(t[k].cp); free(t[k].kid); }
    free(node_hint);
    free(t);
    free(node_rule);
    return rc;
}

/* ------------------------------------------------------------------ schemas */

static int js_visit(js *c, const cJSON *s, const js_path *p, const char *hint, int want, const char **rule);

/* The object's rule from its key-value rules: required ones in order, then any ordered
 * subset of the optional ones, then (star) any number of additional ones, as llama.cpp's
 * _build_object_rule. */
static int js_object_body(js *c, const char **req, int n_req, const char **opt, int n_opt,
                          const char *star, strbuf *b) {
    int m = n_opt + (star != NULL);
    if (n_req == 0 && m == 0) { strbuf_puts(b, "\"{\" space \"}\""); return LLMI_OK; }
    strbuf_puts(b, "\"{\" space ");
    for (int i = 0; i < n_req; i++) {
        if (i) strbuf_puts(b, " \",\" space ");
        strbuf_puts(b, req[i]);
    }
    if (m > 0) {
        /* rest[j]: the optional ones from j on, each at most once (star: any number) */
        const char **rest = calloc((size_t)m + 1, sizeof *rest);
        if (!rest) return js_oom(c);
        int rc = LLMI_OK;
        for (int j = m - 1; j >= 1 && !rc; j--) {
            strbuf r = {0};
            const char *kv = j < n_opt ? opt[j] : star;
            strbuf_puts(&r, "( \",\" space ");
            strbuf_puts(&r, kv);
            strbuf_puts(&r, j < n_opt ? " )?" : " )*");
            if (rest[j + 1]) { strbuf_putc(&r, ' '); strbuf_puts(&r, rest[j + 1]); }
            char *h = js_hint(kv, "rest");
            if (!h) { free(r.p); rc = js_oom(c); break; }
            rc = js_define(c, -1, h, &r, &rest[j]);
            free(h);
        }
        if (!rc) {
            strbuf_puts(b, " (");
            if (n_req) strbuf_puts(b, " \",\" space ( ");
            for (int i = 0; i < m; i++) {
                if (i) strbuf_puts(b, " | ");
                if (i < n_opt) strbuf_puts(b, opt[i]);
                else { strbuf_puts(b, star); strbuf_puts(b, " ( \",\" space "); strbuf_puts(b, star); strbuf_puts(b, " )*"); }
                if (rest[i + 1]) { strbuf_putc(b, ' '); strbuf_puts(b, rest[i + 1]); }
            }
            if (n_req) strbuf_puts(b, " )");
            strbuf_puts(b, " )?");
        }
        free(rest);
        if (rc) return rc;
    }
    strbuf_puts(b, " space \"}\"");
    return LLMI_OK;
}

/* "name" space ":" space value: the key-value rule of a declared property. */
static int js_kv(js *c, const char *name, const char *value_rule, const char *hint, const char **rule) {
    strbuf b = {0};
    strbuf d = {0};
    js_dump_string(&d, name);
    if (d.oom) b.oom = true;
    else gbnf_lit(&b, d.p, d.n);
    free(d.p);
    strbuf_puts(&b, " space \":\" space ");
    strbuf_puts(&b, value_rule);
    js_prim(c, P_SPACE);
    char *h = js_hint(hint, "kv");
    if (!h) { free(b.p); return js_oom(c); }
    int rc = js_define(c, -1, h, &b, rule);
    free(h);
    return rc;
}

typedef struct { const char **kv; bool *required; const char **names; int n, cap; } js_props;

static int js_props_add(js *c, js_props *ps, const char *name, const char *kv, bool required) {
    if (ps->n == ps->cap) {
        int cap = ps->cap ? 2 * ps->cap : 8;
        const char **a = realloc(ps->kv, (size_t)cap * sizeof *a);
        if (a) ps->kv = a;
        bool *b = a ? realloc(ps->required, (size_t)cap * sizeof *b) : NULL;
        if (b) ps->required = b;
        const char **d = b ? realloc(ps->names, (size_t)cap * sizeof *d) : NULL;
        if (d) ps->names = d;
        if (!d) return js_oom(c);
        ps->cap = cap;
    }
    ps->kv[ps->n] = kv;
    ps->required[ps->n] = required;
    ps->names[ps->n] = name;
    ps->n++;
    return LLMI_OK;
}

static void js_props_free(js_props *ps) {
    free(ps->kv);
    free(ps->required);
    free(ps->names);
}

/* The properties of an object schema s (its "properties" and "required"), converted and
 * appended to ps.  all_required: every property must be required (allOf merging). */
static int js_collect_props(js *c, const cJSON *s, const js_path *p, const char *hint, js_props *ps, bool all_required,
                            strmap *seen) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    if (props && !cJSON_IsObject(props)) return js_err(c, p, "properties must be an object");
    if (req && !cJSON_IsArray(req)) return js_err(c, p, "required must be an array of property names");
    strmap rq = {0}, names = {0};
    int rc = LLMI_OK;
    for (const cJSON *e = props && req ? props->child : NULL; e && !rc; e = e->next)
        if (!smap_put(&names, e->string, 1)) rc = js_oom(c);
    for (const cJSON *e = req ? req->child : NULL; e && !rc; e = e->next) {
        if (!cJSON_IsString(e)) rc = js_err(c, p, "required must be an array of property names");
        else if (smap_get(&names, e->valuestring) < 0)
            rc = js_err(c, p, "required names \"%.60s\", which is not in properties (llama.cpp ignores it)", e->valuestring);
        else if (!smap_put(&rq, e->valuestring, 1)) rc = js_oom(c);
    }
    js_path pp = {.up = p, .key = "properties"};
    for (const cJSON *e = props ? props->child : NULL; e && !rc; e = e->next) {
        bool required = smap_get(&rq, e->string) == 1;
        if (all_required && !required) {
            rc = js_err(c, p, "allOf: property \"%.60s\" is optional, but llama.cpp makes every property of an allOf "
                              "part required; not supported", e->string);
            break;
        }
        if (!*hint && !*e->string) {
            rc = js_err(c, p, "a property named \"\" at the top level is not supported (llama.cpp names its rule \"root\")");
            break;
        }
        if (smap_get(seen, e->string) >= 0) {
            rc = js_err(c, p, "allOf: property \"%.60s\" is declared twice", e->string);
            break;
        }
        if (!smap_put(seen, e->string, 1)) { rc = js_oom(c); break; }
        js_path ep = {.up = &pp, .key = e->string};
        char *h = js_hint(hint, e->string);
        if (!h) { rc = js_oom(c); break; }
        const char *value, *kv = NULL;
        c->barriers++;
        rc = js_visit(c, e, &ep, h, -1, &value);
        c->barriers--;
        if (!rc) rc = js_kv(c, e->string, value, h, &kv);
        free(h);
        if (!rc) rc = js_props_add(c, ps, e->string, kv, required);
    }
    strmap_free(&rq);
    strmap_free(&names);
    return rc;
}

static int js_object(js *c, const cJSON *s, const js_path *p, const char *hint, int want, const char **rule) {
    js_props ps = {0};
    strmap seen = {0};
    int rc = js_collect_props(c, s, p, hint, &ps, false, &seen);
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    bool any_extra = addl ? !cJSON_IsFalse(addl) : !cJSON_GetObjectItemCaseSensitive(s, "properties");
    if (!rc && addl && !cJSON_IsBool(addl) && !cJSON_IsObject(addl))
        rc = js_err(c, p, "additionalProperties must be a boolean or a schema");
    const char *star = NULL;
    if (!rc && any_extra) {
        const char *value, *key;
        char *h = js_hint(hint, "additional");
        if (!h) rc = js_oom(c);
        if (!rc && cJSON_IsObject(addl)) {
            js_path ap = {.up = p, .key = "additionalProperties"};
            char *hv = js_hint(h, "value");
            if (!hv) rc = js_oom(c);
            c->barriers++;
            if (!rc) rc = js_visit(c, addl, &ap, hv, -1, &value);
            c->barriers--;
            free(hv);
        } else if (!rc) {
            value = js_prim(c, P_VALUE);
        }
        if (!rc && ps.n == 0) key = js_prim(c, P_STRING);
        else if (!rc) {
            char *hk = js_hint(h, "k");
            rc = hk ? js_not_strings(c, ps.names, ps.n, hk, p, &key) : js_oom(c);
            free(hk);
        }
        if (!rc) {
            strbuf b = {0};
            strbuf_puts(&b, key);
            strbuf_puts(&b, " \":\" space ");
            strbuf_puts(&b, value);
            char *hkv = js_hint(h, "kv");
            rc = hkv ? js_define(c, -1, hkv, &b, &star) : js_oom(c);
            free(hkv);
        }
        free(h);
    }
    if (!rc) {
        const char **req = malloc(((size_t)ps.n + 1) * sizeof *req), **opt = malloc(((size_t)ps.n + 1) * sizeof *opt);
        int n_req = 0, n_opt = 0;
        if (!req || !opt) rc = js_oom(c);
        for (int i = 0; !rc && i < ps.n; i++) {
            if (ps.required[i]) req[n_req++] = ps.kv[i];
            else opt[n_opt++] = ps.kv[i];
        }
        strbuf b = {0};
        if (!rc) rc = js_object_body(c, req, n_req, opt, n_opt, star, &b);
        js_prim(c, P_SPACE);
        if (!rc) rc = js_define(c, want, hint, &b, rule);
        else free(b.p);
        free(req);
        free(opt);
    }
    js_props_free(&ps);
    strmap_free(&seen);
    return rc;
}

static int js_array(js *c, const cJSON *s, const js_path *p, const char *hint, int want, const char **rule) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    if (items && prefix) return js_err(c, p, "prefixItems beside items is not supported (llama.cpp ignores prefixItems)");
    if (prefix && !cJSON_IsArray(prefix)) return js_err(c, p, "prefixItems must be an array of schemas");
    const cJSON *it = items ? items : prefix;
    const char *key = items ? "items" : "prefixItems";
    js_path ip = {.up = p, .key = key};
    strbuf b = {0};
    int rc = LLMI_OK;
    js_prim(c, P_SPACE);
    c->barriers++;
    if (it && cJSON_IsArray(it)) {   /* a tuple: exactly these */
        strbuf_puts(&b, "\"[\" space ");
        int i = 0;
        for (const cJSON *e = it->child; e && !rc; e = e->next, i++) {
            js_path ep = {.up = &ip, .index = i};
            char sfx[32];
            snprintf(sfx, sizeof sfx, "tuple-%d", i);
            char *h = js_hint(hint, sfx);
            const char *r;
            rc = h ? js_visit(c, e, &ep, h, -1, &r) : js_oom(c);
            free(h);
            if (rc) break;
            if (i) strbuf_puts(&b, " \",\" space ");
            strbuf_puts(&b, r);
        }
        strbuf_puts(&b, " space \"]\"");
    } else {
        const char *item = NULL;
        long min, max;
        if (it) {
            char *h = js_hint(hint, "item");
            rc = h ? js_visit(c, it, &ip, h, -1, &item) : js_oom(c);
            free(h);
        } else {
            item = js_prim(c, P_VALUE);
        }
        if (!rc) rc = js_count_pair(c, s, "minItems", "maxItems", p, &min, &max);
        if (!rc) {
            strbuf_puts(&b, "\"[\" space ");
            js_repeat(&b, item, min, max, "\",\" space");
            strbuf_puts(&b, " space \"]\"");
        }
    }
    c->barriers--;
    if (rc) { free(b.p); return rc; }
    return js_define(c, want, hint, &b, rule);
}

static int js_string(js *c, const cJSON *s, const js_path *p, const char *hint, int want, const char **rule) {
    const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(s, "format");
    bool has_len = cJSON_GetObjectItemCaseSensitive(s, "minLength") || cJSON_GetObjectItemCaseSensitive(s, "maxLength");
    const char *len_kw = cJSON_GetObjectItemCaseSensitive(s, "minLength") ? "minLength" : "maxLength";
    strbuf b = {0};
    int rc;
    if (pattern) {
        if (format || has_len)
            return js_err(c, p, "%s beside pattern is not supported (llama.cpp ignores it)", format ? "format" : len_kw);
        rc = js_pattern(c, pattern, p, &b);
    } else if (format) {
        if (!cJSON_IsString(format)) return js_err(c, p, "format must be a string");
        const char *f = format->valuestring;
        if (!js_known_format(f))
            return js_err(c, p, "format \"%.40s\" is not supported (only date, time, date-time, uuid)", f);
        if (has_len) return js_err(c, p, "%s beside format is not supported (llama.cpp ignores it)", len_kw);
        if (!strncmp(f, "uuid", 4)) return js_alias(c, want, js_prim(c, P_UUID), rule);
        int prim = !strcmp(f, "date") ? P_DATE : !strcmp(f, "time") ? P_TIME : P_DATETIME;
        strbuf_puts(&b, "\"\\\"\" ");
        strbuf_puts(&b, js_prim(c, prim));
        strbuf_puts(&b, " \"\\\"\"");
        rc = LLMI_OK;
    } else if (has_len) {
        long min, max;
        rc = js_count_pair(c, s, "minLength", "maxLength", p, &min, &max);
        if (rc) return rc;
        strbuf_puts(&b, "\"\\\"\" ");
        js_repeat(&b, js_prim(c, P_CHAR), min, max, NULL);
        strbuf_puts(&b, " \"\\\"\"");
    } else {
        return js_alias(c, want, js_prim(c, P_STRING), rule);
    }
    if (rc) { free(b.p); return rc; }
    return js_define(c, want, hint, &b, rule);
}

/* An integer bound, fractions rounded inwards as llama.cpp does. */
static int js_bound(js *c, const cJSON *v, const char *key, bool round_up, const js_path *p, int64_t *out) {
    if (!cJSON_IsNumber(v)) return js_err(c, p, "%s must be a number", key);
    js_number n = js_number_of(c, v);
    double d = n.is_int ? (n.neg ? -(double)n.mag : (double)n.mag) : round_up ? ceil(n.d) : floor(n.d);
    if (fabs(d) > (double)JS_MAX_BOUND) return js_err(c, p, "%s beyond 10^18 in magnitude is not supported", key);
    *out = n.is_int ? (n.neg ? -(int64_t)n.mag : (int64_t)n.mag) : (int64_t)d;
    return LLMI_OK;
}

static int js_integer(js *c, const cJSON *s, const js_path *p, const char *hint, int want, const char **rule) {
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minimum"), *xmn = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum");
    const cJSON *mx = cJSON_GetObjectItemCaseSensitive(s, "maximum"), *xmx = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum");
    if (mn && xmn) return js_err(c, p, "minimum and exclusiveMinimum together are not supported (llama.cpp ignores exclusiveMinimum)");
    if (mx && xmx) return js_err(c, p, "maximum and exclusiveMaximum together are not supported (llama.cpp ignores exclusiveMaximum)");
    if (!mn && !xmn && !mx && !xmx) return js_alias(c, want, js_prim(c, P_INTEGER), rule);
    int64_t lo = 0, hi = 0;
    int rc = LLMI_OK;
    if (mn) rc = js_bound(c, mn, "minimum", true, p, &lo);
    else if (xmn && !(rc = js_bound(c, xmn, "exclusiveMinimum", false, p, &lo))) lo++;
    if (!rc && mx) rc = js_bound(c, mx, "maximum", false, p, &hi);
    else if (!rc && xmx && !(rc = js_bound(c, xmx, "exclusiveMaximum", true, p, &hi))) hi--;
    if (rc) return rc;
    bool has_lo = mn || xmn, has_hi = mx || xmx;
    if (has_lo && has_hi && lo > hi)
        return js_err(c, p, "no integer lies between the minimum %lld and the maximum %lld", (long long)lo, (long long)hi);
    if (has_lo != has_hi && (has_lo ? llabs(lo) : llabs(hi)) >= JS_MAX_BOUND_ONE_SIDED)
        return js_err(c, p, "%s of 10^15 or more in magnitude without the other bound is not supported",
                      has_lo ? (mn ? "minimum" : "exclusiveMinimum") : (mx ? "maximum" : "exclusiveMaximum"));
    if (has_lo != has_hi && !ir_one_sided_exact(has_lo, has_lo ? lo : hi)) {
        const char *kw = has_lo ? (mn ? "minimum" : "exclusiveMinimum") : (mx ? "maximum" : "exclusiveMaximum");
        return js_err(c, p, "%s without %s is not supported here: llama.cpp's grammar for it is not exactly the "
                            "integers %s %lld (give both bounds)", kw, has_lo ? "a maximum" : "a minimum",
                      has_lo ? ">=" : "<=", (long long)(has_lo ? lo : hi));
    }
    strbuf b = {0};
    strbuf_putc(&b, '(');
    ir_range(&b, has_lo, lo, has_hi, hi, 16, true);
    strbuf_putc(&b, ')');
    return js_define(c, want, hint, &b, rule);
}

/* const, or enum: the values' dumps as literals; a "type" beside them must admit every value
 * (llama.cpp ignores it). */
static int js_enum(js *c, const cJSON *s, const js_path *p, const char *hint, int want, const char **rule) {
    const cJSON *cv = cJSON_GetObjectItemCaseSensitive(s, "const"), *ev = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (cv && ev) return js_err(c, p, "const and enum together are not supported (llama.cpp ignores enum)");
    if (ev && (!cJSON_IsArray(ev) || !ev->child)) return js_err(c, p, "enum must be a non-empty array");
    unsigned types = 0;
    if (t) {
        int rc = js_types(c, t, p, &types);
        if (rc) return rc;
    }
    strbuf b = {0};
    if (ev) strbuf_putc(&b, '(');
    int i = 0;
    for (const cJSON *v = cv ? cv : ev->child; v; v = cv ? NULL : v->next, i++) {
        if (t && !(js_value_types(c, v) & types)) {
            free(b.p);
            return cv ? js_err(c, p, "const does not match \"type\" (llama.cpp ignores type beside const)")
                      : js_err(c, p, "enum value %d does not match \"type\" (llama.cpp ignores type beside enum)", i);
        }
        const cJSON *x = js_inexact_number(c, v);
        if (x) {
            free(b.p);
            strbuf d = {0};
            js_dump_number(c, &d, x);
            int rc = js_err(c, p, "%s: the number %s needs 16 or more significant digits; not supported (its digits "
                                  "could differ from llama.cpp's)", cv ? "const" : "enum", d.p && !d.oom ? d.p : "?");
            free(d.p);
            return rc;
        }
        if (i) strbuf_puts(&b, " | ");
        js_value_lit(c, &b, v);
    }
    if (ev) strbuf_putc(&b, ')');
    return js_define(c, want, hint, &b, rule);
}

static int js_alternatives(js *c, const cJSON *s, const char *key, const js_path *p, const char *hint, int want,
                           const char **rule) {
    const cJSON *alts = cJSON_GetObjectItemCaseSensitive(s, key);
    js_path ap = {.up = p, .key = key};
    if (!cJSON_IsArray(alts) || !alts->child) return js_err(c, &ap, "must be a non-empty array of schemas");
    strbuf b = {0};
    int i = 0, rc = LLMI_OK;
    for (const cJSON *e = alts->child; e && !rc; e = e->next, i++) {
        js_path ep = {.up = &ap, .index = i};
        char sfx[32];
        snprintf(sfx, sizeof sfx, *hint ? "%d" : "alternative-%d", i);
        char *h = js_hint(hint, sfx);
        const char *r;
        rc = h ? js_visit(c, e, &ep, h, -1, &r) : js_oom(c);
        free(h);
        if (rc) break;
        if (i) strbuf_puts(&b, " | ");
        strbuf_puts(&b, r);
    }
    if (rc) { free(b.p); return rc; }
    return js_define(c, want, hint, &b, rule);
}

/* ------------------------------------------------------------------ $ref */

static int js_resolve(js *c, const char *ref, const js_path *p, const cJSON **out) {
    const cJSON *t = c->doc;
    for (const char *q = ref + 1; *q == '/';) {
        const char *seg = ++q;
        while (*q && *q != '/') q++;
        size_t n = (size_t)(q - seg);
        const cJSON *next = NULL;
        if (cJSON_IsObject(t)) {
            for (const cJSON *e = t->child; e && !next; e = e->next)
                if (strlen(e->string) == n && !memcmp(e->string, seg, n)) next = e;
        } else if (cJSON_IsArray(t) && n > 0 && n < 10 && strspn(seg, "0123456789") >= n) {
            next = cJSON_GetArrayItem(t, atoi(seg));
        }
        if (!next) return js_err(c, p, "cannot resolve $ref %.120s: \"%.*s\" not found", ref, (int)(n > 60 ? 60 : n), seg);
        t = next;
    }
    *out = t;
    return LLMI_OK;
}

static int js_ref_check(js *c, const cJSON *rv, const js_path *p) {
    if (!cJSON_IsString(rv)) return js_err(c, p, "$ref must be a string");
    const char *ref = rv->valuestring;
    if (strncmp(ref, "#/", 2))
        return js_err(c, p, "$ref \"%.120s\" is not supported: only references into this document (#/...) are", ref);
    if (strpbrk(ref, "~%"))
        return js_err(c, p, "$ref \"%.120s\": escaped JSON pointers (~0, ~1, %%-escapes) are not supported", ref);
    return LLMI_OK;
}

/* The rule of a $ref: its target converted once, under a name reserved first so that the
 * target can refer to itself. */
static int js_ref_rule(js *c, const cJSON *rv, const js_path *p, const char **rule) {
    int rc = js_ref_check(c, rv, p);
    if (rc) return rc;
    const char *ref = rv->valuestring;
    int ix = smap_get(&c->ref_ix, ref);
    if (ix >= 0) {
        js_ref *r = &c->refs[ix];
        if (!r->done && r->barriers == c->barriers)
            return js_err(c, p, "$ref %.120s refers back to itself before matching any text (left recursion)", ref);
        *rule = c->rules[r->rule].name;
        return LLMI_OK;
    }
    const cJSON *target;
    if ((rc = js_resolve(c, ref, p, &target))) return rc;
    if (c->n_refs == c->cap_refs) {
        int cap = c->cap_refs ? 2 * c->cap_refs : 16;
        js_ref *m = realloc(c->refs, (size_t)cap * sizeof *m);
        if (!m) return js_oom(c);
        c->refs = m;
        c->cap_refs = cap;
    }
    /* llama.cpp names a $ref's rule "ref" + the pointer with runs of other characters than
     * [a-zA-Z0-9-] made '-', and takes an existing rule of that name as the target */
    strbuf lc = {0};
    strbuf_puts(&lc, "ref");
    bool in_run = false;
    for (const char *q = ref + 1; *q; q++) {
        bool ok = (*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') || *q == '-';
        if (ok || !in_run) strbuf_putc(&lc, ok ? *q : '-');
        in_run = !ok;
    }
    char *lcn = strbuf_take(&lc);
    if (!lcn) return js_oom(c);
    int other = smap_get(&c->lc_ref_names, lcn);
    if (other >= 0) {
        free(lcn);
        return js_err(c, p, "$ref %.100s and $ref %.100s are one rule to llama.cpp (it would use the first's target for "
                            "both); not supported", c->refs[other].ref, ref);
    }
    char *rs = strdup(ref), *h = js_hint("ref", ref + 1);
    int r = rs && h ? js_rule_new(c, h) : -1;
    free(h);
    if (r < 0 || !smap_put(&c->ref_ix, rs, c->n_refs) || !smap_put(&c->lc_ref_names, lcn, c->n_refs)) {
        free(rs);
        free(lcn);
        return js_oom(c);
    }
    ix = c->n_refs++;
    c->refs[ix] = (js_ref){rs, lcn, r, false, c->barriers};
    js_path tp = {.base = rs};
    rc = js_visit(c, target, &tp, c->rules[r].name, r, rule);
    c->refs[ix].done = true;
    return rc;
}

/* ------------------------------------------------------------------ allOf */

/* llama.cpp merges allOf parts: objects' properties into one object (every property
 * required, no additional ones), or enums into the values they all share.  Parts it would
 * drop or misread when merging (strings, anyOf, const, optional properties, ...) are
 * refused. */
typedef struct {
    char **lits;                 /* (n) enum values' literals, in first-seen order */
    int *count;                  /* (n) how many parts list each */
    int n, cap;
    strmap ix;                     /* literal -> index */
} js_enum_tally;

static int js_tally_part(js *c, js_enum_tally *ta, const cJSON *part, unsigned types, bool typed, const js_path *p) {
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(part, "enum");
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(part, "type");
    unsigned own = 0;
    int rc = LLMI_OK;
    if (!cJSON_IsArray(ev) || !ev->child) return js_err(c, p, "enum must be a non-empty array");
    if (pt && (rc = js_types(c, pt, p, &own))) return rc;
    strmap mine = {0};
    for (const cJSON *v = ev->child; v && !rc; v = v->next) {
        unsigned vt = js_value_types(c, v);
        if ((pt && !(vt & own)) || (typed && !(vt & types))) { rc = js_err(c, p, "an enum value does not match \"type\""); break; }
        if (js_inexact_number(c, v)) {
            rc = js_err(c, p, "enum: a number with 16 or more significant digits is not supported (its digits could differ from llama.cpp's)");
            break;
        }
        strbuf l = {0};
        js_value_lit(c, &l, v);
        char *lit = strbuf_take(&l);
        if (!lit) { rc = js_oom(c); break; }
        int at = smap_get(&ta->ix, lit);
        if (at >= 0) {
            free(lit);
            if (smap_get(&mine, ta->lits[at]) >= 0) {
                rc = js_err(c, p, "allOf: an enum lists a value twice (llama.cpp would count it twice)");
                break;
            }
        } else {
            if (ta->n == ta->cap) {
                int cap = ta->cap ? 2 * ta->cap : 16;
                char **a = realloc(ta->lits, (size_t)cap * sizeof *a);
                if (a) ta->lits = a;
                int *b = a ? realloc(ta->count, (size_t)cap * sizeof *b) : NULL;
                if (b) ta->count = b;
                if (!b) { free(lit); rc = js_oom(c); break; }
                ta->cap = cap;
            }
            at = ta->n++;
            ta->lits[at] = lit;
            ta->count[at] = 0;
            if (!smap_put(&ta->ix, lit, at)) { rc = js_oom(c); break; }
        }
        ta->count[at]++;
        if (!smap_put(&mine, ta->lits[at], 1)) rc = js_oom(c);
    }
    strmap_free(&mine);
    return rc;
}

static int js_all_of(js *c, const cJSON *s, const js_path *p, const char *hint, int want, const char **rule) {
    const cJSON *parts = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    js_path ap = {.up = p, .key = "allOf"};
    if (!cJSON_IsArray(parts) || !parts->child) return js_err(c, &ap, "must be a non-empty array of schemas");
    unsigned types = 0;
    int rc = t ? js_types(c, t, p, &types) : LLMI_OK;
    if (rc) return rc;
    js_props ps = {0};
    strmap seen = {0};
    js_enum_tally ta = {0};
    int n_parts = 0, n_obj = 0, n_enum = 0, i = 0;
    int merging0 = c->n_merging;
    for (const cJSON *e = parts->child; e && !rc; e = e->next, i++, n_parts++) {
        js_path ep = {.up = &ap, .index = i}, refp;
        const js_path *tp = &ep;
        const cJSON *part = e;
        /* follow $refs: llama.cpp merges their targets */
        c->n_merging = merging0;
        for (;;) {
            if (!cJSON_IsObject(part)) { rc = js_err(c, tp, "schema must be an object"); break; }
            if (js_kind_of(part, NULL) != K_REF) break;
            const cJSON *rv = cJSON_GetObjectItemCaseSensitive(part, "$ref");
            if ((rc = js_ref_check(c, rv, tp)) || (rc = js_resolve(c, rv->valuestring, tp, &part))) break;
            for (int k = 0; k < c->n_merging && !rc; k++)
                if (c->merging[k] == part) rc = js_err(c, tp, "$ref %.120s: a $ref cycle through allOf is not supported", rv->valuestring);
            if (!rc && c->n_merging == (int)(sizeof c->merging / sizeof c->merging[0]))
                rc = js_err(c, tp, "$ref chain through allOf too long");
            if (rc) break;
            c->merging[c->n_merging++] = part;
            refp = (js_path){.base = rv->valuestring};
            tp = &refp;
        }
        if (rc) break;
        unsigned present = 0;
        for (const cJSON *k = part->child; k && !rc; k = k->next) {
            int id = kw_id(k->string);
            if (id < 0) rc = js_err(c, tp, "%s is not supported", k->string);
            else if (id < KW_COUNT) present |= KB(id);
        }
        if (rc) break;
        js_kind kind = js_kind_of(part, NULL);
        unsigned uses = kind == K_OBJECT ? js_kind_uses(K_OBJECT, part) : kind == K_ENUM ? KB(KW_ENUM) | KB(KW_TYPE) : ~0u;
        for (int k = 0; k < KW_COUNT && !rc; k++)
            if (present & ~uses & KB(k)) rc = js_err(c, tp, "%s is not supported %s in an allOf part", k_keywords[k], k_kind_where[kind]);
        if (rc) break;
        if (kind == K_OBJECT) {
            const cJSON *addl = cJSON_GetObjectItemCaseSensitive(part, "additionalProperties");
            const cJSON *pt = cJSON_GetObjectItemCaseSensitive(part, "type");
            if (addl && !cJSON_IsFalse(addl))
                rc = js_err(c, tp, "allOf: additionalProperties other than false is not supported (llama.cpp drops it when merging)");
            else if (pt && (!cJSON_IsString(pt) || strcmp(pt->valuestring, "object")))
                rc = js_err(c, tp, "allOf: a part of a type other than object is not supported");
            else if (t && !(types & T_OBJECT))
                rc = js_err(c, p, "allOf of objects beside a type other than object is not supported");
            if (rc) break;
            c->barriers++;
            rc = js_collect_props(c, part, tp, hint, &ps, true, &seen);
            c->barriers--;
            n_obj++;
        } else if (kind == K_ENUM) {
            rc = js_tally_part(c, &ta, part, types, t != NULL, tp);
            n_enum++;
        } else {
            static const char *const what[] = {
                [K_REF] = "a $ref", [K_ANYOF] = "anyOf", [K_ONEOF] = "oneOf", [K_TYPES] = "a list of types",
                [K_CONST] = "const", [K_ENUM] = "enum", [K_OBJECT] = "an object", [K_ALLOF] = "allOf",
                [K_ARRAY] = "an array", [K_TUPLE] = "an array", [K_STRING] = "a string", [K_INTEGER] = "an integer",
                [K_NUMBER] = "a number", [K_BOOLEAN] = "a boolean", [K_NULL] = "null",
                [K_ANY] = "a schema without type or properties", [K_BADTYPE] = "a bad type",
            };
            rc = js_err(c, tp, "allOf: a part that is %s is not supported (llama.cpp drops it when merging)", what[kind]);
        }
    }
    c->n_merging = merging0;
    if (!rc && n_obj && n_enum) rc = js_err(c, &ap, "allOf mixing objects and enums is not supported");
    strbuf b = {0};
    if (!rc && n_enum) {
        strbuf_putc(&b, '(');
        int kept = 0;
        for (int k = 0; k < ta.n; k++) {
            if (ta.count[k] != n_parts) continue;
            if (kept++) strbuf_puts(&b, " | ");
            strbuf_puts(&b, ta.lits[k]);
        }
        strbuf_putc(&b, ')');
        if (!kept) rc = js_err(c, &ap, "the enums have no value in common");
    } else if (!rc) {
        js_prim(c, P_SPACE);
        rc = js_object_body(c, ps.kv, ps.n, NULL, 0, NULL, &b);
    }
    for (int k = 0; k < ta.n; k++) free(ta.lits[k]);
    free(ta.lits);
    free(ta.count);
    strmap_free(&ta.ix);
    js_props_free(&ps);
    strmap_free(&seen);
    if (rc) { free(b.p); return rc; }
    return js_define(c, want, hint, &b, rule);
}

/* ------------------------------------------------------------------ dispatch */

/* s read as `kind` (type: the one type of a type list being converted, or NULL). */
static int js_as(js *c, const cJSON *s, js_kind kind, const char *type, const js_path *p, const char *hint, int want,
                 const char **rule) {
    switch (kind) {
    case K_OBJECT: return js_object(c, s, p, hint, want, rule);
    case K_ALLOF: return js_all_of(c, s, p, hint, want, rule);
    case K_ARRAY: case K_TUPLE: return js_array(c, s, p, hint, want, rule);
    case K_STRING: return js_string(c, s, p, hint, want, rule);
    case K_INTEGER: return js_integer(c, s, p, hint, want, rule);
    case K_NUMBER: return js_alias(c, want, js_prim(c, P_NUMBER), rule);
    case K_BOOLEAN: return js_alias(c, want, js_prim(c, P_BOOLEAN), rule);
    case K_NULL: return js_alias(c, want, js_prim(c, P_NULL), rule);
    case K_ANY: return js_alias(c, want, js_prim(c, P_VALUE), rule);
    case K_BADTYPE: {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
        if (type || cJSON_IsString(t)) return js_err(c, p, "unknown type \"%.40s\"", type ? type : t->valuestring);
        return js_err(c, p, "type must be a type name or a non-empty list of them");
    }
    case K_REF: {
        const char *r;
        int rc = js_ref_rule(c, cJSON_GetObjectItemCaseSensitive(s, "$ref"), p, &r);
        return rc ? rc : js_alias(c, want, r, rule);
    }
    case K_ANYOF: case K_ONEOF:
        if (cJSON_GetObjectItemCaseSensitive(s, "anyOf") && cJSON_GetObjectItemCaseSensitive(s, "oneOf"))
            return js_err(c, p, "anyOf and oneOf together are not supported (llama.cpp ignores anyOf)");
        return js_alternatives(c, s, kind == K_ONEOF ? "oneOf" : "anyOf", p, hint, want, rule);
    case K_CONST: case K_ENUM: return js_enum(c, s, p, hint, want, rule);
    case K_TYPES: break;
    }
    /* a list of types: one alternative per type, each reading the same keywords */
    unsigned types;
    int rc = js_types(c, cJSON_GetObjectItemCaseSensitive(s, "type"), p, &types);
    if (rc) return rc;
    strbuf b = {0};
    for (int i = 0, n = 0; i < 7 && !rc; i++) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
        const char *name = NULL;
        for (const cJSON *e = t->child; e; e = e->next)
            if (!strcmp(e->valuestring, k_type_names[i])) name = e->valuestring;
        if (!name) continue;
        char *h = js_hint(hint, name);
        const char *r;
        rc = h ? js_as(c, s, js_kind_of(s, name), name, p, h, -1, &r) : js_oom(c);
        free(h);
        if (rc) break;
        if (n++) strbuf_puts(&b, " | ");
        strbuf_puts(&b, r);
    }
    if (rc) { free(b.p); return rc; }
    return js_define(c, want, hint, &b, rule);
}

/* Converts schema s (at p) to a rule: rule `want` when >= 0, else a new one named after
 * hint, or an existing rule when s is just that (a $ref, a shared rule).  *rule: its name. */
static int js_visit(js *c, const cJSON *s, const js_path *p, const char *hint, int want, const char **rule) {
    if (!cJSON_IsObject(s)) return js_err(c, p, "schema must be an object (boolean schemas are not supported)");
    if (c->depth >= JS_MAX_DEPTH) return js_err(c, p, "schemas nested deeper than %d levels", JS_MAX_DEPTH);
    for (const cJSON *k = s->child; k; k = k->next)
        if (kw_id(k->string) < 0) return js_err(c, p, "%s is not supported", k->string);
    js_kind kind = js_kind_of(s, NULL);
    unsigned uses = kind == K_BADTYPE ? ~0u : js_kind_uses(kind, s);
    if (kind == K_TYPES) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
        for (const cJSON *e = t->child; e; e = e->next)
            if (cJSON_IsString(e)) uses |= js_kind_uses(js_kind_of(s, e->valuestring), s);
    }
    for (const cJSON *k = s->child; k; k = k->next) {
        int id = kw_id(k->string);
        if (id < KW_COUNT && !(uses & KB(id))) {
            if (kind == K_TYPES) return js_err(c, p, "%s is not supported for any of the listed types", k->string);
            return js_err(c, p, "%s is not supported %s%s", k->string, k_kind_where[kind],
                          (kind == K_ANYOF || kind == K_ONEOF || kind == K_REF) ? " (llama.cpp ignores it)" : "");
        }
    }
    c->depth++;
    int rc = js_as(c, s, kind, NULL, p, hint, want, rule);
    c->depth--;
    return rc;
}

/* ------------------------------------------------------------------ entry points */

static int js_convert(const cJSON *doc, const js_num *nums, size_t n_nums, char **gbnf, llmi_status *st) {
    js c = {.doc = doc, .st = st, .nums = nums, .n_nums = n_nums};
    int rc = LLMI_OK;
    for (int i = 0; i < P_COUNT && !rc; i++)
        if (!smap_put(&c.names, k_prims[i].name, -2 - i)) rc = js_oom(&c);
    int root = rc ? -1 : js_rule_new(&c, "root");
    if (!rc && root != 0) rc = js_oom(&c);
    js_path top = {.base = "#"};
    if (!rc) rc = js_check_doc(&c, doc, &top, 0);
    const char *name;
    if (!rc) rc = js_visit(&c, doc, &top, "", root, &name);
    if (!rc) {
        for (bool grew = true; grew;) {
            grew = false;
            for (int i = 0; i < P_COUNT; i++)
                if ((c.prims & PB(i)) && (c.prims | k_prims[i].deps) != c.prims) { c.prims |= k_prims[i].deps; grew = true; }
        }
        strbuf out = {0};
        for (int i = 0; i < c.n_rules; i++) {
            strbuf_puts(&out, c.rules[i].name);
            strbuf_puts(&out, " ::= ");
            strbuf_puts(&out, c.rules[i].body ? c.rules[i].body : "");
            strbuf_putc(&out, '\n');
        }
        for (int i = 0; i < P_COUNT; i++) {
            if (!(c.prims & PB(i))) continue;
            strbuf_puts(&out, k_prims[i].name);
            strbuf_puts(&out, " ::= ");
            strbuf_puts(&out, k_prims[i].body);
            strbuf_putc(&out, '\n');
        }
        *gbnf = strbuf_take(&out);
        if (!*gbnf) rc = js_oom(&c);
    }
    for (int i = 0; i < c.n_rules; i++) { free(c.rules[i].name); free(c.rules[i].body); }
    free(c.rules);
    for (int i = 0; i < c.n_refs; i++) { free(c.refs[i].ref); free(c.refs[i].lc_name); }
    free(c.refs);
    strmap_free(&c.names);
    strmap_free(&c.ref_ix);
    strmap_free(&c.lc_ref_names);
    return rc;
}

int json_schema_to_gbnf_cjson(const cJSON *schema, char **gbnf, llmi_status *st) {
    *gbnf = NULL;
    if (!schema) return llmi_fail(st, LLMI_E_USAGE, "json-schema: no schema");
    return js_convert(schema, NULL, 0, gbnf, st);
}

int json_schema_to_gbnf(const char *text, size_t len, char **gbnf, llmi_status *st) {
    *gbnf = NULL;
    if (!text) return llmi_fail(st, LLMI_E_USAGE, "json-schema: no schema");
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!doc) {
        size_t off = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
        return llmi_fail(st, LLMI_E_USAGE, "json-schema: invalid JSON at offset %zu", off);
    }
    size_t at = (size_t)(end - text);
    while (at < len && (text[at] == ' ' || text[at] == '\t' || text[at] == '\n' || text[at] == '\r')) at++;
    if (at < len) {
        cJSON_Delete(doc);
        return llmi_fail(st, LLMI_E_USAGE, "json-schema: invalid JSON at offset %zu: text after the schema", at);
    }
    js_num *nums = NULL;
    size_t n_nums = 0, k = 0;
    int rc = js_lex(st, text, len, &nums, &n_nums);
    if (!rc) {
        js_collect_numbers(doc, nums, n_nums, &k);
        if (k != n_nums) rc = llmi_fail(st, LLMI_E_RUNTIME, "json-schema: internal error: %zu numbers in the text, %zu parsed", n_nums, k);
    }
    if (!rc && n_nums > 1) qsort(nums, n_nums, sizeof *nums, js_num_cmp);
    static const js_num no_nums[1];   /* a text without numbers: still the text variant */
    if (!rc) rc = js_convert(doc, nums ? nums : no_nums, n_nums, gbnf, st);
    free(nums);
    cJSON_Delete(doc);
    return rc;
}
