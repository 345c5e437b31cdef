#!/usr/bin/env python3
"""transformers on the shapes `llmi bench --dummy llama-3-8b` runs, for the side-by-side
rows of docs/PERF.md: a Llama-3-8B-shaped LlamaForCausalLM with random bf16 weights on the
GPU, greedy generate() with the static KV cache (no torch.compile: the eager baseline most
users run), random prompt ids.

    hf-bench.py [--quick]     prints one line per figure, e.g.
        hf_decode_b1_tps 41.2      decode tok/s at batch 1 (prompt 512, 128 new tokens)
        hf_ttft_p2048_ms 151.3     one 2048-token prefill + first token
        hf_decode_b16_tps 530.8    decode tok/s summed over 16 sequences (prompt 512, 128 new)
Exits 3 (after saying why) without torch, transformers or a GPU.  Each figure is the
median of 3 timed runs after a warm-up.  --quick: the smollm2-135m shape instead.
"""
import sys
import time

LLAMA3_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                 rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                    rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)


def main(argv):
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"hf-bench: {e}")
        return 3
    if not torch.cuda.is_available():
        print("hf-bench: torch sees no CUDA device")
        return 3
    shape = SMOLLM2_135M if "--quick" in argv else LLAMA3_8B
    cfg = transformers.LlamaConfig(**shape)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(cfg)
    model.eval()
    print(f"hf_transformers_version {transformers.__version__}")

    def run(batch, prompt, new):
        ids = torch.randint(0, cfg.vocab_size, (batch, prompt), device="cuda")
        with torch.no_grad():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, cache_implementation="static", pad_token_id=0)
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    def median(f, reps=3):
        f()   # warm-up: kernels, cache allocation
        return sorted(f() for _ in range(reps))[reps // 2]

    ttft512 = median(lambda: run(1, 512, 1))
    full = median(lambda: run(1, 512, 128))
    print(f"hf_decode_b1_tps {127 / max(full - ttft512, 1e-9):.1f}")
    print(f"hf_ttft_p2048_ms {median(lambda: run(1, 2048, 1)) * 1e3:.1f}")
    t16 = median(lambda: run(16, 512, 1))
    f16 = median(lambda: run(16, 512, 128))
    print(f"hf_decode_b16_tps {16 * 127 / max(f16 - t16, 1e-9):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
