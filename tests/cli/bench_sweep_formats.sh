#!/usr/bin/env bash
# llmi bench sweep on a tiny synthetic model: every combination of the lists is a row,
# every row carries the provenance and measurement fields, and json/csv/md/jsonl written
# from the same run (--out) carry the same numbers.
. "$(dirname "$0")/../lib/common.sh"
CFG="$TESTDATA/bench/tiny-llama.json"
"$LLMI" bench --device cpu --dummy "$CFG" --dummy-dtype q8_0 -p 16,48 -n 4 -b 1,3 -r 2 --kv-type f32,f16 -t 1 -o json --columns all \
  --out csv:"$TMP/b.csv" --out md:"$TMP/b.md" --out jsonl:"$TMP/b.jsonl" >"$TMP/b.json" 2>"$TMP/err" \
  || fail "bench failed: $(cat "$TMP/err")"
[ ! -s "$TMP/err" ] || fail "stderr not silent when it is not a terminal: $(head -c 500 "$TMP/err")"
python3 - "$TMP" <<'PY' || exit 1
import csv, json, math, sys
d = sys.argv[1]
rows = json.load(open(f"{d}/b.json"))
assert isinstance(rows, list) and len(rows) == 8, f"want 2 kv x 2 p x 1 n x 2 b = 8 rows, got {len(rows)}"
need = ["commit", "date", "backend", "device", "model", "weight_dtype", "kv_type", "block_size", "threads",
        "n_prompt", "n_gen", "n_batch", "reps", "prefill_tps_mean", "prefill_tps_sd", "decode_tps_mean",
        "decode_tps_sd", "ttft_ms_mean", "ttft_ms_sd", "tpot_ms_mean", "tpot_ms_sd", "peak_rss_mib", "mem_kv_mib",
        "preemptions"]
for r in rows:
    miss = [k for k in need if k not in r]
    assert not miss, f"missing fields {miss}"
    assert r["backend"] == "cpu" and r["weight_dtype"] == "Q8_0" and r["reps"] == 2 and r["n_gen"] == 4
    assert r["commit"] and r["commit"] != "unknown" and r["date"].endswith("Z") and r["threads"] == 1
    for k in ["prefill_tps_mean", "decode_tps_mean", "ttft_ms_mean", "tpot_ms_mean", "peak_rss_mib"]:
        assert isinstance(r[k], (int, float)) and r[k] > 0 and math.isfinite(r[k]), (k, r[k])
    for k in ["prefill_tps_sd", "decode_tps_sd", "ttft_ms_sd", "tpot_ms_sd"]:
        assert r[k] >= 0, (k, r[k])
combos = sorted((r["kv_type"], r["n_prompt"], r["n_batch"]) for r in rows)
assert combos == sorted((k, p, b) for k in ["f32", "f16"] for p in [16, 48] for b in [1, 3]), combos
# csv: same columns, same numbers (full precision)
with open(f"{d}/b.csv") as f:
    crow = list(csv.DictReader(f))
assert len(crow) == 8
for r, c in zip(rows, crow):
    for k, v in r.items():
        if isinstance(v, str): assert c[k] == v, (k, c[k], v)
        elif v is None: assert c[k] == "", (k, c[k])
        else: assert abs(float(c[k]) - v) <= 1e-8 * max(1, abs(v)), (k, c[k], v)
# jsonl: one object per row, identical to json
jl = [json.loads(l) for l in open(f"{d}/b.jsonl")]
assert jl == rows
# md: header + separator + 8 rows; "mean ± sd" cells equal the json numbers at 2 decimals
lines = [l for l in open(f"{d}/b.md").read().splitlines() if l.strip()]
assert len(lines) == 10, len(lines)
hdr = [h.strip() for h in lines[0].strip("|").split("|")]
for r, l in zip(rows, lines[2:]):
    cells = dict(zip(hdr, [c.strip() for c in l.strip("|").split("|")]))
    for key in ["prefill_tps", "decode_tps", "ttft_ms", "tpot_ms"]:
        m, s = cells[key].split(" ± ")
        assert m == f"{r[key + '_mean']:.2f}" and s == f"{r[key + '_sd']:.2f}", (key, cells[key])
    assert cells["n_prompt"] == str(r["n_prompt"]) and cells["kv_type"] == r["kv_type"]
print("sweep formats ok:", len(rows), "rows")
PY
# One sequence, one repetition: bench's decode rate (decode tokens / decode-step time) and
# generate's measure (tokens after the first / time after the first token, i.e. 1000 / tpot)
# cover the same interval of the same run, so they agree closely.
"$LLMI" bench --device cpu --dummy "$CFG" -p 8 -n 40 -b 1 -r 1 -t 1 -o json >"$TMP/one.json" 2>"$TMP/err" || fail "$(cat "$TMP/err")"
python3 - "$TMP/one.json" <<'PY' || exit 1
import json, sys
r = json.load(open(sys.argv[1]))[0]
ratio = r["decode_tps_mean"] * r["tpot_ms_mean"] / 1000
assert abs(ratio - 1) < 0.05, ratio
print("decode measure agrees with 1000/tpot:", round(ratio, 4))
PY
