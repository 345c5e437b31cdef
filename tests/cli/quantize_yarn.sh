#!/usr/bin/env bash
# A YaRN model quantized keeps its rope scaling: from the GGUF (config.json written from the
# loaded config: every parameter but a default attention factor, which transformers then
# computes from the factor as the source did) and from the HF directory (its config.json
# rewritten), and llmi runs each result.
. "$(dirname "$0")/../lib/common.sh"
for src in "$TESTDATA/hf/qwen2-yarn.f32.gguf" "$TESTDATA/hf/qwen2-yarn"; do
  out="$TMP/q-$(basename "$src")"
  "$LLMI" quantize -m "$src" --method rtn --group-size 32 -o "$out" >/dev/null 2>"$TMP/err" ||
    fail "quantize $src: $(tail -c 600 "$TMP/err")"
  python3 - "$out/config.json" "$src" <<'PY' || fail "$src: rope_scaling lost or changed"
import json, sys
rs = json.load(open(sys.argv[1]))["rope_scaling"]
assert rs and rs.get("rope_type", rs.get("type")) == "yarn", rs
assert rs["factor"] == 4 and rs["original_max_position_embeddings"] == 32, rs
assert rs.get("attention_factor") is None and rs.get("beta_fast", 32) == 32 and rs.get("beta_slow", 1) == 1, rs
assert rs.get("truncate", True) is True, rs
print(f"{sys.argv[2].rsplit('/', 1)[-1]}: quantized config.json rope_scaling {rs}")
PY
  "$LLMI" generate -m "$out" --device cpu -p "To be" -n 2 --temp 0 --no-stats >/dev/null 2>"$TMP/err" ||
    fail "the quantized $src does not run: $(tail -c 600 "$TMP/err")"
done
