#!/usr/bin/env python3
"""A GGUF whose quantized weights are dequantized and rounded to bf16, as llmi's CUDA backend
holds them (docs/CUDA.md: Q4_1, Q8_0 and the other GGUF types it does not serve packed become
bf16 at load; Q4_0 is served packed, exactly).

Why: the CPU backend computes with a GGUF's quantized weights exactly but quantizes the
activations of every quantized matmul to Q8 blocks (llama.cpp's rule), where the GPU rounds
the weights to bf16 and keeps the activations unquantized.  On SmolLM2 Q4_1 the two land
0.47% apart in WikiText-2 perplexity; the CPU backend run on this file (bf16 weights, f32
activations) is the GPU's own computation done on the CPU, so gpu-check holds the GPU to it
much more tightly (its "same bf16 weights" perplexity row).

Dequantization by gguf-py (gguf.quants.dequantize, the llama.cpp project's Python package:
an implementation llmi did not write), rounding to bf16 by round-to-nearest-even (what
__float2bfloat16_rn does on the device).  Tensors that are F32 in the input (norms) stay
F32; every other tensor becomes BF16.  Metadata (tokenizer included) is copied as it is.

  python3 scripts/make-bf16-gguf.py IN.gguf OUT.gguf        (pip install gguf numpy)
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter


def bf16_bits(x):
    """float32 array -> uint16 bf16 bits, round to nearest even (no NaN in weights)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + (((u >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: make-bf16-gguf.py IN.gguf OUT.gguf")
    from gguf import quants
    r = GGUFReader(sys.argv[1])
    w = GGUFWriter(sys.argv[2], r.fields["general.architecture"].contents())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        t = f.types[0]
        if t == GGUFValueType.ARRAY:
            w.add_array(name, f.contents())
        elif t == GGUFValueType.STRING:
            w.add_string(name, f.contents())
        else:
            w.add_key_value(name, f.contents(), t)
    for t in r.tensors:
        shape = [int(v) for v in reversed(t.shape)]   # gguf lists the innermost dimension first
        x = quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        if t.tensor_type == GGMLQuantizationType.F32:
            w.add_tensor(t.name, x, raw_dtype=GGMLQuantizationType.F32)
        else:
            w.add_tensor(t.name, bf16_bits(x), raw_shape=shape, raw_dtype=GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
