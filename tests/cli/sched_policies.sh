#!/usr/bin/env bash
# --sched on a tiny synthetic model.  Offline: six equal requests arrive together and the token budget
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
# bench's sweep and profile run their b requests prefill-first unless --sched is given, so
# that every decode step runs all b sequences: 4 prompts of 16 tokens at 16 tokens a step
# are 4 prefill-only steps, then 4 decode steps of 4 sequences each.  Under an explicit
# --sched fifo the first requests decode while the later ones prefill (a step mixes both).
for pol in default fifo; do
  flag=(); [ "$pol" = default ] || flag=(--sched "$pol")
  "$LLMI" profile --device cpu --dummy "$CFG" -p 16 -n 5 -b 4 --max-batch-tokens 16 --warmup 0 "${flag[@]}" \
    --trace "$TMP/trace-$pol.json" -o json >"$TMP/prof-$pol.json" 2>"$TMP/err" \
    || fail "profile ${flag[*]} failed: $(cat "$TMP/err")"
  "$LLMI" bench --device cpu --dummy "$CFG" -p 16 -n 5 -b 4 --max-batch-tokens 16 -r 1 "${flag[@]}" -o json \
    >"$TMP/sweep-$pol.json" 2>"$TMP/err" || fail "bench sweep ${flag[*]} failed: $(cat "$TMP/err")"
done
python3 - "$TMP" <<'PY' || fail "sweep and profile scheduling"
import json, sys
d = sys.argv[1]
def steps(pol):
    ev = json.load(open(f"{d}/trace-{pol}.json"))["traceEvents"]
    return [(e["args"]["prefill_tokens"], e["args"]["decode_tokens"], e["args"]["seqs"]) for e in ev if e.get("cat") == "step"]
s = steps("default")
print("profile, default:", s)
assert s == [(16, 0, 1)] * 4 + [(0, 4, 4)] * 4, s
assert json.load(open(f"{d}/prof-default.json"))["run"][0]["sched"] == "prefill-first"
assert json.load(open(f"{d}/sweep-default.json"))[0]["sched"] == "prefill-first"
s = steps("fifo")
print("profile, --sched fifo:", s)
assert any(p > 0 and t > 0 for p, t, _ in s), "fifo: no step mixed prefill with decode"
assert sum(t for p, t, _ in s if p == 0) < 16, "fifo: every decode token in a decode-only step"
assert json.load(open(f"{d}/prof-fifo.json"))["run"][0]["sched"] == "fifo"
assert json.load(open(f"{d}/sweep-fifo.json"))[0]["sched"] == "fifo"
PY
