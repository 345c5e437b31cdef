#!/usr/bin/env bash
# Issue 15, item 4: clean failure on every path.  Out of memory for the KV pool and the
# activations (ulimit -v), output on a full device (/dev/full; quantize past a file-size
# limit, ulimit -f, as a full filesystem would stop it), SIGINT and SIGTERM during
# quantize (nothing written, no temporary directory left), a bench sweep (the rows so far)
# and --prompts generation (the outputs finished so far kept, each whole).  Each: one
# clear line, the documented exit code (1 error, 130 SIGINT, 143 SIGTERM).
# A model file truncated before use is refused by its size (tests/test_loader.c
# loader_gguf_truncated_everywhere, tests/cli/bad_model_files.sh); one truncated while
# generate has it mapped gives one line naming it and exit 1, not a bus-error crash.
. "$(dirname "$0")/../lib/common.sh"
need_model
CFG="$TESTDATA/quant/tiny-config.json"
TINY_BENCH="$TESTDATA/bench/tiny-llama.json"

# --- out of memory: the KV pool, then the activations (CUDA libraries need ~2 GB mapped)
( ulimit -v 3000000; expect_error "cannot allocate" "$LLMI" generate --device cpu -m "$MODEL" -p hi -n 2 --kv-mem 6G ) || exit 1
( ulimit -v 3000000; expect_error "cannot allocate" "$LLMI" generate --device cpu -m "$MODEL" -p hi -n 2 \
    --max-batch-tokens 1048576 --kv-mem 64M ) || exit 1

# --- stdout on a full device
# one_line_error WORD RC_WANT CMD...: stdout to $STDOUT (default /dev/full); exactly one
# error line ('llmi: ...WORD'; quantize's progress lines may precede it)
one_line_error() {
  local word=$1 want=$2 out=${STDOUT:-/dev/full}; shift 2
  "$@" </dev/null >"$out" 2>"$TMP/err"; local rc=$?
  [ $rc -eq "$want" ] || fail "'$*' >$out exited $rc (want $want): $(cat "$TMP/err")"
  [ "$(grep -c '^llmi: ' "$TMP/err")" -eq 1 ] && grep -q "^llmi: .*$word" "$TMP/err" ||
    fail "'$*' >$out: want one 'llmi: ...$word' line: $(cat "$TMP/err")"
  echo "ok: $* >$out -> rc=$rc: $(grep '^llmi: ' "$TMP/err")"
}
one_line_error "cannot write to stdout: No space left on device" 1 \
    "$LLMI" generate --device cpu -m "$MODEL" -p hi -n 4 --no-stats
printf 'one\ntwo\nthree\n' >"$TMP/p.txt"
one_line_error "cannot write to stdout: No space left on device" 1 \
    "$LLMI" generate --device cpu -m "$MODEL" --prompts "$TMP/p.txt" -n 4 --json --no-stats
one_line_error "cannot write the report to stdout" 1 "$LLMI" bench --device cpu --dummy "$TINY_BENCH" -p 8 -n 4 -r 1 -o json

# --- quantize past a file-size limit: the write fails, nothing is left behind
mkdir "$TMP/q"
( ulimit -f 16; STDOUT=/dev/null one_line_error "File too large" 1 "$LLMI" quantize --dummy "$CFG" --method rtn --group-size 32 -o "$TMP/q/out" ) || exit 1
[ -z "$(ls -A "$TMP/q")" ] || fail "quantize past the file-size limit left: $(ls -A "$TMP/q")"
"$LLMI" quantize --dummy "$CFG" --method rtn --group-size 32 -o "$TMP/q/out" 2>/dev/null ||
    fail "quantize without the limit failed"   # the limit, not the run, was the failure
rm -rf "$TMP/q/out"

# --- signals.  stop_after SIG SECS CMD...: runs CMD (stdout $TMP/s.out, stderr $TMP/s.err),
# sends SIG after SECS seconds, sets rc
stop_after() {
  local sig=$1 secs=$2; shift 2
  "$@" </dev/null >"$TMP/s.out" 2>"$TMP/s.err" &
  local pid=$!
  sleep "$secs"
  kill -"$sig" $pid
  wait $pid; rc=$?
}
for sig in INT TERM; do
  want=$([ $sig = INT ] && echo 130 || echo 143)
  # a sweep of 64 rows of thousands of steps: the rows done so far
  stop_after $sig 6 "$LLMI" bench --dummy "$TINY_BENCH" -p 8,16,24,32,40,48,56,64 -n 900 -b 1,2,3,4,5,6,7,8 -r 5 -t 1
  [ $rc -eq $want ] || fail "SIG$sig in a bench sweep: exit $rc (want $want): $(cat "$TMP/s.err")"
  rows=$(grep -c "^| tiny-llama.json" "$TMP/s.out")
  [ "$rows" -ge 1 ] && [ "$rows" -lt 64 ] || fail "SIG$sig in a bench sweep: $rows rows (want 1..63)"
  echo "ok: SIG$sig in a bench sweep -> rc=$rc, $rows of 64 rows"
  # --prompts, one sequence at a time: the requests answered so far, each a whole JSON line
  for i in $(seq 1 400); do echo "story number $i"; done >"$TMP/many.txt"
  stop_after $sig 6 "$LLMI" generate --device cpu -m "$MODEL" --prompts "$TMP/many.txt" -n 40 \
      --ignore-eos --max-seqs 1 --json
  [ $rc -eq $want ] || fail "SIG$sig in generate --prompts: exit $rc (want $want): $(tail -3 "$TMP/s.err")"
  python3 - "$TMP/s.out" <<'PY' || fail "SIG$sig in generate --prompts: the outputs kept are not whole"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
recs = [json.loads(l) for l in lines]
assert [r["index"] for r in recs] == list(range(400)), "every request answered once, in order"
done = [r for r in recs if r["finish_reason"] == "length"]
assert 1 <= len(done) < 400 and all(r["generated_tokens"] == 40 for r in done), [r["generated_tokens"] for r in done]
rest = [r for r in recs if r["finish_reason"] != "length"]
assert all(r["finish_reason"] == "abort" and r["generated_tokens"] < 40 for r in rest), rest[:2]
print(f"  {len(done)} of 400 requests kept whole; {len(rest)} cut short, marked abort")
PY
  echo "ok: SIG$sig in generate --prompts -> rc=$rc"
done

# quantize (GPTQ calibration on SmolLM2 takes long enough to be interrupted)
CALIB="$SHARED/data/tinyshakespeare/input.txt"
[ -f "$CALIB" ] || CALIB=$(find "$SHARED/data" -name input.txt | head -1)
for sig in INT TERM; do
    want=$([ $sig = INT ] && echo 130 || echo 143)
    mkdir -p "$TMP/qs"
    stop_after $sig 4 "$LLMI" quantize -m "$MODEL" --method gptq --group-size 64 --calib "$CALIB" --nsamples 8 \
        --seqlen 256 -o "$TMP/qs/out"
    [ $rc -eq $want ] || fail "SIG$sig in quantize: exit $rc (want $want): $(tail -3 "$TMP/s.err")"
    grep -q "interrupted; .* not written" "$TMP/s.err" || fail "SIG$sig in quantize: stderr: $(tail -3 "$TMP/s.err")"
    [ -z "$(ls -A "$TMP/qs")" ] || fail "SIG$sig in quantize left: $(ls -A "$TMP/qs")"
    echo "ok: SIG$sig in quantize -> rc=$rc, nothing left in the output's directory"
done

# a model file truncated while in use: the next read of a lost page is a bus error, which
# llmi reports as one line naming the file and exit 1 (whenever the truncation lands: during
# the load, the repacking or the decoding that reads embedding rows from the mapping)
cp "$MODEL" "$TMP/trunc.gguf"
"$LLMI" generate -m "$TMP/trunc.gguf" -p "Once upon a time" -n 5000 --ignore-eos --temp 0.8 -s 1 --no-stats \
    >"$TMP/t.out" 2>"$TMP/t.err" &
pid=$!
sleep 1
truncate -s 65536 "$TMP/trunc.gguf"
wait $pid; rc=$?
[ $rc -eq 1 ] || fail "model truncated while in use: exit $rc (want 1): $(tail -3 "$TMP/t.err")"
[ "$(wc -l <"$TMP/t.err")" -eq 1 ] || fail "model truncated while in use: stderr: $(cat "$TMP/t.err")"
grep -q "trunc.gguf: truncated" "$TMP/t.err" || fail "model truncated while in use: stderr: $(cat "$TMP/t.err")"
echo "ok: model truncated while in use -> rc=$rc: $(cat "$TMP/t.err")"
