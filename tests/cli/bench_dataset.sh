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
# --temp etc. (generate's sampling flags): 16 copies of one prompt whose greedy answer is an
# immediate EOS; greedy gives 16 equal lengths, sampling at 1.5 with no cut does not (all 16
# ending at once would take odds of about 0.5^16).  The row records the temperature.
for i in $(seq 16); do echo "Write a short poem about the sea."; done >"$TMP/same.txt"
for t in 0 1.5; do
  "$LLMI" bench --device cpu -m "$MODEL" --dataset "$TMP/same.txt" --output-len 24 --temp "$t" --top-k 0 --top-p 1 --min-p 0 \
    --seed "$((SEED % 100000))" --per-request "$TMP/s$t.jsonl" -o json >"$TMP/s$t.json" 2>"$TMP/err" || fail "--temp $t: $(cat "$TMP/err")"
done
python3 - "$TMP" <<'PY' || fail "bench sampling"
import json, sys
d = sys.argv[1]
g = [json.loads(l)["n_generated"] for l in open(f"{d}/s0.jsonl")]
s = [json.loads(l)["n_generated"] for l in open(f"{d}/s1.5.jsonl")]
assert len(set(g)) == 1, ("greedy lengths differ", g)
assert s != g, ("sampling gave greedy's lengths", s)
assert json.load(open(f"{d}/s0.json"))[0]["temperature"] == 0 and json.load(open(f"{d}/s1.5.json"))[0]["temperature"] == 1.5
print(f"greedy lengths {g[0]} x16; sampled {sorted(s)}")
PY
expect_error "--top-p" "$LLMI" bench --device cpu -m "$MODEL" -p 8 -n 2 --top-p 0.5
