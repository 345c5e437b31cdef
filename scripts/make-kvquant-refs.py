#!/usr/bin/env python3
"""Reference data for llmi's quantized KV cache (tests/test_kv_quant.c), from
implementations llmi does not share code with:
  - fp8 e4m3: ml_dtypes.float8_e4m3fn (the OCP "fn" format NVIDIA's FP8 uses), round to
    nearest even; inputs are clamped to +-448 first, as llmi (and CUDA's satfinite) saturate;
  - q8: gguf-py's Q8_0 quantizer ("bit-exact same results as reference implementation in
    ggml-quants.c"), llama.cpp's -ctk/-ctv q8_0 format.
Usage: python3 scripts/make-kvquant-refs.py testdata/kvquant/refs.json
(provenance in docs/REFERENCES.md)"""
import json, sys
import numpy as np
import ml_dtypes, gguf
from gguf.quants import quantize, GGMLQuantizationType

rng = np.random.default_rng(20261123)
out = {"tool": f"ml_dtypes {ml_dtypes.__version__}, gguf {gguf.__version__ if hasattr(gguf, '__version__') else '0.19.0'}, numpy {np.__version__}"}

# every e4m3 code and its value (NaN as null)
codes = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
out["e4m3_decode"] = [None if np.isnan(v) else float(v) for v in codes]

# encode: random magnitudes over the whole range, exact representable values, midpoints (ties)
finite = np.array([v for v in codes if np.isfinite(v)], dtype=np.float32)
pos = np.unique(finite[finite > 0])
mids = ((pos[:-1].astype(np.float64) + pos[1:]) / 2).astype(np.float32)   # exact in fp32
xs = np.concatenate([
    rng.standard_normal(1500).astype(np.float32) * 4,
    (np.exp2(rng.uniform(-13, 10, 1500)) * rng.choice([-1, 1], 1500)).astype(np.float32),
    pos, -pos, mids, -mids,
    np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(0)),
    np.array([0.0, -0.0, 448.0, 449.0, 463.9, 464.0, 500.0, 1e9, -1e9, 2.0**-10, 2.0**-9 * 0.5, 2.0**-9 * 0.5000001],
             dtype=np.float32),
]).astype(np.float32)
clamped = np.clip(xs, -448, 448)
enc = clamped.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
out["e4m3_encode"] = [[float(x), int(b)] for x, b in zip(xs, enc)]

# q8_0 blocks: varied scales, a zero block, values landing on .5 after scaling
blocks = []
for i in range(48):
    s = float(np.exp2(rng.uniform(-8, 6)))
    blocks.append(rng.standard_normal(32).astype(np.float32) * s)
blocks.append(np.zeros(32, dtype=np.float32))
b = np.arange(-16, 16, dtype=np.float32) + 0.5
b[0] = -127.0                     # amax 127: d = 1 exactly, the rest are exact ties
blocks.append(b)
blocks.append(np.full(32, 1e-30, dtype=np.float32))
x = np.stack(blocks).astype(np.float32)
q = quantize(x.reshape(-1, 32), GGMLQuantizationType.Q8_0)   # (n_blocks, 34) bytes
out["q8_0"] = [{"x": [float(v) for v in xb], "bytes": [int(v) for v in qb]} for xb, qb in zip(x, q)]

with open(sys.argv[1], "w") as f:
    json.dump(out, f)
print(f"{len(out['e4m3_encode'])} e4m3 encodings, {len(out['q8_0'])} q8_0 blocks -> {sys.argv[1]}")
