# shellcheck shell=bash
# Shared by tests/cli/lora.sh and lora_gguf.sh (sourced after common.sh): llmi with adapters
# against PEFT's logits of the same adapters (testdata/lora/ref, scripts/make-lora-refs.py).
CMP="$(dirname "${BASH_SOURCE[0]}")/../compare_prompt_logprobs_hf.py"
L="$TESTDATA/lora"

# ids_lines REF: the reference's token sequences as --prompts lines of prompt_token_ids.
ids_lines() {
  python3 -c 'import json,sys; [print(json.dumps({"prompt_token_ids": s["ids"]})) for s in json.load(open(sys.argv[1]))["seqs"]]' "$1"
}

# vs_peft CASE "FLAGS" TOL: every position's logprob and top 5 of llmi (cpu) with FLAGS on the
# case's model against PEFT's reference $L/ref/CASE.json, within TOL; leaves the prompts in
# $TMP/CASE.jsonl, llmi's output in $TMP/CASE.out and the comparison's last line in $TMP/cmp.
vs_peft() {
  local name=$1 flags=$2 tol=$3 ref="$L/ref/$1.json" model
  model=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["model"])' "$ref")
  ids_lines "$ref" >"$TMP/$name.jsonl"
  # shellcheck disable=SC2086
  "$LLMI" generate --device cpu -m "$TESTDATA/hf/$model" --prompts "$TMP/$name.jsonl" -n 0 --prompt-logprobs 5 --json \
    --no-stats $flags >"$TMP/$name.out" 2>"$TMP/err" || fail "$name: $(head -c 500 "$TMP/err")"
  python3 "$CMP" "$ref" "$TMP/$name.out" --tol "$tol" --slack "$tol" >"$TMP/cmp" ||
    { tail -5 "$TMP/cmp"; fail "$name: llmi $flags vs PEFT"; }
}
