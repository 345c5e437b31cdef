#!/usr/bin/env python3
"""Make reference trajectories of llama.cpp's Mirostat samplers (v1 and v2) for llmi's tests.

Runs llama.cpp's own samplers (libllama.so, through the ctypes bindings of the
llama-cpp-python 0.3.36 sdist) on synthetic float32 logits and writes
testdata/sampler/mirostat.jsonl.  See testdata/sampler/MIROSTAT-PROVENANCE.md for how
llama.cpp was built and for the exact semantics.

Each case is one sampler instance followed over several steps, built the way
common/sampling.cpp builds the mirostat chain (no logit bias):

    chain = [ temp(temp), mirostat(n_vocab, seed, tau, eta, m = 100) ]     version 1
    chain = [ temp(temp), mirostat_v2(seed, tau, eta) ]                     version 2

For every step a fresh llama_token_data_array {ids 0..V-1, logits, p = 0, selected = -1,
sorted = false} is passed to llama_sampler_apply(chain); nothing else is called between
steps, so mu (and the mt19937) carry over inside the sampler.  Recorded per step: the
logits, the candidates llama.cpp leaves (ids and p, in its order), the id drawn, and mu
before and after the step, read from the sampler's own state in memory.

A float32-exact mirror (glibc's expf/logf/log2f/powf called through ctypes, numpy float32
arithmetic, a Python mt19937 + libstdc++'s discrete_distribution) runs next to llama.cpp and
must agree bit for bit on every p, every mu and every drawn index; candidate ids must agree
except for the order among exactly equal logits.  A float64 evaluation of the same
decisions rejects draws where the cut (v1's int(k), v2's -log2(p) > mu) lies within a
relative 1e-4 of flipping, so that small float deviations cannot change the kept set.

Usage (see MIROSTAT-PROVENANCE.md):
    PYTHONPATH=/tmp/lcp/llama_cpp_python-0.3.36 LLAMA_CPP_LIB_PATH=/tmp/lcp-build/bin \
        /work/refenv/bin/python scripts/make-mirostat-refs.py [--out PATH]
"""

import argparse
import ctypes
import json
import math
import os
import sys

import numpy as np

SEED = 20250612          # numpy seed for the case generator
M = 100                  # common/sampling.cpp passes m = 100 to llama_sampler_init_mirostat
LLAMA_DEFAULT_SEED = 0xFFFFFFFF
NEG_INF = float("-inf")
REL_MARGIN = 1e-4        # float64 decisions must not flip within this relative perturbation

L = None                 # llama_cpp.llama_cpp, loaded in main()


def load_llama():
    global L
    import llama_cpp.llama_cpp as _L  # noqa: E402  (needs PYTHONPATH / LLAMA_CPP_LIB_PATH)
    L = _L
    L.llama_backend_init()


# --------------------------------------------------------------------------------------
# glibc float functions (the ones libllama.so calls) and float32 helpers
# --------------------------------------------------------------------------------------

_libm = ctypes.CDLL("libm.so.6")
for _fn in ("expf", "logf", "log2f"):
    getattr(_libm, _fn).restype = ctypes.c_float
    getattr(_libm, _fn).argtypes = [ctypes.c_float]
_libm.powf.restype = ctypes.c_float
_libm.powf.argtypes = [ctypes.c_float, ctypes.c_float]
_libc = ctypes.CDLL(None)
_libc.strtof.restype = ctypes.c_float
_libc.strtof.argtypes = [ctypes.c_char_p, ctypes.c_void_p]

F = np.float32


def expf(x):
    return F(_libm.expf(float(x)))


def logf(x):
    return F(_libm.logf(float(x)))


def log2f(x):
    return F(_libm.log2f(float(x)))


def powf(x, y):
    return F(_libm.powf(float(x), float(y)))


def bits(x):
    return int(np.asarray(x, dtype=np.float32).view(np.uint32))


def same_f32(a, b):
    a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def x86_int(k):
    """int(k) for a float as cvttss2si does it (llama.cpp's `int(k)`, UB in C++): NaN and
    values outside int32 give INT_MIN (0x80000000)."""
    k = float(k)
    if math.isnan(k) or not (-2147483648.0 <= k < 2147483648.0):
        return -2147483648
    return int(k)          # truncation toward zero


# --------------------------------------------------------------------------------------
# std::mt19937 and libstdc++ 12's discrete_distribution<int> (llama_sample_dist)
# --------------------------------------------------------------------------------------

class MT19937:
    def __init__(self, seed):
        mt = [0] * 624
        mt[0] = seed & 0xFFFFFFFF
        for i in range(1, 624):
            mt[i] = (1812433253 * (mt[i - 1] ^ (mt[i - 1] >> 30)) + i) & 0xFFFFFFFF
        self.mt, self.idx = mt, 624

    def __call__(self):
        mt = self.mt
        if self.idx >= 624:
            for i in range(624):
                y = (mt[i] & 0x80000000) | (mt[(i + 1) % 624] & 0x7FFFFFFF)
                mt[i] = mt[(i + 397) % 624] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
            self.idx = 0
        y = mt[self.idx]
        self.idx += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        y ^= y >> 18
        return y & 0xFFFFFFFF


def generate_canonical_double(rng):
    # bits/random.tcc generate_canonical<double, 53>: two 32-bit draws, low word first
    s = float(rng()) + float(rng()) * 4294967296.0
    r = s / 18446744073709551616.0
    if r >= 1.0:
        r = math.nextafter(1.0, 0.0)
    return r


def discrete_distribution(p_f32, rng):
    """std::discrete_distribution<int>(p.begin(), p.end())(rng), libstdc++ 12."""
    n = len(p_f32)
    if n < 2:                       # _M_initialize clears _M_prob; operator() returns 0, no draw
        return 0
    w = [float(x) for x in p_f32]
    s = 0.0
    for x in w:                     # std::accumulate(..., 0.0)
        s += x
    cp, c = [], 0.0
    for x in w:                     # __normalize (x / sum), std::partial_sum
        c += x / s
        cp.append(c)
    cp[-1] = 1.0
    u = generate_canonical_double(rng)
    for i, c in enumerate(cp):      # std::lower_bound: first cp[i] >= u
        if not (c < u):
            return i
    return n - 1


# --------------------------------------------------------------------------------------
# float32 mirror of llama.cpp's code (src/llama-sampler.cpp)
# --------------------------------------------------------------------------------------

def softmax_f32(lg):
    """llama_sampler_softmax_impl on an already sorted array: max = lg[0], expf in order,
    float sum in order, then p /= sum."""
    mx = lg[0]
    with np.errstate(invalid="ignore", over="ignore"):
        d = (lg - mx).astype(np.float32)
    e = np.array([_libm.expf(float(x)) for x in d], dtype=np.float32)
    s = np.cumsum(e, dtype=np.float32)[-1]      # sequential float accumulation
    return (e / s).astype(np.float32)


class Mirror:
    def __init__(self, version, V, seed, tau, eta, temp, m=M):
        self.version, self.V, self.tau, self.eta, self.temp, self.m = version, V, F(tau), F(eta), F(temp), m
        self.mu = F(F(2.0) * self.tau)
        self.rng = MT19937(seed)

    def step(self, logits):
        lg = np.asarray(logits, dtype=np.float32).copy()
        # llama_sampler_temp (llama_sampler_temp_impl); temp == 1 is the empty sampler
        if self.temp != F(1.0):
            if self.temp <= 0:
                mi, ml = 0, lg[0]
                for i in range(1, len(lg)):
                    if lg[i] > ml:
                        lg[mi] = NEG_INF
                        mi, ml = i, lg[i]
                    else:
                        lg[i] = NEG_INF
            else:
                lg = (lg / self.temp).astype(np.float32)
        order = np.argsort(-lg, kind="stable")            # ties: by id (llama.cpp: unspecified)
        ids, lg = order, lg[order]
        p = softmax_f32(lg)
        size = len(lg)
        info = {"mu": self.mu, "size_in": size, "full_ids": ids, "full_lg": lg,
                "p_zero": bool(np.any(p == 0)), "p_zero_top_m": bool(np.any(p[:self.m] == 0))}
        if self.version == 1:
            sb, sq = F(0), F(0)
            nloop = min(self.m - 1, size - 1)
            with np.errstate(all="ignore"):
                for i in range(nloop):
                    t_i = logf(F(i + 2) / F(i + 1))
                    b_i = logf(p[i] / p[i + 1])
                    sb = F(sb + F(t_i * b_i))
                    sq = F(sq + F(t_i * t_i))
                s_hat = F(sb / sq)
                eps = F(s_hat - F(1))
                num = F(eps * powf(2.0, self.mu))
                den = F(F(1) - powf(F(self.V), -eps))
                k = powf(F(num / den), F(F(1) / s_hat))
            ki = x86_int(k)
            n = min(max(ki, 1), size)
            info.update(s_hat=s_hat, k=k, k_int=ki, n=n)
            info["frag"] = self._v1_fragile(p, size, n)
        else:
            n = size
            for i in range(size):
                if log2f(p[i]) * F(-1) > self.mu:          # -log2f(p) > mu
                    n = i
                    break
            info["n_raw"] = n
            if n == 0:
                n = 1
            info["n"] = n
            info["frag"] = self._v2_fragile(p, size, info["n_raw"])
        ids, lg = ids[:n], lg[:n]
        p2 = softmax_f32(lg)
        idx = discrete_distribution(p2, self.rng)
        obs = F(-log2f(p2[idx]))
        e = F(obs - self.tau)
        self.mu = F(self.mu - F(self.eta * e))
        info.update(mu_after=self.mu, idx=idx)
        return ids, lg, p2, info

    # ---- float64 evaluation of the same decisions (margin check) ----

    def _v1_fragile(self, p, size, n32):
        """Kept count from k computed in float64 (from the same float32 p), under a relative
        perturbation of +-REL_MARGIN of k; fragile when it differs from llama.cpp's."""
        p = p.astype(np.float64)
        sb = sq = 0.0
        with np.errstate(all="ignore"):
            for i in range(min(self.m - 1, size - 1)):
                t = math.log((i + 2) / (i + 1))
                b = np.log(p[i] / p[i + 1]) if p[i + 1] > 0 else (np.inf if p[i] > 0 else np.nan)
                sb += t * b
                sq += t * t
            s = np.float64(sb) / sq
            eps = s - 1.0
            num = eps * 2.0 ** float(self.mu)
            den = 1.0 - np.float64(self.V) ** (-eps)
            k = np.float64(num / den) ** (1.0 / s)

        def cnt(kk):
            return min(max(x86_int(kk), 1), size)
        if not np.isfinite(k):
            return cnt(k) != n32
        ns = {cnt(k), cnt(k * (1 - REL_MARGIN)), cnt(k * (1 + REL_MARGIN))}
        return ns != {n32}

    def _v2_fragile(self, p, size, n_raw):
        mu = float(self.mu)
        tol = REL_MARGIN * max(1.0, abs(mu))
        for i in (n_raw - 1, n_raw):          # last kept and first cut
            if 0 <= i < size and p[i] > 0:
                if abs(-math.log2(float(p[i])) - mu) < tol:
                    return True
        return False


# --------------------------------------------------------------------------------------
# llama.cpp runner
# --------------------------------------------------------------------------------------

TOKEN_DATA_DTYPE = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
# offsets of tau, eta, mu in struct llama_sampler_mirostat / llama_sampler_mirostat_v2
# (src/llama-sampler.cpp:2440 and :2557)
STATE_OFFSETS = {1: dict(tau=12, eta=16, m=20, mu=24), 2: dict(tau=8, eta=12, mu=16)}


class LlamaRun:
    def __init__(self, version, V, seed, tau, eta, temp, m=M):
        self.version = version
        self.chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_temp(float(temp)))
        if version == 1:
            self.smpl = L.llama_sampler_init_mirostat(V, seed, float(tau), float(eta), m)
        else:
            self.smpl = L.llama_sampler_init_mirostat_v2(seed, float(tau), float(eta))
        L.llama_sampler_chain_add(self.chain, self.smpl)
        self.ctx = self.smpl.contents.ctx
        off = STATE_OFFSETS[version]
        # check the struct layout assumption against the values passed in
        assert bits(self._f(off["tau"])) == bits(F(tau)) and bits(self._f(off["eta"])) == bits(F(eta))
        if version == 1:
            assert ctypes.c_int32.from_address(self.ctx + off["m"]).value == m
            assert ctypes.c_int32.from_address(self.ctx).value == V
        assert bits(self.mu()) == bits(F(2.0) * F(tau))
        assert L.llama_sampler_get_seed(self.chain) == seed

    def _f(self, off):
        return F(ctypes.c_float.from_address(self.ctx + off).value)

    def mu(self):
        return self._f(STATE_OFFSETS[self.version]["mu"])

    def step(self, logits):
        V = len(logits)
        buf = np.zeros(V, dtype=TOKEN_DATA_DTYPE)
        buf["id"] = np.arange(V, dtype=np.int32)
        buf["logit"] = np.asarray(logits, dtype=np.float32)
        base = buf.ctypes.data
        cur = L.llama_token_data_array(
            data=ctypes.cast(ctypes.c_void_p(base), L.llama_token_data_p),
            size=V, selected=-1, sorted=False)
        L.llama_sampler_apply(self.chain, ctypes.byref(cur))
        start = ctypes.cast(cur.data, ctypes.c_void_p).value
        assert start == base and 1 <= cur.size <= V and 0 <= cur.selected < cur.size
        out = buf[:cur.size].copy()
        return out["id"].astype(np.int64), out["logit"].copy(), out["p"].copy(), int(cur.selected)

    def free(self):
        L.llama_sampler_free(self.chain)


# --------------------------------------------------------------------------------------
# case generation
# --------------------------------------------------------------------------------------

def f32(x):
    return F(x)


def loguni(rng, a, b):
    return float(math.exp(rng.uniform(math.log(a), math.log(b))))


def draw_logits(rng, V, kind, kp):
    """One step's float32 logits of the given kind (kp: the case's kind parameters)."""
    if kind == "normal":
        x = rng.standard_normal(V) * kp["std"] + kp["shift"]
    elif kind == "ties":             # rounded to one decimal: many exact ties
        x = np.round(rng.standard_normal(V) * kp["std"] + kp["shift"], 1)
    elif kind == "dominant":         # one logit far above a normal bulk
        x = rng.standard_normal(V) * kp["std"]
        x[int(rng.integers(V))] = x.max() + kp["gap"]
    elif kind == "heavy":            # Student t: heavy tails
        x = np.clip(rng.standard_t(kp["df"], V) * kp["std"], -300.0, 300.0)
    elif kind == "zipf":             # logit = -a ln(rank) + noise, ranks shuffled
        r = rng.permutation(V) + 1.0
        x = -kp["a"] * np.log(r) + rng.standard_normal(V) * kp["noise"] + kp["shift"]
    elif kind == "flat":             # all equal, or all but one or two
        x = np.full(V, kp["value"])
        for _ in range(kp["n_up"]):
            x[int(rng.integers(V))] += kp["bump"]
    elif kind == "lm":               # big vocabulary: zipf head with full precision, compact tail
        r = rng.permutation(V) + 1.0
        x = -kp["a"] * np.log(r) + rng.standard_normal(V) * kp["noise"] + kp["shift"]
        head = np.argsort(-x, kind="stable")[:kp["head"]]
        y = np.floor(x * 10.0) / 10.0        # tail: one decimal, rounded down (stays below the head)
        y[head] = x[head]
        x = y
    else:
        raise ValueError(kind)
    return np.asarray(x, dtype=np.float32)


def draw_kind_params(rng, kind, V):
    if kind == "normal":
        return dict(std=round(loguni(rng, 0.3, 10.0), 3), shift=float(rng.choice([0.0, 0.0, -5.0, 3.0])))
    if kind == "ties":
        return dict(std=round(loguni(rng, 0.03, 3.0), 3), shift=float(rng.choice([0.0, 1.0, -2.0])))
    if kind == "dominant":
        return dict(std=round(loguni(rng, 0.3, 3.0), 3), gap=float(rng.choice([3.0, 8.0, 20.0, 60.0, 110.0, 150.0])))
    if kind == "heavy":
        return dict(df=int(rng.integers(1, 4)), std=round(loguni(rng, 0.3, 3.0), 3))
    if kind == "zipf":
        return dict(a=round(rng.uniform(0.5, 2.5), 3), noise=round(loguni(rng, 0.01, 0.5), 3),
                    shift=float(rng.choice([0.0, 4.0, -3.0])))
    if kind == "flat":
        return dict(value=float(rng.choice([0.0, 1.5, -2.25])), n_up=int(rng.integers(0, 3)),
                    bump=float(rng.choice([0.5, 2.0, 30.0])))
    if kind == "lm":
        return dict(a=round(rng.uniform(0.9, 1.6), 3), noise=0.3, shift=18.0, head=512)
    raise ValueError(kind)


TAUS = [5.0, 5.0, 5.0, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0, None]      # None: random in [0.5, 10]
ETAS = [0.1, 0.1, 0.1, 0.01, 0.05, 0.2, 0.5, 1.0, None]                    # None: random in [0.01, 1]
TEMPS = [1.0, 1.0, 0.7, 0.7, 1.5]
KINDS = ["normal", "normal", "normal", "zipf", "zipf", "zipf", "ties", "ties", "dominant", "heavy", "flat"]
SEEDS = [0, 1, 42, 1234, 0xFFFFFFFE]


def draw_V(rng):
    u = rng.random()
    if u < 0.60:
        return int(rng.integers(8, 129))
    if u < 0.965:
        return int(round(loguni(rng, 129, 1024)))
    return int(round(loguni(rng, 1025, 4096)))


def draw_steps(rng, V):
    # keeps the file at a few MB: long trajectories on small vocabularies
    hi = 16 if V <= 128 else 8 if V <= 512 else 5 if V <= 1024 else 4
    return int(rng.integers(4, hi + 1))


def draw_spec(rng, i, forced):
    f = dict(forced)
    version = f.get("version", 1 + (i % 2))
    V = f.get("V") or draw_V(rng)
    kind = f.get("kind") or KINDS[int(rng.integers(len(KINDS)))]
    tau = TAUS[int(rng.integers(len(TAUS)))]
    if tau is None:
        tau = round(rng.uniform(0.5, 10.0), 2)
    tau = f.get("tau", tau)
    eta = ETAS[int(rng.integers(len(ETAS)))]
    if eta is None:
        eta = round(loguni(rng, 0.01, 1.0), 3)
    eta = f.get("eta", eta)
    temp = f.get("temp", TEMPS[int(rng.integers(len(TEMPS)))])
    seed = SEEDS[int(rng.integers(len(SEEDS)))] if rng.random() < 0.3 else int(rng.integers(0, 2**32 - 1))
    if kind == "flat" and "kind" not in f:
        V = min(V, 512)
    nsteps = f.get("steps", draw_steps(rng, V))
    kp = draw_kind_params(rng, kind, V)
    return dict(version=version, V=V, kind=kind, kp=kp, tau=float(F(tau)), eta=float(F(eta)),
                temp=float(F(temp)), seed=seed, steps=nsteps)


def forced_specs():
    """Special cases by index; the rest are drawn freely."""
    fs = {}
    # 32000-token vocabularies, 3 steps each
    fs[0] = dict(version=1, V=32000, kind="lm", steps=3, temp=1.0, tau=5.0, eta=0.1)
    fs[1] = dict(version=2, V=32000, kind="lm", steps=3, temp=1.0, tau=5.0, eta=0.1)
    fs[2] = dict(version=1, V=32000, kind="lm", steps=3, temp=0.7, tau=3.0)
    fs[3] = dict(version=2, V=32000, kind="lm", steps=3, temp=1.5, tau=4.0)
    # tiny vocabularies
    for j, (v, V) in enumerate([(1, 2), (2, 2), (1, 3), (2, 3), (1, 2), (2, 3)]):
        fs[4 + j] = dict(version=v, V=V)
    # temperature 0
    for j in range(6):
        fs[10 + j] = dict(version=1 + j % 2, temp=0.0)
    # the defaults: tau 5, eta 0.1, temp 1 (llama.cpp's CLI defaults, temp 0.8 aside)
    for j in range(4):
        fs[16 + j] = dict(version=1 + j % 2, tau=5.0, eta=0.1, temp=1.0, kind=["zipf", "normal"][j // 2])
    # large tau (v2 keeps everything) and small tau
    for j in range(4):
        fs[20 + j] = dict(version=1 + j % 2, tau=[10.0, 10.0, 0.5, 0.5][j], eta=[0.1, 0.1, 1.0, 1.0][j])
    # flat and all-tied distributions
    for j in range(4):
        fs[24 + j] = dict(version=1 + j % 2, kind="flat")
    return fs


N_CASES = 120
MAX_TRIES = 200


def make_cases(rng, n_cases=N_CASES):
    forced = forced_specs()
    cases, rejected = [], {}
    for i in range(n_cases):
        for attempt in range(MAX_TRIES):
            spec = draw_spec(rng, i, forced.get(i, {}))
            steps_logits = [draw_logits(rng, spec["V"], spec["kind"], spec["kp"]) for _ in range(spec["steps"])]
            res = run_case(spec, steps_logits)
            if res["fragile"]:
                rejected[spec["kind"]] = rejected.get(spec["kind"], 0) + 1
                continue
            res["case"] = i
            cases.append(res)
            break
        else:
            raise RuntimeError("case %d: no non-fragile draw in %d tries" % (i, MAX_TRIES))
        print("case %3d: v%d V=%5d %-8s tau=%-5g eta=%-6g temp=%-4g steps=%2d kept=%s" % (
            i, spec["version"], spec["V"], spec["kind"], spec["tau"], spec["eta"], spec["temp"],
            spec["steps"], [len(s["kept"]) for s in res["steps"]]), file=sys.stderr)
    return cases, rejected


def tie_groups_ok(ids_l, lg_sorted_full_ids, full_lg, n):
    """ids from llama.cpp must be the first n of the mirror's (stably) sorted array up to
    permutations inside groups of equal logits; at a cut inside a group llama.cpp's ids only
    need to come from that group.  Returns (ok, cut_inside_tie_group)."""
    cut_in_tie = n < len(full_lg) and full_lg[n - 1] == full_lg[n]
    i = 0
    while i < n:
        j = i
        while j + 1 < len(full_lg) and full_lg[j + 1] == full_lg[i]:
            j += 1
        grp_all = set(int(t) for t in lg_sorted_full_ids[i:j + 1])
        hi = min(j + 1, n)
        got = set(int(t) for t in ids_l[i:hi])
        if hi == j + 1:
            if got != grp_all:
                return False, cut_in_tie
        else:
            if not got <= grp_all or len(got) != hi - i:
                return False, cut_in_tie
        i = j + 1
    return True, cut_in_tie


def run_case(spec, steps_logits):
    v, V = spec["version"], spec["V"]
    run = LlamaRun(v, V, spec["seed"], spec["tau"], spec["eta"], spec["temp"])
    mir = Mirror(v, V, spec["seed"], spec["tau"], spec["eta"], spec["temp"])
    steps, fragile = [], False
    for t, logits in enumerate(steps_logits):
        mu_l = run.mu()
        ids_l, lg_l, p_l, sel_l = run.step(logits)
        mu_after_l = run.mu()
        ids_m, lg_m, p_m, info = mir.step(logits)
        where = "case %s step %d" % (spec, t)
        assert bits(mu_l) == bits(info["mu"]), where + ": mu before %r vs mirror %r" % (mu_l, info["mu"])
        n = info["n"]
        assert len(ids_l) == n, where + ": size %d vs mirror %d" % (len(ids_l), n)
        # equal as values (a group of equal logits may mix +0 and -0, in any order)
        assert len(lg_l) == len(lg_m) and np.all(lg_l == lg_m), where + ": kept logits differ"
        assert same_f32(p_l, p_m), where + ": p differ"
        assert sel_l == info["idx"], where + ": drawn index %d vs mirror %d" % (sel_l, info["idx"])
        assert bits(mu_after_l) == bits(info["mu_after"]), where + ": mu after %r vs %r" % (mu_after_l, info["mu_after"])
        # tie-aware id comparison against the mirror's full sorted array
        ok, cut_in_tie = tie_groups_ok(ids_l, info.pop("full_ids"), info.pop("full_lg"), n)
        assert ok, where + ": ids differ beyond ties"
        sel_lg = lg_l[sel_l]
        sel_tied = int(np.sum(lg_l == sel_lg)) > 1
        fragile |= bool(info["frag"])
        st = dict(logits=np.asarray(logits, dtype=np.float32), kept=[int(x) for x in ids_l], p=p_l,
                  selected=int(ids_l[sel_l]), mu=mu_l, mu_after=mu_after_l, info=info,
                  order_dependent=bool(cut_in_tie), selected_tied=bool(sel_tied),
                  same_order=list(ids_l) == list(ids_m))
        steps.append(st)
    run.free()
    return dict(spec=spec, steps=steps, fragile=fragile)


# --------------------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------------------

def f32_str(x):
    """Shortest decimal that gives back this float32 both with strtof and with
    strtod + (float)."""
    x = np.float32(x)
    if not np.isfinite(x):
        raise ValueError(x)
    s = str(x)
    ok = (np.float32(float(s)) == x and _libc.strtof(s.encode(), None) == x
          and math.copysign(1.0, float(s)) == math.copysign(1.0, float(x)))
    if not ok:
        s = repr(float(x))
        assert np.float32(float(s)) == x and _libc.strtof(s.encode(), None) == x
    return s


def case_line(c):
    sp = c["spec"]
    steps = []
    for st in c["steps"]:
        parts = [
            '"logits": [%s]' % ",".join(f32_str(x) for x in st["logits"]),
            '"kept": [%s]' % ",".join(str(i) for i in st["kept"]),
            '"p": [%s]' % ",".join(f32_str(x) for x in st["p"]),
            '"selected": %d' % st["selected"],
            '"mu": %s' % f32_str(st["mu"]),
            '"mu_after": %s' % f32_str(st["mu_after"]),
        ]
        if st["order_dependent"]:
            parts.append('"order_dependent": true')
        if st["selected_tied"]:
            parts.append('"selected_tied": true')
        if st["info"].get("k_int") == -2147483648:
            parts.append('"k_int_min": true')
        steps.append("{" + ", ".join(parts) + "}")
    head = [
        '"case": %d' % c["case"],
        '"version": %d' % sp["version"],
        '"tau": %s' % f32_str(sp["tau"]),
        '"eta": %s' % f32_str(sp["eta"]),
        '"temp": %s' % f32_str(sp["temp"]),
        '"n_vocab": %d' % sp["V"],
        '"m": %d' % M,
        '"seed": %d' % sp["seed"],
        '"kind": %s' % json.dumps(sp["kind"]),
    ]
    line = "{" + ", ".join(head) + ', "steps": [' + ", ".join(steps) + "]}"
    # sanity: valid JSON whose numbers give back the exact float32 values (strtof and strtod)
    back = json.loads(line)
    assert back["n_vocab"] == sp["V"] and len(back["steps"]) == len(c["steps"])
    for sb, st in zip(back["steps"], c["steps"]):
        assert len(sb["logits"]) == sp["V"]
        assert same_f32(np.array(sb["logits"], dtype=np.float64).astype(np.float32), st["logits"])
        assert same_f32(np.array(sb["p"], dtype=np.float64).astype(np.float32), st["p"])
        assert sb["kept"] == st["kept"] and sb["selected"] in sb["kept"]
    return line


def check_strtof(lines):
    """Every number in the file, read with C's strtof, gives the float32 the script meant."""
    n = 0
    for line in lines:
        c = json.loads(line, parse_float=lambda s: s)
        for key in ("tau", "eta", "temp"):
            assert np.float32(float(c[key])) == _libc.strtof(c[key].encode(), None)
        for st in c["steps"]:
            for arr in (st["logits"], st["p"], [st["mu"], st["mu_after"]]):
                for s in arr:
                    a = np.float32(_libc.strtof(s.encode(), None))
                    b = np.float32(float(s))
                    assert a.view(np.uint32) == b.view(np.uint32), s
                    n += 1
    return n


# --------------------------------------------------------------------------------------

def self_test():
    n = 0
    # std::mt19937 reference: the 10000th output with the default seed 5489 is 4123659995
    g = MT19937(5489)
    for _ in range(9999):
        g()
    assert g() == 4123659995
    n += 1
    # x86 int conversion
    assert x86_int(float("nan")) == -2147483648 and x86_int(float("inf")) == -2147483648
    assert x86_int(3e9) == -2147483648 and x86_int(2.9) == 2 and x86_int(0.7) == 0
    n += 1

    # llama.cpp itself, hand-checked situations
    def one(v, lg, tau=5.0, eta=0.1, temp=1.0, seed=7):
        r = LlamaRun(v, len(lg), seed, tau, eta, temp)
        ids, _, p, sel = r.step(np.asarray(lg, dtype=np.float32))
        mu = r.mu()
        r.free()
        return [int(i) for i in ids], [float(x) for x in p], sel, float(mu)
    for v in (1, 2):
        for V in (5, 300):
            # temp 0: the first highest logit (lowest id among equal maxima) stays, p = 1
            lg = [0.0] * V
            lg[3] = lg[V - 1] = 2.0
            lg[1] = 1.0
            ids, p, sel, mu = one(v, lg, temp=0.0)
            assert ids == [3] and p == [1.0] and sel == 0, (v, V, ids, p)
            # observed surprise 0: mu = 2 tau - eta (0 - tau) = 10 + 0.5
            assert mu == float(F(F(10.0) - F(F(0.1) * F(-5.0)))), mu
            n += 1
    for V in (2, 10, 1000):
        for tau in (0.5, 5.0, 10.0):
            # v1 on a flat distribution: s_hat = 0, k = powf(x, +inf) in {0, 1, inf} -> 1 token
            ids, p, _, _ = one(1, [0.0] * V, tau=tau)
            assert len(ids) == 1 and p == [1.0], (V, tau, ids)
            n += 1
    # v2 on a flat distribution of 10: -log2(0.1) = 3.32 <= mu = 10 keeps all; mu = 1 keeps none -> 1
    ids, p, _, _ = one(2, [0.0] * 10, tau=5.0)
    assert sorted(ids) == list(range(10)) and len(set(p)) == 1
    ids, p, _, _ = one(2, [0.0] * 10, tau=0.5)
    assert len(ids) == 1 and p == [1.0]
    n += 2
    # v2, two equal logits, tau 1: p = .5 each, surprise 1 = tau -> mu stays 2
    ids, p, _, mu = one(2, [0.0, 0.0], tau=1.0, eta=0.5)
    assert p == [0.5, 0.5] and mu == 2.0
    n += 1
    return n


def stats_of(cases):
    S = {}

    def add(key, case_id):
        d = S.setdefault(key, [0, set()])
        d[0] += 1
        d[1].add(case_id)
    for c in cases:
        v, cid = c["spec"]["version"], c["case"]
        for st in c["steps"]:
            inf = st["info"]
            size, n = inf["size_in"], inf["n"]
            if v == 1:
                k, ki = float(inf["k"]), inf["k_int"]
                if ki < 1:
                    add("v1 k clamped to 1 (int(k) < 1)", cid)
                    if math.isnan(k):
                        add("v1   of which k is NaN", cid)
                    elif math.isinf(k):
                        add("v1   of which k is +inf (int(k) = INT_MIN)", cid)
                    elif abs(k) >= 2147483648.0:
                        add("v1   of which k is finite >= 2^31 (int(k) = INT_MIN)", cid)
                    else:
                        add("v1   of which 0 <= k < 1", cid)
                if ki >= size:
                    add("v1 int(k) >= size (all kept)", cid)
                if 1 < n < size:
                    add("v1 1 < kept < size", cid)
                if not math.isfinite(float(inf["s_hat"])):
                    add("v1 s_hat not finite", cid)
                elif float(inf["s_hat"]) == 0.0:
                    add("v1 s_hat == 0", cid)
            else:
                if inf["n_raw"] == 0:
                    add("v2 nothing passes, forced to keep 1", cid)
                if n == 1:
                    add("v2 keeps only 1", cid)
                if n == size:
                    add("v2 keeps all", cid)
                if 1 < n < size:
                    add("v2 1 < kept < size", cid)
                if float(inf["mu"]) < 0:
                    add("v2 mu < 0", cid)
            if inf["p_zero"]:
                add("p == 0 before the cut (expf underflow or temp 0)", cid)
            if inf["p_zero_top_m"] and v == 1:
                add("v1 p == 0 within the top m (s_hat inf or NaN)", cid)
            if np.any(st["p"] == 0):
                add("p == 0 among kept", cid)
            if st["order_dependent"]:
                add("cut inside a group of equal logits (order_dependent)", cid)
            if st["selected_tied"]:
                add("selected token has an equal-logit twin among kept (selected_tied)", cid)
            if not st["same_order"]:
                add("llama.cpp order != stable (by id) order", cid)
    return {k: (v[0], len(v[1])) for k, v in S.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "testdata", "sampler", "mirostat.jsonl"))
    ap.add_argument("--cases", type=int, default=N_CASES, help="only the first N cases (for debugging)")
    args = ap.parse_args()

    load_llama()
    print("self-test: %d checks passed" % self_test(), file=sys.stderr)
    rng = np.random.default_rng(SEED)
    cases, rejected = make_cases(rng, args.cases)
    lines = [case_line(c) for c in cases]
    nnum = check_strtof(lines)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fp:
        fp.write("\n".join(lines) + "\n")

    nsteps = sum(len(c["steps"]) for c in cases)
    nv = {1: 0, 2: 0}
    for c in cases:
        nv[c["spec"]["version"]] += 1
    print("cases: %d (v1 %d, v2 %d), steps: %d, numbers checked with strtof: %d"
          % (len(cases), nv[1], nv[2], nsteps, nnum), file=sys.stderr)
    print("rejected (fragile) draws by kind: %s" % json.dumps(rejected, sort_keys=True), file=sys.stderr)
    for k, (ns, nc) in sorted(stats_of(cases).items()):
        print("  %-70s steps %4d  cases %3d" % (k, ns, nc), file=sys.stderr)
    print("wrote %s (%d bytes)" % (args.out, os.path.getsize(args.out)), file=sys.stderr)


if __name__ == "__main__":
    main()
