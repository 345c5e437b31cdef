#!/usr/bin/env python3
"""Writes the tiny Mixture-of-Experts reference checkpoints (Qwen3-MoE, Mixtral, GraniteMoe) in
testdata/hf/ and transformers' fp32 logits for them, for tests/test_hf_models.c (the same
reference format as scripts/make-hf-test-models.py, whose tokenizer and write_refs it uses).

Not run by CI (CI has no torch): run once by hand, commit the output, and record the
versions in docs/REFERENCES.md.  Needs PyPI torch, transformers (5.x: its MoE blocks hold
the experts fused in memory, gate_up_proj, and save them per expert), safetensors, tokenizers.

    python3 scripts/make-moe-test-models.py /work/shared/data/tinyshakespeare/input.txt testdata/hf [--only NAME]

--only NAME writes just that model and its reference (each model has its own seed, so the
others' files do not depend on it).

Output:
    testdata/hf/qwen3moe-tiny/     Qwen3MoeForCausalLM, hidden 64, 3 layers (all sparse:
                                   decoder_sparse_step 1, mlp_only_layers []), 4 heads / 2 kv
                                   heads, head_dim 16, q_norm/k_norm, 8 experts, top-2,
                                   moe_intermediate_size 32 (intermediate_size 96 is present
                                   and unused), norm_topk_prob true, untied, bfloat16;
                                   config.json in the form of the released Qwen3-30B-A3B
                                   (transformers 4.51: num_experts, rope_theta, torch_dtype)
    testdata/hf/qwen3moe-nonorm/   the same family, 2 layers, 6 experts, top-3,
                                   norm_topk_prob false (the softmax weights of the chosen
                                   experts are used as they are), float32; config.json as
                                   transformers 5 writes it (num_local_experts, rope_parameters,
                                   dtype)
    testdata/hf/mixtral-tiny/      MixtralForCausalLM, hidden 64, 2 layers, 4 heads / 2 kv
                                   heads, 4 experts (num_local_experts), top-2,
                                   intermediate_size 48, sliding_window null, untied, float32;
                                   config.json in the form of the released Mixtral-8x7B
                                   (rope_theta, torch_dtype, no head_dim key)
    testdata/hf/granitemoe-tiny/   GraniteMoeForCausalLM, hidden 64, 2 layers, 4 heads / 2 kv
                                   heads, 4 experts, top-2, intermediate_size 32, tied, float32,
                                   Granite's four multipliers away from 1 (embedding 12,
                                   attention 0.125, residual 0.22, logits 8); config.json as
                                   transformers 5 writes it
    testdata/hf/ref/<model>.json, .s<k>.f32   as make-hf-test-models.py's
The safetensors hold the experts as the hub checkpoints do, one matrix per expert:
    Qwen3-MoE  model.layers.L.mlp.gate.weight                          [n_expert, hidden]
               model.layers.L.mlp.experts.E.{gate,up}_proj.weight      [moe_ff, hidden]
               model.layers.L.mlp.experts.E.down_proj.weight           [hidden, moe_ff]
    Mixtral    model.layers.L.block_sparse_moe.gate.weight             [n_expert, hidden]
               model.layers.L.block_sparse_moe.experts.E.w1.weight     gate [ff, hidden]
               model.layers.L.block_sparse_moe.experts.E.w3.weight     up   [ff, hidden]
               model.layers.L.block_sparse_moe.experts.E.w2.weight     down [hidden, ff]
    GraniteMoe model.layers.L.block_sparse_moe.router.layer.weight     [n_expert, hidden]
               model.layers.L.block_sparse_moe.input_linear.weight    [n_expert, 2 ff, hidden]
                                                                      (gate rows, then up)
               model.layers.L.block_sparse_moe.output_linear.weight   [n_expert, hidden, ff]
(transformers 5.24's save_pretrained writes these names; the script asserts it, and asserts
that the directory reloaded by from_pretrained gives the in-memory model's logits exactly.)

Tokenizer: make-hf-test-models.py's byte-level BPE (vocab 320, trained on the corpus).
Weights: random init with initializer_range 0.1, every norm weight 1 + 0.2 N(0,1), all
rounded to the checkpoint's dtype; then, layer by layer, the router weight is the best of
N_CAND draws of N(0, ROUTER_STD^2) (ROUTER_STD = 1.5/sqrt(hidden)): among the draws that
choose every expert somewhere, the one whose smallest gap between the k-th and (k+1)-th
router softmax probability, over every token of the reference sequences (given the layers
before it), is largest.  Purely random routers leave some token's top-k a near-tie (about
1% of tokens within 1e-3); with the selection, the smallest gap over every sequence, layer
and token is asserted > MIN_GAP and printed, with the smallest router-logit gap.
Reference logits: the written directory reloaded in float32 with eager attention and eager
experts (the loop over experts of modeling_qwen3_moe.py / modeling_mixtral.py; the default,
grouped_mm, agrees within 2e-6 and is checked too).
"""
import copy
import importlib.util
import json
import os
import sys

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, GraniteMoeConfig, MixtralConfig, Qwen3MoeConfig

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("hfm", os.path.join(HERE, "make-hf-test-models.py"))
hfm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hfm)

VOCAB = hfm.VOCAB
SEED = 8642          # the sequences
HIDDEN = 64
ROUTER_STD = 1.5 / HIDDEN ** 0.5
N_CAND = 10000
MIN_GAP = 1e-3


def common(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=256, bos_token_id=0, eos_token_id=0, initializer_range=0.1,
                tie_word_embeddings=False)
    base.update(kw)
    return base


def model_specs():
    """(name, config, weights dtype, seed, config.json form)"""
    return [
        ("qwen3moe-tiny", Qwen3MoeConfig(**common(
            num_hidden_layers=3, head_dim=16, intermediate_size=96, moe_intermediate_size=32, num_experts=8,
            num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
            rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False, sliding_window=None,
            max_window_layers=3)),
         torch.bfloat16, 101, "qwen3_classic"),
        ("qwen3moe-nonorm", Qwen3MoeConfig(**common(
            num_hidden_layers=2, head_dim=16, intermediate_size=96, moe_intermediate_size=32, num_experts=6,
            num_experts_per_tok=3, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
            rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False, sliding_window=None)),
         torch.float32, 202, None),
        ("mixtral-tiny", MixtralConfig(**common(
            num_hidden_layers=2, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2,
            rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=None)),
         torch.float32, 303, "mixtral_classic"),
        ("granitemoe-tiny", GraniteMoeConfig(**common(
            num_hidden_layers=2, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
            rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True, pad_token_id=0,
            embedding_multiplier=12.0, attention_multiplier=0.125, residual_multiplier=0.22,
            logits_scaling=8.0)),
         torch.float32, 404, None),
    ]


def n_experts_of(cfg):
    return cfg.num_experts if cfg.model_type == "qwen3_moe" else cfg.num_local_experts


def topk_gaps(logits, k):
    """(..., n_expert) router logits -> (...) gap between the k-th and (k+1)-th largest
    softmax probability, and (..., k) the chosen experts."""
    probs = torch.softmax(logits.float(), dim=-1)
    top = torch.topk(probs, k + 1, dim=-1)
    return top.values[..., k - 1] - top.values[..., k], top.indices[..., :k]


def routers_of(model):
    return [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]


def build(cfg, seed, dtype, seqs):
    """A model with random weights already rounded to dtype (so saving in dtype is exact),
    whose router of each layer, in order, is the best of N_CAND draws of N(0, ROUTER_STD^2):
    every expert chosen somewhere, and the largest smallest gap between the k-th and
    (k+1)-th softmax probability over every token of seqs, given the layers before it."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="eager",
                                             experts_implementation="eager", dtype=torch.float32).eval()
    hfm.randomize(model, gen)    # norms 1 + 0.2 N(0,1) (no biases here)
    k = cfg.num_experts_per_tok
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).float())
        for router in routers_of(model):
            inputs = []
            h = router.register_forward_pre_hook(lambda mod, args: inputs.append(args[0].reshape(-1, args[0].shape[-1])))
            for ids in seqs:
                model(torch.tensor([ids]))
            h.remove()
            x = torch.cat(inputs)                                  # (tokens, hidden)
            cand = (ROUTER_STD * torch.randn((N_CAND,) + tuple(router.weight.shape), generator=gen)).to(dtype).float()
            gaps, chosen = topk_gaps(torch.einsum("th,ceh->cte", x, cand), k)
            n_used = torch.stack([torch.unique(c).numel() * torch.ones(()) for c in chosen])
            score = torch.where(n_used == router.weight.shape[0], gaps.min(dim=1).values, torch.tensor(-1.0))
            router.weight.copy_(cand[int(score.argmax())])
    return model


def load_fp32(path, experts="eager"):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager",
                                                experts_implementation=experts).eval()


def logits_of(model, seqs):
    with torch.no_grad():
        return [model(torch.tensor([ids])).logits[0].float() for ids in seqs]


def router_stats(model, seqs, k):
    """Over every sequence, layer and token: the smallest gap between the k-th and (k+1)-th
    router softmax probability (and where), the smallest gap between the k-th and (k+1)-th
    router logit, and per layer the number of distinct experts chosen."""
    routers = [(n, m) for n, m in model.named_modules() if type(m).__name__.endswith("TopKRouter")]
    assert routers, "no router modules"
    seen = {n: set() for n, _ in routers}
    cur = {"best": None, "logit_gap": float("inf")}

    def hook(name):
        def f(mod, inp, out):
            gaps, chosen = topk_gaps(out[0], k)
            # the block's own choice is the top-k of the softmax computed here
            assert torch.equal(torch.sort(chosen, -1).values, torch.sort(out[2], -1).values), name
            g, pos = gaps.min(0)
            if cur["best"] is None or float(g) < cur["best"][0]:
                cur["best"] = (float(g), cur["seq"], name, int(pos))
            top = torch.topk(out[0].float(), k + 1, dim=-1).values
            cur["logit_gap"] = min(cur["logit_gap"], float((top[:, k - 1] - top[:, k]).min()))
            seen[name].update(out[2].reshape(-1).tolist())
        return f

    handles = [m.register_forward_hook(hook(n)) for n, m in routers]
    try:
        for s, ids in enumerate(seqs):
            cur["seq"] = s
            with torch.no_grad():
                model(torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    return cur["best"], cur["logit_gap"], [len(seen[n]) for n, _ in routers]


def rewrite_config(path, form):
    """The forms of the released checkpoints' config.json: transformers 4 style (top-level
    rope_theta, torch_dtype); Qwen3-MoE's num_experts (transformers 5 writes its
    num_local_experts), Mixtral without head_dim (transformers 5 writes null)."""
    if form is None:
        return
    cpath = os.path.join(path, "config.json")
    with open(cpath, encoding="utf-8") as f:
        cfg = json.load(f)
    rp = cfg.pop("rope_parameters")
    assert rp.get("rope_type", "default") == "default", rp
    cfg["rope_theta"] = rp["rope_theta"]
    cfg["torch_dtype"] = cfg.pop("dtype")
    if form == "qwen3_classic":
        cfg["num_experts"] = cfg.pop("num_local_experts")
        cfg["rope_scaling"] = None
    elif form == "mixtral_classic":
        assert cfg.pop("head_dim") is None
    else:
        raise ValueError(form)
    with open(cpath, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def check_layout(path, cfg):
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    h = cfg.hidden_size
    for L in range(cfg.num_hidden_layers):
        if cfg.model_type == "qwen3_moe":
            n, ff = cfg.num_experts, cfg.moe_intermediate_size
            want = {f"model.layers.{L}.mlp.gate.weight": (n, h)}
            for e in range(n):
                p = f"model.layers.{L}.mlp.experts.{e}."
                want.update({p + "gate_proj.weight": (ff, h), p + "up_proj.weight": (ff, h),
                             p + "down_proj.weight": (h, ff)})
        elif cfg.model_type == "granitemoe":
            n, ff, p = cfg.num_local_experts, cfg.intermediate_size, f"model.layers.{L}.block_sparse_moe."
            want = {p + "router.layer.weight": (n, h), p + "input_linear.weight": (n, 2 * ff, h),
                    p + "output_linear.weight": (n, h, ff)}
        else:
            n, ff = cfg.num_local_experts, cfg.intermediate_size
            want = {f"model.layers.{L}.block_sparse_moe.gate.weight": (n, h)}
            for e in range(n):
                p = f"model.layers.{L}.block_sparse_moe.experts.{e}."
                want.update({p + "w1.weight": (ff, h), p + "w3.weight": (ff, h), p + "w2.weight": (h, ff)})
        for k, shp in want.items():
            assert shapes.get(k) == shp, (k, shapes.get(k), shp)
    fused = [k for k in shapes if "gate_up_proj" in k or k.endswith("experts.down_proj")]
    assert not fused, fused
    return shapes


def main(corpus, outdir, only=None):
    gen = torch.Generator().manual_seed(SEED)
    hf_tok = hfm.train_tokenizer(corpus)
    refdir, seqs = hfm.ref_dir_and_seqs(corpus, outdir, lambda t: hf_tok(t)["input_ids"], gen)
    ids_raw = hf_tok.backend_tokenizer.encode(hfm.TOK_TEST_TEXT).ids
    for name, cfg, dtype, seed, form in model_specs():
        if only and name != only:
            continue
        path = os.path.join(outdir, name)
        model = build(cfg, seed, dtype, seqs)
        mem = logits_of(model, seqs)   # before .to(dtype), which rounds the RoPE inv_freq buffer too
        model.to(dtype).save_pretrained(path, safe_serialization=True)
        hf_tok.save_pretrained(path)
        hfm.classic_tokenizer_config(path)
        rewrite_config(path, form)
        shapes = check_layout(path, cfg)
        print(f"{name} layer 0 (expert 0 of {n_experts_of(cfg)}): " + ", ".join(
            f"{k} {list(v)}" for k, v in sorted(shapes.items()) if k.startswith("model.layers.0.")
            and (".experts.0." in k or ".experts." not in k)), file=sys.stderr)
        ref = load_fp32(path)
        assert type(ref).__name__ == {"qwen3_moe": "Qwen3MoeForCausalLM",
                                      "mixtral": "MixtralForCausalLM",
                                      "granitemoe": "GraniteMoeForCausalLM"}[cfg.model_type], type(ref)
        assert AutoTokenizer.from_pretrained(path)(hfm.TOK_TEST_TEXT)["input_ids"] == ids_raw
        # the written layout is what transformers reads: the reloaded checkpoint gives the
        # in-memory model's logits exactly
        got = logits_of(ref, seqs)
        # (GraniteMoe's: within 3e-8, one float ulp at its logits' scale, though every parameter
        # and buffer of the two is bit-equal and each alone is deterministic; the reference is
        # the reloaded model's)
        dm = max(float((a - b).abs().max()) for a, b in zip(mem, got))
        assert dm == 0 or (cfg.model_type == "granitemoe" and dm <= 1e-7), (name, dm)
        # transformers' default experts kernel (grouped_mm) agrees to rounding
        gmm = logits_of(load_fp32(path, experts=None), seqs)
        dg = max(float((a - b).abs().max()) for a, b in zip(gmm, got))
        k, n_expert = cfg.num_experts_per_tok, n_experts_of(cfg)
        (gap, gs, glayer, gpos), lgap, used = router_stats(ref, seqs, k)
        print(f"{name}: min p(k={k}) - p(k+1) = {gap:.3e} (seq {gs}, {glayer}, token {gpos}), "
              f"min logit(k) - logit(k+1) = {lgap:.3e}; distinct experts chosen per layer {used} of "
              f"{n_expert}; |eager - grouped_mm experts| <= {dg:.2e}", file=sys.stderr)
        assert gap > MIN_GAP, (name, gap)
        assert all(u == n_expert for u in used), (name, used)
        if not getattr(cfg, "norm_topk_prob", True):
            for m in routers_of(ref):
                m.norm_topk_prob = True
            dn = max(float((a - b).abs().max()) for a, b in zip(logits_of(ref, seqs), got))
            for m in routers_of(ref):
                m.norm_topk_prob = False
            print(f"{name}: renormalizing the top-k weights would move the logits by up to {dn:.3f}",
                  file=sys.stderr)
            assert dn > 0.05
        hfm.write_refs(ref, name, seqs, VOCAB, dtype, refdir)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[3] == "--only":
        main(sys.argv[1], sys.argv[2], sys.argv[4])
    elif len(sys.argv) == 3:
        main(sys.argv[1], sys.argv[2])
    else:
        sys.exit(__doc__)
