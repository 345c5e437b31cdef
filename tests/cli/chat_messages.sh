#!/usr/bin/env bash
# A --prompts line's "messages" (OpenAI's chat form) end to end on SmolLM2: for every
# SmolLM2 conversation of testdata/bench/chat-messages.jsonl (jinja2's renderings, see
# tests/test_tokenizer.c's tok_chat_messages_jinja for every template), the prompt llmi
# builds is the token ids of jinja2's text; --chat --system stands in for a missing system
# message; "n" and the sampling fields still apply; malformed lists: one line naming the
# line, exit 2, under ASan/UBSan.
. "$(dirname "$0")/../lib/common.sh"
need_model
L="$LLMI_SAN"
python3 - "$TESTDATA/bench/chat-messages.jsonl" "$TMP" <<'PY' || fail "no SmolLM2 conversations in chat-messages.jsonl"
import json, sys
cases = [json.loads(l) for l in open(sys.argv[1])]
smol = [c for c in cases if c["name"] == "smollm2"]
assert len(smol) >= 4, len(smol)
with open(f"{sys.argv[2]}/lines.jsonl", "w") as f:
    for i, c in enumerate(smol):
        f.write(json.dumps({"messages": c["messages"]}) + "\n")
        open(f"{sys.argv[2]}/want{i}.txt", "w").write(c["out"])
print(len(smol))
PY
n=$(wc -l <"$TMP/lines.jsonl")
"$LLMI_SAN" generate --device cpu -m "$MODEL" --prompts "$TMP/lines.jsonl" -n 0 --json --no-stats >"$TMP/got.jsonl" ||
  fail "--prompts with messages"
for i in $(seq 0 $((n - 1))); do
  "$LLMI" generate --device cpu -m "$MODEL" -f "$TMP/want$i.txt" -n 0 --json --no-stats >"$TMP/want$i.json" ||
    fail "the jinja2 text as a plain prompt"
done
python3 - "$TMP" "$n" <<'PY' || fail "messages"
import json, sys
d, n = sys.argv[1], int(sys.argv[2])
got = [json.loads(l) for l in open(f"{d}/got.jsonl")]
for i in range(n):
    want = json.load(open(f"{d}/want{i}.json"))["prompt_ids"]
    assert got[i]["prompt_ids"] == want, (i, got[i]["prompt_ids"], want)
print(f"{n} SmolLM2 conversations: the prompt is jinja2's text, token for token")
PY
# --system for a line without a system message; a line's own wins
printf '{"messages": [{"role": "user", "content": "Hi"}]}\n{"messages": [{"role": "system", "content": "Own."}, {"role": "user", "content": "Hi"}]}\n' >"$TMP/sys.jsonl"
"$LLMI" generate --device cpu -m "$MODEL" --prompts "$TMP/sys.jsonl" --chat --system "Flag." -n 0 --json --no-stats \
  --verbose-prompt >"$TMP/sys.out" 2>"$TMP/sys.err" || fail "--system run"
grep -q "Flag" "$TMP/sys.err" && grep -q "Own" "$TMP/sys.err" || fail "--system / a line's system message: $(head -c 600 "$TMP/sys.err")"
# without --chat too: messages lines take --system; plain lines alone cannot, nor lines with their own
"$LLMI" generate --device cpu -m "$MODEL" --prompts "$TMP/sys.jsonl" --system "Flag." -n 0 --json --no-stats \
  --verbose-prompt >"$TMP/sys2.out" 2>"$TMP/sys2.err" || fail "--system without --chat"
cmp -s "$TMP/sys.out" "$TMP/sys2.out" || python3 -c 'import json,sys; a=[json.loads(l)["prompt_ids"] for l in open(sys.argv[1])]; b=[json.loads(l)["prompt_ids"] for l in open(sys.argv[2])]; sys.exit(a != b)' \
  "$TMP/sys.out" "$TMP/sys2.out" || fail "--system without --chat: other prompt ids than with --chat"
printf 'plain\n' >"$TMP/plain.txt"
expect_error "--system: no request takes it" "$LLMI" generate --device cpu -m "$MODEL" --prompts "$TMP/plain.txt" --system S -n 1
tail -1 "$TMP/sys.jsonl" >"$TMP/own.jsonl"
expect_error "--system: no request takes it" "$LLMI" generate --device cpu -m "$MODEL" --prompts "$TMP/own.jsonl" --system S -n 1
expect_error "--system: needs --chat" "$LLMI" generate --device cpu -m "$MODEL" -p hi --system S -n 1
printf '{"messages": [{"role": "user", "content": "Say a word."}], "n": 2, "temperature": 1, "seed": 5, "max_tokens": 6}\n' >"$TMP/n.jsonl"
"$LLMI" generate --device cpu -m "$MODEL" --prompts "$TMP/n.jsonl" --json --no-stats >"$TMP/n.out" || fail "messages with n"
[ "$(wc -l <"$TMP/n.out")" -eq 2 ] || fail "messages with n 2: $(cat "$TMP/n.out")"
echo "--system and n with messages: ok"

bad() { printf '%s\n' "$2" >"$TMP/bad.jsonl"; expect_error "$1" "$L" generate --device cpu -m "$MODEL" --prompts "$TMP/bad.jsonl"; }
bad 'bad.jsonl:1: "messages"' '{"messages": "hi"}'
bad 'bad.jsonl:1: "messages"' '{"messages": []}'
bad 'bad.jsonl:1: message 1' '{"messages": [{"role": "user"}]}'
bad 'bad.jsonl:1: message 2 has role "user"' '{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}'
bad 'bad.jsonl:1: message 2 has role "system"' '{"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]}'
bad 'bad.jsonl:1: "messages" must end with a user message' '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}'
bad 'bad.jsonl:1: give one of "prompt", "messages" and "prompt_token_ids"' '{"prompt": "x", "messages": [{"role": "user", "content": "a"}]}'
echo "chat messages: ok"
