# Helpers for tests/cli/*.sh (sourced).  Each test exits 0 pass, 77 skip, else fail.
set -u
# The run's seed (tests/run.sh exports one per run); randomized tests draw from it and print it.
SEED="${LLMI_TEST_SEED:-$RANDOM}"
# Files a failing test keeps: fail copies them out of $TMP and says where, with the seed.
KEEP=()
fail() {
  echo "FAIL: $*" >&2
  if [ ${#KEEP[@]} -gt 0 ]; then
    local d; d=$(mktemp -d /tmp/llmi-kept-XXXXXX) && cp -r "${KEEP[@]}" "$d/" \
      && echo "kept for replay in $d (seed $SEED): $(cd "$d" && ls | tr '\n' ' ')" >&2
  fi
  exit 1
}
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

# The CPU emulation of CUDA's llmi (build-emu/llmi, tests/cuda-emu), for the cuda_emu_* tests.
need_emu() { [ -x "$LLMI_EMU" ] || fail "$LLMI_EMU not built (make emu)"; }
# emu_run NAME ARGS...: runs it with ARGS, stdout to $TMP/NAME.out, stderr (with the
# emulator's "EMU stats" line) to $TMP/NAME.err; fails on a non-zero exit or an emulator error.
emu_run() {
  local name=$1; shift
  LLMI_EMU_STATS=1 "$LLMI_EMU" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" ||
    fail "emulated run '$name' exited $?: $(grep -m3 -E 'EMU|ERROR|error|llmi' "$TMP/$name.err")"
  ! grep -q "EMU ERROR" "$TMP/$name.err" || fail "$name: $(grep -m3 'EMU ERROR' "$TMP/$name.err")"
}

# prompt_cache_apart WHAT "FLAGS" ARGS...: llmi ARGS (a generate with --json and
# --prompt-cache DIR) three times: plain, then twice with FLAGS (word-split: e.g. an
# adapter); the first FLAGS run must take nothing of the plain run's cached K/V (FLAGS change
# the weights), the second must find the first's.
prompt_cache_apart() {
  local what=$1 extra=$2; shift 2
  "$LLMI" "$@" >"$TMP/pc1.out" || fail "prompt cache: plain run"
  # shellcheck disable=SC2086
  "$LLMI" "$@" $extra >"$TMP/pc2.out" || fail "prompt cache: $what run"
  # shellcheck disable=SC2086
  "$LLMI" "$@" $extra >"$TMP/pc3.out" || fail "prompt cache: second $what run"
  python3 - "$TMP" "$what" <<'PY' || fail "prompt cache with $what"
import json, sys
d, what = sys.argv[1], sys.argv[2]
c = [[json.loads(l)["cached_tokens"] for l in open(f"{d}/pc{i}.out")] for i in (1, 2, 3)]
assert sum(c[1]) == 0, f"{what} took the plain model's cached K/V: {c[1]}"
assert sum(c[2]) > 0, f"the second {what} run found nothing of the first's: {c[2]}"
print(f"prompt cache: cached tokens plain {c[0]}, first {what} run {c[1]}, second {c[2]}")
PY
}
