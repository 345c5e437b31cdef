#!/usr/bin/env python3
"""Writes testdata/kquant/: random GGUF k-quant super-blocks (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), 5-bit
blocks (Q5_0, Q5_1, what llama-quantize's k-quant mixes fall back to) and the non-linear
IQ4_NL and IQ4_XS, and their
values as gguf-py (llama.cpp's own Python package, gguf.quants, a numpy port of ggml's
dequantize_row_q*_K) dequantizes them, for tests/test_cpu_ops.c's checks of llmi's
dequantization, packing and matmul of those types.

Not run by CI: run once, commit the output.  Needs numpy and gguf (PyPI; gguf 0.19.0).

    python3 scripts/make-kquant-refs.py testdata/kquant

Each type gets ROWS x BLOCKS super-blocks (a ROWS x 256*BLOCKS matrix, row-major as a GGUF
tensor stores it): <type>.bin, the raw blocks, and <type>.f32, the dequantized values as
little-endian float32.  The bytes are random (numpy PCG64, seed 20261128) except the fp16
super-block scales, drawn as fp16 values of magnitude 2^-12 .. 2^-4 (d positive or
negative, dmin positive, as llama-quantize writes them; negative d occurs in Q6_K, Q3_K,
Q5_0 and Q5_1, whose m is signed too), so no block holds inf or NaN.  Row 0 is special: all
scales maximal (63, 127/-128 in Q6_K, -32 in Q3_K and IQ4_XS) and all codes maximal (IQ4's
index 0, value -127), the corners of each format.  Q5_0, Q5_1 and IQ4_NL fill the same
6 x 768 matrix with blocks of 32.
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import quants

ROWS, BLOCKS, SEED = 6, 3, 20261128
LAYOUT = {  # block bytes, offsets of the fp16 scales
    "q4_k": (QT.Q4_K, 144, [0, 2]),
    "q5_k": (QT.Q5_K, 176, [0, 2]),
    "q6_k": (QT.Q6_K, 210, [208]),
    "q5_0": (QT.Q5_0, 22, [0]),
    "q5_1": (QT.Q5_1, 24, [0, 2]),
    "q3_k": (QT.Q3_K, 110, [108]),   # added last: the types above keep their random bytes
    "iq4_nl": (QT.IQ4_NL, 18, [0]),
    "iq4_xs": (QT.IQ4_XS, 136, [0]),
    "q2_k": (QT.Q2_K, 84, [80, 82]),
}


def fp16_bytes(rng, n, signed):
    mag = np.exp2(rng.uniform(-12, -4, n)).astype(np.float16)
    if signed:
        mag = mag * rng.choice(np.array([-1, 1], dtype=np.float16), n)
    return mag.view(np.uint8).reshape(n, 2)


def main(out):
    rng = np.random.Generator(np.random.PCG64(SEED))
    os.makedirs(out, exist_ok=True)
    for name, (qt, bb, scale_offs) in LAYOUT.items():
        per = 256 // 32 if name in ("q5_0", "q5_1", "iq4_nl") else 1   # blocks of 32: 8 per 256 values
        n = ROWS * BLOCKS * per
        blocks = rng.integers(0, 256, size=(n, bb), dtype=np.uint8)
        for k, off in enumerate(scale_offs):
            signed = name in ("q6_k", "q5_0", "q5_1", "q3_k", "iq4_nl", "iq4_xs")   # Q5_1's m is a signed offset too
            blocks[:, off:off + 2] = fp16_bytes(rng, n, signed)
        for b in range(BLOCKS * per):   # row 0: every scale and code at its maximum
            blk = blocks[b]
            keep = [bytes(blk[o:o + 2]) for o in scale_offs]
            blk[:] = 0xFF
            if name == "q6_k":
                blk[192:208] = np.array([127, 0x80] * 8, dtype=np.uint8)   # +127 and -128
            if name == "q3_k":
                blk[96:108] = 0   # every scale -32, the largest magnitude (codes all 7)
            if name in ("iq4_nl", "iq4_xs"):
                blk[:] = 0        # index 0 (-127), the largest magnitude; IQ4_XS's scales -32
            for o, v in zip(scale_offs, keep):
                blk[o:o + 2] = np.frombuffer(v, dtype=np.uint8)
        vals = quants.dequantize(blocks.reshape(-1), qt).astype("<f4").reshape(ROWS, BLOCKS * 256)
        assert np.isfinite(vals).all()
        blocks.tofile(os.path.join(out, name + ".bin"))
        vals.tofile(os.path.join(out, name + ".f32"))
        print(f"{name}: {ROWS} x {BLOCKS * 256}, max |value| {np.abs(vals).max():.4g}", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
