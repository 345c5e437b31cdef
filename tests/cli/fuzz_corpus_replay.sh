#!/usr/bin/env bash
# The fuzz corpora as regression tests: every input of tests/fuzz/corpus/NAME (real-file
# seeds and the reproducer of every crash the campaigns found, docs/RELIABILITY.md) is fed
# once to its target, built without libFuzzer under ASan/UBSan (build-san/fuzz/NAME, made
# by `make SAN=1 tools`).  A crash, a leak, a failure without one clear line, or a broken
# property of the target fails the test.  Every target must have a corpus and a replayer.
. "$(dirname "$0")/../lib/common.sh"
cd "$(dirname "$0")/../.."
n_targets=0
for src in tests/fuzz/fuzz_*.c; do
  name=$(basename "$src" .c)
  bin=build-san/fuzz/$name corpus=tests/fuzz/corpus/$name
  [ -x "$bin" ] || fail "$bin not built (make SAN=1 tools)"
  [ -d "$corpus" ] && [ -n "$(ls "$corpus")" ] || fail "$name has no corpus in $corpus"
  out=$("$bin" "$corpus" 2>"$TMP/err"); rc=$?
  [ $rc -eq 0 ] || fail "$name: replay exited $rc: $(tail -c 3000 "$TMP/err")"
  [[ "$out" =~ ^replayed\ ([0-9]+)\ inputs$ ]] && [ "${BASH_REMATCH[1]}" -eq "$(ls "$corpus" | wc -l)" ] \
    || fail "$name: replay said '$out', corpus has $(ls "$corpus" | wc -l) files"
  echo "ok: $name: $out"
  n_targets=$((n_targets + 1))
done
[ $n_targets -ge 10 ] || fail "only $n_targets fuzz targets found (want 10)"
for d in tests/fuzz/corpus/*/; do
  [ -f "tests/fuzz/$(basename "$d").c" ] || fail "corpus $d has no target"
done
