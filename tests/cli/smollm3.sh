#!/usr/bin/env bash
# SmolLM3 end to end (the logits against transformers are tests/test_hf_models.c's):
#   - config.json and llama.cpp's converter's GGUF give transformers' prompt logprobs (the
#     last of the 4 layers without RoPE); without no_rope_layers the default interval (4)
#     gives the same; with RoPE on every layer (no_rope_layers all 1) they differ;
#   - bad no_rope_layers are refused with one line naming config.json;
#   - llmi quantize writes a SmolLM3 checkpoint from the GGUF (model_type smollm3 and its
#     no_rope_layers) and from the directory, and llmi runs each; --chat refuses SmolLM3's
#     template (its generated system turn) rather than render it as plain ChatML.
. "$(dirname "$0")/../lib/common.sh"
H="$TESTDATA/hf/smollm3-nope"
REF="$TESTDATA/hf/ref/smollm3-nope.json"
python3 -c 'import json,sys
for s in json.load(open(sys.argv[1]))["seqs"]: print(json.dumps({"prompt_token_ids": s["ids"]}))' "$REF" >"$TMP/ids.jsonl"
plp=(generate --device cpu --prompts "$TMP/ids.jsonl" -n 0 --prompt-logprobs 3 --json --no-stats)
edited() { config_edited "$H" "$@"; }   # edited NAME PYTHON: a copy of $H, its config.json c through PYTHON
cmp_ref() {  # cmp_ref OUT: prompt logprobs within 1e-4 of transformers'
  python3 tests/compare_prompt_logprobs_hf.py "$REF" "$1" --tol 1e-4 --slack 1e-4 >"$TMP/cmp.out"
}
interval=$(edited interval 'del c["no_rope_layers"]; del c["no_rope_layer_interval"]')
for m in "$H" "$H.f32.gguf" "$interval"; do
  "$LLMI" "${plp[@]}" -m "$m" >"$TMP/own.out" || fail "prompt logprobs of $m"
  cmp_ref "$TMP/own.out" || fail "$m differs from transformers: $(tail -3 "$TMP/cmp.out")"
  echo "$(basename "$m"): as transformers: $(tail -1 "$TMP/cmp.out")"
done
allrope=$(edited allrope 'c["no_rope_layers"] = [1, 1, 1, 1]')
"$LLMI" "${plp[@]}" -m "$allrope" >"$TMP/all.out" || fail "prompt logprobs of $allrope"
! cmp_ref "$TMP/all.out" || fail "RoPE on the NoPE layer gives transformers' logprobs too: the layer's NoPE does nothing"

gen=(generate --device cpu -p hi -n 1 --no-stats)
d=$(edited short 'c["no_rope_layers"] = [1, 1, 0]')
expect_error "no_rope_layers must list one 0 or 1 per layer (4)" "$LLMI" "${gen[@]}" -m "$d"
d=$(edited two 'c["no_rope_layers"] = [1, 2, 1, 0]')
expect_error "no_rope_layers[1] must be 0 or 1" "$LLMI" "${gen[@]}" -m "$d"
d=$(edited zero 'del c["no_rope_layers"]; c["no_rope_layer_interval"] = 0')
expect_error "no_rope_layer_interval must be an integer" "$LLMI" "${gen[@]}" -m "$d"

for src in "$H.f32.gguf" "$H"; do
  out="$TMP/q-$(basename "$src")"
  "$LLMI" quantize -m "$src" --method rtn --group-size 32 -o "$out" >/dev/null 2>"$TMP/err" ||
    fail "quantize $src: $(tail -c 600 "$TMP/err")"
  python3 - "$out/config.json" <<'PY' || fail "$src: the quantized config.json is not SmolLM3's"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["model_type"] == "smollm3" and c["architectures"] == ["SmolLM3ForCausalLM"], c
assert c["no_rope_layers"] == [1, 1, 1, 0], c["no_rope_layers"]
PY
  "$LLMI" "${plp[@]}" -m "$out" >"$TMP/q.out" 2>"$TMP/err" || fail "the quantized $src does not run: $(tail -c 600 "$TMP/err")"
  # 4-bit RTN of a random model is too coarse for limits: nearer to its own reference than
  # to another model's of the same ids by half
  python3 tests/compare_prompt_logprobs_hf.py "$REF" "$TMP/q.out" --nearer-than "$TESTDATA/hf/ref/llama-gqa-rope3.json" \
    >"$TMP/cmp.out" || fail "the quantized $src is not nearer to transformers' logits: $(tail -3 "$TMP/cmp.out")"
  echo "quantized $(basename "$src"): SmolLM3 config, runs: $(tail -1 "$TMP/cmp.out")"
done

d=$(edited chat 'pass')
python3 - "$d/tokenizer_config.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t["chat_template"] = ('{{- "<|im_start|>system\\n" -}}{{- "## Metadata\\n\\n" -}}'
                      '{{- "Reasoning Mode: " + reasoning_mode + "\\n\\n" -}}{%- for message in messages -%}'
                      '{{ "<|im_start|>" + message.role + "\\n" + message.content + "<|im_end|>\\n" }}{%- endfor -%}')
json.dump(t, open(sys.argv[1], "w"))
PY
expect_error "chat template is not one of chatml" "$LLMI" generate --device cpu -m "$d" --chat -p hi -n 1 --no-stats
echo ok
