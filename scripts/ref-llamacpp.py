#!/usr/bin/env python3
"""Makes llama.cpp's greedy reference for llmi's end-to-end tests (testdata/llamacpp/).

Not run by CI: CI compares llmi against the files this wrote (tests/compare_topk.py).
Needs the llama-cpp-python 0.3.36 sdist's python sources on PYTHONPATH, numpy, and
LLAMA_CPP_LIB_PATH pointing at a build of its vendored llama.cpp (libllama.so); see
docs/REFERENCES.md for the exact command.

For every prompt (plain text, no chat template) it records the prompt ids as llama.cpp
tokenizes them (add_special=True: BOS only if the GGUF says add_bos_token, which
SmolLM2 does not; parse_special=False), then 64 greedy tokens, ignoring EOS, and at
each generated position the top-5 (id, logprob) of llama.cpp's logits.

    greedy   python3 scripts/ref-llamacpp.py greedy MODEL testdata/llamacpp
    ppl      python3 scripts/ref-llamacpp.py ppl LLAMA_PERPLEXITY MODEL WIKI_TEST_RAW CHUNKS testdata/llamacpp [LOG]
             runs llama-perplexity -nr -c 512 -t 2 --chunks CHUNKS (or parses its saved output
             LOG) and writes ppl.json
    ppl-lora python3 scripts/ref-llamacpp.py ppl-lora LLAMA_PERPLEXITY MODEL WIKI_TEST_RAW CHUNKS OUT.json ADAPTER.gguf [SCALE]
             the same with llama.cpp applying a GGUF LoRA adapter at run time (--lora ADAPTER, or
             --lora-scaled ADAPTER:SCALE), written to OUT.json with "llmi_flags", llmi's flags
             for the same adapter (ADAPTER as given: give it relative to the repository)
    greedy-cvec python3 scripts/ref-llamacpp.py greedy-cvec MODEL OUTDIR START END FILE:SCALE...
             greedy with control vectors applied by llama.cpp (llama_set_adapter_cvec, layers
             START..END; the files read with llama.cpp's gguf-py, summed as common_control_vector_load
             does); also writes OUTDIR/cvec.json with llmi's flags for the same vectors
    ppl-flags python3 scripts/ref-llamacpp.py ppl-flags LLAMA_PERPLEXITY MODEL WIKI_TEST_RAW CHUNKS OUT.json FLAG...
             ppl with extra llama-perplexity flags that llmi spells the same (--rope-*, --yarn-*, --control-vector-scaled
             FILE:S, --control-vector-layer-range A B), recorded as "llmi_flags"
"""
import json
import math
import os
import sys

N_GEN = 64
TOP_K = 5
N_CTX = 1024
N_THREADS = int(os.environ.get("REF_THREADS", "2"))  # results do not depend on it (checked)
N_BATCH = 512

SHAKESPEARE = """First Citizen:
Before we proceed any further, hear me speak.

All:
Speak, speak.

First Citizen:
You are all resolved rather to die than to famish?

All:
Resolved. resolved.

First Citizen:
First, you know Caius Marcius is chief enemy to the people.

All:
We know't, we know't.

First Citizen:
Let us kill him, and we'll have corn at our own price.
Is't a verdict?

All:
No more talking on't; let it be done: away, away!

Second Citizen:
One word, good citizens.

First Citizen:
We are accounted poor citizens, the patricians good.
What authority surfeits on would relieve us: if they
would yield us but the superfluity, while it were
wholesome, we might guess they relieved us humanely;
but they think we are too dear: the leanness that
afflicts us, the object of our misery, is as an
inventory to particularise their abundance; our
sufferance is a gain to them Let us revenge this with
our pikes, ere we become rakes: for the gods know I
speak this in hunger for bread, not in thirst for revenge.

Second Citizen:
"""

CODE = '''def fibonacci(n):
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def is_prime(n):
    if n < 2:
        return False
    for d in range(2, int(n ** 0.5) + 1):
        if n % d == 0:
            return False
    return True


def main():
'''

C_CODE = """#include <stdio.h>

/* Sums the elements of an array. */
static long sum(const int *a, int n) {
    long s = 0;
    for (int i = 0; i < n; i++)
"""

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village near the mountains, there lived",
    "1, 2, 3, 4, 5, 6,",
    "The year 1969 was important because",
    "Q: What is 12 + 30?\nA:",
    "Water boils at 100 degrees Celsius and freezes at",
    "def add(a, b):\n    return",
    CODE,
    C_CODE,
    "La capitale de l'Allemagne est",
    "Der schnelle braune Fuchs springt über den faulen Hund, und dann",
    "El sol sale por el este y se pone por el",
    "東京は日本の首都で、",
    "Москва — столица России, а",
    "Photosynthesis is the process by which plants",
    "The three primary colors are red, blue and",
    "import numpy as np\nx = np.arange(10)\nprint(",
    "<html>\n<head>\n<title>My page</title>\n</head>\n<body>\n",
    "Ingredients: 2 cups flour, 1 cup sugar, 3 eggs.\nStep 1:",
    "In 2023, the population of the city grew by 4.5% to 1,234,567 people, while",
    "Dear Sir or Madam,\n\nI am writing to",
    "Hello",
    SHAKESPEARE,
    "The quick brown fox jumps over the lazy dog. " * 6 + "The end of the story is that",
]


def cvec_data(files, n_embd, n_layer):
    """llama.cpp common_control_vector_load's buffer: (n_layer - 1) rows of n_embd, row N-1
    the sum over files of scale x direction.N (read with llama.cpp's gguf-py)."""
    import numpy as np
    from gguf import GGUFReader
    data = np.zeros(((n_layer - 1), n_embd), dtype=np.float32)
    for path, scale in files:
        for t in GGUFReader(path).tensors:
            kind, layer = t.name.split(".")
            assert kind == "direction" and 1 <= int(layer) < n_layer and t.data.shape == (n_embd,), t.name
            data[int(layer) - 1] += np.asarray(t.data, dtype=np.float32) * np.float32(scale)
    return data


def greedy(model_path, outdir, cvec=None):
    import numpy as np
    import llama_cpp.llama_cpp as llama_capi
    from llama_cpp import Llama

    # No extra buffer types (weight repacking, AMX): the AMX path dies with SIGILL/SIGSEGV
    # on VMs that advertise AMX without granting it, and the plain ggml CPU kernels are the
    # ones llama-perplexity -nr uses for ppl.json too.
    default_params = llama_capi.llama_model_default_params

    def model_params():
        p = default_params()
        p.use_extra_bufts = False
        return p
    llama_capi.llama_model_default_params = model_params

    llm = Llama(model_path=model_path, n_ctx=N_CTX, n_threads=N_THREADS, n_threads_batch=N_THREADS,
                n_batch=N_BATCH, n_ubatch=N_BATCH, logits_all=False, verbose=False, seed=0)
    n_vocab = llm.n_vocab()
    if cvec:
        # llama.cpp adds the vector inside its graph (llama_adapter_cvec::apply_to after each
        # layer's residual add); the buffer is common_control_vector_load's
        n_embd, n_layer = llm.n_embd(), llama_capi.llama_model_n_layer(llm.model)
        data = cvec_data(cvec["files"], n_embd, n_layer)
        flat = np.ascontiguousarray(data.reshape(-1))
        import ctypes
        rc = llama_capi.llama_set_adapter_cvec(llm.ctx, flat.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                               flat.size, n_embd, cvec["start"], cvec["end"])
        assert rc == 0, rc
    os.makedirs(outdir, exist_ok=True)
    out_path = os.path.join(outdir, "greedy.jsonl")
    prompts_path = os.path.join(outdir, "prompts.jsonl")
    with open(out_path, "w", encoding="utf-8") as out, open(prompts_path, "w", encoding="utf-8") as pf:
        # REF_LIMIT=k: only the first k prompts (to re-check a few, e.g. with other threads).
        for i, prompt in enumerate(PROMPTS[:int(os.environ.get("REF_LIMIT", len(PROMPTS)))]):
            ids = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=False)
            llm.reset()
            llm.eval(ids)
            tokens, top5, lps = [], [], []
            for _ in range(N_GEN):
                # Llama.eval keeps no logits unless logits_all: read the last row directly.
                row = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,)).astype(np.float64)
                m = row.max()
                lse = m + math.log(np.exp(row - m).sum())
                lp = row - lse
                order = np.argsort(-row, kind="stable")[:TOP_K]
                tok = int(order[0])  # argmax, lowest id on ties
                tokens.append(tok)
                lps.append(float(lp[tok]))
                top5.append([[int(t), round(float(lp[t]), 6)] for t in order])
                llm.eval([tok])
            text = llm.detokenize(tokens).decode("utf-8", errors="replace")
            rec = {"index": i, "prompt": prompt, "prompt_ids": ids, "tokens": tokens, "text": text,
                   "logprobs": [round(x, 6) for x in lps], "top5": top5}
            out.write(json.dumps(rec, ensure_ascii=False) + "\n")
            pf.write(json.dumps({"prompt": prompt}, ensure_ascii=False) + "\n")
            print(f"[{i}] {len(ids)} prompt tokens -> {text[:60]!r}", file=sys.stderr)
    print(f"wrote {out_path} and {prompts_path}", file=sys.stderr)


PPL_CTX = 512

PPL_RULE = (
    "llama.cpp tools/perplexity/perplexity.cpp perplexity(): the whole file is read (one trailing "
    "newline dropped) and tokenized once with add_special=true, parse_special=false (BOS at the "
    "very start only if the model's add_bos_token is true; SmolLM2's is false, so no BOS). "
    "Window i is tokens [i*ctx, (i+1)*ctx) of that stream, run from an empty KV cache at positions "
    "0..ctx-1; if add_bos, its first token is replaced by BOS (not with SmolLM2). Only the second "
    "half is scored: the logits at positions j = ctx/2 .. ctx-2 predict token j+1, so ctx/2 - 1 = "
    "255 tokens per window, nll = -log_softmax(logits_j)[token_{j+1}] in double. chunks = "
    "min(--chunks, n_tokens / ctx). PPL = exp(mean nll) over all scored tokens; the +/- is "
    "PPL * sqrt((mean(nll^2) - mean(nll)^2) / (count - 1)). The running value printed after "
    "window i is exp(mean nll) over windows 1..i.")


def ppl(binary, model, data, chunks, outdir, log=None, extra=(), out_path=None, llmi_flags=None):
    import re
    import subprocess
    import time

    cmd = [binary, "-nr", "-m", model, "-f", data, "-c", str(PPL_CTX), "-t", "2", "--chunks", str(chunks), *extra]
    seconds = None
    if log:
        text = open(log, encoding="utf-8", errors="replace").read()
    else:
        t0 = time.time()
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        text = done.stderr + done.stdout   # this llama.cpp prints the running values to stdout
        seconds = round(time.time() - t0, 1)
    running = [float(x) for x in re.findall(r"\[(?:\d+)\]([0-9.]+),", text)]
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", text)
    n = re.search(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+)", text)
    tok = re.search(r"tokenizes to only|tokenization took", text)
    assert m and n and tok and len(running) == chunks == int(n.group(1)), (m, n, running)
    out = {"model": os.path.basename(model), "data": "wikitext-2-raw/wiki.test.raw", "ctx": PPL_CTX,
           "chunks": chunks, "ppl": float(m.group(1)), "ppl_stderr": float(m.group(2)),
           "running_ppl": running, "scored_tokens": chunks * (PPL_CTX // 2 - 1), "add_bos": False,
           "scoring": PPL_RULE, "command": " ".join(["llama-perplexity"] + cmd[1:]),
           "llama_cpp_commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f"}
    if seconds is not None:
        out["llama_cpp_seconds"] = seconds
    if llmi_flags:
        out["llmi_flags"] = llmi_flags
    os.makedirs(outdir, exist_ok=True)
    with open(out_path or os.path.join(outdir, "ppl.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(json.dumps({k: out[k] for k in ("chunks", "ppl", "ppl_stderr", "running_ppl")}), file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "greedy":
        greedy(sys.argv[2], sys.argv[3])
    elif len(sys.argv) in (7, 8) and sys.argv[1] == "ppl":
        ppl(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6],
            sys.argv[7] if len(sys.argv) == 8 else None)
    elif len(sys.argv) >= 7 and sys.argv[1] == "greedy-cvec":
        # greedy-cvec MODEL OUTDIR START END FILE:SCALE... (START/END as llama.cpp's
        # --control-vector-layer-range after its defaults: 1 and n_layer)
        files = [(a.rsplit(":", 1)[0], float(a.rsplit(":", 1)[1])) for a in sys.argv[6:]]
        start, end = int(sys.argv[4]), int(sys.argv[5])
        greedy(sys.argv[2], sys.argv[3], {"files": files, "start": start, "end": end})
        flags = ["--control-vector-scaled", ",".join(f"{p}:{sc:g}" for p, sc in files),
                 "--control-vector-layer-range", str(start), str(end)]
        with open(os.path.join(sys.argv[3], "cvec.json"), "w", encoding="utf-8") as f:
            json.dump({"llmi_flags": flags, "llama_cpp": "llama_set_adapter_cvec(ctx, buffer of "
                       "common_control_vector_load, n_embd, START, END)"}, f, indent=1)
            f.write("\n")
    elif len(sys.argv) >= 8 and sys.argv[1] == "ppl-flags":
        # ppl-flags LLAMA_PERPLEXITY MODEL WIKI CHUNKS OUT.json FLAG...: llama.cpp's flags,
        # spelled the same for llmi (the control vector flags)
        ppl(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), os.path.dirname(sys.argv[6]) or ".",
            extra=sys.argv[7:], out_path=sys.argv[6], llmi_flags=sys.argv[7:])
    elif len(sys.argv) in (8, 9) and sys.argv[1] == "ppl-lora":
        adapter, out_json = sys.argv[7], sys.argv[6]
        if len(sys.argv) == 9:
            extra, flags = ["--lora-scaled", f"{adapter}:{sys.argv[8]}"], ["--lora-scaled", adapter, sys.argv[8]]
        else:
            extra, flags = ["--lora", adapter], ["--lora", adapter]
        ppl(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), os.path.dirname(out_json) or ".",
            extra=extra, out_path=out_json, llmi_flags=flags)
    else:
        sys.exit(__doc__)
