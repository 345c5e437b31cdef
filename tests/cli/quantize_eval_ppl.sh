#!/usr/bin/env bash
# llmi quantize --eval-ppl: the perplexity of the checkpoint it wrote, read back without a
# tokenizer, equals `llmi bench -m OUTDIR --ppl` on the same text (the read-back model's
# BOS comes from the source's tokenizer; it was read from the missing one: a crash after
# the checkpoint was written).  --eval-only gives the source's, as bench --ppl does.
. "$(dirname "$0")/../lib/common.sh"
BIN="${LLMI_SAN:-$LLMI}"; [ -x "$BIN" ] || BIN="$LLMI"
SRC="$TESTDATA/hf/llama-gqa-rope3"
words=(the sea a boat river stone light wind over under blue green quiet morning)
for ((i = 0; i < 3000; i++)); do printf '%s ' "${words[(i * 7 + i / 5) % ${#words[@]}]}"; done >"$TMP/eval.txt"
ppl_of() { grep -o '^ppl [0-9.]*' | cut -d' ' -f2; }
bench_ppl() { "$LLMI" bench --device cpu -m "$1" --ppl "$TMP/eval.txt" -c 64 --chunks 2 -o csv 2>/dev/null |
              awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "ppl") c = i } NR == 2 { printf "%.4f\n", $c }'; }
out=$("$BIN" quantize --device cpu -m "$SRC" --method rtn --group-size 32 -o "$TMP/q" --eval-ppl "$TMP/eval.txt" \
      --eval-ctx 64 --eval-chunks 2 2>"$TMP/err") || fail "quantize --eval-ppl exited $?: $(tail -3 "$TMP/err")"
q=$(printf '%s\n' "$out" | ppl_of)
[ -n "$q" ] || fail "quantize --eval-ppl printed no ppl: [$out]"
[ "$q" = "$(bench_ppl "$TMP/q")" ] || fail "quantize --eval-ppl $q, bench --ppl of $TMP/q $(bench_ppl "$TMP/q")"
src=$("$BIN" quantize --device cpu -m "$SRC" --eval-only --eval-ppl "$TMP/eval.txt" --eval-ctx 64 --eval-chunks 2 |
      ppl_of) || fail "--eval-only"
[ "$src" = "$(bench_ppl "$SRC")" ] || fail "--eval-only $src, bench --ppl $(bench_ppl "$SRC")"
echo "ppl: source $src, rtn checkpoint $q (as bench --ppl reads them)"
