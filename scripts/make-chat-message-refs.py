#!/usr/bin/env python3
"""Reference data for a `llmi generate --prompts` line's "messages" (OpenAI's chat form).

Writes testdata/bench/chat-messages.jsonl: for every chat template of
testdata/tokenizer/chat.jsonl that scripts/make-chat-turn-refs.py renders (the same jinja2
environment and the same templates left out), jinja2's rendering with the generation prompt
of several conversations: five messages (user, assistant, user, assistant, user) with plain
contents and with contents wrapped in spaces and newlines, a lone user message, and an
answer holding quotes, a backslash, an em dash and an emoji, and an answer with a reasoning
block ("<think>...</think>", which Qwen3's template drops from the history), and contents
wrapped in non-ASCII whitespace (what str.isspace() matches); each without a system message
and, where the template takes one, with a plain one and with one wrapped in spaces and a
newline.  tests/test_tokenizer.c (tok_chat_messages_jinja)
checks that llmi renders the messages of a --prompts line as jinja2 does, and
tests/cli/chat_messages.sh that the SmolLM2 conversations become the same prompt tokens.

    pip install jinja2
    python3 scripts/make-chat-message-refs.py
No llmi code is involved in making the file.
"""
import importlib.util
import json
import os

spec = importlib.util.spec_from_file_location("turns", os.path.join(os.path.dirname(__file__), "make-chat-turn-refs.py"))
turns = importlib.util.module_from_spec(spec)
spec.loader.exec_module(turns)

CONVERSATIONS = [
    ["Hello!", "Hi there.", "And now?", "Now this.", "Last one."],
    ["  spaced user \n", " Spaced answer. \n\n", "\nsecond\n", "\n\nTwo lines:\nok \n", "third  "],
    ["Only one."],
    ["Quote me.", "He said \"no\" \u2014 fine \\ \U0001F642", "Again?"],
    ["Think first.", "<think>\nhmm, two steps\n</think>\n\nThe answer.", "Why?"],
    ["\u00a0nbsp around\u3000", "answer\u00a0", "\x0bnext\x1f"],
]
# a system message with spaces and newlines around it (templates trim it, or not, as they
# trim user messages, or not)
SYSTEMS = ["You are terse.", "  Spaced system. \n"]


def main():
    e = turns.env()
    seen, out = set(), []
    for line in open(turns.CHAT, encoding="utf-8"):
        r = json.loads(line)
        if r["name"] in seen or "strftime_now" in r["template"]:
            continue   # one record per template; Llama-3.2 writes today's date
        seen.add(r["name"])
        t = e.from_string(r["template"])
        no_system = r["kind"] == "mistral" or "System role not supported" in r["template"]   # Mistral, Gemma 2
        for system in ([None] if no_system else [None] + SYSTEMS):
            for conv in CONVERSATIONS:
                msgs = [] if system is None else [{"role": "system", "content": system}]
                msgs += [{"role": "user" if i % 2 == 0 else "assistant", "content": c} for i, c in enumerate(conv)]
                s = t.render(messages=msgs, add_generation_prompt=True, bos_token=r["bos"], eos_token=r["eos"])
                out.append(json.dumps({"kind": r["kind"], "name": r["name"], "template": r["template"], "bos": r["bos"],
                                       "eos": r["eos"], "messages": msgs, "out": s}, ensure_ascii=False))
    open(os.path.join(turns.OUT, "chat-messages.jsonl"), "w", encoding="utf-8").write("\n".join(out) + "\n")
    print(len(out), "renderings of", len(seen), "templates")


if __name__ == "__main__":
    main()
