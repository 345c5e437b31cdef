#!/usr/bin/env python3
"""Compares llmi's prompt logprobs with Hugging Face transformers' logits (testdata/hf/ref).

    compare_prompt_logprobs_hf.py REF.json LLMI.jsonl --tol X --slack Y    exit 0 pass, 1 fail
    compare_prompt_logprobs_hf.py REF.json LLMI.jsonl --nearer-than OTHER.json

REF.json is a reference of scripts/make-hf-test-models.py: per sequence its token ids and a file of
transformers' fp32 logits, (n_tokens, n_vocab) little-endian.  LLMI.jsonl is llmi's --json
output for the same ids as "prompt_token_ids" with --prompt-logprobs N, one line per
sequence in order.  Per sequence: the prompt ids are the reference's, the first entry is
null and there is one entry per token; at every position p >= 1 the token's logprob is
log_softmax(logits[p - 1])[id] within --tol, and each of llmi's top-N entries has
transformers' logprob within --tol of llmi's and is no more than --slack below
transformers' k-th best there (a near-tie may swap, nothing else).  --nearer-than: for
outputs too coarse for limits (a 4-bit model), llmi's mean |logprob diff| to REF must be
below half of that to OTHER (a reference of the same ids from another model).  Standard
library only.
"""
import json
import math
import os
import struct
import sys


def log_softmax_rows(ref_path, s, V):
    raw = open(os.path.join(os.path.dirname(ref_path), s["file"]), "rb").read()
    logits = struct.unpack(f"<{len(raw) // 4}f", raw)
    for p in range(len(s["ids"])):
        row = logits[p * V:(p + 1) * V]
        mx = max(row)
        lse = mx + math.log(sum(math.exp(x - mx) for x in row))
        yield [x - lse for x in row]


def mean_diff(ref_path, outs):
    ref = json.load(open(ref_path))
    tot = n = 0
    for s, o in zip(ref["seqs"], outs):
        for p, row in enumerate(log_softmax_rows(ref_path, s, ref["n_vocab"])):
            if p + 1 < len(s["ids"]):
                tot += abs(o["prompt_logprobs"][p + 1]["logprob"] - row[s["ids"][p + 1]])
                n += 1
    return tot / n


def main(argv):
    if len(argv) == 4 and argv[2] == "--nearer-than":
        outs = [json.loads(l) for l in open(argv[1]) if l.strip()]
        near, far = mean_diff(argv[0], outs), mean_diff(argv[3], outs)
        ok = near < 0.5 * far
        print(f"{'PASS' if ok else 'FAIL'}: mean |logprob diff| {near:.3f} from {os.path.basename(argv[0])}, "
              f"{far:.3f} from {os.path.basename(argv[3])}")
        return 0 if ok else 1
    if len(argv) != 6 or argv[2] != "--tol" or argv[4] != "--slack":
        print(__doc__, file=sys.stderr)
        return 2
    ref_path, out_path, tol, slack = argv[0], argv[1], float(argv[3]), float(argv[5])
    ref = json.load(open(ref_path))
    V = ref["n_vocab"]
    outs = [json.loads(l) for l in open(out_path) if l.strip()]
    if len(outs) != len(ref["seqs"]):
        print(f"FAIL llmi wrote {len(outs)} records for {len(ref['seqs'])} sequences")
        return 1
    worst, worst_top, n, fails = 0.0, 0.0, 0, 0
    for i, (s, o) in enumerate(zip(ref["seqs"], outs)):
        raw = open(os.path.join(os.path.dirname(ref_path), s["file"]), "rb").read()
        logits = struct.unpack(f"<{len(raw) // 4}f", raw)
        ids, plp = s["ids"], o.get("prompt_logprobs")
        if o.get("prompt_ids") != ids or not isinstance(plp, list) or len(plp) != len(ids) or plp[0] is not None:
            print(f"FAIL sequence {i}: prompt_ids / prompt_logprobs do not list the {len(ids)} reference ids")
            return 1
        for p in range(1, len(ids)):
            row = logits[(p - 1) * V:p * V]
            mx = max(row)
            lse = mx + math.log(sum(math.exp(x - mx) for x in row))
            e, want = plp[p], row[ids[p]] - lse
            n += 1
            d = abs(e["logprob"] - want) if e["id"] == ids[p] else math.inf
            worst = max(worst, d)
            if d > tol:
                fails += 1
                print(f"FAIL sequence {i} position {p}: id {e['id']} logprob {e['logprob']:.6f}, "
                      f"transformers: id {ids[p]} {want:.6f}")
            best = sorted(row, reverse=True)
            for k, t in enumerate(e["top"]):
                ref_lp = row[t["id"]] - lse
                dt = abs(t["logprob"] - ref_lp)
                worst_top = max(worst_top, dt)
                if dt > tol or row[t["id"]] < best[k] - slack:
                    fails += 1
                    print(f"FAIL sequence {i} position {p}: top {k} id {t['id']} ({t['logprob']:.6f}; transformers "
                          f"{ref_lp:.6f}, its {k}-th best logit {best[k]:.6f}, this one {row[t['id']]:.6f})")
    print(f"{'PASS' if not fails else 'FAIL'}: {ref['model']}: {n} positions, max |logprob diff| {worst:.2e} "
          f"(top entries {worst_top:.2e}), {fails} failures")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
