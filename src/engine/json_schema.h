/* json_schema.h — owns the conversion of a JSON Schema (--json-schema, a request's
 * "json_schema") into a GBNF grammar for grammar.h, so that llmi constrains output to the
 * same language as llama.cpp's `-j` (common/json-schema-to-grammar.cpp): the same `space`
 * rule between tokens, required properties in schema order then any ordered subset of the
 * optional ones, additionalProperties false unless the schema says otherwise, the same
 * string, number, integer-range, date/time/uuid and pattern languages.  Rule names are
 * llmi's own; the language is llama.cpp's (testdata/grammar/schemas.json holds llama.cpp's
 * grammar for each supported feature).
 *
 * Supported: type (a name or a list), properties, required, additionalProperties, items
 * (a schema, or an array = a tuple), prefixItems, minItems, maxItems, minLength, maxLength,
 * pattern (^...$), format (date, time, date-time, uuid, uuid1..uuid5), minimum, maximum,
 * exclusiveMinimum, exclusiveMaximum (integers only), enum, const, anyOf, oneOf (read as
 * anyOf, as llama.cpp does), allOf (of objects, or of enums), $ref into the same document
 * (#/$defs/..., #/definitions/..., any #/ pointer; recursion is fine, as a rule that names
 * itself).  Ignored: the annotations title, description, examples, default, $schema, $id,
 * $comment, readOnly, writeOnly, deprecated, and the $defs / definitions containers.
 *
 * No silent fallbacks: where llama.cpp skips a keyword (uniqueItems, minimum on a number,
 * an unknown format, properties beside anyOf, an unsupported regex, any unknown keyword,
 * ...) or would build a grammar that does not mean what the schema says, the conversion
 * fails with one line naming the keyword and where it is, as a JSON pointer:
 *   json-schema: #/properties/tags: uniqueItems is not supported
 * The second kind: a bound on one side of an integer that llama.cpp's digit rules get
 * wrong (minimum 105 lets 104 through; give both bounds), allOf parts it would drop or
 * misread (optional properties made required, anyOf, strings), regex runs it would
 * repeat whole ("ab\.+"), a property named "" at the top level, two $refs it would name
 * alike, const/enum numbers with 16+ significant digits (its Grisu2 digits may differ). 
 * Input is untrusted: nesting, $ref chains and the grammar's size are bounded, and $ref
 * cycles end (a cycle that matches no text first, i.e. left recursion, is refused). */
#ifndef LLMI_JSON_SCHEMA_H
#define LLMI_JSON_SCHEMA_H

#include <stddef.h>
#include "core/status.h"

struct cJSON;

/* schema_text (len bytes, need not be NUL-terminated): the schema as JSON text.  On
 * success *gbnf is a malloc'ed NUL-terminated grammar whose start rule is "root".  Fails
 * with LLMI_E_USAGE for invalid JSON (with the byte offset) or a schema outside the
 * supported subset, LLMI_E_RUNTIME when out of memory. */
int json_schema_to_gbnf(const char *schema_text, size_t len, char **gbnf, llmi_status *st);

/* The same for an already parsed schema.  cJSON keeps no number text, so a number in const
 * or enum is written from its value: 1.0 becomes 1 (llama.cpp writes 1.0, the text variant
 * does too); prefer json_schema_to_gbnf when the text is at hand. */
int json_schema_to_gbnf_cjson(const struct cJSON *schema, char **gbnf, llmi_status *st);

#endif
