/* Grammar-constrained decoding (src/engine/grammar.c): GBNF parsing and its errors, and
 * token masks checked against llama.cpp's own grammar sampler on the same vocabulary
 * (testdata/grammar/, scripts/make-grammar-refs.py). */
#include <cJSON.h>
#include <string.h>
#include "test.h"
#include "engine/grammar.h"
#include "engine/json_schema.h"
#include "tok/tokenizer.h"

#ifndef TESTDATA_DIR
#define TESTDATA_DIR "testdata"
#endif

static const char *testdata(void) {
    const char *e = getenv("TESTDATA");
    return e ? e : TESTDATA_DIR;
}

static tokenizer *smollm2_tok(test_ctx *t_) {
    llmi_status st = {0};
    tokenizer *tk = test_smollm2_tokenizer(&st);
    CHECK_MSG(tk != NULL, "%s", st.msg);
    return tk;
}

static int parse_err(const char *text, char *msg, size_t cap) {
    grammar *g = NULL;
    llmi_status st = {0};
    int rc = grammar_parse(text, strlen(text), "test", &g, &st);
    snprintf(msg, cap, "%s", st.msg);
    grammar_free(g);
    return rc;
}

TEST(grammar_parse_errors) {
    static const struct { const char *text, *want; } cases[] = {
        {"root ::= foo\n", "rule foo is used but never defined"},
        {"root ::= \"a\"\nroot ::= \"b\"\n", "rule defined twice: root"},
        {"start ::= \"a\"\n", "no rule named root"},
        {"root ::= root \"a\"\n", "left recursion in rule root"},
        {"root ::= a\na ::= b? a \"x\"\nb ::= \"y\"\n", "left recursion in rule a"},
        {"root ::= (\"\")*\n", "left recursion in rule root"},
        {"root ::= \"abc\n", "unterminated string literal"},
        {"root ::= [ab", "unterminated character class"},
        {"root ::= [z-a]\n", "character range is empty"},
        {"root ::= \"\\q\"\n", "unknown escape"},
        {"root ::= \"\\x4\"\n", "\\x needs 2 hex digits"},
        {"root ::= * \"a\"\n", "nothing before the repetition *"},
        {"root ::= \"a\"{3,2}\n", "with n below m"},
        {"root ::= \"a\"{1000000}\n", "repetition count too large"},
        {"root ::= \"a\" )\n", "expecting the end of the line"},
        {"root := \"a\"\n", "expecting '::='"},
        {"root ::= (\"a\" \n", "expecting ')'"},
        {"root ::= <[12]>\n", "token references"},
        {"root ::= \"\xff\"\n", "invalid UTF-8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char msg[512];
        int rc = parse_err(cases[i].text, msg, sizeof msg);
        CHECK_MSG(rc == LLMI_E_USAGE && strstr(msg, cases[i].want) && strncmp(msg, "test: ", 6) == 0,
                  "case %zu: rc %d, message \"%s\", want \"%s\"", i, rc, msg, cases[i].want);
    }
    char msg[512];
    parse_err("root ::= \"a\"\n\nx ::= \"b\" )\n", msg, sizeof msg);
    CHECK_MSG(strstr(msg, "line 3 col 11"), "position: %s", msg);
}

/* Walks text token by token (as the tokenizer splits it): every token must be in the mask
 * before it; returns how many were, and whether the grammar was complete after all. */
static int walk(test_ctx *t_, tokenizer *tk, grammar_vocab *gv, const char *grammar_text, const char *text,
                bool *complete) {
    grammar *g = NULL;
    grammar_state *gs = NULL;
    llmi_status st = {0};
    int32_t *ids = NULL;
    int n = 0, ok = -1;
    uint8_t *mask = malloc((size_t)tok_n_vocab(tk));
    if (grammar_parse(grammar_text, strlen(grammar_text), "walk", &g, &st) || grammar_state_create(g, gv, &gs, &st) ||
        tok_encode(tk, text, strlen(text), false, false, &ids, &n, &st)) {
        CHECK_MSG(0, "%s", st.msg);
        goto done;
    }
    for (ok = 0; ok < n; ok++) {
        if (grammar_state_mask(gs, true, mask, &st) < 0) {
            CHECK_MSG(0, "%s", st.msg);
            break;
        }
        if (!mask[ids[ok]]) break;
        if (grammar_state_accept(gs, ids[ok], &st)) {
            CHECK_MSG(0, "%s", st.msg);
            break;
        }
    }
    *complete = ok == n && grammar_state_complete(gs);
    if (ok == n) {
        grammar_state_mask(gs, true, mask, &st);
        int eos = tok_eos(tk);
        CHECK_MSG(mask[eos] == *complete, "eos allowed %d but complete %d", mask[eos], *complete);
    }
done:
    free(ids);
    free(mask);
    grammar_state_free(gs);
    grammar_free(g);
    return ok;
}

TEST(grammar_walks_by_definition) {
    tokenizer *tk = smollm2_tok(t_);
    if (!tk) return;
    grammar_vocab *gv = NULL;
    llmi_status st = {0};
    CHECK_MSG(grammar_vocab_build(tk, &gv, &st) == 0, "%s", st.msg);
    static const struct { const char *g, *text; bool full, complete; } cases[] = {
        {"root ::= \"hello world\"\n", "hello world", true, true},
        {"root ::= \"hello world\"\n", "hello", true, false},
        {"root ::= \"hello world\"\n", "hello there", false, false},
        {"root ::= [a-z]+ (\" \" [a-z]+)*\n", "the quick brown fox", true, true},
        {"root ::= [a-z]+ (\" \" [a-z]+)*\n", "the Quick", false, false},
        {"root ::= \"a\"{2,3}\n", "aaa", true, true},
        {"root ::= \"a\"{2,3}\n", "aaaa", false, false},
        {"root ::= \"a\"{2,3}\n", "a", true, false},
        {"root ::= \"x\"{2,}\n", "xxxxxxxx", true, true},
        {"root ::= [^\\n]* \"\\n\"\n", "anything at all: 123 \xc3\xa9\n", true, true},
        {"root ::= . . .\n", "\xe3\x81\x82\xe3\x81\x84\xe3\x81\x86", true, true},
        {"root ::= [\xe3\x81\x81-\xe3\x82\x9f]+\n", "\xe3\x81\x82\xe3\x82\x8a\xe3\x81\x8c\xe3\x81\xa8\xe3\x81\x86", true, true},
        {"root ::= [\xe3\x81\x81-\xe3\x82\x9f]+\n", "\xe3\x81\x82\xe3\x82\xa2", false, false},
        {"root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= [0-9]+ | \"(\" expr \")\"\n", "(1+2)-(3-(4+5))", true, true},
        {"root ::= \"yes\" | \"no\" # a comment\n", "no", true, true},
        {"root ::= (\n  \"a\" |\n  \"b\"\n) \"c\"\n", "bc", true, true},
        {"root ::= \"a\" |\n  \"b\"\n", "b", true, true},
        /* 40 optional choices that all meet again at "z": each expansion must visit the
         * continuation once, not once per path (2^40) */
        {"root ::= g g g g g g g g g g g g g g g g g g g g g g g g g g g g g g g g g g g g g g g g \"z\"\n"
         "g ::= (\"a\"? | \"b\"?) (\"c\"? | \"d\"?)\n", "abdcz", true, true},
    };
    for (size_t i = 0; gv && i < sizeof cases / sizeof *cases; i++) {
        bool complete = false;
        int32_t *ids = NULL;
        int n = 0;
        tok_encode(tk, cases[i].text, strlen(cases[i].text), false, false, &ids, &n, &st);
        free(ids);
        int ok = walk(t_, tk, gv, cases[i].g, cases[i].text, &complete);
        CHECK_MSG((ok == n) == cases[i].full && complete == cases[i].complete,
                  "case %zu (%s): %d of %d tokens allowed, complete %d", i, cases[i].text, ok, n, complete);
    }
    grammar_vocab_free(gv);
    tok_free(tk);
}

/* ---- against llama.cpp: testdata/grammar/masks.jsonl ------------------------------- */


/* FNV-1a 64 over the sorted ids (mask set, excluded and, when skip is given, skip unset),
 * each 4 bytes little-endian, as the reference script. */
static uint64_t ids_hash(const uint8_t *mask, int V, const uint8_t *excluded, const uint8_t *skip, int *count) {
    uint64_t h = 0xcbf29ce484222325ULL;
    *count = 0;
    for (int t = 0; t < V; t++) {
        if (!mask[t] || excluded[t] || (skip && skip[t])) continue;
        (*count)++;
        for (int k = 0; k < 4; k++) h = (h ^ (uint8_t)((uint32_t)t >> (8 * k))) * 0x100000001b3ULL;
    }
    return h;
}

/* Strict UTF-8 (no overlong forms, surrogates or values past U+10FFFF), as Python decodes. */
static bool utf8_whole(const uint8_t *s, int n) {
    for (int i = 0; i < n;) {
        uint8_t b = s[i];
        int need = b < 0x80 ? 1 : (b >= 0xC2 && b <= 0xDF) ? 2 : (b >= 0xE0 && b <= 0xEF) ? 3 : (b >= 0xF0 && b <= 0xF4) ? 4 : 0;
        if (!need || i + need > n) return false;
        for (int k = 1; k < need; k++)
            if ((s[i + k] & 0xC0) != 0x80) return false;
        if ((b == 0xE0 && s[i + 1] < 0xA0) || (b == 0xED && s[i + 1] > 0x9F) || (b == 0xF0 && s[i + 1] < 0x90) ||
            (b == 0xF4 && s[i + 1] > 0x8F))
            return false;
        i += need;
    }
    return true;
}

typedef struct mask_walk_result { int steps, differ, split_extra; char first[640]; } mask_walk_result;

/* Walks one reference record with grammar text gtext: at each step llmi's mask (over the
 * reference's universe) must equal llama.cpp's, and tokens[accepted], when the reference
 * rejected it, must be refused too.  With negated (negated classes in the grammar) the
 * tokens that are not whole UTF-8 on their own (split) are judged apart: llama.cpp refuses
 * such a token under [^...] when any code point it could become is excluded, llmi allows
 * it when some code point it could become is allowed (grammar.h).  There the rest must
 * still be equal, llmi's split tokens must include llama.cpp's, and a reference walk that
 * stopped at a split token goes no further (llmi takes it). */
static void walk_record(test_ctx *t_, const cJSON *rec, const char *gtext, grammar_vocab *gv, int V,
                        const uint8_t *excluded, const uint8_t *split, int eos, bool negated, mask_walk_result *r) {
    memset(r, 0, sizeof *r);
    grammar *g = NULL;
    grammar_state *gs = NULL;
    llmi_status st = {0};
    uint8_t *mask = malloc((size_t)V);
    if (grammar_parse(gtext, strlen(gtext), "ref", &g, &st) || grammar_state_create(g, gv, &gs, &st)) {
        snprintf(r->first, sizeof r->first, "does not load: %s", st.msg);
        r->differ = 1;
        goto done;
    }
    const cJSON *toks = cJSON_GetObjectItem(rec, "tokens"), *steps = cJSON_GetObjectItem(rec, "steps");
    int accepted = cJSON_GetObjectItem(rec, "accepted")->valueint, n_tok = cJSON_GetArraySize(toks);
    for (int i = 0; i <= accepted; i++) {
        const cJSON *sp = cJSON_GetArrayItem(steps, i);
        if (grammar_state_mask(gs, true, mask, &st) < 0) {
            snprintf(r->first, sizeof r->first, "step %d: %s", i, st.msg);
            r->differ++;
            break;
        }
        int n, ref_n = cJSON_GetObjectItem(sp, negated ? "n_whole" : "n")->valueint;
        char h[17];
        snprintf(h, sizeof h, "%016llx", (unsigned long long)ids_hash(mask, V, excluded, negated ? split : NULL, &n));
        const char *ref_h = cJSON_GetObjectItem(sp, negated ? "h_whole" : "h")->valuestring;
        bool eog = mask[eos], ref_eog = cJSON_IsTrue(cJSON_GetObjectItem(sp, "eog"));
        int missing = 0, ours = 0;
        if (negated) {
            const cJSON *x;
            cJSON_ArrayForEach(x, cJSON_GetObjectItem(sp, "split")) missing += !mask[x->valueint];
            for (int t = 0; t < V; t++) ours += mask[t] && split[t] && !excluded[t];
            r->split_extra += ours - cJSON_GetArraySize(cJSON_GetObjectItem(sp, "split"));
        }
        r->steps++;
        if (n != ref_n || strcmp(h, ref_h) || eog != ref_eog || missing) {
            if (r->differ++ == 0)
                snprintf(r->first, sizeof r->first, "step %d: llmi allows %d (eog %d), llama.cpp %d (eog %d)%s", i, n, eog,
                         ref_n, ref_eog, missing ? "; split tokens llama.cpp allows are refused" : "");
        }
        if (i == accepted) {
            int32_t rejected = accepted < n_tok ? cJSON_GetArrayItem(toks, accepted)->valueint : -1;
            if (rejected >= 0 && mask[rejected] && !(negated && split[rejected])) {
                if (r->differ++ == 0)
                    snprintf(r->first, sizeof r->first, "token %d allowed where llama.cpp rejects it", accepted);
            }
            break;
        }
        int32_t tok = cJSON_GetArrayItem(toks, i)->valueint;
        if (!mask[tok] || grammar_state_accept(gs, tok, &st)) {
            if (r->differ++ == 0) snprintf(r->first, sizeof r->first, "token %d (id %d) refused: %s", i, tok, st.msg);
            break;
        }
    }
done:
    free(mask);
    grammar_state_free(gs);
    grammar_free(g);
}

TEST(grammar_masks_match_llamacpp) {
    char path[1024];
    snprintf(path, sizeof path, "%s/grammar/masks.jsonl", testdata());
    char *all = test_read_text(path);
    tokenizer *tk = smollm2_tok(t_);
    if (!all || !tk) {
        CHECK_MSG(all, "cannot read %s", path);
        free(all);
        tok_free(tk);
        return;
    }
    grammar_vocab *gv = NULL;
    llmi_status st = {0};
    CHECK_MSG(grammar_vocab_build(tk, &gv, &st) == 0, "%s", st.msg);
    int V = tok_n_vocab(tk);
    uint8_t *excluded = calloc((size_t)V, 1), *split = calloc((size_t)V, 1);
    char piece[512];
    for (int t = 0; t < V; t++) {
        int n = tok_piece(tk, t, piece, sizeof piece);
        split[t] = !utf8_whole((const uint8_t *)piece, n > 0 ? n : 0);
    }
    int records = 0, steps = 0, negated_walks = 0, split_extra = 0, eos = -1;
    char *save = NULL;
    for (char *line = strtok_r(all, "\n", &save); line && gv; line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *meta = cJSON_GetObjectItem(j, "meta");
        if (meta) {
            CHECK(cJSON_GetObjectItem(meta, "n_vocab")->valueint == V);
            eos = cJSON_GetObjectItem(meta, "eos")->valueint;
            CHECK(eos == tok_eos(tk));
            const cJSON *x;
            cJSON_ArrayForEach(x, cJSON_GetObjectItem(meta, "excluded")) excluded[x->valueint] = 1;
            cJSON_Delete(j);
            continue;
        }
        const char *name = cJSON_GetObjectItem(j, "name")->valuestring;
        const char *gtext = cJSON_GetObjectItem(j, "grammar")->valuestring;
        int ti = cJSON_GetObjectItem(j, "text_index")->valueint;
        bool negated = strstr(gtext, "[^") != NULL;
        mask_walk_result r;
        walk_record(t_, j, gtext, gv, V, excluded, split, eos, negated, &r);
        records++;
        steps += r.steps;
        negated_walks += negated;
        split_extra += r.split_extra;
        CHECK_MSG(r.differ == 0, "%s text %d: %d of %d steps differ; first: %s", name, ti, r.differ, r.steps, r.first);
        cJSON_Delete(j);
    }
    fprintf(stderr, "  %d walks, %d masks over %d tokens: equal to llama.cpp's (in %d walks under negated classes: "
            "equal but for %d more split-UTF-8 tokens allowed)\n", records, steps, V, negated_walks, split_extra);
    CHECK(records >= 100);
    free(excluded);
    free(split);
    grammar_vocab_free(gv);
    tok_free(tk);
    free(all);
}

/* JSON schemas: llmi's converter (engine/json_schema.c) against llama.cpp's.  Each schema
 * case of testdata/grammar/cases.json is converted by llmi and walked over the texts that
 * masks.jsonl walked with llama.cpp's converter's grammar and grammar sampler: equal masks
 * at every step say the two grammars allow the same tokens along every such text, valid,
 * broken part-way or incomplete. */
TEST(grammar_json_schema_masks_match_llamacpp) {
    char path[1024], cpath[1024];
    snprintf(path, sizeof path, "%s/grammar/masks.jsonl", testdata());
    snprintf(cpath, sizeof cpath, "%s/grammar/cases.json", testdata());
    char *all = test_read_text(path), *ctext = test_read_text(cpath);
    cJSON *cases = ctext ? cJSON_Parse(ctext) : NULL;
    tokenizer *tk = smollm2_tok(t_);
    grammar_vocab *gv = NULL;
    llmi_status st = {0};
    if (!all || !cases || !tk || grammar_vocab_build(tk, &gv, &st)) {
        CHECK_MSG(0, "cannot read %s, %s or the vocabulary: %s", path, cpath, st.msg);
        goto out;
    }
    int V = tok_n_vocab(tk), eos = tok_eos(tk), walks = 0, steps = 0, n_schemas = 0;
    uint8_t *excluded = calloc((size_t)V, 1), *split = calloc((size_t)V, 1);
    char piece[512];
    for (int t = 0; t < V; t++) {
        int n = tok_piece(tk, t, piece, sizeof piece);
        split[t] = !utf8_whole((const uint8_t *)piece, n > 0 ? n : 0);
    }
    char *save = NULL;
    for (char *line = strtok_r(all, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *meta = cJSON_GetObjectItem(j, "meta");
        if (meta) {
            const cJSON *x;
            cJSON_ArrayForEach(x, cJSON_GetObjectItem(meta, "excluded")) excluded[x->valueint] = 1;
            cJSON_Delete(j);
            continue;
        }
        const char *name = cJSON_GetObjectItem(j, "name")->valuestring;
        const cJSON *c, *schema = NULL;
        cJSON_ArrayForEach(c, cases) if (!strcmp(cJSON_GetObjectItem(c, "name")->valuestring, name)) schema =
            cJSON_GetObjectItem(c, "schema");
        if (!schema) {
            cJSON_Delete(j);
            continue;
        }
        char *stext = cJSON_PrintUnformatted(schema), *gbnf = NULL;
        llmi_status cs = {0};
        int ti = cJSON_GetObjectItem(j, "text_index")->valueint;
        n_schemas += ti == 0;
        if (json_schema_to_gbnf(stext, strlen(stext), &gbnf, &cs)) {
            CHECK_MSG(0, "%s: llmi refuses the schema: %s", name, cs.msg);
        } else {
            mask_walk_result r;
            walk_record(t_, j, gbnf, gv, V, excluded, split, eos, strstr(gbnf, "[^") != NULL, &r);
            walks++;
            steps += r.steps;
            CHECK_MSG(r.differ == 0, "%s text %d: %d of %d steps differ; first: %s", name, ti, r.differ, r.steps, r.first);
        }
        free(gbnf);
        free(stext);
        cJSON_Delete(j);
    }
    fprintf(stderr, "  %d schemas, %d walks, %d masks: llmi's grammar allows what llama.cpp's converter's does\n",
            n_schemas, walks, steps);
    CHECK(n_schemas >= 10);
    free(excluded);
    free(split);
out:
    grammar_vocab_free(gv);
    tok_free(tk);
    cJSON_Delete(cases);
    free(ctext);
    free(all);
}
