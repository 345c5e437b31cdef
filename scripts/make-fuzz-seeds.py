#!/usr/bin/env python3
"""Writes the small seed files of the fuzz corpora that no testdata file can be
(docs/RELIABILITY.md): a whole llama model in a few KB, as GGUF (tensor table and data,
and a Mixtral-style mixture of 4 experts,
the vocabulary of testdata/tokenizer/eog/named.gguf) and as a safetensors directory.
Standard library only; the layout follows ggml's docs/gguf.md and huggingface/safetensors.
  python3 scripts/make-fuzz-seeds.py        (from the repository root)"""
import json, os, random, struct, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
DIM, FFN, HEADS, KV, HD, VOCAB, LAYERS = 32, 32, 2, 1, 16, 12, 1
rnd = random.Random(15)


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv_u32(k, v): return gstr(k) + struct.pack("<II", 4, v)
def kv_f32(k, v): return gstr(k) + struct.pack("<If", 6, v)
def kv_str(k, v): return gstr(k) + struct.pack("<I", 8) + gstr(v)


def q4_0(rows, cols):
    out = b""
    for _ in range(rows * cols // 32):
        out += struct.pack("<e", 0.01 + rnd.random() * 0.02) + bytes(rnd.randrange(256) for _ in range(16))
    return out


def f32(n): return struct.pack("<%df" % n, *[1.0 + rnd.random() * 0.1 for _ in range(n)])


def tensors(moe=0):
    # (gguf name, hf name, rows, cols, gguf type, data); vectors have rows None; a stacked
    # MoE tensor (moe experts) has rows (experts, rows); moe: the experts of each layer
    t = [("token_embd.weight", "model.embed_tokens.weight", VOCAB, DIM, 2, q4_0(VOCAB, DIM)),
         ("output_norm.weight", "model.norm.weight", None, DIM, 0, f32(DIM))]
    for l in range(LAYERS):
        p, h = "blk.%d." % l, "model.layers.%d." % l
        t += [(p + "attn_norm.weight", h + "input_layernorm.weight", None, DIM, 0, f32(DIM)),
              (p + "attn_q.weight", h + "self_attn.q_proj.weight", HEADS * HD, DIM, 2, q4_0(HEADS * HD, DIM)),
              (p + "attn_k.weight", h + "self_attn.k_proj.weight", KV * HD, DIM, 2, q4_0(KV * HD, DIM)),
              (p + "attn_v.weight", h + "self_attn.v_proj.weight", KV * HD, DIM, 2, q4_0(KV * HD, DIM)),
              (p + "attn_output.weight", h + "self_attn.o_proj.weight", DIM, HEADS * HD, 2, q4_0(DIM, HEADS * HD)),
              (p + "ffn_norm.weight", h + "post_attention_layernorm.weight", None, DIM, 0, f32(DIM))]
        if moe:
            t += [(p + "ffn_gate_inp.weight", None, moe, DIM, 0, f32(moe * DIM)),
                  (p + "ffn_gate_exps.weight", None, (moe, FFN), DIM, 2, q4_0(moe * FFN, DIM)),
                  (p + "ffn_up_exps.weight", None, (moe, FFN), DIM, 2, q4_0(moe * FFN, DIM)),
                  (p + "ffn_down_exps.weight", None, (moe, DIM), FFN, 2, q4_0(moe * DIM, FFN))]
        else:
            t += [(p + "ffn_gate.weight", h + "mlp.gate_proj.weight", FFN, DIM, 2, q4_0(FFN, DIM)),
                  (p + "ffn_up.weight", h + "mlp.up_proj.weight", FFN, DIM, 2, q4_0(FFN, DIM)),
                  (p + "ffn_down.weight", h + "mlp.down_proj.weight", DIM, FFN, 2, q4_0(DIM, FFN))]
    return t


def vocab_kvs():
    """The raw tokenizer.* key/value pairs of testdata/tokenizer/eog/named.gguf."""
    d = open(os.path.join(ROOT, "testdata", "tokenizer", "eog", "named.gguf"), "rb").read()
    n_kv = struct.unpack_from("<Q", d, 16)[0]
    p, out, n = 24, b"", 0
    size = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    for _ in range(n_kv):
        start = p
        klen = struct.unpack_from("<Q", d, p)[0]
        key = d[p + 8:p + 8 + klen]
        p += 8 + klen
        t = struct.unpack_from("<I", d, p)[0]
        p += 4
        if t == 8:
            p += 8 + struct.unpack_from("<Q", d, p)[0]
        elif t == 9:
            et, cnt = struct.unpack_from("<IQ", d, p)
            p += 12
            for _ in range(cnt):
                p += (8 + struct.unpack_from("<Q", d, p)[0]) if et == 8 else size[et]
        else:
            p += size[t]
        if key.startswith(b"tokenizer."):
            out += d[start:p]
            n += 1
    return out, n


def write_gguf(path, moe=0):
    """moe > 0: a Mixtral-style model of moe experts, 2 per token, stacked as llama.cpp's converter writes them."""
    kvs = [kv_str("general.architecture", "llama"), kv_str("general.name", "fuzz seed"),
           kv_u32("llama.context_length", 256), kv_u32("llama.embedding_length", DIM),
           kv_u32("llama.block_count", LAYERS), kv_u32("llama.feed_forward_length", FFN),
           kv_u32("llama.attention.head_count", HEADS), kv_u32("llama.attention.head_count_kv", KV),
           kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5), kv_u32("llama.rope.dimension_count", HD),
           kv_u32("llama.vocab_size", VOCAB), kv_u32("general.alignment", 32)]
    if moe:
        kvs += [kv_u32("llama.expert_count", moe), kv_u32("llama.expert_used_count", 2)]
    vk, nv = vocab_kvs()
    ts = tensors(moe)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(ts), len(kvs) + nv) + b"".join(kvs) + vk
    data, off = b"", 0
    for name, _, rows, cols, typ, blob in ts:
        dims = [cols] if rows is None else [cols, rows] if isinstance(rows, int) else [cols, rows[1], rows[0]]
        head += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", x) for x in dims)
        head += struct.pack("<IQ", typ, len(data))
        data += blob + b"\0" * (-len(blob) % 32)
    head += b"\0" * (-len(head) % 32)
    with open(path, "wb") as f:
        f.write(head + data)


def safetensors(entries):
    """entries: [(name, dtype, shape, bytes)] -> the file's bytes (header padded to 8)."""
    hdr, off, data = {"__metadata__": {"format": "pt"}}, 0, b""
    for name, dt, shape, blob in entries:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(blob)]}
        off += len(blob)
        data += blob
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


# The config.json fuzz_safetensors.c holds for its model.safetensors (keep the two equal).
HF_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": DIM,
             "intermediate_size": FFN, "num_attention_heads": HEADS, "num_key_value_heads": KV,
             "num_hidden_layers": LAYERS, "rms_norm_eps": 1e-5, "max_position_embeddings": 256,
             "vocab_size": VOCAB, "tie_word_embeddings": True}


def f16(n): return struct.pack("<%de" % n, *[rnd.random() - 0.5 for _ in range(n)])


def dense_model():
    out = []
    for i, (_, name, rows, cols, _, _) in enumerate(tensors()):
        shape = [cols] if rows is None else [rows, cols]
        n = cols * (rows or 1)
        dt = ["F32", "F16", "BF16"][i % 3] if rows else "F32"
        blob = f32(n) if dt == "F32" else f16(n) if dt == "F16" else bytes(x for i2, x in enumerate(f32(n)) if i2 % 4 >= 2)
        out.append((name, dt, shape, blob))
    return out


def gptq_model(group=16):
    """GPTQ v1 (sym, no act order) linears, dense embedding and norms."""
    out = []
    for name, dt, shape, blob in dense_model():
        if len(shape) == 2 and "embed" not in name:
            rows, cols = shape
            base = name[:-len(".weight")]
            g = cols // group
            out += [(base + ".qweight", "I32", [cols // 8, rows], bytes(rnd.randrange(256) for _ in range(cols // 8 * rows * 4))),
                    (base + ".qzeros", "I32", [g, rows // 8], struct.pack("<%di" % (g * rows // 8), *[0x77777777] * (g * rows // 8))),
                    (base + ".scales", "F16", [g, rows], f16(g * rows))]
        else:
            out.append((name, dt, shape, blob))
    return out


def trim_tokenizer(src, n_keep=300):
    """A tokenizer.json cut to its first n_keep ids (and the merges among them), added
    tokens renumbered after them: the same model, normalizer and pre-tokenizer in a few KB."""
    raw = subprocess.run(["zstd", "-dc", src], check=True, capture_output=True).stdout if src.endswith(".zst") \
        else open(src, "rb").read()
    t = json.loads(raw)
    m = t["model"]
    vocab = {k: v for k, v in m["vocab"].items() if v < n_keep}
    nxt, remap = n_keep, {}
    t["added_tokens"] = t.get("added_tokens", [])[:16]
    for a in t["added_tokens"]:
        if a["id"] >= n_keep:
            remap[a["id"]] = nxt
            a["id"] = nxt
            nxt += 1
        vocab[a["content"]] = a["id"]

    def fix_ids(x):  # the post-processor names special tokens by id too
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "ids" and isinstance(v, list):
                    x[k] = [remap.get(i, i) for i in v]
                else:
                    fix_ids(v)
        elif isinstance(x, list):
            for v in x:
                fix_ids(v)
    fix_ids(t.get("post_processor"))
    m["vocab"] = vocab
    merges = []
    for mg in m.get("merges", []):
        a, b = mg.split(" ", 1) if isinstance(mg, str) else mg
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(mg)
    m["merges"] = merges
    return json.dumps(t, ensure_ascii=False, separators=(",", ":")).encode()


def stats(n_layers, cols):
    """A --save-stats file: "LLMIQST1", u32 n_layers and the 4 input dims, then per layer
    and set mean|x| and the Gram matrix's upper triangle (f32), one zstd stream."""
    raw = b"LLMIQST1" + struct.pack("<5I", n_layers, *cols)
    for _ in range(n_layers):
        for n in cols:
            raw += f32(n) + f32(n * (n + 1) // 2)
    return subprocess.run(["zstd", "-q", "-c", "-3"], input=raw, check=True, capture_output=True).stdout


def index_seeds():
    """fuzz_safetensors_index: testdata/hf/mistral-sharded's real index and the ways an
    index can be wrong (name -> bytes)."""
    src = json.load(open(os.path.join(ROOT, "testdata", "hf", "mistral-sharded", "model.safetensors.index.json")))
    wm, first = src["weight_map"], sorted(src["weight_map"])[0]
    other = {"model-00001-of-00002.safetensors": "model-00002-of-00002.safetensors"}.get(
        wm[first], "model-00001-of-00002.safetensors")
    def with_map(m): return json.dumps(dict(src, weight_map=m), indent=1).encode()
    seeds = {"valid": with_map(wm),
             "missing-tensor": with_map({k: v for k, v in wm.items() if k != first}),
             "wrong-shard": with_map(dict(wm, **{first: other})),
             "path-traversal": with_map(dict(wm, **{first: "../mistral-sharded/" + wm[first]})),
             "shard-not-safetensors": with_map(dict(wm, **{first: "config.json"})),
             "shard-missing": with_map(dict(wm, **{"model.extra.weight": "model-00003-of-00002.safetensors"})),
             "not-a-string": with_map(dict(wm, **{first: 7})),
             "no-weight-map": json.dumps({"metadata": src.get("metadata", {})}).encode()}
    seeds["duplicate-key"] = seeds["valid"].replace(b'"weight_map": {', b'"weight_map": {\n  "%s": "%s",' % (
        first.encode(), wm[first].encode()), 1)
    return seeds


def write(name, path, data):
    d = os.path.join(CORPUS, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, path), "wb") as f:
        f.write(data)


def llamacpp_template(name, fallback):
    """llama.cpp's copy of a chat template (models/templates/NAME under $LLAMACPP_TEMPLATES),
    else the fallback text, a shorter template of the same shape."""
    tpl_dir = os.environ.get("LLAMACPP_TEMPLATES", "")
    return open(os.path.join(tpl_dir, name)).read() if tpl_dir else fallback


def gguf_as_arch(src, arch):
    """The GGUF src read by gguf_edit with its llama.* keys and general.architecture renamed
    to arch's."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
    import gguf_edit
    g = gguf_edit.read(src)
    for e in g["kv"]:
        if e[0].startswith("llama."):
            e[0] = arch + e[0][len("llama"):]
        if e[0] == "general.architecture":
            e[2] = gstr(arch)
    return g


def seeds_2026_11_29():
    """SmolLM3's GGUF (arch smollm3, every 4th layer without RoPE) with Tekken's pre-tokenizer
    and Mistral v7's chat template (its default system message parsed from the template
    text); Phi-4-mini's partial RoPE (rope.dimension_count below the head size) with the
    o200k pre-tokenizer and its chat template; the o200k and Tekken tokenizer.json files with
    those templates; SmolLM3's and Phi-4-mini's config.json.  Edits of the seeds above."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
    import gguf_edit
    mistral_v7 = llamacpp_template(
        "Mistral-Small-3.2-24B-Instruct-2506.jinja",
        "{%- set today = strftime_now(\"%Y-%m-%d\") %}{%- set default_system_message = 'Today is ' + today + '.' %}"
        "{{- bos_token }}{{- '[SYSTEM_PROMPT]' + default_system_message + '[/SYSTEM_PROMPT]' }}"
        "{{- '[AVAILABLE_TOOLS]' }}{{- '[INST]' + message['content'] + '[/INST]' }}")
    phi4_mini = ("{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
                 "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")
    src = os.path.join(CORPUS, "fuzz_gguf", "tiny-llama.gguf")
    for name, arch, pre, tpl, rope_dim in (("tiny-smollm3-tekken.gguf", "smollm3", "tekken", mistral_v7, None),
                                          ("tiny-phi4mini-o200k.gguf", "phi3", "gpt-4o", phi4_mini, HD - 2)):
        g = gguf_as_arch(src, arch)
        for e in g["kv"]:
            if e[0] == arch + ".rope.dimension_count" and rope_dim:
                e[2] = struct.pack("<I", rope_dim)
        gguf_edit.set_str(g, "tokenizer.ggml.pre", pre)
        gguf_edit.set_str(g, "tokenizer.chat_template", tpl)
        if arch == "phi3":   # q/k/v as one attn_qkv, gate and up as one ffn_up, as llama.cpp's converter
            ts = []
            for t in g["tensors"]:
                n = t["name"]
                if n.endswith("attn_q.weight"):
                    k, v = gguf_edit.find(g, n.replace("attn_q", "attn_k")), gguf_edit.find(g, n.replace("attn_q", "attn_v"))
                    rows = t["dims"][1] + k["dims"][1] + v["dims"][1]
                    ts.append({"name": n.replace("attn_q", "attn_qkv"), "dims": [t["dims"][0], rows], "type": t["type"],
                               "data": q4_0(rows, t["dims"][0])})
                elif n.endswith("ffn_up.weight"):
                    ts.append({"name": n, "dims": [t["dims"][0], 2 * t["dims"][1]], "type": t["type"],
                               "data": q4_0(2 * t["dims"][1], t["dims"][0])})
                elif not (n.endswith("attn_k.weight") or n.endswith("attn_v.weight") or n.endswith("ffn_gate.weight")):
                    ts.append(t)
            g["tensors"] = ts
        gguf_edit.write(os.path.join(CORPUS, "fuzz_gguf", name), g)
    tok = os.path.join(ROOT, "testdata", "tokenizer")
    for case, tpl in (("o200k", phi4_mini), ("tekken", mistral_v7)):
        cfg = json.dumps({"add_bos_token": case == "tekken", "bos_token": "<|begin_of_text|>",
                          "eos_token": "<|end_of_text|>", "chat_template": tpl}).encode()
        write("fuzz_tokenizer_json", case, trim_tokenizer(tok + "/%s-trim/tokenizer.json.zst" % case) + b"\n#--\n" + cfg)
    hf = os.path.join(ROOT, "testdata", "hf")
    for case in ("smollm3-nope", "phi4mini-partial"):
        write("fuzz_config_json", case + ".json", open(os.path.join(hf, case, "config.json"), "rb").read())


def seeds_2026_11_29_granite():
    """Granite's GGUF (arch granite: embedding_scale, attention.scale, residual_scale,
    logit_scale; the refact pre-tokenizer) with Granite 3.3's chat template (its default
    system message read from the template text); Granite's config.json (the four
    multipliers) and GraniteMoe's (the multipliers and its experts).  Edits of the seeds above."""
    import gguf_edit
    granite = llamacpp_template(
        "ibm-granite-granite-3.3-2B-Instruct.jinja",
        "{%- set system_message = \"Knowledge Cutoff Date: April 2024. Today's Date: \" + strftime_now('%B %d, %Y')"
        " + \".\" %}{%- if tools %}{%- else %}\n {%- set system_message = system_message + \" Be helpful.\" %}"
        "{%- endif %}{{- '<|start_of_role|>system<|end_of_role|>' + system_message + '<|end_of_text|>\n' }}")
    g = gguf_as_arch(os.path.join(CORPUS, "fuzz_gguf", "tiny-llama.gguf"), "granite")
    for key, v in (("embedding_scale", 12.0), ("attention.scale", 0.125), ("residual_scale", 0.22),
                   ("logit_scale", 8.0)):
        gguf_edit.set_f32(g, "granite." + key, v)
    gguf_edit.set_str(g, "tokenizer.ggml.pre", "refact")
    gguf_edit.set_str(g, "tokenizer.chat_template", granite)
    gguf_edit.write(os.path.join(CORPUS, "fuzz_gguf", "tiny-granite.gguf"), g)
    for case in ("granite-mult", "granitemoe-tiny"):
        write("fuzz_config_json", case + ".json", open(os.path.join(ROOT, "testdata", "hf", case, "config.json"), "rb").read())


if __name__ == "__main__":
    os.makedirs(os.path.join(CORPUS, "fuzz_gguf"), exist_ok=True)
    write_gguf(os.path.join(CORPUS, "fuzz_gguf", "tiny-llama.gguf"))
    write("fuzz_safetensors", "tiny-llama.safetensors", safetensors(dense_model()))
    for case, data in index_seeds().items():
        write("fuzz_safetensors_index", case, data)
    qc = dict(HF_CONFIG, quantization_config={"bits": 4, "group_size": 16, "desc_act": False, "sym": True,
                                               "quant_method": "gptq", "checkpoint_format": "gptq"})
    tok = os.path.join(ROOT, "testdata", "tokenizer")
    hf = os.path.join(ROOT, "testdata", "hf", "llama-attn-bias")
    for case, src, cfg in [("gpt2", tok + "/gpt2-trim/tokenizer.json.zst", hf + "/tokenizer_config.json"),
                           ("llama3", tok + "/llama3-trim/tokenizer.json.zst", hf + "/tokenizer_config.json"),
                           ("qwen2", tok + "/qwen2-trim/tokenizer.json.zst", hf + "/tokenizer_config.json"),
                           ("smollm2", tok + "/smollm2/tokenizer.json", tok + "/smollm2/tokenizer_config.json"),
                           ("llama-spm", tok + "/llama-spm/tokenizer.json", tok + "/llama-spm/tokenizer_config.json")]:
        write("fuzz_tokenizer_json", case, trim_tokenizer(src) + b"\n#--\n" + open(cfg, "rb").read())
    # fuzz_tokenize: a flags byte (vocabulary, add/parse/skip special) and a reference text
    for case, vb in [("smollm2", 0), ("llama-spm", 1)]:
        refs = subprocess.run(["zstd", "-dc", tok + "/%s/refs.jsonl.zst" % case], check=True,
                              capture_output=True).stdout.decode().split("\n")
        texts = sorted({json.loads(l)["t"] for l in refs if l}, key=lambda x: (len(x.encode()), x))
        picked = [x for x in texts if 0 < len(x.encode()) <= 512][::max(1, len(texts) // 24)][:24]
        for i, x in enumerate(picked):
            write("fuzz_tokenize", "%s-%02d" % (case, i), bytes([vb | (i % 8) << 1]) + x.encode())
    write("fuzz_gptq_config", "tiny-gptq", json.dumps(qc, indent=1).encode() + b"\n#--\n" + safetensors(gptq_model()))
    write("fuzz_stats", "stats-2x8-8-8-16.zst", stats(2, [8, 8, 8, 16]))
    write("fuzz_stats", "stats-other-model.zst", stats(1, [8, 8, 8, 8]))
    # last, so the random draws of the seeds above stay as they were
    write_gguf(os.path.join(CORPUS, "fuzz_gguf", "tiny-mixtral.gguf"), moe=4)
    seeds_2026_11_29()
    seeds_2026_11_29_granite()

