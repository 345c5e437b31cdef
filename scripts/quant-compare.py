#!/usr/bin/env python3
"""quant-compare.py A_DIR B_DIR — how close two llmi quantize outputs of the same model and
settings are (e.g. --device cpu against --device cuda): per tensor kind, the share of
identical int32 words (qweight/qzeros/g_idx) and the largest relative difference of the fp16
scales.  Standard library only (runs on a bare GPU machine); never on llmi's path."""
import json, struct, sys


def read(path):
    with open(path + "/model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        return h, f.read()


(ha, da), (hb, db) = read(sys.argv[1]), read(sys.argv[2])
names = sorted(k for k in ha if k != "__metadata__")
if names != sorted(k for k in hb if k != "__metadata__"):
    sys.exit("quant-compare: the two directories hold different tensors")
same = {}
worst_scale = 0.0
for k in names:
    a0, a1 = ha[k]["data_offsets"]
    b0, b1 = hb[k]["data_offsets"]
    x, y = da[a0:a1], db[b0:b1]
    kind = k.rsplit(".", 1)[-1]
    if ha[k]["dtype"] == "I32":
        wx, wy = struct.unpack(f"<{len(x) // 4}I", x), struct.unpack(f"<{len(y) // 4}I", y)
        eq = sum(1 for p, q in zip(wx, wy) if p == q)
        s = same.setdefault(kind, [0, 0])
        s[0] += eq
        s[1] += len(wx)
    elif kind == "scales":
        fx, fy = struct.unpack(f"<{len(x) // 2}e", x), struct.unpack(f"<{len(y) // 2}e", y)
        for p, q in zip(fx, fy):
            if p != q:
                worst_scale = max(worst_scale, abs(p - q) / max(abs(p), abs(q)))
print(" ".join(f"{k} {100.0 * v[0] / max(v[1], 1):.3f}% same" for k, v in sorted(same.items()))
      + f"; scales max rel diff {worst_scale:.3g}")
