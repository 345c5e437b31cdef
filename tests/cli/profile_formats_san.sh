#!/usr/bin/env bash
# llmi profile on a tiny synthetic model under ASan/UBSan, every output format: json has
# the three tables, jsonl tags every row with its table, csv/md carry the same op rows,
# and the trace is valid Chrome trace JSON.
. "$(dirname "$0")/../lib/common.sh"
CFG="$TESTDATA/bench/tiny-llama.json"
for f in json jsonl csv md; do
  "$LLMI_SAN" profile --device cpu --dummy "$CFG" -p 12 -n 4 -b 2 -t 1 --peak-bw 10 --peak-flops 50 --trace "$TMP/t.$f.json" \
    -o $f >"$TMP/p.$f" 2>"$TMP/err" || fail "profile -o $f failed: $(cat "$TMP/err")"
  [ ! -s "$TMP/err" ] || fail "profile -o $f wrote to stderr: $(head -c 300 "$TMP/err")"
done
python3 - "$TMP" <<'PY' || exit 1
import csv, io, json, sys
d = sys.argv[1]
doc = json.load(open(f"{d}/p.json"))
assert set(doc) == {"ops", "memory", "run"}
n_ops = len(doc["ops"])
assert n_ops == 2 * 13, n_ops          # prefill + decode, 12 classes + untimed
jl = [json.loads(l) for l in open(f"{d}/p.jsonl")]
assert [r["table"] for r in jl].count("ops") == n_ops and [r["table"] for r in jl].count("memory") == 6
assert [r["table"] for r in jl].count("run") == 1
blocks = open(f"{d}/p.csv").read().split("\n\n")
assert len(blocks) == 3, len(blocks)
ops_csv = list(csv.DictReader(io.StringIO(blocks[0])))
assert len(ops_csv) == n_ops and ops_csv[0]["phase"] == "prefill" and ops_csv[-1]["op"] == "untimed"
md = open(f"{d}/p.md").read()
import re   # md pads cells to the column's width
assert len(re.findall(r"\n\| prefill +\|", md)) == 13 and len(re.findall(r"\n\| decode +\|", md)) == 13
assert "## memory" in md and "## run" in md
for f in ["json", "jsonl", "csv", "md"]:
    tr = json.load(open(f"{d}/t.{f}.json"))
    ev = tr["traceEvents"]
    steps = [e for e in ev if e.get("cat") == "step"]
    assert len(steps) == 4, len(steps)   # one prefill step (2 x 12 tokens) + 3 decode steps
    assert all(e["ph"] in "XMC" for e in ev)
print("profile formats ok")
PY
