#!/usr/bin/env python3
"""Writes the tiny Gemma 2 reference checkpoints in testdata/hf/ and transformers' fp32
logits for them, for tests/test_hf_models.c (the reference format of
scripts/make-hf-test-models.py; the Gemma-style tokenizer of make-gemma3-test-models.py,
whose helpers it uses).

Not run by CI (CI has no torch): run once by hand, commit the output, and record the
versions in docs/REFERENCES.md.  Needs PyPI torch, transformers, safetensors, tokenizers.

    python3 scripts/make-gemma2-test-models.py /work/shared/data/tinyshakespeare/input.txt testdata/hf \\
        LLAMA_CPP_DIR/models/templates/google-gemma-2-2b-it.jinja

Output:
    testdata/hf/gemma2-capped/   Gemma2ForCausalLM, hidden 64, 4 layers (layer_types
                                 [sliding, full, sliding, full], window 6), 4 heads / 2 kv
                                 heads, head_dim 32, query_pre_attn_scalar 32 (so that
                                 llama.cpp's 1/sqrt(head_dim) is the same scale),
                                 attn_logit_softcapping 0.75 and final_logit_softcapping 2.5:
                                 caps small enough to bend most of the tiny model's scores and
                                 logits (the script asserts how much); float32; config.json as
                                 transformers 5 writes it (layer_types, rope_parameters)
    testdata/hf/gemma2-classic/  3 layers (the default pattern: layers 0 and 2 slide, over 5
                                 keys), query_pre_attn_scalar 24 (!= head_dim), the soft caps
                                 left out of config.json (transformers' defaults 50 and 30
                                 apply), bfloat16, config.json in the form of the released
                                 gemma-2-2b-it (transformers 4.42: top-level rope_theta,
                                 torch_dtype, no layer_types)
    testdata/hf/ref/gemma2-*.json, .s<k>.f32   as make-hf-test-models.py's
The tokenizer is gemma3-swa's (the same construction and seed), with Gemma 2's chat template
(llama.cpp's models/templates/google-gemma-2-2b-it.jinja, the released template).  Every norm
weight is random (Gemma multiplies by 1 + w).
"""
import importlib.util
import json
import os
import sys

import torch
import transformers
from transformers import AutoTokenizer, Gemma2Config

HERE = os.path.dirname(os.path.abspath(__file__))


def load(name, file):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, file))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


hfm = load("hfm", "make-hf-test-models.py")
g3 = load("g3", "make-gemma3-test-models.py")

SEED = 2424


def classic_config(path):
    """The released gemma-2-2b-it's config.json form: top-level rope_theta, torch_dtype, no
    layer_types; and no soft-cap keys, so that the defaults are what a reader must supply."""
    cpath = os.path.join(path, "config.json")
    with open(cpath, encoding="utf-8") as f:
        cfg = json.load(f)
    rp = cfg.pop("rope_parameters")
    cfg.pop("layer_types")
    cfg.pop("attn_logit_softcapping")
    cfg.pop("final_logit_softcapping")
    cfg["rope_theta"] = rp["rope_theta"]
    cfg["torch_dtype"] = cfg.pop("dtype")
    cfg["cache_implementation"] = "hybrid"
    with open(cpath, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def cap_effect(model, ids):
    """max |logit change| when both soft caps are taken out: the test must see them."""
    with torch.no_grad():
        with_caps = model(torch.tensor([ids])).logits
        a, f = model.config.attn_logit_softcapping, model.config.final_logit_softcapping
        model.config.attn_logit_softcapping = None
        model.config.final_logit_softcapping = None
        for layer in model.model.layers:
            layer.self_attn.attn_logit_softcapping = None
        without = model(torch.tensor([ids])).logits
        model.config.attn_logit_softcapping, model.config.final_logit_softcapping = a, f
        for layer in model.model.layers:
            layer.self_attn.attn_logit_softcapping = a
    return (with_caps - without).abs().max().item()


def main(corpus, outdir, template_path):
    with open(template_path, encoding="utf-8") as f:
        g3.GEMMA3_TEMPLATE = f.read().rstrip("\n")   # write_tokenizer's template: Gemma 2's here
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    tok = g3.gemma_tokenizer(corpus)
    refdir, seqs = hfm.ref_dir_and_seqs(corpus, outdir, lambda t: tok.encode(t).ids, gen, g3.VOCAB)
    base = dict(vocab_size=g3.VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, max_position_embeddings=256, rms_norm_eps=1e-6,
                bos_token_id=2, eos_token_id=1, pad_token_id=0, initializer_range=0.1, tie_word_embeddings=True,
                hidden_activation="gelu_pytorch_tanh")
    specs = [
        ("gemma2-capped", Gemma2Config(num_hidden_layers=4, sliding_window=6, query_pre_attn_scalar=32,
                                       attn_logit_softcapping=0.75, final_logit_softcapping=2.5, **base),
         torch.float32, False, 0.5),
        ("gemma2-classic", Gemma2Config(num_hidden_layers=3, sliding_window=5, query_pre_attn_scalar=24, **base),
         torch.bfloat16, True, 0.0),
    ]
    for name, cfg, dtype, classic, min_effect in specs:
        path = os.path.join(outdir, name)
        g3.save_gemma(transformers.Gemma2ForCausalLM, cfg, SEED, gen, dtype, path, tok)
        if classic:
            classic_config(path)
        ref = hfm.load_fp32(path).eval()
        assert type(ref).__name__ == "Gemma2ForCausalLM", type(ref)
        assert ref.config.attn_logit_softcapping == cfg.attn_logit_softcapping
        assert ref.config.final_logit_softcapping == cfg.final_logit_softcapping
        effect = cap_effect(ref, seqs[2])
        print(f"{name}: the soft caps move the logits by up to {effect:.4f}")
        assert effect >= min_effect, effect
        hf = AutoTokenizer.from_pretrained(path)
        assert hf(hfm.TOK_TEST_TEXT)["input_ids"] == tok.encode(hfm.TOK_TEST_TEXT).ids
        hfm.write_refs(ref, name, seqs, g3.VOCAB, dtype, refdir)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3])
