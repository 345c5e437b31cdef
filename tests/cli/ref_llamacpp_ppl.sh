#!/usr/bin/env bash
# llmi's perplexity on wikitext-2 test (first N 512-token windows, llama.cpp's scoring rule)
# against llama-perplexity's on the same model: within 1% (testdata/llamacpp/ppl.json, made
# by the command in docs/REFERENCES.md).
. "$(dirname "$0")/../lib/common.sh"
need_model
REF="$TESTDATA/llamacpp/ppl.json"
DATA="$SHARED/data/wikitext-2-raw/wiki.test.raw"
[ -f "$DATA" ] || { echo "wikitext-2 missing ($DATA)"; exit 77; }
read -r CTX CHUNKS < <(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["ctx"], r["chunks"])' "$REF") \
  || fail "cannot read $REF"
"$LLMI" bench --ppl "$DATA" -m "$MODEL" -c "$CTX" --chunks "$CHUNKS" -t 2 -o json >"$TMP/p.json" 2>"$TMP/err" \
  || fail "llmi bench --ppl failed: $(tail -c 2000 "$TMP/err")"
python3 - "$REF" "$TMP/p.json" "$TMP/err" <<'PY' || fail "perplexity differs from llama.cpp"
import json, re, sys
ref = json.load(open(sys.argv[1]))
got = json.load(open(sys.argv[2]))
got = got[0] if isinstance(got, list) else got
ppl, want = float(got["ppl"]), float(ref["ppl"])
rel = abs(ppl - want) / want
print(f"llmi ppl {ppl:.4f} +/- {float(got['ppl_stderr']):.4f}, llama.cpp {want:.4f} +/- {ref['ppl_stderr']:.4f} "
      f"({ref['chunks']} chunks of {ref['ctx']}): relative difference {rel:.4%}")
# Per-chunk running values, when llmi prints llama.cpp's "[i]ppl," line, show where a
# difference starts.
run = [float(x) for x in re.findall(r"\[\d+\]([0-9.]+),", open(sys.argv[3]).read())]
for i, (a, b) in enumerate(zip(run, ref["running_ppl"]), 1):
    print(f"  chunk {i}: llmi {a:.4f} llama.cpp {b:.4f} ({abs(a - b) / b:.3%})")
if rel >= 0.01:
    sys.exit(f"relative difference {rel:.4%} >= 1%")
PY
