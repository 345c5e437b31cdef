#!/usr/bin/env bash
# The generate paths a user takes: -p, -f, stdin, --chat, --json, --verbose-prompt, -n 0,
# stop strings, and that the stream equals the one-shot text.
. "$(dirname "$0")/../lib/common.sh"
need_model
L="$LLMI"
# Chat: the instruct model knows this one.
out=$("$L" generate -m "$MODEL" --chat -p "What is the capital of France?" -n 40 --temp 0 2>"$TMP/err") || fail "chat run failed: $(cat "$TMP/err")"
echo "chat: $out"
echo "$out" | grep -q "Paris" || fail "expected 'Paris' in the chat answer"
grep -q "TTFT" "$TMP/err" && grep -q "decode" "$TMP/err" && grep -q "KV blocks" "$TMP/err" || fail "stats missing: $(cat "$TMP/err")"
# -p, -f and stdin give the same greedy text; the stream equals the JSON text.
a=$("$L" generate -m "$MODEL" -p "The history of the Roman Empire" -n 24 --temp 0 --no-stats) || fail "-p"
printf 'The history of the Roman Empire' >"$TMP/p.txt"
b=$("$L" generate -m "$MODEL" -f "$TMP/p.txt" -n 24 --temp 0 --no-stats) || fail "-f"
c=$(printf 'The history of the Roman Empire' | "$L" generate -m "$MODEL" -n 24 --temp 0 --no-stats) || fail "stdin"
[ "$a" = "$b" ] && [ "$a" = "$c" ] || fail "-p/-f/stdin differ: [$a] [$b] [$c]"
"$L" generate -m "$MODEL" -p "The history of the Roman Empire" -n 24 --temp 0 --json --no-stats >"$TMP/j.json" || fail "--json"
python3 - "$TMP/j.json" "$a" <<'PY' || fail "json check"
import json, sys
objs = [json.loads(l) for l in open(sys.argv[1])]
assert len(objs) == 1, objs
o = objs[0]
for k in ("index", "text", "finish_reason", "prompt_tokens", "generated_tokens", "ttft_ms", "latency_ms", "prompt_ids", "tokens"):
    assert k in o, k
assert o["generated_tokens"] == len(o["tokens"]) == 24, o
assert o["finish_reason"] == "length", o
assert o["text"] == sys.argv[2], (o["text"], sys.argv[2])
assert o["prompt_tokens"] == len(o["prompt_ids"])
print("json ok:", o["prompt_tokens"], "prompt tokens,", o["generated_tokens"], "generated")
PY
# --verbose-prompt lists each prompt token; -n 0 runs the prompt only.
"$L" generate -m "$MODEL" -p "Hello world" -n 0 --verbose-prompt >"$TMP/o0" 2>"$TMP/e0" || fail "-n 0"
grep -q "number of tokens in prompt = " "$TMP/e0" || fail "--verbose-prompt: $(cat "$TMP/e0")"
grep -qE "^ +[0-9]+ -> ' world'" "$TMP/e0" || fail "--verbose-prompt pieces: $(cat "$TMP/e0")"
grep -q "generated 0 tokens" "$TMP/e0" || fail "-n 0 generated tokens: $(cat "$TMP/e0")"
# A stop string ends the output before it.
s=$("$L" generate -m "$MODEL" -p "Count: 1, 2, 3, 4, 5," -n 40 --temp 0 --no-stats --stop " 9" --json) || fail "--stop"
python3 -c '
import json,sys
o=json.loads(sys.argv[1]); t=o["text"]
assert o["finish_reason"]=="stop", o
assert " 9" not in t and t.rstrip().endswith("8,"), t
print("stop ok:", repr(t))' "$s" || fail "stop string"
# Logprobs: top-N sorted, chosen token's logprob <= top-1 (greedy: equal).
"$L" generate -m "$MODEL" -p "Once upon a time" -n 8 --temp 0 --json --logprobs 3 --no-stats >"$TMP/lp.json" || fail "logprobs run"
python3 - "$TMP/lp.json" <<'PY' || fail "logprobs check"
import json, sys
o = json.loads(open(sys.argv[1]).read())
lp = o["logprobs"]
assert len(lp) == 8
for i, e in enumerate(lp):
    assert e["id"] == o["tokens"][i]
    tops = [t["logprob"] for t in e["top"]]
    assert len(tops) == 3 and tops == sorted(tops, reverse=True)
    assert abs(e["logprob"] - tops[0]) < 1e-5 and e["top"][0]["id"] == e["id"], e
    assert all(t <= 0 for t in tops)
print("logprobs ok")
PY
echo "generate basics ok"
