#!/usr/bin/env bash
# -d (context already in the KV cache), --slo with a --request-rate list (attainment and
# goodput recomputed here from the --per-request records), and --plot (the SVG parses as
# XML, has labelled axes with units and one line per series, a --spec list's rows included).
. "$(dirname "$0")/../lib/common.sh"
CFG="$TESTDATA/bench/tiny-llama.json"
"$LLMI" bench --dummy "$CFG" -p 16 -n 4 -b 1,2 -d 0,32 -r 1 --warmup 0 -t 1 -o json --plot "$TMP/sweep.svg" \
  --out md:"$TMP/d.md" >"$TMP/d.json" 2>"$TMP/err" || fail "bench -d: $(cat "$TMP/err")"
"$LLMI" bench --dummy "$CFG" --num-requests 30 --input-len 16 --output-len 8 --request-rate 100,20000 \
  --slo ttft=3,tpot=0.5 --per-request "$TMP/pr.jsonl" -t 1 -o json --plot "$TMP/tp.svg" >"$TMP/s.json" 2>"$TMP/err" \
  || fail "bench --slo: $(cat "$TMP/err")"
# --spec rows are lines of their own (they were one line zig-zagging between off and ngram).
"$LLMI" bench --dummy "$CFG" -p 16 -n 4 -b 1,2 --spec off,ngram -r 1 --warmup 0 -t 1 -o json --plot "$TMP/spec.svg" \
  >/dev/null 2>"$TMP/err" || fail "bench --spec --plot: $(cat "$TMP/err")"
python3 - "$TMP" <<'PY' || exit 1
import json, sys, xml.etree.ElementTree as ET
d = sys.argv[1]
rows = json.load(open(d + "/d.json"))
assert [(r["n_batch"], r["depth"]) for r in rows] == [(1, 0), (1, 32), (2, 0), (2, 32)], rows
md = open(d + "/d.md").read()
assert "| pp16+tg4 @ d32 |" in md.replace("  ", " ").replace("  ", " ") or "pp16+tg4 @ d32" in md, md
# SLO accounting against the per-request records of each rate
slo = json.load(open(d + "/s.json"))
assert [r["request_rate"] for r in slo] == [100, 20000], slo
recs = [json.loads(l) for l in open(d + "/pr.jsonl")]
assert len(recs) == 60, len(recs)
best = None
for r in slo:
    mine = [q for q in recs if q["request_rate"] == r["request_rate"]]
    assert len(mine) == 30
    t_ok = [q["ttft_ms"] <= 3 for q in mine]
    p_ok = [q["n_generated"] < 2 or q["tpot_ms"] <= 0.5 for q in mine]
    both = [a and b for a, b in zip(t_ok, p_ok)]
    assert r["slo_ttft_ms"] == 3 and r["slo_tpot_ms"] == 0.5 and r["slo_e2e_ms"] is None and r["slo_e2e_met"] is None
    assert abs(r["slo_ttft_met"] - sum(t_ok) / 30) < 1e-9, (r["slo_ttft_met"], sum(t_ok))
    assert abs(r["slo_tpot_met"] - sum(p_ok) / 30) < 1e-9, (r["slo_tpot_met"], sum(p_ok))
    assert abs(r["slo_met"] - sum(both) / 30) < 1e-9, (r["slo_met"], sum(both))
    assert abs(r["goodput_rps"] - sum(both) / r["elapsed_s"]) < 1e-6 * max(1, r["goodput_rps"]), r
    if sum(both) / 30 >= 0.9: best = r["request_rate"] if best is None else max(best, r["request_rate"])
for r in slo: assert r["slo_max_rate"] == best, (r["slo_max_rate"], best)
print("slo ok:", [(r["request_rate"], r["slo_met"], round(r["goodput_rps"], 1)) for r in slo], "max rate", best)
# plots
for name, labels, n_lines in [("sweep.svg", ["(tok/s)", "concurrent sequences (-b)", "-d 0", "-d 32"], 2 * 2),
                              ("tp.svg", ["TTFT (ms)", "KV blocks in use (%)", "100 req/s", "20000 req/s"], 3 * 2),
                              ("spec.svg", ["concurrent sequences (-b)", "--spec off", "--spec ngram"], 2 * 2)]:
    root = ET.parse(f"{d}/{name}").getroot()
    assert root.tag.endswith("svg"), root.tag
    width = float(root.get("width"))
    texts = ["".join(t.itertext()) for t in root.iter() if t.tag.endswith("text")]
    for want in labels: assert any(want in t for t in texts), (name, want, texts)
    lines = [p for p in root.iter() if p.tag.endswith("path") and p.get("stroke-width") == "2"]
    assert len(lines) == n_lines, (name, len(lines))
    for t in root.iter():
        if t.tag.endswith("text") and t.get("x"): assert 0 <= float(t.get("x")) <= width, (name, t.get("x"))
print("plots ok")
PY
L="$LLMI_SAN"
expect_error "-d 20" "$L" bench --dummy "$CFG" -p 16 -n 4 -d 20
expect_error "prefix cache" "$L" bench --dummy "$CFG" -p 16 -n 4 -d 32 --no-prefix-cache
expect_error "context" "$L" bench --dummy "$CFG" -p 16 -n 4 -d 1008
expect_error "-p/-n/-b/-d" "$L" bench --dummy "$CFG" --num-requests 4 -d 32
expect_error "--slo" "$L" bench --dummy "$CFG" --num-requests 4 --slo ttft=0
expect_error "--slo" "$L" bench --dummy "$CFG" -p 16 --slo ttft=100
expect_error "--request-rate" "$L" bench --dummy "$CFG" --num-requests 4 --request-rate 1,x
expect_error ".svg" "$L" bench --dummy "$CFG" -p 16 --plot out.png
expect_error "--plot" "$L" bench --dummy "$CFG" -p 16 --plot /nonexistent/dir/p.svg
