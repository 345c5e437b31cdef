#!/usr/bin/env bash
# Offline throughput with seeded Poisson arrivals on a tiny synthetic model: arrivals have
# the asked-for mean rate, every request is served, and the reported percentiles are the
# percentiles of the per-request records (numpy's linear rule, recomputed here).
. "$(dirname "$0")/../lib/common.sh"
CFG="$TESTDATA/bench/tiny-llama.json"
"$LLMI_SAN" bench --device cpu --dummy "$CFG" --dummy-dtype f32 --num-requests 120 --input-len 12 --output-len 6 --range-ratio 0.5 \
  --request-rate 400 --seed 7 --per-request "$TMP/req.jsonl" -o json >"$TMP/t.json" 2>"$TMP/err" \
  || fail "bench failed: $(cat "$TMP/err")"
python3 - "$TMP" <<'PY' || exit 1
import json, sys
d = sys.argv[1]
row = json.load(open(f"{d}/t.json"))[0]
reqs = [json.loads(l) for l in open(f"{d}/req.jsonl")]
assert len(reqs) == 120 == row["num_requests"]
arr = sorted(r["arrival_s"] for r in reqs)
rate = (len(arr) - 1) / (arr[-1] - arr[0])
assert 400 * 0.7 < rate < 400 * 1.3, f"arrival rate {rate}"
assert row["request_rate"] == 400
assert all(6 <= r["n_prompt"] <= 18 and 3 <= r["max_tokens"] <= 9 for r in reqs)
assert row["output_tokens"] == sum(r["n_generated"] for r in reqs) == row["requested_output_tokens"] \
    == sum(r["max_tokens"] for r in reqs)
assert row["finished_length"] == 120
assert row["elapsed_s"] >= arr[-1]
assert all(r["submitted_s"] >= r["arrival_s"] - 1e-9 for r in reqs)
assert all(r["ttft_ms"] >= (r["submitted_s"] - r["arrival_s"]) * 1e3 - 1e-3 for r in reqs)
def pct(xs, q):
    xs = sorted(xs); k = q / 100 * (len(xs) - 1); lo = int(k)
    return xs[lo] if lo + 1 >= len(xs) else xs[lo] + (xs[lo + 1] - xs[lo]) * (k - lo)
for key, vals in [("ttft_ms", [r["ttft_ms"] for r in reqs]), ("e2e_ms", [r["latency_ms"] for r in reqs]),
                  ("tpot_ms", [r["tpot_ms"] for r in reqs if r["n_generated"] > 1])]:
    for q in (50, 90, 99):
        want, got = pct(vals, q), row[f"{key}_p{q}"]
        assert abs(want - got) <= 1e-3 + 1e-6 * abs(want), (key, q, want, got)
    assert row[f"{key}_p50"] <= row[f"{key}_p90"] <= row[f"{key}_p99"]
assert row["itl_ms_p50"] <= row["itl_ms_p99"] and row["itl_ms_mean"] > 0
assert 0 < row["kv_util_max"] <= 1 and isinstance(row["kv_util_series"], list) and row["kv_util_series"]
print("poisson ok: rate", round(rate, 1))
PY
