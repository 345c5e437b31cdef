#!/usr/bin/env python3
"""Converts PEFT adapters of testdata/lora into llama.cpp's GGUF adapter format with
llama.cpp's own converter (convert_lora_to_gguf.py), for tests/cli/lora.sh (llmi's --lora
FILE.gguf against PEFT's logits of the same adapters, and against the directory form).

Not run by CI (CI has neither torch nor llama.cpp): run once by hand, commit the output,
and record the versions in docs/REFERENCES.md.  Needs the llama.cpp source tree (the
llama-cpp-python sdist's vendor/llama.cpp) and a Python with torch, transformers, safetensors
and gguf (scripts/make-lora-refs.py's environment).

    python3 scripts/make-lora-gguf.py LLAMA_CPP_DIR testdata/hf testdata/lora [SMOLLM2.gguf]

Output: testdata/lora/gguf/<adapter>.<outtype>.gguf, one per case below.  The converter
needs the base model's config.json only; for the two bases that exist as GGUF files alone
(the k-quant Qwen3 and SmolLM2) it is written to a temporary directory first, from the same
config scripts/make-lora-refs.py gave transformers.
"""
import importlib.util
import os
import subprocess
import sys
import tempfile

# adapter -> (base: an HF directory under testdata/hf, or "qwen3-kq" / "smollm2", outtype).
# Every outtype the converter offers: f32 (the same values as the PEFT file), f16, bf16 and
# q8_0 (llmi reads them back into floats).  llama-gqa-rope3-qv-rslora is left out: the GGUF
# form has no use_rslora (the converter writes lora_alpha and llama.cpp scales by alpha / r).
CASES = {
    "llama-gqa-rope3-all": ("llama-gqa-rope3", "f32"),
    "qwen2-bias-tied-attn": ("qwen2-bias-tied", "f16"),
    "gemma3-swa-mlp": ("gemma3-swa", "bf16"),
    "qwen3-kq-all": ("qwen3-kq", "q8_0"),
    "smollm2-qv": ("smollm2", "f32"),
}


def config_dir(base, hfdir, smollm2, tmp):
    if base == "qwen3-kq":
        here = os.path.dirname(os.path.abspath(__file__))
        spec = importlib.util.spec_from_file_location("make_lora_refs", os.path.join(here, "make-lora-refs.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        cfg = mod.kq_config()
        cfg.architectures = ["Qwen3ForCausalLM"]
    elif base == "smollm2":
        from transformers import AutoConfig
        cfg = AutoConfig.from_pretrained(os.path.dirname(smollm2), gguf_file=os.path.basename(smollm2))
        cfg.architectures = ["LlamaForCausalLM"]
    else:
        return os.path.join(hfdir, base)
    d = os.path.join(tmp, base)
    cfg.save_pretrained(d)
    return d


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    llama_cpp, hfdir, loradir = sys.argv[1:4]
    smollm2 = sys.argv[4] if len(sys.argv) == 5 else None
    out = os.path.join(loradir, "gguf")
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (base, outtype) in CASES.items():
            if base == "smollm2" and not smollm2:
                print(f"{name}: skipped (no SmolLM2 GGUF given)")
                continue
            dst = os.path.join(out, f"{name}.{outtype}.gguf")
            subprocess.run([sys.executable, os.path.join(llama_cpp, "convert_lora_to_gguf.py"),
                            "--base", config_dir(base, hfdir, smollm2, tmp), "--outtype", outtype,
                            "--outfile", dst, os.path.join(loradir, name)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            print(f"{dst}: {os.path.getsize(dst)} bytes")


if __name__ == "__main__":
    main()
