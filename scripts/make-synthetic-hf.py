#!/usr/bin/env python3
"""make-synthetic-hf.py — a real-shape Hugging Face directory of synthetic bf16 weights, to
measure `llmi quantize` at scale without downloading a checkpoint (issue 13: an 8B model on
a 24 GB machine).  Shapes are Llama-3-8B's (config.json of meta-llama/Meta-Llama-3-8B);
values are uniform in +-1/sqrt(in_features) (as llmi's --dummy), norms 1.  A tokenizer
directory (e.g. testdata/tokenizer/smollm2) is copied in so calibration text can be read:
its ids are valid in the larger vocabulary.  Needs numpy only; never on llmi's path.

    scripts/make-synthetic-hf.py OUTDIR --tokenizer testdata/tokenizer/smollm2 [--layers N]
"""
import argparse, json, os, shutil, struct
import numpy as np

CFG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
       "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
       "num_hidden_layers": 32, "head_dim": 128, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
       "max_position_embeddings": 8192, "vocab_size": 128256, "tie_word_embeddings": False,
       "hidden_act": "silu", "attention_bias": False, "torch_dtype": "bfloat16",
       "bos_token_id": 0, "eos_token_id": 0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--layers", type=int, default=32)
    a = ap.parse_args()
    cfg = dict(CFG, num_hidden_layers=a.layers)
    d, f, v, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], a.layers
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    tensors = [("model.embed_tokens.weight", (v, d)), ("lm_head.weight", (v, d)), ("model.norm.weight", (d,))]
    for l in range(L):
        p = f"model.layers.{l}."
        tensors += [(p + "input_layernorm.weight", (d,)), (p + "post_attention_layernorm.weight", (d,)),
                    (p + "self_attn.q_proj.weight", (q, d)), (p + "self_attn.k_proj.weight", (kv, d)),
                    (p + "self_attn.v_proj.weight", (kv, d)), (p + "self_attn.o_proj.weight", (d, q)),
                    (p + "mlp.gate_proj.weight", (f, d)), (p + "mlp.up_proj.weight", (f, d)),
                    (p + "mlp.down_proj.weight", (d, f))]
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in tensors:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(0)
    unit = rng.uniform(-1.0, 1.0, size=1 << 26).astype(np.float32)
    pools = {}   # bf16 bytes of unit / sqrt(cols) (round to nearest even), one per input width

    def pool(cols):
        if cols not in pools:
            bits = (unit / np.float32(np.sqrt(cols))).view(np.uint32)
            pools[cols] = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
        return pools[cols]

    one = (np.ones(1, np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    with open(os.path.join(a.out, "model.safetensors"), "wb") as fo:
        fo.write(struct.pack("<Q", len(hj)) + hj)
        for i, (name, shape) in enumerate(tensors):
            if len(shape) == 1:
                fo.write(one * shape[0])
                continue
            p, n = pool(shape[1]), shape[0] * shape[1] * 2
            at = (i * 7919 * 4096 * 2) % len(p)   # each tensor starts elsewhere in the pool
            while n > 0:
                k = min(n, len(p) - at)
                fo.write(p[at:at + k])
                n, at = n - k, 0
    with open(os.path.join(a.out, "config.json"), "w") as fc:
        json.dump(cfg, fc, indent=2)
    for fn in os.listdir(a.tokenizer):
        if fn.startswith("tokenizer") or fn == "generation_config.json":
            shutil.copy(os.path.join(a.tokenizer, fn), a.out)
    print(f"{a.out}: {L} layers, {off / 2**30:.2f} GiB of bf16 weights")


if __name__ == "__main__":
    main()
