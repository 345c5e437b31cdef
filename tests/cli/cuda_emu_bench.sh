#!/usr/bin/env bash
# llmi bench and llmi profile with --device cuda on the CPU emulation of CUDA (build-emu/llmi,
# tests/cuda-emu), on gpu-check's bench and tput command lines at toy sizes: the backend's
# timing events, memory accounting and the graph and int4 paths run, and each report is
# whole.  The figures are the emulator's, so only their presence and the memory sizes are
# checked: an RTN int4 copy of the model must report its packed weights on the device (about
# a quarter of bf16's plus scales), not a bf16 copy (issue 8, part 1, point 9), and so must
# the synthetic int4 model gpu-check measures.
. "$(dirname "$0")/../lib/common.sh"
need_emu
M="$TESTDATA/hf/llama-gqa-rope3"
# col FILE NAME [ROW]: a CSV column's value (ROW 1 = the first data row)
col() { python3 -c 'import csv,sys; r=list(csv.DictReader(open(sys.argv[1]))); print(r[int(sys.argv[3])-1][sys.argv[2]])' "$@"; }
positive() { python3 -c 'import sys; v=float(sys.argv[1]); sys.exit(0 if v > 0 else 1)' "$1" 2>/dev/null; }

# decode at batch 1 and 8 (the graph path), prefill-only TTFT
emu_run bench bench -m "$M" --device cuda --kv-type bf16 -o csv -p 24 -n 6 -b 1,8 -r 1
[ "$(grep -c '^' "$TMP/bench.out")" -eq 3 ] || fail "bench: want a header and 2 rows: $(cat "$TMP/bench.out")"
for r in 1 2; do
  [ "$(col "$TMP/bench.out" backend $r)" = cuda ] || fail "bench row $r: backend is not cuda"
  for c in decode_tps_mean ttft_ms_mean mem_backend_weights_mib mem_kv_mib; do
    positive "$(col "$TMP/bench.out" $c $r)" || fail "bench row $r: $c = '$(col "$TMP/bench.out" $c $r)'"
  done
done
grep -qE 'EMU stats: .* [1-9][0-9]* graph launches' "$TMP/bench.err" || fail "bench: no decode step ran as a CUDA graph"
bf16_mib=$(col "$TMP/bench.out" mem_backend_weights_mib 1)
echo "bench: 2 rows, decode graphs ran, backend weights $bf16_mib MiB (bf16)"

# offline throughput, gpu-check's tput line
emu_run tput bench -m "$M" --device cuda --kv-type bf16 -o csv --num-requests 12 --input-len 10 --output-len 6
[ "$(col "$TMP/tput.out" output_tokens 1)" = 72 ] || fail "tput: output_tokens $(col "$TMP/tput.out" output_tokens 1), want 12 x 6"
positive "$(col "$TMP/tput.out" output_tps 1)" || fail "tput: output_tps missing"
echo "tput: 12 requests, 72 output tokens"
# its untimed warm-up (docs/BENCH.md) ran every decode batch size up to 12 (buckets 16, 8, 4,
# 2, 1) twice: five graphs captured, and the timed run, whose decode steps all fall in
# those buckets, captured none of its own; without the warm-up the timed run captures
captures() { sed -n 's/^EMU stats: .* \([0-9]*\) graph captures.*/\1/p' "$TMP/$1.err"; }
[ "$(captures tput)" = 5 ] || fail "tput: $(captures tput) graph captures, want the warm-up's 5 (16, 8, 4, 2, 1)"
emu_run tput0 bench -m "$M" --device cuda --kv-type bf16 -o csv --num-requests 12 --input-len 10 --output-len 6 --warmup 0
[ "$(captures tput0)" -ge 1 ] || fail "tput --warmup 0: no graph captured in the timed run"
[ "$(col "$TMP/tput0.out" warmup_s 1)" = 0 ] && positive "$(col "$TMP/tput.out" warmup_s 1)" ||
  fail "tput: warmup_s $(col "$TMP/tput.out" warmup_s 1) with the warm-up, $(col "$TMP/tput0.out" warmup_s 1) without"
echo "tput: the warm-up captured the 5 graphs the timed run replays ($(captures tput0) captured inside it without)"

# RTN int4 on the device: packed weights, W4A16 kernels at batch 1 and 4
"$LLMI" quantize -m "$M" --method rtn --group-size 32 -o "$TMP/i4" --force >"$TMP/q.log" 2>&1 || fail "quantize: $(tail -2 "$TMP/q.log")"
emu_run int4 bench -m "$TMP/i4" --device cuda --kv-type bf16 -o csv -p 24 -n 6 -b 1,4 -r 1
[ "$(col "$TMP/int4.out" weight_dtype 1)" = I4G ] || fail "int4: weight_dtype $(col "$TMP/int4.out" weight_dtype 1)"
i4_mib=$(col "$TMP/int4.out" mem_backend_weights_mib 1)
# the embeddings, norms and lm_head stay bf16 in both; the linears shrink ~3.6x (scales and zeros included)
python3 - "$bf16_mib" "$i4_mib" "$M/config.json" <<'PY' || fail "int4: backend weights $i4_mib MiB against bf16 $bf16_mib MiB"
import json, sys
bf16, i4, c = float(sys.argv[1]), float(sys.argv[2]), json.load(open(sys.argv[3]))
h, f, L, kv = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c.get("num_key_value_heads", c["num_attention_heads"])
hd = c.get("head_dim", h // c["num_attention_heads"])
lin = L * (h * (c["num_attention_heads"] * hd + 2 * kv * hd) + c["num_attention_heads"] * hd * h + 3 * h * f)
lin_bf16 = lin * 2 / 2**20
want = bf16 - lin_bf16 * (1 - (0.5 + 4 / 32) / 2)   # 4 bits a weight + an fp16 scale and a 4-bit zero per 32
assert abs(i4 - want) <= 0.1 * lin_bf16 and i4 < bf16, (i4, want, bf16)
print(f"int4: backend weights {i4:.3f} MiB, bf16 {bf16:.3f} MiB, linears alone {lin_bf16:.3f} MiB in bf16")
PY

# the synthetic int4 model gpu-check benches (--dummy-dtype int4-gN) is served as the RTN
# checkpoint of the same shapes is: packed, the same bytes on the device, the int4 kernels
LLMI_EMU_COUNT=llmi_int4 emu_run int4d bench --dummy "$M/config.json" --dummy-dtype int4-g32 --device cuda --kv-type bf16 -o csv \
  -p 24 -n 6 -b 1,4 -r 1
[ "$(col "$TMP/int4d.out" weight_dtype 1)" = I4G ] || fail "int4 dummy: weight_dtype $(col "$TMP/int4d.out" weight_dtype 1)"
i4d_mib=$(col "$TMP/int4d.out" mem_backend_weights_mib 1)
python3 -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 1e-3 * b)' "$i4d_mib" "$i4_mib" ||
  fail "int4 dummy: backend weights $i4d_mib MiB, the RTN checkpoint's $i4_mib"
grep -qE '^EMU count: [1-9][0-9]* launches of llmi_int4' "$TMP/int4d.err" || fail "int4 dummy: no int4 kernel ran: $(grep '^EMU' "$TMP/int4d.err")"
echo "int4 dummy: backend weights $i4d_mib MiB, as the RTN checkpoint's"

# llmi profile: every op of both phases timed by events
emu_run profile profile -m "$M" --device cuda -b 1 -p 24 -n 4 -o csv
for ph in prefill decode; do
  for op in embed norm qkv rope_kv attn o_proj mlp_up act mlp_down lm_head sample; do
    grep -q "^$ph,$op," "$TMP/profile.out" || fail "profile: no $ph $op row"
  done
done
echo "profile: prefill and decode rows for all 11 ops"

# the kernel knobs a device session times (int4 kernels, GEMM autotuning): a value that names
# nothing is refused with one line naming the variable, before any work, not ignored
for bad in "LLMI_I4_GEMV=tensor" "LLMI_I4_DEQUANT_MIN_N=0" "LLMI_I4_DEQUANT_MIN_N=9x" "LLMI_GEMM_TUNE=17" \
           "LLMI_ATTN_DECODE=simt" "LLMI_DENSE_GEMV=yes" "LLMI_ATTN_TILES=pipelined"; do
  rc=0
  env "$bad" "$LLMI_EMU" bench -m "$TMP/i4" --device cuda -o csv -p 4 -n 2 -b 1 -r 1 >"$TMP/knob.out" 2>"$TMP/knob.err" || rc=$?
  [ "$rc" = 2 ] || fail "$bad: exit $rc, want 2: $(tail -2 "$TMP/knob.err")"
  grep -q "${bad%%=*}=${bad#*=}: not" "$TMP/knob.err" || fail "$bad: no line naming it: $(tail -2 "$TMP/knob.err")"
  [ ! -s "$TMP/knob.out" ] || fail "$bad: wrote a report: $(head -2 "$TMP/knob.out")"
done
for good in "LLMI_I4_GEMV=warp" "LLMI_I4_GEMV=chunk" "LLMI_I4_GEMV=mma" "LLMI_I4_DEQUANT_MIN_N=3" "LLMI_GEMM_TUNE=4" \
            "LLMI_ATTN_DECODE=fp32" "LLMI_DENSE_GEMV=on" "LLMI_DENSE_GEMV=off" "LLMI_DENSE_GEMV=b1" \
            "LLMI_ATTN_TILES=sync"; do
  env "$good" "$LLMI_EMU" bench -m "$TMP/i4" --device cuda -o csv -p 4 -n 2 -b 1,4 -r 1 >"$TMP/knob.out" 2>"$TMP/knob.err" ||
    fail "$good: $(tail -2 "$TMP/knob.err")"
done
echo "kernel knobs: 7 bad values refused, 10 good ones run"

# the dense products of a one-token decode step take llmi's GEMV by default
# (LLMI_DENSE_GEMV=b1), none with =off; batch 8 never does
# gemv_launches NAME BATCH [VAR=VALUE]: the GEMV's launches in a bench run
gemv_launches() {
  env ${3:+"$3"} LLMI_EMU_STATS=1 LLMI_EMU_COUNT=llmi_gemv_bf16_kernel "$LLMI_EMU" bench -m "$M" --device cuda \
    --kv-type bf16 -o csv -p 8 -n 4 -b "$2" -r 1 >"$TMP/gemv-$1.out" 2>"$TMP/gemv-$1.err" ||
    fail "gemv $1: $(tail -2 "$TMP/gemv-$1.err")"
  sed -n 's/^EMU count: \([0-9]*\) launches of .*/\1/p' "$TMP/gemv-$1.err"
}
n=$(gemv_launches default 1)
[ "${n:-0}" -gt 0 ] || fail "gemv: the default ran no GEMV at batch 1 ($(grep EMU "$TMP/gemv-default.err" | head -2))"
for v in "off 1 LLMI_DENSE_GEMV=off" "b8 8"; do
  set -- $v
  m=$(gemv_launches "$@")
  [ "${m:-x}" = 0 ] || fail "gemv $1: $m GEMV launches, want 0"
done
echo "dense GEMV: $n launches at batch 1 by default, none with =off or at batch 8"
