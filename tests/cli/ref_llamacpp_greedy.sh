#!/usr/bin/env bash
# llmi's greedy generations on SmolLM2 Q4_1 against llama.cpp's (testdata/llamacpp/greedy.jsonl,
# made by scripts/ref-llamacpp.py; provenance in docs/REFERENCES.md): same prompt ids; where
# the 64-token continuations first differ each side's token is in the other's top-5; at every
# matched position the chosen token's logprob and the whole top-5 (ids and logprobs) agree
# within limits set from the measured spread; and enough tokens and whole prompts match
# (tests/compare_topk.py states each rule and limit).  The comparator is first checked on
# llama.cpp's own data (passes on itself, fails on perturbed copies), so a broken
# comparator cannot pass llmi.
. "$(dirname "$0")/../lib/common.sh"
REF="$TESTDATA/llamacpp/greedy.jsonl"
PROMPTS="$TESTDATA/llamacpp/prompts.jsonl"
CMP="$(dirname "$0")/../compare_topk.py"
python3 "$CMP" --self-test "$REF" || fail "compare_topk.py self-test"
need_model
"$LLMI" generate --device cpu -m "$MODEL" --prompts "$PROMPTS" -n 64 --temp 0 --ignore-eos --logprobs 5 --json \
  --no-stats -t 2 >"$TMP/llmi.jsonl" 2>"$TMP/err" || fail "llmi generate failed: $(tail -c 2000 "$TMP/err")"
python3 "$CMP" "$REF" "$TMP/llmi.jsonl" || fail "llmi differs from llama.cpp (see above)"
