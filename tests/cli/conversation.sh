#!/usr/bin/env bash
# generate -cnv on SmolLM2: user turns from stdin (a trailing '\' joins lines), each answered
# on the conversation so far.  Every turn's prompt ids are checked piece by piece: the
# previous prompt and its answer as generated (end-of-generation token left out), then the
# chat template's pieces as Hugging Face tokenizes them (testdata/bench/chat-turns-smollm2.json)
# around the user message, whose ids decode to the message through SmolLM2's own vocabulary
# (tokenizer.json, byte-level).  With the prefix cache the earlier turns' full blocks are
# served from it; without, nothing is.  Bad combinations and a full context: one clear line.
. "$(dirname "$0")/../lib/common.sh"
need_model
python3 - "$SEED" >"$TMP/turns.txt" <<'PY'
import random, sys
rnd = random.Random(int(sys.argv[1]))
asks = ["What is the capital of France?", "Name three colours.", "Why is the sky blue?", "Count to five.",
        "Tell me a joke about cats.", "What is 12 times 12?", "Translate 'good morning' to Spanish."]
turns = rnd.sample(asks, 3)
turns[1] = turns[1] + " \\\nAnswer briefly."            # two lines, one turn
print("\n\n".join(turns))                                 # blank lines between: skipped
PY
run() {  # run NAME [flags]: the conversation, JSON per turn
  local name=$1; shift
  "$LLMI_SAN" generate --device cpu -m "$MODEL" -cnv --json -n 12 --temp 0 "$@" <"$TMP/turns.txt" \
    >"$TMP/$name.jsonl" 2>"$TMP/$name.err" || fail "$name: $(tail -3 "$TMP/$name.err")"
}
run cached
run uncached --no-prefix-cache
KEEP=("$TMP/turns.txt" "$TMP/cached.jsonl")
python3 - "$TMP" "$TESTDATA/bench/chat-turns-smollm2.json" "$TESTDATA/tokenizer/smollm2/tokenizer.json" <<'PY' || fail "conversation ids"
import json, sys
d, ref, tj = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
FIRST, AFTER, NEXT = (ref[k]["ids"] for k in ("before_first_user", "after_user", "answer_to_user"))
EOS = 2   # <|im_end|>
# byte-level decoding through the vocabulary (GPT-2's bytes_to_unicode)
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
byte_of = {chr(c): b for b, c in zip(bs, cs)}
piece = {i: s for s, i in tj["model"]["vocab"].items()}
decode = lambda ids: bytes(byte_of[ch] for i in ids for ch in piece[i]).decode("utf-8")
users = [t for t in open(f"{d}/turns.txt").read().replace("\\\n", "\n").split("\n\n")]
users = [u.strip("\n") for u in users if u.strip()]
for name in ("cached", "uncached"):
    recs = [json.loads(l) for l in open(f"{d}/{name}.jsonl")]
    assert len(recs) == 3, (name, len(recs))
    prev = None
    for k, r in enumerate(recs):
        p = r["prompt_ids"]
        if k == 0:
            head = FIRST
        else:
            answer = prev["tokens"][:-1] if prev["finish_reason"] == "eos" else prev["tokens"]
            assert prev["finish_reason"] != "eos" or prev["tokens"][-1] == EOS, prev
            head = prev["prompt_ids"] + answer + NEXT
        assert p[:len(head)] == head, (name, k, "the conversation so far is not the prompt's start")
        assert p[-len(AFTER):] == AFTER, (name, k, p[-len(AFTER):])
        msg = decode(p[len(head):len(p) - len(AFTER)])
        assert msg == users[k], (name, k, msg, users[k])
        if k > 0:
            computed = len(prev["prompt_ids"]) + len(prev["tokens"]) - 1   # the last token was never fed
            want = 0 if name == "uncached" else computed // 16 * 16
            assert r["cached_tokens"] == want, (name, k, r["cached_tokens"], want)
        prev = r
    print(f"{name}: 3 turns, prompts {[len(r['prompt_ids']) for r in recs]}, cached {[r['cached_tokens'] for r in recs]}")
PY
# greedy answers do not depend on the cache
python3 -c 'import json,sys; a=[json.loads(l)["tokens"] for l in open(sys.argv[1])]; b=[json.loads(l)["tokens"] for l in open(sys.argv[2])]; sys.exit(a != b)' \
  "$TMP/cached.jsonl" "$TMP/uncached.jsonl" || fail "answers differ with and without the prefix cache"
echo "answers equal with and without the prefix cache"
# plain text: one answer line per turn on stdout, a stats line per turn on stderr
"$LLMI" generate --device cpu -m "$MODEL" -cnv -n 6 --temp 0 <"$TMP/turns.txt" >"$TMP/plain.out" 2>"$TMP/plain.err" ||
  fail "plain: $(tail -2 "$TMP/plain.err")"
[ "$(grep -c '^llmi: turn [123]: prompt' "$TMP/plain.err")" -eq 3 ] || fail "plain: want 3 turn lines: $(cat "$TMP/plain.err")"
# a full context ends the conversation with one line and exit 1, after the turns that fit
"$LLMI" generate --device cpu -m "$MODEL" -cnv -n 40 --temp 0 --ignore-eos -c 112 --no-stats <"$TMP/turns.txt" \
  >"$TMP/full.out" 2>"$TMP/full.err"; rc=$?
[ $rc -eq 1 ] || [ $rc -eq 2 ] || fail "full context: exit $rc: $(cat "$TMP/full.err")"
[ "$(wc -l <"$TMP/full.err")" -eq 1 ] && grep -q "turn [23].*context" "$TMP/full.err" ||
  fail "full context: want one line naming the turn and the context: $(cat "$TMP/full.err")"
echo "full context: $(cat "$TMP/full.err")"
expect_error "--conversation" "$LLMI_SAN" generate --device cpu -m "$MODEL" -cnv -p hi
expect_error "chat template" "$LLMI_SAN" generate --device cpu -m "$TESTDATA/hf/llama-gqa-rope3" -cnv
echo "conversation: ok"
