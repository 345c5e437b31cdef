#!/usr/bin/env python3
"""Make reference outputs of llama.cpp's DRY sampler for llmi's DRY tests.

Runs llama.cpp's own DRY sampler (llama_sampler_init_dry in libllama.so, through the
ctypes bindings of the llama-cpp-python 0.3.36 sdist) on the vocabulary of
SmolLM2-135M-Instruct (loaded with vocab_only = true) and writes

  testdata/sampler/dry.jsonl          one line per case: params, breakers, history, penalties
  testdata/sampler/dry-breakers.json  the processed restart-sequence table per breaker list

See testdata/sampler/DRY-PROVENANCE.md for the exact semantics.

For each case a DRY sampler is built with (multiplier, base, allowed_length,
penalty_last_n, breakers), the history is fed with llama_sampler_accept one token at a
time, and the sampler is applied to all 49,152 ids in id order with logit 0.0
(sorted = false).  Every id whose logit changed is recorded with its new logit
(= -penalty, float32).

The restart-sequence table (get_overlapping_token_sequences, an unordered_multimap
inside the sampler) cannot be read through the API; it is re-implemented here and then
checked against llama.cpp's behaviour:
  * the set of heads with an empty tail (single-token breakers, never penalised) is
    checked for every id of the vocabulary;
  * for every id H of the vocabulary and every split point i of every breaker,
    the history [p, H, T, p, H, T] with T = tokenize(breaker[i:])[:20] is run through
    llama.cpp and the repeat clamp it shows (rep_limit) is compared with the table's
    prediction;
  * every case of the output is recomputed by a Python mirror of llama_sampler_dry_apply
    that uses the table, and must equal llama.cpp's float32 output bit for bit.

Usage (see DRY-PROVENANCE.md):
    PYTHONPATH=/tmp/lcp/llama_cpp_python-0.3.36 LLAMA_CPP_LIB_PATH=/tmp/lcp-build/bin \
        /work/refenv/bin/python scripts/make-dry-refs.py [--model PATH] [--quick]
# --quick: probe only the partial heads the table predicts plus a random sample
"""

import argparse
import ctypes
import json
import os
import sys
import time

import numpy as np

SEED = 20250612
MODEL = "/root/.cache/llmi/SmolLM2-135M-Instruct.Q4_1.gguf"
MAX_CHAR_LEN = 40        # llama_sampler_init_dry: breaker strings cut at 40 bytes
MAX_SEQ_LEN = 20         # tails truncated to 20 tokens
FLOAT_MAX_LOG = np.float32(88.7228391)

L = None
VOCAB = None
NV = 0

_libm = ctypes.CDLL("libm.so.6")
_libm.logf.restype = ctypes.c_float
_libm.logf.argtypes = [ctypes.c_float]
_libm.pow.restype = ctypes.c_double
_libm.pow.argtypes = [ctypes.c_double, ctypes.c_double]


LOG = []
_LOG_CB = None


def _log(level, text, user_data):
    LOG.append(text.decode("utf-8", "replace") if text else "")


def load(model_path):
    global L, VOCAB, NV
    import llama_cpp.llama_cpp as _L  # noqa: E402  (needs PYTHONPATH / LLAMA_CPP_LIB_PATH)
    L = _L
    global _LOG_CB
    _LOG_CB = L.llama_log_callback(_log)      # keep llama.cpp's log off stderr (kept in LOG)
    L.llama_log_set(_LOG_CB, None)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.vocab_only = True
    model = L.llama_model_load_from_file(model_path.encode(), mp)
    if not model:
        raise SystemExit("cannot load " + model_path)
    VOCAB = L.llama_model_get_vocab(model)
    NV = L.llama_vocab_n_tokens(VOCAB)
    return model


# --------------------------------------------------------------------------------------
# tokenizer access, exactly the calls llama.cpp's DRY init makes
# --------------------------------------------------------------------------------------

def tokenize(b):
    """vocab.tokenize(str, add_special = false, parse_special = false)"""
    assert isinstance(b, bytes)
    n_max = len(b) + 16
    arr = (L.llama_token * n_max)()
    n = L.llama_tokenize(VOCAB, b, len(b), arr, n_max, False, False)
    if n < 0:
        n_max = -n
        arr = (L.llama_token * n_max)()
        n = L.llama_tokenize(VOCAB, b, len(b), arr, n_max, False, False)
    assert n >= 0
    return [int(x) for x in arr[:n]]


def detokenize1(tid):
    """vocab.detokenize({tid}, special = true) == llama_detokenize(.., remove_special = false,
    unparse_special = true)"""
    arr = (L.llama_token * 1)(tid)
    size = 64
    while True:
        buf = ctypes.create_string_buffer(size)
        n = L.llama_detokenize(VOCAB, arr, 1, buf, size, False, True)
        if n >= 0:
            return buf.raw[:n]
        size = -n


def piece(tid):
    """llama_token_to_piece(tid, lstrip = 0, special = true) (for the cross-check only)"""
    size = 64
    while True:
        buf = ctypes.create_string_buffer(size)
        n = L.llama_token_to_piece(VOCAB, tid, buf, size, 0, True)
        if n >= 0:
            return buf.raw[:n]
        size = -n


PIECES = None


def all_pieces():
    global PIECES
    if PIECES is None:
        PIECES = [detokenize1(t) for t in range(NV)]
        same = sum(PIECES[t] == piece(t) for t in range(NV))
        assert same == NV, "detokenize({id}, true) != token_to_piece for %d ids" % (NV - same)
    return PIECES


# --------------------------------------------------------------------------------------
# get_overlapping_token_sequences, re-implemented
# --------------------------------------------------------------------------------------

def process_breakers(breakers):
    """llama_sampler_init_dry's breaker processing.  Returns {head id: [tail, ...]} with the
    entries of the unordered_multimap in insertion order (duplicates kept as llama.cpp
    keeps them)."""
    pieces = all_pieces()
    table = {}
    tail_cache = {}
    for s in breakers:
        b = s.encode("utf-8")
        if len(b) == 0:
            continue                         # "skipping null or empty DRY sequence breaker"
        if len(b) > MAX_CHAR_LEN:
            b = b[:MAX_CHAR_LEN]             # sequence_break.resize(MAX_CHAR_LEN)
        c0 = b[0:1]
        for tid in range(NV):
            word = pieces[tid]
            if b in word:                    # word.find(str) != npos: emplace, no duplicate check
                table.setdefault(tid, []).append([])
                continue
            wl, sl = len(word), len(b)
            pos = -1
            while True:
                pos = word.find(c0, pos + 1)
                if pos < 0:
                    break
                match = True
                i = 1
                while i < sl and i + pos < wl:
                    if word[pos + i] != b[i]:
                        match = False
                        break
                    i += 1
                if match:
                    rest = b[i:]
                    if rest not in tail_cache:
                        t = tokenize(rest)
                        tail_cache[rest] = t[:MAX_SEQ_LEN]
                    t = tail_cache[rest]
                    lst = table.setdefault(tid, [])
                    if t not in lst:         # duplicate check over all entries of this head
                        lst.append(list(t))
    return table


def single_heads(table):
    return {h for h, tails in table.items() if any(len(t) == 0 for t in tails)}


# --------------------------------------------------------------------------------------
# llama.cpp runner
# --------------------------------------------------------------------------------------

TOKEN_DATA_DTYPE = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


def c_breakers(breakers):
    arr = (ctypes.c_char_p * max(1, len(breakers)))()
    keep = [s.encode("utf-8") for s in breakers]
    for i, b in enumerate(keep):
        arr[i] = b
    return arr, keep


def make_dry(P, breakers):
    arr, keep = c_breakers(breakers)
    smpl = L.llama_sampler_init_dry(VOCAB, float(P["dry_multiplier"]), float(P["dry_base"]),
                                    int(P["dry_allowed_length"]), int(P["dry_penalty_last_n"]),
                                    arr, len(breakers))
    del keep
    return smpl


class Cands:
    def __init__(self, ids):
        self.ids = np.asarray(ids, dtype=np.int32)
        self.buf = np.zeros(len(self.ids), dtype=TOKEN_DATA_DTYPE)

    def apply(self, smpl):
        buf = self.buf
        buf["id"] = self.ids
        buf["logit"] = 0.0
        buf["p"] = 0.0
        cur = L.llama_token_data_array(
            data=ctypes.cast(ctypes.c_void_p(buf.ctypes.data), L.llama_token_data_p),
            size=len(buf), selected=-1, sorted=False)
        L.llama_sampler_apply(smpl, ctypes.byref(cur))
        assert cur.size == len(buf) and ctypes.cast(cur.data, ctypes.c_void_p).value == buf.ctypes.data
        assert np.array_equal(buf["id"], self.ids), "DRY reordered the candidates"
        return buf["logit"]


FULL = None


def run_llamacpp(P, breakers, history):
    """{id: float32 logit} for every id whose logit changed from 0.0."""
    smpl = make_dry(P, breakers)
    for t in history:
        L.llama_sampler_accept(smpl, int(t))
    lg = FULL.apply(smpl)
    L.llama_sampler_free(smpl)
    ch = np.nonzero(lg != 0.0)[0]
    return {int(FULL.ids[i]): np.float32(lg[i]) for i in ch}


# --------------------------------------------------------------------------------------
# Python mirror of llama_sampler_dry_apply
# --------------------------------------------------------------------------------------

def f32(x):
    return np.float32(x)


def max_exponent(base):
    b = f32(base)
    if b > f32(1.000001):
        return int(FLOAT_MAX_LOG / f32(_libm.logf(b)))   # float / logf(float), truncated to int
    return 0


def penalty_value(mult, base, exp):
    # float penalty = dry_multiplier * std::pow(dry_base, repeat_exp): pow(float, int) is
    # computed in double, the product in double, rounded once to float.
    with np.errstate(over="ignore"):
        return np.float32(float(f32(mult)) * _libm.pow(float(f32(base)), float(exp)))


def rep_limit_of(window, table, skip=None, extra=None):
    """Step 1: (rep_limit, i of the head found or None, longest_match).  skip: a head id
    whose entries are ignored; extra: (head, tail) added to the table (both only for the
    decisiveness tests of the probes)."""
    N = len(window)
    for i in range(N):
        tok = window[N - 1 - i]
        if tok == skip:
            continue
        tails = table.get(tok)
        if extra is not None and tok == extra[0]:
            tails = (tails or []) + [extra[1]]
        if not tails:
            continue
        longest = -1
        for t in tails:
            sl = len(t)
            if sl > longest and sl <= i:
                if all(t[o] == window[N - 1 - (i - o - 1)] for o in range(sl)):
                    longest = sl
        if longest >= 0:
            return i - longest, i, longest
    return N, None, None


def mirror(P, table, history):
    m, b = f32(P["dry_multiplier"]), f32(P["dry_base"])
    a, n = int(P["dry_allowed_length"]), max(int(P["dry_penalty_last_n"]), 0)
    info = dict(enabled=False, early="")
    if m == 0.0 or b < 1.0 or n == 0:
        info["early"] = "disabled"
        return {}, info
    info["enabled"] = True
    w = list(history[-n:])
    N = len(w)
    if N <= a:
        info["early"] = "last_n_repeat<=allowed"
        return {}, info
    rep_limit, hi, lm = rep_limit_of(w, table)
    info["rep_limit"] = rep_limit
    info["restart_at"] = hi
    info["restart_len"] = lm
    if rep_limit < a:
        info["early"] = "rep_limit<allowed"
        return {}, info
    # Steps 2-3: repeat length of the suffix ending at w[t] (t < N-1), clamped to rep_limit,
    # attached to the token that follows it, w[t+1]; max over occurrences.
    maxrep = {}
    raw_max = 0
    for t in range(N - 1):
        k = 0
        while k <= t and w[t - k] == w[N - 1 - k]:
            k += 1
        raw_max = max(raw_max, k)
        c = min(k, rep_limit)
        if c >= a:
            tok = w[t + 1]
            if maxrep.get(tok, -1) < c:
                maxrep[tok] = c
    info["max_repeat_unclamped"] = raw_max
    mx = max_exponent(b)
    out = {}
    singles = single_heads(table)
    clamped = False
    for tok, r in maxrep.items():
        if tok in singles:
            continue
        e = r - a
        if mx > 0 and e > mx:
            e = mx
            clamped = True
        out[tok] = np.float32(np.float32(0.0) - penalty_value(m, b, e))
    info["exp_clamped"] = clamped
    return out, info


# --------------------------------------------------------------------------------------
# table verification against llama.cpp's behaviour
# --------------------------------------------------------------------------------------

PROBE_P = dict(dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=0, dry_penalty_last_n=4096)


def verify_single_heads(breakers, table, chunk=4000):
    """allowed_length 0: every window token but the first gets a penalty unless it is a
    single-token breaker (or unless a restart sequence clamps... which only lowers the
    exponent, never removes the penalty).  The window is [x0, ids...] with ids distinct."""
    smpl = make_dry(dict(PROBE_P, dry_penalty_last_n=chunk + 1), breakers)
    singles = single_heads(table)
    x0 = FILLER[0]
    found = set()
    for lo in range(0, NV, chunk):
        ids = list(range(lo, min(NV, lo + chunk)))
        L.llama_sampler_reset(smpl)
        L.llama_sampler_accept(smpl, x0)
        for t in ids:
            L.llama_sampler_accept(smpl, t)
        c = Cands(ids)
        lg = c.apply(smpl)
        for t, v in zip(ids, lg):
            if v == 0.0:
                found.add(t)
    L.llama_sampler_free(smpl)
    # x0 itself is not a single-token breaker (checked on its own below) and appears once
    assert found == singles, "single-token heads differ: llama.cpp-only %s, table-only %s" % (
        sorted(found - singles)[:20], sorted(singles - found)[:20])
    return len(found)


FILLER = []     # ordinary word tokens, chosen in main(): never heads in any table used


def verify_partial(breakers, table, ids_to_probe, stats):
    """For each split i of each breaker and each H in ids_to_probe: history
    [p, H, T, p, H, T] (T = tokenize(breaker[i:])[:20]); base 2, multiplier 1, allowed 0:
    the token p at position |T|+2 ends the only repeat, so it gets the penalty
    2^min(|T|+2, rep_limit).  Compare with the table's rep_limit."""
    smpl = make_dry(PROBE_P, breakers)
    p = FILLER[1]
    assert p not in table
    data = (L.llama_token_data * 1)()
    data[0].id = p
    cur = L.llama_token_data_array(data=ctypes.cast(data, L.llama_token_data_p), size=1, selected=-1,
                                   sorted=False)
    curp = ctypes.byref(cur)
    tails = []
    for s in breakers:
        b = s.encode("utf-8")[:MAX_CHAR_LEN]
        for i in range(1, len(b)):
            t = tokenize(b[i:])[:MAX_SEQ_LEN]
            if t not in tails:
                tails.append(t)
    n = dec = 0
    acc, app, reset = L.llama_sampler_accept, L.llama_sampler_apply, L.llama_sampler_reset
    for T in tails:
        assert p not in T
        for H in ids_to_probe:
            if H == p:
                continue
            hist = [p, H] + T + [p, H] + T
            reset(smpl)
            for t in hist:
                acc(smpl, t)
            data[0].logit = 0.0
            cur.size = 1
            cur.sorted = False
            app(smpl, curp)
            v = data[0].logit
            rl = rep_limit_of(hist, table)[0]
            exp = min(len(T) + 2, rl)
            want = -float(2.0 ** exp)
            if v != want:
                raise AssertionError("partial-head probe: breakers %r H=%d T=%s llama.cpp %r table %r"
                                     % (breakers, H, T, v, want))
            # decisive: would the table without H's entries predict something else?
            if H in table and min(len(T) + 2, rep_limit_of(hist, table, skip=H)[0]) != exp:
                dec += 1
                if any(table[H]):
                    stats.setdefault("decisive_heads", set()).add((tuple(breakers), H))
            # absence: had llama.cpp an entry (H, T) that the table lacks, would this probe show it?
            if T not in table.get(H, []):
                stats["absent"] = stats.get("absent", 0) + 1
                if min(len(T) + 2, rep_limit_of(hist, table, extra=(H, T))[0]) != exp:
                    stats["absent_decisive"] = stats.get("absent_decisive", 0) + 1
            n += 1
    L.llama_sampler_free(smpl)
    stats["probes"] = stats.get("probes", 0) + n
    stats["decisive"] = stats.get("decisive", 0) + dec
    return n


# --------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------

BREAKER_LISTS = [
    ("default", ["\n", ":", "\"", "*"]),
    ("none", []),
    ("nn", ["\n\n"]),
    ("the", [" the"]),
    ("hash-user", ["###", "User:"]),
    ("assistant-says", [" Assistant says"]),
    ("long", [" and then the story goes on and on forever and ever, the end"]),   # cut to 40 bytes
    ("digits", ["3.14159265358979323846264338327950288419716939937510"]),         # cut; tails > 20 tokens
    ("mixed", ["", "\u2014", "\n", "\n", "\u2014"]),   # empty (skipped), em dash (invalid-UTF-8 tails), duplicates
]

TEXTS = [
    "The cat sat on the mat. The cat sat on the mat. The cat sat on the mat. The cat sat on the",
    "User: hi\nAssistant: hello\nUser: hi\nAssistant: hello\nUser: hi\nAssistant:",
    "\"Where are you going?\" she asked. \"Home,\" he said. \"Where are you going?\" she asked. \"Home,\" he",
    "* apples\n* pears\n* plums\n* apples\n* pears\n* plums\n* apples\n* pears\n*",
    "**Note:** read the manual.\n**Note:** read the manual.\n**Note:** read the",
    "def f(x):\n    return x + 1\n\ndef f(x):\n    return x + 1\n\ndef f(x):\n    return",
    "config:\n  name: test\n  value: 1\nconfig:\n  name: test\n  value: 1\nconfig:\n  name:",
    "### User: what is the time?\n### Assistant says: it is noon.\n### User: what is the time?\n### Assistant says: it is",
    "Once upon a time there was a king. Once upon a time there was a king. Once upon a time there was a",
    "and then the story goes on and on forever and ever, and then the story goes on and on forever and ever, and then the story goes on",
    "pi = 3.14159265358979323846264338327950288419716939937510; pi = 3.14159265358979323846264338327950288419716939937510; pi = 3.14159265",
    "The Assistant says yes. The Assistant says no. The Assistant says yes. The Assistant says no. The Assistant says",
    "I think \u2014 no, I know \u2014 that it works. I think \u2014 no, I know \u2014 that it works. I think \u2014 no, I know",
    "Q: What is 2+2?\nA: 4\n\nQ: What is 2+2?\nA: 4\n\nQ: What is 2+2?\nA:",
    "the the the the the the the the the the the the the the the the the the the the the the",
    "la la la la la la la la la la la la la la la la la la la la la la la la la la la la la",
    "- item one\n- item two\n\n- item one\n- item two\n\n- item one\n- item",
    "User: tell me a joke\nAssistant: Why did the chicken cross the road? To get to the other side.\nUser: tell me a joke\nAssistant: Why did the chicken cross the road?",
    "a: 1, b: 2, c: 3; a: 1, b: 2, c: 3; a: 1, b: 2, c: 3; a: 1, b:",
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nhi<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
]

MULTS = [0.8, 1.5, 3.0]
BASES = [1.75, 1.1, 2.5, 1.0]
ALLOWED = [0, 1, 2, 4]
LASTN = [8, 64, 512]


def pick(rng, xs):
    return xs[int(rng.integers(len(xs)))]


def draw_params(rng, off_rate=0.06):
    P = dict(dry_multiplier=pick(rng, MULTS), dry_base=pick(rng, BASES),
             dry_allowed_length=pick(rng, ALLOWED), dry_penalty_last_n=pick(rng, LASTN))
    if rng.random() < off_rate:
        k = int(rng.integers(4))
        if k == 0:
            P["dry_multiplier"] = 0.0
        elif k == 1:
            P["dry_base"] = 0.5
        elif k == 2:
            P["dry_penalty_last_n"] = 0
        else:
            P["dry_penalty_last_n"] = -1
    return P


def special_ids():
    """Tokens whose text is or contains breaker text, and partial heads."""
    pieces = all_pieces()
    want = [b"\n", b":", b"\"", b"*", b":\n", b"**", b" the", b"the", b"\n\n", b"###", b"##", b"#",
            b"User", b":\n\n", b" Assistant", b" says", b"3", b".", b"1", b"4", b"\xe2\x80\x94",
            b" \xe2\x80\x94", b"\xe2", b"\xe2\x80", b" t", b" th", b" ", b"\xef\xbf\xbd", b"\"\n",
            b"*\n", b" U", b"Us", b"Use", b" and", b" then", b" story"]
    idx = {p: i for i, p in reversed(list(enumerate(pieces)))}
    out = []
    for w in want:
        if w in idx and idx[w] not in out:
            out.append(idx[w])
    return out


def draw_alphabet(rng, specials, words, k):
    ns = int(rng.integers(1, min(k, 6) + 1))
    a = list(rng.choice(specials, size=ns, replace=False))
    a += list(rng.choice(words, size=k - ns, replace=False))
    return [int(x) for x in a]


def random_history(rng, alphabet, length):
    """Random (1/4), one motif repeated with some noise (3/8), or a mix of motifs (3/8):
    the latter two make the suffix of the window recur, i.e. make long repeats."""
    if length == 0:
        return []
    u = rng.random()
    if u < 0.25:
        return [int(x) for x in rng.choice(alphabet, size=length)]
    motifs = [[int(x) for x in rng.choice(alphabet, size=int(rng.integers(2, 9)))] for _ in range(3)]
    single = u < 0.625
    out = []
    while len(out) < length:
        if single:
            out += motifs[0] if rng.random() < 0.9 else [int(pick(rng, alphabet))]
        elif rng.random() < 0.6:
            out += motifs[int(rng.integers(len(motifs)))]
        else:
            out += [int(x) for x in rng.choice(alphabet, size=int(rng.integers(1, 4)))]
    out = out[:length]
    if rng.random() < 0.3 and length > 2:     # a point mutation
        out[int(rng.integers(length))] = int(pick(rng, alphabet))
    return out


def build_cases(tables, words):
    rng = np.random.default_rng(SEED)
    specials = special_ids()
    text_tok = [tokenize(t.encode("utf-8")) for t in TEXTS]
    cases = []

    def add(name, P, bl, hist):
        cases.append(dict(case=name, params=P, blname=bl, breakers=dict(BREAKER_LISTS)[bl],
                          history=[int(x) for x in hist]))

    bl_names = [n for n, _ in BREAKER_LISTS]
    # (a) real text, every breaker list
    for j in range(81):
        bl = bl_names[j % len(bl_names)]
        tt = text_tok[int(rng.integers(len(text_tok)))]
        u = rng.random()
        if u < 0.5:
            hist = tt
        elif u < 0.8:
            hist = tt[:int(rng.integers(1, len(tt) + 1))]
        else:
            hist = (tt * int(rng.integers(2, 6)))[:int(rng.integers(len(tt), 5 * len(tt)))]
        add("text-%s-%03d" % (bl, j), draw_params(rng), bl, hist)
    # text with the llama.cpp defaults (multiplier set, the rest default)
    for j, tt in enumerate(text_tok):
        add("text-cli-%03d" % j, dict(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2,
                                      dry_penalty_last_n=64), "default", tt)
    # (b) random sequences over small alphabets
    for j in range(75):
        bl = bl_names[j % len(bl_names)]
        k = int(rng.integers(5, 13))
        alpha = draw_alphabet(rng, specials, words, k)
        u = rng.random()
        length = int(rng.integers(0, 40)) if u < 0.3 else (int(rng.integers(40, 200)) if u < 0.7 else
                                                          int(rng.integers(200, 701)))
        hist = random_history(rng, alpha, length)
        sh = single_heads(tables[bl])
        plain = [t for t in alpha if t not in sh]
        if hist and hist[-1] in sh and plain and rng.random() < 0.6:
            # often let the history end outside a breaker, so that step 1 does not stop at i = 0
            hist = hist + [int(pick(rng, plain))]
        add("rand-%s-%03d" % (bl, j), draw_params(rng), bl, hist)
    # (c) histories that end in a multi-token restart sequence (head + part/all of its tail)
    j = 0
    for bl in bl_names:
        tab = tables[bl]
        multi = [(h, t) for h, ts in sorted(tab.items()) for t in ts if len(t) > 0]
        if not multi:
            continue
        for _ in range(6):
            h, t = multi[int(rng.integers(len(multi)))]
            if rng.random() < 0.5:      # prefer the natural head (the breaker's first tokens)
                nat = tokenize(dict(BREAKER_LISTS)[bl][-1].encode("utf-8")[:MAX_CHAR_LEN])
                cand = [(hh, tt) for hh, tt in multi if hh == nat[0]]
                if cand:
                    h, t = cand[int(rng.integers(len(cand)))]
            tt = text_tok[int(rng.integers(len(text_tok)))]
            pre = tt[:int(rng.integers(4, len(tt)))]
            part = len(t) if rng.random() < 0.6 else int(rng.integers(0, len(t) + 1))
            seq = [h] + t[:part]
            after = [] if rng.random() < 0.5 else pre[:int(rng.integers(1, 4))]
            hist = pre + seq + pre + seq + after
            P = draw_params(rng, off_rate=0.0)
            P["dry_penalty_last_n"] = pick(rng, [64, 512])
            add("restart-%s-%03d" % (bl, j), P, bl, hist)
            j += 1
    # (d) long repeats: the max_exponent clamp (base 2.5 -> 96, base 1.75 -> 158)
    j = 0
    for base in (2.5, 2.5, 2.5, 1.75, 1.75):
        for mult in MULTS:
            alpha = [int(x) for x in rng.choice(words, size=int(rng.integers(3, 8)), replace=False)]
            motif = [int(x) for x in rng.choice(alpha, size=int(rng.integers(2, 7)))]
            length = int(rng.integers(200, 701))
            hist = (motif * (length // len(motif) + 1))[:length]
            P = dict(dry_multiplier=mult, dry_base=base, dry_allowed_length=pick(rng, [0, 0, 1, 2]),
                     dry_penalty_last_n=512)
            add("overflow-%03d" % j, P, pick(rng, ["default", "none"]), hist)
            j += 1
    # (e) edges: empty history, history of 1, last_n_repeat == allowed, base exactly 1, off cases
    edge = [
        (dict(dry_multiplier=1.5, dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=64), []),
        (dict(dry_multiplier=1.5, dry_base=1.75, dry_allowed_length=0, dry_penalty_last_n=64), [words[0]]),
        (dict(dry_multiplier=1.5, dry_base=1.75, dry_allowed_length=0, dry_penalty_last_n=64), words[:2]),
        (dict(dry_multiplier=1.5, dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=64), words[:2]),
        (dict(dry_multiplier=1.5, dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=64), words[:3]),
        (dict(dry_multiplier=1.5, dry_base=1.75, dry_allowed_length=4, dry_penalty_last_n=4), words[:3] * 3),
        (dict(dry_multiplier=1.5, dry_base=1.75, dry_allowed_length=4, dry_penalty_last_n=5), words[:3] * 3),
        (dict(dry_multiplier=0.8, dry_base=1.0, dry_allowed_length=1, dry_penalty_last_n=64), words[:4] * 5),
        (dict(dry_multiplier=0.0, dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=64), words[:4] * 5),
        (dict(dry_multiplier=0.8, dry_base=0.5, dry_allowed_length=2, dry_penalty_last_n=64), words[:4] * 5),
        (dict(dry_multiplier=0.8, dry_base=0.999, dry_allowed_length=2, dry_penalty_last_n=64), words[:4] * 5),
        (dict(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=0), words[:4] * 5),
        (dict(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=-1), words[:4] * 5),
        (dict(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=8), words[:4] * 5),
        (dict(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=8), [words[0]] * 30),
        (dict(dry_multiplier=-0.5, dry_base=1.75, dry_allowed_length=1, dry_penalty_last_n=64), words[:4] * 5),
    ]
    for j, (P, hist) in enumerate(edge):
        add("edge-%03d" % j, P, "default", hist)
    return cases


# --------------------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------------------

def fnum32(x):
    x = np.float32(x)
    if np.isneginf(x):
        return '"-inf"'
    assert np.isfinite(x)
    s = repr(float(x))
    assert np.float32(float(s)) == x
    return s


def pnum(v):
    return str(int(v)) if isinstance(v, int) else repr(float(v))


def case_line(c, pen):
    P = c["params"]
    ps = ", ".join('"%s": %s' % (k, pnum(P[k])) for k in
                   ("dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n"))
    parts = [
        '"case": %s' % json.dumps(c["case"]),
        '"params": {%s}' % ps,
        '"breakers": %s' % json.dumps(c["breakers"], ensure_ascii=False),
        '"history": %s' % json.dumps(c["history"]),
        '"penalties": [%s]' % ", ".join("[%d, %s]" % (t, fnum32(pen[t])) for t in sorted(pen)),
    ]
    line = "{" + ", ".join(parts) + "}"
    back = json.loads(line)
    assert back["history"] == c["history"] and back["breakers"] == c["breakers"]
    return line


def choose_words(tables):
    """Ordinary word tokens (letters only, >= 3 bytes) that are heads in no table."""
    pieces = all_pieces()
    heads = set()
    for t in tables.values():
        heads |= set(t)
    out = []
    for tid in range(1000, NV):
        p = pieces[tid]
        if len(p) >= 4 and p[0:1] == b" " and p[1:].isalpha() and p.isascii() and tid not in heads:
            out.append(tid)
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--out", default=os.path.join(here, "..", "testdata", "sampler", "dry.jsonl"))
    ap.add_argument("--table-out", default=os.path.join(here, "..", "testdata", "sampler", "dry-breakers.json"))
    ap.add_argument("--quick", action="store_true",
                    help="probe the partial heads of the table plus 2000 random ids, not the whole vocabulary")
    args = ap.parse_args()

    t0 = time.time()
    load(args.model)
    global FULL
    FULL = Cands(np.arange(NV))
    all_pieces()
    print("vocab: %d ids; detokenize({id}, true) == token_to_piece(id, 0, true) for all" % NV, file=sys.stderr)

    tables = {name: process_breakers(bl) for name, bl in BREAKER_LISTS}
    words = choose_words(tables)
    rngw = np.random.default_rng(SEED + 1)
    words = [int(x) for x in rngw.permutation(words)[:400]]
    FILLER[:] = words[:2]
    for name, bl in BREAKER_LISTS:
        tab = tables[name]
        ne = sum(len(v) for v in tab.values())
        nm = sum(1 for v in tab.values() for t in v if t)
        print("table %-15s heads %5d entries %5d (non-empty tails %d), single-token heads %d"
              % (name, len(tab), ne, nm, len(single_heads(tab))), file=sys.stderr)

    # ---- verify the tables against llama.cpp's behaviour
    stats = {}
    rngq = np.random.default_rng(SEED + 2)
    for name, bl in BREAKER_LISTS:
        tab = tables[name]
        ns = verify_single_heads(bl, tab)
        if args.quick:
            ids = sorted(set(h for h, ts in tab.items() if any(ts)) |
                         set(int(x) for x in rngq.choice(NV, size=2000, replace=False)))
        else:
            ids = list(range(NV))
        n = verify_partial(bl, tab, ids, stats)
        print("verified %-15s single-token heads %d (whole vocabulary); partial-head probes %d"
              % (name, ns, n), file=sys.stderr)
    dh = stats.get("decisive_heads", set())
    multi = set((tuple(bl), h) for name, bl in BREAKER_LISTS for h, ts in tables[name].items() if any(ts))
    print("partial-head probes: %d; the probe is decisive (the table without that head predicts "
          "otherwise) for %d of the %d heads with non-empty tails" % (stats["probes"], len(dh & multi),
                                                                      len(multi)), file=sys.stderr)
    print("probes of (H, T) pairs absent from the table: %d, of which %d would have shown the entry"
          % (stats.get("absent", 0), stats.get("absent_decisive", 0)), file=sys.stderr)
    if multi - dh:
        print("  not decisive: %s" % sorted((b[0][:12], h, all_pieces()[h]) for b, h in multi - dh)[:40],
              file=sys.stderr)

    # ---- cases
    cases = build_cases(tables, words)
    lines = []
    n_nonempty = n_clamped = n_inf = 0
    early = {}
    for c in cases:
        pen = run_llamacpp(c["params"], c["breakers"], c["history"])
        mir, info = mirror(c["params"], tables[c["blname"]], c["history"])
        assert set(pen) == set(mir), "%s: ids differ: llama.cpp-only %s mirror-only %s" % (
            c["case"], sorted(set(pen) - set(mir))[:10], sorted(set(mir) - set(pen))[:10])
        for t in pen:
            assert np.float32(pen[t]).tobytes() == np.float32(mir[t]).tobytes(), "%s: id %d: %r vs %r" % (
                c["case"], t, pen[t], mir[t])
        c["info"] = info
        n_nonempty += bool(pen)
        n_clamped += bool(info.get("exp_clamped"))
        n_inf += any(np.isneginf(v) for v in pen.values())
        if info["early"]:
            early[info["early"]] = early.get(info["early"], 0) + 1
        lines.append(case_line(c, pen))

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fp:
        fp.write("\n".join(lines) + "\n")

    # ---- the tables
    tl = []
    for name, bl in BREAKER_LISTS:
        tab = tables[name]
        heads = ", ".join('"%d": %s' % (h, json.dumps(tab[h])) for h in sorted(tab))
        tl.append('  {"name": %s, "breakers": %s, "heads": {%s}}'
                  % (json.dumps(name), json.dumps(bl, ensure_ascii=False), heads))
    with open(args.table_out, "w") as fp:
        fp.write("[\n" + ",\n".join(tl) + "\n]\n")
    back = json.load(open(args.table_out))
    assert [b["breakers"] for b in back] == [bl for _, bl in BREAKER_LISTS]

    used = sorted(set(c["blname"] for c in cases))
    print("cases: %d, non-empty penalties: %d, exponent clamped: %d, with -inf: %d; early returns: %s; "
          "breaker lists used: %d" % (len(cases), n_nonempty, n_clamped, n_inf,
                                      json.dumps(early, sort_keys=True), len(used)), file=sys.stderr)
    restart_hits = sum(1 for c in cases if c["info"].get("restart_at") is not None)
    restart_multi = sum(1 for c in cases if (c["info"].get("restart_len") or 0) > 0)
    print("cases where step 1 found a restart sequence: %d (multi-token: %d)" % (restart_hits, restart_multi),
          file=sys.stderr)
    print("wrote %s (%d bytes), %s (%d bytes) in %.0f s" % (args.out, os.path.getsize(args.out), args.table_out,
                                                            os.path.getsize(args.table_out), time.time() - t0),
          file=sys.stderr)


if __name__ == "__main__":
    main()
