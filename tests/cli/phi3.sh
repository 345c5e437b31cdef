#!/usr/bin/env bash
# Phi-3 end to end (the logits against transformers are tests/test_hf_models.c's):
#   - a phi3 GGUF's attention.sliding_window is ignored, as llama.cpp ignores it
#     (src/models/phi3.cpp: "Phi SWA is currently disabled"): the file with a window of 8
#     gives the same prompt logprobs as the converter's (window 0);
#   - longrope (Phi-3.5-mini, the 128k models): -c picks the factors as llama.cpp does, short
#     up to the original context, long past it; each then matches transformers' prompt
#     logprobs where transformers took the same factors (sequences of 7 and 33 tokens: short,
#     130: long), from config.json and from the converter's GGUF; the other factors do not;
#     the same for Phi-4-mini's partial RoPE (3/4 of each head rotated, with longrope);
#   - a partial_rotary_factor whose rotated dims are odd or fewer than 2 is refused with one line;
#   - what llmi does not implement is refused with one line, exit 2 or 1, nothing written:
#     LoRA adapters on the fused projections, quantize.
. "$(dirname "$0")/../lib/common.sh"
G="$TESTDATA/hf/phi3-fused.f32.gguf"
ref_prompts phi3-fused
win=$(gguf_edited "$G" win "
for e in g['kv']:
    if e[0] == 'phi3.attention.sliding_window': e[2] = struct.pack('<I', 8)") || fail "editing $G"
"$LLMI" "${plp[@]}" -m "$G" >"$TMP/own.out" || fail "prompt logprobs of $G"
"$LLMI" "${plp[@]}" -m "$win" >"$TMP/win.out" || fail "prompt logprobs of $win"
python3 - "$TMP/own.out" "$TMP/win.out" <<'PY' || fail "a phi3 GGUF's sliding_window 8 changed the logprobs (llama.cpp ignores it)"
import json, sys
a, b = ([json.loads(l)["prompt_logprobs"] for l in open(p)] for p in sys.argv[1:3])
assert len(a) == len(b) == 3 and a == b
PY
[ -s "$TMP/own.out" ] || fail "a phi3 GGUF's sliding_window 8 changed the logprobs (llama.cpp ignores it)"
echo "phi3 GGUF with attention.sliding_window 8 = without (130-token prompts): the window is ignored, as llama.cpp does"

gen=(generate --device cpu -p hi -n 1 --no-stats)
d=$(edited badrope 'c["rope_scaling"] = {"type": "dynamic", "factor": 2.0}')
expect_error "rope_scaling type must be longrope" "$LLMI" "${gen[@]}" -m "$d"
d=$(edited shortlist 'c["rope_scaling"] = {"type": "su", "short_factor": [1.0] * 7, "long_factor": [2.0] * 8}')
expect_error "rope_scaling.short_factor must list 8 numbers" "$LLMI" "${gen[@]}" -m "$d"
d=$(edited zero 'c["rope_scaling"] = {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 7 + [0]}')
expect_error "rope_scaling.long_factor[7] must be a number in (0, 1e6]" "$LLMI" "${gen[@]}" -m "$d"
d=$(edited partial 'c["partial_rotary_factor"] = 0.5625')
expect_error "partial_rotary_factor 0.5625 rotates 9 of head_dim 16: an even count >= 2 is needed" "$LLMI" \
  "${gen[@]}" -m "$d"
d=$(edited partial 'c["partial_rotary_factor"] = 0.1')
expect_error "partial_rotary_factor 0.1 rotates 1 of head_dim 16" "$LLMI" "${gen[@]}" -m "$d"
d=$(edited partial 'c["partial_rotary_factor"] = 1.5')
expect_error "partial_rotary_factor must be a number in (0, 1]" "$LLMI" "${gen[@]}" -m "$d"
lr=$(gguf_edited "$G" longrope "
import copy
t = copy.deepcopy(gguf_edit.find(g, 'blk.0.attn_norm.weight'))
t['name'] = 'rope_factors_long.weight'
g['tensors'].append(t)") || fail "editing $G"
expect_error "rope_factors_long.weight and rope_factors_short.weight must both be 8 F32 values" "$LLMI" "${gen[@]}" \
  -m "$lr"

# longrope: the reference's sequences split by the factors transformers took for them
for L in "$TESTDATA/hf/phi3-longrope" "$TESTDATA/hf/phi4mini-partial"; do
python3 - "$TESTDATA/hf/ref/$(basename "$L").json" "$TMP" <<'PY' || fail "splitting the longrope reference"
import json, os, sys
ref = json.load(open(sys.argv[1]))
for name, seqs in (("short", ref["seqs"][:2]), ("long", ref["seqs"][2:])):
    r = dict(ref, seqs=[dict(s, file=os.path.join(os.path.dirname(sys.argv[1]), s["file"])) for s in seqs])
    json.dump(r, open(f"{sys.argv[2]}/{name}.json", "w"))
    with open(f"{sys.argv[2]}/{name}.jsonl", "w") as f:
        for s in seqs: f.write(json.dumps({"prompt_token_ids": s["ids"]}) + "\n")
PY
lp=(generate --device cpu -n 0 --prompt-logprobs 3 --json --no-stats)
for m in "$L" "$L.f32.gguf"; do
  for c in "short 64" "long 256"; do
    set -- $c
    "$LLMI" "${lp[@]}" -m "$m" -c "$2" --prompts "$TMP/$1.jsonl" >"$TMP/$1-$2.out" || fail "longrope -c $2 on $m"
    python3 tests/compare_prompt_logprobs_hf.py "$TMP/$1.json" "$TMP/$1-$2.out" --tol 1e-3 --slack 1e-3 \
      >"$TMP/cmp.out" || fail "longrope -c $2 ($1 factors) on $m differs from transformers: $(tail -3 "$TMP/cmp.out")"
    echo "$(basename "$m") -c $2: $1 factors, as transformers: $(tail -1 "$TMP/cmp.out")"
  done
  "$LLMI" "${lp[@]}" -m "$m" -c 256 --prompts "$TMP/short.jsonl" >"$TMP/wrong.out" || fail "longrope -c 256 short prompts"
  ! python3 tests/compare_prompt_logprobs_hf.py "$TMP/short.json" "$TMP/wrong.out" --tol 1e-3 --slack 1e-3 >/dev/null ||
    fail "the long factors on the short sequences match transformers' short-factor logits: the factors do nothing"
done
done
expect_error "the model has longrope scaling (Phi-3)" "$LLMI" "${gen[@]}" -m "$L" --rope-scale 2
expect_error "adapters on Phi-3's fused qkv_proj and gate_up_proj are not supported" "$LLMI" "${gen[@]}" -m "$H" \
  --lora "$TESTDATA/lora/llama-gqa-rope3-all"
expect_error "phi3 model, whose fused qkv_proj and gate_up_proj quantize does not write yet" "$LLMI" quantize -m "$H" \
  --method rtn --group-size 32 -o "$TMP/q"
[ ! -e "$TMP/q" ] || fail "quantize of a Phi-3 model wrote $TMP/q"
echo "ok"
