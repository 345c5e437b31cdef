#!/usr/bin/env bash
# Invalid flags and impossible requests: a one-line error naming the flag or file, exit 1 or 2,
# nothing on stdout, no crash (run under ASan/UBSan).
. "$(dirname "$0")/../lib/common.sh"
need_model
L="$LLMI_SAN"
expect_error "-n" "$L" generate --device cpu -m "$MODEL" -p hi -n abc
expect_error "--temp" "$L" generate --device cpu -m "$MODEL" -p hi --temp -1
expect_error "--top-p" "$L" generate --device cpu -m "$MODEL" -p hi --top-p 1.5
expect_error "--top-k" "$L" generate --device cpu -m "$MODEL" -p hi --top-k 1x
expect_error "--device" "$L" generate -m "$MODEL" -p hi --device gpu
expect_error "--bogus" "$L" generate --device cpu -m "$MODEL" -p hi --bogus
expect_error "-p" "$L" generate --device cpu -m "$MODEL" -p
expect_error "--logprobs" "$L" generate --device cpu -m "$MODEL" -p hi --logprobs 5
expect_error "--logprobs" "$L" generate --device cpu -m "$MODEL" -p hi --json --logprobs 99
expect_error "--block-size" "$L" generate --device cpu -m "$MODEL" -p hi --block-size 0
expect_error "-c" "$L" generate --device cpu -m "$MODEL" -p hi -c 0
expect_error "/nonexistent/model.gguf" "$L" generate --device cpu -m /nonexistent/model.gguf -p hi
expect_error "no prompt" "$L" generate --device cpu -m "$MODEL" --prompts /dev/null
expect_error "missing.txt" "$L" generate --device cpu -m "$MODEL" -f "$TMP/missing.txt"
# A prompt longer than the context.
python3 -c 'print("word " * 400)' >"$TMP/long.txt"
expect_error "context" "$L" generate --device cpu -m "$MODEL" -f "$TMP/long.txt" -c 64 -n 4
# A prompt that cannot fit the KV cache even alone.
expect_error "KV" "$L" generate --device cpu -m "$MODEL" -f "$TMP/long.txt" --num-blocks 2 --block-size 16 -n 4
# Bad JSONL in --prompts.
printf '{"prompt": 5}\n' >"$TMP/bad.jsonl"
expect_error "bad.jsonl:1" "$L" generate --device cpu -m "$MODEL" --prompts "$TMP/bad.jsonl"
printf '{"prompt": "x", "temperature": "hot"}\n' >"$TMP/bad2.jsonl"
expect_error "temperature" "$L" generate --device cpu -m "$MODEL" --prompts "$TMP/bad2.jsonl"
# --repeat-penalty's range (0 divided the logits of repeated tokens by zero: +inf, so they repeat forever).
printf '{"prompt": "x", "repeat_penalty": 0}\n' >"$TMP/bad3.jsonl"
expect_error "repeat_penalty" "$L" generate --device cpu -m "$MODEL" --prompts "$TMP/bad3.jsonl"
# --device cuda where there is no GPU (or no CUDA build): a clear error, never a silent CPU run.
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  expect_error "cuda" "$LLMI" generate -m "$MODEL" -p hi -n 1 --device cuda
fi
# An HF directory without a tokenizer.
if [ -d "$TESTDATA/hf" ]; then
  d=$(ls -d "$TESTDATA"/hf/*/ 2>/dev/null | head -1)
  if [ -n "$d" ]; then
    mkdir -p "$TMP/notok"; cp "$d"/config.json "$d"/*.safetensors* "$TMP/notok/" 2>/dev/null
    expect_error "tokenizer" "$L" generate --device cpu -m "$TMP/notok" -p hi -n 1
  fi
fi
# Unsupported subcommand flags for dummy.
expect_error "--dummy" "$L" generate --device cpu --dummy smollm2-135m -p hi
echo "all bad-input cases gave one-line errors"
