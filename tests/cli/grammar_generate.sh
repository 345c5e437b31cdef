#!/usr/bin/env bash
# Grammar-constrained generation (--grammar, --json-schema, per-request "grammar") on SmolLM2:
#  - sampled output (temperature 1.5, no top-k/top-p/min-p cut, seeds from the run's seed) is
#    a sentence of its grammar every time, checked by Python regexes written from the grammars
#    (never by llmi): ASCII lists, a JSON-shaped record, a choice, and Hiragana (multi-byte
#    code points that the byte-level vocabulary splits over tokens); and JSON that a schema
#    accepts (a per-request "json_schema": required and optional keys, an enum, an integer
#    range, a bounded array of bounded strings), checked by Python's json and the schema's
#    rules written out by hand;
#  - the text ends where the grammar does: end-of-generation comes only once it is whole, and
#    with --ignore-eos a finished grammar ends the request as "stop";
#  - greedy output is the same alone and in a batch, and with --spec ngram as without;
#  - a grammar that grows too ambiguous to follow fails its own request (finish "grammar", a
#    line on stderr, exit 1 at the end), and the others in the batch go on;
#  - bad grammars fail with one line naming the flag or line, before any work.
. "$(dirname "$0")/../lib/common.sh"
need_model
echo "seed $SEED"
L="$LLMI_SAN"
G_LIST='root ::= ("- " [a-z]{1,12} "\n"){3}'
G_REC='root ::= "{\"name\": \"" [A-Za-z ]{1,20} "\", \"age\": " [1-9] [0-9]{0,2} "}"'
G_CHOICE='root ::= "yes" | "no" | "maybe"'
G_KANA='root ::= [ぁ-ゟ]{2,8}'
SCHEMA='{"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 12},
  "kind": {"enum": ["cat", "dog", "bird"]}, "age": {"type": "integer", "minimum": 0, "maximum": 30},
  "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
  "note": {"type": "string", "maxLength": 10}}, "required": ["name", "kind", "age"]}'
python3 - "$TMP/prompts.jsonl" "$SEED" "$SCHEMA" "$G_LIST" "$G_REC" "$G_CHOICE" "$G_KANA" <<'PY' || fail "making prompts"
import json, random, sys
out, seed, schema, grammars = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4:]
asks = ["List three animals.", "Describe a person as JSON.", "Is the sky green?", "Write a word in Japanese.",
        "Describe a pet as JSON."]
rng = random.Random(seed)
with open(out, "w") as f:
    for i in range(40):
        g = i % 5
        r = {"prompt": asks[g], "seed": rng.randrange(1 << 30)}
        if g < 4:
            r["grammar"] = grammars[g]
        else:
            r["json_schema"] = schema
        f.write(json.dumps(r) + "\n")
PY
KEEP=("$TMP/prompts.jsonl")
"$LLMI" generate --device cpu -m "$MODEL" --chat --prompts "$TMP/prompts.jsonl" -n 256 --temp 1.5 --top-k 0 \
  --top-p 1 --min-p 0 --json --no-stats >"$TMP/sampled.json" || fail "sampled run"
KEEP+=("$TMP/sampled.json")
python3 - "$TMP/sampled.json" <<'PY' || fail "sampled output outside its grammar"
import json, re, sys
rx = [r"(- [a-z]{1,12}\n){3}", r'\{"name": "[A-Za-z ]{1,20}", "age": [1-9][0-9]{0,2}\}', r"yes|no|maybe",
      r"[\u3041-\u309f]{2,8}"]
got = [json.loads(l) for l in open(sys.argv[1])]
assert len(got) == 40, len(got)
def pet(text):
    v = json.loads(text)
    assert isinstance(v, dict) and {"name", "kind", "age"} <= set(v) <= {"name", "kind", "age", "tags", "note"}, v
    assert isinstance(v["name"], str) and 1 <= len(v["name"]) <= 12, v
    assert v["kind"] in ("cat", "dog", "bird") and type(v["age"]) is int and 0 <= v["age"] <= 30, v
    assert all(isinstance(t, str) and len(t) <= 8 for t in v.get("tags", [])) and len(v.get("tags", [])) <= 3, v
    assert isinstance(v.get("note", ""), str) and len(v.get("note", "")) <= 10, v
    return True
for o in got:
    g = o["index"] % 5
    assert o["finish_reason"] == "eos", (o["index"], o["finish_reason"], o["text"])
    assert pet(o["text"]) if g == 4 else re.fullmatch(rx[g], o["text"]), (o["index"], o["text"])
print("40 sampled outputs, each a whole sentence of its grammar or schema; e.g.", [got[i]["text"] for i in range(5)])
PY

# A finished grammar with --ignore-eos: nothing may follow, so the request stops there.
"$LLMI" generate --device cpu -m "$MODEL" --chat -p "Is the sky green?" -n 16 --temp 0 --ignore-eos \
  --grammar "$G_CHOICE" --json --no-stats >"$TMP/ie.json" || fail "--ignore-eos run"
python3 -c '
import json, sys
o = json.load(open(sys.argv[1]))
assert o["finish_reason"] == "stop" and o["text"] in ("yes", "no", "maybe"), o
print("--ignore-eos:", o["text"], o["finish_reason"])' "$TMP/ie.json" || fail "--ignore-eos with a finished grammar"

# Greedy: alone vs batched, speculation on vs off, the same tokens.
grep -v '"Write a word' "$TMP/prompts.jsonl" | head -6 >"$TMP/six.jsonl"
run() { "$LLMI" generate --device cpu -m "$MODEL" --chat -n 48 --temp 0 --json --no-stats "$@"; }
run --prompts "$TMP/six.jsonl" >"$TMP/batch.json" || fail "greedy batch"
run --prompts "$TMP/six.jsonl" --spec ngram --spec-k 4 --spec-ngram 1,3 >"$TMP/spec.json" || fail "greedy --spec ngram"
for i in 1 4; do
  sed -n "${i}p" "$TMP/six.jsonl" >"$TMP/one.jsonl"
  run --prompts "$TMP/one.jsonl" >"$TMP/alone$i.json" || fail "greedy alone $i"
done
python3 - "$TMP" <<'PY' || fail "greedy output under a grammar depends on batching or speculation"
import json, sys
d = sys.argv[1]
load = lambda n: [json.loads(l) for l in open(f"{d}/{n}.json")]
b, s = load("batch"), load("spec")
assert [o["tokens"] for o in b] == [o["tokens"] for o in s], "spec ngram changed greedy tokens"
assert sum(o.get("spec_accepted", 0) for o in s) > 0, "no proposal accepted: the check proves nothing"
for i in (1, 4):
    assert load(f"alone{i}")[0]["tokens"] == b[i - 1]["tokens"], f"request {i} alone differs from batched"
print("greedy: batched == alone == --spec ngram (%d proposals accepted)" % sum(o["spec_accepted"] for o in s))
PY

# A grammar whose parses double with every "x" (2^k stacks of pending "a"/"b") passes the
# state's bound of 4096 after a dozen: that request ends, the other is served.
printf '%s\n' '{"prompt": "xxxxxxxxxxxx", "grammar": "root ::= s\ns ::= \"x\" (s \"a\")? | \"x\" (s \"b\")?"}' \
  '{"prompt": "Say yes", "grammar": "root ::= \"yes\""}' >"$TMP/amb.jsonl"
"$L" generate --device cpu -m "$MODEL" --prompts "$TMP/amb.jsonl" -n 32 --temp 0 --json --no-stats \
  >"$TMP/amb.json" 2>"$TMP/amb.err"
rc=$?
[ $rc -eq 1 ] || fail "a too ambiguous grammar: exit $rc (want 1)"
grep -q "request 0: grammar: the grammar is too ambiguous to follow" "$TMP/amb.err" || fail "no line for it: $(cat "$TMP/amb.err")"
python3 -c '
import json, sys
o = [json.loads(l) for l in open(sys.argv[1])]
assert [x["finish_reason"] for x in o] == ["grammar", "eos"] and o[1]["text"] == "yes", o
print("too ambiguous: request 0 ended as grammar, request 1 served:", o[1]["text"])' "$TMP/amb.json" ||
  fail "the other request was not served"

# Bad grammars: one line naming the flag or line, exit 2, before any work.
expect_error "--grammar: line 1" "$L" generate --device cpu -m "$MODEL" -p hi --grammar 'root ::= "a" )'
expect_error "rule foo is used but never defined" "$L" generate --device cpu -m "$MODEL" -p hi --grammar 'root ::= foo'
expect_error "left recursion" "$L" generate --device cpu -m "$MODEL" -p hi --grammar 'root ::= root "a" | "b"'
expect_error "-j: --grammar was given already" "$L" generate --device cpu -m "$MODEL" -p hi --grammar 'root ::= "a"' -j '{}'
expect_error "missing.gbnf" "$L" generate --device cpu -m "$MODEL" -p hi --grammar-file "$TMP/missing.gbnf"
printf '{"prompt": "x", "grammar": 5}\n' >"$TMP/bad1.jsonl"
expect_error "bad1.jsonl:1: \"grammar\" must be a string" "$L" generate --device cpu -m "$MODEL" --prompts "$TMP/bad1.jsonl"
printf '{"prompt": "x"}\n{"prompt": "x", "grammar": "root ::= [z-a]"}\n' >"$TMP/bad2.jsonl"
expect_error "bad2.jsonl:2: \"grammar\": line 1 col 11: character range is empty" "$L" generate --device cpu -m "$MODEL" --prompts "$TMP/bad2.jsonl"
printf '{"prompt": "x", "grammar": "root ::= \\"a\\"", "json_schema": {}}\n' >"$TMP/bad3.jsonl"
expect_error "not both" "$L" generate --device cpu -m "$MODEL" --prompts "$TMP/bad3.jsonl"
echo "grammar_generate ok"
