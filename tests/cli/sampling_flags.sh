#!/usr/bin/env bash
# The sampling stages beyond top-k/top-p/min-p, end to end on SmolLM2 (the chain itself is
# checked against llama.cpp's samplers in tests/test_sampler_ref.c):
#   - -l ID-inf bans a token: greedy output never holds it, though it is the model's pick
#     without the ban; ID+100 makes it every token;
#   - --presence-penalty 100 over the whole history: no generated token repeats or occurs in
#     the prompt (the penalties count the prompt, as llama.cpp's do);
#   - a --prompts line's "logit_bias" replaces the command line's; false bans;
#   - typical, top-n-sigma and XTC change sampled output and stay reproducible by seed;
#   - mirostat 1 and 2: reproducible by seed and from a --prompts line, greedy at target 0;
#   - bad values: one line naming the flag or the line, exit 2, under ASan/UBSan.
. "$(dirname "$0")/../lib/common.sh"
need_model
L="$LLMI_SAN"
P="The quick brown fox jumps over the lazy dog. The quick brown"
gen=(generate --device cpu -m "$MODEL" --json --no-stats)
ids() { python3 -c 'import json,sys; print(" ".join(str(t) for t in json.load(sys.stdin)["tokens"]))'; }
pids() { python3 -c 'import json,sys; print(" ".join(str(t) for t in json.load(sys.stdin)["prompt_ids"]))'; }

base=$("$LLMI" "${gen[@]}" -p "$P" -n 8 --temp 0 --ignore-eos | ids) || fail "greedy run"
first=${base%% *}
echo "greedy: $base"
banned=$("$LLMI" "${gen[@]}" -p "$P" -n 8 --temp 0 --ignore-eos -l "${first}-inf" | ids) || fail "banned run"
echo "with -l ${first}-inf: $banned"
for t in $banned; do [ "$t" != "$first" ] || fail "-l ${first}-inf: token $first still generated ($banned)"; done
forced=$("$LLMI" "${gen[@]}" -p "$P" -n 6 --temp 0.8 -s "$SEED" --ignore-eos -l 1000+100 | ids) || fail "forced run"
[ "$forced" = "1000 1000 1000 1000 1000 1000" ] || fail "-l 1000+100: want token 1000 six times, got $forced"
echo "with -l 1000+100: $forced"

out=$("$LLMI" "${gen[@]}" -p "$P" -n 24 --temp 0 --ignore-eos --presence-penalty 100 --repeat-last-n -1) ||
  fail "presence run"
python3 - "$out" <<'PY' || fail "presence penalty: a repeat"
import json, sys
r = json.loads(sys.argv[1])
toks, prompt = r["tokens"], set(r["prompt_ids"])
rep = [t for i, t in enumerate(toks) if t in prompt or t in toks[:i]]
assert not rep, f"repeated or prompt tokens in the output: {rep} of {toks}"
print(f"presence 100: {len(toks)} tokens, none repeated, none from the prompt")
PY

# per-line logit_bias (object and list forms, false bans) over the command line's
printf '{"prompt": "%s", "logit_bias": {"1000": 100}}\n{"prompt": "%s", "logit_bias": [[%s, false]]}\n{"prompt": "%s"}\n' \
  "$P" "$P" "$first" "$P" >"$TMP/lb.jsonl"
"$LLMI" generate --device cpu -m "$MODEL" --json --no-stats --prompts "$TMP/lb.jsonl" -n 4 --temp 0 --ignore-eos \
  -l 2000+100 >"$TMP/lb.out" || fail "--prompts logit_bias run"
python3 - "$TMP/lb.out" "$first" <<'PY' || fail "--prompts logit_bias"
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
first = int(sys.argv[2])
assert rs[0]["tokens"] == [1000] * 4, rs[0]["tokens"]          # the line's bias replaces -l 2000+100
assert first not in rs[1]["tokens"] and 2000 not in rs[1]["tokens"], rs[1]["tokens"]
assert rs[2]["tokens"] == [2000] * 4, rs[2]["tokens"]          # no field: the command line's
print("--prompts logit_bias: replaces the command line's, false bans")
PY

# typical, top-n-sigma and XTC: sampled output changes, and a seed reproduces it
s0=$("$LLMI" "${gen[@]}" -p "$P" -n 24 --ignore-eos --top-k 0 --top-p 1 --min-p 0 --temp 1.5 -s "$SEED" | ids)
for f in "--typical 0.3" "--top-nsigma 0.5" "--xtc-probability 1 --xtc-threshold 0.05"; do
  # shellcheck disable=SC2086
  a=$("$LLMI" "${gen[@]}" -p "$P" -n 24 --ignore-eos --top-k 0 --top-p 1 --min-p 0 --temp 1.5 -s "$SEED" $f | ids) || fail "$f"
  # shellcheck disable=SC2086
  b=$("$LLMI_SAN" "${gen[@]}" -p "$P" -n 24 --ignore-eos --top-k 0 --top-p 1 --min-p 0 --temp 1.5 -s "$SEED" $f | ids) || fail "$f (san)"
  [ "$a" = "$b" ] || fail "$f: the same seed gave different outputs ($a / $b)"
  [ "$a" != "$s0" ] || fail "$f: the output did not change"
  echo "$f: reproducible, differs from plain sampling"
done

# DRY: on a prompt that repeats itself greedy decoding goes on repeating ("mat. The cat sat
# on the mat."); with DRY no generated token extends a repeat of 6+ tokens of the text so
# far (at multiplier 100 any such token loses far more than logits span); breakers per line
# in --prompts; greedy DRY output the same under ASan
C="The cat sat on the mat. The cat sat on the mat. The cat sat on the"
for name in plain dry; do
  f=(); [ $name = dry ] && f=(--dry-multiplier 100 --dry-allowed-length 5 --dry-penalty-last-n -1 --dry-sequence-breaker none)
  "$LLMI" "${gen[@]}" -p "$C" -n 24 --temp 0 --ignore-eos "${f[@]}" >"$TMP/$name.json" || fail "DRY $name run"
done
"$LLMI_SAN" "${gen[@]}" -p "$C" -n 24 --temp 0 --ignore-eos --dry-multiplier 100 --dry-allowed-length 5 \
  --dry-penalty-last-n -1 --dry-sequence-breaker none >"$TMP/dry-san.json" || fail "DRY san run"
python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))["tokens"]; b=json.load(open(sys.argv[2]))["tokens"]; sys.exit(a != b)' \
  "$TMP/dry.json" "$TMP/dry-san.json" || fail "DRY: llmi-san gave other tokens"
python3 - "$TMP/plain.json" "$TMP/dry.json" <<'PY' || fail "DRY"
import json, sys
def longest_repeat(seq, i):
    """the longest n such that seq[i-n:i+1] occurred earlier (ending before i)"""
    best = 0
    for j in range(i):                       # an earlier occurrence ending at j
        n = 0
        while n <= j and i - n - 1 >= 0 and seq[j - n] == seq[i - n] and j - n < i - n:
            n += 1
        best = max(best, n - 1 if seq[j] == seq[i] else 0)
    return best
for name, want_repeat in ((sys.argv[1], True), (sys.argv[2], False)):
    r = json.load(open(name))
    seq = r["prompt_ids"] + r["tokens"]
    n0 = len(r["prompt_ids"])
    worst = max(longest_repeat(seq, i) for i in range(n0, len(seq)))
    assert (worst >= 6) == want_repeat, (name, worst, r["text"])
    print(f"{'plain' if want_repeat else 'DRY'}: longest repeat a generated token extends: {worst} tokens")
PY
printf '{"prompt": "%s", "dry_multiplier": 100, "dry_allowed_length": 5, "dry_penalty_last_n": -1, "dry_sequence_breakers": []}\n' "$C" >"$TMP/dry.jsonl"
"$LLMI" generate --device cpu -m "$MODEL" --json --no-stats --prompts "$TMP/dry.jsonl" -n 24 --temp 0 --ignore-eos >"$TMP/dry-line.json" ||
  fail "DRY --prompts run"
python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))["tokens"]; b=json.load(open(sys.argv[2]))["tokens"]; sys.exit(a != b)' \
  "$TMP/dry.json" "$TMP/dry-line.json" || fail "DRY: a --prompts line's fields gave other tokens than the flags"
echo "DRY: --prompts fields as the flags"

# mirostat (its cut and state against llama.cpp in tests/test_sampler_ref.c): a seed
# reproduces it, also under ASan and from a --prompts line's fields; a low target surprise
# keeps it near greedy, and it differs from the default chain
for v in 1 2; do
  m1=$("$LLMI" "${gen[@]}" -p "$P" -n 24 --ignore-eos -s "$SEED" --mirostat $v | ids) || fail "--mirostat $v"
  m2=$("$LLMI_SAN" "${gen[@]}" -p "$P" -n 24 --ignore-eos -s "$SEED" --mirostat $v | ids) || fail "--mirostat $v (san)"
  [ "$m1" = "$m2" ] || fail "--mirostat $v: the same seed gave different outputs ($m1 / $m2)"
  d=$("$LLMI" "${gen[@]}" -p "$P" -n 24 --ignore-eos -s "$SEED" | ids)
  [ "$m1" != "$d" ] || fail "--mirostat $v: the same output as the default chain"
  printf '{"prompt": "%s", "mirostat": %d, "mirostat_tau": 3.5, "mirostat_eta": 0.3, "seed": %d}\n' "$P" $v "$SEED" >"$TMP/m.jsonl"
  a=$("$LLMI" generate --device cpu -m "$MODEL" --json --no-stats -n 24 --ignore-eos --prompts "$TMP/m.jsonl" | ids)
  b=$("$LLMI" "${gen[@]}" -p "$P" -n 24 --ignore-eos -s "$SEED" --mirostat $v --mirostat-ent 3.5 --mirostat-lr 0.3 | ids)
  [ "$a" = "$b" ] || fail "--mirostat $v: a --prompts line's fields gave other tokens than the flags ($a / $b)"
  echo "--mirostat $v: reproducible, as its --prompts fields, differs from the default chain"
done
g=$("$LLMI" "${gen[@]}" -p "$P" -n 24 --ignore-eos --temp 0 | ids)
low=$("$LLMI" "${gen[@]}" -p "$P" -n 24 --ignore-eos -s "$SEED" --mirostat 2 --mirostat-ent 0 --mirostat-lr 0 | ids)
[ "$g" = "$low" ] || fail "--mirostat 2 at target surprise 0 (mu 0: only the best token) is not greedy ($low / $g)"
expect_error "--mirostat" "$L" generate --device cpu -m "$MODEL" -p hi --mirostat 3
expect_error "--mirostat" "$L" generate --device cpu -m "$MODEL" -p hi -n 1 --mirostat 2 --spec ngram
expect_error "--dry-sequence-breaker" "$L" generate --device cpu -m "$MODEL" -p hi --dry-sequence-breaker ""
expect_error "--dry-base" "$L" generate --device cpu -m "$MODEL" -p hi --dry-base x
printf '{"prompt": "x", "dry_sequence_breakers": "\\n"}\n' >"$TMP/b5.jsonl"
expect_error "dry_sequence_breakers" "$L" generate --device cpu -m "$MODEL" --prompts "$TMP/b5.jsonl"
expect_error "--logit-bias" "$L" generate --device cpu -m "$MODEL" -p hi --logit-bias 12
expect_error "-l" "$L" generate --device cpu -m "$MODEL" -p hi -l 12+inf
expect_error "-l" "$L" generate --device cpu -m "$MODEL" -p hi -l 12+101
expect_error "-l" "$L" generate --device cpu -m "$MODEL" -p hi -l -3+1
expect_error "outside the vocabulary" "$L" generate --device cpu -m "$MODEL" -p hi -n 1 -l 49152+1
expect_error "--typical" "$L" generate --device cpu -m "$MODEL" -p hi --typical 1.5
expect_error "--frequency-penalty" "$L" generate --device cpu -m "$MODEL" -p hi --frequency-penalty nan
expect_error "--xtc-threshold" "$L" generate --device cpu -m "$MODEL" -p hi --xtc-threshold 2
printf '{"prompt": "x", "logit_bias": {"abc": 1}}\n' >"$TMP/b1.jsonl"
expect_error "b1.jsonl:1" "$L" generate --device cpu -m "$MODEL" --prompts "$TMP/b1.jsonl"
printf '{"prompt": "x", "logit_bias": [[5, 1, 2]]}\n' >"$TMP/b2.jsonl"
expect_error "logit_bias" "$L" generate --device cpu -m "$MODEL" --prompts "$TMP/b2.jsonl"
printf '{"prompt": "x", "logit_bias": {"5": "big"}}\n' >"$TMP/b3.jsonl"
expect_error "logit_bias" "$L" generate --device cpu -m "$MODEL" --prompts "$TMP/b3.jsonl"
printf '{"prompt": "x", "presence_penalty": 1000}\n' >"$TMP/b4.jsonl"
expect_error "presence_penalty" "$L" generate --device cpu -m "$MODEL" --prompts "$TMP/b4.jsonl"
echo "sampling flags: ok"
