#!/usr/bin/env bash
# bench --max-concurrency N (vLLM's client-side limit), on SmolLM2: from --per-request,
# never more than N requests in flight (each from its submission to its end), N at once at
# the start, latencies counted from when a slot freed (arrival_s moves to it, never before
# the scheduled arrival); decode_batch_max is N, and more without the limit; a request's
# --samples share one slot; bad values: one line, exit 2.
. "$(dirname "$0")/../lib/common.sh"
need_model
b=(bench --device cpu -m "$MODEL" --input-len 16 --output-len 8)
"$LLMI" "${b[@]}" --num-requests 12 --max-concurrency 3 --per-request "$TMP/c3.jsonl" -o json >"$TMP/c3.json" 2>"$TMP/err" ||
  fail "--max-concurrency 3: $(tail -3 "$TMP/err")"
"$LLMI" "${b[@]}" --num-requests 12 -o json >"$TMP/free.json" 2>"$TMP/err" || fail "no limit: $(tail -3 "$TMP/err")"
"$LLMI_SAN" "${b[@]}" --num-requests 6 --samples 2 --temp 1 --max-concurrency 2 --request-rate 50 \
  --per-request "$TMP/s2.jsonl" -o json >"$TMP/s2.json" 2>"$TMP/err" || fail "--samples with a limit (san): $(tail -3 "$TMP/err")"
"$LLMI" "${b[@]}" --num-requests 12 --max-concurrency 3 >"$TMP/c3.md" 2>"$TMP/err" || fail "md: $(tail -3 "$TMP/err")"
python3 - "$TMP" <<'PY' || fail "--max-concurrency"
import json, sys
d = sys.argv[1]
def flight(reqs, group=1):
    """most requests (groups of `group` consecutive sequences) in flight at any submission"""
    spans = {}
    for r in reqs:
        g = r["index"] // group
        end = r["arrival_s"] + r["latency_ms"] / 1e3
        s, e = spans.get(g, (r["submitted_s"], end))
        spans[g] = (min(s, r["submitted_s"]), max(e, end))
    return max(sum(1 for s, e in spans.values() if s <= t < e) for t, _ in spans.values())
c3 = [json.loads(l) for l in open(f"{d}/c3.jsonl")]
row = json.load(open(f"{d}/c3.json"))[0]
free = json.load(open(f"{d}/free.json"))[0]
assert flight(c3) == 3, flight(c3)
t0 = min(r["submitted_s"] for r in c3)
assert sum(1 for r in c3 if r["submitted_s"] == t0) == 3, [r["submitted_s"] for r in c3]
assert all(r["arrival_s"] <= r["submitted_s"] + 1e-9 for r in c3)
assert any(r["arrival_s"] > 0 for r in c3), "no request waited for a slot"
assert row["max_concurrency"] == 3 and row["decode_batch_max"] == 3, (row["max_concurrency"], row["decode_batch_max"])
assert "max_concurrency" not in free and free["decode_batch_max"] > 3, free["decode_batch_max"]
assert "12 req conc3 in16/out8" in open(f"{d}/c3.md").read()
s2 = [json.loads(l) for l in open(f"{d}/s2.jsonl")]
row2 = json.load(open(f"{d}/s2.json"))[0]
assert len(s2) == 12 and flight(s2, 2) <= 2 and row2["decode_batch_max"] <= 4, (flight(s2, 2), row2["decode_batch_max"])
print(f"--max-concurrency 3: at most 3 in flight, decode batch 3 (free: {free['decode_batch_max']}); "
      f"mean TTFT {row['ttft_ms_mean']:.1f} ms from the slot, {free['ttft_ms_mean']:.1f} ms without a limit")
PY
expect_error "--max-concurrency" "$LLMI_SAN" "${b[@]}" --num-requests 2 --max-concurrency 0
echo "bench --max-concurrency: ok"
