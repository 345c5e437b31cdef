/* test_json_schema.c — JSON Schema -> GBNF (src/engine/json_schema.c): every refusal names
 * the keyword and where it is, as a JSON pointer; each feature's rules have the shape of
 * llama.cpp's (common/json-schema-to-grammar.cpp); every grammar made parses (grammar.c);
 * and texts walk through it, token by token, as llama.cpp's language says (whitespace,
 * property order, no additional properties by default, integer ranges).  Token masks
 * against llama.cpp's own converter use testdata/grammar/schemas.json. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>

#include "engine/grammar.h"
#include "engine/json_schema.h"
#include "test.h"
#include "tok/tokenizer.h"

/* The grammar of schema, which must convert and parse; NULL (a failure recorded) if not. */
static char *js_conv(test_ctx *t_, const char *schema) {
    char *g = NULL;
    llmi_status st = {0};
    int rc = json_schema_to_gbnf(schema, strlen(schema), &g, &st);
    CHECK_MSG(rc == 0 && g, "%s: %s", schema, st.msg);
    if (rc || !g) return NULL;
    grammar *gr = NULL;
    llmi_status pst = {0};
    CHECK_MSG(grammar_parse(g, strlen(g), "json-schema grammar", &gr, &pst) == 0, "%s: %s\n%s", schema, pst.msg, g);
    grammar_free(gr);
    return g;
}

/* schema must be refused with a message containing want. */
static void js_refused(test_ctx *t_, const char *schema, const char *want) {
    char *g = NULL;
    llmi_status st = {0};
    int rc = json_schema_to_gbnf(schema, strlen(schema), &g, &st);
    CHECK_MSG(rc == LLMI_E_USAGE && !g && strstr(st.msg, want) && !strncmp(st.msg, "json-schema: ", 13),
              "%s: rc %d, message \"%s\", want \"%s\"", schema, rc, st.msg, want);
    free(g);
}

/* The body of rule name in grammar g ("" when absent), in a static buffer. */
static const char *js_rule(const char *g, const char *name) {
    static char body[4096];
    body[0] = '\0';
    size_t n = strlen(name);
    for (const char *l = g; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (!strncmp(l, name, n) && !strncmp(l + n, " ::= ", 5)) {
            const char *b = l + n + 5, *e = strchr(b, '\n');
            size_t len = e ? (size_t)(e - b) : strlen(b);
            if (len >= sizeof body) len = sizeof body - 1;
            memcpy(body, b, len);
            body[len] = '\0';
            break;
        }
    }
    return body;
}

#define CHECK_RULE(g, name, want)                                                                  \
    do {                                                                                           \
        const char *got_ = (g) ? js_rule((g), (name)) : "";                                        \
        CHECK_MSG(!strcmp(got_, (want)), "rule %s is \"%s\", want \"%s\"", (name), got_, (want)); \
    } while (0)

/* ---------------------------------------------------------------- refusals */

TEST(json_schema_invalid_json) {
    js_refused(t_, "{\"type\": \"object\", ", "invalid JSON at offset");
    js_refused(t_, "{\"type\": \"string\"} x", "invalid JSON at offset 19: text after the schema");
    js_refused(t_, "", "invalid JSON at offset 0");
    js_refused(t_, "{\"const\": 01}", "invalid JSON at offset 10: invalid number");
    js_refused(t_, "{\"const\": 1.}", "invalid number");
    js_refused(t_, "{\"const\": \"a\tb\"}", "invalid JSON at offset 12: a control character in a string");
    js_refused(t_, "{\"const\": \"\xff\"}", "invalid UTF-8");
    js_refused(t_, "{\"const\": \"a\\u0000b\"}", "\\u0000");
    js_refused(t_, "{\"const\": 1e999}", "out of range");
    js_refused(t_, "{\"type\": \"string\", \"type\": \"integer\"}", "#: the key \"type\" appears twice");
    js_refused(t_, "[]", "#: schema must be an object");
    js_refused(t_, "true", "#: schema must be an object (boolean schemas are not supported)");
}

TEST(json_schema_unsupported_keywords_name_the_pointer) {
    js_refused(t_, "{\"type\":\"object\",\"properties\":{\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},"
                   "\"uniqueItems\":true}}}",
               "json-schema: #/properties/tags: uniqueItems is not supported");
    js_refused(t_, "{\"type\":\"object\",\"properties\":{\"a/b~c\":{\"not\":{}}}}", "#/properties/a~1b~0c: not is not supported");
    js_refused(t_, "{\"type\":\"number\",\"minimum\":0}", "#: minimum is not supported for type number");
    js_refused(t_, "{\"type\":\"string\",\"format\":\"email\"}", "#: format \"email\" is not supported");
    js_refused(t_, "{\"type\":\"string\",\"pattern\":\"^a$\",\"maxLength\":3}", "maxLength beside pattern is not supported");
    js_refused(t_, "{\"type\":\"object\",\"properties\":{\"a\":{}},\"anyOf\":[{}]}", "#: type is not supported beside anyOf");
    js_refused(t_, "{\"$ref\":\"#/$defs/a\",\"maxLength\":3,\"$defs\":{\"a\":{}}}", "#: maxLength is not supported beside $ref");
    js_refused(t_, "{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", "required names \"b\"");
    js_refused(t_, "{\"type\":\"string\",\"nullable\":true}", "#: nullable is not supported");
    js_refused(t_, "{\"minimum\":1}", "#: minimum is not supported without a type");
    js_refused(t_, "{\"type\":\"strng\"}", "#: unknown type \"strng\"");
    js_refused(t_, "{\"type\":[\"string\",\"string\"]}", "type lists \"string\" twice");
    js_refused(t_, "{\"type\":[\"string\",\"null\"],\"minimum\":3}", "minimum is not supported for any of the listed types");
    js_refused(t_, "{\"type\":\"string\",\"enum\":[\"a\",1]}", "#: enum value 1 does not match \"type\"");
    js_refused(t_, "{\"const\":1,\"enum\":[1]}", "#: enum is not supported beside const");
    js_refused(t_, "{\"oneOf\":[{}],\"anyOf\":[{}]}", "anyOf is not supported beside oneOf");
    js_refused(t_, "{\"anyOf\":[]}", "#/anyOf: must be a non-empty array of schemas");
    js_refused(t_, "{\"type\":\"integer\",\"minimum\":1,\"exclusiveMinimum\":0}", "minimum and exclusiveMinimum together");
    js_refused(t_, "{\"type\":\"integer\",\"minimum\":1000000000000000}", "without the other bound is not supported");
    /* one-sided bounds where llama.cpp's grammar is not the integers it says */
    js_refused(t_, "{\"type\":\"integer\",\"minimum\":105}", "minimum without a maximum is not supported here: "
                   "llama.cpp's grammar for it is not exactly the integers >= 105");
    js_refused(t_, "{\"type\":\"integer\",\"exclusiveMinimum\":1209}", "integers >= 1210");
    js_refused(t_, "{\"type\":\"integer\",\"maximum\":-42}", "integers <= -42");
    js_refused(t_, "{\"type\":\"integer\",\"maximum\":-5}", "integers <= -5");
    js_refused(t_, "{\"type\":\"array\",\"prefixItems\":[{}],\"minItems\":1}", "minItems is not supported for a tuple");
    js_refused(t_, "{\"type\":\"array\",\"prefixItems\":[{}],\"items\":{}}", "prefixItems beside items is not supported");
    js_refused(t_, "{\"type\":\"array\",\"minItems\":200000}", "minItems above 100000 is not supported");
    js_refused(t_, "{\"type\":\"array\",\"minItems\":2.0}", "minItems must be a non-negative integer");
    js_refused(t_, "{\"type\":\"array\",\"maxItems\":-1}", "maxItems must be a non-negative integer");
    js_refused(t_, "{\"type\":\"object\",\"properties\":{\"a]\":{}},\"additionalProperties\":true}", "with ']' or '\\'");
    js_refused(t_, "{\"type\":\"object\",\"properties\":{\"\":{}}}", "a property named \"\" at the top level");
    js_refused(t_, "{\"enum\":[0.30000000000000004]}", "16 or more significant digits");
    /* patterns: unanchored, unsupported escapes and groups, and what llama.cpp mistranslates */
    js_refused(t_, "{\"type\":\"string\",\"pattern\":\"[a-z]+\"}", "#: pattern must start with ^ and end with $");
    js_refused(t_, "{\"type\":\"string\",\"pattern\":\"^\\\\d+$\"}", "pattern: this escape is not supported");
    js_refused(t_, "{\"type\":\"string\",\"pattern\":\"^(?=a)a$\"}", "(?...) groups");
    js_refused(t_, "{\"type\":\"string\",\"pattern\":\"^a+?$\"}", "a quantifier after a quantifier");
    js_refused(t_, "{\"type\":\"string\",\"pattern\":\"^ab\\\\.+$\"}", "llama.cpp repeats the whole run");
    js_refused(t_, "{\"type\":\"string\",\"pattern\":\"^\xc3\xa9+$\"}", "after a non-ASCII character");
    js_refused(t_, "{\"type\":\"string\",\"pattern\":\"^(a$\"}", "unbalanced parentheses");
    js_refused(t_, "{\"type\":\"string\",\"pattern\":\"^[z-a]$\"}", "reversed range");
    js_refused(t_, "{\"type\":\"string\",\"pattern\":\"^|*$\"}", "nothing to repeat");
    js_refused(t_, "{\"type\":\"string\",\"pattern\":\"^a{2,1}$\"}", "with n below m");
}

TEST(json_schema_bad_refs) {
    js_refused(t_, "{\"$ref\":\"#/$defs/missing\"}", "#: cannot resolve $ref #/$defs/missing: \"$defs\" not found");
    js_refused(t_, "{\"$defs\":{},\"$ref\":\"#/$defs/missing\"}", "\"missing\" not found");
    js_refused(t_, "{\"$ref\":\"https://example.com/s.json\"}", "only references into this document");
    js_refused(t_, "{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}", "#/items: $ref \"#\" is not supported");
    js_refused(t_, "{\"$ref\":3}", "$ref must be a string");
    js_refused(t_, "{\"$ref\":\"#/$defs/a~1b\",\"$defs\":{\"a/b\":{}}}", "escaped JSON pointers");
    js_refused(t_, "{\"$ref\":\"#/$defs/a\",\"$defs\":{\"a\":true}}", "#/$defs/a: schema must be an object");
    js_refused(t_, "{\"type\":\"array\",\"prefixItems\":[{\"$ref\":\"#/$defs/a_b\"},{\"$ref\":\"#/$defs/a-b\"}],"
                   "\"$defs\":{\"a_b\":{},\"a-b\":{}}}",
               "are one rule to llama.cpp");
}

TEST(json_schema_min_above_max) {
    js_refused(t_, "{\"type\":\"integer\",\"minimum\":5,\"maximum\":3}", "no integer lies between the minimum 5 and the maximum 3");
    js_refused(t_, "{\"type\":\"integer\",\"exclusiveMinimum\":3,\"exclusiveMaximum\":4}", "no integer lies between");
    js_refused(t_, "{\"type\":\"string\",\"minLength\":5,\"maxLength\":3}", "minLength 5 is above maxLength 3");
    js_refused(t_, "{\"type\":\"array\",\"minItems\":5,\"maxItems\":3}", "minItems 5 is above maxItems 3");
}

static char *js_nested(const char *open, const char *mid, const char *close, int depth) {
    size_t lo = strlen(open), lm = strlen(mid), lc = strlen(close);
    char *s = malloc((size_t)depth * (lo + lc) + lm + 1), *p = s;
    for (int i = 0; i < depth; i++) { memcpy(p, open, lo); p += lo; }
    memcpy(p, mid, lm);
    p += lm;
    for (int i = 0; i < depth; i++) { memcpy(p, close, lc); p += lc; }
    *p = '\0';
    return s;
}

TEST(json_schema_depth_bombs) {
    /* deep subschemas */
    char *s = js_nested("{\"type\":\"array\",\"items\":", "{}", "}", 300);
    js_refused(t_, s, "schemas nested deeper than 100 levels");
    free(s);
    s = js_nested("{\"type\":\"array\",\"items\":", "{}", "}", 90);
    free(js_conv(t_, s));
    free(s);
    /* deep JSON (cJSON's limit) and deep data in const */
    s = js_nested("[", "", "]", 100000);
    js_refused(t_, s, "invalid JSON at offset");
    free(s);
    char *data = js_nested("[", "1", "]", 900);
    size_t n = strlen(data) + 32;
    s = malloc(n);
    snprintf(s, n, "{\"const\":%s}", data);
    free(js_conv(t_, s));
    free(s);
    free(data);
    /* a chain of $refs, each to the next */
    size_t cap = 1 << 16, len = 0;
    s = malloc(cap);
    len += (size_t)snprintf(s + len, cap - len, "{\"$ref\":\"#/$defs/d0\",\"$defs\":{");
    for (int i = 0; i < 500; i++)
        len += (size_t)snprintf(s + len, cap - len, "%s\"d%d\":{\"$ref\":\"#/$defs/d%d\"}", i ? "," : "", i, i + 1);
    snprintf(s + len, cap - len, ",\"d500\":{}}}");
    js_refused(t_, s, "schemas nested deeper than 100 levels");
    free(s);
    /* a grammar that would blow up: a type list fanning out at every level */
    s = js_nested("{\"type\":[\"object\",\"array\"],\"properties\":{\"a\":", "{}", "},\"items\":{}}", 60);
    char *g = NULL;
    llmi_status st = {0};
    int rc = json_schema_to_gbnf(s, strlen(s), &g, &st);
    CHECK_MSG(rc == 0 || strstr(st.msg, "larger than"), "%s", st.msg);
    free(g);
    free(s);
}

TEST(json_schema_recursion) {
    /* a linked list: the rule names itself, not through its first character */
    char *g = js_conv(t_, "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
                          "\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},\"required\":[\"v\"]}},"
                          "\"$ref\":\"#/$defs/node\"}");
    CHECK_RULE(g, "root", "ref-defs-node");
    CHECK_RULE(g, "ref-defs-node-next", "ref-defs-node | null");
    free(g);
    /* mutual recursion through arrays */
    g = js_conv(t_, "{\"$defs\":{\"a\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/b\"}},"
                    "\"b\":{\"anyOf\":[{\"$ref\":\"#/$defs/a\"},{\"type\":\"integer\"}]}},\"$ref\":\"#/$defs/a\"}");
    CHECK_RULE(g, "ref-defs-b", "ref-defs-a | integer");
    free(g);
    /* left recursion cannot be matched; an allOf cycle would merge forever */
    js_refused(t_, "{\"$defs\":{\"a\":{\"anyOf\":[{\"$ref\":\"#/$defs/a\"},{\"type\":\"null\"}]}},\"$ref\":\"#/$defs/a\"}",
               "#/$defs/a/anyOf/0: $ref #/$defs/a refers back to itself before matching any text");
    js_refused(t_, "{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}",
               "left recursion");
    js_refused(t_, "{\"$defs\":{\"A\":{\"type\":\"object\",\"properties\":{\"x\":{\"allOf\":[{\"$ref\":\"#/$defs/A\"}]}},"
                   "\"required\":[\"x\"]}},\"allOf\":[{\"$ref\":\"#/$defs/A\"}]}",
               "a $ref cycle through allOf is not supported");
}

/* ---------------------------------------------------------------- each feature's rules */

TEST(json_schema_shared_rules) {
    char *g = js_conv(t_, "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\"},\"n\":{\"type\":\"number\"},"
                          "\"i\":{\"type\":\"integer\"},\"b\":{\"type\":\"boolean\"},\"z\":{\"type\":\"null\"},\"v\":{}},"
                          "\"required\":[\"s\",\"n\",\"i\",\"b\",\"z\",\"v\"]}");
    CHECK_RULE(g, "space", "| \" \" | \"\\n\"{1,2} [ \\t]{0,20}");
    CHECK_RULE(g, "char", "[^\"\\\\\\x7F\\x00-\\x1F] | [\\\\] ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4})");
    CHECK_RULE(g, "string", "\"\\\"\" char* \"\\\"\"");
    CHECK_RULE(g, "number", "(\"-\"? integral-part) (\".\" decimal-part)? ([eE] [-+]? integral-part)?");
    CHECK_RULE(g, "integral-part", "[0] | [1-9] [0-9]{0,15}");
    CHECK_RULE(g, "decimal-part", "[0-9]{1,16}");
    CHECK_RULE(g, "integer", "(\"-\"? integral-part)");
    CHECK_RULE(g, "boolean", "(\"true\" | \"false\")");
    CHECK_RULE(g, "null", "\"null\"");
    CHECK_RULE(g, "value", "object | array | string | number | boolean | null");
    CHECK_RULE(g, "object", "\"{\" space ( string \":\" space value (\",\" space string \":\" space value)* )? space \"}\"");
    CHECK_RULE(g, "array", "\"[\" space ( value (\",\" space value)* )? space \"]\"");
    CHECK_RULE(g, "s-kv", "\"\\\"s\\\"\" space \":\" space string");
    CHECK_RULE(g, "root", "\"{\" space s-kv \",\" space n-kv \",\" space i-kv \",\" space b-kv \",\" space z-kv \",\" space v-kv space \"}\"");
    free(g);
    g = js_conv(t_, "{}");
    CHECK_RULE(g, "root", "value");
    free(g);
    g = js_conv(t_, "{\"type\":\"object\"}");
    CHECK_RULE(g, "root", "\"{\" space  (additional-kv ( \",\" space additional-kv )* )? space \"}\"");
    CHECK_RULE(g, "additional-kv", "string \":\" space value");
    free(g);
}

TEST(json_schema_object_property_order) {
    /* required first in schema order (not "required"'s order), then any ordered subset of
     * the optional ones; no other keys unless additionalProperties says so */
    char *g = js_conv(t_, "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"},"
                          "\"c\":{\"type\":\"integer\"},\"d\":{\"type\":\"integer\"}},\"required\":[\"d\",\"b\"]}");
    CHECK_RULE(g, "root", "\"{\" space b-kv \",\" space d-kv ( \",\" space ( a-kv c-kv-rest | c-kv ) )? space \"}\"");
    CHECK_RULE(g, "c-kv-rest", "( \",\" space c-kv )?");
    free(g);
    g = js_conv(t_, "{\"type\":\"object\",\"properties\":{\"a\":{},\"b\":{}}}");
    CHECK_RULE(g, "root", "\"{\" space  (a-kv b-kv-rest | b-kv )? space \"}\"");
    free(g);
    g = js_conv(t_, "{\"type\":\"object\",\"properties\":{}}");
    CHECK_RULE(g, "root", "\"{\" space \"}\"");
    free(g);
    /* additionalProperties: keys that are none of the declared names */
    g = js_conv(t_, "{\"type\":\"object\",\"properties\":{\"ab\":{\"type\":\"integer\"},\"ac\":{\"type\":\"integer\"},"
                    "\"-x\":{\"type\":\"integer\"}},\"required\":[\"ab\"],\"additionalProperties\":{\"type\":\"string\"}}");
    CHECK_RULE(g, "root", "\"{\" space ab-kv ( \",\" space ( ac-kv -x-kv-rest | -x-kv additional-kv-rest | "
                          "additional-kv ( \",\" space additional-kv )* ) )? space \"}\"");
    CHECK_RULE(g, "additional-kv", "additional-k \":\" space string");
    /* llama.cpp writes [^"-a] unescaped: a range from '"' to 'a' */
    CHECK_RULE(g, "additional-k", "[\"] ( [\\-] additional-k-node | [a] additional-k-node-1 | [^\\\"-a] char* )? [\"]");
    CHECK_RULE(g, "additional-k-node-1", "[b] char+ | [c] char+ | [^\\\"bc] char*");
    free(g);
}

TEST(json_schema_arrays) {
    char *g = js_conv(t_, "{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":2,\"maxItems\":4}");
    CHECK_RULE(g, "root", "\"[\" space number (\",\" space number){1,3} space \"]\"");
    free(g);
    g = js_conv(t_, "{\"type\":\"array\",\"items\":{\"type\":\"string\"}}");
    CHECK_RULE(g, "root", "\"[\" space (string (\",\" space string)*)? space \"]\"");
    free(g);
    g = js_conv(t_, "{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"minItems\":1}");
    CHECK_RULE(g, "root", "\"[\" space string (\",\" space string)* space \"]\"");
    free(g);
    g = js_conv(t_, "{\"type\":\"array\",\"maxItems\":1}");
    CHECK_RULE(g, "root", "\"[\" space value? space \"]\"");
    free(g);
    g = js_conv(t_, "{\"type\":\"array\",\"maxItems\":0}");
    CHECK_RULE(g, "root", "\"[\" space  space \"]\"");
    free(g);
    /* tuples: prefixItems, or items as an array */
    g = js_conv(t_, "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\",\"maxLength\":2},{\"type\":\"integer\"}]}");
    CHECK_RULE(g, "root", "\"[\" space tuple-0 \",\" space integer space \"]\"");
    CHECK_RULE(g, "tuple-0", "\"\\\"\" char{0,2} \"\\\"\"");
    free(g);
    g = js_conv(t_, "{\"items\":[{\"type\":\"boolean\"}]}");
    CHECK_RULE(g, "root", "\"[\" space boolean space \"]\"");
    free(g);
}

TEST(json_schema_strings) {
    char *g = js_conv(t_, "{\"type\":\"string\",\"minLength\":1,\"maxLength\":100}");
    CHECK_RULE(g, "root", "\"\\\"\" char{1,100} \"\\\"\"");
    free(g);
    g = js_conv(t_, "{\"type\":\"string\",\"minLength\":3}");
    CHECK_RULE(g, "root", "\"\\\"\" char{3,} \"\\\"\"");
    free(g);
    g = js_conv(t_, "{\"maxLength\":0}");
    CHECK_RULE(g, "root", "\"\\\"\"  \"\\\"\"");
    free(g);
    g = js_conv(t_, "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\",\"format\":\"date\"},{\"format\":\"time\"},"
                    "{\"type\":\"string\",\"format\":\"date-time\"},{\"type\":\"string\",\"format\":\"uuid\"}]}");
    CHECK_RULE(g, "tuple-0", "\"\\\"\" date \"\\\"\"");
    CHECK_RULE(g, "tuple-1", "\"\\\"\" time \"\\\"\"");
    CHECK_RULE(g, "tuple-2", "\"\\\"\" date-time \"\\\"\"");
    CHECK_RULE(g, "root", "\"[\" space tuple-0 \",\" space tuple-1 \",\" space tuple-2 \",\" space uuid space \"]\"");
    CHECK_RULE(g, "date", "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | [1-2] [0-9] | \"3\" [0-1] )");
    CHECK_RULE(g, "date-time", "date \"T\" time");
    free(g);
    /* patterns: literal runs merged, classes, groups, repetitions */
    g = js_conv(t_, "{\"type\":\"string\",\"pattern\":\"^[a-z]+(-[a-z0-9]{2,4})*\\\\.(com|org)?$\"}");
    CHECK_RULE(g, "root", "\"\\\"\" ([a-z]+ (\"-\" [a-z0-9]{2,4})* \".\" (\"com\" | \"org\")?) \"\\\"\"");
    free(g);
    g = js_conv(t_, "{\"type\":\"string\",\"pattern\":\"^a.b\\\\.c[^x-z\\\\]]+(?:d|e|)\\\\x41{3}\\\"q$\"}");
    CHECK_RULE(g, "root", "\"\\\"\" (\"a\" dot \"b.c\" [^x-z\\]]+ (\"d\" | \"e\" |) \"A\"{3,3} \"\\\"q\") \"\\\"\"");
    CHECK_RULE(g, "dot", "[^\\x0A\\x0D]");
    free(g);
}

TEST(json_schema_integers) {
    /* llama.cpp's ranges, digit by digit */
    char *g2, *g = js_conv(t_, "{\"type\":\"integer\",\"minimum\":0,\"maximum\":150}");
    CHECK_RULE(g, "root", "([0-9] | ([1-8] [0-9] | [9] [0-9]) | \"1\" ([0-4] [0-9] | [5] \"0\"))");
    free(g);
    g = js_conv(t_, "{\"type\":\"integer\",\"minimum\":-5,\"maximum\":7}");
    CHECK_RULE(g, "root", "(\"-\" ([0-5]) | [0-7])");
    free(g);
    g = js_conv(t_, "{\"type\":\"integer\",\"minimum\":150}");
    CHECK_RULE(g, "root", "([1] ([0-4] [0-9]{2,14} | [5] ([0-9]{1,14}) | [6-9] [0-9]{1,14}) | [2-9] [0-9]{2,15})");
    free(g);
    g = js_conv(t_, "{\"type\":\"integer\",\"exclusiveMinimum\":0}");
    CHECK_RULE(g, "root", "([1-9] [0-9]{0,15})");
    free(g);
    g = js_conv(t_, "{\"type\":\"integer\",\"maximum\":-150}");
    CHECK_RULE(g, "root", "(\"-\" ([1] ([0-4] [0-9]{2,14} | [5] ([0-9]{1,14}) | [6-9] [0-9]{1,14}) | [2-9] [0-9]{2,15}))");
    g2 = js_conv(t_, "{\"type\":\"integer\",\"maximum\":42}");
    CHECK_RULE(g2, "root", "(\"-\" [1-9] [0-9]{0,15} | [0-9] | ([1-3] [0-9] | [4] [0-2]))");
    free(g2);
    free(g);
    /* fractional bounds round inwards */
    g = js_conv(t_, "{\"type\":\"integer\",\"minimum\":1.5,\"exclusiveMaximum\":9.5}");
    CHECK_RULE(g, "root", "([2-9])");
    free(g);
}

TEST(json_schema_enum_const_anyof_types) {
    /* values written as llama.cpp's JSON dump writes them: compact, 1.0 kept, 1e2 as 100.0 */
    char *g = js_conv(t_, "{\"enum\":[\"red\",1,1.0,1e2,-0,-0.0,1.5e-7,null,true,{\"a\":[1,\"x\\n\\\"y\"]},\"\\u00e9\\u0001\"]}");
    CHECK_RULE(g, "root", "(\"\\\"red\\\"\" | \"1\" | \"1.0\" | \"100.0\" | \"0\" | \"-0.0\" | \"1.5e-07\" | \"null\" | \"true\" | "
                          "\"{\\\"a\\\":[1,\\\"x\\\\n\\\\\\\"y\\\"]}\" | \"\\\"\xc3\xa9\\\\u0001\\\"\")");
    free(g);
    g = js_conv(t_, "{\"type\":\"string\",\"const\":\"x\"}");
    CHECK_RULE(g, "root", "\"\\\"x\\\"\"");
    free(g);
    g = js_conv(t_, "{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}],\"title\":\"t\",\"default\":null}");
    CHECK_RULE(g, "root", "string | null");
    free(g);
    g = js_conv(t_, "{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"boolean\"}]}");
    CHECK_RULE(g, "root", "integer | boolean");
    free(g);
    g = js_conv(t_, "{\"type\":[\"string\",\"null\"],\"maxLength\":3}");
    CHECK_RULE(g, "root", "null | string-1");
    CHECK_RULE(g, "string-1", "\"\\\"\" char{0,3} \"\\\"\"");
    free(g);
    g = js_conv(t_, "{\"type\":[\"object\",\"null\"],\"properties\":{\"x\":{\"type\":\"integer\"}},\"required\":[\"x\"]}");
    CHECK_RULE(g, "root", "null | object-1");
    CHECK_RULE(g, "object-1", "\"{\" space object-x-kv space \"}\"");
    free(g);
    /* the cJSON variant keeps no number text */
    cJSON *doc = cJSON_Parse("{\"enum\":[1.0,2.5]}");
    char *g2 = NULL;
    llmi_status st = {0};
    CHECK_MSG(json_schema_to_gbnf_cjson(doc, &g2, &st) == 0, "%s", st.msg);
    CHECK_RULE(g2, "root", "(\"1\" | \"2.5\")");
    free(g2);
    cJSON_Delete(doc);
}

TEST(json_schema_all_of_and_refs) {
    char *g = js_conv(t_, "{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"]},"
                          "{\"$ref\":\"#/$defs/b\"}],\"$defs\":{\"b\":{\"properties\":{\"b\":{\"type\":\"integer\"}},"
                          "\"required\":[\"b\"]}}}");
    CHECK_RULE(g, "root", "\"{\" space a-kv \",\" space b-kv space \"}\"");
    free(g);
    g = js_conv(t_, "{\"allOf\":[{\"enum\":[\"a\",\"b\",\"c\"]},{\"$ref\":\"#/definitions/e\"}],"
                    "\"definitions\":{\"e\":{\"enum\":[\"c\",\"d\",\"b\"]}}}");
    CHECK_RULE(g, "root", "(\"\\\"b\\\"\" | \"\\\"c\\\"\")");
    free(g);
    js_refused(t_, "{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{}}}]}", "#/allOf/0: allOf: property \"a\" is optional");
    js_refused(t_, "{\"allOf\":[{\"type\":\"string\"}]}", "#/allOf/0: allOf: a part that is a string is not supported");
    js_refused(t_, "{\"allOf\":[{\"anyOf\":[{}]}]}", "a part that is anyOf");
    js_refused(t_, "{\"allOf\":[{\"enum\":[1]},{\"enum\":[2]}]}", "the enums have no value in common");
    /* $ref anywhere in the document, and to an array element */
    g = js_conv(t_, "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":2},"
                    "\"b\":{\"$ref\":\"#/properties/a\"},\"c\":{\"$ref\":\"#/$defs/l/1\"}},\"$defs\":{\"l\":[{},{\"type\":\"null\"}]}}");
    CHECK_RULE(g, "b-kv", "\"\\\"b\\\"\" space \":\" space ref-properties-a");
    CHECK_RULE(g, "ref-properties-a", "\"\\\"\" char{0,2} \"\\\"\"");
    CHECK_RULE(g, "ref-defs-l-1", "null");
    free(g);
}

/* ---------------------------------------------------------------- texts through the grammar */

/* Whether text, as the tokenizer splits it, walks through grammar g to a complete sentence. */
static bool js_accepts(test_ctx *t_, tokenizer *tk, grammar_vocab *gv, const char *g, const char *text) {
    grammar *gr = NULL;
    grammar_state *gs = NULL;
    llmi_status st = {0};
    int32_t *ids = NULL;
    int n = 0, i = 0;
    bool ok = false;
    uint8_t *mask = malloc((size_t)tok_n_vocab(tk));
    if (grammar_parse(g, strlen(g), "schema", &gr, &st) || grammar_state_create(gr, gv, &gs, &st) ||
        tok_encode(tk, text, strlen(text), false, false, &ids, &n, &st)) {
        CHECK_MSG(0, "%s", st.msg);
        goto done;
    }
    for (i = 0; i < n; i++) {
        if (grammar_state_mask(gs, true, mask, &st) < 0) { CHECK_MSG(0, "%s", st.msg); goto done; }
        if (!mask[ids[i]] || grammar_state_accept(gs, ids[i], &st)) break;
    }
    ok = i == n && grammar_state_complete(gs);
done:
    free(ids);
    free(mask);
    grammar_state_free(gs);
    grammar_free(gr);
    return ok;
}

TEST(json_schema_texts_walk_as_llamacpp) {
    grammar_vocab *gv = NULL;
    llmi_status st = {0};
    tokenizer *tk = test_smollm2_tokenizer(&st);
    if (!tk || grammar_vocab_build(tk, &gv, &st)) {
        CHECK_MSG(0, "%s", st.msg);
        tok_free(tk);
        return;
    }
    static const struct { const char *schema, *text; bool ok; } cases[] = {
#define PERSON "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150}," \
               "\"email\":{\"type\":\"string\"}},\"required\":[\"name\",\"age\"]}"
        {PERSON, "{\"name\": \"Al\", \"age\": 30}", true},
        {PERSON, "{\n  \"name\": \"Al\",\n  \"age\": 30,\n  \"email\": \"a@b\"\n}", true},
        {PERSON, "{\"name\":\"Al\",\"age\":150}", true},
        {PERSON, "{\"age\": 30, \"name\": \"Al\"}", false},                /* required order */
        {PERSON, "{\"name\": \"Al\"}", false},                             /* age missing */
        {PERSON, "{\"name\": \"Al\", \"age\": 30, \"x\": 1}", false},      /* no additional properties */
        {PERSON, "{\"name\": \"Al\", \"age\": 151}", false},
        {PERSON, "{\"name\": \"Al\" , \"age\": 1}", false},                /* no space before a comma */
        {PERSON, "{\"name\": \"Al\", \"age\": 30} ", false},               /* nor after the value */
        {"{\"type\":\"integer\",\"minimum\":-5,\"maximum\":7}", "-0", true},   /* llama.cpp's quirk */
        {"{\"type\":\"integer\",\"minimum\":150}", "149", false},
        {"{\"type\":\"integer\",\"minimum\":150}", "1000", true},
        {"{\"type\":\"integer\",\"maximum\":-150}", "-0150", false},
        {"{\"type\":\"integer\",\"maximum\":-150}", "-149", false},
        {"{\"type\":\"integer\",\"maximum\":-150}", "-150", true},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":3}", "[1, 2, 3]", true},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":3}", "[1]", false},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":3}", "[1,2,3,4]", false},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-02-29\"", true},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-13-01\"", false},
        {"{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-[0-9]+$\"}", "\"AB-123\"", true},
        {"{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-[0-9]+$\"}", "\"A-123\"", false},
        {"{\"enum\":[\"red\",\"green\"]}", "\"green\"", true},
        {"{\"enum\":[\"red\",\"green\"]}", "\"blue\"", false},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", "{\"a\": 1, \"b\": 2}", true},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", "{\"a\": \"x\"}", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *g = js_conv(t_, cases[i].schema);
        if (!g) continue;
        bool ok = js_accepts(t_, tk, gv, g, cases[i].text);
        CHECK_MSG(ok == cases[i].ok, "case %zu: %s on %s: accepted %d", i, cases[i].text, cases[i].schema, ok);
        free(g);
    }
    grammar_vocab_free(gv);
    tok_free(tk);
}

/* ---------------------------------------------------------------- against llama.cpp's converter */


/* testdata/grammar/schemas.json: for each schema, llmi's grammar and the one llama.cpp's
 * converter printed (scripts/llamacpp-json-schema.cpp), both read by llmi's grammar parser,
 * allow the same tokens at every step of random walks (this run's seed) through them. */
TEST(json_schema_matches_llamacpp_reference) {
    char path[1024];
    char *text = test_read_text(test_data_path(path, sizeof path, "grammar/schemas.json"));
    cJSON *all = text ? cJSON_Parse(text) : NULL;
    grammar_vocab *gv = NULL;
    llmi_status st = {0};
    tokenizer *tk = all ? test_smollm2_tokenizer(&st) : NULL;
    if (!all || !tk || grammar_vocab_build(tk, &gv, &st)) {
        CHECK_MSG(0, "cannot read %s or the vocabulary: %s", path, st.msg);
        goto out;
    }
    int V = tok_n_vocab(tk), n_schemas = 0, steps = 0;
    uint8_t *ma = malloc((size_t)V), *mb = malloc((size_t)V);
    unsigned long long rng = test_seed() * 2654435761ull + 1;
    const cJSON *e;
    cJSON_ArrayForEach(e, all) {
        const char *name = cJSON_GetObjectItemCaseSensitive(e, "name")->valuestring;
        const char *ref = cJSON_GetObjectItemCaseSensitive(e, "llamacpp_gbnf")->valuestring;
        char *stext = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(e, "schema"));
        char *mine = js_conv(t_, stext);
        grammar *ga = NULL, *gb = NULL;
        if (!mine || grammar_parse(ref, strlen(ref), name, &gb, &st) || grammar_parse(mine, strlen(mine), name, &ga, &st)) {
            CHECK_MSG(0, "%s: %s", name, st.msg);
            goto next;
        }
        n_schemas++;
        for (int walk = 0; walk < 4; walk++) {
            grammar_state *sa = NULL, *sb = NULL;
            if (grammar_state_create(ga, gv, &sa, &st) || grammar_state_create(gb, gv, &sb, &st)) {
                CHECK_MSG(0, "%s", st.msg);
                grammar_state_free(sa);
                break;
            }
            for (int step = 0; step < 48; step++) {
                int na = grammar_state_mask(sa, true, ma, &st), nb = grammar_state_mask(sb, true, mb, &st);
                steps++;
                if (na < 0 || nb < 0 || na != nb || memcmp(ma, mb, (size_t)V)) {
                    CHECK_MSG(0, "%s walk %d step %d: llmi allows %d tokens, llama.cpp's grammar %d (%s)", name, walk, step,
                              na, nb, st.msg);
                    break;
                }
                int pick = -1, seen = 0;
                for (int t = 0; t < V; t++) {
                    if (!ma[t] || t == tok_eos(tk)) continue;
                    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                    if ((rng >> 33) % (unsigned long long)++seen == 0) pick = t;   /* uniform among the allowed */
                }
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                if (pick < 0 || (grammar_state_complete(sa) && (rng >> 33) % 4 == 0)) break;
                if (grammar_state_accept(sa, pick, &st) || grammar_state_accept(sb, pick, &st)) {
                    CHECK_MSG(0, "%s: %s", name, st.msg);
                    break;
                }
            }
            grammar_state_free(sa);
            grammar_state_free(sb);
        }
    next:
        grammar_free(ga);
        grammar_free(gb);
        free(mine);
        free(stext);
    }
    fprintf(stderr, "  %d schemas, %d masks: llmi's grammar allows what llama.cpp's converter's does\n", n_schemas, steps);
    CHECK(n_schemas >= 20);
    free(ma);
    free(mb);
out:
    grammar_vocab_free(gv);
    tok_free(tk);
    cJSON_Delete(all);
    free(text);
}
