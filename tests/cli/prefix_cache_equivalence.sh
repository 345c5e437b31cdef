#!/usr/bin/env bash
# Prefix caching never changes an output: greedy continuations of prompts that share a
# ~500-token system prompt, served with the cache on one at a time, all together, with
# chunked prefill and under a KV budget that forces preemption, are identical to the
# cache-off run; and later requests really reuse the shared prefix (cached_tokens > 0).
. "$(dirname "$0")/../lib/common.sh"
need_model
SEED=${LLMI_TEST_SEED:-$RANDOM}
echo "seed $SEED (LLMI_TEST_SEED replays)"
python3 - "$SHARED/data/wikitext-2-raw/wiki.test.raw" "$TESTDATA/llamacpp/prompts.jsonl" "$TMP/prompts.jsonl" "$SEED" <<'PY'
import json, random, sys
rnd = random.Random(int(sys.argv[4]))
lines = [l.strip() for l in open(sys.argv[1], encoding="utf-8") if len(l.strip()) > 200 and not l.startswith(" =")]
system = ""
while len(system) < 2600:          # ~500-650 SmolLM2 tokens (4-5 characters each)
    system += rnd.choice(lines) + "\n"
qs = [json.loads(l)["prompt"] for l in open(sys.argv[2], encoding="utf-8")]
rnd.shuffle(qs)
with open(sys.argv[3], "w", encoding="utf-8") as f:
    for q in qs[:8]:
        f.write(json.dumps({"prompt": system + "\nQuestion: " + q}) + "\n")
PY
cp "$TMP/prompts.jsonl" "${LLMI_KEEP:-/tmp}/prefix_cache_prompts.$SEED.jsonl" 2>/dev/null || true
run() {
  local name=$1; shift
  "$LLMI" generate --device cpu -m "$MODEL" --prompts "$TMP/prompts.jsonl" -n 12 --temp 0 --ignore-eos --json \
    --no-stats "$@" >"$TMP/$name.json" 2>"$TMP/$name.err" || fail "$name: $(tail -c 1000 "$TMP/$name.err")"
}
# The cache-off baseline once: every configuration without the cache is already held to
# it by generate_batch_invariance.
run serial-off --max-seqs 1 --no-prefix-cache
run serial-on --max-seqs 1
run together-on
run chunked-on --prefill-chunk 64 --max-batch-tokens 160
# Room for the longest request alone and one block more: with the prefix shared, several run
# at once and then outgrow the pool while decoding.  48 tokens (3 blocks each) so that they
# always outgrow it, whatever the prompts' last blocks hold (12 did not, for some seeds); the
# first 12 are compared (greedy tokens do not depend on how many follow).
tight=$(python3 -c "import json,sys; print(max(-(-(json.loads(l)['prompt_tokens'] + 48) // 16) for l in open(sys.argv[1])) + 1)" "$TMP/serial-off.json")
run tight-on --num-blocks "$tight" --block-size 16 -n 48
python3 - "$TMP" <<'PY'
import json, sys
d = sys.argv[1]
load = lambda n: [json.loads(l) for l in open(f"{d}/{n}.json")]
base = [o["tokens"] for o in load("serial-off")]
assert len(base) == 8 and all(len(t) == 12 for t in base)
assert all(o["cached_tokens"] == 0 for o in load("serial-off")), "--no-prefix-cache reused tokens"
report = []
for name in ("serial", "together", "chunked", "tight"):
    on = load(name + "-on")
    assert all(len(o["tokens"]) == (48 if name == "tight" else 12) for o in on)
    for o in on: o["tokens"] = o["tokens"][:12]
    assert [o["tokens"] for o in on] == base, f"{name}: cache on changes outputs: " + str(
        [i for i, (a, b) in enumerate(zip(base, [o["tokens"] for o in on])) if a != b])
    cached = [o["cached_tokens"] for o in on]
    assert all(c % 16 == 0 and c < o["prompt_tokens"] for c, o in zip(cached, on)), cached
    report.append(f"{name}: cached {sum(cached)} of {sum(o['prompt_tokens'] for o in on)} prompt tokens")
    if name == "serial":
        # One at a time with room to spare, request i reuses exactly the full blocks it shares
        # with an earlier request, all but its last token.
        ids = [o["prompt_ids"] for o in on]
        def lcp(a, b):
            k = 0
            while k < min(len(a), len(b)) and a[k] == b[k]: k += 1
            return k
        want = [0] + [max(16 * (min(lcp(ids[i], ids[j]), len(ids[i]) - 1) // 16) for j in range(i)) for i in range(1, len(ids))]
        assert cached == want, f"serial: cached {cached}, want {want}"
        assert min(want[1:]) >= 400, f"the shared system prompt should be ~500 tokens: {want}"
    if name == "tight":
        pre = sum(o["preempted"] for o in on)
        assert pre > 0, "the tight run should preempt"
        report[-1] += f", {pre} preemptions"
print("identical with the cache on and off; " + "; ".join(report))
PY
