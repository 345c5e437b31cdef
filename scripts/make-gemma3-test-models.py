#!/usr/bin/env python3
"""Writes the tiny Gemma 3 (text) reference checkpoints in testdata/hf/ and transformers'
fp32 logits for them, for tests/test_hf_models.c (the same reference format as
scripts/make-hf-test-models.py, whose helpers it uses), and the reference encodings of
their Gemma-style tokenizer.

Not run by CI (CI has no torch): run once by hand, commit the output, and record the
versions in docs/REFERENCES.md.  Needs PyPI torch, transformers, safetensors, tokenizers.

    python3 scripts/make-gemma3-test-models.py /work/shared/data/tinyshakespeare/input.txt testdata/hf

Output:
    testdata/hf/gemma3-swa/        Gemma3ForCausalLM, hidden 64, 6 layers (the default
                                   sliding_window_pattern 6: layers 0-4 slide over 8 keys with
                                   RoPE base 10000, layer 5 is global with base 1e6), 4 heads /
                                   2 kv heads, head_dim 32, query_pre_attn_scalar 32, bfloat16,
                                   config.json in the transformers 4 form of the released
                                   checkpoints (rope_theta, rope_local_base_freq,
                                   sliding_window_pattern, torch_dtype)
    testdata/hf/gemma3-scaled/     2 layers, layer_types [sliding, full], window 5,
                                   query_pre_attn_scalar 24 (!= head_dim 32), linear rope
                                   scaling x4 on the global layer only, float32, config.json
                                   as transformers 5 writes it (layer_types, rope_parameters
                                   per layer type)
    testdata/hf/ref/gemma3-*.json, .s<k>.f32   as make-hf-test-models.py's
    testdata/hf/ref/gemma3-tokenizer.json      [{"text", "ids"}]: HF tokenizers' encoding
                                   (with the BOS the tokenizer adds) of test strings
Both models have the same tokenizer, built as transformers' GemmaTokenizer builds Gemma's:
BPE with byte_fallback, normalizer Replace(" ", "▁"), pre-tokenizer Split(" ",
merged_with_previous), decoder Replace("▁", " ") + ByteFallback + Fuse; <pad> 0, <eos> 1,
<bos> 2, <unk> 3, <mask> 4, then <start_of_turn>, <end_of_turn>, the 256 byte tokens
<0x00>..<0xFF>, and merges trained here on the corpus (vocab 512).  Every norm weight is
random (Gemma multiplies by 1 + w, so a loader that forgets the 1 fails).
"""
import importlib.util
import json
import os
import sys

import torch
import transformers
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, Gemma3TextConfig, PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("hfm", os.path.join(HERE, "make-hf-test-models.py"))
hfm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hfm)

VOCAB = 512
SEED = 4321
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
BYTES = [f"<0x{b:02X}>" for b in range(256)]
TOK_STRINGS = [
    hfm.TOK_TEST_TEXT,
    " leading space and  two   spaces",
    "line one\nline two\n\n\ttabbed",
    "élan 東京 🚀 naïve",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "",
]
GEMMA3_TEMPLATE = None   # filled from make-tokenizer-refs.py's copy of the released template


def gemma_tokenizer(corpus):
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    # the specials and byte tokens first (ids 0..262), trained merges after them
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS + BYTES, show_progress=False,
                                  limit_alphabet=120)
    with open(corpus, encoding="utf-8") as f:
        lines = f.read().splitlines()
    tok.train_from_iterator(lines, trainer)
    vocab = tok.get_vocab()
    merges = json.loads(tok.to_str())["model"]["merges"]
    assert vocab["<pad>"] == 0 and vocab["<eos>"] == 1 and vocab["<bos>"] == 2 and vocab["<0x00>"] == 7
    # rebuilt so that only the real specials are added tokens: the byte tokens are ordinary
    # vocabulary, as in Gemma's (text "<0x41>" is not matched as a token)
    out = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) if isinstance(m, list) else tuple(m.split(" "))
                                                    for m in merges],
                               unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    out.normalizer = tok.normalizer
    out.pre_tokenizer = tok.pre_tokenizer
    out.decoder = tok.decoder
    out.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    from tokenizers import processors
    out.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                       special_tokens=[("<bos>", 2)])
    assert out.get_vocab_size() == VOCAB, out.get_vocab_size()
    return out


def write_tokenizer(path, tok):
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>", "eos_token": "<eos>",
                   "pad_token": "<pad>", "unk_token": "<unk>", "chat_template": GEMMA3_TEMPLATE,
                   "model_max_length": 256, "tokenizer_class": "GemmaTokenizer", "padding_side": "left",
                   "clean_up_tokenization_spaces": False}, f, indent=2, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(path, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token_id": 2, "eos_token_id": [1, 6], "pad_token_id": 0}, f, indent=2)
        f.write("\n")


def classic_gemma_config(path):
    """The form of the released gemma-3-1b-it config.json (transformers 4.50): top-level
    rope_theta, rope_local_base_freq, sliding_window_pattern, rope_scaling, torch_dtype."""
    cpath = os.path.join(path, "config.json")
    with open(cpath, encoding="utf-8") as f:
        cfg = json.load(f)
    rp = cfg.pop("rope_parameters")
    cfg.pop("layer_types")
    cfg.pop("_sliding_window_pattern", None)   # transformers 5's private copy
    cfg["rope_theta"] = rp["full_attention"]["rope_theta"]
    cfg["rope_local_base_freq"] = rp["sliding_attention"]["rope_theta"]
    cfg["rope_scaling"] = None
    cfg["sliding_window_pattern"] = 6
    cfg["torch_dtype"] = cfg.pop("dtype")
    with open(cpath, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def save_gemma(model_cls, cfg, seed, gen, dtype, path, tok):
    """A tiny Gemma of model_cls (Gemma2ForCausalLM, Gemma3ForCausalLM) at path: seeded init,
    every norm weight random (Gemma's norms are 1 + w, so w around 0), cast to dtype, with
    the tokenizer files."""
    cfg.architectures = [model_cls.__name__]
    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    model = model.to(dtype)
    model.save_pretrained(path, safe_serialization=True)
    write_tokenizer(path, tok)


def main(corpus, outdir):
    global GEMMA3_TEMPLATE
    spec = importlib.util.spec_from_file_location("mtr", os.path.join(HERE, "make-tokenizer-refs.py"))
    mtr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mtr)
    GEMMA3_TEMPLATE = mtr.GEMMA3_TEMPLATE
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    tok = gemma_tokenizer(corpus)
    refdir, seqs = hfm.ref_dir_and_seqs(corpus, outdir, lambda t: tok.encode(t).ids, gen, VOCAB)
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, max_position_embeddings=256, rms_norm_eps=1e-6,
                bos_token_id=2, eos_token_id=1, pad_token_id=0, initializer_range=0.1, tie_word_embeddings=True,
                hidden_activation="gelu_pytorch_tanh")
    specs = [
        ("gemma3-swa", Gemma3TextConfig(num_hidden_layers=6, sliding_window=8, query_pre_attn_scalar=32,
                                        rope_theta=1e6, rope_local_base_freq=1e4, **base), torch.bfloat16, True),
        ("gemma3-scaled", Gemma3TextConfig(num_hidden_layers=2, sliding_window=5, query_pre_attn_scalar=24,
                                           layer_types=["sliding_attention", "full_attention"],
                                           rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0,
                                                                               "rope_theta": 1e6},
                                                            "sliding_attention": {"rope_type": "default",
                                                                                  "rope_theta": 1e4}},
                                           **base), torch.float32, False),
    ]
    for name, cfg, dtype, classic in specs:
        path = os.path.join(outdir, name)
        save_gemma(transformers.Gemma3ForCausalLM, cfg, SEED, gen, dtype, path, tok)
        if classic:
            classic_gemma_config(path)
        ref = hfm.load_fp32(path).eval()
        assert type(ref).__name__ == "Gemma3ForCausalLM", type(ref)
        hf = AutoTokenizer.from_pretrained(path)
        assert hf(hfm.TOK_TEST_TEXT)["input_ids"] == tok.encode(hfm.TOK_TEST_TEXT).ids
        hfm.write_refs(ref, name, seqs, VOCAB, dtype, refdir)
    hf = AutoTokenizer.from_pretrained(os.path.join(outdir, "gemma3-swa"))
    recs = []
    for s in TOK_STRINGS:
        ids = hf(s)["input_ids"]
        assert ids == tok.encode(s).ids
        recs.append({"text": s, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
    with open(os.path.join(refdir, "gemma3-tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer": "testdata/hf/gemma3-swa/tokenizer.json", "add_special_tokens": True,
                   "tokenizers": __import__("tokenizers").__version__, "cases": recs}, f, ensure_ascii=False,
                  indent=1)
        f.write("\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
