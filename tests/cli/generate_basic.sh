#!/usr/bin/env bash
# The generate paths a user takes: -p, -f, stdin, --chat, --json, --verbose-prompt, -n 0,
# stop strings, and that the stream equals the one-shot text.
. "$(dirname "$0")/../lib/common.sh"
need_model
L="$LLMI"
# Chat: the instruct model knows this one, and none of its first 8 greedy choices is a
# near-tie (the closest is 0.89 nats ahead; llama.cpp answers the same).  "What is the
# capital of France?" is not such a question: its first token is a 0.05-0.09 nat tie
# between "The" and "L" that rounding decides (llama.cpp 0c1e570 answers "L'Étoile, ...").
out=$("$L" generate --device cpu -m "$MODEL" --chat -p "Tell me the capital of France." -n 40 --temp 0 2>"$TMP/err") || fail "chat run failed: $(cat "$TMP/err")"
echo "chat: $out"
echo "$out" | grep -q "Paris" || fail "expected 'Paris' in the chat answer"
grep -q "TTFT" "$TMP/err" && grep -q "decode" "$TMP/err" && grep -q "KV blocks" "$TMP/err" || fail "stats missing: $(cat "$TMP/err")"
# -p, -f and stdin give the same greedy text; the stream equals the JSON text.
a=$("$L" generate --device cpu -m "$MODEL" -p "The history of the Roman Empire" -n 24 --temp 0 --no-stats) || fail "-p"
printf 'The history of the Roman Empire' >"$TMP/p.txt"
b=$("$L" generate --device cpu -m "$MODEL" -f "$TMP/p.txt" -n 24 --temp 0 --no-stats) || fail "-f"
c=$(printf 'The history of the Roman Empire' | "$L" generate --device cpu -m "$MODEL" -n 24 --temp 0 --no-stats) || fail "stdin"
[ "$a" = "$b" ] && [ "$a" = "$c" ] || fail "-p/-f/stdin differ: [$a] [$b] [$c]"
"$L" generate --device cpu -m "$MODEL" -p "The history of the Roman Empire" -n 24 --temp 0 --json --no-stats >"$TMP/j.json" || fail "--json"
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
"$L" generate --device cpu -m "$MODEL" -p "Hello world" -n 0 --verbose-prompt >"$TMP/o0" 2>"$TMP/e0" || fail "-n 0"
grep -q "number of tokens in prompt = " "$TMP/e0" || fail "--verbose-prompt: $(cat "$TMP/e0")"
grep -qE "^ +[0-9]+ -> ' world'" "$TMP/e0" || fail "--verbose-prompt pieces: $(cat "$TMP/e0")"
grep -q "generated 0 tokens" "$TMP/e0" || fail "-n 0 generated tokens: $(cat "$TMP/e0")"
# Stop strings.  The greedy continuation of the prompt is " 6, 7, 8, 9, 10, 11, 12," with
# every space, digit and comma its own token, so " 9," spans three tokens.  The streamed
# stdout must equal the --json text exactly: a stop string that completes never shows its
# start (the stream holds back " " and " 9" until they complete or break), and one that never
# completes (" 12, 13": the output ends inside it) is flushed in full at the end.
COUNT="Count: 1, 2, 3, 4, 5,"
stop_case() { # stop_case NAME N STOP...: streamed stdout vs the --json text of the same run
  local name=$1 n=$2; shift 2
  "$L" generate --device cpu -m "$MODEL" -p "$COUNT" -n "$n" --temp 0 --no-stats "$@" >"$TMP/$name.out" \
    || fail "--stop $name (stream)"
  "$L" generate --device cpu -m "$MODEL" -p "$COUNT" -n "$n" --temp 0 --no-stats --json "$@" >"$TMP/$name.json" \
    || fail "--stop $name (json)"
}
stop_case spans 40 --stop " 9,"
stop_case never 24 --stop " 12, 13"
stop_case two 40 --stop "xyz" --stop ", 8"
python3 - "$TMP" <<'PY' || fail "stop strings"
import json, sys
d = sys.argv[1]
def case(name):
    o = json.load(open(f"{d}/{name}.json"))
    out = open(f"{d}/{name}.out", encoding="utf-8", newline="").read()
    assert out == o["text"] + "\n", f"{name}: streamed {out!r} but the JSON text is {o['text']!r}"
    return o
o = case("spans")
assert o["finish_reason"] == "stop" and o["text"] == " 6, 7, 8,", o
o = case("never")
assert o["finish_reason"] == "length" and o["text"] == " 6, 7, 8, 9, 10, 11, 12,", o
o = case("two")
assert o["finish_reason"] == "stop" and o["text"] == " 6, 7", o
print("stop strings ok: streamed == json for a stop spanning tokens, one never completing, two stops")
PY
# Logprobs: top-N sorted, chosen token's logprob <= top-1 (greedy: equal).
"$L" generate --device cpu -m "$MODEL" -p "Once upon a time" -n 8 --temp 0 --json --logprobs 3 --no-stats >"$TMP/lp.json" || fail "logprobs run"
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
# `llmi version` names the CPU kernels of this build (-march=native), which must be the best
# this CPU's flags allow
v=$("$L" version) || fail "llmi version"
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { for f in "$@"; do [[ " $flags " == *" $f "* ]] || return 1; done; }
if has avx512f avx512_vnni; then want=avx512-vnni
elif has avx512f avx2 fma f16c; then want="avx512 + avx2"
elif has avx2 fma f16c; then want=avx2
else want=portable; fi
[[ "$v" == *"cpu kernels: $want)"* ]] || fail "llmi version: '$v', want cpu kernels: $want for flags of this CPU"
echo "generate basics ok ($v)"
