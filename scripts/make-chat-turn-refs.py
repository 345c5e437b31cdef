#!/usr/bin/env python3
"""Reference data for `llmi bench --turns` (multi-turn conversations).

Writes, from the repository root:
  testdata/bench/chat-turns.jsonl   jinja2 renderings of two-turn conversations
      [system?, user, assistant, user] + generation prompt, for every chat template in
      testdata/tokenizer/chat.jsonl; tests/test_bench.c checks that llmi's
      tok_chat_format(system, user1) + answer + tok_chat_next_turn(user2) is the same text.
  testdata/bench/chat-turns-smollm2.json   Hugging Face `tokenizers` ids of the pieces a
      bench conversation is made of with SmolLM2's template (testdata/tokenizer/smollm2):
      the text before the first user message, after a user message, and between an answer
      and the next user message; tests/cli/bench_turns.sh checks every turn's prompt length
      against them.

    pip install jinja2 tokenizers
    python3 scripts/make-chat-turn-refs.py
No llmi code is involved in making either file.
"""
import json
import os

import jinja2
from tokenizers import Tokenizer

CHAT = "testdata/tokenizer/chat.jsonl"
OUT = "testdata/bench"
MARK = "\x00MSG\x00"   # stands for a message's content, then cut out


def env():
    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)
    e = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    e.globals["raise_exception"] = raise_exception
    return e


def main():
    e = env()
    seen, out, smol = set(), [], None
    for line in open(CHAT, encoding="utf-8"):
        r = json.loads(line)
        if r["name"] in seen or "strftime_now" in r["template"]:
            continue   # one record per template; Llama-3.2 writes today's date
        seen.add(r["name"])
        t = e.from_string(r["template"])
        if r["name"] == "smollm2":
            smol = t
        # Llama-2's template writes ' ' + answer.strip(): the answer as generated brings the space
        answer = " Hi there." if r["kind"] == "llama2" else "Hi there."
        no_system = r["kind"] == "mistral" or "System role not supported" in r["template"]   # Mistral, Gemma 2
        # Mistral v3-Tekken writes the system message with the last user message: a conversation
        # growing turn by turn cannot keep it (llmi refuses --system there), so no system case
        no_system = no_system or r["kind"] == "mistral-tekken"
        for system in ([None] if no_system else [None, "You are terse."]):
            msgs = ([] if system is None else [{"role": "system", "content": system}]) + [
                {"role": "user", "content": "Hello!"}, {"role": "assistant", "content": answer},
                {"role": "user", "content": "And now?"}]
            s = t.render(messages=msgs, add_generation_prompt=True, bos_token=r["bos"], eos_token=r["eos"])
            out.append(json.dumps({"kind": r["kind"], "name": r["name"], "template": r["template"], "bos": r["bos"],
                                   "eos": r["eos"], "system": system, "user1": "Hello!", "answer": answer,
                                   "user2": "And now?", "out": s}, ensure_ascii=False))
    os.makedirs(OUT, exist_ok=True)
    open(os.path.join(OUT, "chat-turns.jsonl"), "w", encoding="utf-8").write("\n".join(out) + "\n")

    tok = Tokenizer.from_file("testdata/tokenizer/smollm2/tokenizer.json")
    one = smol.render(messages=[{"role": "user", "content": MARK}], add_generation_prompt=True)
    two = smol.render(messages=[{"role": "user", "content": "x"}, {"role": "assistant", "content": MARK},
                                {"role": "user", "content": MARK}], add_generation_prompt=True)
    before_user, after_user = one.split(MARK)
    between = two.split(MARK)[1]          # after the answer, before the next user message
    ids = lambda s: tok.encode(s, add_special_tokens=True).ids
    ref = {"tokenizer": "testdata/tokenizer/smollm2/tokenizer.json",
           "before_first_user": {"text": before_user, "ids": ids(before_user)},
           "after_user": {"text": after_user, "ids": ids(after_user)},
           "answer_to_user": {"text": between, "ids": ids(between)}}
    json.dump(ref, open(os.path.join(OUT, "chat-turns-smollm2.json"), "w", encoding="utf-8"), ensure_ascii=False,
              indent=1)
    print(len(out), "renderings;", {k: len(v["ids"]) for k, v in ref.items() if isinstance(v, dict)})


if __name__ == "__main__":
    main()
