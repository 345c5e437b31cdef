#!/usr/bin/env bash
# Granite 3.x end to end (the logits against transformers are tests/test_hf_models.c's):
#   - config.json and llama.cpp's converter's GGUF give transformers' prompt logprobs (the
#     four multipliers away from 1); without any one multiplier they differ;
#   - bad multipliers are refused with one line naming config.json, and a GGUF without
#     granite.logit_scale (which llama.cpp requires) with one line naming the file;
#   - llmi quantize writes a Granite checkpoint from the GGUF and from the directory
#     (model_type granite and its multipliers), and llmi runs each.
. "$(dirname "$0")/../lib/common.sh"
ref_prompts granite-mult
for m in "$H" "$H.f32.gguf"; do
  "$LLMI" "${plp[@]}" -m "$m" >"$TMP/own.out" || fail "prompt logprobs of $m"
  cmp_ref "$TMP/own.out" || fail "$m differs from transformers: $(tail -3 "$TMP/cmp.out")"
  echo "$(basename "$m"): as transformers: $(tail -1 "$TMP/cmp.out")"
done
for key in embedding_multiplier attention_multiplier residual_multiplier logits_scaling; do
  d=$(edited "no-$key" "del c['$key']")
  "$LLMI" "${plp[@]}" -m "$d" >"$TMP/no.out" || fail "prompt logprobs without $key"
  ! cmp_ref "$TMP/no.out" || fail "without $key the logprobs are transformers' too: llmi does not apply it"
done

gen=(generate --device cpu -p hi -n 1 --no-stats)
d=$(edited zero 'c["logits_scaling"] = 0')
expect_error "logits_scaling must be > 0" "$LLMI" "${gen[@]}" -m "$d"
d=$(edited str 'c["residual_multiplier"] = "0.22"')
expect_error "residual_multiplier must be a finite number" "$LLMI" "${gen[@]}" -m "$d"
g=$(gguf_edited "$H.f32.gguf" nologit 'gguf_edit.drop_key(g, "granite.logit_scale")')
expect_error "granite.logit_scale" "$LLMI" "${gen[@]}" -m "$g"

check='assert c["model_type"] == "granite" and c["architectures"] == ["GraniteForCausalLM"], c
want = {"embedding_multiplier": 12, "attention_multiplier": 0.125, "residual_multiplier": 0.22, "logits_scaling": 8}
assert all(c[k] == v for k, v in want.items()), {k: c.get(k) for k in want}'
for src in "$H.f32.gguf" "$H"; do
  quantized_runs "$src" Granite "$check" "$REF" >"$TMP/qr"   # not in $(...): its fail must end the test
  echo "quantized $(basename "$src"): Granite config, runs: $(cat "$TMP/qr")"
done
echo ok
