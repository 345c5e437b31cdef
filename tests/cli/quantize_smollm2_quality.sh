#!/usr/bin/env bash
# The real model end to end: SmolLM2 GGUF -> llmi quantize --method rtn -> HF GPTQ directory
# with a generated tokenizer.json -> llmi generate loads it (int4 CPU matmul) and writes text.
set -u
[ -f "${MODEL:-}" ] || { echo "no default model"; exit 77; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
"$LLMI" quantize -m "$MODEL" --method rtn --group-size 64 -o "$T/q" 2>"$T/err" || { cat "$T/err"; exit 1; }
for f in model.safetensors config.json quantize_config.json tokenizer.json tokenizer_config.json; do
    [ -s "$T/q/$f" ] || { echo "missing $f"; exit 1; }
done
grep -q '"quant_method":[[:space:]]*"gptq"' "$T/q/config.json" || { echo "no quantization_config"; exit 1; }
out=$("$LLMI" generate -m "$T/q" -p "The capital of France is" -n 8 --temp 0 --no-stats 2>"$T/err2") \
    || { cat "$T/err2"; exit 1; }
[ -n "$out" ] || { echo "no text generated"; exit 1; }
echo "generated: $out"
