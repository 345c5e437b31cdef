#!/usr/bin/env bash
# The whole test suite: unit tests (under ASan/UBSan), then every tests/cli/*.sh.
# A CLI test is a script that exits 0 on pass, 77 to skip; it gets
#   LLMI      the optimized binary      LLMI_SAN  the ASan/UBSan binary
#   MODEL     the default SmolLM2 GGUF  TESTDATA  testdata/    SHARED  ../shared
# Ends with the line "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
export LLMI="$PWD/llmi" LLMI_SAN="$PWD/llmi-san" TESTDATA="$PWD/testdata" SHARED="$(cd .. && pwd)/shared"
export MODEL="${MODEL:-$(scripts/fetch-model.sh --path)}"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=99" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=98"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
# Spinning OpenMP workers collapse when the cores are shared (a busy CI host, parallel
# jobs): sleeping waits keep the suite's run time predictable.  Speed is measured by
# benchmarks, not here.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
passed=0; failed=0; skipped=0; failed_names=()
filter="${1:-}"

echo "== unit tests (ASan/UBSan build)"
if [ -z "$filter" ] || [ "$filter" = unit ]; then
  out=$(build-san/llmi_tests 2>&1); rc=$?
  echo "$out" | grep -v '^ok  ' 
  last=$(echo "$out" | tail -n 1)
  if [[ "$last" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
    passed=$((passed + BASH_REMATCH[1])); failed=$((failed + BASH_REMATCH[2]))
    [ "${BASH_REMATCH[2]}" -gt 0 ] && failed_names+=("unit: $(echo "$out" | grep '^FAIL' | tr '\n' ' ')")
  fi
  if [ $rc -ne 0 ] && ! [[ "$last" =~ failed$ ]]; then
    failed=$((failed + 1)); failed_names+=("unit tests crashed (rc=$rc)")
  fi
fi

echo "== cli tests"
for t in tests/cli/*.sh; do
  name=$(basename "$t" .sh)
  [ -n "$filter" ] && [ "$filter" != unit ] && [[ "$name" != *"$filter"* ]] && continue
  [ -n "$filter" ] && [ "$filter" = unit ] && continue
  start=$(date +%s)
  log=$(mktemp)
  bash "$t" >"$log" 2>&1; rc=$?
  secs=$(( $(date +%s) - start ))
  if [ $rc -eq 0 ]; then
    echo "ok   $name (${secs}s)"; passed=$((passed + 1))
  elif [ $rc -eq 77 ]; then
    echo "skip $name: $(tail -n 1 "$log")"; skipped=$((skipped + 1))
  else
    echo "FAIL $name (rc=$rc, ${secs}s)"; tail -n 30 "$log" | sed 's/^/    /'
    failed=$((failed + 1)); failed_names+=("$name")
  fi
  rm -f "$log"
done

[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
if [ $skipped -gt 0 ]; then echo "$passed passed, $failed failed, $skipped skipped"; else echo "$passed passed, $failed failed"; fi
[ $failed -eq 0 ]
