#!/usr/bin/env bash
# Greedy outputs of 16+ prompts of varied lengths are identical run alone, run together,
# with --prefill-chunk 16, 64 and unlimited, and under a KV budget that forces preemption.
# The prompts are drawn from wikitext-2 with the run's seed (printed); on failure they are
# kept, so `LLMI_TEST_SEED=N bash tests/run.sh generate_batch_invariance` replays it.
. "$(dirname "$0")/../lib/common.sh"
need_model
N=18
echo "seed $SEED"
KEEP=("$TMP/prompts.txt")
python3 - "$SHARED/data/wikitext-2-raw/wiki.test.raw" "$TMP/prompts.txt" $N "$SEED" <<'PY' || fail "making prompts"
import random, sys
lines = [l.strip() for l in open(sys.argv[1], encoding="utf-8") if len(l.strip()) > 40 and not l.startswith(" =")]
rnd = random.Random(int(sys.argv[4]))
out = []
for i in range(int(sys.argv[3])):
    words = rnd.choice(lines).split()
    n = rnd.choice([3, 5, 9, 17, 30, 45, 70, 100, 140])
    out.append(" ".join(words[:n]))
open(sys.argv[2], "w", encoding="utf-8").write("\n".join(out) + "\n")
PY
run() { "$LLMI" generate --device cpu -m "$MODEL" --prompts "$TMP/prompts.txt" -n 20 --temp 0 --ignore-eos --json --no-stats "$@"; }
run >"$TMP/together.json" || fail "together"
run --prefill-chunk 16 >"$TMP/c16.json" || fail "chunk 16"
run --prefill-chunk 64 --max-batch-tokens 100 >"$TMP/c64.json" || fail "chunk 64"
run --num-blocks 40 --block-size 16 >"$TMP/tight.json" || fail "tight KV"
i=0
: >"$TMP/alone.json"
while IFS= read -r p; do
  printf '%s\n' "$p" >"$TMP/one.txt"
  "$LLMI" generate --device cpu -m "$MODEL" --prompts "$TMP/one.txt" -n 20 --temp 0 --ignore-eos --json --no-stats >>"$TMP/alone.json" || fail "alone $i"
  i=$((i + 1))
done <"$TMP/prompts.txt"
python3 - "$TMP" <<'PY' || fail "outputs depend on batching"
import json, sys
d = sys.argv[1]
load = lambda n: [json.loads(l) for l in open(f"{d}/{n}.json")]
alone = load("alone")
base = [o["tokens"] for o in alone]
assert len(base) >= 16 and all(len(t) == 20 for t in base)
for name in ("together", "c16", "c64", "tight"):
    got = load(name)
    assert [o["tokens"] for o in got] == base, f"{name}: outputs differ from running alone: " + str(
        [(i, a, b) for i, (a, b) in enumerate(zip(base, [o['tokens'] for o in got])) if a != b][:2])
pre = sum(o["preempted"] for o in load("tight"))
assert pre > 0, "the 40-block run should have preempted"
print(f"{len(base)} prompts identical alone/together/chunk16/chunk64/tight-KV ({pre} preemptions)")
PY
