#!/usr/bin/env python3
"""Writes the tiny Hugging Face reference checkpoints in testdata/hf/ and transformers'
fp32 logits for them, for tests/test_hf_models.c.

Not run by CI (CI has no torch): run once by hand, commit the output, and record the
versions in docs/REFERENCES.md.  Needs PyPI torch, transformers, safetensors, tokenizers.

    python3 scripts/make-hf-test-models.py /work/shared/data/tinyshakespeare/input.txt testdata/hf [--only NAME]

--only NAME writes just that model and its reference (every model is still built, in order,
so the random stream, and so NAME's weights, are those of a full run).

Output:
    testdata/hf/<model>/            complete HF checkpoint: config.json, *.safetensors,
                                    tokenizer.json, tokenizer_config.json, generation_config.json
    testdata/hf/ref/<model>.json    {"model", "n_vocab", "seqs": [{"ids", "n_tokens", "file"}]}
    testdata/hf/ref/<model>.s<k>.f32  (n_tokens, n_vocab) little-endian float32 logits,
                                    every position, from a float32 eager forward
    testdata/hf/ref/tokenizer.json  {"text", "ids"}: HF tokenizers' encoding of one string

Models (hidden 64, 2 layers, vocab 320 = the trained tokenizer):
    llama-gqa-rope3   llama, 4 heads / 2 kv heads, llama3 rope scaling (factor 8, low 1,
                      high 4, original 32), untied, float32
    qwen2-bias-tied   qwen2 (q/k/v bias), tied embeddings, bfloat16
    mistral-sharded   mistral, float16, saved in 2 shards with model.safetensors.index.json
    llama-headdim     llama, head_dim 32 != 64/4, 4 heads / 1 kv head, tied embeddings,
                      float32
    llama-attn-bias   llama, attention_bias (q/k/v and o_proj biases), bfloat16; only the
                      first two sequences (size)
    qwen3-qknorm      qwen3: per-head q_norm/k_norm before RoPE, head_dim 32 != 64/4, no
                      bias, tied embeddings, bfloat16
    qwen2-yarn        qwen2 with YaRN rope scaling (factor 4, original context 32), float32
    llama-yarn-params llama with YaRN and every parameter set (beta_fast 8, beta_slow 0.5,
                      attention_factor 1.25, truncate false; factor 4, original 64), head_dim
                      64, tied embeddings, float32, transformers 5's config form
    phi3-fused, phi3-swa, phi3-longrope, phi4mini-partial: Phi-3's fused projections, its
                      sliding window, Phi-3.5's longrope, Phi-4-mini's partial RoPE (see
                      model_specs)
    smollm3-nope      SmolLM3: 4 layers, the last without RoPE, tied embeddings, float32
    granite-mult      Granite 3: llama's layers with attention_bias, and the four multipliers
                      (embeddings x12, q.k x0.125 in place of 1/sqrt(16), residual x0.22,
                      logits /8), tied embeddings, bfloat16
The first three and llama-attn-bias get config.json / tokenizer_config.json in the classic (transformers 4)
form: top-level rope_theta, rope_scaling, torch_dtype; llama-headdim keeps what
transformers 5 writes (rope_parameters, dtype, tokenizer_class TokenizersBackend).
"""
import json
import os
import struct
import sys

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (AutoModelForCausalLM, AutoTokenizer, GraniteConfig, LlamaConfig, MistralConfig,
                          Phi3Config, PreTrainedTokenizerFast, Qwen2Config, Qwen3Config, SmolLM3Config)

VOCAB = 320
SEED = 1234
SEQ_LENS = (7, 33, 130)
TOK_TEST_TEXT = ("To be, or not to be: that is the question.\n"
                 "  Whether 'tis nobler in the mind to suffer 1234 slings... élan 東京!")


def train_tokenizer(corpus):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([corpus], trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                                   eos_token="<|endoftext|>", unk_token=None, model_max_length=256)


def common(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=0, initializer_range=0.1)
    base.update(kw)
    return base


def model_specs():
    return [
        ("llama-gqa-rope3", LlamaConfig(**common(
            rope_theta=10000.0, tie_word_embeddings=False,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
         torch.float32, None, True),
        ("qwen2-bias-tied", Qwen2Config(**common(
            rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False)),
         torch.bfloat16, None, True),
        ("mistral-sharded", MistralConfig(**common(
            rope_theta=10000.0, tie_word_embeddings=False, sliding_window=None)),
         torch.float16, "150KB", True),
        ("llama-headdim", LlamaConfig(**common(
            head_dim=32, num_key_value_heads=1, rope_theta=500000.0, tie_word_embeddings=True)),
         torch.float32, None, False),
        # HF llama's attention_bias puts a bias on o_proj as well as on q/k/v.
        ("llama-attn-bias", LlamaConfig(**common(
            attention_bias=True, rope_theta=10000.0, tie_word_embeddings=False)),
         torch.bfloat16, None, True),
        ("qwen3-qknorm", Qwen3Config(**common(
            head_dim=32, rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False)),
         torch.bfloat16, None, True),
        # YaRN (Qwen2.5's long-context config): 130-token sequences on an original context of
        # 32, so the interpolated, ramped and extrapolated dimensions all matter
        ("qwen2-yarn", Qwen2Config(**common(
            rope_theta=10000.0, tie_word_embeddings=False, use_sliding_window=False,
            rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32})),
         torch.float32, None, True),
        # every YaRN parameter set: betas, an explicit attention_factor, no truncation, in
        # transformers 5's rope_parameters form
        # (head_dim 64: the correction range spans dimensions 0.84..10.5, which truncation,
        # the betas and the ramp each move)
        ("llama-yarn-params", LlamaConfig(**common(
            head_dim=64, tie_word_embeddings=True,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                             "original_max_position_embeddings": 64, "beta_fast": 8.0, "beta_slow": 0.5,
                             "attention_factor": 1.25, "truncate": False})),
         torch.float32, None, False),
        # Phi-3 (Phi-3-mini-4k, Phi-4): q/k/v in one qkv_proj, gate and up in one gate_up_proj
        # (llmi splits them at load); no window, so llama.cpp (which runs Phi without one)
        # reads its GGUF the same; and the released mini-4k form with a sliding window on
        # every layer (transformers applies it), 8 keys against 130-token sequences
        ("phi3-fused", Phi3Config(**common(
            rope_theta=10000.0, tie_word_embeddings=False, sliding_window=None, pad_token_id=0)),
         torch.float32, None, True),
        ("phi3-swa", Phi3Config(**common(
            rope_theta=10000.0, tie_word_embeddings=False, sliding_window=8, pad_token_id=0)),
         torch.bfloat16, None, True),
        # Phi-3.5-mini's longrope on an original context of 64 (max 256: factor 4, attention
        # factor sqrt(1 + ln 4 / ln 64)): transformers takes the short factors for the 7- and
        # 33-token sequences and the long ones for the 130-token one
        ("phi3-longrope", Phi3Config(**common(
            rope_theta=10000.0, tie_word_embeddings=False, sliding_window=None, pad_token_id=0,
            original_max_position_embeddings=64,
            rope_scaling={"rope_type": "longrope",
                          "short_factor": [1.0, 1.02, 1.05, 1.1, 1.2, 1.35, 1.5, 1.7],
                          "long_factor": [1.0, 1.1, 1.4, 2.0, 3.0, 4.5, 6.0, 8.0]})),
         torch.float32, None, True),
        # Phi-4-mini's partial RoPE: partial_rotary_factor 0.75 of head_dim 32 (2 heads, 1 kv
        # head) rotates the first 24 values of each head, the last 8 pass through; longrope
        # with 12 factors each (one per rotated pair) as phi3-longrope; tied embeddings; the
        # released config form (top-level partial_rotary_factor, rope_scaling without it)
        ("phi4mini-partial", Phi3Config(**common(
            num_attention_heads=2, num_key_value_heads=1, rope_theta=10000.0, tie_word_embeddings=True,
            sliding_window=None, pad_token_id=0, original_max_position_embeddings=64,
            partial_rotary_factor=0.75,
            rope_scaling={"rope_type": "longrope", "partial_rotary_factor": 0.75,
                          "short_factor": [1.0, 1.01, 1.03, 1.06, 1.1, 1.15, 1.2, 1.3, 1.4, 1.5, 1.6, 1.8],
                          "long_factor": [1.0, 1.2, 1.5, 2.0, 2.6, 3.3, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]})),
         torch.float32, None, True),
        # SmolLM3: llama's layers, the last of every 4 without RoPE (no_rope_layers [1, 1, 1,
        # 0], as SmolLM3Config makes it and llama.cpp assumes for its GGUF), tied embeddings
        ("smollm3-nope", SmolLM3Config(**common(
            num_hidden_layers=4, rope_theta=10000.0, pad_token_id=0)),
         torch.float32, None, True),
        # Granite 3.x: every multiplier away from 1 (the released 2B's values but for q.k's,
        # which is 2x 1/sqrt(head_dim 16) here), biases on q/k/v and o_proj (so the residual
        # scale must apply to o_proj's output with its bias), tied embeddings
        ("granite-mult", GraniteConfig(**common(
            rope_theta=10000.0, tie_word_embeddings=True, attention_bias=True, pad_token_id=0,
            embedding_multiplier=12.0, attention_multiplier=0.125, residual_multiplier=0.22,
            logits_scaling=8.0)),
         torch.bfloat16, None, True),
    ]


def randomize(model, gen):
    """Default init leaves norms at 1 and biases at 0, which would hide a loader that
    skips them: give every norm and bias random values too."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))


def classic_config(path):
    """transformers 5 writes rope_parameters and dtype; most checkpoints in the wild
    (Llama 3.x, Qwen2.5, Mistral) have top-level rope_theta, rope_scaling and
    torch_dtype.  Rewrite to that form; the reference is computed after the rewrite,
    so it checks that transformers reads the classic form the same way."""
    cpath = os.path.join(path, "config.json")
    with open(cpath, encoding="utf-8") as f:
        cfg = json.load(f)
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp.pop("rope_theta")
    if rp.get("rope_type", "default") != "default":
        cfg["rope_scaling"] = rp
    cfg["torch_dtype"] = cfg.pop("dtype")
    with open(cpath, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def released_partial_rotary(path):
    """Phi-4-mini's config.json: partial_rotary_factor at the top level, not in rope_scaling."""
    cpath = os.path.join(path, "config.json")
    with open(cpath, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["partial_rotary_factor"] = cfg["rope_scaling"].pop("partial_rotary_factor")
    with open(cpath, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def classic_tokenizer_config(path):
    """The PreTrainedTokenizerFast form that released checkpoints carry."""
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"add_bos_token": False, "add_eos_token": False, "bos_token": "<|endoftext|>",
                   "clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>",
                   "model_max_length": 256, "tokenizer_class": "PreTrainedTokenizerFast"},
                  f, indent=2)
        f.write("\n")


def load_fp32(path):
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    except TypeError:
        return AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="eager")


def write_refs(ref, name, seqs, vocab, dtype, refdir):
    """Transformers' fp32 logits of every sequence at every position: refdir/<name>.s<k>.f32
    (raw little-endian float32 (n_tokens, vocab)) and refdir/<name>.json (the ids)."""
    meta = {"model": name, "n_vocab": vocab, "weights_dtype": str(dtype).replace("torch.", ""),
            "transformers": transformers.__version__, "torch": torch.__version__, "seqs": []}
    for k, ids in enumerate(seqs):
        with torch.no_grad():
            logits = ref(torch.tensor([ids])).logits[0].to(torch.float32).contiguous()
        assert logits.shape == (len(ids), vocab)
        fname = f"{name}.s{k}.f32"
        flat = logits.reshape(-1).tolist()
        with open(os.path.join(refdir, fname), "wb") as f:
            f.write(struct.pack(f"<{len(flat)}f", *flat))
        top2 = torch.topk(logits, 2, dim=-1).values
        margin = float((top2[:, 0] - top2[:, 1]).min())
        meta["seqs"].append({"ids": ids, "n_tokens": len(ids), "file": fname,
                             "max_abs": float(logits.abs().max()), "std": float(logits.std()),
                             "min_top2_margin": margin})
        print(f"{name} s{k}: n={len(ids)} max|logit|={logits.abs().max():.3f} "
              f"std={logits.std():.3f} min top-2 margin={margin:.2e}", file=sys.stderr)
    with open(os.path.join(refdir, name + ".json"), "w", encoding="utf-8") as f:
        json.dump(meta, f)
        f.write("\n")


def ref_dir_and_seqs(corpus, outdir, tokenize, gen, vocab=VOCAB):
    """outdir/ref (made) and reference_seqs of the corpus: the preamble every model script shares."""
    refdir = os.path.join(outdir, "ref")
    os.makedirs(refdir, exist_ok=True)
    with open(corpus, encoding="utf-8") as f:
        text = f.read()
    return refdir, reference_seqs(tokenize, text, gen, vocab)


def reference_seqs(tokenize, text, gen, vocab=VOCAB):
    """The three reference sequences every tiny checkpoint is checked on: SEQ_LENS[0] random
    ids below vocab (specials too), then SEQ_LENS[1] and SEQ_LENS[2] tokens of the corpus text (tokenize:
    text -> ids), drawn from gen after the text is tokenized."""
    text_ids = tokenize(text[:20000])
    assert len(text_ids) > 400
    return [
        torch.randint(0, vocab, (SEQ_LENS[0],), generator=gen).tolist(),   # any ids, specials too
        text_ids[100:100 + SEQ_LENS[1]],
        text_ids[200:200 + SEQ_LENS[2]],
    ]


def main(corpus, outdir, only=None):
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    hf_tok = train_tokenizer(corpus)
    refdir = os.path.join(outdir, "ref")
    os.makedirs(refdir, exist_ok=True)

    with open(corpus, encoding="utf-8") as f:
        text = f.read()
    seqs = reference_seqs(lambda t: hf_tok(t)["input_ids"], text, gen)

    ids_fast = hf_tok(TOK_TEST_TEXT)["input_ids"]
    ids_raw = hf_tok.backend_tokenizer.encode(TOK_TEST_TEXT).ids
    assert ids_fast == ids_raw, (ids_fast, ids_raw)
    if only:   # the other models' references must stay valid: the same tokenizer
        with open(os.path.join(refdir, "tokenizer.json"), encoding="utf-8") as f:
            assert json.load(f)["ids"] == ids_raw, "the trained tokenizer differs from the committed one"
    else:
        with open(os.path.join(refdir, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump({"text": TOK_TEST_TEXT, "ids": ids_raw}, f, ensure_ascii=False)
            f.write("\n")

    for name, cfg, dtype, shard, classic in model_specs():
        path = os.path.join(outdir, name)
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
        randomize(model, gen)
        if only and name != only:
            continue
        model = model.to(dtype)
        kw = {"safe_serialization": True}
        if shard:
            kw["max_shard_size"] = shard
        model.save_pretrained(path, **kw)
        hf_tok.save_pretrained(path)
        if classic:
            classic_config(path)
            classic_tokenizer_config(path)
        if name == "phi4mini-partial":
            released_partial_rotary(path)
        shards = sorted(x for x in os.listdir(path) if x.endswith(".safetensors"))
        if shard:
            assert os.path.exists(os.path.join(path, "model.safetensors.index.json"))
            assert len(shards) == 2, shards
        # Reference from what was written: bf16/f16 weights upcast, all math in fp32.
        ref = load_fp32(path).eval()
        assert AutoTokenizer.from_pretrained(path)(TOK_TEST_TEXT)["input_ids"] == ids_raw
        write_refs(ref, name, seqs[:2] if name == "llama-attn-bias" else seqs, VOCAB, dtype, refdir)
        print(f"{name}: {shards}", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[3] == "--only":
        main(sys.argv[1], sys.argv[2], sys.argv[4])
    elif len(sys.argv) == 3:
        main(sys.argv[1], sys.argv[2])
    else:
        sys.exit(__doc__)
