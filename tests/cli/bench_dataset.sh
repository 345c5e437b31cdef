#!/usr/bin/env bash
# bench --dataset: text lines and JSONL {"prompt", "max_tokens"} mixed, tokenized by the
# model, cycled up to --num-requests; dataset prompts may stop at EOS, so generated <=
# requested and every request ends by length or EOS.  Bad lines fail before any work.
. "$(dirname "$0")/../lib/common.sh"
need_model
cat >"$TMP/d.jsonl" <<'J'
{"prompt": "The capital of France is", "max_tokens": 5}
Once upon a time
{"prompt": "List three colors:", "max_tokens": 3}
J
"$LLMI" bench --device cpu -m "$MODEL" --dataset "$TMP/d.jsonl" --num-requests 5 --output-len 4 --per-request "$TMP/r.jsonl" \
  -o json >"$TMP/o.json" 2>"$TMP/err" || fail "bench --dataset failed: $(cat "$TMP/err")"
python3 - "$TMP" <<'PY' || exit 1
import json, sys
d = sys.argv[1]
row = json.load(open(f"{d}/o.json"))[0]
reqs = [json.loads(l) for l in open(f"{d}/r.jsonl")]
assert row["num_requests"] == 5 == len(reqs) and row["dataset"].endswith("d.jsonl")
assert [r["max_tokens"] for r in reqs] == [5, 4, 3, 5, 4], [r["max_tokens"] for r in reqs]
assert reqs[0]["n_prompt"] == reqs[3]["n_prompt"] and reqs[1]["n_prompt"] == reqs[4]["n_prompt"]
assert row["requested_output_tokens"] == 21
assert row["output_tokens"] == sum(r["n_generated"] for r in reqs) <= 21
assert row["finished_length"] + row["finished_eos"] == 5
for r in reqs:
    assert (r["finish"] == "length" and r["n_generated"] == r["max_tokens"]) or \
           (r["finish"] == "eos" and 1 <= r["n_generated"] <= r["max_tokens"]), r
print("dataset ok")
PY
printf '{"prompt": 3}\n' >"$TMP/bad.jsonl"
expect_error "bad.jsonl:1" "$LLMI" bench --device cpu -m "$MODEL" --dataset "$TMP/bad.jsonl"
printf '{"prompt": "x", "max_tokens": 0}\n' >"$TMP/bad2.jsonl"
expect_error "max_tokens" "$LLMI" bench --device cpu -m "$MODEL" --dataset "$TMP/bad2.jsonl"
expect_error "no prompts" "$LLMI" bench --device cpu -m "$MODEL" --dataset /dev/null
