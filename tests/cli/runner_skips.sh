#!/usr/bin/env bash
# tests/run.sh itself: a skip is counted as a skip (never a pass) and fails the suite unless
# LLMI_ALLOW_SKIP=1 (README, "Testing"; issue 17).  The runner is copied into a scratch tree
# with stub tests whose outcomes are fixed here: a unit binary reporting 3 passed and 2
# skipped, one CLI script that passes and one that exits 77; a visible GPU (a stub
# nvidia-smi) with no CUDA build must also count as a skip.  Checked: the summary line
# and the exit status.  And the unit runner counts a real SKIP as a skip.
. "$(dirname "$0")/../lib/common.sh"
R="$TMP/tree"
mkdir -p "$R/tests/cli" "$R/scripts" "$R/build-san" "$R/build" "$R/build-emu" "$R/bin"
cp "$(dirname "$0")/../run.sh" "$R/tests/run.sh"
printf '#!/bin/sh\necho /nonexistent-model.gguf\n' >"$R/scripts/fetch-model.sh"
printf '#!/bin/sh\necho "ok   a"\necho "skip b"\necho "3 passed, 0 failed, 2 skipped"\n' >"$R/build-san/llmi_tests"
# The CUDA build's unit binary (with a GPU) and the emulated one (without) add nothing, so
# the counts hold with or without a GPU here.
printf '#!/bin/sh\necho "0 passed, 0 failed, 0 skipped"\n' >"$R/build/llmi_tests"
cp "$R/build/llmi_tests" "$R/build-emu/llmi_tests"
printf '#!/bin/sh\nexit 0\n' >"$R/tests/cli/a_pass.sh"
printf '#!/bin/sh\necho "no reference here"\nexit 77\n' >"$R/tests/cli/b_skip.sh"
chmod +x "$R/scripts/fetch-model.sh" "$R/build-san/llmi_tests" "$R/build/llmi_tests" "$R/build-emu/llmi_tests"

# run_case NAME WANT_RC WANT_SUMMARY [ENV...] -- [RUN.SH ARGS...]
run_case() {
  local name=$1 want_rc=$2 want=$3; shift 3
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  env -u LLMI_ALLOW_SKIP "${envs[@]}" bash "$R/tests/run.sh" "$@" >"$TMP/$name.out" 2>&1
  local rc=$?
  local last; last=$(tail -n 1 "$TMP/$name.out")
  [[ "$last" == "$want"* ]] || fail "$name: summary '$last', want '$want...'; output: $(cat "$TMP/$name.out")"
  if [ "$want_rc" = nonzero ]; then [ $rc -ne 0 ] || fail "$name: exited 0, want a failure; output: $(cat "$TMP/$name.out")"
  else [ $rc -eq "$want_rc" ] || fail "$name: exited $rc, want $want_rc; output: $(cat "$TMP/$name.out")"; fi
  echo "ok: $name -> rc=$rc, $last"
}
run_case skips nonzero "4 passed, 0 failed, 3 skipped" --
grep -q "skips fail the suite" "$TMP/skips.out" || fail "no line saying why the suite failed"
run_case allowed 0 "4 passed, 0 failed, 3 skipped" LLMI_ALLOW_SKIP=1 --
run_case cli_only nonzero "0 passed, 0 failed, 1 skipped" -- b_skip
run_case cli_pass 0 "1 passed, 0 failed, 0 skipped" -- a_pass
# A GPU that no CUDA build tests is a skip.
rm "$R/build/llmi_tests"
printf '#!/bin/sh\necho "GPU 0: stub"\n' >"$R/bin/nvidia-smi"
chmod +x "$R/bin/nvidia-smi"
run_case gpu_no_build nonzero "0 passed, 0 failed, 1 skipped" "PATH=$R/bin:$PATH" -- cuda
# The unit runner's own count (tests/test_main.c), on a real test that must skip: the
# loader's real-model test with MODEL pointing nowhere.
U="$(dirname "$0")/../../build-san/llmi_tests"
[ -x "$U" ] || fail "$U not built (make SAN=1 tools)"
MODEL=/nonexistent-model.gguf "$U" loader_real_smollm2_gguf >"$TMP/unit.out" 2>&1
rc=$?
grep -q '^skip loader_real_smollm2_gguf$' "$TMP/unit.out" && [ "$(tail -n 1 "$TMP/unit.out")" = "0 passed, 0 failed, 1 skipped" ] \
  || fail "unit runner: a skipped test is not counted as skipped (rc=$rc): $(cat "$TMP/unit.out")"
echo "ok: unit runner counts the skip: $(tail -n 1 "$TMP/unit.out")"
