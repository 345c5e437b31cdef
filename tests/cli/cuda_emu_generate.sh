#!/usr/bin/env bash
# The CUDA backend end to end on the CPU emulation of CUDA (build-emu/llmi, tests/cuda-emu):
# greedy generation with --device cuda against --device cpu by gpu-check's rule
# (scripts/gpu-compare.py: identical up to a first difference where each side's token is in
# the other's top 5), three ways: batched with CUDA graphs for the decode steps; with chunked
# prefill and a KV cache too small for all requests (the scheduler must preempt, and the
# graph path sees tables and slots change under it); with prompt-lookup speculation (the
# verification steps' several logit rows a sequence).  This runs the backend's host code
# (metadata uploads, graph capture and replay, device sampling, copies and their ordering)
# and the kernels' logic; it says nothing of GPU timing or memory ordering (docs/TESTING.md).
# Prompts: wikitext-2 lines drawn with the run's seed; kept on failure.
. "$(dirname "$0")/../lib/common.sh"
need_emu
M="$TESTDATA/hf/llama-gqa-rope3"
N=12 NGEN=32
echo "seed $SEED"
KEEP=("$TMP/prompts.txt")
python3 - "$SHARED/data/wikitext-2-raw/wiki.test.raw" "$TMP/prompts.txt" $N "$SEED" <<'PY' || fail "making prompts"
import random, sys
lines = [l.strip() for l in open(sys.argv[1], encoding="utf-8") if len(l.strip()) > 40 and not l.startswith(" =")]
rnd = random.Random(int(sys.argv[4]))
# the tiny model holds 256 positions: prompts of up to ~150 tokens leave room for the output
out = [" ".join(rnd.choice(lines).split()[:rnd.choice([2, 4, 7, 12, 20, 28])]) for _ in range(int(sys.argv[3]))]
open(sys.argv[2], "w", encoding="utf-8").write("\n".join(out) + "\n")
PY
gen=(generate -m "$M" --prompts "$TMP/prompts.txt" -n $NGEN --temp 0 --ignore-eos --logprobs 5 --json --no-stats)
# the emulator's own checks (a divergent warp operation, a copy in the wrong direction, a
# synchronising call during capture, ...) print "EMU ERROR" and make it exit 97
emu() { local name=$1; shift; emu_run "$name" "${gen[@]}" --device cuda "$@"; }
compare() {
  python3 scripts/gpu-compare.py "$TMP/cpu.json" "$TMP/$1.out" >"$TMP/$1.cmp" 2>&1 ||
    { KEEP+=("$TMP/cpu.json" "$TMP/$1.out" "$TMP/$1.cmp"); fail "$1: cuda vs cpu: $(grep -m3 -E '^FAIL|^summary' "$TMP/$1.cmp")"; }
  echo "$1: $(grep -m1 '^summary' "$TMP/$1.cmp")"
}
"$LLMI" "${gen[@]}" --device cpu >"$TMP/cpu.json" 2>"$TMP/cpu.err" || fail "cpu run: $(head -3 "$TMP/cpu.err")"
# (the prompts of 16 tokens and more take the prefill kernel, its tiles by cp.async: the
# default for the bf16 cache)
LLMI_EMU_COUNT="llmi_attn_prefill_kernel<T, HDMAX, true>" emu batched
compare batched
graphs=$(sed -n 's/^EMU stats: .* \([0-9]*\) graph launches$/\1/p' "$TMP/batched.err")
[ "${graphs:-0}" -gt 0 ] || fail "batched: no decode step ran as a CUDA graph ($(grep 'EMU stats' "$TMP/batched.err"))"
echo "batched: $(grep 'EMU stats' "$TMP/batched.err")"
pf=$(sed -n 's/^EMU count: \([0-9]*\) launches of .*/\1/p' "$TMP/batched.err")
[ "${pf:-0}" -gt 0 ] || fail "batched: no prefill by cp.async ran ($(grep 'EMU' "$TMP/batched.err" | head -2))"
echo "batched: $pf launches of the prefill with cp.async tiles"
# 12 blocks of 16 positions hold about a third of what 12 requests reach: preemption
emu preempt --max-seqs $N --max-batch-tokens 64 --prefill-chunk 16 --num-blocks 12 --block-size 16
compare preempt
pre=$(grep -oE '"preempted":[0-9]+' "$TMP/preempt.out" | awk -F: '{s += $2} END {print s + 0}')
[ "$pre" -gt 0 ] || fail "preempt: no request was preempted with 12 KV blocks"
echo "preempt: $pre preemptions"
emu spec --spec ngram --spec-k 4
compare spec
# the dense projections on llmi's GEMV (LLMI_DENSE_GEMV=on) where a step has at most
# LLMI_GEMV_MAX_N (4) tokens: with 4 sequences at a time every decode step's linears and
# lm_head take it, in the graphs and out of them
export LLMI_DENSE_GEMV=on LLMI_EMU_COUNT=llmi_gemv_bf16_kernel
emu gemv --max-seqs 4
unset LLMI_DENSE_GEMV LLMI_EMU_COUNT
compare gemv
gemv=$(sed -n 's/^EMU count: \([0-9]*\) launches of .*/\1/p' "$TMP/gemv.err")
[ "${gemv:-0}" -gt 0 ] || fail "gemv: LLMI_DENSE_GEMV=on ran no GEMV ($(grep 'EMU' "$TMP/gemv.err" | head -2))"
echo "gemv: $gemv GEMV launches"
