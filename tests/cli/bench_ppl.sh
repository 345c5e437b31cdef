#!/usr/bin/env bash
# llmi bench --ppl on SmolLM2: llama.cpp's rule (windows of -c tokens, second half scored),
# the scoring rule stated in the output, a running estimate on stderr, --chunks honoured,
# the ± consistent with the count, and a file too short for the window refused.
. "$(dirname "$0")/../lib/common.sh"
need_model
F="$TESTDATA/bench/ppl-sample.txt"
"$LLMI" bench --device cpu -m "$MODEL" --ppl "$F" -c 64 --chunks 3 -o json >"$TMP/p.json" 2>"$TMP/err" \
  || fail "ppl failed: $(cat "$TMP/err")"
grep -q '^\[1\][0-9.]*,\[2\][0-9.]*,\[3\][0-9.]*,$' "$TMP/err" || fail "no running estimate: $(cat "$TMP/err")"
grep -q 'Final estimate: PPL = ' "$TMP/err" || fail "no final estimate"
python3 - "$TMP" <<'PY' || exit 1
import json, math, re, sys
d = sys.argv[1]
r = json.load(open(f"{d}/p.json"))
assert isinstance(r, dict), "-o json of --ppl is one object"
for k in ["ppl", "ppl_stderr", "chunks", "ctx", "scoring"]: assert k in r, k
assert r["chunks"] == 3 and r["ctx"] == 64 and r["scored"] == 3 * (64 - 32 - 1)
assert "second half" in r["scoring"] and "BOS" in r["scoring"]
assert 1 < r["ppl"] < 1000 and 0 < r["ppl_stderr"] < r["ppl"], r
last = re.findall(r"\[3\]([0-9.]+),", open(f"{d}/err").read())[0]
assert abs(float(last) - r["ppl"]) < 1e-3, (last, r["ppl"])
print("ppl ok:", r["ppl"], "+/-", r["ppl_stderr"])
PY
head -c 300 "$F" >"$TMP/short.txt"
expect_error "at least 128" "$LLMI" bench --device cpu -m "$MODEL" --ppl "$TMP/short.txt" -c 64
expect_error "missing.txt" "$LLMI" bench --device cpu -m "$MODEL" --ppl "$TMP/missing.txt"
