#!/usr/bin/env bash
# --control-vector, --control-vector-scaled, --control-vector-layer-range: llama.cpp's control
# vectors (testdata/control: written by llama.cpp's own llama-cvector-generator from SmolLM2,
# scripts/make-control-vectors.py), against llama.cpp applying the same files:
#   - greedy generations with top-5 logprobs (scripts/ref-llamacpp.py greedy-cvec: llama.cpp's
#     llama_set_adapter_cvec), one vector over every layer, and two files summed with their
#     scales over layers 10..25;
#   - WikiText-2 perplexity from llama-perplexity given the same flags (its own file loader),
#     and without the vector llmi is far from those figures;
#   - llmi's spellings of one thing agree to the bit (one- and two-argument forms, a list and
#     repeated flags, the same file twice at half scale, the default range spelled out), and
#     the fused decode step equals the op-by-op prefill with a vector, on SmolLM2 and on a
#     Gemma 3 model (sandwich norms) with fresh random directions;
#   - through the CUDA backend on the CPU emulation; under ASan/UBSan; the prompt cache keeps
#     a vector's K/V apart; --spec ngram keeps the greedy tokens;
#   - broken files and flag values: one line naming the flag and what is wrong, exit 2.
. "$(dirname "$0")/../lib/common.sh"
C="$TESTDATA/control"
echo "seed $SEED"
CMP="$(dirname "$0")/../compare_topk.py"
# same_logprobs A B WHAT: two --json outputs with (prompt_)logprobs, equal to the bit
same_logprobs() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
keep = ("tokens", "logprobs", "prompt_logprobs", "prompt_ids")
a = [{k: r.get(k) for k in keep} for r in map(json.loads, open(sys.argv[1]))]
b = [{k: r.get(k) for k in keep} for r in map(json.loads, open(sys.argv[2]))]
assert len(a) == len(b) > 0 and a == b, f"{sys.argv[3]}: outputs differ"
print(f"{sys.argv[3]}: {len(a)} requests equal")
PY
}
# random_cvec OUT DIM LAYERS STD: direction.1..LAYERS-1, normal(0, STD) values, this run's seed
random_cvec() {
  python3 - "$1" "$2" "$3" "$4" "$SEED" "$(dirname "$0")/../lib" <<'PY'
import random, struct, sys
sys.path.insert(0, sys.argv[6])
import gguf_edit
out, dim, layers, std = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
rnd = random.Random(int(sys.argv[5]))
g = {"kv": [], "tensors": []}
gguf_edit.set_str(g, "general.architecture", "controlvector")
for n in range(1, layers):
    vals = [rnd.gauss(0, std) for _ in range(dim)]
    g["tensors"].append({"name": f"direction.{n}", "dims": [dim], "type": 0, "data": struct.pack(f"<{dim}f", *vals)})
gguf_edit.write(out, g)
PY
}

G3="$TESTDATA/hf/gemma3-swa"
random_cvec "$TMP/g3.gguf" 64 6 2 || fail "making a random control vector"
printf '%s\n' '{"prompt_token_ids": [2, 17, 45, 9, 120, 33, 7, 88, 61, 14, 5, 99, 23, 41]}' \
  '{"prompt_token_ids": [2, 71, 3, 150, 12, 64, 8, 19, 77, 30, 101, 4, 56]}' >"$TMP/g3.jsonl"
# teacher_forced NAME MODEL PROMPTS FLAGS...: greedy 12 tokens with their logprobs (one sequence:
# the fused decode step), then prompt + those tokens scored in one prefill (the op-by-op
# forward): the logprobs of the 12 tokens must be equal to the bit
teacher_forced() {
  local name=$1 m=$2 p=$3; shift 3
  "$LLMI" generate --device cpu -m "$m" --prompts "$p" -n 12 --temp 0 --ignore-eos --logprobs 1 --json --no-stats "$@" \
    >"$TMP/$name-dec.out" || fail "$name: greedy run"
  python3 -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l); print(json.dumps({"prompt_token_ids": r["prompt_ids"] + r["tokens"]}))' "$TMP/$name-dec.out" \
    >"$TMP/$name-tf.jsonl"
  "$LLMI" generate --device cpu -m "$m" --prompts "$TMP/$name-tf.jsonl" -n 0 --prompt-logprobs 1 --json --no-stats "$@" \
    >"$TMP/$name-pre.out" || fail "$name: teacher-forced run"
  python3 - "$TMP/$name-dec.out" "$TMP/$name-pre.out" "$name" <<'PY' || fail "$name: decode step and prefill differ"
import json, sys
dec = [json.loads(l) for l in open(sys.argv[1])]
pre = [json.loads(l) for l in open(sys.argv[2])]
n = 0
for a, b in zip(dec, pre):
    want = [x["logprob"] for x in a["logprobs"]]
    got = [x["logprob"] for x in b["prompt_logprobs"][-len(want):]]
    assert want == got, (sys.argv[3], want, got)
    n += len(want)
assert len(dec) == len(pre) > 0 and n > 0
print(f"{sys.argv[3]}: {n} decoded tokens' logprobs equal to the prefill's")
PY
}
teacher_forced gemma3-cvec "$G3" "$TMP/g3.jsonl" --control-vector-scaled "$TMP/g3.gguf" 1
"$LLMI" generate --device cpu -m "$G3" --prompts "$TMP/g3.jsonl" -n 12 --temp 0 --ignore-eos --logprobs 1 --json \
  --no-stats >"$TMP/g3-plain.out" || fail "gemma3 without a vector"
! same_logprobs "$TMP/g3-plain.out" "$TMP/gemma3-cvec-dec.out" x >/dev/null 2>&1 || fail "the random vector changed nothing"

if [ -x "$LLMI_EMU" ]; then
  # the CUDA backend (bf16 weights and activations) against the CPU's fp32 with the same vector:
  # every prompt position's logprob (measured at most 0.02 apart without a vector)
  printf '%s\n' '{"prompt_token_ids": [2, 17, 45, 9, 120, 33, 7, 88, 61, 14, 5, 99, 23, 41, 12, 77, 140, 3]}' >"$TMP/g3p.jsonl"
  g3p=(generate -m "$G3" --prompts "$TMP/g3p.jsonl" -n 0 --prompt-logprobs 1 --json --no-stats
    --control-vector-scaled "$TMP/g3.gguf" 1 --control-vector-layer-range 2 5)
  emu_run emu "${g3p[@]}" --device cuda
  "$LLMI" "${g3p[@]}" --device cpu >"$TMP/cpu.out" || fail "cpu run for the emulation"
  python3 - "$TMP/cpu.out" "$TMP/emu.out" <<'PY' || fail "emulated cuda with a control vector differs from the cpu"
import json, sys
a, b = (json.loads(open(p).readline())["prompt_logprobs"][1:] for p in sys.argv[1:3])
d = max(abs(x["logprob"] - y["logprob"]) for x, y in zip(a, b))
print(f"emulated cuda vs cpu, gemma3-swa with a random vector on layers 2..5: {len(a)} positions, max |logprob diff| {d:.4f}")
assert len(a) == len(b) == 17 and d < 0.1
PY
else
  echo "(no $LLMI_EMU: the emulated CUDA part is skipped; make emu)"
fi

# broken files and flag values (no model needed beyond the tiny one)
edit() { gguf_edited "$TMP/g3.gguf" "$@"; }   # edit NAME PYTHON: the random vector, edited (tests/lib/common.sh)
gen=(generate --device cpu -m "$G3" -p hi -n 1 --no-stats)
f=$(edit ident "pass"); "$LLMI" "${gen[@]}" --control-vector "$f" >/dev/null || fail "the vector rewritten unchanged is refused"
expect_error "No such file" "$LLMI" "${gen[@]}" --control-vector "$TMP/nonexistent.gguf"
expect_error "not a control vector" "$LLMI" "${gen[@]}" --control-vector "$TESTDATA/hf/gemma3-swa.bf16.gguf"
head -c 300 "$TMP/g3.gguf" >"$TMP/trunc.gguf"
expect_error "--control-vector $TMP/trunc.gguf" "$LLMI" "${gen[@]}" --control-vector "$TMP/trunc.gguf"
f=$(edit none "g['tensors'] = []"); expect_error "no direction tensors" "$LLMI" "${gen[@]}" --control-vector "$f"
f=$(edit name "gguf_edit.find(g, 'direction.2')['name'] = 'direction.2b'"); expect_error '"direction.2b" is not a direction' "$LLMI" "${gen[@]}" --control-vector "$f"
f=$(edit zero "gguf_edit.find(g, 'direction.2')['name'] = 'direction.0'"); expect_error "layer 0 takes no control vector" "$LLMI" "${gen[@]}" --control-vector "$f"
f=$(edit deep "gguf_edit.find(g, 'direction.2')['name'] = 'direction.6'"); expect_error "direction.6 is for layer 6; the model has layers 0..5" "$LLMI" "${gen[@]}" --control-vector "$f"
f=$(edit f16 "t = gguf_edit.find(g, 'direction.2'); t['type'] = 1; t['data'] = t['data'][:128]"); expect_error "must be a 1-d F32 tensor (is 1-d F16)" "$LLMI" "${gen[@]}" --control-vector "$f"
f=$(edit twod "gguf_edit.find(g, 'direction.2')['dims'] = [32, 2]"); expect_error "must be a 1-d F32 tensor (is 2-d F32)" "$LLMI" "${gen[@]}" --control-vector "$f"
f=$(edit size "t = gguf_edit.find(g, 'direction.2'); t['dims'] = [32]; t['data'] = t['data'][:128]"); expect_error "has 32 values; the model's hidden size is 64" "$LLMI" "${gen[@]}" --control-vector "$f"
f=$(edit nan "t = gguf_edit.find(g, 'direction.3'); t['data'] = t['data'][:8] + struct.pack('<f', float('nan')) + t['data'][12:]")
expect_error "direction.3 value 2 is not finite" "$LLMI" "${gen[@]}" --control-vector "$f"
f=$(edit big "t = gguf_edit.find(g, 'direction.3'); t['data'] = struct.pack('<f', 3e36) + t['data'][4:]")
expect_error "layer 3's scaled sum overflows" "$LLMI" "${gen[@]}" --control-vector-scaled "$f" 1000
"$LLMI" "${gen[@]}" --control-vector-scaled "$f" 1000 --control-vector-layer-range 4 5 >/dev/null ||
  fail "an overflowing layer outside the range is refused"
expect_error "START 4 is after END 2" "$LLMI" "${gen[@]}" --control-vector "$TMP/g3.gguf" --control-vector-layer-range 4 2
expect_error "no direction of the file falls in it" "$LLMI" "${gen[@]}" --control-vector "$TMP/g3.gguf" --control-vector-layer-range 6 9
expect_error "no --control-vector to apply" "$LLMI" "${gen[@]}" --control-vector-layer-range 1 3
expect_error "--control-vector-layer-range" "$LLMI" "${gen[@]}" --control-vector "$TMP/g3.gguf" --control-vector-layer-range 1 x
expect_error "is not PATH:SCALE" "$LLMI" "${gen[@]}" --control-vector-scaled "$TMP/g3.gguf:1,$TMP/g3.gguf"
expect_error "--control-vector-scaled" "$LLMI" "${gen[@]}" --control-vector-scaled "$TMP/g3.gguf" lots
expect_error "an empty path" "$LLMI" "${gen[@]}" --control-vector "$TMP/g3.gguf,"
expect_error "at most 8" "$LLMI" "${gen[@]}" --control-vector "$(printf "$TMP/g3.gguf,%.0s" 1 2 3 4 5 6 7 8)$TMP/g3.gguf"
expect_error "not part of a quantized checkpoint" "$LLMI" quantize -m "$G3" --method rtn -o "$TMP/q" --control-vector "$TMP/g3.gguf"
[ ! -e "$TMP/q" ] || fail "quantize with a control vector wrote $TMP/q"
"$LLMI_SAN" "${gen[@]}" --control-vector "$TMP/nan.gguf" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] || fail "llmi-san on a bad control vector exited $rc: $(head -c 500 "$TMP/err")"
"$LLMI_SAN" generate --device cpu -m "$G3" --prompts "$TMP/g3.jsonl" -n 12 --temp 0 --ignore-eos --logprobs 1 --json \
  --no-stats --control-vector-scaled "$TMP/g3.gguf" 1 >"$TMP/san.out" 2>"$TMP/err" ||
  fail "llmi-san --control-vector: $(head -c 800 "$TMP/err")"
same_logprobs "$TMP/gemma3-cvec-dec.out" "$TMP/san.out" "llmi-san vs llmi, gemma3-swa with a random vector" ||
  fail "llmi-san differs from llmi"

need_model
# llama.cpp's greedy generations with the same vectors.  Measured 2026-11-29 (24 prompts x 64
# tokens): happy-pca x8 over every layer 711 tokens before the first difference and 6 whole
# prompts, rank spreads 0.03-0.10 nats (llmi without a vector against llama.cpp without one:
# the same spreads); the two files over 10..25: 679 tokens, 5 prompts, one token's logprob
# 0.51 apart (Q4_1 with 8-bit activations on both sides, rounded differently; a vector makes
# the residual larger).  A vector one layer off (direction N after layer N-1 or N+1) matches
# 5-12 tokens of 8 prompts with spreads of 0.3-0.4.
greedy=(generate --device cpu -m "$MODEL" -n 64 --temp 0 --ignore-eos --logprobs 5 --json --no-stats -t 2)
lim=(--min-matched 550 --min-full 4 --max-lp-diff 0.75)
R="$C/ref/happy-pca-8"
"$LLMI" "${greedy[@]}" --prompts "$R/prompts.jsonl" --control-vector-scaled "$C/happy-pca.gguf" 8 >"$TMP/a.out" ||
  fail "greedy with happy-pca"
python3 "$CMP" "$R/greedy.jsonl" "$TMP/a.out" "${lim[@]}" >"$TMP/cmp" || { tail -5 "$TMP/cmp"; fail "happy-pca x8 differs from llama.cpp"; }
echo "happy-pca.gguf x8, every layer, vs llama.cpp: $(tail -3 "$TMP/cmp" | head -1)"
R="$C/ref/two-10-25"
read -r -a flags < <(python3 -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1]))["llmi_flags"]))' "$R/cvec.json")
"$LLMI" "${greedy[@]}" --prompts "$R/prompts.jsonl" "${flags[@]//testdata/$TESTDATA}" >"$TMP/b.out" || fail "greedy with two files"
python3 "$CMP" "$R/greedy.jsonl" "$TMP/b.out" "${lim[@]}" >"$TMP/cmp" || { tail -5 "$TMP/cmp"; fail "two vectors on 10..25 differ from llama.cpp"; }
echo "${flags[*]} vs llama.cpp: $(tail -3 "$TMP/cmp" | head -1)"

# one thing spelled several ways: equal to the bit
head -4 "$C/ref/happy-pca-8/prompts.jsonl" >"$TMP/four.jsonl"
few=(generate --device cpu -m "$MODEL" --prompts "$TMP/four.jsonl" -n 8 --temp 0 --ignore-eos --logprobs 2 --json --no-stats)
"$LLMI" "${few[@]}" --control-vector "$C/happy-mean.gguf" --control-vector "$C/pirate-pca.gguf" >"$TMP/rep.out" || fail "repeated"
"$LLMI" "${few[@]}" --control-vector "$C/happy-mean.gguf,$C/pirate-pca.gguf" --control-vector-layer-range 1 30 >"$TMP/list.out" || fail "list"
same_logprobs "$TMP/rep.out" "$TMP/list.out" "--control-vector A,B (range 1 30) vs --control-vector A --control-vector B" ||
  fail "a list differs from repeated flags"
"$LLMI" "${few[@]}" --control-vector-scaled "$C/happy-mean.gguf:0.5,$C/happy-mean.gguf:0.5" --control-vector-scaled \
  "$C/pirate-pca.gguf" 1 >"$TMP/half.out" || fail "halves"
same_logprobs "$TMP/rep.out" "$TMP/half.out" "A:0.5,A:0.5 plus B 1 vs A plus B" || fail "halves do not add up"
"$LLMI" "${few[@]}" --control-vector "$C/happy-mean.gguf" >"$TMP/one.out" || fail "one file"
! same_logprobs "$TMP/rep.out" "$TMP/one.out" x >/dev/null 2>&1 || fail "the second file changed nothing"
teacher_forced smollm2-cvec "$MODEL" "$TMP/four.jsonl" --control-vector-scaled "$C/happy-pca.gguf:8"

# llama-perplexity with the same flags (llama.cpp's own loader and graph), 8 windows of 512
# tokens, tests/cli/ref_llamacpp_ppl.sh's rule.  Measured 2026-11-29: happy-pca x8 29.3344 vs
# 29.3452 (0.037%, windows at most 0.69%); two files on 10..25 64.6775 vs 64.4554 (0.34%,
# windows 0.96%).  Without a vector llmi's 23.70 is 19% from the first.
DATA="$SHARED/data/wikitext-2-raw/wiki.test.raw"
if [ -f "$DATA" ]; then
  for ref in happy-pca-8-ppl two-10-25-ppl; do ppl_vs_llamacpp "$C/ref/$ref.json" "the vector"; done
  ppl_far_without "$C/ref/happy-pca-8-ppl.json" "the vector"
else
  echo "(wikitext-2 missing: the llama.cpp perplexity part is skipped)"
fi

# speculative decoding proposes with n-grams and verifies on the steered model: the same tokens
"$LLMI" "${few[@]}" --control-vector-scaled "$C/happy-pca.gguf:8" >"$TMP/nospec.out" || fail "without --spec"
"$LLMI" "${few[@]}" --control-vector-scaled "$C/happy-pca.gguf:8" --spec ngram >"$TMP/spec.out" || fail "--spec ngram"
python3 - "$TMP/nospec.out" "$TMP/spec.out" <<'PY' || fail "--spec ngram changed the tokens"
import json, sys
a, b = ([json.loads(l)["tokens"] for l in open(p)] for p in sys.argv[1:3])
assert len(a) == len(b) == 4 and a == b, (a, b)
print(f"--spec ngram with a vector: {len(a)} requests, the same greedy tokens as without --spec")
PY

# the prompt cache keys on the vectors
tail -2 "$C/ref/happy-pca-8/prompts.jsonl" >"$TMP/two.jsonl"   # 60+ tokens: whole blocks to cache
prompt_cache_apart "--control-vector" "--control-vector $C/happy-mean.gguf" generate --device cpu -m "$MODEL" \
  --prompts "$TMP/two.jsonl" -n 2 --temp 0 --json --no-stats --prompt-cache "$TMP/pc"
