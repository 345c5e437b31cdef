#!/usr/bin/env bash
# The progress bar goes to stderr only when it is a terminal (sweep, throughput, --ppl;
# a pseudo-terminal from script(1)), stdout stays clean; Ctrl-C prints the rows measured
# so far and exits 130.
. "$(dirname "$0")/../lib/common.sh"
CFG="$TESTDATA/bench/tiny-llama.json"
command -v script >/dev/null || { echo "script(1) missing (util-linux): no terminal to test the bar on"; exit 77; }
tty_run() {  # tty_run NAME CMD...: stdout to $TMP/NAME.out, the terminal's text to $TMP/NAME.tty
  local name=$1; shift
  script -qec "$* >$TMP/$name.out" "$TMP/$name.tty" >/dev/null </dev/null || fail "$name under a terminal: $(tail -c 300 "$TMP/$name.tty")"
}
tty_run sweep "$LLMI" bench --dummy "$CFG" -p 16 -n 8 -b 1,2 -r 2 -t 1 -o json
tty_run tp "$LLMI" bench --dummy "$CFG" --num-requests 20 --input-len 8 --output-len 4 -t 1 -o json
for n in sweep tp; do
  grep -q "bench \[=*>* *\] [0-9]*/[0-9]*" "$TMP/$n.tty" || fail "$n: no progress bar on the terminal: $(head -c 300 "$TMP/$n.tty")"
  python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$TMP/$n.out" || fail "$n: stdout is not clean JSON"
  ! grep -q $'\r' "$TMP/$n.out" || fail "$n: a carriage return on stdout"
done
grep -q "bench \[=*\] 6/6" "$TMP/sweep.tty" || fail "sweep bar never reached 6/6 (2 rows x (2 runs + 1 warm-up))"
if [ -f "$MODEL" ]; then
  tty_run ppl "$LLMI" bench -m "$MODEL" --ppl "$TESTDATA/bench/ppl-sample.txt" -c 64 --chunks 3 -t 2 -o json
  grep -q "perplexity \[=*\] 3/3  PPL [0-9.]*" "$TMP/ppl.tty" || fail "--ppl: no bar with the running PPL: $(head -c 400 "$TMP/ppl.tty")"
  ! grep -q "\[1\][0-9.]*," "$TMP/ppl.tty" || fail "--ppl printed the log-style estimate on a terminal"
  "$LLMI" bench -m "$MODEL" --ppl "$TESTDATA/bench/ppl-sample.txt" -c 64 --chunks 3 -t 2 -o json >/dev/null 2>"$TMP/ppl.err"
  grep -q "\[1\][0-9.]*,\[2\]" "$TMP/ppl.err" && ! grep -q "perplexity \[" "$TMP/ppl.err" || fail "--ppl log: $(cat "$TMP/ppl.err")"
fi
echo "progress bar on a terminal, nothing on a pipe"
# Ctrl-C in a sweep of 64 rows of at least 6 x 900 steps each: the rows done so far, exit 130.
"$LLMI" bench --dummy "$CFG" -p 8,16,24,32,40,48,56,64 -n 900 -b 1,2,3,4,5,6,7,8 -r 5 -t 1 >"$TMP/i.md" 2>"$TMP/i.err" &
pid=$!
sleep 8   # a few rows, far from 64
kill -INT $pid
wait $pid; rc=$?
[ $rc -eq 130 ] || fail "Ctrl-C exit code $rc (want 130); stderr: $(cat "$TMP/i.err")"
rows=$(grep -c "^| tiny-llama.json" "$TMP/i.md")
[ "$rows" -ge 1 ] && [ "$rows" -lt 64 ] || fail "$rows rows after Ctrl-C (want 1..63): $(cat "$TMP/i.md")"
grep -q "interrupted; the report has the $rows row(s)" "$TMP/i.err" || fail "stderr: $(cat "$TMP/i.err")"
echo "Ctrl-C: exit 130, $rows of 64 rows printed"
# Ctrl-C in an offline run: one row of the requests finished so far.
"$LLMI" bench --dummy "$CFG" --num-requests 200000 --input-len 16 --output-len 16 -t 1 -o json >"$TMP/t.json" 2>"$TMP/t.err" &
pid=$!
sleep 4
kill -INT $pid
wait $pid; rc=$?
[ $rc -eq 130 ] || fail "Ctrl-C (throughput) exit code $rc; stderr: $(cat "$TMP/t.err")"
python3 - "$TMP/t.json" <<'PY' || exit 1
import json, sys
r = json.load(open(sys.argv[1]))[0]
assert 0 < r["num_requests"] < 200000 and r["output_tokens"] == 16 * r["num_requests"], r
print("Ctrl-C (throughput): a row of", r["num_requests"], "finished requests")
PY
