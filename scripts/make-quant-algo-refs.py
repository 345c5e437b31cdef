#!/usr/bin/env python3
"""make-quant-algo-refs.py — the reference algorithms' answers on one small fixed layer, for
tests/test_quant_ref.c (docs/TESTING.md O16, O17, O19: mutations of llmi's GPTQ and AWQ
searches that no perplexity bound sees).

  make-quant-algo-refs.py OUTDIR        (writes OUTDIR/*.f32, *.u8 and OUTDIR/cases.json)

One synthetic layer: inputs X (512 tokens, 128 columns) with the structure that matters in
real models (a few outlier channels, correlated features, little independent noise, so the
Hessian has small eigenvalues and the dampening matters), weights W (64, 128) with heavy
tails (so clipping pays).  Then:

- GPTQ: fasterquant of IST-DASLab/gptq@2d65066 as transcribed in scripts/gptq-reference.py
  (fp32, torch; the one change: scales rounded to fp16 before the zero and q are chosen, as
  the checkpoint stores them and as llmi's grid rule does — with fp32 scales near-ties flip
  0.5-2.5 % of q, which GPTQ then carries along the row), on H = 2/n X^T X, group 32 and block 32 (every group starts a block, where
  the reference's block-stale W and llmi's updated weights coincide), damp 0.01: sym, sym
  act-order, asym.  Written: the int4 values q (64, 128) u8, scales (4, 64) f32, zeros
  (4, 64) u8 (true zero, not minus one), and the output error tr(D H D^T) / tr(W H W^T).
- AWQ clip: llm-awq's auto_clip_layer (mit-han-lab/llm-awq awq/quantize/auto_clip.py at
  460d6d4 with pseudo_quantize_tensor of awq/quantize/quantizer.py at 02c1dd6: zero point,
  n_grid 20, max_shrink 0.5, all 512 tokens) re-expressed in torch: per output row and
  group of 32, the max_val = amax (1 - i/20), i < 10, of lowest mean squared group output
  error (scales again rounded to fp16; with fp32 ones 11 of the 256 choices differ from llmi's,
  near-equal losses).  Written: best max_val (64, 4) f32.
Inputs written: w.f32 (64, 128) and h.f32 = X^T X / n (128, 128), summed in fp64 and stored
as fp32 (what llmi's Gram accumulation gives, up to rounding); X itself is not needed.
"""
import importlib.util, json, os, sys
import numpy as np
import torch

torch.set_grad_enabled(False)
spec = importlib.util.spec_from_file_location("gref", os.path.join(os.path.dirname(__file__), "gptq-reference.py"))
gref = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gref)

ROWS, COLS, NTOK, GS = 64, 128, 512, 32


def make_layer(seed=20261123):
    r = np.random.default_rng(seed)
    mix = r.standard_normal((6, COLS))
    f = r.standard_normal((NTOK, 6))
    x = f @ mix + 0.05 * r.standard_normal((NTOK, COLS)) * (1 + np.arange(COLS) % 5)
    x[:, [3, 40, 77]] *= 20.0                       # outlier channels, as after an RMSNorm with spiky weights
    w = 0.02 * r.standard_t(4, (ROWS, COLS))       # heavy tails: clipping a group's extremes can pay
    return x.astype(np.float32), w.astype(np.float32)


class Lin:
    def __init__(self, w):
        self.weight = torch.nn.Parameter(torch.from_numpy(w.copy()))


def gptq_case(w, h, sym, act_order):
    g = gref.GPTQ(Lin(w))
    g.quantizer = gref.Quantizer(4, sym, fp16_scale=True)
    g.H = torch.from_numpy(2.0 * h)
    Q, qi, sc, zr, gi = g.fasterquant(GS, blocksize=GS, percdamp=0.01, actorder=act_order)
    d = w.astype(np.float64) - Q.double().numpy()
    hd = h.astype(np.float64)
    err = float(np.sum((d @ hd) * d) / np.sum((w.astype(np.float64) @ hd) * w))
    return qi.numpy().astype(np.uint8), sc.numpy().astype(np.float32), zr.numpy().astype(np.uint8), \
        gi.numpy().astype(np.int32), err


def awq_pseudo_quantize(w):
    """zero-point int4 of each row of w (n, group) — llm-awq pseudo_quantize_tensor."""
    mx, mn = w.amax(1, keepdim=True), w.amin(1, keepdim=True)
    s = ((mx - mn).clamp(min=1e-5) / 15).half().float()     # fp16, as stored (see the docstring)
    z = (-torch.round(mn / s)).clamp(0, 15)
    return (torch.clamp(torch.round(w / s) + z, 0, 15) - z) * s


def awq_clip(w, x, n_grid=20, max_shrink=0.5):
    """llm-awq auto_clip_layer: best max_val per (row, group)."""
    wt, xt = torch.from_numpy(w), torch.from_numpy(x)
    wg = wt.reshape(ROWS, 1, -1, GS)                # co, 1, n_group, gs
    xg = xt.reshape(1, NTOK, -1, GS)                # 1, n_token, n_group, gs (all 512 tokens: step 1)
    amax = wg.abs().amax(-1, keepdim=True)
    best, min_err = amax.clone(), torch.full_like(amax, 1e9)
    org = (xg * wg).sum(-1)                         # co, n_token, n_group
    for i in range(int(max_shrink * n_grid)):
        mv = amax * (1 - i / n_grid)
        q = awq_pseudo_quantize(torch.clamp(wg, -mv, mv).reshape(-1, GS)).reshape(wg.shape)
        err = ((xg * q).sum(-1) - org).pow(2).mean(1).view(min_err.shape)
        better = err < min_err
        min_err[better], best[better] = err[better], mv[better]
    return best.reshape(ROWS, -1).numpy().astype(np.float32)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    x, w = make_layer()
    h = (x.astype(np.float64).T @ x.astype(np.float64) / NTOK).astype(np.float32)
    for name, a in (("w", w), ("h", h)):
        a.tofile(os.path.join(out, f"{name}.f32"))
    cases = {}
    for name, sym, act in (("gptq-sym", True, False), ("gptq-sym-actorder", True, True), ("gptq-asym", False, False)):
        q, sc, zr, gi, err = gptq_case(w, h, sym, act)
        q.tofile(os.path.join(out, f"{name}.q.u8"))
        sc.tofile(os.path.join(out, f"{name}.scales.f32"))
        zr.tofile(os.path.join(out, f"{name}.zeros.u8"))
        cases[name] = {"sym": sym, "act_order": act, "group_size": GS, "block_size": GS, "damp": 0.01, "err": err}
        if act:
            gi.tofile(os.path.join(out, f"{name}.g_idx.i32"))
        print(f"{name}: output error {err:.6e}")
    mv = awq_clip(w, x)
    mv.tofile(os.path.join(out, "awq-clip.max_val.f32"))
    frac = float(np.mean(mv < np.abs(w).reshape(ROWS, -1, GS).max(-1) * (1 - 1e-6)))
    cases["awq-clip"] = {"group_size": GS, "n_grid": 20, "max_shrink": 0.5, "clipped_share": frac}
    print(f"awq-clip: {100 * frac:.1f}% of (row, group) clipped")
    json.dump({"rows": ROWS, "cols": COLS, "tokens": NTOK, "cases": cases,
               "torch": torch.__version__, "numpy": np.__version__}, open(os.path.join(out, "cases.json"), "w"),
              indent=1)


if __name__ == "__main__":
    main()
