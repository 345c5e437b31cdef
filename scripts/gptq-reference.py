#!/usr/bin/env python3
"""gptq-reference.py — the reference GPTQ beside llmi's, on the same inputs (issue 13, docs/REFERENCES.md).

The algorithm is the GPTQ authors' published one, transcribed from IST-DASLab/gptq at commit
2d65066 (gptq.py GPTQ.add_batch / fasterquant, quant.py Quantizer.find_params / quantize,
llama.py llama_sequential with --true-sequential): H accumulated in fp32 as a running
2/n X^T X, dead inputs pinned, damp = percdamp * mean(diag H), Cholesky -> cholesky_inverse ->
upper Cholesky, 128-column blocks, group parameters from the block-stale W when a group starts,
layers in order with the sub-groups [k,v,q], [o], [up,gate], [down] each fed through the
already-quantized ones.  AutoGPTQ (0.7.1) and GPTQModel need CUDA to quantize, so they were
not used.  Runs on the CPU with torch; never on llmi's path.

Inputs are llmi's: the SmolLM2 GGUF dequantized by transformers (gguf-py), the calibration
windows tokenized by the HF tokenizer.json (equal to llmi's) and drawn by llmi's seeded
shuffle (cli/cmd_quantize.c qc_windows, reproduced below).

  gptq-reference.py quantize --gguf M --tokenizer DIR --calib FILE --nsamples 64 --seqlen 512
                    --group-size 64 --like LLMI_GPTQ_DIR --out REF_DIR
      writes REF_DIR: LLMI_GPTQ_DIR's files with every linear replaced by the reference's
      grid (GPTQ v1: fp16 scales, zeros stored minus one), so llmi loads both the same way.
      --save-stats FILE: the Hessians the reference saw, as an llmi statistics file, so that
      `llmi quantize --load-stats FILE` runs llmi's algorithm on exactly the reference's inputs;
      --load-stats FILE: the reference's fasterquant on the Hessians of such a file (no forward).
      --reverse-windows: the same windows fed in reverse order (H summed in another order: the
      reference's own rounding noise).  --fresh-params: group parameters from the in-block-
      updated weights, as llmi takes them, instead of the reference's block-stale W.
      --fp16-scales: scales rounded to fp16 before the zero and q are chosen, as llmi does.
  gptq-reference.py compare --gguf M --tokenizer DIR --heldout wiki.test.raw CKPT...
      per linear, tr(D H D^T) / tr(W H W^T) with D = W - Q under the fp model's input Gram
      matrices of held-out text (64 x 512 tokens from byte 200000 of the file), and the
      perplexity of each checkpoint's weights in transformers by llama.cpp's rule
      (512-token windows, BOS first if the GGUF adds one, second half scored, 40 windows;
      --windows and --chunks make it smaller for a smoke test; --chunks 0: no perplexity).
      --json FILE writes the per-linear errors and perplexities; --grams FILE caches the
      held-out Gram matrices between runs.
  gptq-reference.py agree CKPT_A CKPT_B [-v]
      the share of int4 values and of scales that differ between two checkpoints, per linear.
  gptq-reference.py ratios --json CMP.json [--json ...] A/B ...
      per linear type, the distribution of held-out error(A) / error(B) (A, B: checkpoint
      directory names in the compare files).
"""
import argparse, json, math, os, shutil, struct, sys, time
import numpy as np
import torch
import torch.nn as nn

torch.set_grad_enabled(False)


# ---- inputs -----------------------------------------------------------------------------------
def load_model(gguf_path):
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(os.path.dirname(os.path.abspath(gguf_path)),
                                             gguf_file=os.path.basename(gguf_path), torch_dtype=torch.float32)
    m.config.use_cache = False
    return m.eval()


def tokenize(tok_dir, path, strip_last_newline=False):
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    text = open(path, encoding="utf-8").read()
    if strip_last_newline and text.endswith("\n"):
        text = text[:-1]
    return t.encode(text, add_special_tokens=False).ids


def llmi_windows(ids, n_windows, seqlen, seed):
    """cmd_quantize.c qc_windows: non-overlapping windows, xorshift64 Fisher-Yates over slots."""
    M = (1 << 64) - 1
    slots = len(ids) // seqlen
    assert slots >= n_windows, f"{len(ids)} tokens is too short for {n_windows} windows of {seqlen}"
    perm = list(range(slots))
    s = 0x9E3779B97F4A7C15 ^ seed
    for i in range(slots - 1, 0, -1):
        s ^= (s << 13) & M
        s ^= s >> 7
        s ^= (s << 17) & M
        j = s % (i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return torch.tensor([ids[perm[w] * seqlen:(perm[w] + 1) * seqlen] for w in range(n_windows)])


# ---- the reference algorithm (IST-DASLab/gptq quant.py, gptq.py) --------------------------------
def quantize(x, scale, zero, maxq):
    q = torch.clamp(torch.round(x / scale) + zero, 0, maxq)
    return scale * (q - zero)


class Quantizer:
    def __init__(self, bits, sym, fp16_scale=False):
        """fp16_scale: round the scale to fp16 before the zero and q are chosen, as the
        checkpoint stores it (llmi's grid rule); the reference keeps it in fp32."""
        self.maxq, self.sym, self.fp16_scale = torch.tensor(2 ** bits - 1), sym, fp16_scale

    def find_params(self, x):   # perchannel=True, weight=True, mse=False
        tmp = torch.zeros(x.shape[0])
        xmin = torch.minimum(x.min(1)[0], tmp)
        xmax = torch.maximum(x.max(1)[0], tmp)
        if self.sym:
            xmax = torch.maximum(torch.abs(xmin), xmax)
            tmp = xmin < 0
            if torch.any(tmp):
                xmin[tmp] = -xmax[tmp]
        tmp = (xmin == 0) & (xmax == 0)
        xmin[tmp], xmax[tmp] = -1, +1
        self.scale = (xmax - xmin) / self.maxq
        if self.fp16_scale:
            self.scale = self.scale.half().float()
        self.zero = torch.full_like(self.scale, (self.maxq + 1) / 2) if self.sym else torch.round(-xmin / self.scale)
        self.scale, self.zero = self.scale.reshape(-1, 1), self.zero.reshape(-1, 1)


class GPTQ:
    def __init__(self, layer):
        self.layer = layer
        self.columns = layer.weight.shape[1]
        self.H = torch.zeros((self.columns, self.columns))
        self.nsamples = 0
        self.xabs, self.ntok = torch.zeros(self.columns, dtype=torch.float64), 0   # for --save-stats

    def add_batch(self, inp):
        inp = inp.reshape((-1, inp.shape[-1]))
        self.xabs += inp.abs().double().sum(0)
        self.ntok += inp.shape[0]
        inp = inp.t()
        tmp = 1
        self.H *= self.nsamples / (self.nsamples + tmp)
        self.nsamples += tmp
        inp = math.sqrt(2 / self.nsamples) * inp.float()
        self.H += inp.matmul(inp.t())

    def fasterquant(self, groupsize, blocksize=128, percdamp=.01, actorder=False, fresh_params=False):
        """fresh_params: group parameters from the in-block-updated weights (llmi's choice)
        instead of the block-stale W (the reference's).  Returns (Q fake-quantized, qint, scales (ng, rows), zeros (ng, rows), g_idx) as the
        reference computes them; the recording of per-group parameters is AutoGPTQ's."""
        W = self.layer.weight.data.clone().float()
        H = self.H
        dead = torch.diag(H) == 0
        H[dead, dead] = 1
        W[:, dead] = 0
        if actorder:
            perm = torch.argsort(torch.diag(H), descending=True)
            W, H = W[:, perm], H[perm][:, perm]
            invperm = torch.argsort(perm)
        Q, Qint = torch.zeros_like(W), torch.zeros_like(W)
        damp = percdamp * torch.mean(torch.diag(H))
        diag = torch.arange(self.columns)
        H[diag, diag] += damp
        H = torch.linalg.cholesky(H)
        H = torch.cholesky_inverse(H)
        Hinv = torch.linalg.cholesky(H, upper=True)
        scales, zeros = [], []
        for i1 in range(0, self.columns, blocksize):
            i2 = min(i1 + blocksize, self.columns)
            W1 = W[:, i1:i2].clone()
            Q1, Qi1, Err1 = torch.zeros_like(W1), torch.zeros_like(W1), torch.zeros_like(W1)
            Hinv1 = Hinv[i1:i2, i1:i2]
            for i in range(i2 - i1):
                w, d = W1[:, i], Hinv1[i, i]
                if (i1 + i) % groupsize == 0:
                    if fresh_params:
                        self.quantizer.find_params(torch.cat([W1[:, i:], W[:, i2:]], 1)[:, :groupsize])
                    else:
                        self.quantizer.find_params(W[:, (i1 + i):(i1 + i + groupsize)])
                    scales.append(self.quantizer.scale.flatten().clone())
                    zeros.append(self.quantizer.zero.flatten().clone())
                sc, zr = self.quantizer.scale, self.quantizer.zero
                q = quantize(w.unsqueeze(1), sc, zr, self.quantizer.maxq).flatten()
                Qi1[:, i] = torch.clamp(torch.round(w.unsqueeze(1) / sc) + zr, 0, self.quantizer.maxq).flatten()
                Q1[:, i] = q
                err1 = (w - q) / d
                W1[:, i:] -= err1.unsqueeze(1).matmul(Hinv1[i, i:].unsqueeze(0))
                Err1[:, i] = err1
            Q[:, i1:i2], Qint[:, i1:i2] = Q1, Qi1
            W[:, i2:] -= Err1.matmul(Hinv[i1:i2, i2:])
        g_idx = torch.tensor([i // groupsize for i in range(self.columns)], dtype=torch.int32)
        if actorder:
            Q, Qint, g_idx = Q[:, invperm], Qint[:, invperm], g_idx[invperm]
        return Q, Qint.to(torch.int64), torch.stack(scales), torch.stack(zeros), g_idx


def sequential(model, windows, args, stats=None):
    """llama.py llama_sequential with true_sequential, one window per forward."""
    layers = model.model.layers
    n = windows.shape[0]
    inps, cache = [None] * n, {"i": 0}

    class Catcher(nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, inp, *a, **kw):
            inps[cache["i"]] = inp
            cache["i"] += 1
            cache["kw"] = kw
            raise ValueError

    layers[0] = Catcher(layers[0])
    for j in range(n):
        try:
            model(windows[j:j + 1])
        except ValueError:
            pass
    layers[0] = layers[0].module
    kw = cache["kw"]
    outs = [None] * n

    def run(layer, x):
        y = layer(x, **kw)
        return y[0] if isinstance(y, tuple) else y

    grids = {}
    order = [["self_attn.k_proj", "self_attn.v_proj", "self_attn.q_proj"], ["self_attn.o_proj"],
             ["mlp.up_proj", "mlp.gate_proj"], ["mlp.down_proj"]]
    for i, layer in enumerate(layers):
        t0 = time.time()
        full = {name: mod for name, mod in layer.named_modules() if isinstance(mod, nn.Linear)}
        for names in order:
            g = {name: GPTQ(full[name]) for name in names}
            for name in names:
                g[name].quantizer = Quantizer(4, args.sym, args.fp16_scales)
            hs = [full[name].register_forward_hook(lambda m, inp, out, name=name: g[name].add_batch(inp[0].data))
                  for name in names]
            for j in range(n):
                outs[j] = run(layer, inps[j])
            for h in hs:
                h.remove()
            if stats is not None:   # llmi's statistics file: mean|x| and the upper triangle of X^T X / n
                g0 = g[names[0]]
                gram = (g0.H.double() * (g0.nsamples / 2.0 / g0.ntok)).numpy().astype(np.float32)
                stats.write((g0.xabs / g0.ntok).numpy().astype(np.float32).tobytes())
                stats.write(gram[np.triu_indices(gram.shape[0])].tobytes())
            for name in names:
                Q, qi, sc, zr, gi = g[name].fasterquant(args.group_size, percdamp=args.damp, actorder=args.act_order,
                                                        fresh_params=args.fresh_params)
                full[name].weight.data = Q.to(full[name].weight.dtype)
                grids[f"model.layers.{i}.{name}"] = (qi.to(torch.uint8), sc, zr, gi)
                del g[name].H
        for j in range(n):
            outs[j] = run(layer, inps[j])
        inps, outs = outs, inps
        print(f"reference: layer {i + 1}/{len(layers)} {time.time() - t0:.1f}s", file=sys.stderr, flush=True)
    return grids


# ---- checkpoints ------------------------------------------------------------------------------------
def st_read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        data = f.read()
    dt = {"I32": np.int32, "F16": np.float16, "F32": np.float32}
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], dt[v["dtype"]]).reshape(v["shape"])
            for k, v in h.items() if k != "__metadata__"}


def st_write(path, tensors):
    hdr, off, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    names = {np.dtype(np.int32): "I32", np.dtype(np.float16): "F16", np.dtype(np.float32): "F32"}
    for k in sorted(tensors):
        b = np.ascontiguousarray(tensors[k]).tobytes()
        hdr[k] = {"dtype": names[tensors[k].dtype], "shape": list(tensors[k].shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    hj = json.dumps(hdr, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj)
        for b in blobs:
            f.write(b)


def pack_gptq_v1(qint, scales, zeros, g_idx):
    """FORMATS.md: qweight (in/8, out) along the input axis, qzeros (ng, out/8) of zero-1 along
    the output axis, fp16 scales (ng, out), g_idx (in)."""
    q = qint.numpy().astype(np.uint32).T          # (in, out)
    qw = np.zeros((q.shape[0] // 8, q.shape[1]), np.uint32)
    for j in range(8):
        qw |= q[j::8, :] << (4 * j)
    z = (zeros.numpy().astype(np.int64) - 1).astype(np.uint32)   # (ng, out)
    qz = np.zeros((z.shape[0], z.shape[1] // 8), np.uint32)
    for j in range(8):
        qz |= z[:, j::8] << (4 * j)
    return qw.view(np.int32), qz.view(np.int32), scales.numpy().astype(np.float16), g_idx.numpy().astype(np.int32)


def unpack_gptq_v1(t, prefix):
    qw, qz = t[prefix + ".qweight"].view(np.uint32), t[prefix + ".qzeros"].view(np.uint32)
    sc, gi = t[prefix + ".scales"].astype(np.float32), t[prefix + ".g_idx"]
    q = np.zeros((qw.shape[0] * 8, qw.shape[1]), np.int64)
    for j in range(8):
        q[j::8, :] = (qw >> (4 * j)) & 15
    z = np.zeros((qz.shape[0], qz.shape[1] * 8), np.int64)
    for j in range(8):
        z[:, j::8] = (qz >> (4 * j)) & 15
    return ((q - (z[gi, :] + 1)) * sc[gi, :]).T.astype(np.float64)   # (out, in), what llmi serves


# ---- evaluation ----------------------------------------------------------------------------------------
LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj"]


def heldout_grams(model, windows):
    grams = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        for name in ["self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"]:
            mod = layer.get_submodule(name)
            key = (i, name)

            def hook(m, inp, out, key=key):
                x = inp[0].reshape(-1, inp[0].shape[-1]).double()
                grams[key] = grams.get(key, 0) + x.t() @ x
            hooks.append(mod.register_forward_hook(hook))
    for j in range(windows.shape[0]):
        model(windows[j:j + 1])
    for h in hooks:
        h.remove()
    return grams


def ppl_llamacpp(model, ids, bos, n_ctx=512, chunks=40):
    nll, cnt = 0.0, 0
    for c in range(min(chunks, len(ids) // n_ctx)):
        tok = list(ids[c * n_ctx:(c + 1) * n_ctx])
        if bos >= 0:
            tok[0] = bos
        logits = model(torch.tensor([tok])).logits[0].double()
        lp = torch.log_softmax(logits, -1)
        for p in range(n_ctx // 2, n_ctx - 1):
            nll -= lp[p, ids[c * n_ctx + p + 1]].item()
            cnt += 1
    return math.exp(nll / cnt), cnt


def read_llmi_stats(path):
    """llmi's statistics file (quant/calib_stats.c): per layer and input set mean|x| and the
    upper triangle of X^T X / n; returns [[gram (cols, cols) fp32] * 4] * n_layers."""
    import subprocess
    raw = subprocess.run(["zstd", "-dc", path], check=True, capture_output=True).stdout
    assert raw[:8] == b"LLMIQST1", f"{path}: not an llmi statistics file"
    hdr = struct.unpack("<5I", raw[8:28])
    off, out = 28, []
    for _ in range(hdr[0]):
        sets = []
        for n in hdr[1:]:
            off += 4 * n
            nt = n * (n + 1) // 2
            tri = np.frombuffer(raw[off:off + 4 * nt], np.float32)
            off += 4 * nt
            g = np.zeros((n, n), np.float32)
            g[np.triu_indices(n)] = tri
            g = g + np.triu(g, 1).T
            sets.append(g)
        out.append(sets)
    assert off == len(raw), f"{path}: {len(raw) - off} bytes past the statistics"
    return out


def from_stats(model, stats, args):
    """The reference's fasterquant on given Hessians (H = 2 X^T X / n): no calibration
    forward, so two quantizers can be compared on exactly the same inputs."""
    sets = {"self_attn.k_proj": 0, "self_attn.v_proj": 0, "self_attn.q_proj": 0, "self_attn.o_proj": 1,
            "mlp.up_proj": 2, "mlp.gate_proj": 2, "mlp.down_proj": 3}
    grids = {}
    for i, layer in enumerate(model.model.layers):
        t0 = time.time()
        for name, k in sets.items():
            g = GPTQ(layer.get_submodule(name))
            g.quantizer = Quantizer(4, args.sym, args.fp16_scales)
            g.H = torch.from_numpy(2.0 * stats[i][k])
            Q, qi, sc, zr, gi = g.fasterquant(args.group_size, percdamp=args.damp, actorder=args.act_order,
                                              fresh_params=args.fresh_params)
            grids[f"model.layers.{i}.{name}"] = (qi.to(torch.uint8), sc, zr, gi)
        print(f"reference: layer {i + 1}/{len(model.model.layers)} {time.time() - t0:.1f}s (from statistics)",
              file=sys.stderr, flush=True)
    return grids


def cmd_quantize(a):
    model = load_model(a.gguf)
    if a.load_stats:
        t0 = time.time()
        grids = from_stats(model, read_llmi_stats(a.load_stats), a)
        print(f"reference: {time.time() - t0:.0f}s", file=sys.stderr)
        return write_like(a, grids)
    ids = tokenize(a.tokenizer, a.calib)
    windows = llmi_windows(ids, a.nsamples, a.seqlen, a.seed)
    if a.reverse_windows:   # the same tokens, H summed in the other order: the reference's own rounding noise
        windows = windows.flip(0)
    print(f"reference: {a.nsamples} windows x {a.seqlen} tokens of {a.calib} ({len(ids)} tokens)", file=sys.stderr)
    t0 = time.time()
    stats = None
    if a.save_stats:
        c = model.config
        stats = open(a.save_stats + ".raw", "wb")
        stats.write(b"LLMIQST1" + struct.pack("<5I", c.num_hidden_layers, c.hidden_size,
                                              c.num_attention_heads * (c.hidden_size // c.num_attention_heads),
                                              c.hidden_size, c.intermediate_size))
    grids = sequential(model, windows, a, stats)
    if stats is not None:
        stats.close()
        os.system(f"zstd -q -f --rm '{a.save_stats}.raw' -o '{a.save_stats}'")
    print(f"reference: {time.time() - t0:.0f}s", file=sys.stderr)
    torch.save(grids, a.out.rstrip("/") + ".grids.pt")   # the grids survive a failure below
    write_like(a, grids)


def write_like(a, grids):
    t = st_read(os.path.join(a.like, "model.safetensors"))
    for prefix, (qi, sc, zr, gi) in grids.items():
        qw, qz, s16, g = pack_gptq_v1(qi, sc, zr, gi)
        for suf, v in (("qweight", qw), ("qzeros", qz), ("scales", s16), ("g_idx", g)):
            assert t[f"{prefix}.{suf}"].shape == v.shape, (prefix, suf, v.shape)
            t[f"{prefix}.{suf}"] = v
    os.makedirs(a.out, exist_ok=True)
    for fn in os.listdir(a.like):
        if fn != "model.safetensors":
            shutil.copy(os.path.join(a.like, fn), a.out)
    qc = json.load(open(os.path.join(a.out, "quantize_config.json")))
    qc["quantizer"] = "IST-DASLab/gptq@2d65066 (scripts/gptq-reference.py)"
    json.dump(qc, open(os.path.join(a.out, "quantize_config.json"), "w"), indent=2)
    st_write(os.path.join(a.out, "model.safetensors"), t)


def cmd_compare(a):
    model = load_model(a.gguf)
    W = {f"model.layers.{i}.{n}": layer.get_submodule(n).weight.data.double().numpy()
         for i, layer in enumerate(model.model.layers) for n in LINEARS}
    raw = open(a.heldout, "rb").read()[200000:].decode("utf-8", "ignore")
    tmp = "/tmp/gptq-reference-heldout.txt"
    open(tmp, "w", encoding="utf-8").write(raw)
    ho = tokenize(a.tokenizer, tmp)
    n = min(a.windows, len(ho) // 512)
    if a.grams and os.path.exists(a.grams):
        grams = torch.load(a.grams)
    else:
        grams = heldout_grams(model, torch.tensor([ho[j * 512:(j + 1) * 512] for j in range(n)]))
        if a.grams:
            torch.save(grams, a.grams)
    cks = [st_read(os.path.join(c, "model.safetensors")) for c in a.ckpt]
    print(f"held-out: {n} x 512 tokens of {a.heldout} from byte 200000; relative output error per linear")
    print("layer linear " + " ".join(os.path.basename(c.rstrip('/')) for c in a.ckpt))
    logs = np.zeros(len(cks))
    per_linear, ppl = [], {}
    worse = []
    setof = {"self_attn.q_proj": "self_attn.q_proj", "self_attn.k_proj": "self_attn.q_proj",
             "self_attn.v_proj": "self_attn.q_proj", "self_attn.o_proj": "self_attn.o_proj",
             "mlp.gate_proj": "mlp.gate_proj", "mlp.up_proj": "mlp.gate_proj", "mlp.down_proj": "mlp.down_proj"}
    L = len(model.model.layers)
    for i in range(L):
        for nme in LINEARS:
            H = grams[(i, setof[nme])].numpy()
            w = W[f"model.layers.{i}.{nme}"]
            den = np.sum((w @ H) * w)
            es = []
            for t in cks:
                d = w - unpack_gptq_v1(t, f"model.layers.{i}.{nme}")
                es.append(np.sum((d @ H) * d) / den)
            logs += np.log(es)
            per_linear.append({"layer": i, "linear": nme, "err": [float(e) for e in es]})
            if len(es) > 1 and es[1] > 0 and es[0] / es[1] > 1.05:
                worse.append((i, nme, es[0] / es[1]))
            print(f"{i:2d} {nme:17s} " + " ".join(f"{e:.3e}" for e in es), flush=True)
    print("geo-mean error / first checkpoint's:", " ".join(f"{v:.3f}" for v in np.exp((logs - logs[0]) / (L * 7))))
    if len(cks) > 1:
        print(f"linears where {a.ckpt[0]} is > 5% worse than {a.ckpt[1]}: {len(worse)} of {L * 7}")
        for i, nme, r in worse:
            print(f"  layer {i} {nme}: x{r:.3f}")
    report = {"ckpt": a.ckpt, "heldout_windows": int(n), "per_linear": per_linear, "ppl": ppl}
    if a.json:
        json.dump(report, open(a.json, "w"), indent=1)
    if a.chunks == 0:
        return
    # perplexity in transformers, llama.cpp's rule, with each checkpoint's served weights
    from gguf import GGUFReader
    r = GGUFReader(a.gguf)
    fld = r.fields.get("tokenizer.ggml.add_bos_token")
    add_bos = bool(fld.parts[fld.data[0]][0]) if fld else False
    bos = int(r.fields["tokenizer.ggml.bos_token_id"].parts[-1][0]) if add_bos else -1
    ids = tokenize(a.tokenizer, a.heldout, strip_last_newline=True)
    p, cnt = ppl_llamacpp(model, ids, bos, chunks=a.chunks)
    print(f"transformers ppl (llama.cpp rule, {a.chunks} x 512, {cnt} predictions): fp {p:.4f}", flush=True)
    ppl["fp"] = p
    for c, t in zip(a.ckpt, cks):
        for i, layer in enumerate(model.model.layers):
            for nme in LINEARS:
                layer.get_submodule(nme).weight.data = torch.from_numpy(
                    unpack_gptq_v1(t, f"model.layers.{i}.{nme}")).float()
        p, _ = ppl_llamacpp(model, ids, bos, chunks=a.chunks)
        print(f"transformers ppl: {c} {p:.4f}", flush=True)
        ppl[c] = p
        if a.json:
            json.dump(report, open(a.json, "w"), indent=1)


def cmd_agree(a):
    """How much two checkpoints' grids agree, per linear: the share of q and of scales that differ."""
    ta, tb = st_read(os.path.join(a.a, "model.safetensors")), st_read(os.path.join(a.b, "model.safetensors"))
    layers = sorted({int(k.split(".")[2]) for k in ta if k.endswith(".qweight")})

    def q_of(t, prefix):
        qw = t[prefix + ".qweight"].view(np.uint32)
        return np.stack([(qw >> (4 * j)) & 15 for j in range(8)], 1).reshape(-1, qw.shape[1])

    per = {n: [] for n in LINEARS}
    for i in layers:
        for n in LINEARS:
            p = f"model.layers.{i}.{n}"
            dq = float(np.mean(q_of(ta, p) != q_of(tb, p)))
            ds = float(np.mean(ta[p + ".scales"] != tb[p + ".scales"]))
            per[n].append((dq, ds))
            if a.verbose:
                print(f"{i:2d} {n:17s} q differ {100 * dq:6.2f}%  scales differ {100 * ds:6.2f}%")
    print(f"{a.a} vs {a.b}: share of q (and of scales) that differ, layer 0 | median over layers | max")
    for n in LINEARS:
        v = np.array(per[n])
        print(f"  {n:17s} q {100 * v[0, 0]:6.2f}% | {100 * np.median(v[:, 0]):6.2f}% | {100 * v[:, 0].max():6.2f}%"
              f"   scales {100 * v[0, 1]:6.2f}% | {100 * np.median(v[:, 1]):6.2f}% | {100 * v[:, 1].max():6.2f}%")


def cmd_ratios(a):
    """Per linear type, the distribution of err(A) / err(B) from compare --json files."""
    err = {}
    for fn in a.json:
        r = json.load(open(fn))
        for e in r["per_linear"]:
            for c, v in zip(r["ckpt"], e["err"]):
                err.setdefault(os.path.basename(c.rstrip("/")), {})[(e["layer"], e["linear"])] = v
    for pair in a.pairs:
        x, y = pair.split("/")
        keys = sorted(set(err[x]) & set(err[y]))
        rat = {k: err[x][k] / err[y][k] for k in keys}
        allr = np.array(list(rat.values()))
        print(f"{x} / {y}: held-out error ratio over {len(keys)} linears: geo-mean {np.exp(np.mean(np.log(allr))):.3f}, "
              f"median {np.median(allr):.3f}, max {allr.max():.3f}, > 1.05: {int((allr > 1.05).sum())}, "
              f"< 1/1.05: {int((allr < 1 / 1.05).sum())}")
        for n in LINEARS:
            v = np.array([rat[k] for k in keys if k[1] == n])
            worst = max((k for k in keys if k[1] == n), key=lambda k: rat[k])
            print(f"  {n:17s} geo-mean {np.exp(np.mean(np.log(v))):.3f} median {np.median(v):.3f} "
                  f"min {v.min():.3f} max {v.max():.3f} (layer {worst[0]})  > 1.05: {int((v > 1.05).sum())}/{len(v)}")
        if a.verbose:
            for k in keys:
                if rat[k] > 1.05:
                    print(f"    layer {k[0]:2d} {k[1]:17s} x{rat[k]:.3f}  ({err[x][k]:.3e} vs {err[y][k]:.3e})")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("quantize")
    q.add_argument("--gguf", required=True)
    q.add_argument("--tokenizer", required=True)
    q.add_argument("--calib", help="calibration text (not with --load-stats)")
    q.add_argument("--nsamples", type=int, default=64)
    q.add_argument("--seqlen", type=int, default=512)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--group-size", type=int, default=64)
    q.add_argument("--damp", type=float, default=0.01)
    q.add_argument("--asym", dest="sym", action="store_false")
    q.add_argument("--act-order", action="store_true")
    q.add_argument("--fresh-params", action="store_true",
                   help="group parameters from the in-block-updated weights (llmi's choice), not the block-stale W")
    q.add_argument("--fp16-scales", action="store_true",
                   help="round each scale to fp16 before its zero and q are chosen (llmi's grid rule)")
    q.add_argument("--load-stats", help="quantize from an llmi statistics file (no calibration forward)")
    q.add_argument("--save-stats", help="also write the Hessians the reference saw as an llmi --load-stats file")
    q.add_argument("--reverse-windows", action="store_true", help="feed the windows in reverse order")
    q.add_argument("--like", required=True)
    q.add_argument("--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--gguf", required=True)
    c.add_argument("--tokenizer", required=True)
    c.add_argument("--heldout", required=True)
    c.add_argument("--windows", type=int, default=64, help="held-out windows of 512 tokens")
    c.add_argument("--chunks", type=int, default=40, help="perplexity windows of 512 tokens")
    c.add_argument("--grams", help="cache of the held-out Gram matrices (torch.save), made if missing")
    c.add_argument("--json", help="write the per-linear errors and perplexities here")
    c.add_argument("ckpt", nargs="+")
    g = sub.add_parser("agree")
    g.add_argument("a")
    g.add_argument("b")
    g.add_argument("-v", "--verbose", action="store_true")
    rr = sub.add_parser("ratios")
    rr.add_argument("--json", action="append", required=True, help="a compare --json file (repeatable)")
    rr.add_argument("-v", "--verbose", action="store_true", help="list every linear above 1.05")
    rr.add_argument("pairs", nargs="+", help="A/B: checkpoint directory basenames")
    a = ap.parse_args()
    {"quantize": cmd_quantize, "compare": cmd_compare, "agree": cmd_agree, "ratios": cmd_ratios}[a.cmd](a)


if __name__ == "__main__":
    main()
