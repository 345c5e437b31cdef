#!/usr/bin/env bash
# llmi quantize refuses bad input with one clear line and exit 1/2, leaving nothing behind:
# group size not dividing an input dim, unsupported bits, calibration text too short, empty
# or not text, a run whose memory estimate cannot fit, existing output dir (unless --force),
# a checkpoint whose quantization_config disagrees.
set -u
BIN="${LLMI_SAN:-$LLMI}"; [ -x "$BIN" ] || BIN="$LLMI"
[ -x "$BIN" ] || { echo "no llmi binary"; exit 77; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
TINY="$TESTDATA/quant/tiny-config.json"
fail=0
expect() { # expect RC PATTERN -- command...
    local want=$1 pat=$2; shift 3
    local err rc
    err=$("$@" 2>&1 >/dev/null); rc=$?
    local last; last=$(printf '%s\n' "$err" | grep -v '^quantize: ' | tail -n 1)
    if [ "$rc" != "$want" ] || ! printf '%s' "$last" | grep -q -- "$pat"; then
        echo "FAIL: $* -> rc $rc (want $want), stderr: $err"; fail=1
    fi
    if [ "$(printf '%s\n' "$err" | grep -v '^quantize: ' | grep -c .)" -gt 1 ]; then
        echo "FAIL: more than one error line: $err"; fail=1
    fi
}
leftovers() { ls -d "$T"/out* 2>/dev/null | grep -v "^$T/out-existing$" ; }

expect 2 "does not divide the input dim 64" -- "$BIN" quantize --dummy "$TINY" --method rtn --group-size 48 -o "$T/out"
expect 2 "unsupported bit width" -- "$BIN" quantize --dummy "$TINY" --method rtn --bits 3 -o "$T/out"
expect 2 "needs --calib" -- "$BIN" quantize --dummy "$TINY" --method gptq -o "$T/out"
expect 2 "unknown flag" -- "$BIN" quantize --dummy "$TINY" --method rtn --frobnicate -o "$T/out"
# memory: 65536 windows of 65536 tokens need terabytes of hidden states: refused before any work
expect 2 "needs ~.* GiB but only" -- "$BIN" quantize --dummy "$TINY" --method gptq --group-size 32 --calib "$TINY" \
    --nsamples 65536 --seqlen 65536 -o "$T/out"
"$BIN" quantize --dummy "$TINY" --method rtn --group-size 32 -o "$T/out-dry" --dry-run 2>"$T/dry.err" \
    && grep -q "needs ~" "$T/dry.err" && [ ! -e "$T/out-dry" ] || { echo "FAIL: --dry-run"; cat "$T/dry.err"; fail=1; }
mkdir "$T/out-existing"; echo keep > "$T/out-existing/file"
expect 2 "exists (use --force" -- "$BIN" quantize --dummy "$TINY" --method rtn --group-size 32 -o "$T/out-existing"
[ "$(cat "$T/out-existing/file")" = keep ] || { echo "FAIL: existing dir touched"; fail=1; }
"$BIN" quantize --dummy "$TINY" --method rtn --group-size 32 -o "$T/out-existing" --force 2>/dev/null \
    || { echo "FAIL: --force did not replace"; fail=1; }
[ -f "$T/out-existing/model.safetensors" ] && [ ! -e "$T/out-existing/file" ] || { echo "FAIL: --force result"; fail=1; }
[ -z "$(leftovers)" ] || { echo "FAIL: left behind: $(leftovers)"; fail=1; }

# calibration text too short for the requested windows (needs a model with a tokenizer)
if [ -f "${MODEL:-}" ]; then
    printf 'To be, or not to be, that is the question.\n' > "$T/short.txt"
    expect 2 "too short for 128 windows of 2048 tokens" -- "$BIN" quantize -m "$MODEL" --method gptq --group-size 64 \
        --calib "$T/short.txt" -o "$T/out"
    : > "$T/empty.txt"
    expect 2 "the file is empty" -- "$BIN" quantize -m "$MODEL" --method gptq --group-size 64 --calib "$T/empty.txt" -o "$T/out"
    printf '\n \n\t\n' > "$T/blank.txt"
    expect 2 "the file is empty" -- "$BIN" quantize -m "$MODEL" --method awq --group-size 64 --calib "$T/blank.txt" -o "$T/out"
    printf 'some text\0more' > "$T/nul.bin"
    expect 2 "not text (a NUL byte at offset 9)" -- "$BIN" quantize -m "$MODEL" --method gptq --group-size 64 \
        --calib "$T/nul.bin" -o "$T/out"
    printf 'caf\xe9 latin-1' > "$T/latin1.txt"
    expect 2 "not text (invalid UTF-8 at offset 3)" -- "$BIN" quantize -m "$MODEL" --method gptq --group-size 64 \
        --calib "$T/latin1.txt" -o "$T/out"
    [ -z "$(leftovers)" ] || { echo "FAIL: left behind: $(leftovers)"; fail=1; }
fi

# a checkpoint whose quantization_config disagrees with its tensors
cp -r "$TESTDATA/quant/gptq" "$T/bad"
sed -i 's/"group_size":\t32/"group_size":\t64/' "$T/bad/config.json"
expect 1 "disagrees with quantization_config" -- "$BIN" generate --device cpu -m "$T/bad" -p hi -n 1
cp -r "$TESTDATA/quant/awq" "$T/bad2"
sed -i 's/"bits":\t4/"bits":\t3/' "$T/bad2/config.json"
expect 1 "bits 3 is not supported" -- "$BIN" generate --device cpu -m "$T/bad2" -p hi -n 1
[ $fail -eq 0 ] || exit 1
# Part of this test did not run without the model: that is a skip, not a pass.
[ -f "${MODEL:-}" ] || { echo "calibration-text case not run: default model missing (${MODEL:-})"; exit 77; }
exit 0
