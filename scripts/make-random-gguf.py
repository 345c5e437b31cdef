#!/usr/bin/env python3
"""Writes a GGUF of random weights in the TinyLlama-1.1B shape, for speed comparisons
between llmi and llama.cpp on a model where reading the weights, not per-op overhead,
dominates decode.  Nothing here is a trained model: outputs are noise, only speed means
anything.

  scripts/make-random-gguf.py --type q4_0|f16 [--out FILE] [--seed N] [--layers N]
                              [--moe EXPERTS,K [--ffn N]] [--tokenizer-from GGUF]

Shape (TinyLlama-1.1B-Chat-v1.0's config.json): hidden 2048, 22 layers, 32 heads,
4 KV heads (head_dim 64), FFN 5632, RoPE base 10000, RMS eps 1e-5, context 2048, an
untied output matrix.  The one difference: the vocabulary is SmolLM2's (49152 tokens,
not 32000), because the tokenizer metadata (tokenizer.*: GPT-2 BPE, pre "smollm", merges,
special ids, chat template) is copied from the SmolLM2-135M-Instruct GGUF
(scripts/fetch-model.sh), which both llmi and llama.cpp load; token_embd and output are
sized to it.  1.17 B parameters: ~2.35 GB as F16, ~0.66 GB as Q4_0.

--moe E,K makes it a Mixtral-style mixture of experts (llama.cpp's llama architecture with
llama.expert_count E and llama.expert_used_count K): each layer's MLP becomes E experts of
--ffn (default 5632) stacked in blk.N.ffn_{gate,up,down}_exps, with an F32 router
blk.N.ffn_gate_inp N(0, 0.02) (llama-quantize keeps routers unquantized too).

Weights: every matrix N(0, 0.02) (the initializer_range of Llama configs), norms all
1.0 (F32), drawn from numpy's PCG64 seeded with --seed in a fixed tensor order, so the
same seed gives the same floats whatever --type: the Q4_0 and F16 files are two encodings
of one model.  --type q4_0 encodes every matrix, token_embd and output included, as Q4_0
with the gguf package's reference quantizer (gguf.quants, a numpy port of llama.cpp's
quantize_row_q4_0_ref: per 32 weights d = max-magnitude / -8, 4-bit codes + 8); this is
llama-quantize's --pure Q4_0.  --type f16 rounds every matrix to F16.

Needs numpy and gguf (PyPI; tested with gguf 0.19.0, numpy 2.4).  Streams one tensor at a
time, so memory stays at the largest tensor (~0.4 GB as float32) plus the reader.
"""
import argparse
import os
import subprocess
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT

SHAPE = dict(dim=2048, n_layers=22, n_heads=32, n_kv_heads=4, ffn=5632, ctx=2048,
             rope_base=10000.0, rms_eps=1e-5)
STD = 0.02


def tensor_list(n_layers, vocab, s, moe=None):
    """(name, numpy shape (rows = outputs, cols = inputs; (experts, rows, cols) stacked) or
    (dim,), kind: "norm", "router" (F32) or "matrix") in file order."""
    hd = s["dim"] // s["n_heads"]
    out = [("token_embd.weight", (vocab, s["dim"]), False)]
    for i in range(n_layers):
        p = f"blk.{i}."
        out += [(p + "attn_norm.weight", (s["dim"],), True),
                (p + "attn_q.weight", (s["n_heads"] * hd, s["dim"]), False),
                (p + "attn_k.weight", (s["n_kv_heads"] * hd, s["dim"]), False),
                (p + "attn_v.weight", (s["n_kv_heads"] * hd, s["dim"]), False),
                (p + "attn_output.weight", (s["dim"], s["n_heads"] * hd), False),
                (p + "ffn_norm.weight", (s["dim"],), True)]
        if moe:
            e = moe[0]
            out += [(p + "ffn_gate_inp.weight", (e, s["dim"]), "router"),
                    (p + "ffn_gate_exps.weight", (e, s["ffn"], s["dim"]), False),
                    (p + "ffn_up_exps.weight", (e, s["ffn"], s["dim"]), False),
                    (p + "ffn_down_exps.weight", (e, s["dim"], s["ffn"]), False)]
        else:
            out += [(p + "ffn_gate.weight", (s["ffn"], s["dim"]), False),
                    (p + "ffn_up.weight", (s["ffn"], s["dim"]), False),
                    (p + "ffn_down.weight", (s["dim"], s["ffn"]), False)]
    out += [("output_norm.weight", (s["dim"],), True), ("output.weight", (vocab, s["dim"]), False)]
    return out


def encode(rng, shape, is_norm, qtype):
    """The tensor's bytes as the writer takes them (float array, or uint8 blocks for Q4_0)."""
    if is_norm is True:
        return np.ones(shape, dtype=np.float32)
    w = rng.standard_normal(shape, dtype=np.float32)
    w *= STD
    if is_norm == "router":
        return w
    if qtype == QT.F16:
        return w.astype(np.float16)
    return gguf.quants.quantize(w, QT.Q4_0)


def copy_tokenizer(reader, writer):
    n = 0
    for key, f in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, f.contents(), vt, sub_type=f.types[1])
        else:
            writer.add_key_value(key, f.contents(), vt)
        n += 1
    if n == 0:
        raise SystemExit("make-random-gguf.py: no tokenizer.* keys in the --tokenizer-from file")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    return len(tokens.data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--type", choices=["q4_0", "f16"], required=True)
    ap.add_argument("--out", help="output file (default random-tinyllama-1.1b-<type>.gguf)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--layers", type=int, default=SHAPE["n_layers"],
                    help="fewer layers for a quick file (default 22)")
    ap.add_argument("--moe", help="EXPERTS,K: a Mixtral-style mixture of EXPERTS experts, K per token")
    ap.add_argument("--ffn", type=int, help="the MLP's (each expert's) width (default 5632)")
    ap.add_argument("--tokenizer-from", help="GGUF whose tokenizer.* keys are copied "
                    "(default: SmolLM2-135M-Instruct, scripts/fetch-model.sh --path)")
    a = ap.parse_args()
    if a.layers < 1 or a.layers > 256:
        raise SystemExit("make-random-gguf.py: --layers must be in 1..256")
    moe = None
    if a.moe:
        try:
            moe = tuple(int(x) for x in a.moe.split(","))
        except ValueError:
            moe = ()
        if len(moe) != 2 or not 1 <= moe[1] <= moe[0] <= 256:
            raise SystemExit("make-random-gguf.py: --moe must be EXPERTS,K with 1 <= K <= EXPERTS <= 256")
    if a.ffn is not None and (a.ffn < 32 or a.ffn % 32):
        raise SystemExit("make-random-gguf.py: --ffn must be a positive multiple of 32")
    qtype = QT.Q4_0 if a.type == "q4_0" else QT.F16
    here = os.path.dirname(os.path.abspath(__file__))
    tok_path = a.tokenizer_from or subprocess.run([os.path.join(here, "fetch-model.sh"), "--path"],
                                                  check=True, capture_output=True, text=True).stdout.strip()
    s = dict(SHAPE, ffn=a.ffn or SHAPE["ffn"])
    shape_name = f"tinyllama-{moe[0]}x{moe[1]}-moe" if moe else "tinyllama-1.1b"
    out = a.out or f"random-{shape_name}-{a.type}.gguf"
    hd = s["dim"] // s["n_heads"]

    reader = gguf.GGUFReader(tok_path)
    tmp = out + ".part"
    w = gguf.GGUFWriter(tmp, "llama")
    moe_text = f", {moe[0]} experts of {s['ffn']}, {moe[1]} per token" if moe else ""
    w.add_name(f"random TinyLlama-1.1B shape ({a.layers} layers{moe_text}, SmolLM2 vocab) seed {a.seed}")
    w.add_description(f"llmi scripts/make-random-gguf.py --type {a.type} --seed {a.seed} --layers {a.layers}"
                      f"{' --moe ' + a.moe if moe else ''}{' --ffn ' + str(a.ffn) if a.ffn else ''}: "
                      f"N(0,{STD}) matrices, norms 1; tokenizer from {os.path.basename(tok_path)}. "
                      "Random weights for speed tests only.")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0 if qtype == QT.Q4_0 else gguf.LlamaFileType.MOSTLY_F16)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["dim"])
    w.add_block_count(a.layers)
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["n_heads"])
    w.add_head_count_kv(s["n_kv_heads"])
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(s["rope_base"])
    w.add_layer_norm_rms_eps(s["rms_eps"])
    if moe:
        w.add_expert_count(moe[0])
        w.add_expert_used_count(moe[1])
    vocab = copy_tokenizer(reader, w)
    w.add_vocab_size(vocab)

    tensors = tensor_list(a.layers, vocab, s, moe)
    for name, shape, is_norm in tensors:
        if is_norm:
            w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
        elif qtype == QT.F16:
            w.add_tensor_info(name, shape, np.dtype(np.float16), 2 * int(np.prod(shape)))
        else:
            bshape = gguf.quant_shape_to_byte_shape(shape, QT.Q4_0)
            w.add_tensor_info(name, bshape, np.dtype(np.uint8), int(np.prod(bshape)), raw_dtype=QT.Q4_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.Generator(np.random.PCG64(a.seed))
    try:
        for i, (name, shape, is_norm) in enumerate(tensors):
            w.write_tensor_data(encode(rng, shape, is_norm, qtype))
            print(f"\r{i + 1}/{len(tensors)} {name}" + " " * 20, end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        w.close()
    except BaseException:
        os.unlink(tmp)  # no half-written model left behind
        raise
    os.replace(tmp, out)
    print(f"wrote {out} ({os.path.getsize(out) / 1e9:.2f} GB, {a.type}, vocab {vocab}, seed {a.seed})")


if __name__ == "__main__":
    main()
