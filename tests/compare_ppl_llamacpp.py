#!/usr/bin/env python3
"""llmi's perplexity against llama-perplexity's on the same windows (llama.cpp's scoring
rule, tests/cli/ref_llamacpp_ppl.sh): the overall figure and each window's own perplexity,
derived from the running values both print.

    python3 tests/compare_ppl_llamacpp.py REF.json LLMI.json LLMI.stderr --overall 0.001 --window 0.015

REF.json is scripts/ref-llamacpp.py's file (ppl, running_ppl, chunks); LLMI.json is `llmi
bench --ppl -o json`'s output and LLMI.stderr what it printed (its running values).  Prints
each window and a summary; exits non-zero naming every limit passed.
"""
import argparse
import json
import math
import re
import sys


def windows(running):
    """Each window's own perplexity: the running value after window i is exp of the mean
    nll over windows 1..i, every window scoring the same number of tokens."""
    out, prev = [], 0.0
    for i, r in enumerate(running, 1):
        total = i * math.log(r)
        out.append(math.exp(total - prev))
        prev = total
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ref")
    ap.add_argument("got")
    ap.add_argument("stderr")
    ap.add_argument("--overall", type=float, required=True, help="limit on the relative difference of the figures")
    ap.add_argument("--window", type=float, required=True, help="limit on each window's relative difference")
    a = ap.parse_args()
    ref = json.load(open(a.ref))
    got = json.load(open(a.got))
    got = got[0] if isinstance(got, list) else got
    ppl, want = float(got["ppl"]), float(ref["ppl"])
    rel = abs(ppl - want) / want
    run = [float(x) for x in re.findall(r"\[\d+\]([0-9.]+),", open(a.stderr).read())]
    if len(run) != ref["chunks"] or len(ref["running_ppl"]) != ref["chunks"]:
        sys.exit(f"llmi printed {len(run)} running values, want {ref['chunks']}")
    bad, worst = [], 0.0
    for i, (x, y) in enumerate(zip(windows(run), windows(ref["running_ppl"])), 1):
        d = (x - y) / y
        worst = max(worst, abs(d))
        print(f"  window {i}: llmi {x:.4f} llama.cpp {y:.4f} ({d:+.3%})")
        if abs(d) > a.window:
            bad.append(f"window {i} differs by {d:+.3%} (> {a.window:.1%})")
    if rel >= a.overall:
        bad.append(f"overall relative difference {rel:.4%} >= {a.overall:.2%}")
    print(f"llmi ppl {ppl:.4f} +/- {float(got['ppl_stderr']):.4f}, llama.cpp {want:.4f} +/- {ref['ppl_stderr']:.4f} "
          f"({ref['chunks']} chunks of {ref['ctx']}): relative difference {rel:.4%}, each window at most {worst:.2%}")
    if bad:
        sys.exit("; ".join(bad))


if __name__ == "__main__":
    main()
