#!/usr/bin/env bash
# What a person reads: the compact md table of a 2x2 sweep (model, backend, the two swept
# columns, test, tok/s ± sd) under a header of what every row shares; --columns all and
# csv/json keep every field, with the field names docs/BENCH.md lists.  --compare on two
# recorded files (testdata/bench/compare-*.jsonl): ratios and noise flags recomputed here
# by hand, --fail-below's exit code.
. "$(dirname "$0")/../lib/common.sh"
CFG="$TESTDATA/bench/tiny-llama.json"
"$LLMI" bench --dummy "$CFG" -p 16 -n 4 -b 1,2 --kv-type f32,f16 -r 2 --warmup 0 -t 1 \
  --out json:"$TMP/s.json" --out md:"$TMP/s2.md" >"$TMP/s.md" 2>"$TMP/err" || fail "bench: $(cat "$TMP/err")"
[ ! -s "$TMP/err" ] || fail "stderr not silent: $(head -c 300 "$TMP/err")"
cmp -s "$TMP/s.md" "$TMP/s2.md" || fail "--out md differs from stdout's md"
"$LLMI" bench --dummy "$CFG" -p 16 -n 4 -b 1,2 --kv-type f32,f16 -r 1 --warmup 0 -t 1 --columns all \
  --out json:"$TMP/a.json" >"$TMP/a.md" 2>"$TMP/err" || fail "bench --columns all: $(cat "$TMP/err")"
"$LLMI" bench --dummy "$CFG" --num-requests 4 --input-len 8 --output-len 4 -t 1 -o json >"$TMP/t.json" 2>"$TMP/err" \
  || fail "throughput: $(cat "$TMP/err")"
python3 - "$TMP" <<'PY' || exit 1
import json, sys
d = sys.argv[1]
rows = json.load(open(f"{d}/s.json"))
text = open(f"{d}/s.md").read()
lines = text.splitlines()
head, table = lines[:2], [l for l in lines if l.startswith("|")]
cells = lambda l: [c.strip() for c in l.strip().strip("|").split("|")]
cols = cells(table[0])
assert cols == ["model", "backend", "kv_type", "n_batch", "test", "pp t/s", "tg t/s"], cols
assert len(table) == 2 + 4, table
assert set(cells(table[1])) <= {"-" * n for n in range(3, 80)} | {"-" * n + ":" for n in range(2, 80)}
r0 = rows[0]
h = " ".join(head)
for want in ["tiny-llama.json", "cpu: " + r0["device"], "1 threads", "block 16", "prefix cache on",
             "mean ± sd of 2 runs", "commit " + r0["commit"], r0["date"][:10]]:
    assert want in h, (want, head)
assert "KV" not in h and "batch" not in h, head      # they vary: columns, not header
for r, l in zip(rows, table[2:]):
    c = dict(zip(cols, cells(l)))
    assert c["model"] == "tiny-llama.json" and c["backend"] == "cpu" and c["test"] == "pp16+tg4", c
    assert c["kv_type"] == r["kv_type"] and c["n_batch"] == str(r["n_batch"]), (c, r)
    assert c["pp t/s"] == f'{r["prefill_tps_mean"]:.2f} ± {r["prefill_tps_sd"]:.2f}', (c, r)
    assert c["tg t/s"] == f'{r["decode_tps_mean"]:.2f} ± {r["decode_tps_sd"]:.2f}', (c, r)
# every field, names as documented (docs/BENCH.md)
SWEEP = ("commit date backend device model model_format params_m weights_gib weight_dtype threads kv_type "
         "prefix_cache sched block_size n_prompt n_gen n_batch reps prefill_tps_mean prefill_tps_sd decode_tps_mean "
         "decode_tps_sd ttft_ms_mean ttft_ms_sd tpot_ms_mean tpot_ms_sd preemptions peak_rss_mib mem_weights_mib "
         "mem_backend_weights_mib mem_kv_mib mem_act_mib kv_blocks_total kv_blocks_peak").split()
TP = ("commit date backend device model model_format params_m weights_gib weight_dtype threads kv_type prefix_cache "
      "sched block_size dataset num_requests input_len output_len range_ratio prefix_len num_prefixes request_rate seed temperature warmup_s "
      "elapsed_s requests_per_s output_tps total_tps prompt_tokens output_tokens requested_output_tokens "
      "cached_prompt_tokens prefix_hit_rate finished_length finished_eos finished_other ttft_ms_mean ttft_ms_p50 "
      "ttft_ms_p90 ttft_ms_p99 tpot_ms_mean tpot_ms_p50 tpot_ms_p90 tpot_ms_p99 itl_ms_mean itl_ms_p50 itl_ms_p90 "
      "itl_ms_p99 e2e_ms_mean e2e_ms_p50 e2e_ms_p90 e2e_ms_p99 preemptions decode_batch_max kv_util_mean kv_util_max "
      "peak_rss_mib "
      "mem_weights_mib mem_backend_weights_mib mem_kv_mib mem_act_mib kv_blocks_total kv_blocks_peak "
      "kv_util_series").split()
for r in rows: assert list(r) == SWEEP, list(r)
assert list(json.load(open(f"{d}/t.json"))[0]) == TP, list(json.load(open(f"{d}/t.json"))[0])
# --columns all: one md column per field (X_mean/X_sd pairs as one "X")
full = [l for l in open(f"{d}/a.md").read().splitlines() if l.startswith("|")]
want = []
for k in list(json.load(open(f"{d}/a.json"))[0]):
    if k.endswith("_sd") and want and want[-1] == k[:-3]: continue
    want.append(k[:-5] if k.endswith("_mean") else k)
assert cells(full[0]) == want, (cells(full[0]), want)
print("compact view ok:", cols)
PY
# --compare: recorded with commit 2ccdc6f (base) and this branch with --max-batch-tokens 4 (new)
B="$TESTDATA/bench/compare-base.jsonl" N="$TESTDATA/bench/compare-new.jsonl"
"$LLMI" bench --compare "$B" "$N" -o json >"$TMP/c.json" 2>"$TMP/err" || fail "--compare: $(cat "$TMP/err")"
"$LLMI" bench --compare "$B" "$N" >"$TMP/c.md" 2>"$TMP/err" || fail "--compare md: $(cat "$TMP/err")"
python3 - "$TMP/c.json" "$B" "$N" "$TMP/c.md" <<'PY' || exit 1
import json, math, os, sys
out = json.load(open(sys.argv[1]))
base = [json.loads(l) for l in open(sys.argv[2])]
new = [json.loads(l) for l in open(sys.argv[3])]
KEYS = ["model", "kv_type", "prefix_cache", "block_size", "n_prompt", "n_gen", "n_batch", "num_requests",
        "input_len", "output_len", "request_rate", "seed"]
cfg = lambda r: tuple((k, os.path.basename(str(r.get(k)))) for k in KEYS)
METRICS = [("prefill t/s", "prefill_tps_mean", "prefill_tps_sd", 1), ("decode t/s", "decode_tps_mean", "decode_tps_sd", 1),
           ("output t/s", "output_tps", None, 1), ("req/s", "requests_per_s", None, 1),
           ("TTFT p50 ms", "ttft_ms_p50", None, -1), ("TPOT p50 ms", "tpot_ms_p50", None, -1)]
want = []
for b in base:
    n = [r for r in new if cfg(r) == cfg(b)]
    assert len(n) == 1, cfg(b)
    n = n[0]
    for name, m, s, sign in METRICS:
        if m not in b: continue
        ratio = n[m] / b[m] if sign > 0 else b[m] / n[m]
        if s: flag = "~" if abs(n[m] - b[m]) <= math.hypot(b[s], n[s]) else ("better" if ratio > 1 else "worse")
        else: flag = "no sd"
        want.append((name, ratio, flag, b[m], n[m]))
got = [(r["metric"], r["ratio"], r["flag"], r["base_mean"], r["new_mean"]) for r in out]
assert len(got) == len(want) == 8, (got, want)
for g, w in zip(got, want):
    assert g[0] == w[0] and abs(g[1] - w[1]) <= 1e-9 * w[1] and g[2] == w[2] and g[3] == w[3] and g[4] == w[4], (g, w)
assert {w[2] for w in want} == {"worse", "~", "no sd"}, "the recorded files no longer cover the flags"
md = open(sys.argv[4]).read()
assert "base: smollm2-135m" in md and "commit 2ccdc6f" in md and "ratio > 1: new is better" in md, md[:400]
assert "| pp32+tg8" in md and "0.413" in md, md
print("compare ok:", [(g[0], round(g[1], 3), g[2]) for g in got])
PY
# --fail-below: the lowest ratio is 0.413 (decode, -b 4)
"$LLMI" bench --compare "$B" "$N" --fail-below 0.5 >"$TMP/out" 2>"$TMP/err"; rc=$?
[ $rc -eq 1 ] || fail "--fail-below 0.5 exited $rc (want 1)"
[ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "0.413" "$TMP/err" && grep -q "below" "$TMP/err" || fail "stderr: $(cat "$TMP/err")"
grep -q "| pp32+tg8" "$TMP/out" || fail "--fail-below printed no table"
echo "fail-below 0.5 -> exit 1: $(cat "$TMP/err")"
"$LLMI" bench --compare "$B" "$N" --fail-below 0.41 >/dev/null 2>"$TMP/err" || fail "--fail-below 0.41 failed: $(cat "$TMP/err")"
echo "fail-below 0.41 -> exit 0"
printf '{"model":"x","n_prompt":1}\nnot json\n' >"$TMP/bad.jsonl"
expect_error "bad.jsonl:2" "$LLMI_SAN" bench --compare "$B" "$TMP/bad.jsonl"
expect_error "missing.jsonl" "$LLMI_SAN" bench --compare "$B" "$TMP/missing.jsonl"
expect_error "no configuration" "$LLMI_SAN" bench --compare "$B" "$TESTDATA/bench/chat-turns-smollm2.json"
expect_error "two files" "$LLMI_SAN" bench --compare "$B"
expect_error "--fail-below" "$LLMI_SAN" bench --dummy "$CFG" -p 8 --fail-below 0.9
expect_error "--compare" "$LLMI_SAN" bench --compare "$B" "$N" --dummy "$CFG"
expect_error "--columns" "$LLMI_SAN" bench --dummy "$CFG" --columns some
