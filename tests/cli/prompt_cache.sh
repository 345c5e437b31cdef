#!/usr/bin/env bash
# --prompt-cache DIR: a second run of the same ~1000-token preamble reuses its K/V from
# disk and generates the same tokens; corrupt, truncated, foreign-model and wrong-dtype
# entries each cost one warning line and a recompute, never a wrong token or a failure;
# another KV dtype never reuses entries; concurrent writers leave only whole entries;
# --prompt-cache-max keeps the directory under its cap.
. "$(dirname "$0")/../lib/common.sh"
need_model
python3 - "$SHARED/data/wikitext-2-raw/wiki.test.raw" "$TMP/prompt.txt" <<'PY'
import sys
lines = [l.strip() for l in open(sys.argv[1], encoding="utf-8") if len(l.strip()) > 300 and not l.startswith(" =")]
text = ""
for l in lines[40:]:
    if len(text) > 4200: break      # ~1000 SmolLM2 tokens
    text += l + "\n"
open(sys.argv[2], "w", encoding="utf-8").write(text + "\nSummarize the text above in one sentence:")
PY
D="$TMP/cache"
gen() {  # gen NAME [flags]: greedy 8 tokens of the preamble prompt as JSON, stderr kept
  local name=$1; shift
  "$LLMI" generate --device cpu -m "$MODEL" -f "$TMP/prompt.txt" -n 8 --temp 0 --ignore-eos --json --no-stats \
    "$@" >"$TMP/$name.json" 2>"$TMP/$name.err" || fail "$name: exit $?: $(tail -c 800 "$TMP/$name.err")"
}
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$TMP/$1.json" "$2"; }
same_tokens() { [ "$(field "$1" tokens)" = "$(field base tokens)" ] || fail "$1: tokens differ from the uncached run"; }
warnings() { grep -c "prompt-cache" "$TMP/$1.err" || true; }

gen base --no-prefix-cache
gen first --prompt-cache "$D"
same_tokens first
[ "$(field first cached_tokens)" = 0 ] || fail "first run found cached tokens in an empty directory"
n_entries=$(ls "$D" | grep -c '\.kvb$')
[ "$n_entries" -ge 50 ] || fail "expected ~60 block entries, found $n_entries"
gen second --prompt-cache "$D"
same_tokens second
cached=$(field second cached_tokens); prompt=$(field second prompt_tokens)
[ "$cached" -ge $((prompt - 16)) ] || fail "second run reused $cached of $prompt tokens"
[ "$(warnings second)" = 0 ] || fail "second run warned: $(cat "$TMP/second.err")"
echo "second run: $cached of $prompt prompt tokens from $D ($n_entries entries); ttft $(field first ttft_ms) -> $(field second ttft_ms) ms"

# Damage one entry in the middle of the chain each way: one warning, same tokens, exit 0.
damage() {  # damage HOW: edit the 20th entry of the chain (by the file order of the first run)
  python3 - "$D" "$1" <<'PY'
import os, sys, struct
d, how = sys.argv[1], sys.argv[2]
files = sorted((os.path.getmtime(os.path.join(d, f)), f) for f in os.listdir(d) if f.endswith(".kvb"))
path = os.path.join(d, files[19][1])
b = bytearray(open(path, "rb").read())
if how == "corrupt":   b[-40] ^= 0x5a                     # inside the zstd frame
elif how == "truncated": b = b[: len(b) // 2]
elif how == "foreign": b[16] ^= 1                          # model fingerprint
elif how == "dtype":   b[32:36] = struct.pack("<I", 1)     # f16 in an f32 cache
open(path, "wb").write(b)
PY
}
for how in corrupt truncated foreign dtype; do
  gen "$how-fill" --prompt-cache "$D"     # make sure the chain is whole again
  damage "$how"
  gen "$how" --prompt-cache "$D"
  same_tokens "$how"
  [ "$(warnings "$how")" = 1 ] || fail "$how: want exactly one warning, got: $(cat "$TMP/$how.err")"
  c=$(field "$how" cached_tokens)
  [ "$c" -lt "$cached" ] || fail "$how: the damaged entry was used ($c tokens cached)"
  echo "$how: $(grep prompt-cache "$TMP/$how.err" | sed 's/.*(\(.*\)).*/\1/'); $c tokens still reused"
done

# Another KV dtype names its blocks differently: nothing reused, nothing wrong.
gen f16-base --kv-type f16 --no-prefix-cache
gen f16 --kv-type f16 --prompt-cache "$D"
[ "$(field f16 cached_tokens)" = 0 ] || fail "an f16 run reused f32 entries"
[ "$(field f16 tokens)" = "$(field f16-base tokens)" ] || fail "f16 run with a cache of f32 entries differs"

# Two writers at once into a fresh directory, then a reader: whole entries only.
D2="$TMP/shared"
"$LLMI" generate --device cpu -m "$MODEL" -f "$TMP/prompt.txt" -n 8 --temp 0 --ignore-eos --json --no-stats \
  --prompt-cache "$D2" >"$TMP/w1.json" 2>"$TMP/w1.err" &
p1=$!
"$LLMI" generate --device cpu -m "$MODEL" -f "$TMP/prompt.txt" -n 8 --temp 0 --ignore-eos --json --no-stats \
  --prompt-cache "$D2" >"$TMP/w2.json" 2>"$TMP/w2.err" &
p2=$!
wait $p1 || fail "writer 1 failed: $(cat "$TMP/w1.err")"
wait $p2 || fail "writer 2 failed: $(cat "$TMP/w2.err")"
same_tokens w1; same_tokens w2
[ -z "$(ls -A "$D2" | grep -v '\.kvb$')" ] || fail "temporary files left in $D2: $(ls -A "$D2" | grep -v '\.kvb$')"
gen reader --prompt-cache "$D2"
same_tokens reader
[ "$(warnings reader)" = 0 ] || fail "reader warned after concurrent writers: $(cat "$TMP/reader.err")"
[ "$(field reader cached_tokens)" -ge $((prompt - 16)) ] || fail "reader did not reuse the writers' entries"

# The size cap: a directory capped at 8 MiB holds at most that after a run.
D3="$TMP/capped"
gen capped --prompt-cache "$D3" --prompt-cache-max 8M
same_tokens capped
bytes=$(du -sb "$D3" | cut -f1)
[ "$bytes" -le $((8 * 1024 * 1024)) ] || fail "capped directory holds $bytes bytes"
echo "concurrent writers + reader ok; capped directory $bytes bytes"
