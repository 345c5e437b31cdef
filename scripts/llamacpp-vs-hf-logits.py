#!/usr/bin/env python3
"""Runs a GGUF through llama.cpp (libllama of the llama-cpp-python 0.3.36 sdist, through its
ctypes bindings) on the token sequences of a transformers reference (testdata/hf/ref/<name>.json)
and prints, per sequence, max |logit diff| against the reference logits (<name>.s<k>.f32),
the normalized squared error and how many rows have the same argmax.  A diagnostic: it writes
nothing and no test runs it; docs/REFERENCES.md quotes its output.

    PYTHONPATH=.../llama_cpp_python-0.3.36 LLAMA_CPP_LIB_PATH=.../vendor/llama.cpp/build/bin \
      python3 scripts/llamacpp-vs-hf-logits.py MODEL.gguf NAME testdata/hf/ref [--kv-f32]

--kv-f32 keeps llama.cpp's KV cache in F32 (its default is F16, which alone moves the logits
of the tiny test models by ~1e-3).  One context per sequence (n_ctx 256, logits at every
position, 2 threads).  Needs numpy.
"""
import json
import os
import sys
import types

import numpy as np

try:
    import diskcache  # noqa: F401  (llama_cpp.llama_cache imports it; nothing here uses a cache)
except ImportError:
    sys.modules["diskcache"] = types.SimpleNamespace(Cache=None)
from llama_cpp import Llama  # noqa: E402

GGML_TYPE_F32 = 0


def main(gguf, name, refdir, kv_f32):
    with open(os.path.join(refdir, name + ".json"), encoding="utf-8") as f:
        meta = json.load(f)
    n_vocab = meta["n_vocab"]
    kv = {"type_k": GGML_TYPE_F32, "type_v": GGML_TYPE_F32} if kv_f32 else {}
    worst = 0.0
    for k, s in enumerate(meta["seqs"]):
        ids, n = s["ids"], s["n_tokens"]
        ref = np.fromfile(os.path.join(refdir, s["file"]), dtype="<f4").reshape(n, n_vocab)
        llm = Llama(model_path=gguf, n_ctx=256, n_batch=256, n_ubatch=256, logits_all=True, n_threads=2,
                    verbose=False, seed=0, **kv)
        llm.eval(ids)
        got = np.array(llm.scores[:n], dtype=np.float32)
        del llm
        d = np.abs(got - ref)
        same = got.argmax(1) == ref.argmax(1)
        top2 = np.sort(ref, 1)[:, -2:]
        nmse = float(((got - ref) ** 2).sum() / (ref ** 2).sum())
        note = "" if same.all() else f" (the reference's top-2 gap on the others: {top2[~same, 1] - top2[~same, 0]})"
        print(f"{name} s{k} n={n}: max|diff| {d.max():.3e}, mean|diff| {d.mean():.2e}, nmse {nmse:.2e}, "
              f"argmax equal {int(same.sum())}/{n}{note}")
        worst = max(worst, float(d.max()))
    print(f"{name}: max|diff| {worst:.3e}")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--kv-f32"]
    if len(args) != 3:
        sys.exit(__doc__)
    main(args[0], args[1], args[2], "--kv-f32" in sys.argv)
