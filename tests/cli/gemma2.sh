#!/usr/bin/env bash
# Gemma 2 end to end (the logits against transformers are tests/test_hf_models.c's):
#   - a GGUF without gemma2.attn_logit_softcapping, final_logit_softcapping and
#     attention.sliding_window runs as one that says llama.cpp's defaults (50, 30, 4096:
#     src/models/gemma2.cpp), and not as the file with its own caps;
#   - the checkpoint's chat template (Gemma 2's released one) renders --chat prompts, and
#     greedy generation runs on cpu;
#   - llmi quantize refuses a Gemma 2 model with one line, writing nothing.
. "$(dirname "$0")/../lib/common.sh"
G="$TESTDATA/hf/gemma2-capped.f32.gguf"
ref_prompts gemma2-capped
same() {  # same A B: equal prompt logprobs
  python3 - "$1" "$2" <<'PY'
import json, sys
a, b = ([json.loads(l)["prompt_logprobs"] for l in open(p)] for p in sys.argv[1:3])
assert len(a) == len(b) == 3
sys.exit(0 if a == b else 1)
PY
}
keys='["gemma2.attn_logit_softcapping", "gemma2.final_logit_softcapping", "gemma2.attention.sliding_window"]'
absent=$(gguf_edited "$G" absent "for k in $keys: gguf_edit.drop_key(g, k)") || fail "editing $G"
said=$(gguf_edited "$G" said "
gguf_edit.set_f32(g, 'gemma2.attn_logit_softcapping', 50.0)
gguf_edit.set_f32(g, 'gemma2.final_logit_softcapping', 30.0)
for e in g['kv']:
    if e[0] == 'gemma2.attention.sliding_window': e[2] = struct.pack('<I', 4096)") || fail "editing $G"
"$LLMI" "${plp[@]}" -m "$G" >"$TMP/own.out" || fail "prompt logprobs of $G"
for f in "$absent" "$said"; do
  "$LLMI" "${plp[@]}" -m "$f" >"$f.out" || fail "prompt logprobs of $f"
done
same "$absent.out" "$said.out" || fail "the GGUF without the caps and the window differs from one saying 50, 30, 4096"
! same "$absent.out" "$TMP/own.out" || fail "the GGUF's own caps (0.75, 2.5) and window (6) changed nothing"
echo "gemma2 GGUF without soft-cap and window keys = with 50, 30 and 4096 (llama.cpp's defaults); != the file's own"

C="$TESTDATA/hf/gemma2-classic"
"$LLMI" generate --device cpu -m "$C" --chat -p "Good morrow" -n 8 --temp 0 --json --no-stats >"$TMP/chat.json" ||
  fail "--chat on $C"
python3 - "$TMP/chat.json" "$C" <<'PY' || fail "the chat prompt"
import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[0])
tok = json.load(open(sys.argv[2] + "/tokenizer.json"))
vocab = {v: k for k, v in tok["model"]["vocab"].items()}
vocab.update({t["id"]: t["content"] for t in tok["added_tokens"]})
ids = r["prompt_ids"]
def piece(i):
    p = vocab[i]
    return chr(int(p[3:5], 16)) if p.startswith("<0x") and len(p) == 6 else p.replace("\u2581", " ")
text = "".join(piece(i) for i in ids)
want = "<bos><start_of_turn>user\nGood morrow<end_of_turn>\n<start_of_turn>model\n"
assert text == want, repr(text)
assert r["generated_tokens"] == 8 and r["prompt_tokens"] == len(ids)
print(f"--chat prompt of {len(ids)} tokens in Gemma 2's template ({text!r}), 8 tokens generated")
PY

expect_error "gemma2 model, which quantize does not write yet" "$LLMI" quantize -m "$C" --method rtn --group-size 32 \
  -o "$TMP/q"
[ ! -e "$TMP/q" ] || fail "quantize of a Gemma 2 model wrote $TMP/q"
echo "ok"
