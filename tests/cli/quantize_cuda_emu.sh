#!/usr/bin/env bash
# llmi quantize --device cuda on the CPU emulation of CUDA (build-emu/llmi, tests/cuda-emu):
# GPTQ through the whole GPU path (the CUDA backend's calibration forward, the Gram matrices
# left in their device slots, the factorisation, column walk and error measure on the device)
# and AWQ (its scale and clipping searches on the device) against --device cpu on the same
# model and calibration, and the GPU path's three sources of
# H against each other: its own slots (H never on the host), the same calibration copied to the
# host for --save-stats, and those statistics read back with --load-stats (no forward).  The
# last two hand the device the very values the first kept there, so all three must write the
# same bytes and print the same errors.  The GPU calibrates through bf16 activations where the
# CPU uses fp32, so against the CPU each linear's relative output error must agree within 15%
# (observed: within 5%; H of another tap or layer gives 2-100x).
. "$(dirname "$0")/../lib/common.sh"
need_emu
M="$TESTDATA/hf/llama-gqa-rope3"
words=(the sea a boat river stone light wind over under blue green quiet morning)
for ((i = 0; i < 3000; i++)); do printf '%s ' "${words[(i * 7 + i / 5) % ${#words[@]}]}"; done >"$TMP/calib.txt"
Q=(quantize -m "$M" --group-size 32 --calib "$TMP/calib.txt" --nsamples 16 --seqlen 64 --force)
# errs FILE: each layer's "q 1.2e-03 k ..." error list
errs() { grep -E '^quantize: layer' "$1" | sed 's/^quantize: layer *[0-9]*\/[0-9]* //; s/  (rel\. output error.*//'; }

for variant in "gptq" "gptq --desc-act" "awq"; do
  tag=${variant// /}; tag=${tag//--/-}; [ "$tag" = gptq ] && tag=plain
  "$LLMI" "${Q[@]}" --method $variant --device cpu -o "$TMP/cpu-$tag" 2>"$TMP/cpu-$tag.err" ||
    fail "$tag cpu: $(tail -2 "$TMP/cpu-$tag.err")"
  emu_run "gpu-$tag" "${Q[@]}" --method $variant --device cuda -o "$TMP/gpu-$tag"
  [ "$(grep -c 'rel. output error' "$TMP/gpu-$tag.err")" = 2 ] ||
    fail "$tag: want 2 per-layer lines: $(tail -3 "$TMP/gpu-$tag.err")"
  python3 - "$(errs "$TMP/cpu-$tag.err")" "$(errs "$TMP/gpu-$tag.err")" "$tag" <<'PY' || fail "$tag: errors differ"
import sys
cpu, gpu, tag = (l.split() for l in sys.argv[1].splitlines()), (l.split() for l in sys.argv[2].splitlines()), sys.argv[3]
n = 0
for lc, lg in zip(cpu, gpu):
    assert lc[0::2] == lg[0::2] and len(lc) == 14, (lc, lg)
    for name, c, g in zip(lc[0::2], lc[1::2], lg[1::2]):
        c, g = float(c), float(g)
        assert abs(g - c) <= 0.15 * c, f"{tag} {name}: gpu {g}, cpu {c}"
        n += 1
assert n == 14, n
print(f"{tag}: 14 linears' relative output errors, gpu within 15% of cpu")
PY
done
[ -f "$TMP/gpu-plain/model.safetensors" ] || fail "no checkpoint written"

[ -f "$TMP/gpu-awq/model.safetensors" ] || fail "no AWQ checkpoint written"

# the same H by the host: --save-stats copies the slots' matrices off the device
emu_run saved "${Q[@]}" --method gptq --device cuda --save-stats "$TMP/stats.zst" -o "$TMP/gpu-saved"
emu_run loaded quantize -m "$M" --method gptq --group-size 32 --force --load-stats "$TMP/stats.zst" \
  --device cuda -o "$TMP/gpu-loaded"
for v in saved loaded; do
  [ "$(errs "$TMP/$v.err")" = "$(errs "$TMP/gpu-plain.err")" ] ||
    fail "$v: errors $(errs "$TMP/$v.err" | head -1) vs $(errs "$TMP/gpu-plain.err" | head -1)"
  cmp -s "$TMP/gpu-$v/model.safetensors" "$TMP/gpu-plain/model.safetensors" ||
    fail "$v: the checkpoint differs from the one whose H stayed on the device"
done
echo "H from the device's slots, from the host (--save-stats) and from the file (--load-stats): same checkpoint"
