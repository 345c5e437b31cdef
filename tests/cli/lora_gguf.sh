#!/usr/bin/env bash
# --lora FILE.gguf: llama.cpp's GGUF adapters (testdata/lora/gguf, written by llama.cpp's own
# convert_lora_to_gguf.py from the PEFT adapters of testdata/lora: scripts/make-lora-gguf.py),
# against someone else's numbers:
#   - PEFT's logits of the same adapters (every prompt position's logprob and top 5), with
#     each of the converter's output types: f32 (and then exactly llmi's output with the
#     PEFT directory: a llama adapter's Q/K rows come permuted and must be put back), f16,
#     bf16 and Q8_0 factors (rounded by the converter, so looser limits), on f32, bf16 and
#     GGUF Q4_K_M models;
#   - llama.cpp itself applying the adapter at run time: llama-perplexity --lora and
#     --lora-scaled 0.5 on the default model (testdata/lora/ref/smollm2-qv-ppl*.json), and
#     without the adapter llmi is far from those figures;
#   - through the CUDA backend on the CPU emulation; under ASan/UBSan;
#   - the prompt cache keeps a GGUF adapter's K/V apart from the plain model's;
#   - broken adapter files (tests/lib/gguf_edit.py rewrites a valid one): one line naming
#     the flag and what is wrong, exit 2.
. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/../lib/lora.sh"
G="$L/gguf"
# case (PEFT reference) | flags | limit.  f32 factors: the directory's limit (measured 1.7e-6);
# f16 and bf16 factors round B A by 2^-11 and 2^-8 against PEFT's fp32 (measured 4.8e-3 and
# 2.0e-2, where the base models are 1.7 and more away); Q8_0 factors on the Q4_K_M model
# (measured 0.097; 0.068 with the f32 directory)
cases=(
  "llama-gqa-rope3-all|--lora $G/llama-gqa-rope3-all.f32.gguf|1e-4"
  "qwen2-bias-tied-attn|--lora $G/qwen2-bias-tied-attn.f16.gguf|1e-2"
  "gemma3-swa-mlp-scaled|--lora-scaled $G/gemma3-swa-mlp.bf16.gguf -0.75|5e-2"
  "qwen3-kq-q4km-all|--lora $G/qwen3-kq-all.q8_0.gguf|0.3"
)
for c in "${cases[@]}"; do
  IFS='|' read -r name flags tol <<<"$c"
  vs_peft "$name" "$flags" "$tol"
  echo "cpu ${flags##*/} vs PEFT: $(tail -1 "$TMP/cmp")"
done

# f32 factors are the PEFT file's values: the same output as the directory, to the bit (a
# llama adapter, so the un-permuted Q/K rows are checked too)
same_output() {  # same_output A B WHAT
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
strip = lambda r: {k: v for k, v in r.items() if not k.endswith("_ms") and k != "decode_tok_s"}
a = [strip(json.loads(l)) for l in open(sys.argv[1])]
b = [strip(json.loads(l)) for l in open(sys.argv[2])]
assert len(a) == len(b) and a == b, f"{sys.argv[3]}: outputs differ"
n = sum(len(r["prompt_logprobs"]) - 1 for r in a)
print(f"{sys.argv[3]}: {len(a)} requests, {n} prompt logprobs and their top 5 equal")
PY
}
M="$TESTDATA/hf/llama-gqa-rope3"
"$LLMI" generate --device cpu -m "$M" --prompts "$TMP/llama-gqa-rope3-all.jsonl" -n 0 --prompt-logprobs 5 --json \
  --no-stats --lora "$L/llama-gqa-rope3-all" >"$TMP/dir.out" || fail "directory adapter run"
same_output "$TMP/dir.out" "$TMP/llama-gqa-rope3-all.out" "llama-gqa-rope3: GGUF f32 adapter vs the PEFT directory" ||
  fail "GGUF adapter differs from its PEFT directory"

# llama.cpp's one-argument forms, --lora A,B and --lora-scaled A:S,B:S, mean the repeated flags
two=(generate --device cpu -m "$M" --prompts "$TMP/llama-gqa-rope3-all.jsonl" -n 0 --prompt-logprobs 5 --json --no-stats)
"$LLMI" "${two[@]}" --lora "$G/llama-gqa-rope3-all.f32.gguf" --lora-scaled "$L/llama-gqa-rope3-qv-rslora" 0.5 \
  >"$TMP/rep.out" || fail "repeated --lora flags"
"$LLMI" "${two[@]}" --lora-scaled "$G/llama-gqa-rope3-all.f32.gguf:1,$L/llama-gqa-rope3-qv-rslora:0.5" >"$TMP/list.out" ||
  fail "--lora-scaled A:S,B:S"
same_output "$TMP/rep.out" "$TMP/list.out" "--lora-scaled A:1,B:0.5 vs --lora A --lora-scaled B 0.5" || fail "--lora-scaled list"
"$LLMI" "${two[@]}" --lora "$G/llama-gqa-rope3-all.f32.gguf,$L/llama-gqa-rope3-qv-rslora" >"$TMP/list2.out" ||
  fail "--lora A,B"
"$LLMI" "${two[@]}" --lora "$G/llama-gqa-rope3-all.f32.gguf" --lora "$L/llama-gqa-rope3-qv-rslora" >"$TMP/rep2.out" ||
  fail "--lora A --lora B"
same_output "$TMP/rep2.out" "$TMP/list2.out" "--lora A,B vs --lora A --lora B" || fail "--lora list"
! same_output "$TMP/rep.out" "$TMP/rep2.out" "scale 0.5 vs 1" >/dev/null 2>&1 || fail "the second adapter's scale changed nothing"

if [ -x "$LLMI_EMU" ]; then
  emu_run emu generate --device cuda -m "$M" --prompts "$TMP/llama-gqa-rope3-all.jsonl" -n 0 --prompt-logprobs 5 --json \
    --no-stats --lora "$G/llama-gqa-rope3-all.f32.gguf"
  python3 "$CMP" "$L/ref/llama-gqa-rope3-all.json" "$TMP/emu.out" --tol 0.1 --slack 0.1 >"$TMP/cmp" ||
    { tail -5 "$TMP/cmp"; fail "emulated cuda --lora FILE.gguf vs PEFT"; }
  echo "emulated cuda llama-gqa-rope3-all.f32.gguf vs PEFT: $(tail -1 "$TMP/cmp")"
else
  echo "(no $LLMI_EMU: the emulated CUDA part is skipped; make emu)"
fi

# ASan/UBSan, with Q8_0 and F16 factors and a directory adapter after the GGUF one
head -2 "$TMP/qwen3-kq-q4km-all.jsonl" >"$TMP/two.jsonl"
"$LLMI_SAN" generate --device cpu -m "$TESTDATA/hf/qwen3-kq.Q4_K_M.gguf" --prompts "$TMP/two.jsonl" -n 2 --temp 0 --json \
  --no-stats --lora "$G/qwen3-kq-all.q8_0.gguf" --lora-scaled "$L/qwen3-kq-qv" 0.5 >"$TMP/san.out" 2>"$TMP/err" ||
  fail "llmi-san --lora FILE.gguf: $(head -c 800 "$TMP/err")"
"$LLMI" generate --device cpu -m "$TESTDATA/hf/qwen3-kq.Q4_K_M.gguf" --prompts "$TMP/two.jsonl" -n 2 --temp 0 --json \
  --no-stats --lora "$G/qwen3-kq-all.q8_0.gguf" --lora-scaled "$L/qwen3-kq-qv" 0.5 >"$TMP/opt.out" || fail "--lora run"
python3 -c 'import json,sys; a=[json.loads(l)["tokens"] for l in open(sys.argv[1])]; b=[json.loads(l)["tokens"] for l in open(sys.argv[2])]; assert a == b, (a, b)' \
  "$TMP/san.out" "$TMP/opt.out" || fail "llmi-san --lora FILE.gguf differs from llmi"
echo "llmi-san: a Q8_0/F16 GGUF adapter then a PEFT directory: the same tokens as llmi"

# the prompt cache keys on the adapter file
head -2 "$TMP/llama-gqa-rope3-all.jsonl" >"$TMP/two.jsonl"
prompt_cache_apart "--lora FILE.gguf" "--lora $G/llama-gqa-rope3-all.f32.gguf" generate --device cpu -m "$M" \
  --prompts "$TMP/two.jsonl" -n 2 --temp 0 --json --no-stats --prompt-cache "$TMP/pc"

# llama.cpp applying the adapter at run time (Q4_1 weights, the f32 adapter beside them)
# against llmi merging it into bf16 copies: WikiText-2 perplexity, 8 windows of 512 tokens
# (tests/cli/ref_llamacpp_ppl.sh's rule).  Measured 2026-11-29: 27.0210 vs 27.0397 (0.069%),
# each window at most 1.69% apart; scaled 0.5: 24.6763 vs 24.6702 (0.025%), windows 0.89%
# (the plain model: 0.088% and 0.57%; the adapted q/v run in bf16 with fp32 activations
# here, Q4_1 with 8-bit activations plus the f32 adapter there).  The limits, 0.5% overall
# and 3% a window, are far below the adapter's own effect (llmi without it must miss by
# more than 5%; it misses by 12%).
DATA="$SHARED/data/wikitext-2-raw/wiki.test.raw"
if [ -f "$MODEL" ] && [ -f "$DATA" ]; then
  for ref in smollm2-qv-ppl smollm2-qv-ppl-scaled; do ppl_vs_llamacpp "$L/ref/$ref.json" "the adapter"; done
  # the same adapter as the PEFT directory: SmolLM2 (a llama GGUF: its Q rows and the
  # adapter's both come permuted) gives the same output to the bit
  python3 -c 'import json,sys
for l in list(open(sys.argv[1]))[:3]:
    r = json.loads(l); print(json.dumps({"prompt_token_ids": r["prompt_ids"] + r["tokens"]}))' \
    "$L/ref/smollm2-qv.jsonl" >"$TMP/smol.jsonl"
  smol=(generate --device cpu -m "$MODEL" --prompts "$TMP/smol.jsonl" -n 4 --temp 0 --prompt-logprobs 5 --json --no-stats)
  "$LLMI" "${smol[@]}" --lora "$L/smollm2-qv" >"$TMP/smol-dir.out" || fail "SmolLM2 with the PEFT directory"
  "$LLMI" "${smol[@]}" --lora "$G/smollm2-qv.f32.gguf" >"$TMP/smol-gguf.out" || fail "SmolLM2 with the GGUF adapter"
  same_output "$TMP/smol-dir.out" "$TMP/smol-gguf.out" "SmolLM2: GGUF f32 adapter vs the PEFT directory" ||
    fail "SmolLM2: the GGUF adapter differs from its PEFT directory"
  ppl_far_without "$L/ref/smollm2-qv-ppl.json" "the adapter"
else
  echo "(default model or wikitext-2 missing: the llama.cpp perplexity part is skipped)"
fi

# broken adapter files
edit() { gguf_edited "$G/llama-gqa-rope3-all.f32.gguf" "$@"; }   # edit NAME PYTHON: the llama f32 adapter, edited (tests/lib/common.sh)
gen=(generate --device cpu -m "$M" -p hi -n 1 --no-stats)
QA=blk.0.attn_q.weight.lora_a
QB=blk.0.attn_q.weight.lora_b
f=$(edit ident "pass"); "$LLMI" "${gen[@]}" --lora "$f" >/dev/null || fail "the adapter rewritten unchanged is refused"
expect_error "no such file" "$LLMI" "${gen[@]}" --lora "$TMP/nonexistent.gguf"
expect_error "not a LoRA adapter" "$LLMI" "${gen[@]}" --lora "$TESTDATA/hf/qwen3-qknorm.bf16.gguf"
expect_error 'architecture "qwen2"' "$LLMI" "${gen[@]}" --lora "$G/qwen2-bias-tied-attn.f16.gguf"
head -c 3000 "$G/llama-gqa-rope3-all.f32.gguf" >"$TMP/trunc.gguf"
expect_error "--lora $TMP/trunc.gguf" "$LLMI" "${gen[@]}" --lora "$TMP/trunc.gguf"
f=$(edit type 'gguf_edit.set_str(g, "general.type", "model")'); expect_error "not a LoRA adapter" "$LLMI" "${gen[@]}" --lora "$f"
f=$(edit cvec 'gguf_edit.set_str(g, "adapter.type", "control_vector")'); expect_error "adapter.type" "$LLMI" "${gen[@]}" --lora "$f"
f=$(edit alpha 'gguf_edit.set_f32(g, "adapter.lora.alpha", float("inf"))'); expect_error "adapter.lora.alpha" "$LLMI" "${gen[@]}" --lora "$f"
f=$(edit alora 'g["kv"].append(["adapter.alora.invocation_tokens", 9, struct.pack("<IQII", 4, 2, 5, 6)])')
expect_error "activated LoRA" "$LLMI" "${gen[@]}" --lora "$f"
f=$(edit embd "gguf_edit.find(g, '$QA')['name'] = 'token_embd.weight.lora_a'"); expect_error "token_embd.weight.lora_a" "$LLMI" "${gen[@]}" --lora "$f"
f=$(edit norm "g['tensors'].append({'name': 'blk.0.attn_norm.weight', 'dims': [64], 'type': 0, 'data': bytes(256)})")
expect_error "blk.0.attn_norm.weight" "$LLMI" "${gen[@]}" --lora "$f"
f=$(edit unpaired "g['tensors'].remove(gguf_edit.find(g, '$QB'))"); expect_error "without lora_B" "$LLMI" "${gen[@]}" --lora "$f"
f=$(edit twice "g['tensors'].append(dict(gguf_edit.find(g, '$QB')))"); expect_error "duplicate tensor" "$LLMI" "${gen[@]}" --lora "$f"
f=$(edit layer "gguf_edit.find(g, '$QA')['name'] = 'blk.40.attn_q.weight.lora_a'; gguf_edit.find(g, '$QB')['name'] = 'blk.40.attn_q.weight.lora_b'")
expect_error "layer 40" "$LLMI" "${gen[@]}" --lora "$f"
f=$(edit rank "t = gguf_edit.find(g, '$QA'); t['dims'] = [64, 4]; t['data'] = t['data'][:64 * 4 * 4]")
expect_error "lora_A is 4x64 and lora_B 64x8" "$LLMI" "${gen[@]}" --lora "$f"
f=$(edit i32 "gguf_edit.find(g, '$QA')['type'] = 26"); expect_error "F32, F16, BF16 or Q8_0" "$LLMI" "${gen[@]}" --lora "$f"
f=$(edit nan "t = gguf_edit.find(g, '$QA'); t['data'] = struct.pack('<f', float('nan')) + t['data'][4:]")
expect_error "non-finite" "$LLMI" "${gen[@]}" --lora "$f"
expect_error "is not PATH:SCALE" "$LLMI" "${gen[@]}" --lora-scaled "$G/llama-gqa-rope3-all.f32.gguf:1,$L/llama-gqa-rope3-qv-rslora"
expect_error "an empty path" "$LLMI" "${gen[@]}" --lora "$G/llama-gqa-rope3-all.f32.gguf,"
expect_error "at most 8" "$LLMI" "${gen[@]}" --lora "$(printf "$TMP/x,%.0s" 1 2 3 4 5 6 7 8)$TMP/x"
"$LLMI_SAN" "${gen[@]}" --lora "$TMP/rank.gguf" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] || fail "llmi-san on a bad GGUF adapter exited $rc: $(head -c 500 "$TMP/err")"
