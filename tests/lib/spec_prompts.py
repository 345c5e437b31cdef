#!/usr/bin/env python3
"""The prompt set of the speculative-decoding CLI tests: the 24 prompts of the greedy test
set (testdata/llamacpp/prompts.jsonl) plus 8 input-quoting prompts ("Repeat the following
text word for word") over wikitext-2 lines drawn with the run's seed.

    spec_prompts.py WIKI_TEST_RAW GREEDY_PROMPTS_JSONL OUT_JSONL SEED
"""
import json
import random
import sys

lines = [l.strip() for l in open(sys.argv[1], encoding="utf-8") if len(l.strip()) > 200 and not l.startswith(" =")]
rnd = random.Random(int(sys.argv[4]))
out = [l.strip() for l in open(sys.argv[2], encoding="utf-8") if l.strip()]
for i in range(8):
    text = " ".join(rnd.choice(lines).split()[:60])
    out.append(json.dumps({"prompt": f"Repeat the following text word for word.\n\nText: {text}\n\nRepeated text: {text[:40]}"}))
open(sys.argv[3], "w", encoding="utf-8").write("\n".join(out) + "\n")
