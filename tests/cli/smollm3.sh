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
ref_prompts smollm3-nope
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

check='assert c["model_type"] == "smollm3" and c["architectures"] == ["SmolLM3ForCausalLM"], c
assert c["no_rope_layers"] == [1, 1, 1, 0], c["no_rope_layers"]'
for src in "$H.f32.gguf" "$H"; do
  quantized_runs "$src" SmolLM3 "$check" "$REF" >"$TMP/qr"   # not in $(...): its fail must end the test
  echo "quantized $(basename "$src"): SmolLM3 config, runs: $(cat "$TMP/qr")"
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
