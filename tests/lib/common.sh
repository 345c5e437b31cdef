# Helpers for tests/cli/*.sh (sourced).  Each test exits 0 pass, 77 skip, else fail.
set -u
fail() { echo "FAIL: $*" >&2; exit 1; }
need_model() { [ -f "$MODEL" ] || { echo "default model missing ($MODEL): run scripts/fetch-model.sh"; exit 77; }; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# expect_error EXPECTED_WORD CMD...: the command must exit 1 or 2, print exactly one line on
# stderr that contains EXPECTED_WORD, print nothing on stdout, and not crash (ASan exit 99, UBSan 98).
expect_error() {
  local word="$1"; shift
  local out="$TMP/out" err="$TMP/err" rc
  "$@" </dev/null >"$out" 2>"$err"; rc=$?
  [ $rc -eq 1 ] || [ $rc -eq 2 ] || fail "'$*' exited $rc (want 1 or 2); stderr: $(head -c 2000 "$err")"
  [ ! -s "$out" ] || fail "'$*' wrote to stdout: $(head -c 300 "$out")"
  [ "$(wc -l <"$err")" -eq 1 ] || fail "'$*' printed $(wc -l <"$err") stderr lines (want 1): $(head -c 2000 "$err")"
  grep -qF -- "$word" "$err" || fail "'$*' error does not mention '$word': $(cat "$err")"
  echo "ok: $* -> rc=$rc: $(cat "$err")"
}
