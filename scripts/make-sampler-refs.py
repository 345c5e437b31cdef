#!/usr/bin/env python3
"""Make reference outputs of llama.cpp's default sampler chain for llmi's sampler tests.

Runs llama.cpp's own samplers (libllama.so, through the ctypes bindings of the
llama-cpp-python 0.3.36 sdist) on synthetic logits and writes
testdata/sampler/llamacpp.jsonl.  See testdata/sampler/PROVENANCE.md for how
llama.cpp was built and for the exact semantics of every stage.

The chain is built the way common/sampling.cpp (common_sampler_init) builds the
default one, minus DRY and minus the final dist sampler:

    logit_bias -> penalties -> top_n_sigma -> top_k -> typical -> top_p
               -> min_p -> xtc -> temp_ext(temp, 0, 1)

with min_keep = 0 everywhere.  Every stage is always added, even with its "off"
value (llama.cpp then installs an "empty" no-op sampler), so the off semantics
are covered too.  After llama_sampler_apply the remaining candidates are read
back (id, logit) in the order llama.cpp leaves them; candidates whose logit is
-inf (masked by top_n_sigma or biased to -inf, probability 0) are dropped and
counted in "n_masked"; the others get a float64 softmax of their final logits.

A float64 mirror of the documented semantics runs next to llama.cpp.  It is used
(1) to reject cases where a cut decision lies too close to its threshold (so
that float32 vs float64 implementations, summation order, etc. cannot change the
kept set), and (2) as a cross-check: for every case the mirror must give the same
kept set and probabilities as llama.cpp, otherwise the script fails.

Usage (see PROVENANCE.md):
    PYTHONPATH=/tmp/lcp/llama_cpp_python-0.3.36 LLAMA_CPP_LIB_PATH=/tmp/lcp-build/bin \
        /work/refenv/bin/python scripts/make-sampler-refs.py [--self-test-only] [--out PATH]
"""

import argparse
import ctypes
import json
import math
import os
import sys

import numpy as np

SEED = 20250611          # numpy seed for the case generator
XTC_SEED = 1234          # irrelevant: XTC is only used with probability 0 or 1
NEG_INF = float("-inf")

L = None                 # llama_cpp.llama_cpp, loaded in main()


def load_llama():
    global L
    import llama_cpp.llama_cpp as _L  # noqa: E402  (needs PYTHONPATH / LLAMA_CPP_LIB_PATH)
    L = _L
    L.llama_backend_init()


# --------------------------------------------------------------------------------------
# llama.cpp runner
# --------------------------------------------------------------------------------------

TOKEN_DATA_DTYPE = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


def run_llamacpp(logits, history, P):
    """Apply the chain to logits (float32 array, ids 0..V-1 in order, sorted=false).

    Returns (ids, final_logits_float32) in the order llama.cpp leaves them."""
    V = len(logits)
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())

    lb = P["logit_bias"]
    lb_arr = (L.llama_logit_bias * max(1, len(lb)))()
    for i, (tid, b) in enumerate(lb):
        lb_arr[i].token = int(tid)
        lb_arr[i].bias = float(b)
    stages = [
        L.llama_sampler_init_logit_bias(V, len(lb), lb_arr),
        L.llama_sampler_init_penalties(V, int(P["penalty_last_n"]), float(P["repeat_penalty"]),
                                       float(P["frequency_penalty"]), float(P["presence_penalty"])),
        L.llama_sampler_init_top_n_sigma(float(P["top_n_sigma"])),
        L.llama_sampler_init_top_k(int(P["top_k"])),
        L.llama_sampler_init_typical(float(P["typical_p"]), 0),
        L.llama_sampler_init_top_p(float(P["top_p"]), 0),
        L.llama_sampler_init_min_p(float(P["min_p"]), 0),
        L.llama_sampler_init_xtc(float(P["xtc_probability"]), float(P["xtc_threshold"]), 0, XTC_SEED),
        # common_sampler_init uses temp_ext(temp, dynatemp_range = 0, dynatemp_exponent = 1)
        L.llama_sampler_init_temp_ext(float(P["temperature"]), 0.0, 1.0),
    ]
    for s in stages:
        L.llama_sampler_chain_add(chain, s)

    for tok in history:
        L.llama_sampler_accept(chain, int(tok))

    buf = np.zeros(V, dtype=TOKEN_DATA_DTYPE)
    buf["id"] = np.arange(V, dtype=np.int32)
    buf["logit"] = np.asarray(logits, dtype=np.float32)
    base = buf.ctypes.data
    cur = L.llama_token_data_array(
        data=ctypes.cast(ctypes.c_void_p(base), L.llama_token_data_p),
        size=V, selected=-1, sorted=False)
    L.llama_sampler_apply(chain, ctypes.byref(cur))

    # XTC may advance cur.data inside buf
    start = ctypes.cast(cur.data, ctypes.c_void_p).value
    off = (start - base) // TOKEN_DATA_DTYPE.itemsize
    assert (start - base) % TOKEN_DATA_DTYPE.itemsize == 0 and 0 <= off and off + cur.size <= V
    out = buf[off:off + cur.size].copy()
    L.llama_sampler_free(chain)
    return out["id"].astype(np.int64), out["logit"].astype(np.float32)


def softmax64(x):
    x = np.asarray(x, dtype=np.float64)
    m = np.max(x)
    e = np.exp(x - m)
    return e / e.sum()


def finalize(ids, logits):
    """Drop -inf candidates, softmax (float64) the rest."""
    logits = np.asarray(logits, dtype=np.float64)
    keep = logits != NEG_INF
    ids_k = np.asarray(ids)[keep]
    lg_k = logits[keep]
    probs = softmax64(lg_k) if len(lg_k) else np.zeros(0)
    return ids_k, probs, int((~keep).sum())


# --------------------------------------------------------------------------------------
# float64 mirror of the documented semantics, with decision margins
# --------------------------------------------------------------------------------------

class Reject(Exception):
    pass


def tol_logit(x):
    return 1e-5 * max(1.0, abs(x))


def tol_cum(n):
    # float32 accumulations over n terms (softmax normaliser and running sums)
    return 2e-6 + 3e-7 * math.sqrt(max(1, n))


def mirror(logits, history, P, strict=True):
    """Returns dict(ids, logits, order_dependent, effective).  Raises Reject when a
    decision is within tolerance of its threshold (strict) or typical would see p == 0."""
    V = len(logits)
    ids = np.arange(V)
    lg = np.asarray(logits, dtype=np.float64).copy()
    is_sorted = False
    order_dep = []
    effective = []

    def sort_desc():
        nonlocal ids, lg, is_sorted
        o = np.argsort(-lg, kind="stable")
        ids, lg = ids[o], lg[o]
        is_sorted = True

    def check_gap(i_last_kept, stage):
        # the kept set is sorted[:i_last_kept+1]; it must be separated from sorted[i_last_kept+1]
        if i_last_kept + 1 >= len(lg):
            return
        a, b = lg[i_last_kept], lg[i_last_kept + 1]
        if a == NEG_INF:           # cut among -inf candidates: they are dropped anyway
            return
        if a == b:
            order_dep.append(stage)
            return
        if a - b < tol_logit(a):
            raise Reject(stage + ":gap")

    # 1. logit bias: every entry adds (the array is still in id order here)
    if P["logit_bias"]:
        for tid, b in P["logit_bias"]:
            lg[tid] += b
        effective.append("logit_bias")

    # 2. penalties
    n, r, f, pp = P["penalty_last_n"], P["repeat_penalty"], P["frequency_penalty"], P["presence_penalty"]
    n = max(n, 0)
    if not (n == 0 or (r == 1.0 and f == 0.0 and pp == 0.0)):
        window = history[-n:] if n > 0 else []
        counts = {}
        for t in window:
            counts[t] = counts.get(t, 0) + 1
        changed = False
        for i in range(len(ids)):
            c = counts.get(int(ids[i]), 0)
            if c == 0:
                continue
            if lg[i] <= 0:
                lg[i] *= r
            else:
                lg[i] /= r
            lg[i] -= c * f + pp
            changed = True
        is_sorted = False
        if changed:
            effective.append("penalties")

    # 3. top-n-sigma (masks to -inf, removes nothing)
    s = P["top_n_sigma"]
    if s > 0 and len(lg) > 1:
        fin = lg[lg != NEG_INF]
        mx = fin.max() if len(fin) else lg[0]
        mean = fin.mean() if len(fin) else 0.0
        std = math.sqrt(((fin - mean) ** 2).mean()) if len(fin) else 0.0
        thr = mx - s * std
        d = np.abs(fin - thr)
        if strict and len(d) and d.min() < 1e-5 * (abs(mx) + s * std + 1.0):
            raise Reject("top_n_sigma:thr")
        mask = lg < thr
        if mask.any():
            lg = lg.copy()
            lg[mask] = NEG_INF
            effective.append("top_n_sigma")

    # 4. top-k
    k = P["top_k"]
    if k > 0:
        k = min(k, len(lg))
        if not is_sorted:
            sort_desc()
        if strict:
            check_gap(k - 1, "top_k")
        if k < len(lg):
            effective.append("top_k")
        ids, lg = ids[:k], lg[:k]

    # 5. typical
    y = P["typical_p"]
    if y < 1.0:
        sort_desc()
        if np.any(lg == NEG_INF) or (lg[0] - lg[-1] > 80.0):
            raise Reject("typical:p0")       # llama.cpp computes 0*log(0) = NaN there
        p = softmax64(lg)
        ent = -(p * np.log(p)).sum()
        sh = np.abs(-np.log(p) - ent)
        o = np.argsort(sh, kind="stable")
        cum = np.cumsum(p[o])
        hit = np.nonzero(cum > y)[0]
        last = int(hit[0]) + 1 if len(hit) else len(o)
        if strict:
            tc = tol_cum(len(p))
            if cum[last - 1] - y < tc:
                raise Reject("typical:cum_hi")
            if last >= 2 and y - cum[last - 2] < tc:
                raise Reject("typical:cum_lo")
            if last < len(o):
                a, b = sh[o[last - 1]], sh[o[last]]
                if a == b:
                    order_dep.append("typical")
                elif b - a < 1e-5 * max(1.0, a):
                    raise Reject("typical:gap")
        if last < len(o):
            effective.append("typical")
        ids, lg = ids[o[:last]], lg[o[:last]]
        is_sorted = False

    # 6. top-p
    tp = P["top_p"]
    if tp < 1.0:
        sort_desc()
        p = softmax64(lg)
        cum = np.cumsum(p)
        hit = np.nonzero(cum >= tp)[0]
        last = int(hit[0]) + 1 if len(hit) else len(p)
        if strict:
            tc = tol_cum(len(p))
            if tp > 0.0:
                if cum[last - 1] - tp < tc:
                    raise Reject("top_p:cum_hi")
                if last >= 2 and tp - cum[last - 2] < tc:
                    raise Reject("top_p:cum_lo")
            check_gap(last - 1, "top_p")
        if last < len(lg):
            effective.append("top_p")
        ids, lg = ids[:last], lg[:last]

    # 7. min-p (on logits: keep logit >= max + log(p)); order is preserved
    mp = P["min_p"]
    if mp > 0.0 and len(lg):
        mx = lg.max()
        thr = mx + math.log(mp)
        fin = lg[lg != NEG_INF]
        if strict and np.abs(fin - thr).min() < tol_logit(thr):
            raise Reject("min_p:thr")
        keep = lg >= thr
        if not keep.all():
            effective.append("min_p")
        ids, lg = ids[keep], lg[keep]

    # 8. XTC (probability 1 here, so it always runs when enabled)
    xp, xt = P["xtc_probability"], P["xtc_threshold"]
    if xp > 0.0 and xt <= 0.5 and len(lg) >= 2:
        assert xp == 1.0
        sort_desc()
        p = softmax64(lg)
        pos_last = 0
        for i in range(len(p)):
            if strict and abs(p[i] - xt) < tol_cum(len(p)):
                raise Reject("xtc:thr")
            if p[i] >= xt:
                pos_last = i
            else:
                break
        if pos_last > 0:
            if strict:
                check_gap(pos_last - 1, "xtc")
            ids, lg = ids[pos_last:], lg[pos_last:]
            effective.append("xtc")

    # 9. temperature (temp_ext with delta 0; temp == 1 is the empty sampler)
    t = P["temperature"]
    if t != 1.0:
        if t <= 0.0:
            raise Reject("temp<=0 not generated")
        lg = lg / t
        effective.append("temp")

    return dict(ids=ids, logits=lg, order_dependent=sorted(set(order_dep)), effective=effective)


# --------------------------------------------------------------------------------------
# case generation
# --------------------------------------------------------------------------------------

OFF = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, top_n_sigma=-1.0,
           xtc_probability=0.0, xtc_threshold=0.1, repeat_penalty=1.0, frequency_penalty=0.0,
           presence_penalty=0.0, penalty_last_n=64, logit_bias=[])

SCALES = [0.5, 1.0, 3.0, 8.0]
TEMPS = [0.3, 0.8, 1.0, 1.7]
TOPK = ["0", "1", "5", "40", "V", "V+10"]
TYPICAL = [1.0, 0.9, 0.5, 0.2]
TOPP = [1.0, 0.95, 0.5, 0.0]
MINP = [0.0, 0.05, 0.3]
XTC = [(0.0, 0.1), (1.0, 0.1), (1.0, 0.3), (1.0, 0.6)]
SIGMA = [-1.0, 0.0, 1.0, 2.5]
LASTN = [-1, 0, 8, 64]
REPEAT = [1.0, 1.1, 1.5]
FREQ = [0.0, 0.2, 1.0, -0.5]
PRES = [0.0, 0.3, 1.5]
BIASES = [2.5, -3.0, NEG_INF, 1.0, -0.5, 6.0]


def f32(x):
    return float(np.float32(x))


def pick(rng, xs):
    return xs[int(rng.integers(len(xs)))]


def off_params(rng):
    """All stages off, with the various 'off' spellings chosen at random."""
    P = dict(OFF)
    P["logit_bias"] = []
    P["top_n_sigma"] = pick(rng, [-1.0, 0.0])
    P["xtc_probability"], P["xtc_threshold"] = pick(rng, [(0.0, 0.1), (1.0, 0.6)])
    u = int(rng.integers(4))
    if u == 0:      # disabled through the values
        P["penalty_last_n"] = pick(rng, LASTN)
    elif u == 1:    # disabled through last_n == 0 with non-trivial values
        P["penalty_last_n"] = 0
        P["repeat_penalty"], P["frequency_penalty"], P["presence_penalty"] = 1.5, 1.0, 1.5
    elif u == 2:    # last_n == -1: llama_sampler_init_penalties clamps it to 0 -> disabled
        P["penalty_last_n"] = -1
        P["repeat_penalty"], P["frequency_penalty"], P["presence_penalty"] = 1.1, 0.2, 0.3
    else:
        P["penalty_last_n"] = 64
    return P


def draw_logits(rng, V, scale, ties, shift):
    x = (rng.standard_normal(V) * scale + shift).astype(np.float32)
    if ties:
        top = np.argsort(-x, kind="stable")[:min(20, V)]
        ng = int(rng.integers(1, 4))
        for g in range(ng):
            if len(top) < 2:
                break
            gsize = int(rng.integers(2, 4))
            members = rng.choice(top, size=min(gsize, len(top)), replace=False)
            if g == 0 and rng.random() < 0.5:
                members[0] = top[0]          # a tie for the maximum
            x[members] = x[members[0]]
    return x


def draw_history(rng, V, logits, length):
    if length == 0:
        return []
    nsub = int(rng.integers(1, min(V, 12) + 1))
    order = np.argsort(-logits, kind="stable")
    ntop = int(rng.integers(0, nsub + 1))
    sub = list(order[:min(V, 30)][rng.permutation(min(V, 30))[:ntop]])
    rest = [int(i) for i in rng.permutation(V) if i not in sub][:nsub - len(sub)]
    sub = [int(i) for i in sub] + rest
    w = rng.dirichlet(np.ones(len(sub)))
    return [int(sub[i]) for i in rng.choice(len(sub), size=length, p=w)]


def draw_bias(rng, V, logits, n, allow_neg_inf=True):
    if n == 0:
        return []
    order = np.argsort(-logits, kind="stable")
    out = []
    for _ in range(n):
        tid = int(order[int(rng.integers(min(V, 25)))]) if rng.random() < 0.7 else int(rng.integers(V))
        choices = BIASES if allow_neg_inf else [b for b in BIASES if b != NEG_INF]
        out.append([tid, pick(rng, choices)])
    if n >= 2 and rng.random() < 0.5:   # repeat an id
        j = int(rng.integers(n - 1))
        out[-1][0] = out[j][0]
        if out[-1][1] == NEG_INF or out[j][1] == NEG_INF:
            out[-1][1] = 2.5
    return out


def draw_V(rng, big=False, small=False):
    if big:
        return int(rng.integers(1000, 3001))
    if small:   # stages that keep (almost) every candidate: keep the file small
        return int(rng.integers(8, 65)) if rng.random() < 0.5 else int(rng.integers(65, 301))
    u = rng.random()
    if u < 0.35:
        return int(rng.integers(8, 65))
    if u < 0.75:
        return int(rng.integers(65, 257))
    return int(rng.integers(257, 701))


def resolve_topk(sym, V):
    return {"0": 0, "1": 1, "5": 5, "40": 40, "V": V, "V+10": V + 10}[sym]


def set_penalties(rng, P, active=True):
    P["penalty_last_n"] = pick(rng, [8, 64, 64]) if active else pick(rng, LASTN)
    while True:
        P["repeat_penalty"] = pick(rng, REPEAT)
        P["frequency_penalty"] = pick(rng, FREQ)
        P["presence_penalty"] = pick(rng, PRES)
        if not active or P["repeat_penalty"] != 1.0 or P["frequency_penalty"] != 0.0 or P["presence_penalty"] != 0.0:
            return


# each spec returns (params-with-symbolic-top_k, V, scale, shift, ties, hist_len, n_bias)
def spec_off(rng):
    P = off_params(rng)
    P["top_k"] = "0"
    return P, draw_V(rng, small=True), pick(rng, SCALES), 0.0, False, int(rng.integers(0, 50)), 0


def spec_single(stage):
    def f(rng):
        P = off_params(rng)
        P["top_k"] = "0"
        small = stage in ("logit_bias", "penalties", "temp", "top_k")
        V, scale, shift, hist, nb = draw_V(rng, small=small), pick(rng, SCALES), 0.0, 0, 0
        if stage == "logit_bias":
            nb = int(rng.integers(1, 7))
        elif stage == "penalties":
            set_penalties(rng, P)
            hist = int(rng.integers(1, 301))
            shift = pick(rng, [0.0, 0.0, 0.0, -4.0 * scale, 4.0 * scale])  # all-neg / all-pos too
            if P["penalty_last_n"] == 64 and rng.random() < 0.3:
                P["penalty_last_n"] = -1                     # llama.cpp: disabled
        elif stage == "top_n_sigma":
            P["top_n_sigma"] = pick(rng, [1.0, 2.5, 1.0, 2.5, 0.0, -1.0])
        elif stage == "top_k":
            P["top_k"] = pick(rng, ["1", "5", "40", "V", "V+10", "0"])
        elif stage == "typical":
            P["typical_p"] = pick(rng, [0.9, 0.5, 0.2])
        elif stage == "top_p":
            P["top_p"] = pick(rng, [0.95, 0.5, 0.0, 0.95, 0.5])
        elif stage == "min_p":
            P["min_p"] = pick(rng, [0.05, 0.3])
        elif stage == "xtc":
            P["xtc_probability"], P["xtc_threshold"] = pick(rng, [(1.0, 0.1), (1.0, 0.3), (1.0, 0.1), (1.0, 0.6), (0.0, 0.1)])
            scale = pick(rng, [0.5, 1.0, 1.0, 3.0, 8.0])
            if rng.random() < 0.7:
                V = int(rng.integers(8, 40))
        elif stage == "temp":
            P["temperature"] = pick(rng, [0.3, 0.8, 1.7])
        return P, V, scale, shift, False, hist, nb
    return f


def spec_mixed(p_on=0.5, big=False, ties=False):
    def f(rng):
        P = off_params(rng)
        V = draw_V(rng, big=big)
        scale = pick(rng, SCALES)
        shift = pick(rng, [0.0, 0.0, 0.0, 0.0, -3.0 * scale, 3.0 * scale])
        on = lambda: rng.random() < p_on  # noqa: E731
        nb = int(rng.integers(1, 7)) if on() else 0
        hist = 0
        if on():
            set_penalties(rng, P)
            hist = int(rng.integers(0, 301))
        else:
            hist = int(rng.integers(0, 40))
        P["top_n_sigma"] = pick(rng, [1.0, 2.5]) if on() else pick(rng, [-1.0, 0.0])
        P["top_k"] = pick(rng, ["1", "5", "40", "V", "V+10"]) if on() else "0"
        P["typical_p"] = pick(rng, [0.9, 0.5, 0.2]) if on() else 1.0
        P["top_p"] = pick(rng, [0.95, 0.5, 0.0]) if on() else 1.0
        P["min_p"] = pick(rng, [0.05, 0.3]) if on() else 0.0
        if on():
            P["xtc_probability"], P["xtc_threshold"] = pick(rng, [(1.0, 0.1), (1.0, 0.3)])
        P["temperature"] = pick(rng, [0.3, 0.8, 1.7]) if on() else pick(rng, TEMPS)
        return P, V, scale, shift, ties, hist, nb
    return f


def spec_ties(rng):
    """Exact duplicate logits in the top 20; often a cut (top_k 1/5, top_p 0) lands inside a tie group."""
    P, V, scale, shift, ties, hist, nb = spec_mixed(p_on=0.5, ties=True)(rng)
    if rng.random() < 0.6:      # keep the ties alive: no bias, no penalties
        nb = 0
        P["repeat_penalty"], P["frequency_penalty"], P["presence_penalty"] = 1.0, 0.0, 0.0
    u = rng.random()
    if u < 0.3:
        P["top_k"] = pick(rng, ["1", "5"])
    elif u < 0.45:
        P["top_p"] = 0.0
    return P, V, scale, shift, ties, hist, nb


def spec_all(rng):
    """Every stage active at once."""
    P, V, scale, shift, ties, hist, nb = spec_mixed(p_on=1.0)(rng)
    P["top_k"] = pick(rng, ["5", "40", "40", "V", "V+10"])
    P["top_p"] = pick(rng, [0.95, 0.95, 0.5])
    P["typical_p"] = pick(rng, [0.9, 0.9, 0.5])
    return P, V, scale, shift, ties, hist, nb


def spec_v32000(kind):
    def f(rng):
        P = off_params(rng)
        V = 32000
        P["top_k"] = "0"
        scale, shift, hist, nb = 1.0, 0.0, 0, 0
        if kind == 0:     # top_n_sigma alone
            P["top_n_sigma"] = 1.0
            scale = pick(rng, [1.0, 3.0])
        elif kind == 1:   # llama-cli defaults-like: penalties, top_k 40, top_p .95, min_p .05, temp .8
            set_penalties(rng, P)
            hist = 200
            P["top_k"], P["top_p"], P["min_p"], P["temperature"] = "40", 0.95, 0.05, 0.8
            scale = 3.0
            nb = 3
        else:             # min_p alone on a large vocabulary, plus temperature
            P["min_p"], P["temperature"] = 0.3, 1.7
            scale = pick(rng, [3.0, 8.0])
        return P, V, scale, shift, False, hist, nb
    return f


def make_case(rng, spec, name, stats, max_param_tries=200, max_logit_tries=25):
    for _ in range(max_param_tries):
        Psym, V, scale, shift, ties, hist_len, nb = spec(rng)
        for _ in range(max_logit_tries):
            logits = draw_logits(rng, V, scale, ties, shift)
            P = dict(Psym)
            P["top_k"] = resolve_topk(Psym["top_k"], V)
            history = draw_history(rng, V, logits, hist_len)
            P["logit_bias"] = draw_bias(rng, V, logits, nb)
            try:
                m = mirror(logits, history, P, strict=True)
            except Reject as e:
                key = str(e)
                stats[key] = stats.get(key, 0) + 1
                if key.startswith("typical:p0"):
                    break   # parameter problem, not a logits problem
                continue
            return dict(case=name, n_vocab=V, logits=logits, history=history, params=P,
                        ties=bool(ties), mirror=m)
    raise RuntimeError("could not make case %s" % name)


def build_cases():
    rng = np.random.default_rng(SEED)
    stats = {}
    plan = []
    plan += [("off", spec_off, 16)]
    for st, n in [("logit_bias", 24), ("penalties", 56), ("top_n_sigma", 22), ("top_k", 26),
                  ("typical", 24), ("top_p", 26), ("min_p", 20), ("xtc", 30), ("temp", 14)]:
        plan.append(("only-" + st, spec_single(st), n))
    plan += [("mix", spec_mixed(0.5), 70), ("all", spec_all, 34), ("big", spec_mixed(0.6, big=True), 6),
             ("ties", spec_ties, 30)]
    plan += [("v32000-sigma", spec_v32000(0), 1), ("v32000-cli", spec_v32000(1), 1),
             ("v32000-minp", spec_v32000(2), 1)]
    cases = []
    for prefix, spec, n in plan:
        for i in range(n):
            cases.append(make_case(rng, spec, "%s-%03d" % (prefix, i), stats))
    return cases, stats


# --------------------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------------------

_libc = ctypes.CDLL(None)
_libc.strtof.restype = ctypes.c_float
_libc.strtof.argtypes = [ctypes.c_char_p, ctypes.c_void_p]


def f32_str(x):
    """Shortest decimal that gives back this float32 both with strtof and with
    strtod + (float); otherwise the exact double repr."""
    x = np.float32(x)
    s = str(x)
    ok = (np.float32(float(s)) == x and _libc.strtof(s.encode(), None) == x
          and math.copysign(1.0, float(s)) == math.copysign(1.0, float(x)))
    if not ok:
        s = repr(float(x))
    return s


def fnum(x):
    x = float(x)
    if x == NEG_INF:
        return '"-inf"'
    if math.isinf(x) or math.isnan(x):
        raise ValueError(x)
    return repr(x)


def case_line(c, ids, probs, n_masked, order_dep, effective):
    P = c["params"]
    keys = ["temperature", "top_k", "top_p", "min_p", "typical_p", "top_n_sigma", "xtc_probability",
            "xtc_threshold", "repeat_penalty", "frequency_penalty", "presence_penalty", "penalty_last_n"]
    ps = []
    for k in keys:
        v = P[k]
        ps.append('"%s": %s' % (k, str(int(v)) if isinstance(v, int) else fnum(v)))
    ps.append('"logit_bias": [%s]' % ", ".join("[%d, %s]" % (t, fnum(b)) for t, b in P["logit_bias"]))
    parts = [
        '"case": %s' % json.dumps(c["case"]),
        '"n_vocab": %d' % c["n_vocab"],
        '"logits": [%s]' % ", ".join(f32_str(x) for x in c["logits"]),
        '"history": %s' % json.dumps(c["history"]),
        '"params": {%s}' % ", ".join(ps),
        '"ties": %s' % ("true" if c["ties"] else "false"),
        '"ids": %s' % json.dumps([int(i) for i in ids]),
        '"probs": [%s]' % ", ".join(repr(float(p)) for p in probs),
        '"n_masked": %d' % n_masked,
        '"order_dependent": %s' % json.dumps(order_dep),
        '"effective": %s' % json.dumps(effective),
    ]
    line = "{" + ", ".join(parts) + "}"
    back = json.loads(line)                  # sanity: valid JSON that round-trips
    assert len(back["logits"]) == c["n_vocab"]
    assert all(np.float32(v) == x for v, x in zip(back["logits"], c["logits"]))
    return line


def compare(c, ids_l, probs_l, n_masked_l, ids_m, probs_m, n_masked_m):
    """llama.cpp vs mirror.  Raises AssertionError with details on mismatch."""
    name = c["case"]
    od = c["mirror"]["order_dependent"]
    assert len(ids_l) == len(ids_m), "%s: size llama.cpp %d vs mirror %d (ids %s vs %s)" % (
        name, len(ids_l), len(ids_m), list(ids_l)[:20], list(ids_m)[:20])
    if not od:
        assert set(int(i) for i in ids_l) == set(int(i) for i in ids_m), "%s: kept sets differ" % name
        pm = dict(zip((int(i) for i in ids_m), probs_m))
        for i, p in zip(ids_l, probs_l):
            q = pm[int(i)]
            assert abs(p - q) <= 5e-5 * max(p, q) + 1e-12, "%s: prob of %d %r vs %r" % (name, i, p, q)
    a, b = np.sort(probs_l), np.sort(probs_m)
    assert np.all(np.abs(a - b) <= 5e-5 * np.maximum(a, b) + 1e-12), "%s: sorted probs differ" % name


# --------------------------------------------------------------------------------------
# self-test: hand-computed cases, asserting what PROVENANCE.md says
# --------------------------------------------------------------------------------------

def P_(**kw):
    P = dict(OFF)
    P["logit_bias"] = []
    P.update(kw)
    return P


def final_logits_by_id(logits, history, P):
    ids, lg = run_llamacpp(np.asarray(logits, dtype=np.float32), history, P)
    return [int(i) for i in ids], {int(i): float(x) for i, x in zip(ids, lg)}


def approx(a, b, eps=1e-6):
    if a == b:
        return True
    return abs(a - b) <= eps * max(1.0, abs(a), abs(b))


def self_test():
    n = 0

    def check(cond, msg):
        nonlocal n
        if not cond:
            raise AssertionError("self-test failed: " + msg)
        n += 1

    # repeat penalty: positive logit is divided, negative (and 0) multiplied
    ids, d = final_logits_by_id([3.0, -2.0, 1.0, 0.0, 0.5], [0, 1, 3], P_(repeat_penalty=1.5))
    check(ids == [0, 1, 2, 3, 4], "no stage reorders when nothing sorts: %s" % ids)
    check(approx(d[0], 2.0) and approx(d[1], -3.0) and d[2] == 1.0 and d[3] == 0.0 and d[4] == 0.5,
          "repeat penalty: %s" % d)
    # repeat is applied once per token, independent of its count
    _, d = final_logits_by_id([3.0, -2.0], [0, 0, 0, 1, 1], P_(repeat_penalty=1.5))
    check(approx(d[0], 2.0) and approx(d[1], -3.0), "repeat penalty count-independent: %s" % d)
    # frequency 1.0 on a token seen 3 times + presence 0.5; repeat first, then subtract
    _, d = final_logits_by_id([1.0, 2.0, 3.0, 4.0], [2, 2, 2, 3],
                              P_(repeat_penalty=1.1, frequency_penalty=1.0, presence_penalty=0.5))
    check(approx(d[2], f32(f32(3.0 / 1.1) - 3.5)), "freq/presence token 2: %r" % d[2])
    check(approx(d[3], f32(f32(4.0 / 1.1) - 1.5)), "freq/presence token 3: %r" % d[3])
    check(d[0] == 1.0 and d[1] == 2.0, "unpenalized tokens untouched")
    # the repeat sign test happens before the subtraction: 0.5/1.5 - 1.0 (no multiply afterwards)
    _, d = final_logits_by_id([0.5, -0.5], [0, 1], P_(repeat_penalty=1.5, frequency_penalty=1.0))
    check(approx(d[0], f32(f32(0.5 / 1.5) - 1.0)) and approx(d[1], -0.75 - 1.0), "order: %s" % d)
    # negative frequency penalty raises the logit
    _, d = final_logits_by_id([1.0, 2.0], [0, 0], P_(frequency_penalty=-0.5))
    check(approx(d[0], 2.0), "negative frequency: %s" % d)
    # window: penalty_last_n = 2 only sees the last two accepted tokens
    _, d = final_logits_by_id([1.0, 1.0, 1.0], [0, 0, 0, 1, 1], P_(frequency_penalty=1.0, penalty_last_n=2))
    check(d[0] == 1.0 and approx(d[1], -1.0) and d[2] == 1.0, "window: %s" % d)
    # penalty_last_n = -1 and 0: disabled
    for ln in (-1, 0):
        _, d = final_logits_by_id([1.0, 2.0], [0, 1, 1], P_(repeat_penalty=1.5, frequency_penalty=1.0,
                                                            presence_penalty=1.5, penalty_last_n=ln))
        check(d == {0: 1.0, 1: 2.0}, "penalty_last_n=%d disabled: %s" % (ln, d))
    # logit bias: a repeated id gets both entries; -inf stays in the array
    ids, d = final_logits_by_id([0.0, 0.0, 0.0], [], P_(logit_bias=[[1, 2.5], [2, NEG_INF], [1, 2.5]]))
    check(d[1] == 5.0 and d[2] == NEG_INF and len(ids) == 3, "logit bias: %s" % d)
    # top-k: 0 = off (no sort), k >= n keeps all but sorts descending
    ids, _ = final_logits_by_id([1.0, 3.0, 2.0], [], P_(top_k=0))
    check(ids == [0, 1, 2], "top_k 0: %s" % ids)
    ids, _ = final_logits_by_id([1.0, 3.0, 2.0], [], P_(top_k=13))
    check(ids == [1, 2, 0], "top_k > n: %s" % ids)
    ids, _ = final_logits_by_id([1.0, 3.0, 2.0, 0.5], [], P_(top_k=2))
    check(ids == [1, 2], "top_k 2: %s" % ids)
    # top-p: cum >= p (inclusive), p = 0 keeps exactly one
    lg = [math.log(0.5), math.log(0.3), math.log(0.2)]
    ids, _ = final_logits_by_id(lg, [], P_(top_p=0.0))
    check(ids == [0], "top_p 0: %s" % ids)
    ids, _ = final_logits_by_id(lg, [], P_(top_p=0.75))
    check(ids == [0, 1], "top_p .75: %s" % ids)
    ids, _ = final_logits_by_id(lg, [], P_(top_p=0.45))
    check(ids == [0], "top_p .45: %s" % ids)
    # min-p on logits before temperature: keep logit >= max + ln(p); temp does not move the cut
    lg = [0.0, -1.0, -2.0, -3.5]     # ln(0.05) = -2.9957, ln(0.3) = -1.204
    ids, _ = final_logits_by_id(lg, [], P_(min_p=0.05, temperature=0.3))
    check(ids == [0, 1, 2], "min_p .05: %s" % ids)
    ids, _ = final_logits_by_id(lg, [], P_(min_p=0.3, temperature=1.7))
    check(ids == [0, 1], "min_p .3: %s" % ids)
    # min-p keeps the incoming (unsorted) order
    ids, _ = final_logits_by_id([-1.0, 0.0, -3.5, -2.0], [], P_(min_p=0.05))
    check(ids == [0, 1, 3], "min_p order: %s" % ids)
    # XTC: probs .5 .3 .2, threshold .25 -> the top one (all above the threshold except the last) goes
    lg = [math.log(0.2), math.log(0.5), math.log(0.3)]
    ids, _ = final_logits_by_id(lg, [], P_(xtc_probability=1.0, xtc_threshold=0.25))
    check(ids == [2, 0], "xtc .25: %s" % ids)
    ids, _ = final_logits_by_id(lg, [], P_(xtc_probability=1.0, xtc_threshold=0.4))
    check(ids == [1, 2, 0], "xtc .4 (only one above: nothing removed, but sorted): %s" % ids)
    ids, _ = final_logits_by_id(lg, [], P_(xtc_probability=1.0, xtc_threshold=0.6))
    check(ids == [0, 1, 2], "xtc threshold > .5 = off: %s" % ids)
    # top-n-sigma: mask logit < max - n*std (population std over non -inf logits) to -inf
    lg = [0.0, 1.0, 2.0, 3.0, NEG_INF]   # mean 1.5, std sqrt(1.25) = 1.118; 3 - 1.118 = 1.882
    ids, d = final_logits_by_id(lg, [], P_(top_n_sigma=1.0))
    check(ids == [0, 1, 2, 3, 4] and d[0] == NEG_INF and d[1] == NEG_INF and d[2] == 2.0 and d[3] == 3.0,
          "top_n_sigma: %s" % d)
    # typical: strict >; p = [.5, .3, .2]: H = 1.0297; |-ln p - H| = .336, .174, .580
    lg = [math.log(0.5), math.log(0.3), math.log(0.2)]
    ids, _ = final_logits_by_id(lg, [], P_(typical_p=0.5))
    check(ids == [1, 0], "typical .5: %s" % ids)
    ids, _ = final_logits_by_id(lg, [], P_(typical_p=0.2))
    check(ids == [1], "typical .2: %s" % ids)
    # temperature: logits divided, 1.0 = no-op
    _, d = final_logits_by_id([1.0, -2.0], [], P_(temperature=0.5))
    check(d == {0: 2.0, 1: -4.0}, "temp: %s" % d)
    return n


# --------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "testdata", "sampler", "llamacpp.jsonl"))
    ap.add_argument("--self-test-only", action="store_true")
    args = ap.parse_args()

    load_llama()
    n = self_test()
    print("self-test: %d checks passed" % n, file=sys.stderr)
    if args.self_test_only:
        return

    cases, stats = build_cases()
    print("rejected draws: %s" % json.dumps(stats, sort_keys=True), file=sys.stderr)
    lines = []
    n_orderdep = n_ordermatch = n_order_checked = 0
    for c in cases:
        ids_l, lg_l = run_llamacpp(c["logits"], c["history"], c["params"])
        ids_l, probs_l, nm_l = finalize(ids_l, lg_l)
        m = c["mirror"]
        ids_m, probs_m, nm_m = finalize(m["ids"], m["logits"])
        compare(c, ids_l, probs_l, nm_l, ids_m, probs_m, nm_m)
        if m["order_dependent"]:
            n_orderdep += 1
        elif not c["ties"]:
            n_order_checked += 1
            n_ordermatch += int(list(ids_l) == list(ids_m))
        lines.append(case_line(c, ids_l, probs_l, nm_l, m["order_dependent"], m["effective"]))

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fp:
        fp.write("\n".join(lines) + "\n")

    eff = {}
    for c in cases:
        for e in c["mirror"]["effective"]:
            eff[e] = eff.get(e, 0) + 1
    print("cases: %d, tie cases: %d, order-dependent: %d, mirror order == llama.cpp order: %d/%d"
          % (len(cases), sum(c["ties"] for c in cases), n_orderdep, n_ordermatch, n_order_checked),
          file=sys.stderr)
    print("stage effective in: %s" % json.dumps(eff, sort_keys=True), file=sys.stderr)
    print("wrote %s (%d bytes)" % (args.out, os.path.getsize(args.out)), file=sys.stderr)


if __name__ == "__main__":
    main()
