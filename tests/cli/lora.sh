#!/usr/bin/env bash
# --lora DIR / --lora-scaled DIR SCALE: PEFT LoRA adapters merged into the weights, end to
# end against PEFT itself (testdata/lora, scripts/make-lora-refs.py: PEFT 0.21.2's
# merge_and_unload of the same adapters, then a float32 forward), every prompt position's
# logprob and top 5 (tests/compare_prompt_logprobs_hf.py):
#   - one adapter on all seven projections (f32 model), two adapters at once with the
#     second scaled 0.5 and rslora on one layer's q/v, attention-only on a bf16 model with
#     q/k/v biases, MLP-only on Gemma 3 at scale -0.75, and on a GGUF Q4_K_M model (every
#     projection, or q/v only: quantized linears dequantized into bf16, against
#     transformers' own dequantization); the base model fails each comparison;
#   - the default model, SmolLM2 Q4_1, against PEFT's scores of llama.cpp's greedy
#     continuations (compare_topk.py --teacher-forced);
#   - an int4 checkpoint (llmi quantize's) with an adapter: nearer PEFT's adapted model
#     than the base by far, on the CPU and the emulated CUDA backend;
#   - through the CUDA backend on the CPU emulation (bf16 limits);
#   - under ASan/UBSan; --lora-scaled 0 is the base model exactly; quantize takes --lora;
#   - the prompt cache keeps adapted and plain K/V apart;
#   - bad adapters and models: one line naming the flag and what is wrong, exit 2.
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/lora.sh"
# case | flags | limit (f32 models: measured 2.0e-6; bf16 ones 1.4e-4, a few merged weights
# rounding the other way after fp32 sums in another order)
cases=(
  "llama-gqa-rope3-all|--lora $L/llama-gqa-rope3-all|1e-4"
  "llama-gqa-rope3-two|--lora $L/llama-gqa-rope3-all --lora-scaled $L/llama-gqa-rope3-qv-rslora 0.5|1e-4"
  "qwen2-bias-tied-attn|--lora $L/qwen2-bias-tied-attn|1e-3"
  "gemma3-swa-mlp-scaled|--lora-scaled $L/gemma3-swa-mlp -0.75|1e-3"
  # GGUF Q4_K_M: adapted linears dequantized into bf16 and merged, the others Q4_K/Q6_K with
  # int8 activations, against transformers' float32 dequantization (measured 0.068, 0.119)
  "qwen3-kq-q4km-all|--lora $L/qwen3-kq-all|0.3"
  "qwen3-kq-q4km-qv|--lora $L/qwen3-kq-qv|0.3"
)
for c in "${cases[@]}"; do
  IFS='|' read -r name flags tol <<<"$c"
  vs_peft "$name" "$flags" "$tol"
  echo "cpu $name: $(tail -1 "$TMP/cmp")"
  model=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["model"])' "$L/ref/$name.json")
  "$LLMI" generate -m "$TESTDATA/hf/$model" --prompts "$TMP/$name.jsonl" -n 0 --prompt-logprobs 5 --json --no-stats \
    --device cpu >"$TMP/base.out" 2>"$TMP/err" || fail "$name: base run"
  ! python3 "$CMP" "$L/ref/$name.json" "$TMP/base.out" --tol 0.05 --slack 0.05 >"$TMP/cmp" ||
    fail "$name: the base model passes the adapted reference"
  echo "  base model against it: $(tail -1 "$TMP/cmp" | cut -c1-90)"
done
if [ -x "$LLMI_EMU" ]; then
  for name in llama-gqa-rope3-two qwen2-bias-tied-attn qwen3-kq-q4km-qv; do
    for c in "${cases[@]}"; do [ "${c%%|*}" = "$name" ] && IFS='|' read -r _ flags _ <<<"$c"; done
    model=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["model"])' "$L/ref/$name.json")
    # shellcheck disable=SC2086
    emu_run "emu-$name" generate --device cuda -m "$TESTDATA/hf/$model" --prompts "$TMP/$name.jsonl" -n 0 \
      --prompt-logprobs 5 --json --no-stats $flags
    python3 "$CMP" "$L/ref/$name.json" "$TMP/emu-$name.out" --tol 0.1 --slack 0.1 >"$TMP/cmp" ||
      { tail -5 "$TMP/cmp"; fail "$name: emulated cuda --lora vs PEFT"; }
    echo "emulated cuda $name: $(tail -1 "$TMP/cmp")"
  done
else
  echo "(no $LLMI_EMU: the emulated CUDA part is skipped; make emu)"
fi

# the default model, SmolLM2 Q4_1 (q/v of five layers adapted, dequantized into bf16):
# PEFT on transformers' float32 dequantization scored llama.cpp's 24 greedy continuations
# (testdata/lora/ref/smollm2-qv.jsonl); compare_topk.py's teacher-forced rules, with the
# top-5 limit at 1.5 for this exact-vs-int8-activations pair (measured 2026-11-29: chosen
# token 0.43, top-5 entries 0.84, a boundary 1.13, top-1 the same at 1501 of 1536; the base
# model fails the same reference by every rule)
if [ -f "$MODEL" ]; then
  python3 -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l); print(json.dumps({"prompt_token_ids": r["prompt_ids"] + r["tokens"]}))' \
    "$L/ref/smollm2-qv.jsonl" >"$TMP/smol.jsonl"
  smol=(generate --device cpu -m "$MODEL" --prompts "$TMP/smol.jsonl" -n 0 --prompt-logprobs 5 --json --no-stats -t 2)
  "$LLMI" "${smol[@]}" --lora "$L/smollm2-qv" >"$TMP/smol.out" 2>"$TMP/err" || fail "SmolLM2 --lora: $(head -c 500 "$TMP/err")"
  python3 "$(dirname "$0")/../compare_topk.py" --teacher-forced "$L/ref/smollm2-qv.jsonl" "$TMP/smol.out" \
    --max-top-diff 1.5 --min-top1 1400 >"$TMP/cmp" || { grep -E "^FAIL|^summary" "$TMP/cmp" | head; fail "SmolLM2 --lora vs PEFT"; }
  echo "SmolLM2 --lora vs PEFT: $(grep -E '^summary|^most likely' "$TMP/cmp" | tr '\n' ' ')"
  "$LLMI" "${smol[@]}" >"$TMP/smol0.out" || fail "SmolLM2 base run"
  ! python3 "$(dirname "$0")/../compare_topk.py" --teacher-forced "$L/ref/smollm2-qv.jsonl" "$TMP/smol0.out" \
    --max-top-diff 1.5 --min-top1 1400 >"$TMP/cmp" || fail "SmolLM2 without the adapter passes the adapted reference"
  echo "  SmolLM2 without it: $(grep '^most likely' "$TMP/cmp")"
else
  echo "(default model missing: the SmolLM2 part is skipped; run scripts/fetch-model.sh)"
fi

# ASan/UBSan; scale 0 is the base model bit for bit
M="$TESTDATA/hf/llama-gqa-rope3"
head -2 "$TMP/llama-gqa-rope3-two.jsonl" >"$TMP/two.jsonl"
"$LLMI_SAN" generate --device cpu -m "$M" --prompts "$TMP/two.jsonl" -n 4 --temp 0 --prompt-logprobs 2 --json --no-stats \
  --lora "$L/llama-gqa-rope3-all" --lora-scaled "$L/llama-gqa-rope3-qv-rslora" 0.5 >"$TMP/san.out" 2>"$TMP/err" ||
  fail "llmi-san --lora: $(head -c 800 "$TMP/err")"
"$LLMI" generate --device cpu -m "$M" --prompts "$TMP/two.jsonl" -n 4 --temp 0 --prompt-logprobs 2 --json --no-stats \
  --lora "$L/llama-gqa-rope3-all" --lora-scaled "$L/llama-gqa-rope3-qv-rslora" 0.5 >"$TMP/opt.out" || fail "--lora run"
python3 - "$TMP/san.out" "$TMP/opt.out" <<'PY' || fail "llmi-san --lora differs from llmi"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert [r["tokens"] for r in a] == [r["tokens"] for r in b]
for x, y in zip(a, b):
    for e, f in zip(x["prompt_logprobs"][1:], y["prompt_logprobs"][1:]):
        assert abs(e["logprob"] - f["logprob"]) < 1e-4, (e, f)
print("llmi-san --lora: the same tokens and prompt logprobs as llmi")
PY
"$LLMI" generate --device cpu -m "$M" --prompts "$TMP/two.jsonl" -n 4 --temp 0 --prompt-logprobs 2 --json --no-stats \
  --lora-scaled "$L/llama-gqa-rope3-all" 0 >"$TMP/zero.out" || fail "--lora-scaled 0 run"
"$LLMI" generate --device cpu -m "$M" --prompts "$TMP/two.jsonl" -n 4 --temp 0 --prompt-logprobs 2 --json --no-stats \
  >"$TMP/plain.out" || fail "plain run"
python3 - "$TMP/zero.out" "$TMP/plain.out" <<'PY' || fail "--lora-scaled 0 is not the base model"
import json, sys
strip = lambda r: {k: v for k, v in r.items() if not k.endswith("_ms") and k != "decode_tok_s"}
a = [strip(json.loads(l)) for l in open(sys.argv[1])]
b = [strip(json.loads(l)) for l in open(sys.argv[2])]
assert a == b
print("--lora-scaled 0: every token and logprob equal the base model's")
PY

# the prompt cache keeps adapted and plain K/V apart
prompt_cache_apart "--lora" "--lora $L/llama-gqa-rope3-all" generate --device cpu -m "$M" --prompts "$TMP/two.jsonl" -n 2 \
  --temp 0 --json --no-stats --prompt-cache "$TMP/pc"

# quantize merges the adapter before quantizing (RTN, so no calibration text); an int4
# checkpoint takes an adapter at load (its adapted linears dequantized into bf16)
"$LLMI" quantize -m "$M" --lora "$L/llama-gqa-rope3-all" --method rtn --bits 4 --group-size 32 -o "$TMP/q" >"$TMP/q.log" 2>&1 ||
  fail "quantize --lora: $(tail -3 "$TMP/q.log")"
"$LLMI" generate --device cpu -m "$TMP/q" --prompts "$TMP/llama-gqa-rope3-all.jsonl" -n 0 --prompt-logprobs 5 --json \
  --no-stats >"$TMP/q.out" || fail "generate on the quantized adapted model"
# (int4 of a 64-wide random model moves logprobs by up to ~1: the adapted reference must be
# the near one, by far)
python3 "$CMP" "$L/ref/llama-gqa-rope3-all.json" "$TMP/q.out" --nearer-than "$TESTDATA/hf/ref/llama-gqa-rope3.json" \
  >"$TMP/cmp" || { cat "$TMP/cmp"; fail "quantize --lora: the int4 model is not the adapted one"; }
echo "quantize --lora, int4 g32: $(cat "$TMP/cmp")"
# bad adapters
mk() {  # mk NAME: a copy of llama-gqa-rope3-all to break
  rm -rf "$TMP/$1"; cp -r "$L/llama-gqa-rope3-all" "$TMP/$1"; echo "$TMP/$1"
}
setcfg() {  # setcfg DIR PYTHON-EXPR-ON-c
  python3 -c 'import json,sys; p=sys.argv[1]+"/adapter_config.json"; c=json.load(open(p)); exec(sys.argv[2]); json.dump(c, open(p, "w"))' "$1" "$2"
}
gen=(generate --device cpu -m "$M" -p hi -n 1 --no-stats)
expect_error "no such file or directory" "$LLMI" "${gen[@]}" --lora "$TMP/nonexistent"
d=$(mk dora); setcfg "$d" 'c["use_dora"] = True'; expect_error "DoRA" "$LLMI" "${gen[@]}" --lora "$d"
d=$(mk fifo); setcfg "$d" 'c["fan_in_fan_out"] = True'; expect_error "fan_in_fan_out" "$LLMI" "${gen[@]}" --lora "$d"
d=$(mk bias); setcfg "$d" 'c["bias"] = "all"'; expect_error "bias" "$LLMI" "${gen[@]}" --lora "$d"
d=$(mk alora); setcfg "$d" 'c["alora_invocation_tokens"] = [5, 6]'; expect_error "alora_invocation_tokens" "$LLMI" "${gen[@]}" --lora "$d"
d=$(mk mts); setcfg "$d" 'c["modules_to_save"] = ["lm_head"]'; expect_error "modules_to_save" "$LLMI" "${gen[@]}" --lora "$d"
d=$(mk rank); setcfg "$d" 'c["r"] = 4'; expect_error "must be 4x" "$LLMI" "${gen[@]}" --lora "$d"
d=$(mk rzero); setcfg "$d" 'c["r"] = 0'; expect_error '"r"' "$LLMI" "${gen[@]}" --lora "$d"
d=$(mk alpha); setcfg "$d" 'c["lora_alpha"] = "16"'; expect_error "lora_alpha" "$LLMI" "${gen[@]}" --lora "$d"
d=$(mk json); echo '{"r": 8,' >"$d/adapter_config.json"; expect_error "JSON" "$LLMI" "${gen[@]}" --lora "$d"
# finite factors whose merge leaves an f16 weight's range (mistral-sharded is f16, of the same shapes)
d=$(mk huge); setcfg "$d" 'c["lora_alpha"] = 1e6'
expect_error "overflow F16" "$LLMI" generate --device cpu -m "$TESTDATA/hf/mistral-sharded" -p hi -n 1 --no-stats \
  --lora-scaled "$d" 1e4
# tensors: renamed, unpaired, mis-shaped, non-finite (a safetensors file rewritten by the stdlib)
st_edit() {  # st_edit DIR PYTHON: edits t, name -> {"dtype", "shape", "data"}, of adapter_model.safetensors
  python3 - "$1/adapter_model.safetensors" "$2" <<'PY'
import json, struct, sys
p = sys.argv[1]
raw = open(p, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
meta = h.pop("__metadata__", None)
t = {k: {"dtype": v["dtype"], "shape": v["shape"],
         "data": bytearray(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])} for k, v in h.items()}
exec(sys.argv[2])
out, data = {}, b""
for k, v in t.items():
    out[k] = {"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [len(data), len(data) + len(v["data"])]}
    data += bytes(v["data"])
if meta is not None:
    out["__metadata__"] = meta
hb = json.dumps(out).encode()
hb += b" " * (-len(hb) % 8)
open(p, "wb").write(struct.pack("<Q", len(hb)) + hb + data)
PY
}
A0=base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight
B0=base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight
d=$(mk name); st_edit "$d" "t['base_model.model.lm_head.lora_A.weight'] = t.pop('$A0')"
expect_error "lm_head.lora_A" "$LLMI" "${gen[@]}" --lora "$d"
d=$(mk unpaired); st_edit "$d" "t.pop('$B0')"; expect_error "without lora_B" "$LLMI" "${gen[@]}" --lora "$d"
d=$(mk layer); st_edit "$d" "t['$A0'.replace('layers.0.', 'layers.7.')] = t.pop('$A0'); t['$B0'.replace('layers.0.', 'layers.7.')] = t.pop('$B0')"
expect_error "layer 7" "$LLMI" "${gen[@]}" --lora "$d"
d=$(mk nan); st_edit "$d" "t['$A0']['data'][12:16] = struct.pack('<f', float('nan'))"
expect_error "non-finite" "$LLMI" "${gen[@]}" --lora "$d"
d=$(mk dtype); st_edit "$d" "t['$A0']['dtype'] = 'I32'"; expect_error "f32, f16 or bf16" "$LLMI" "${gen[@]}" --lora "$d"
d=$(mk ident); st_edit "$d" "pass"; "$LLMI" "${gen[@]}" --lora "$d" --temp 0 >"$TMP/ident.out" ||
  fail "the adapter rewritten unchanged by st_edit is refused"
"$LLMI_SAN" "${gen[@]}" --lora "$TMP/dtype" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] || fail "llmi-san on a bad adapter exited $rc: $(head -c 500 "$TMP/err")"
# models the merge cannot take
need_model
expect_error "lora_A is 8x64" "$LLMI" generate --device cpu -m "$MODEL" -p hi -n 1 --no-stats --lora "$L/llama-gqa-rope3-all"
expect_error "--dummy" "$LLMI" bench --dummy smollm2-135m --lora "$L/llama-gqa-rope3-all" -p 8 -n 8 -r 1
"$LLMI" quantize -m "$M" --method rtn --bits 4 --group-size 32 -o "$TMP/q0" >"$TMP/q0.log" 2>&1 || fail "quantize: $(tail -3 "$TMP/q0.log")"
for dev in cpu emu; do
  bin=$LLMI; [ $dev = emu ] && { [ -x "$LLMI_EMU" ] || continue; bin=$LLMI_EMU; }
  d=cpu; [ $dev = emu ] && d=cuda
  "$bin" generate --device $d -m "$TMP/q0" --lora "$L/llama-gqa-rope3-all" --prompts "$TMP/llama-gqa-rope3-all.jsonl" -n 0 \
    --prompt-logprobs 5 --json --no-stats >"$TMP/q0.out" 2>"$TMP/err" || fail "$dev: int4 model with --lora: $(tail -3 "$TMP/err")"
  python3 "$CMP" "$L/ref/llama-gqa-rope3-all.json" "$TMP/q0.out" --nearer-than "$TESTDATA/hf/ref/llama-gqa-rope3.json" \
    >"$TMP/cmp" || { cat "$TMP/cmp"; fail "$dev: int4 model with --lora is not the adapted one"; }
  echo "$dev: int4 base + --lora: $(cat "$TMP/cmp")"
done
expect_error "--lora-scaled" "$LLMI" "${gen[@]}" --lora-scaled "$L/llama-gqa-rope3-all" nan
expect_error "self_attn.q_proj: lora_A is 8x64" "$LLMI" generate --device cpu -m "$TESTDATA/hf/llama-headdim" -p hi -n 1 --no-stats \
  --lora "$L/llama-gqa-rope3-all"
expect_error "MLPs are experts" "$LLMI" generate --device cpu -m "$TESTDATA/hf/qwen3moe-tiny" -p hi -n 1 --no-stats \
  --lora "$L/llama-gqa-rope3-all"
