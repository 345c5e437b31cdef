#!/usr/bin/env python3
"""Compares two llmi greedy runs of the same prompts (generate --json --logprobs 5 --temp 0
--ignore-eos), e.g. --device cuda against --device cpu, with tests/compare_topk.py's rule:
identical prompt ids; walk each continuation to its first difference, where each side's
token must be in the other's top-5 (a near-tie broken the other way by bf16 rounding);
logprobs within --max-lp-diff nats on the matched prefix.

    gpu-compare.py REF.jsonl GOT.jsonl [--max-lp-diff X]   exit 0 pass, 1 fail, 2 bad input

Prints compare_topk's per-prompt lines and a last line
    summary: F/N prompts match all tokens, M/T tokens before the first difference, ...
Python 3 standard library only; gpu-check.sh runs it on the GPU machine.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import compare_topk  # noqa: E402


def as_ref(rec):
    """An llmi --json record in the shape of compare_topk's llama.cpp reference."""
    lps = rec.get("logprobs") or []
    return {"prompt": rec.get("prompt", f"index {rec.get('index')}"), "prompt_ids": rec.get("prompt_ids"),
            "tokens": rec.get("tokens") or [], "logprobs": [float(e["logprob"]) for e in lps],
            "top5": [[[int(t["id"]), float(t["logprob"])] for t in e.get("top", [])] for e in lps]}


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    lp = compare_topk.DEFAULT_MAX_LP_DIFF
    if "--max-lp-diff" in argv:
        lp = float(argv[argv.index("--max-lp-diff") + 1])
        args = [a for a in args if a != argv[argv.index("--max-lp-diff") + 1]]
    if len(args) != 2:
        print(__doc__)
        return 2
    try:
        ref = [as_ref(r) for r in compare_topk.load_jsonl(args[0])]
        got = compare_topk.load_jsonl(args[1])
    except (OSError, ValueError, KeyError) as e:
        print(f"gpu-compare: {e}")
        return 2
    # compare_topk's agreement minimums are for its 24 prompts x 64 tokens (620 tokens, 5 whole
    # prompts: ~40% and ~20%); these runs vary in size, so the same shares of this run's
    total = sum(len(r["tokens"]) for r in ref)
    min_matched = (total * 620 + 1535) // 1536
    min_full = len(ref) * 5 // 24
    return 1 if compare_topk.compare(ref, got, max_lp_diff=lp, min_matched=min_matched, min_full=min_full) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
