#!/usr/bin/env bash
# Speculative decoding (prompt lookup) is exact under greedy decoding: the 24 prompts of the
# greedy test set (testdata/llamacpp/prompts.jsonl) plus 8 input-quoting prompts drawn from
# wikitext-2 with the run's seed, 32 in one batch, give the same tokens and the same logprobs
# with --spec ngram as with --spec off: together; with chunked prefill, forced preemption,
# prefill-first scheduling and other k / n-gram sizes; and one quoting prompt alone (the one
# with the most accepted proposals in the batch).
# Proposals must actually be accepted (and some rejected), or the check proves nothing.
# Bad --spec values fail with one line before any work.
. "$(dirname "$0")/../lib/common.sh"
need_model
echo "seed $SEED"
KEEP=("$TMP/prompts.jsonl")
python3 "$(dirname "$0")/../lib/spec_prompts.py" "$SHARED/data/wikitext-2-raw/wiki.test.raw" \
  "$TESTDATA/llamacpp/prompts.jsonl" "$TMP/prompts.jsonl" "$SEED" || fail "making prompts"
run() { "$LLMI" generate --device cpu -m "$MODEL" -n 24 --temp 0 --ignore-eos --json --logprobs 2 --no-stats "$@"; }
run --prompts "$TMP/prompts.jsonl" >"$TMP/off.json" || fail "--spec off"
run --prompts "$TMP/prompts.jsonl" --spec ngram >"$TMP/together.json" || fail "together"
run --prompts "$TMP/prompts.jsonl" --spec ngram --spec-k 8 --spec-ngram 1,3 --sched prefill-first \
  --prefill-chunk 16 --num-blocks 40 --block-size 16 >"$TMP/tight.json" || fail "chunked prefill, tight KV"
# alone: the quoting prompt (the last 8) whose proposals the batch run accepted most, so the
# check has accepted proposals to compare (a random quote may repeat nothing in 24 tokens);
# a sequence's proposals depend only on its own tokens, so alone it proposes the same
ONE=$(python3 -c '
import json, sys
got = [json.loads(l) for l in open(sys.argv[1])]
print(max(range(24, 32), key=lambda i: (got[i]["spec_accepted"], i)))' "$TMP/together.json") || fail "picking the alone prompt"
sed -n "$((ONE + 1))p" "$TMP/prompts.jsonl" >"$TMP/one.jsonl"
echo "$ONE" >"$TMP/one.idx"
run --prompts "$TMP/one.jsonl" --spec ngram >"$TMP/alone.json" || fail "alone"
python3 - "$TMP" <<'PY' || fail "speculation changed greedy output"
import json, math, sys
d = sys.argv[1]
load = lambda n: [json.loads(l) for l in open(f"{d}/{n}.json")]
off = load("off")
assert len(off) == 32 and all(len(o["tokens"]) == 24 for o in off)
def same(name, got, ref, some_rejected=True):
    assert [o["tokens"] for o in got] == [o["tokens"] for o in ref], f"{name}: tokens differ from --spec off: " + str(
        [(i, a["tokens"], b["tokens"]) for i, (a, b) in enumerate(zip(ref, got)) if a["tokens"] != b["tokens"]][:1])
    for a, b in zip(ref, got):
        for x, y in zip(a["logprobs"], b["logprobs"]):
            assert abs(x["logprob"] - y["logprob"]) < 1e-4, f"{name}: logprob {x['logprob']} vs {y['logprob']}"
    prop = sum(o["spec_proposed"] for o in got)
    acc = sum(o["spec_accepted"] for o in got)
    assert 0 < acc and (acc < prop or not some_rejected), f"{name}: {acc} of {prop} proposals accepted: the check proves nothing"
    return prop, acc
for name in ("together", "tight"):
    prop, acc = same(name, load(name), off)
    print(f"{name}: 32 prompts identical to --spec off, {acc}/{prop} proposals accepted")
pre = sum(o["preempted"] for o in load("tight"))
assert pre > 0, "the 40-block run should have preempted"
one = int(open(f"{d}/one.idx").read())
prop, acc = same("alone", load("alone"), off[one:one + 1], some_rejected=False)
print(f"alone: identical, {acc}/{prop} accepted; tight run preempted {pre} times")
PY
# Bad values: one line, before any work.
M=(-m "$MODEL" -p hi --device cpu)
expect_error "--spec-k" "$LLMI" generate "${M[@]}" --spec ngram --spec-k 0
expect_error "--spec-k" "$LLMI" generate "${M[@]}" --spec ngram --spec-k 1000
expect_error "--spec" "$LLMI" generate "${M[@]}" --spec sometimes
expect_error "draft" "$LLMI" generate "${M[@]}" --spec draft
expect_error "MIN" "$LLMI" generate "${M[@]}" --spec ngram --spec-ngram 4,2
expect_error "--spec-ngram" "$LLMI" generate "${M[@]}" --spec ngram --spec-ngram 0
printf '{"prompt": "hi", "spec": "ngram", "spec_k": 0}\n' >"$TMP/bad.jsonl"
expect_error "spec_k" "$LLMI" generate -m "$MODEL" --device cpu --prompts "$TMP/bad.jsonl"
