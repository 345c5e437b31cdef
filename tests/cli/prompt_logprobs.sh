#!/usr/bin/env bash
# vLLM's prompt_logprobs (generate --prompt-logprobs N, a --prompts line's "prompt_logprobs")
# and prompts given as token ids (a line's "prompt_token_ids"), end to end:
#   - against transformers: the HF test models' teacher-forced fp32 logits (testdata/hf/ref),
#     every prompt position's logprob and top 5 (tests/compare_prompt_logprobs_hf.py), on the
#     CPU backend and through the CUDA backend on the CPU emulation (bf16: looser limits);
#   - against llama.cpp: SmolLM2 Q4_1 scoring llama.cpp's own 24 greedy continuations
#     (testdata/llamacpp/greedy.jsonl), all 1536 positions by compare_topk.py's rules
#     (--teacher-forced), under a random token budget (the prompt in chunks);
#   - against llmi's own generation: the logprobs a greedy run reported for its tokens are
#     exactly what scoring prompt + those tokens gives (CPU steps are batch invariant),
#     under ASan/UBSan too;
#   - a line's "n" samples: the prompt's logprobs once (sample 0), the other samples take its
#     K/V from the prefix cache, sample 0 none; "prompt_token_ids" as the text's ids gives
#     the text's output;
#   - bad values: one line naming the flag or the line, exit 1 or 2.
. "$(dirname "$0")/../lib/common.sh"
CMP_HF="$(dirname "$0")/../compare_prompt_logprobs_hf.py"
CMP_LC="$(dirname "$0")/../compare_topk.py"
ids_lines() {  # REF.json -> one {"prompt_token_ids"} line per reference sequence
  python3 -c 'import json,sys; [print(json.dumps({"prompt_token_ids": s["ids"]})) for s in json.load(open(sys.argv[1]))["seqs"]]' "$1"
}
for m in llama-gqa-rope3 qwen2-bias-tied gemma3-swa qwen3moe-tiny; do
  ref="$TESTDATA/hf/ref/$m.json"
  ids_lines "$ref" >"$TMP/$m.jsonl"
  "$LLMI" generate --device cpu -m "$TESTDATA/hf/$m" --prompts "$TMP/$m.jsonl" -n 0 --prompt-logprobs 5 --json \
    --no-stats >"$TMP/$m.out" 2>"$TMP/err" || fail "$m: cpu run: $(head -c 500 "$TMP/err")"
  # measured max |diff| 4.2e-6 (2026-11-29): fp32 on both sides
  python3 "$CMP_HF" "$ref" "$TMP/$m.out" --tol 1e-4 --slack 1e-4 >"$TMP/cmp" || { cat "$TMP/cmp"; fail "$m: cpu vs transformers"; }
  echo "cpu: $(tail -1 "$TMP/cmp")"
done
if [ -x "$LLMI_EMU" ]; then
  for m in llama-gqa-rope3 gemma3-swa; do
    emu_run "emu-$m" generate --device cuda -m "$TESTDATA/hf/$m" --prompts "$TMP/$m.jsonl" -n 0 --prompt-logprobs 5 \
      --json --no-stats
    # bf16 weights and activations on the CUDA path: measured max |diff| 0.038
    python3 "$CMP_HF" "$TESTDATA/hf/ref/$m.json" "$TMP/emu-$m.out" --tol 0.1 --slack 0.1 >"$TMP/cmp" ||
      { cat "$TMP/cmp"; fail "$m: emulated cuda vs transformers"; }
    echo "emulated cuda: $(tail -1 "$TMP/cmp")"
  done
else
  echo "(no $LLMI_EMU: the emulated CUDA part is skipped; make emu)"
fi

need_model
REF="$TESTDATA/llamacpp/greedy.jsonl"
python3 - "$REF" >"$TMP/tf.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(json.dumps({"prompt_token_ids": r["prompt_ids"] + r["tokens"]}))
PY
budget=$((24 + SEED % 200))
"$LLMI" generate --device cpu -m "$MODEL" --prompts "$TMP/tf.jsonl" -n 0 --prompt-logprobs 5 --json --no-stats -t 2 \
  --max-batch-tokens $budget >"$TMP/tf.out" 2>"$TMP/err" || fail "teacher-forced SmolLM2 run: $(head -c 500 "$TMP/err")"
python3 "$CMP_LC" --teacher-forced "$REF" "$TMP/tf.out" >"$TMP/cmp" || { tail -20 "$TMP/cmp"; fail "SmolLM2 vs llama.cpp (teacher-forced, --max-batch-tokens $budget)"; }
echo "SmolLM2 vs llama.cpp, --max-batch-tokens $budget: $(grep -E '^summary|^most likely' "$TMP/cmp" | tr '\n' ' ')"

# llmi's own greedy logprobs, scored again as a prompt
head -6 "$TESTDATA/llamacpp/prompts.jsonl" >"$TMP/p6.jsonl"
for bin in "$LLMI" "$LLMI_SAN"; do
  tag=$(basename "$bin")
  "$bin" generate --device cpu -m "$MODEL" --prompts "$TMP/p6.jsonl" -n 12 --temp 0 --ignore-eos --logprobs 5 --json \
    --no-stats >"$TMP/gen-$tag.out" 2>"$TMP/err" || fail "$tag: greedy run: $(head -c 500 "$TMP/err")"
  python3 -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l); print(json.dumps({"prompt_token_ids": r["prompt_ids"] + r["tokens"], "max_tokens": 0, "prompt_logprobs": 5}))' \
    "$TMP/gen-$tag.out" >"$TMP/again.jsonl"
  "$bin" generate --device cpu -m "$MODEL" --prompts "$TMP/again.jsonl" --json --no-stats --prefill-chunk 7 \
    >"$TMP/again-$tag.out" 2>"$TMP/err" || fail "$tag: scoring run: $(head -c 500 "$TMP/err")"
  python3 - "$TMP/gen-$tag.out" "$TMP/again-$tag.out" <<'PY' || fail "$tag: prompt logprobs differ from the generation's"
import json, sys
gen = [json.loads(l) for l in open(sys.argv[1])]
again = [json.loads(l) for l in open(sys.argv[2])]
assert len(gen) == len(again) == 6
for g, a in zip(gen, again):
    n = len(g["prompt_ids"])
    plp = a["prompt_logprobs"]
    assert a["generated_tokens"] == 0 and a["finish_reason"] == "length" and len(plp) == n + 12, a
    assert plp[n:] == g["logprobs"], "the prompt's logprobs of the generated tokens are not the generation's"
    for e in plp[1:]:
        lps = [t["logprob"] for t in e["top"]]
        assert len(lps) == 5 and lps == sorted(lps, reverse=True) and e["logprob"] <= lps[0] and max(lps) <= 0, e
print(f"6 greedy runs: their {sum(len(g['logprobs']) for g in gen)} token logprobs and top 5 equal the scored prompt's")
PY
done

# "n" samples share the prompt; prompt_token_ids = the text's ids gives the same output
P="Write a short poem about the sea, the wind, the old lighthouse keeper and his dog who waits by the door."
ids=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["prompt_ids"])' "$TMP/gen-llmi.out")
printf '{"prompt": "%s", "n": 3, "prompt_logprobs": 0, "max_tokens": 4}\n' "$P" >"$TMP/n.jsonl"
head -1 "$TMP/p6.jsonl" >>"$TMP/n.jsonl"
printf '{"prompt_token_ids": %s, "prompt_logprobs": null}\n' "$ids" >>"$TMP/n.jsonl"
"$LLMI" generate --device cpu -m "$MODEL" --prompts "$TMP/n.jsonl" --json --no-stats -n 12 --temp 0 --ignore-eos \
  --prompt-logprobs 2 >"$TMP/n.out" 2>"$TMP/err" || fail "samples run: $(head -c 500 "$TMP/err")"
python3 - "$TMP/n.out" "$TMP/gen-llmi.out" <<'PY' || fail "samples / prompt_token_ids"
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
first = json.loads(open(sys.argv[2]).readline())
assert [(r["index"], r["sample"]) for r in rs] == [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0)], rs
n = rs[0]["prompt_tokens"]
plp = rs[0]["prompt_logprobs"]
assert len(plp) == n and plp[0] is None and all(e["top"] == [] for e in plp[1:]), "sample 0: top 0 wanted"
assert all("prompt_logprobs" not in r for r in rs[1:3]), "samples after the first carry prompt logprobs"
assert rs[0]["cached_tokens"] == 0 and rs[1]["cached_tokens"] == rs[2]["cached_tokens"] == (n - 1) // 16 * 16 > 0, \
    [r["cached_tokens"] for r in rs]
assert len(rs[3]["prompt_logprobs"]) == rs[3]["prompt_tokens"] and all(len(e["top"]) == 2 for e in rs[3]["prompt_logprobs"][1:])
assert "prompt_logprobs" not in rs[4], "a line's null did not turn --prompt-logprobs off"
assert rs[4]["prompt_ids"] == first["prompt_ids"] and rs[4]["tokens"] == first["tokens"], "prompt_token_ids != the text's run"
print(f"n=3: prompt logprobs once, cached {[r['cached_tokens'] for r in rs[:3]]}; prompt_token_ids gives the text's output")
PY

gen=(generate --device cpu -m "$MODEL" --no-stats -n 2)
expect_error "--prompt-logprobs" "$LLMI" "${gen[@]}" -p hi --prompt-logprobs 3
expect_error "--prompt-logprobs" "$LLMI" "${gen[@]}" -p hi --prompt-logprobs 21 --json
expect_error "--prompt-logprobs" "$LLMI" "${gen[@]}" --json -cnv --prompt-logprobs 1
line_error() {  # WORD LINE [FLAGS...]
  local word=$1 line=$2; shift 2
  printf '%s\n' "$line" >"$TMP/bad.jsonl"
  expect_error "$word" "$LLMI" "${gen[@]}" --prompts "$TMP/bad.jsonl" "$@"
}
line_error "prompt_logprobs" '{"prompt": "hi", "prompt_logprobs": 2}'
line_error "prompt_logprobs" '{"prompt": "hi", "prompt_logprobs": "5"}' --json
line_error "prompt_logprobs" '{"prompt": "hi", "prompt_logprobs": 1.5}' --json
line_error "prompt_token_ids" '{"prompt_token_ids": []}' --json
line_error "prompt_token_ids" '{"prompt_token_ids": [1, -2]}' --json
line_error "prompt_token_ids" '{"prompt_token_ids": [1, 2.5]}' --json
line_error "prompt_token_ids" '{"prompt_token_ids": "1 2"}' --json
line_error "prompt_token_ids" '{"prompt": "hi", "prompt_token_ids": [1]}' --json
line_error "outside the vocabulary" '{"prompt_token_ids": [1, 99999999]}' --json
"$LLMI_SAN" "${gen[@]}" --json --prompts "$TMP/bad.jsonl" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 1 ] || [ $rc -eq 2 ] || fail "llmi-san on an id outside the vocabulary exited $rc: $(head -c 500 "$TMP/err")"
echo "ok: llmi-san refuses the id outside the vocabulary (rc $rc)"
