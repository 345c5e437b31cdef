#!/usr/bin/env bash
# --sched on a tiny synthetic model: six equal requests arrive together and the token budget
# holds one prompt per step.  fifo serves the oldest first, so request 0 finishes before
# request 5 gets its first token; prefill-first runs every prompt before any decode, so
# every request has its first token before any request finishes (README, --sched).  The
# order of events within one run is compared, not times across runs.
. "$(dirname "$0")/../lib/common.sh"
CFG="$TESTDATA/bench/tiny-llama.json"
for pol in fifo prefill-first; do
  "$LLMI" bench --device cpu --dummy "$CFG" --num-requests 6 --input-len 16 --output-len 4 --range-ratio 0 \
    --max-batch-tokens 16 --sched "$pol" --per-request "$TMP/$pol.jsonl" -o json >"$TMP/$pol.json" 2>"$TMP/err" \
    || fail "bench --sched $pol failed: $(cat "$TMP/err")"
done
python3 - "$TMP" <<'PY' || fail "--sched policies"
import json, sys
d = sys.argv[1]
def load(pol):
    reqs = sorted((json.loads(l) for l in open(f"{d}/{pol}.jsonl")), key=lambda r: r["index"])
    assert len(reqs) == 6 and all(r["n_prompt"] == 16 and r["n_generated"] == 4 for r in reqs), reqs
    assert all(r["preempted"] == 0 for r in reqs)
    return [r["ttft_ms"] for r in reqs], [r["latency_ms"] for r in reqs]
ttft, done = load("fifo")
print("fifo          first tokens", [round(x) for x in ttft], "finished", [round(x) for x in done])
assert done[0] < ttft[5], "fifo: request 0 should finish before request 5's first token"
assert ttft == sorted(ttft), "fifo: first tokens should come in arrival order"
ttft, done = load("prefill-first")
print("prefill-first first tokens", [round(x) for x in ttft], "finished", [round(x) for x in done])
assert max(ttft) < min(done), "prefill-first: every first token should come before any request finishes"
assert ttft == sorted(ttft), "prefill-first: first tokens should come in arrival order"
PY
