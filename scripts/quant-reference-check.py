#!/usr/bin/env python3
"""Independent dequantization of llmi's GPTQ / AWQ checkpoints with the published packages'
own unpacking code, for tests/test_quant_io.c (quant_testdata_checkpoints).

  GPTQ: auto_gptq 0.7.1, auto_gptq/nn_modules/qlinear/qlinear_cuda.py, QuantLinear.forward
        (its torch fallback path: unpack qweight/qzeros, zeros + 1, scales[g_idx] * (w - z[g_idx]))
        run on an identity input, so its output is the dequantized weight.
  AWQ:  autoawq 0.2.9, awq/utils/packing_utils.py, dequantize_gemm.

Neither package is imported whole (they need CUDA torch); the two module files are taken
from the PyPI distributions and run against a small numpy stand-in for the few torch
operations they use (below), with scales given as float32 (QuantLinear's weight_dtype
option; dequantize_gemm keeps the scales' dtype) so the products are exact fp32 like llmi's.

    pip download --no-deps auto-gptq==0.7.1          # wheel (cp311 manylinux)
    pip download --no-deps --no-binary :all: autoawq==0.2.9
    python3 scripts/quant-reference-check.py --gptq-wheel auto_gptq-0.7.1-*.whl \
        --awq-sdist autoawq-0.2.9.tar.gz testdata/quant

writes testdata/quant/ref/<case>.layers.<l>.<linear>.f32: (out, in) little-endian float32,
the layout of llmi's tensor_dequant_row.  With --check it instead compares against the
existing files and exits 1 on any difference.
"""
import argparse
import glob
import io
import json
import os
import struct
import sys
import tarfile
import types
import zipfile

import numpy as np


# ---------------------------------------------------------------- numpy stand-in for torch
class _Dev:
    type = "cpu"

    def __eq__(self, o):
        return True

    def __ne__(self, o):
        return False


_DEV = _Dev()
_DT = {"int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
       "float16": np.float16, "float32": np.float32}


class Tensor:
    def __init__(self, a):
        self.a = np.asarray(a)

    device = _DEV
    shape = property(lambda s: s.a.shape)
    dtype = property(lambda s: s.a.dtype.type)

    def _u(x):
        return x.a if isinstance(x, Tensor) else x

    def to(self, d):
        if isinstance(d, type) and issubclass(d, np.generic):
            return Tensor(self.a.astype(d))  # wraps like torch's integer casts
        return self

    def long(self):
        return Tensor(self.a.astype(np.int64))

    def float(self):
        return Tensor(self.a.astype(np.float32))

    def view(self, *s):
        return Tensor(self.a.reshape(*s))

    reshape = view

    def unsqueeze(self, d):
        return Tensor(np.expand_dims(self.a, d))

    def expand(self, *s):
        shape = tuple(self.a.shape[i] if v == -1 else v for i, v in enumerate(s))
        return Tensor(np.broadcast_to(self.a, shape))

    def repeat_interleave(self, n, dim=0):
        return Tensor(np.repeat(self.a, n, axis=dim))

    def __getitem__(self, k):
        if isinstance(k, tuple):
            k = tuple(Tensor._u(x) for x in k)
        else:
            k = Tensor._u(k)
        return Tensor(self.a[k])

    def __sub__(self, o):
        return Tensor(self.a - Tensor._u(o))

    def __add__(self, o):
        return Tensor(self.a + Tensor._u(o))

    def __mul__(self, o):
        return Tensor(self.a * Tensor._u(o))

    __rmul__ = __mul__


def _torch_module():
    t = types.ModuleType("torch")
    t.Tensor = Tensor
    for k, v in _DT.items():
        setattr(t, k, v)
    t.tensor = lambda x, dtype=None: Tensor(np.array(x, dtype=dtype))
    t.zeros = lambda shape, dtype=None: Tensor(np.zeros(shape, dtype=dtype))
    t.arange = lambda *a, dtype=None, device=None: Tensor(np.arange(*a, dtype=dtype or np.int64))
    t.bitwise_right_shift = lambda x, s: Tensor(np.right_shift(Tensor._u(x), Tensor._u(s)))
    t.bitwise_and = lambda x, m: Tensor(np.bitwise_and(Tensor._u(x), Tensor._u(m)))
    t.unsqueeze = lambda x, d: Tensor(np.expand_dims(Tensor._u(x), d))
    t.matmul = lambda x, y: Tensor(Tensor._u(x) @ Tensor._u(y))
    t.cat = lambda xs, dim=0: Tensor(np.concatenate([Tensor._u(x) for x in xs], axis=dim))
    nn = types.ModuleType("torch.nn")

    class Module:
        def __init__(self):
            pass

        def register_buffer(self, name, val):
            setattr(self, name, val)

    nn.Module = Module
    t.nn = nn
    return t, nn


def _load_module(name, source):
    torch, nn = _torch_module()
    saved = {k: sys.modules.get(k) for k in ("torch", "torch.nn", "transformers")}
    sys.modules.update({"torch": torch, "torch.nn": nn, "transformers": types.ModuleType("transformers")})
    try:
        m = types.ModuleType(name)
        exec(compile(source, name, "exec"), m.__dict__)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return m


def load_gptq(wheel):
    with zipfile.ZipFile(wheel) as z:
        src = z.read("auto_gptq/nn_modules/qlinear/qlinear_cuda.py").decode()
    return _load_module("qlinear_cuda", src)


def load_awq(sdist):
    with tarfile.open(sdist) as t:
        member = next(m for m in t.getmembers() if m.name.endswith("awq/utils/packing_utils.py"))
        src = t.extractfile(member).read().decode()
    return _load_module("packing_utils", src)


# ---------------------------------------------------------------- safetensors (container only)
def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    dts = {"F16": np.float16, "F32": np.float32, "I32": np.int32, "BF16": np.uint16}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, en = e["data_offsets"]
        out[name] = np.frombuffer(data[base + b:base + en], dtype=dts[e["dtype"]]).reshape(e["shape"])
    return out


LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def dequant_case(d, gptq_mod, awq_mod):
    cfg = json.load(open(os.path.join(d, "config.json")))
    q = cfg["quantization_config"]
    t = read_safetensors(os.path.join(d, "model.safetensors"))
    res = {}
    for l in range(cfg["num_hidden_layers"]):
        for lin in LINEARS:
            p = f"model.layers.{l}.{lin}"
            if q["quant_method"] == "awq":
                w = awq_mod.dequantize_gemm(Tensor(t[p + ".qweight"]), Tensor(t[p + ".qzeros"]),
                                            Tensor(t[p + ".scales"].astype(np.float32)), q["bits"], q["group_size"])
                w = w.a  # (in, out)
            else:
                assert q.get("checkpoint_format", "gptq") == "gptq"
                qw = t[p + ".qweight"]
                infeatures, outfeatures = qw.shape[0] * 32 // q["bits"], qw.shape[1]
                ql = gptq_mod.QuantLinear(q["bits"], q["group_size"], infeatures, outfeatures, False,
                                          weight_dtype=np.float32)
                ql.qweight = Tensor(qw)
                ql.qzeros = Tensor(t[p + ".qzeros"])
                ql.scales = Tensor(t[p + ".scales"].astype(np.float32))
                ql.g_idx = Tensor(t[p + ".g_idx"])
                eye = Tensor(np.eye(infeatures, dtype=np.float32))
                w = ql.forward(eye).a  # identity @ W = W, (in, out)
            res[f"layers.{l}.{lin}"] = np.ascontiguousarray(w.T.astype(np.float32))
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gptq-wheel", required=True)
    ap.add_argument("--awq-sdist", required=True)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("dir")
    a = ap.parse_args()
    gptq_mod, awq_mod = load_gptq(glob.glob(a.gptq_wheel)[0]), load_awq(glob.glob(a.awq_sdist)[0])
    refdir = os.path.join(a.dir, "ref")
    os.makedirs(refdir, exist_ok=True)
    bad = 0
    for case in ("gptq", "gptq-actorder", "awq"):
        for k, w in dequant_case(os.path.join(a.dir, case), gptq_mod, awq_mod).items():
            path = os.path.join(refdir, f"{case}.{k}.f32")
            if a.check:
                old = np.fromfile(path, dtype="<f4").reshape(w.shape)
                if not np.array_equal(old.view(np.uint32), w.view(np.uint32)):
                    print(f"differs: {path}")
                    bad += 1
            else:
                w.astype("<f4").tofile(path)
        print(f"{case}: ok")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
