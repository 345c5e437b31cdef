#!/usr/bin/env bash
# vLLM's request controls in --prompts lines (allowed_token_ids, bad_words,
# include_stop_str_in_output, skip_special_tokens / --special, truncate_prompt_tokens), end
# to end on SmolLM2 with greedy decoding, each against the free run of the same prompt:
#   - allowed_token_ids holding every token of the free run changes nothing; without the
#     free run's first token the first token is another allowed one, the most likely of
#     them by the model's own logprobs, and sampled tokens stay inside the list too;
#   - bad_words: a one-token word never appears, in either spelling (vLLM also bans the word
#     after a space); of a two-token phrase the first token still appears where the free
#     run has it, the phrase never does, and the prompt's tokens do not start one; with
#     --spec ngram the same tokens (a banned proposal is rejected);
#   - include_stop_str_in_output: the text runs to the end of the stop string; a stop id's
#     and EOS's text is not part of the output unless it asks for them (vLLM's rendering);
#   - skip_special_tokens false and --special: special tokens' text is in the output;
#   - truncate_prompt_tokens N: the prompt's last N tokens, as given by prompt_token_ids;
#   - allowed_token_ids and bad_words that leave nothing end the request with one line;
#   - through the CUDA backend on the CPU emulation (those rows are sampled on the host);
#     under ASan/UBSan; bad values: one line naming the line and key.
. "$(dirname "$0")/../lib/common.sh"
need_model
P="The capital of France is"
gen=(generate --device cpu -m "$MODEL" --json --no-stats -t 2)
line() {  # line JSON-FIELDS: a --prompts line for P with greedy decoding and the fields
  printf '{"prompt": "%s", "max_tokens": 24, "temperature": 0, "ignore_eos": true%s}\n' "$P" "${1:+, $1}"
}
line '"logprobs": 20' >"$TMP/free.jsonl"
"$LLMI" "${gen[@]}" --prompts "$TMP/free.jsonl" >"$TMP/free.out" || fail "free run"
# spellings of words as the tokenizer gives them (a prompt's ids: SmolLM2 adds no BOS)
printf '{"prompt": "Paris", "max_tokens": 0}\n{"prompt": " Paris", "max_tokens": 0}\n' >"$TMP/spell.jsonl"
"$LLMI" "${gen[@]}" --prompts "$TMP/spell.jsonl" >"$TMP/spell.out" || fail "spelling run"
read -r F0 ALLOWED NOT_F0 WORD2 < <(python3 - "$TMP/free.out" "$TMP/spell.out" "$LLMI_TEST_SEED" <<'PY'
import json, random, sys
free = json.load(open(sys.argv[1]))
F = free["tokens"]
spell = [json.loads(l)["prompt_ids"] for l in open(sys.argv[2])]
assert all(len(s) == 1 for s in spell) and F[0] == spell[1][0], (F[:3], spell)   # " Paris" first
rng = random.Random(int(sys.argv[3]))
allowed = sorted(set(F) | set(rng.sample(range(49152), 8)))
not_f0 = [t for t in allowed if t != F[0]]
# two words the free run writes after its first tokens, one token each ("United States")
pieces = [e["piece"] for e in free["logprobs"]]
word = lambda p: p.startswith(" ") and p[1:].isalpha()
i = next(i for i in range(2, len(F) - 1) if word(pieces[i]) and word(pieces[i + 1]))
print(F[0], ",".join(map(str, allowed)), ",".join(map(str, not_f0)), (pieces[i] + pieces[i + 1]).strip())
PY
) || fail "cannot read the free run"
echo "free run starts with token $F0 (\" Paris\"); a two-token phrase it writes: \"$WORD2\""
{
  line "\"allowed_token_ids\": [$ALLOWED]"
  line "\"allowed_token_ids\": [$NOT_F0], \"logprobs\": 20"
  printf '{"prompt": "%s", "max_tokens": 24, "temperature": 1, "ignore_eos": true, "seed": %d, "n": 6, "allowed_token_ids": [%s]}\n' \
    "$P" "$((LLMI_TEST_SEED % 100000))" "$NOT_F0"
  line '"bad_words": ["Paris"]'
  line "\"bad_words\": [\"$WORD2\"]"
  line "\"bad_words\": [\"$WORD2\", \"Paris\"], \"spec\": \"ngram\", \"spec_k\": 3"
  line "\"bad_words\": [\"$WORD2\", \"Paris\"]"
  line '"stop": ["population"], "include_stop_str_in_output": true'
  line '"stop": ["population"]'
  line '"skip_special_tokens": false, "max_tokens": 40'
  line '"max_tokens": 40'
  line '"truncate_prompt_tokens": 3'
  line '"bad_words": ["is Paris"]'
} >"$TMP/c.jsonl"
"$LLMI" "${gen[@]}" --prompts "$TMP/c.jsonl" >"$TMP/c.out" || fail "controls run: $(tail -3 "$TMP/c.out")"
python3 - "$TMP/free.out" "$TMP/c.out" "$TMP/spell.out" "$WORD2" <<'PY' || fail "request controls"
import json, sys
free = json.load(open(sys.argv[1]))
F, text = free["tokens"], free["text"]
out = [json.loads(l) for l in open(sys.argv[2])]
spell = [json.loads(l)["prompt_ids"][0] for l in open(sys.argv[3])]
word2 = sys.argv[4]
allowed, not_f0, sampled = out[0], out[1], out[2:8]
assert allowed["tokens"] == F, ("allowed_token_ids with every free token", allowed["tokens"], F)
print(f"allowed_token_ids with the free run's tokens and 8 more: the same {len(F)} tokens")
S = set(json.loads(open(sys.argv[2].replace('.out', '.jsonl')).read().splitlines()[1])["allowed_token_ids"])
t = not_f0["tokens"]
assert all(x in S for x in t) and t[0] != F[0], t
# the first token is the most likely allowed one: no allowed token above it in the model's top 20
top = not_f0["logprobs"][0]
above = [a["id"] for a in top["top"] if a["logprob"] > top["logprob"]]
assert not (set(above) & S), (top["id"], above)
print(f"without token {F[0]}: first token {t[0]} ({top['logprob']:.3f}), every token allowed, "
      f"{len(above)} more likely tokens not allowed")
for r in sampled:
    assert all(x in S for x in r["tokens"]) and len(r["tokens"]) == 24, r["tokens"]
print(f"6 sampled completions: all {sum(len(r['tokens']) for r in sampled)} tokens allowed")
one, two, spec, nospec = out[8], out[9], out[10], out[11]
assert not set(spell) & set(one["tokens"]), (spell, one["tokens"])
print(f"bad_words [\"Paris\"]: neither spelling {spell} among {len(one['tokens'])} tokens: {one['text'][:40]!r}")
def contains(seq, sub):
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))
i = next(i for i in range(len(F)) if free["logprobs"][i]["piece"].strip() + free["logprobs"][i + 1]["piece"] == word2
         or (free["logprobs"][i]["piece"] + free["logprobs"][i + 1]["piece"]).strip() == word2)
sub = F[i:i + 2]
assert two["tokens"][:i + 1] == F[:i + 1] and two["tokens"][i + 1] != F[i + 1] and not contains(two["tokens"], sub), \
    (i, sub, two["tokens"], F)
print(f"bad_words [{word2!r}]: the free run's first {i + 1} tokens (its first token included), then not {sub}")
assert spec["tokens"] == nospec["tokens"] and not contains(spec["tokens"], sub), (spec["tokens"], nospec["tokens"])
print(f"with --spec ngram: the same {len(spec['tokens'])} tokens ({spec['spec_accepted']} of "
      f"{spec['spec_proposed']} proposals accepted)")
inc, exc = out[12], out[13]
k = text.find("population")
assert k >= 0 and inc["text"] == text[:k + 10] and exc["text"] == text[:k] and inc["finish_reason"] == "stop", \
    (inc["text"], exc["text"], text)
print(f"include_stop_str_in_output: {inc['text']!r}, without: {exc['text']!r}")
sp, nosp = out[14], out[15]
assert sp["tokens"] == nosp["tokens"] and "<|im_end|>" in sp["text"] and "<|im_end|>" not in nosp["text"], \
    (sp["text"], nosp["text"])
print(f"skip_special_tokens false: {sp['text'].count('<|im_end|>')} <|im_end|> in the text, none by default")
tr = out[16]
assert tr["prompt_tokens"] == 3 and tr["prompt_ids"] == free["prompt_ids"][-3:], (tr["prompt_ids"], free["prompt_ids"])
print(f"truncate_prompt_tokens 3: prompt ids {tr['prompt_ids']} of {free['prompt_ids']}")
assert out[17]["tokens"] == F, out[17]["tokens"]
print("bad_words [\"is Paris\"]: the prompt's \" is\" does not count, \" Paris\" comes first as in the free run")
PY
# truncation means the prompt's last tokens: the same output as those ids given
python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])][16]; print(json.dumps({"prompt_token_ids": r["prompt_ids"], "max_tokens": 24, "temperature": 0, "ignore_eos": True}))' \
  "$TMP/c.out" >"$TMP/tr.jsonl"
"$LLMI" "${gen[@]}" --prompts "$TMP/tr.jsonl" >"$TMP/tr.out" || fail "prompt_token_ids run"
python3 -c 'import json,sys; a=[json.loads(l) for l in open(sys.argv[1])][16]; b=json.load(open(sys.argv[2])); assert a["tokens"] == b["tokens"], (a["tokens"], b["tokens"])' \
  "$TMP/c.out" "$TMP/tr.out" || fail "truncate_prompt_tokens differs from its last ids given"
echo "truncate_prompt_tokens 3: the same tokens as prompt_token_ids of those 3"

# stop ids and EOS: in "tokens", their text only with include_stop_str_in_output
chat=(generate --device cpu -m "$MODEL" --json --no-stats -t 2 --chat --temp 0 -n 40 -p "Answer with one word: is the sky blue?")
"$LLMI" "${chat[@]}" --logprobs 1 >"$TMP/eos.json" || fail "EOS run"
read -r x < <(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["finish_reason"] == "eos"; print(r["tokens"][1])' "$TMP/eos.json") ||
  fail "the chat answer does not end with EOS"
"$LLMI" "${chat[@]}" --logprobs 1 --stop-token-id "$x" >"$TMP/sid.json" || fail "stop id run"
"$LLMI" "${chat[@]}" --logprobs 1 --special >"$TMP/eos-sp.json" || fail "--special EOS run"
python3 - "$TMP/eos.json" "$TMP/sid.json" "$TMP/eos-sp.json" <<'PY' || fail "stop token text"
import json, sys
eos, sid, sp = (json.load(open(f)) for f in sys.argv[1:4])
pieces = lambda r: [e["piece"] for e in r["logprobs"]]
assert sid["finish_reason"] == "stop" and len(sid["tokens"]) == 2 and sid["text"] == pieces(sid)[0], sid
print(f"--stop-token-id {sid['tokens'][1]}: tokens {sid['tokens']}, text {sid['text']!r} (without the stop token's)")
assert eos["text"] == sp["text"] == "".join(pieces(eos)[:-1]), (eos["text"], sp["text"])
print(f"EOS: not in the text, --special or not ({eos['text']!r})")
PY
Q='"messages": [{"role": "user", "content": "Answer with one word: is the sky blue?"}], "max_tokens": 40, "temperature": 0'
{
  printf '{%s, "include_stop_str_in_output": true, "skip_special_tokens": false, "stop_token_ids": [%s]}\n' "$Q" "$x"
  printf '{%s, "include_stop_str_in_output": true, "skip_special_tokens": false}\n' "$Q"
} >"$TMP/inc.jsonl"
"$LLMI" generate --device cpu -m "$MODEL" --json --no-stats -t 2 --prompts "$TMP/inc.jsonl" >"$TMP/inc.out" || fail "include run"
python3 - "$TMP/inc.out" "$TMP/sid.json" "$TMP/eos.json" <<'PY' || fail "include_stop_str_in_output with stop tokens"
import json, sys
a, b = (json.loads(l) for l in open(sys.argv[1]))
sid, eos = json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
assert a["tokens"] == sid["tokens"] and a["text"] == "".join(e["piece"] for e in sid["logprobs"]), (a, sid)
assert b["tokens"] == eos["tokens"] and b["text"] == eos["text"] + "<|im_end|>", (b["text"], eos["text"])
print(f"include_stop_str_in_output: stop id's text kept ({a['text']!r}), EOS's too with special tokens ({b['text']!r})")
PY

# nothing left: one line, that request fails, the others are served
{
  printf '{"prompt": "%s", "max_tokens": 4, "allowed_token_ids": [%s], "bad_words": ["Paris"]}\n' "$P" "$F0"
  printf '{"prompt": "%s", "max_tokens": 4}\n' "$P"
} >"$TMP/none.jsonl"
"$LLMI" "${gen[@]}" --prompts "$TMP/none.jsonl" >"$TMP/none.out" 2>"$TMP/none.err"; rc=$?
[ $rc -eq 1 ] && grep -q "allowed_token_ids and bad_words leave no token" "$TMP/none.err" || fail "empty set: rc $rc, $(cat "$TMP/none.err")"
python3 -c 'import json,sys; a,b=[json.loads(l) for l in open(sys.argv[1])]; assert a["finish_reason"] == "grammar" and a["generated_tokens"] == 0 and b["generated_tokens"] == 4, (a, b)' \
  "$TMP/none.out" || fail "empty set: outputs"
echo "nothing allowed: $(grep -m1 'leave no token' "$TMP/none.err"); the other request served"

# the CUDA backend (emulated, on a tiny test model: SmolLM2 is slow there): those rows go
# to the host sampler; the lists hold, greedy and sampled
if [ -x "$LLMI_EMU" ]; then
  {
    printf '{"prompt_token_ids": [1, 2, 3], "max_tokens": 8, "temperature": 0, "allowed_token_ids": [5, 9, 17, 40]}\n'
    printf '{"prompt_token_ids": [1, 2, 3], "max_tokens": 8, "temperature": 1, "seed": 4, "n": 3, "allowed_token_ids": [5, 9, 17, 40]}\n'
    printf '{"prompt_token_ids": [1, 2, 3], "max_tokens": 8, "temperature": 0, "ignore_eos": true}\n'
  } >"$TMP/emu.jsonl"
  emu_run emu generate --device cuda -m "$TESTDATA/hf/llama-gqa-rope3" --json --no-stats --prompts "$TMP/emu.jsonl"
  python3 - "$TMP/emu.out" <<'PY' || fail "emulated cuda: allowed_token_ids"
import json, sys
out = [json.loads(l) for l in open(sys.argv[1])]
assert all(all(t in (5, 9, 17, 40) for t in r["tokens"]) for r in out[:4]), [r["tokens"] for r in out]
assert not all(t in (5, 9, 17, 40) for t in out[4]["tokens"]), out[4]["tokens"]
print(f"emulated cuda: allowed_token_ids holds over {sum(len(r['tokens']) for r in out[:4])} tokens "
      f"(without it: {out[4]['tokens']})")
PY
else
  echo "(no $LLMI_EMU: the emulated CUDA part is skipped; make emu)"
fi

# ASan/UBSan over every control
"$LLMI_SAN" "${gen[@]}" --prompts "$TMP/c.jsonl" -n 6 >"$TMP/san.out" 2>"$TMP/err" || fail "llmi-san: $(head -c 600 "$TMP/err")"
echo "llmi-san: $(wc -l <"$TMP/san.out") requests with the controls"

bad() {  # bad WORD FIELDS: a line with FIELDS is refused naming WORD
  printf '{"prompt": "x", "max_tokens": 1, %s}\n' "$2" >"$TMP/b.jsonl"
  expect_error "$1" "$LLMI_SAN" generate --device cpu -m "$MODEL" --prompts "$TMP/b.jsonl"
}
bad 'b.jsonl:1: "allowed_token_ids"' '"allowed_token_ids": []'
bad 'b.jsonl:1: "allowed_token_ids"' '"allowed_token_ids": 5'
bad 'b.jsonl:1: "allowed_token_ids"' '"allowed_token_ids": [1.5]'
bad 'b.jsonl:1: "allowed_token_ids"' '"allowed_token_ids": [-1]'
bad 'outside the vocabulary' '"allowed_token_ids": [49152]'
bad 'b.jsonl:1: "bad_words"' '"bad_words": "Paris"'
bad 'b.jsonl:1: "bad_words"' '"bad_words": [" "]'
bad 'b.jsonl:1: "bad_words"' '"bad_words": [5]'
bad 'b.jsonl:1: "include_stop_str_in_output"' '"include_stop_str_in_output": 1'
bad 'b.jsonl:1: "skip_special_tokens"' '"skip_special_tokens": "no"'
bad 'b.jsonl:1: "truncate_prompt_tokens"' '"truncate_prompt_tokens": 0'
bad 'b.jsonl:1: "truncate_prompt_tokens"' '"truncate_prompt_tokens": 2.5'
