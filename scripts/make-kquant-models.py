#!/usr/bin/env python3
"""Writes testdata/hf/qwen3-kq.{Q4_K_M,Q5_K_M,Q3_K_M,IQ4_XS,IQ4_NL,Q2_K}.gguf, tiny Qwen3 models in
llama.cpp's k-quant and IQ4 mixes, and the logits transformers computes from those very files
(testdata/hf/ref/qwen3-kq.Q*_K_M.*), for tests/test_hf_models.c.

Not run by CI: run once by hand, commit the output, record it in docs/REFERENCES.md.

    python3 scripts/make-kquant-models.py LLAMA_CPP_DIR LLAMA_QUANTIZE testdata/hf [MIXES]

MIXES: comma-separated llama-quantize types (default Q4_K_M,Q5_K_M,Q3_K_M,IQ4_XS,IQ4_NL,Q2_K); the checkpoint
is the same whichever are made, so one mix can be added without remaking the others.

LLAMA_CPP_DIR: vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist; LLAMA_QUANTIZE: its
llama-quantize, built from that tree.  Needs torch, transformers, safetensors, gguf,
sentencepiece (PyPI).

1. A random Qwen3 checkpoint whose every linear input width is a multiple of 256 (k-quant
   super-blocks; llama-quantize falls back to other types elsewhere): hidden 256, 4 heads
   of 128 (Qwen3's head size), 2 KV heads, intermediate 512, 2 layers, vocab 320
   (testdata/hf's tokenizer),
   untied; transformers' random init (seed 1234, initializer_range 0.1) with every RMSNorm
   weight 1 + 0.2 N(0,1); float32.
2. llama.cpp's convert_hf_to_gguf.py (scripts/hf-to-gguf.py) -> F32 GGUF.
3. llama-quantize F32 -> Q4_K_M, Q5_K_M, Q3_K_M, IQ4_XS, IQ4_NL, Q2_K (its mixes: Q4_K /
   Q5_K / Q3_K / IQ4_XS / IQ4_NL / Q2_K with Q6_K for the output matrix, and in the K mixes
   some attn_v / ffn_down a wider type; no importance matrix).
4. Reference: transformers loads each quantized GGUF itself (gguf_file=..., gguf-py's
   dequantization, float32, eager attention; the config given, see below) and computes the logits at every position of
   the three sequences of testdata/hf/ref/qwen3-qknorm.json.  llmi must match them up to
   its int8 activations (llama.cpp's own CPU path quantizes activations too).
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import torch
import transformers
from transformers import AutoModelForCausalLM, Qwen3Config

SEED = 1234
HERE = os.path.dirname(os.path.abspath(__file__))


def main(llama_cpp, quantize, outdir, mixes="Q4_K_M,Q5_K_M,Q3_K_M,IQ4_XS,IQ4_NL,Q2_K"):
    refdir = os.path.join(outdir, "ref")
    with open(os.path.join(refdir, "qwen3-qknorm.json"), encoding="utf-8") as f:
        seqs = [s["ids"] for s in json.load(f)["seqs"]]
    tmp = tempfile.mkdtemp(prefix="kq-")
    hf = os.path.join(tmp, "qwen3-kq")
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    cfg = Qwen3Config(vocab_size=320, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                      max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=1000000.0,
                      tie_word_embeddings=False, use_sliding_window=False, bos_token_id=0,
                      eos_token_id=0, initializer_range=0.1)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(hf, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(outdir, "qwen3-qknorm", f), hf)
    f32 = os.path.join(tmp, "qwen3-kq.F32.gguf")
    subprocess.run([sys.executable, os.path.join(HERE, "hf-to-gguf.py"), llama_cpp, hf, "--outtype", "f32",
                    "--outfile", f32], check=True, stdout=subprocess.DEVNULL)
    for mix in mixes.split(","):
        name = f"qwen3-kq.{mix}"
        out = os.path.join(outdir, name + ".gguf")
        subprocess.run([quantize, f32, out, mix, "1"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        # the checkpoint's own config: transformers' GGUF reader leaves qwen3's head_dim at
        # Qwen3Config's default (it maps no key to it); the tensors are the file's
        ref = AutoModelForCausalLM.from_pretrained(outdir, gguf_file=name + ".gguf", config=cfg, dtype=torch.float32,
                                                   attn_implementation="eager").eval()
        meta = {"model": name, "n_vocab": 320, "weights_dtype": mix, "transformers": transformers.__version__,
                "torch": torch.__version__, "seqs": []}
        for k, ids in enumerate(seqs):
            with torch.no_grad():
                logits = ref(torch.tensor([ids])).logits[0].to(torch.float32).contiguous()
            fname = f"{name}.s{k}.f32"
            flat = logits.reshape(-1).tolist()
            with open(os.path.join(refdir, fname), "wb") as f:
                f.write(struct.pack(f"<{len(flat)}f", *flat))
            meta["seqs"].append({"ids": ids, "n_tokens": len(ids), "file": fname,
                                 "max_abs": float(logits.abs().max()), "std": float(logits.std())})
        with open(os.path.join(refdir, name + ".json"), "w", encoding="utf-8") as f:
            json.dump(meta, f)
            f.write("\n")
        print(f"{name}: {os.path.getsize(out)} bytes", file=sys.stderr)
    shutil.rmtree(tmp)


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    main(*sys.argv[1:])
