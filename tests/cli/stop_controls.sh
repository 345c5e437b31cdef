#!/usr/bin/env bash
# vLLM's stop_token_ids and min_tokens (generate --stop-token-id, --min-tokens, and the
# --prompts fields), end to end on SmolLM2, each against the free greedy run:
#   - --stop-token-id X ends the output at X's first occurrence, X included, finish stop;
#   - --min-tokens M on an answer the model ends with EOS after L < M tokens: the same first
#     L - 1 tokens, no end-of-generation among the first M, at least M tokens;
#   - with both, X is not generated among the first M tokens;
#   - a stop string completed within the first M tokens does not count: the text is cut at
#     its first occurrence that ends past them (pieces from --logprobs);
#   - a --prompts line's "min_tokens" and "stop_token_ids" over the flags; bad values: one
#     line naming the flag or the line, exit 2, under ASan/UBSan.
. "$(dirname "$0")/../lib/common.sh"
need_model
L="$LLMI_SAN"
P="Answer with one word: is the sky blue?"
gen=(generate --device cpu -m "$MODEL" --json --no-stats --chat --temp 0 -n 40)
"$LLMI" "${gen[@]}" -p "$P" >"$TMP/free.json" || fail "free run"
read -r n_free x first_eos < <(python3 - "$TMP/free.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = r["tokens"]
assert r["finish_reason"] == "eos" and len(t) < 30, (r["finish_reason"], t)
# a stop id: the third token, when it does not occur before
x = t[2]
assert x not in t[:2], t
print(len(t), x, t[-1])
PY
) || fail "free run: not the short answer this test needs"
echo "free run: $n_free tokens ending in EOS $first_eos; stop id $x"
M=$((n_free + 4))
"$LLMI" "${gen[@]}" -p "$P" --stop-token-id "$x" >"$TMP/stop.json" || fail "--stop-token-id run"
"$LLMI_SAN" "${gen[@]}" -p "$P" --min-tokens "$M" >"$TMP/min.json" || fail "--min-tokens run (san)"
"$LLMI" "${gen[@]}" -p "$P" --min-tokens 6 --stop-token-id "$x" >"$TMP/both.json" || fail "both run"
"$LLMI" "${gen[@]}" -p "$P" --min-tokens "$M" --logprobs 1 >"$TMP/minfull.json" || fail "pieces run"
"$LLMI" "${gen[@]}" -p "$P" --min-tokens "$M" --stop sky >"$TMP/minstop.json" || fail "stop string run"
"$LLMI" "${gen[@]}" -p "$P" --stop sky >"$TMP/stopstr.json" || fail "plain stop string run"
python3 - "$TMP" "$x" "$M" <<'PY' || fail "stop controls"
import json, sys
d, x, M = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
load = lambda n: json.load(open(f"{d}/{n}.json"))
free, stop, mn, both = load("free"), load("stop"), load("min"), load("both")
F = free["tokens"]
assert stop["tokens"] == F[:3] and stop["finish_reason"] == "stop", (stop["tokens"], stop["finish_reason"])
eos = F[-1]
t = mn["tokens"]
assert len(t) >= M and t[:len(F) - 1] == F[:-1] and eos not in t[:M], (M, t, F)
print(f"--min-tokens {M}: {len(t)} tokens ({mn['finish_reason']}), the free run's {len(F) - 1} first, no EOS among {M}")
b = both["tokens"]
assert x not in b[:6] and b[:2] == F[:2], (x, b)
assert (b[-1] == x and both["finish_reason"] == "stop") or x not in b, (x, b, both["finish_reason"])
print(f"--min-tokens 6 --stop-token-id {x}: {len(b)} tokens, {both['finish_reason']}")
# stop strings: "sky" is in the first tokens ("The sky ..."); with min_tokens the cut is at
# the first "sky" that ends past the first M tokens' text
full = load("minfull")
pieces = [p["piece"] for p in full["logprobs"]][:-1 if full["finish_reason"] == "eos" else None]
text = "".join(pieces)
assert text == full["text"], (text, full["text"])
head = len("".join(pieces[:M]))
i = text.find("sky")
assert i >= 0 and i + 3 <= head, "this test needs 'sky' inside the first tokens"
j = text.find("sky", max(0, head - 2))
want = text[:j] if j >= 0 else text
got = load("minstop")
assert got["text"] == want, (got["text"], want)
assert load("stopstr")["text"] == text[:i], load("stopstr")["text"]
print(f"--stop sky: cut at byte {i} alone, at {j} with --min-tokens {M}")
PY

# --prompts: a line's fields over the flags
printf '{"prompt": "%s", "stop_token_ids": [%s]}\n{"prompt": "%s", "min_tokens": %d, "stop_token_ids": []}\n{"prompt": "%s"}\n' \
  "$P" "$x" "$P" "$M" "$P" >"$TMP/p.jsonl"
y=$(python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["tokens"]; assert t[4] not in t[:4]; print(t[4])' "$TMP/free.json") ||
  fail "the free run's fifth token occurs earlier"
"$LLMI" generate --device cpu -m "$MODEL" --json --no-stats --chat --temp 0 -n 40 --prompts "$TMP/p.jsonl" \
  --stop-token-id "$y" --min-tokens 1 >"$TMP/p.out" || fail "--prompts run"
python3 - "$TMP" "$M" <<'PY' || fail "--prompts fields"
import json, sys
d, M = sys.argv[1], int(sys.argv[2])
rs = [json.loads(l) for l in open(f"{d}/p.out")]
stop, mn = json.load(open(f"{d}/stop.json")), json.load(open(f"{d}/min.json"))
assert rs[0]["tokens"] == stop["tokens"] and rs[0]["finish_reason"] == "stop", rs[0]["tokens"]
assert rs[1]["tokens"] == mn["tokens"], (rs[1]["tokens"], mn["tokens"])
free = json.load(open(f"{d}/free.json"))["tokens"]
assert rs[2]["tokens"] == free[:5] and rs[2]["finish_reason"] == "stop", (rs[2]["tokens"], rs[2]["finish_reason"])
print("--prompts: stop_token_ids and min_tokens per line over the flags'; a plain line takes the flags'")
PY

expect_error "--min-tokens" "$L" generate --device cpu -m "$MODEL" -p hi --min-tokens -1
expect_error "--stop-token-id" "$L" generate --device cpu -m "$MODEL" -p hi --stop-token-id abc
expect_error "outside the vocabulary" "$L" generate --device cpu -m "$MODEL" -p hi -n 1 --stop-token-id 49152
ids=(); for i in $(seq 1 33); do ids+=(--stop-token-id "$i"); done
expect_error "--stop-token-id" "$L" generate --device cpu -m "$MODEL" -p hi "${ids[@]}"
printf '{"prompt": "x", "stop_token_ids": 5}\n' >"$TMP/b1.jsonl"
expect_error "b1.jsonl:1: \"stop_token_ids\"" "$L" generate --device cpu -m "$MODEL" --prompts "$TMP/b1.jsonl"
printf '{"prompt": "x", "stop_token_ids": [1.5]}\n' >"$TMP/b2.jsonl"
expect_error "b2.jsonl:1: \"stop_token_ids\"" "$L" generate --device cpu -m "$MODEL" --prompts "$TMP/b2.jsonl"
printf '{"prompt": "x", "min_tokens": -2}\n' >"$TMP/b3.jsonl"
expect_error "b3.jsonl:1: \"min_tokens\"" "$L" generate --device cpu -m "$MODEL" --prompts "$TMP/b3.jsonl"
echo "stop controls: ok"
