#!/usr/bin/env bash
# Offline throughput on SmolLM2: 200 requests of mixed lengths all at t=0, continuous
# batching; every percentile is reported and the generated tokens add up to what the
# requests asked for (random prompts ignore EOS, as vllm bench throughput does).
. "$(dirname "$0")/../lib/common.sh"
need_model
"$LLMI" bench --device cpu -m "$MODEL" --num-requests 200 --input-len 12 --output-len 4 --range-ratio 0.5 --max-seqs 200 \
  --per-request "$TMP/req.jsonl" -o json >"$TMP/t.json" 2>"$TMP/err" || fail "bench failed: $(cat "$TMP/err")"
python3 - "$TMP" <<'PY' || exit 1
import json, math, sys
d = sys.argv[1]
row = json.load(open(f"{d}/t.json"))[0]
reqs = [json.loads(l) for l in open(f"{d}/req.jsonl")]
assert len(reqs) == 200 == row["num_requests"]
lens = {r["n_prompt"] for r in reqs}; outs = {r["max_tokens"] for r in reqs}
assert len(lens) > 5 and len(outs) >= 2, "lengths are not mixed"
gen = sum(r["n_generated"] for r in reqs)
assert gen == row["output_tokens"] == row["requested_output_tokens"] == sum(r["max_tokens"] for r in reqs), \
    (gen, row["output_tokens"], row["requested_output_tokens"])
assert row["finished_length"] == 200 and row["finished_other"] == 0
for k in ["requests_per_s", "output_tps", "total_tps", "peak_rss_mib", "kv_util_max"]:
    assert row[k] > 0, k
for key in ["ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"]:
    vals = [row[f"{key}_{s}"] for s in ("mean", "p50", "p90", "p99")]
    assert all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in vals), (key, vals)
    assert vals[1] <= vals[2] <= vals[3], (key, vals)
assert abs(row["total_tps"] - (row["prompt_tokens"] + gen) / row["elapsed_s"]) < 1e-6 * row["total_tps"]
assert abs(row["requests_per_s"] - 200 / row["elapsed_s"]) < 1e-6 * row["requests_per_s"]
print("throughput ok:", row["requests_per_s"], "req/s", row["output_tps"], "out tok/s, preemptions", row["preemptions"])
PY
# The untimed warm-up (docs/BENCH.md): it ran above (warmup_s > 0), draws its prompts from a
# stream of its own, so --warmup 0 serves the very same requests, and it adds nothing to the
# counts; --warmup 0 reports 0 seconds of it.
"$LLMI" bench --device cpu -m "$MODEL" --num-requests 200 --input-len 12 --output-len 4 --range-ratio 0.5 --max-seqs 200 \
  --warmup 0 --per-request "$TMP/req0.jsonl" -o json >"$TMP/t0.json" 2>"$TMP/err" || fail "bench --warmup 0 failed: $(cat "$TMP/err")"
python3 - "$TMP" <<'PY' || exit 1
import json, sys
d = sys.argv[1]
warm, cold = json.load(open(f"{d}/t.json"))[0], json.load(open(f"{d}/t0.json"))[0]
assert warm["warmup_s"] > 0 and cold["warmup_s"] == 0, (warm["warmup_s"], cold["warmup_s"])
shape = lambda f: [(r["index"], r["n_prompt"], r["max_tokens"], r["n_generated"]) for r in map(json.loads, open(f))]
assert shape(f"{d}/req.jsonl") == shape(f"{d}/req0.jsonl"), "the warm-up changed the timed requests"
for k in ("num_requests", "prompt_tokens", "output_tokens", "cached_prompt_tokens"):
    assert warm[k] == cold[k], (k, warm[k], cold[k])
print(f"warm-up {warm['warmup_s']:.3f} s untimed; the same 200 requests with and without it")
PY
