#!/usr/bin/env bash
# CPU compute-path benchmarks (not part of `make`): builds build/bench_cpu from
# tests/bench/bench_cpu.c and the objects of `make`, then runs
#   scripts/bench-cpu-ops.sh matmul [reps]
#   scripts/bench-cpu-ops.sh model [PATH] [n_prompt] [n_gen] [threads] [kv]
# and, with `llama`, llama.cpp's llama-bench on the same model for comparison.
#
# Notes for this (shared, 2-core, VM) machine:
# - llama.cpp's native build takes its AMX path for Q4_1 prompt processing, and the VM
#   does not grant AMX tile state: pp dies with SIGILL (tileloadd).  Build libggml-cpu
#   without AMX (cmake -DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON
#   -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF ...; target ggml-cpu) and
#   point LLAMA_LIBS at its bin/ directory.
# - When other jobs share the cores, OpenMP's default spin-waiting makes every parallel
#   region wait for a descheduled thread: 2-thread decode falls ~100x (llmi and llama.cpp
#   alike).  Compare with OMP_WAIT_POLICY=passive there; on an idle machine leave it unset.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-matmul}"; shift || true
if [ "$mode" = llama ]; then
  LB=${LLAMA_BENCH:-/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-bench}
  [ -n "${LLAMA_LIBS:-}" ] && export LD_LIBRARY_PATH="$LLAMA_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  exec nice "$LB" -m "${1:-$(scripts/fetch-model.sh --path)}" -t "${2:-2}" -p 512 -n 128
fi
make -j2 >/dev/null
# the objects of the current sources only (build/ may hold stale ones)
objs=""
for f in $(find src -name "*.c") kernels/*.cu; do
  [ -e "$f" ] || continue
  o="build/${f%.*}.o"; [ -e "$o" ] && objs="$objs $o"
done
pkg=$(pkg-config --libs libpcre2-8 libutf8proc libcjson libzstd libxxhash 2>/dev/null || echo -lpcre2-8 -lutf8proc -lcjson -lzstd -lxxhash)
cuda=""
if [[ "$objs" == *build/kernels/* ]]; then cuda="-L/usr/local/cuda/lib64 -lcublasLt -lcublas -lcusolver -lcudart -lstdc++"; fi
gcc -std=c11 -D_GNU_SOURCE -O3 -march=native -fopenmp -Isrc -c tests/bench/bench_cpu.c -o build/bench_cpu.o
gcc -o build/bench_cpu build/bench_cpu.o $objs $pkg $cuda -fopenmp -lm -lpthread
if [ "$mode" = model ]; then
  exec nice build/bench_cpu model "${1:-$(scripts/fetch-model.sh --path)}" "${@:2}"
fi
exec nice build/bench_cpu matmul "$@"
