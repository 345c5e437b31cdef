#!/usr/bin/env bash
# --turns on SmolLM2: every turn's prompt is the previous prompt + its answer + the chat
# template's text to the next user message + that message (--input-len random tokens) + the
# assistant turn opened.  Token counts checked against Hugging Face's tokenization of
# SmolLM2's template pieces (testdata/bench/chat-turns-smollm2.json).  With prefix caching
# (the default) turn k+1 finds turn k's full blocks cached; with --no-prefix-cache nothing.
. "$(dirname "$0")/../lib/common.sh"
need_model
run() {  # run NAME [flags]
  local name=$1; shift
  "$LLMI" bench -m "$MODEL" --turns 3 --num-requests 2 --input-len 8 --output-len 4 -t 2 \
    --per-request "$TMP/$name.jsonl" -o json "$@" >"$TMP/$name.json" 2>"$TMP/err" || fail "$name: $(cat "$TMP/err")"
}
run on
run off --no-prefix-cache
"$LLMI" bench -m "$MODEL" --turns 2 --num-requests 1 --input-len 4 --output-len 2 -t 2 >"$TMP/t.md" 2>"$TMP/err" \
  || fail "md: $(cat "$TMP/err")"
python3 - "$TMP" "$TESTDATA/bench/chat-turns-smollm2.json" <<'PY' || exit 1
import json, sys
d, ref = sys.argv[1], json.load(open(sys.argv[2]))
A, U, G = (len(ref[k]["ids"]) for k in ("before_first_user", "after_user", "answer_to_user"))
BS, L = 16, 8
for name in ("on", "off"):
    recs = [json.loads(l) for l in open(f"{d}/{name}.jsonl")]
    assert len(recs) == 6, len(recs)
    for c in range(2):
        turns = [r for r in recs if r["conversation"] == c]
        assert [r["turn"] for r in turns] == [1, 2, 3], turns
        assert turns[0]["n_prompt"] == A + L + U, (turns[0]["n_prompt"], A, L, U)
        for prev, cur in zip(turns, turns[1:]):
            assert prev["n_generated"] == 4 and prev["finish"] == "length", prev
            assert cur["n_prompt"] == prev["n_prompt"] + prev["n_generated"] + G + L + U, (prev, cur)
            # turn k computed its prompt and all but its last generated token: those full blocks
            want = (prev["n_prompt"] + prev["n_generated"] - 1) // BS * BS if name == "on" else 0
            assert cur["n_cached"] == want, (name, cur["n_cached"], want)
    row = json.load(open(f"{d}/{name}.json"))[0]
    assert row["turns"] == 3 and row["num_requests"] == 2 and row["prefix_cache"] == name, row
    for k in (1, 2, 3):
        mine = [r for r in recs if r["turn"] == k]
        assert row[f"turn{k}_prompt_tokens"] == sum(r["n_prompt"] for r in mine) / 2, (k, row)
        assert abs(row[f"turn{k}_cached_tokens"] - sum(r["n_cached"] for r in mine) / 2) < 1e-9, (k, row)
        assert row[f"turn{k}_ttft_ms_mean"] > 0
    assert row["cached_prompt_tokens"] == sum(r["n_cached"] for r in recs)
    print(name, "prompts", [r["n_prompt"] for r in recs[:3]], "cached", [r["n_cached"] for r in recs[:3]],
          "ttft/turn ms", [round(row[f"turn{k}_ttft_ms_mean"], 1) for k in (1, 2, 3)])
md = open(f"{d}/t.md").read()
hdr = [l for l in md.splitlines() if l.startswith("|")][0]
assert "TTFT t1 ms" in hdr and "TTFT t2 ms" in hdr and "1 conv x2 turns in4/out2" in md, md
PY
expect_error "chat template" "$LLMI_SAN" bench --dummy "$TESTDATA/bench/tiny-llama.json" --turns 2 --num-requests 1
expect_error "--turns" "$LLMI_SAN" bench -m "$MODEL" --turns 17
expect_error "--prefix-len" "$LLMI_SAN" bench -m "$MODEL" --turns 2 --prefix-len 16
expect_error "context" "$LLMI_SAN" bench -m "$MODEL" --turns 16 --num-requests 1 --input-len 64 --output-len 64 -c 512
