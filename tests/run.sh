#!/usr/bin/env bash
# The whole test suite: unit tests (under ASan/UBSan), the CUDA unit tests (from the CUDA
# build when a GPU is visible, else from the CPU emulation of CUDA, build-emu), then every
# tests/cli/*.sh.
# A CLI test is a script that exits 0 on pass, 77 to skip; it gets
#   LLMI      the optimized binary      LLMI_SAN  the ASan/UBSan binary
#   LLMI_EMU  the CUDA build on the CPU emulation (build-emu/llmi)
#   MODEL     the default SmolLM2 GGUF  TESTDATA  testdata/    SHARED  ../shared
# Ends with the line "N passed, N failed, N skipped".  A skip is not a pass: the suite
# fails when anything skipped, unless LLMI_ALLOW_SKIP=1.  Without a visible GPU the CUDA
# unit tests run on the emulation only, and the summary says so.
set -u
cd "$(dirname "$0")/.."
export LLMI="$PWD/llmi" LLMI_SAN="$PWD/llmi-san" LLMI_EMU="$PWD/build-emu/llmi" TESTDATA="$PWD/testdata" SHARED="$(cd .. && pwd)/shared"
export MODEL="${MODEL:-$(scripts/fetch-model.sh --path)}"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=99" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=98"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
# Spinning OpenMP workers collapse when the cores are shared (a busy CI host, parallel
# jobs): sleeping waits keep the suite's run time predictable.  Speed is measured by
# benchmarks, not here.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
# One seed for every randomized test of this run (unit and CLI), printed so that a
# failure can be replayed: LLMI_TEST_SEED=N bash tests/run.sh NAME.
export LLMI_TEST_SEED="${LLMI_TEST_SEED:-$(( ($(date +%s%N) / 1000) % 1000000000000 ))}"
passed=0; failed=0; skipped=0; failed_names=(); skipped_names=(); notes=()
filter="${1:-}"
t_suite=$(date +%s)
echo "== seed $LLMI_TEST_SEED (replay with LLMI_TEST_SEED=$LLMI_TEST_SEED)"

# unit_run LABEL BINARY [FILTER...]: runs a unit-test binary and adds its summary line.
unit_run() {
  local label=$1 bin=$2; shift 2
  if [ ! -x "$bin" ]; then
    echo "FAIL $label: $bin not built"; failed=$((failed + 1)); failed_names+=("$label: not built"); return
  fi
  local out rc last
  out=$("$bin" "$@" 2>&1); rc=$?
  echo "$out" | grep -v '^ok  '
  last=$(echo "$out" | tail -n 1)
  if [[ "$last" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed,\ ([0-9]+)\ skipped$ ]]; then
    passed=$((passed + BASH_REMATCH[1])); failed=$((failed + BASH_REMATCH[2])); skipped=$((skipped + BASH_REMATCH[3]))
    [ "${BASH_REMATCH[2]}" -gt 0 ] && failed_names+=("$label: $(echo "$out" | grep '^FAIL' | tr '\n' ' ')")
    [ "${BASH_REMATCH[3]}" -gt 0 ] && skipped_names+=("$label: $(echo "$out" | grep '^skip' | tr '\n' ' ')")
    if [ $rc -ne 0 ] && [ "${BASH_REMATCH[2]}" -eq 0 ]; then
      failed=$((failed + 1)); failed_names+=("$label exited $rc")
    fi
  else
    failed=$((failed + 1)); failed_names+=("$label crashed (rc=$rc)")
  fi
}

# A GPU is visible when the driver lists one (or its device node exists).
gpu_visible() {
  { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; } || [ -e /dev/nvidia0 ]
}

if [ -z "$filter" ] || [ "$filter" = unit ]; then
  echo "== unit tests (ASan/UBSan build)"
  unit_run unit build-san/llmi_tests
fi

if [ -z "$filter" ] || [ "$filter" = unit ] || [ "$filter" = cuda ]; then
  if ! gpu_visible; then
    # No GPU: the same tests through the CPU emulation of CUDA (tests/cuda-emu, make emu).
    # It runs the host code and the kernels' logic, not the GPU: the note says so.
    echo "== CUDA unit tests (CPU emulation: build-emu, no GPU visible)"
    unit_run cuda-emu build-emu/llmi_tests cuda
    # the kernel tests again with each block's threads, and a launch's blocks, run last to
    # first: a missing barrier, or a block that counts on another's order, shows in one
    # order or the other
    LLMI_EMU_ORDER=reverse unit_run cuda-emu-reverse build-emu/llmi_tests cuda_add_rmsnorm cuda_attention cuda_rope_kv \
      cuda_swiglu cuda_embed cuda_dequant cuda_sum_store cuda_argmax cuda_gemm cuda_gemv cuda_sample cuda_backend_int4 \
      quant_cuda_int4_matmul_vs_cpu quant_cuda_gram_and_gptq_vs_cpu
    # and the GEMMs with cuBLASLt refusing an algorithm outside the n it was chosen for, so
    # that gemm.cu's fallback (an exact entry for that n) runs
    LLMI_EMU_LT_EXACT_N=1 unit_run cuda-emu-exact-n build-emu/llmi_tests cuda_gemm cuda_backend_forward_layers cuda_backend_int4
    notes+=("CUDA unit tests run on the CPU emulation only: no GPU visible")
  elif [ ! -x build/llmi_tests ]; then
    # A GPU nobody tests is a skip, not a pass.
    echo "skip cuda unit tests: a GPU is visible but llmi was built without CUDA (no nvcc)"
    skipped=$((skipped + 1)); skipped_names+=("cuda unit tests (no CUDA build)")
  else
    echo "== CUDA unit tests (CUDA build, GPU visible)"
    unit_run cuda build/llmi_tests cuda
  fi
fi

echo "== cli tests"
for t in tests/cli/*.sh; do
  name=$(basename "$t" .sh)
  [ -n "$filter" ] && { [ "$filter" = unit ] || [ "$filter" = cuda ]; } && continue
  [ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && continue
  start=$(date +%s)
  log=$(mktemp)
  bash "$t" >"$log" 2>&1; rc=$?
  secs=$(( $(date +%s) - start ))
  if [ $rc -eq 0 ]; then
    echo "ok   $name (${secs}s)"; passed=$((passed + 1))
  elif [ $rc -eq 77 ]; then
    echo "skip $name: $(tail -n 1 "$log")"; skipped=$((skipped + 1)); skipped_names+=("$name")
  else
    echo "FAIL $name (rc=$rc, ${secs}s)"; tail -n 30 "$log" | sed 's/^/    /'
    failed=$((failed + 1)); failed_names+=("$name")
  fi
  rm -f "$log"
done

[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
[ ${#skipped_names[@]} -gt 0 ] && echo "skipped: ${skipped_names[*]}"
echo "suite time: $(( $(date +%s) - t_suite ))s, seed $LLMI_TEST_SEED"
rc=0
[ $failed -eq 0 ] || rc=1
if [ $skipped -gt 0 ] && [ "${LLMI_ALLOW_SKIP:-0}" != 1 ]; then
  echo "skips fail the suite (set LLMI_ALLOW_SKIP=1 to accept them)"
  rc=1
fi
summary="$passed passed, $failed failed, $skipped skipped"
[ ${#notes[@]} -gt 0 ] && summary="$summary (${notes[*]})"
echo "$summary"
exit $rc
