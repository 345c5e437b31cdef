#!/usr/bin/env python3
"""Makes llama.cpp's grammar-constrained decoding reference for llmi's GBNF tests (testdata/grammar/).

Not run by CI: CI compares llmi's grammar masks and constrained generations against the
files this wrote. Needs the llama-cpp-python 0.3.36 sdist's python sources on PYTHONPATH,
numpy and diskcache (the package imports it), LLAMA_CPP_LIB_PATH pointing at a build of its
vendored llama.cpp (libllama.so), and scripts/llamacpp-json-schema.cpp built against that
build (llama.cpp's own JSON-schema-to-GBNF converter); testdata/grammar/PROVENANCE.md has the
exact commands.

Input: testdata/grammar/cases.json, a list of {"name", "grammar": GBNF} or {"name", "schema":
JSON schema} with "texts" to walk. Schema cases are turned into GBNF by the converter.

    masks   python3 scripts/make-grammar-refs.py masks  SCHEMA_BIN MODEL testdata/grammar
            writes masks.jsonl: for every (case, text) the text's llama.cpp tokens
            (add_special=false, parse_special=false) and, before each token and after the
            last accepted one, the set of tokens llama.cpp's grammar sampler allows
            (llama_sampler_init_grammar(vocab, grammar, "root") + llama_sampler_apply over all
            n_vocab candidates at logit 0); the walk stops at the first token it rejects.
            Sets are over the ids that are neither EOG nor control tokens (meta.excluded);
            "eog" says whether the vocab's EOS id is allowed. Each set is stored as its size
            "n", "h" = FNV-1a 64 over the sorted ids as little-endian int32 (16 hex digits),
            and the ids themselves when n <= 64.
    greedy  python3 scripts/make-grammar-refs.py greedy SCHEMA_BIN MODEL testdata/grammar
            writes greedy.jsonl: greedy generation under a grammar (sampler chain: grammar,
            then greedy; llama_sampler_sample), ChatML prompt written by hand and tokenized
            with parse_special=true and no BOS, at most 64 tokens, stopping after an EOG
            token (kept in "tokens"); per position the top-5 (id, logprob) of the raw logits
            (log-softmax before the grammar mask), as testdata/llamacpp/greedy.jsonl.
    all     both.
    time    python3 scripts/make-grammar-refs.py time SCHEMA_BIN MODEL testdata/grammar
            writes nothing: times llama_sampler_apply of the grammar sampler over all
            n_vocab candidates on every step of masks.jsonl's walks (the cost llmi's
            grammar_state_mask replaces; `kernel_bench grammar` times llmi's on the same
            walks), the first step of each walk apart from the rest (docs/PERF.md).

Each step also records "n_whole"/"h_whole" (the same over the ids whose text is whole UTF-8
on its own) and "split" (the allowed ids whose text is not), since llama.cpp and llmi judge
those differently under negated classes (docs/REFERENCES.md).
"""
import ctypes
import hashlib
import json
import math
import os
import subprocess
import sys

N_GEN = 64
TOP_K = 5
N_CTX = 1024  # as scripts/ref-llamacpp.py
N_THREADS = int(os.environ.get("REF_THREADS", "2"))
N_BATCH = 512
MAX_LISTED = 64  # steps with at most this many allowed ids list them

# Greedy generations: (case name in cases.json, user message).
GREEDY = [
    ("json-gbnf", "Describe a cat as a JSON object with its name, age and favourite food."),
    ("schema-person", "Make up a person named Alice who is 30 years old. Answer in JSON."),
    ("schema-enum-const", "What colour is a ripe banana? Answer in JSON."),
    ("schema-array-bounds", "Give me two numbers between 1 and 10 as a JSON array."),
    ("list-gbnf", "List three fruits."),
    ("choice-color", "What colour is a clear sky at noon?"),
    ("number", "What is 12 + 30?"),
    ("yes-no", "Is water wet? Answer yes or no."),
]

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK64 = (1 << 64) - 1


def fnv1a64(ids):
    """FNV-1a 64 over the ids, each as 4 bytes little-endian int32."""
    import numpy as np
    h = FNV_OFFSET
    for b in np.asarray(ids, dtype="<i4").tobytes():
        h = ((h ^ b) * FNV_PRIME) & MASK64
    return "%016x" % h


def llama_version():
    """'llama.cpp <commit>' of the vendored tree LLAMA_CPP_LIB_PATH was built from."""
    lib = os.environ.get("LLAMA_CPP_LIB_PATH", "")
    src = os.path.normpath(os.path.join(lib, "..", ".."))
    try:
        commit = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    import llama_cpp
    return f"llama.cpp {commit} (vendored by llama-cpp-python {llama_cpp.__version__}, CPU build)"


def command_line():
    env = " ".join(f"{k}={os.environ[k]}" for k in ("PYTHONPATH", "LLAMA_CPP_LIB_PATH", "REF_THREADS")
                   if k in os.environ)
    return (env + " " if env else "") + sys.executable + " " + " ".join(sys.argv)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_cases(outdir, schema_bin):
    """cases.json with each case's GBNF as llama.cpp uses it (schema cases converted)."""
    with open(os.path.join(outdir, "cases.json"), encoding="utf-8") as f:
        cases = json.load(f)
    names = set()
    for c in cases:
        assert c["name"] not in names, c["name"]
        names.add(c["name"])
        assert ("grammar" in c) != ("schema" in c), c["name"]
        if "schema" in c:
            r = subprocess.run([schema_bin, "-"], input=json.dumps(c["schema"]).encode(),
                               capture_output=True, check=True)
            c["gbnf"] = r.stdout.decode("utf-8")
            if r.stderr:
                print(f"{c['name']}: converter says: {r.stderr.decode().strip()}", file=sys.stderr)
        else:
            c["gbnf"] = c["grammar"]
    return cases


class Lib:
    """The ctypes bindings, the vocabulary and helpers around them."""

    def __init__(self, model_path, vocab_only=True):
        import numpy as np
        import llama_cpp
        import llama_cpp.llama_cpp as L
        llama_cpp._logger.set_verbose(False)  # errors (grammar parse errors) still print
        self.np, self.L = np, L
        L.llama_backend_init()
        p = L.llama_model_default_params()
        p.vocab_only = vocab_only
        p.use_extra_bufts = False
        self.model = L.llama_model_load_from_file(model_path.encode(), p)
        assert self.model, "model load failed"
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.eos = L.llama_vocab_eos(self.vocab)
        self.excluded = [t for t in range(self.n_vocab)
                         if L.llama_vocab_is_eog(self.vocab, t) or L.llama_vocab_is_control(self.vocab, t)]
        self.universe = np.ones(self.n_vocab, dtype=bool)
        self.universe[self.excluded] = False
        # Tokens whose text is not whole UTF-8 on its own (it ends inside a code point, or
        # starts with a continuation byte): llama.cpp and llmi judge these by different
        # rules under negated classes (docs/REFERENCES.md), so each step also records them
        # apart from the rest.
        self.split = np.zeros(self.n_vocab, dtype=bool)
        for t in range(self.n_vocab):
            try:
                self.piece(t).decode("utf-8")
            except UnicodeDecodeError:
                self.split[t] = True
        self.cand = np.zeros(self.n_vocab, dtype=[("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
        assert self.cand.itemsize == ctypes.sizeof(L.llama_token_data)

    def tokenize(self, text, parse_special):
        L = self.L
        b = text.encode("utf-8")
        buf = (L.llama_token * (len(b) + 16))()
        n = L.llama_tokenize(self.vocab, b, len(b), buf, len(buf), False, parse_special)
        assert n >= 0, n
        return list(buf[:n])

    def piece(self, t):
        buf = ctypes.create_string_buffer(256)
        n = self.L.llama_token_to_piece(self.vocab, t, buf, 256, 0, True)
        return buf.raw[:n]

    def grammar(self, gbnf):
        s = self.L.llama_sampler_init_grammar(self.vocab, gbnf.encode("utf-8"), b"root")
        assert s, "llama.cpp did not parse the grammar:\n" + gbnf
        return s

    def apply(self, smpl, logits=None):
        """llama_sampler_apply over all n_vocab candidates (logit 0, or the given row), in id
        order; returns the logits after it."""
        np, L = self.np, self.L
        c = self.cand
        c["id"] = np.arange(self.n_vocab, dtype=np.int32)
        c["logit"] = 0.0 if logits is None else logits
        c["p"] = 0.0
        arr = L.llama_token_data_array(data=c.ctypes.data_as(L.llama_token_data_p), size=self.n_vocab,
                                       selected=-1, sorted=False)
        L.llama_sampler_apply(smpl, ctypes.byref(arr))
        assert arr.size == self.n_vocab and ctypes.addressof(arr.data.contents) == c.ctypes.data
        assert (c["id"] == np.arange(self.n_vocab)).all()
        return c["logit"].copy(), arr.selected

    def step(self, smpl):
        """The recorded mask: allowed ids in the universe, and whether EOS is allowed."""
        np = self.np
        logit, _ = self.apply(smpl)
        ok = np.isfinite(logit)
        ids = np.nonzero(ok & self.universe)[0]
        rec = {"n": int(len(ids)), "h": fnv1a64(ids)}
        if len(ids) <= MAX_LISTED:
            rec["ids"] = [int(t) for t in ids]
        rec["eog"] = bool(ok[self.eos])
        whole = np.nonzero(ok & self.universe & ~self.split)[0]
        rec["n_whole"] = int(len(whole))
        rec["h_whole"] = fnv1a64(whole)
        rec["split"] = [int(t) for t in np.nonzero(ok & self.universe & self.split)[0]]
        return rec, ok


def masks(schema_bin, model_path, outdir):
    lib = Lib(model_path)
    L = lib.L
    cases = load_cases(outdir, schema_bin)
    meta = {"tool": llama_version(), "model": os.path.basename(model_path), "model_sha256": sha256(model_path),
            "n_vocab": lib.n_vocab, "eos": lib.eos, "excluded": lib.excluded,
            "excluded_rule": "ids with llama_vocab_is_eog or llama_vocab_is_control are left out of every "
                             "recorded set; eog says whether the EOS id was allowed",
            "command": command_line()}
    out_path = os.path.join(outdir, "masks.jsonl")
    with open(out_path, "w", encoding="utf-8") as out:
        out.write(json.dumps({"meta": meta}, ensure_ascii=False) + "\n")
        for c in cases:
            for ti, text in enumerate(c["texts"]):
                toks = lib.tokenize(text, parse_special=False)
                smpl = lib.grammar(c["gbnf"])
                steps, accepted = [], len(toks)
                for i in range(len(toks) + 1):
                    rec, ok = lib.step(smpl)
                    steps.append(rec)
                    if i == len(toks):
                        break
                    if not ok[toks[i]]:
                        accepted = i
                        break
                    L.llama_sampler_accept(smpl, toks[i])
                L.llama_sampler_free(smpl)
                line = {"name": c["name"], "text_index": ti, "grammar": c["gbnf"], "text": text,
                        "tokens": toks, "accepted": accepted, "steps": steps}
                out.write(json.dumps(line, ensure_ascii=False) + "\n")
                print(f"{c['name']}[{ti}]: {accepted}/{len(toks)} accepted, n = "
                      f"{[s['n'] for s in steps][:12]}{'...' if len(steps) > 12 else ''} "
                      f"eog at end {steps[-1]['eog']}", file=sys.stderr)
    print(f"wrote {out_path}", file=sys.stderr)


def chatml(user):
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def greedy(schema_bin, model_path, outdir):
    import numpy as np
    import llama_cpp
    import llama_cpp.llama_cpp as L
    from llama_cpp import Llama

    # No extra buffer types (weight repacking, AMX), as scripts/ref-llamacpp.py.
    default_params = L.llama_model_default_params

    def model_params():
        p = default_params()
        p.use_extra_bufts = False
        return p
    L.llama_model_default_params = model_params

    cases = {c["name"]: c for c in load_cases(outdir, schema_bin)}
    llm = Llama(model_path=model_path, n_ctx=N_CTX, n_threads=N_THREADS, n_threads_batch=N_THREADS,
                n_batch=N_BATCH, n_ubatch=N_BATCH, logits_all=False, verbose=False, seed=0)
    llama_cpp._logger.set_verbose(False)
    lib = Lib(model_path)  # a vocab-only copy for the mask check
    vocab = L.llama_model_get_vocab(llm._model.model)
    n_vocab = llm.n_vocab()
    out_path = os.path.join(outdir, "greedy.jsonl")
    with open(out_path, "w", encoding="utf-8") as out:
        for gi, (name, user) in enumerate(GREEDY):
            gbnf = cases[name]["gbnf"]
            prompt = chatml(user)
            ids = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
            chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
            g = L.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"), b"root")
            assert g, name
            L.llama_sampler_chain_add(chain, g)
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
            check = lib.grammar(gbnf)  # a second grammar sampler, fed the same tokens
            llm.reset()
            llm.eval(ids)
            tokens, top5, lps, mask_n = [], [], [], []
            eog = False
            for _ in range(N_GEN):
                row = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,)).astype(np.float64)
                m = row.max()
                lp = row - (m + math.log(np.exp(row - m).sum()))
                order = np.argsort(-row, kind="stable")[:TOP_K]
                masked, _ = lib.apply(check, row.astype(np.float32))
                ok = np.isfinite(masked)
                tok = int(L.llama_sampler_sample(chain, llm._ctx.ctx, -1))
                # llama_sampler_sample = the chain's apply (grammar, then greedy) + accept:
                # the token must be the first maximum of the grammar-masked logits.
                assert tok == int(np.argmax(np.where(ok, row, -np.inf))), (name, len(tokens), tok)
                L.llama_sampler_accept(check, tok)
                tokens.append(tok)
                lps.append(float(lp[tok]))
                top5.append([[int(t), round(float(lp[t]), 6)] for t in order])
                mask_n.append(int((ok & lib.universe).sum()))
                if L.llama_vocab_is_eog(vocab, tok):
                    eog = True
                    break
                llm.eval([tok])
            L.llama_sampler_free(chain)
            L.llama_sampler_free(check)
            text = llm.detokenize(tokens).decode("utf-8", errors="replace")
            rec = {"index": gi, "name": name, "grammar": gbnf, "user": user, "prompt": prompt,
                   "prompt_ids": ids, "tokens": tokens, "text": text, "eog": eog,
                   "logprobs": [round(x, 6) for x in lps], "top5": top5, "mask_n": mask_n}
            out.write(json.dumps(rec, ensure_ascii=False) + "\n")
            print(f"[{gi}] {name}: {len(ids)} prompt tokens -> {len(tokens)} tokens {text!r} eog={eog}",
                  file=sys.stderr)
    print(f"wrote {out_path}", file=sys.stderr)


def timing(model_path, outdir):
    import time
    lib = Lib(model_path)
    L, np = lib.L, lib.np
    first, rest, worst = [], [], 0.0
    for line in open(os.path.join(outdir, "masks.jsonl"), encoding="utf-8"):
        r = json.loads(line)
        if "meta" in r:
            continue
        smpl = lib.grammar(r["grammar"])
        c = lib.cand
        for i in range(r["accepted"] + 1):
            c["id"] = np.arange(lib.n_vocab, dtype=np.int32)
            c["logit"] = 0.0
            arr = L.llama_token_data_array(data=c.ctypes.data_as(L.llama_token_data_p), size=lib.n_vocab,
                                           selected=-1, sorted=False)
            t0 = time.thread_time()
            L.llama_sampler_apply(smpl, ctypes.byref(arr))
            dt = time.thread_time() - t0
            (first if i == 0 else rest).append(dt)
            worst = max(worst, dt)
            if i == r["accepted"]:
                break
            L.llama_sampler_accept(smpl, r["tokens"][i])
        L.llama_sampler_free(smpl)
    print(f"llama.cpp grammar | vocab {lib.n_vocab} | first mask of a walk {1e3 * sum(first) / len(first):.3f} ms "
          f"({len(first)}) | later masks {1e3 * sum(rest) / len(rest):.3f} ms ({len(rest)}) | worst {1e3 * worst:.2f} ms")


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "time":
        return timing(sys.argv[3], sys.argv[4])
    if len(sys.argv) != 5 or sys.argv[1] not in ("masks", "greedy", "all"):
        sys.exit(__doc__)
    what, schema_bin, model, outdir = sys.argv[1:]
    if what in ("masks", "all"):
        masks(schema_bin, model, outdir)
    if what in ("greedy", "all"):
        greedy(schema_bin, model, outdir)


if __name__ == "__main__":
    main()
