#!/usr/bin/env python3
"""Compares llmi's greedy generations with llama.cpp's (testdata/llamacpp/greedy.jsonl).

    compare_topk.py REF.jsonl LLMI.jsonl [--max-lp-diff X]   exit 0 pass, 1 fail, 2 bad input
    compare_topk.py --self-test REF.jsonl                    checks this comparator itself

Python 3 standard library only (CI has no pip packages).

Per prompt, in input order:
  1. prompt_ids must equal llama.cpp's exactly (tokenizer and BOS rule).
  2. Walk both 64-token greedy continuations to their first difference.  Quantized
     kernels round differently, so a near-tie may break the other way; at that one
     position llmi's token must be in llama.cpp's top-5 and llama.cpp's token in
     llmi's top-5 (the rule vLLM's tests use).  Past it the texts are unrelated.
  3. On the matched prefix, llmi's logprob of each token is within --max-lp-diff nats
     of llama.cpp's (catches a wrong softmax or temperature that rule 2 would miss).
  4. llmi's own record is consistent: logprobs[i].id == tokens[i], and with --temp 0
     that token has the highest logprob of its top list.
"""
import copy
import json
import sys

DEFAULT_MAX_LP_DIFF = 1.0


def load_jsonl(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON: {e}")
    return out


def llmi_top(entry):
    """[(id, logprob)] of one llmi logprobs entry."""
    return [(int(t["id"]), float(t["logprob"])) for t in entry.get("top", [])]


def compare(ref, got, max_lp_diff=DEFAULT_MAX_LP_DIFF, log=print):
    """Returns the number of failures; logs one line per prompt and one per failure."""
    fails = 0

    def fail(msg):
        nonlocal fails
        fails += 1
        log("FAIL " + msg)

    if len(got) != len(ref):
        fail(f"llmi wrote {len(got)} records, llama.cpp reference has {len(ref)}")
        return fails
    total_match = full = 0
    worst_lp = 0.0
    for i, (r, g) in enumerate(zip(ref, got)):
        tag = f"prompt {i} ({r['prompt'][:30]!r})"
        if g.get("index", i) != i:
            fail(f"{tag}: llmi record {i} has index {g.get('index')}, want input order")
            continue
        if g.get("prompt_ids") != r["prompt_ids"]:
            a, b = g.get("prompt_ids") or [], r["prompt_ids"]
            k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
            fail(f"{tag}: prompt_ids differ at {k}: llmi {a[k:k + 5]} (n={len(a)}) "
                 f"vs llama.cpp {b[k:k + 5]} (n={len(b)})")
            continue
        rt, gt = r["tokens"], g.get("tokens") or []
        lps = g.get("logprobs") or []
        if len(gt) != len(rt) or len(lps) != len(gt):
            fail(f"{tag}: llmi generated {len(gt)} tokens with {len(lps)} logprobs entries, "
                 f"want {len(rt)} (is --ignore-eos / -n honoured?)")
            continue
        bad = False
        for j, (t, e) in enumerate(zip(gt, lps)):
            top = llmi_top(e)
            if int(e.get("id", -1)) != t or not top:
                fail(f"{tag}: llmi logprobs[{j}] id {e.get('id')} / top {top[:2]} vs token {t}")
                bad = True
                break
            if float(e["logprob"]) < max(lp for _, lp in top) - 1e-5:
                fail(f"{tag}: llmi token {t} at {j} has logprob {e['logprob']} below its top "
                     f"{top[0]}: not greedy")
                bad = True
                break
        if bad:
            continue
        k = next((j for j in range(len(rt)) if rt[j] != gt[j]), len(rt))
        for j in range(k):
            d = abs(float(lps[j]["logprob"]) - float(r["logprobs"][j]))
            worst_lp = max(worst_lp, d)
            if d > max_lp_diff:
                fail(f"{tag}: token {j} ({rt[j]}) logprob llmi {lps[j]['logprob']:.4f} "
                     f"vs llama.cpp {r['logprobs'][j]:.4f}: differ by {d:.3f} > {max_lp_diff}")
                bad = True
                break
        if bad:
            continue
        total_match += k
        if k == len(rt):
            full += 1
            log(f"ok   {tag}: {k}/{len(rt)} tokens match")
            continue
        ref_top = [int(t) for t, _ in r["top5"][k]]
        got_top = [t for t, _ in llmi_top(lps[k])]
        if gt[k] in ref_top and rt[k] in got_top:
            log(f"ok   {tag}: {k}/{len(rt)} tokens match; at {k} llmi {gt[k]} / llama.cpp {rt[k]} "
                f"are in each other's top-5")
        else:
            fail(f"{tag}: {k}/{len(rt)} tokens match; at {k} llmi chose {gt[k]} "
                 f"(llama.cpp top-5 {r['top5'][k]}), llama.cpp chose {rt[k]} "
                 f"(llmi top {llmi_top(lps[k])})")
    n_tok = sum(len(r["tokens"]) for r in ref)
    log(f"summary: {full}/{len(ref)} prompts match all tokens, {total_match}/{n_tok} tokens "
        f"before the first difference, max |logprob diff| on matched tokens {worst_lp:.4f}")
    return fails


def as_llmi(ref):
    """llama.cpp's reference written as llmi's --json output (the self-test's 'llmi')."""
    out = []
    for i, r in enumerate(ref):
        lps = []
        for t, lp, top in zip(r["tokens"], r["logprobs"], r["top5"]):
            lps.append({"id": t, "piece": "", "logprob": lp,
                        "top": [{"id": a, "piece": "", "logprob": b} for a, b in top]})
        out.append({"index": i, "prompt_ids": list(r["prompt_ids"]), "tokens": list(r["tokens"]),
                    "text": r.get("text", ""), "finish_reason": "length",
                    "prompt_tokens": len(r["prompt_ids"]), "generated_tokens": len(r["tokens"]),
                    "logprobs": lps})
    return out


def diverge(rec, k, new_tok, new_top):
    """rec with its generation changed from position k on, as a divergent llmi would be."""
    rec["tokens"] = rec["tokens"][:k] + [new_tok] * (len(rec["tokens"]) - k)
    for j in range(k, len(rec["tokens"])):
        rec["logprobs"][j] = {"id": new_tok, "piece": "", "logprob": -0.1,
                              "top": [{"id": t, "piece": "", "logprob": -0.1 - 0.01 * n}
                                      for n, t in enumerate(new_top)]}


def self_test(ref_path):
    ref = load_jsonl(ref_path)
    quiet = lambda msg: None  # noqa: E731
    cases = []
    cases.append(("identical", as_llmi(ref), True))

    g = as_llmi(ref)
    g[1]["prompt_ids"][-1] += 1
    cases.append(("one prompt id changed", g, False))

    g = as_llmi(ref)
    g[2]["prompt_ids"] = [1] + g[2]["prompt_ids"]
    cases.append(("extra BOS", g, False))

    # Second choice of llama.cpp, with llama.cpp's token in llmi's top-5: allowed.
    g = as_llmi(ref)
    k = 10
    second = ref[3]["top5"][k][1][0]
    diverge(g[3], k, second, [second, ref[3]["tokens"][k], 7, 8, 9])
    cases.append(("diverge to llama.cpp's 2nd choice", g, True))

    # A token outside llama.cpp's top-5.
    g = as_llmi(ref)
    ref_top = {t for t, _ in ref[4]["top5"][k]}
    outsider = next(t for t in range(100, 50000) if t not in ref_top)
    diverge(g[4], k, outsider, [outsider, ref[4]["tokens"][k], 7, 8, 9])
    cases.append(("diverge outside llama.cpp's top-5", g, False))

    # llmi's token in llama.cpp's top-5 but llama.cpp's token not in llmi's top-5.
    g = as_llmi(ref)
    second = ref[5]["top5"][k][1][0]
    others = [t for t in range(100, 200) if t != ref[5]["tokens"][k]][:4]
    diverge(g[5], k, second, [second] + others)
    cases.append(("llama.cpp's token missing from llmi's top-5", g, False))

    g = as_llmi(ref)
    g[6]["logprobs"][0]["logprob"] -= 3.0
    g[6]["logprobs"][0]["top"][0]["logprob"] -= 3.0
    cases.append(("logprob off by 3 nats", g, False))

    g = as_llmi(ref)
    g[0]["tokens"] = g[0]["tokens"][:20]
    g[0]["logprobs"] = g[0]["logprobs"][:20]
    cases.append(("stopped early", g, False))

    g = as_llmi(ref)[:-1]
    cases.append(("record missing", g, False))

    g = as_llmi(ref)
    g[7]["logprobs"][3]["top"].insert(0, {"id": 5, "piece": "", "logprob": 0.0})
    cases.append(("not greedy", g, False))

    bad = 0
    for name, got, want_pass in cases:
        fails = compare(ref, json.loads(json.dumps(copy.deepcopy(got))), log=quiet)
        ok = (fails == 0) == want_pass
        print(f"{'ok  ' if ok else 'FAIL'} self-test {name}: {fails} failures, want "
              f"{'pass' if want_pass else 'fail'}")
        bad += not ok
    print(f"self-test: {len(cases) - bad}/{len(cases)} cases behave")
    return 1 if bad else 0


def main(argv):
    if len(argv) == 2 and argv[0] == "--self-test":
        return self_test(argv[1])
    max_lp = DEFAULT_MAX_LP_DIFF
    if len(argv) == 4 and argv[2] == "--max-lp-diff":
        max_lp = float(argv[3])
        argv = argv[:2]
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        ref, got = load_jsonl(argv[0]), load_jsonl(argv[1])
    except (OSError, ValueError) as e:
        print(f"compare_topk: {e}", file=sys.stderr)
        return 2
    fails = compare(ref, got, max_lp)
    print(f"{'PASS' if fails == 0 else 'FAIL'}: {fails} failures")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
