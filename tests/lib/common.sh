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

# ppl_vs_llamacpp REF.json WHAT: llmi's WikiText-2 perplexity on the default model (8 windows
# of 512, as llama-perplexity -c 512 --chunks 8) with REF's "llmi_flags" (testdata/ paths made
# this checkout's) against llama.cpp's figures in REF, by tests/cli/ref_llamacpp_ppl.sh's rule
# (0.5% overall, 3% a window); prints the flags and the comparison's last line.
ppl_vs_llamacpp() {
  local ref=$1 what=$2 extra
  read -r -a extra < <(python3 -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1]))["llmi_flags"]))' "$ref")
  "$LLMI" bench --device cpu --ppl "$SHARED/data/wikitext-2-raw/wiki.test.raw" -m "$MODEL" -c 512 --chunks 8 -t 2 -o json \
    "${extra[@]//testdata/$TESTDATA}" >"$TMP/p.json" 2>"$TMP/perr" || fail "bench --ppl ${extra[*]}: $(tail -c 800 "$TMP/perr")"
  python3 "$(dirname "${BASH_SOURCE[0]}")/../compare_ppl_llamacpp.py" "$ref" "$TMP/p.json" "$TMP/perr" --overall 0.005 \
    --window 0.03 >"$TMP/cmp" || { cat "$TMP/cmp"; fail "$(basename "$ref" .json): perplexity with $what differs from llama.cpp's"; }
  echo "${extra[*]}: $(tail -1 "$TMP/cmp")"
}
# ppl_far_without REF.json WHAT: the plain model's perplexity must miss REF's figure (made with
# WHAT) by more than 5%, so that ppl_vs_llamacpp's limits are far below WHAT's own effect.
ppl_far_without() {
  local ref=$1 what=$2
  "$LLMI" bench --device cpu --ppl "$SHARED/data/wikitext-2-raw/wiki.test.raw" -m "$MODEL" -c 512 --chunks 8 -t 2 -o json \
    >"$TMP/p0.json" 2>/dev/null || fail "bench --ppl without $what"
  python3 - "$ref" "$TMP/p0.json" "$what" <<'PY' || fail "llmi without $what meets llama.cpp's figure with it"
import json, sys
want = json.load(open(sys.argv[1]))["ppl"]
got = json.load(open(sys.argv[2]))
got = float((got[0] if isinstance(got, list) else got)["ppl"])
print(f"  llmi without {sys.argv[3]}: ppl {got:.4f}, {abs(got / want - 1):.1%} from llama.cpp's with it")
assert abs(got / want - 1) > 0.05
PY
}

# config_edited DIR NAME PYTHON: a copy of the model directory DIR as $TMP/NAME whose
# config.json, as the dict c, went through PYTHON; prints the copy's path.
config_edited() {
  rm -rf "$TMP/$2" && cp -r "$1" "$TMP/$2"
  python3 - "$TMP/$2/config.json" "$3" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); exec(sys.argv[2]); json.dump(c, open(sys.argv[1], "w"))
PY
  echo "$TMP/$2"
}

# ref_prompts NAME: for a test against transformers' reference of the test checkpoint
# testdata/hf/NAME: H its directory, REF its reference (testdata/hf/ref/NAME.json), the
# reference's token sequences as prompts in $TMP/ids.jsonl, and plp the llmi arguments for
# their prompt logprobs (top 3, cpu).
ref_prompts() {
  H="$TESTDATA/hf/$1"
  REF="$TESTDATA/hf/ref/$1.json"
  python3 -c 'import json,sys
for s in json.load(open(sys.argv[1]))["seqs"]: print(json.dumps({"prompt_token_ids": s["ids"]}))' \
    "$REF" >"$TMP/ids.jsonl" || fail "reading $REF"
  plp=(generate --device cpu --prompts "$TMP/ids.jsonl" -n 0 --prompt-logprobs 3 --json --no-stats)
}
# edited NAME PYTHON: a copy of $H (ref_prompts'), its config.json as c through PYTHON.
edited() { config_edited "$H" "$@"; }
# cmp_ref OUT: OUT's prompt logprobs within 1e-4 of $REF's (ref_prompts'); the comparison's
# report in $TMP/cmp.out.
cmp_ref() {
  python3 tests/compare_prompt_logprobs_hf.py "$REF" "$1" --tol 1e-4 --slack 1e-4 >"$TMP/cmp.out"
}

# quantized_runs SRC WHAT PYTHON REF: llmi quantize (RTN, group 32) of the model SRC into
# $TMP/q-NAME; its config.json, as the dict c, must pass PYTHON's asserts (else "SRC: the
# quantized config.json is not WHAT's"); then its prompt logprobs (the caller's plp array of
# llmi arguments) must be nearer to REF's than to llama-gqa-rope3's, the 4-bit RTN of a random
# model being too coarse for limits.  Prints the comparison's last line.  Call it as a command
# (not inside $(...), where fail would end only the subshell).
quantized_runs() {
  local src=$1 what=$2 check=$3 ref=$4 out="$TMP/q-$(basename "$1")"
  "$LLMI" quantize -m "$src" --method rtn --group-size 32 -o "$out" >/dev/null 2>"$TMP/err" ||
    fail "quantize $src: $(tail -c 600 "$TMP/err")"
  python3 - "$out/config.json" "$check" <<'PY' >&2 || fail "$src: the quantized config.json is not $what's"
import json, sys
c = json.load(open(sys.argv[1])); exec(sys.argv[2])
PY
  "$LLMI" "${plp[@]}" -m "$out" >"$TMP/q.out" 2>"$TMP/err" || fail "the quantized $src does not run: $(tail -c 600 "$TMP/err")"
  python3 tests/compare_prompt_logprobs_hf.py "$ref" "$TMP/q.out" --nearer-than "$TESTDATA/hf/ref/llama-gqa-rope3.json" \
    >"$TMP/cmp.out" || fail "the quantized $src is not nearer to transformers' logits: $(tail -3 "$TMP/cmp.out")"
  tail -1 "$TMP/cmp.out"
}

# gguf_edited SRC NAME PYTHON: $TMP/NAME.gguf, a copy of the GGUF file SRC rewritten after
# PYTHON ran on g = gguf_edit.read(SRC) (tests/lib/gguf_edit.py; struct imported); prints
# the path.
gguf_edited() {
  python3 - "$1" "$TMP/$2.gguf" "$3" "$(dirname "${BASH_SOURCE[0]}")" <<'PY'
import struct, sys
sys.path.insert(0, sys.argv[4])
import gguf_edit
g = gguf_edit.read(sys.argv[1])
exec(sys.argv[3])
gguf_edit.write(sys.argv[2], g)
PY
  echo "$TMP/$2.gguf"
}
