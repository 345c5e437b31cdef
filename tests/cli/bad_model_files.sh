#!/usr/bin/env bash
# Corrupt model files through the CLI under ASan/UBSan: for every bad GGUF file and bad
# Hugging Face directory, `llmi generate -m BAD -p hi -n 1` must exit 1, print exactly
# one line on stderr naming the file, and nothing on stdout.  The GGUF cases are cut
# from the real model ($MODEL; without it the test is a skip); the safetensors cases come from a tiny
# directory written here.  The files are made by a stdlib-only Python script.
set -u
BIN="${LLMI_SAN:-$(cd "$(dirname "$0")/../.." && pwd)/llmi-san}"
[ -x "$BIN" ] || { echo "no ASan binary at $BIN (make SAN=1)"; exit 77; }
command -v python3 >/dev/null || { echo "python3 not found"; exit 77; }
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:exitcode=99}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:exitcode=98}"

work=$(mktemp -d /tmp/llmi_badmodels_XXXXXX)
trap 'rm -rf "$work"' EXIT

python3 - "$work" "${MODEL:-}" "$(cd "$(dirname "$0")/../.." && pwd)" <<'PY'
import json, os, struct, sys
work, model = sys.argv[1], sys.argv[2]
cases = []   # paths to hand to -m

def put(name, data):
    p = os.path.join(work, name)
    with open(p, "wb") as f:
        f.write(data)
    cases.append(p)

def patched(buf, off, fmt, val):
    b = bytearray(buf)
    struct.pack_into("<" + fmt, b, off, val)
    return bytes(b)

# ---- GGUF cases from the real model: its header and tensor infos (first ~1.8 MB)
if model and os.path.isfile(model):
    with open(model, "rb") as f:
        head = f.read(4 << 20)
    def rs(p):
        n = struct.unpack_from("<Q", head, p)[0]
        return p + 8 + n, head[p + 8:p + 8 + n]
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    n_t, n_kv = struct.unpack_from("<QQ", head, 8)
    p, first_key, tokens_count, tokens_first = 24, 24, None, None
    for _ in range(n_kv):
        p, key = rs(p)
        t = struct.unpack_from("<I", head, p)[0]; p += 4
        if t == 9:
            et, n = struct.unpack_from("<IQ", head, p)
            if key == b"tokenizer.ggml.tokens":
                tokens_count, tokens_first = p + 4, p + 12
            p += 12
            for _ in range(n):
                if et == 8: p, _s = rs(p)
                else: p += sizes[et]
        elif t == 8: p, _s = rs(p)
        else: p += sizes[t]
    ti = p
    _, _name = rs(ti)
    ti_ndims = ti + 8 + len(_name)
    nd0 = struct.unpack_from("<I", head, ti_ndims)[0]
    ti_type = ti_ndims + 4 + 8 * nd0
    infos_end = ti
    for _ in range(n_t):
        infos_end, _n = rs(infos_end)
        nd = struct.unpack_from("<I", head, infos_end)[0]
        infos_end += 4 + 8 * nd + 4 + 8
    hdr = head[:infos_end + 64]
    put("bad_magic.gguf", b"GGUG" + head[4:4096])
    put("version0.gguf", patched(hdr, 4, "I", 0))
    put("version4.gguf", patched(hdr, 4, "I", 4))
    put("tensor_count_huge.gguf", patched(hdr, 8, "Q", 1 << 60))
    put("kv_count_huge.gguf", patched(hdr, 16, "Q", (1 << 64) - 1))
    put("key_len_huge.gguf", patched(hdr, first_key, "Q", (1 << 63) + 5))
    put("tokens_count_huge.gguf", patched(hdr, tokens_count, "Q", 1 << 61))
    put("tokens_elem_type.gguf", patched(hdr, tokens_count - 4, "I", 9))
    put("token_len_huge.gguf", patched(hdr, tokens_first, "Q", 1 << 40))
    put("ndims5.gguf", patched(hdr, ti_ndims, "I", 5))
    put("dims_overflow.gguf", patched(patched(hdr, ti_ndims + 4, "Q", 1 << 40), ti_ndims + 12, "Q", 1 << 40))
    put("type_invalid.gguf", patched(hdr, ti_type, "I", 1000))
    put("offset_huge.gguf", patched(hdr, ti_type + 4, "Q", (1 << 64) - 8))
    for cut in (0, 3, 23, 100, 5000, first_key + 40, ti + 10, infos_end - 1, infos_end + 50):
        put("cut_%d.gguf" % cut, head[:cut])
    # the whole model short by one byte: the last tensor runs past the end
    with open(model, "rb") as f:
        whole = f.read()
    put("cut_last_byte.gguf", whole[:-1])
    del whole

# ---- a tiny Mixtral-style GGUF (the fuzz seed: 4 experts stacked, 2 per token) with one
# key added or one stacked tensor's shape changed (without the seed the cases are not made,
# and the count check below fails)
seed = os.path.join(sys.argv[3], "tests/fuzz/corpus/fuzz_gguf/tiny-mixtral.gguf")
if os.path.isfile(seed):
    g = open(seed, "rb").read()
    g_sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    n_t, n_kv = struct.unpack_from("<QQ", g, 8)
    p = 24
    def g_str(p):
        n = struct.unpack_from("<Q", g, p)[0]
        return p + 8 + n, g[p + 8:p + 8 + n]
    for _ in range(n_kv):
        p, _k = g_str(p)
        t = struct.unpack_from("<I", g, p)[0]; p += 4
        if t == 9:
            et, n = struct.unpack_from("<IQ", g, p); p += 12
            for _ in range(n):
                if et == 8: p, _s = g_str(p)
                else: p += g_sizes[et]
        elif t == 8: p, _s = g_str(p)
        else: p += g_sizes[t]
    kv_end, infos = p, {}
    for _ in range(n_t):
        p, name = g_str(p)
        nd = struct.unpack_from("<I", g, p)[0]
        infos[name] = p + 4   # its dims
        p += 4 + 8 * nd + 12
    data_at = (p + 31) // 32 * 32
    def with_kv(key, val):
        kv = struct.pack("<Q", len(key)) + key.encode() + struct.pack("<II", 4, val)
        head = g[:16] + struct.pack("<Q", n_kv + 1) + g[24:kv_end] + kv + g[kv_end:p]
        return head + b"\0" * (-len(head) % 32) + g[data_at:]
    put("moe_sigmoid_gating.gguf", with_kv("llama.expert_gating_func", 2))
    put("moe_shared_experts.gguf", with_kv("llama.expert_shared_count", 1))
    put("moe_stacked_3_of_4.gguf", patched(g, infos[b"blk.0.ffn_up_exps.weight"] + 16, "Q", 3))

put("random.bin", bytes((i * 7919 + 13) % 256 for i in range(4096)))
put("empty.gguf", b"")
cases.append(os.path.join(work, "does_not_exist.gguf"))

# ---- Hugging Face directories: a tiny valid llama, then one corruption per directory
cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 1,
       "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 32,
       "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "tie_word_embeddings": True}
shapes = [("model.embed_tokens.weight", [32, 64]), ("model.norm.weight", [64]),
          ("model.layers.0.input_layernorm.weight", [64]),
          ("model.layers.0.post_attention_layernorm.weight", [64]),
          ("model.layers.0.self_attn.q_proj.weight", [64, 64]), ("model.layers.0.self_attn.k_proj.weight", [32, 64]),
          ("model.layers.0.self_attn.v_proj.weight", [32, 64]), ("model.layers.0.self_attn.o_proj.weight", [64, 64]),
          ("model.layers.0.mlp.gate_proj.weight", [96, 64]), ("model.layers.0.mlp.up_proj.weight", [96, 64]),
          ("model.layers.0.mlp.down_proj.weight", [64, 96])]

def st_bytes(entries, header_override=None, data_extra=b""):
    hdr, pos, data = {}, 0, b""
    for name, shape, dtype in entries:
        n = 4 if dtype == "F32" else 2
        for s in shape: n *= s
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + n]}
        data += bytes((pos + i) % 251 for i in range(n)) if dtype != "F32" else b"\0" * n
        pos += n
    h = header_override if header_override is not None else json.dumps(hdr).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data + data_extra

def hf_dir(name, config=cfg, st=None, extra_files=None):
    d = os.path.join(work, name)
    os.mkdir(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write(config if isinstance(config, str) else json.dumps(config))
    if st is not None:
        with open(os.path.join(d, "model.safetensors"), "wb") as f:
            f.write(st)
    for fn, data in (extra_files or {}).items():
        with open(os.path.join(d, fn), "wb") as f:
            f.write(data)
    cases.append(d)

good = [(n, s, "F16") for n, s in shapes]
valid = st_bytes(good)
hl = struct.unpack_from("<Q", valid)[0]
hf_dir("hf_header_len_huge", st=struct.pack("<Q", 1 << 40) + valid[8:])
hf_dir("hf_header_len_past_end", st=struct.pack("<Q", len(valid)) + valid[8:])
hf_dir("hf_not_json", st=st_bytes(good, header_override=b"{not json"))
hf_dir("hf_not_utf8", st=st_bytes(good, header_override=b'{"\xff": 1}'))
hf_dir("hf_trailing_data", st=valid + b"x")
hf_dir("hf_truncated", st=valid[:-7])
hf_dir("hf_cut_header", st=valid[:hl // 2])
ov = json.loads(valid[8:8 + hl])
first = shapes[1][0]
ov[first]["data_offsets"] = [0, ov[first]["data_offsets"][1] - ov[first]["data_offsets"][0]]
hf_dir("hf_overlap", st=st_bytes(good, header_override=json.dumps(ov).encode()))
dup = valid[8:8 + hl].rstrip().decode()
dup = dup[:-1] + ', "model.norm.weight": {"dtype": "F16", "shape": [64], "data_offsets": [0, 128]}}'
hf_dir("hf_duplicate", st=st_bytes(good, header_override=dup.encode()))
hf_dir("hf_bad_dtype", st=st_bytes([(n, s, "I16" if n.endswith("up_proj.weight") else "F16") for n, s in shapes]))
hf_dir("hf_missing_tensor", st=st_bytes([e for e in good if "down_proj" not in e[0]]))
hf_dir("hf_wrong_shape", st=st_bytes([(n, [s[1], s[0]] if "gate_proj" in n else s, t) for n, s, t in good]))
hf_dir("hf_layers_too_many", config=dict(cfg, num_hidden_layers=100000), st=valid)
hf_dir("hf_bad_arch", config=dict(cfg, architectures=["GPT2LMHeadModel"]), st=valid)
hf_dir("hf_rope_yarn", config=dict(cfg, rope_scaling={"rope_type": "yarn", "factor": 4.0}), st=valid)
hf_dir("hf_config_not_json", config="{\"architectures\": [", st=valid)
hf_dir("hf_no_weights", st=None)
hf_dir("hf_index_escape", st=None, extra_files={"model.safetensors.index.json":
       json.dumps({"weight_map": {"model.norm.weight": "../../etc/passwd"}}).encode()})

# ---- a tiny Qwen3-MoE (3 experts, 2 per token, one tensor per expert), one corruption each
moe_cfg = {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96, "moe_intermediate_size": 32,
           "num_experts": 3, "num_experts_per_tok": 2, "norm_topk_prob": True, "vocab_size": 32,
           "max_position_embeddings": 128, "tie_word_embeddings": True}
moe_shapes = [(n, s) for n, s in shapes if "mlp." not in n]
moe_shapes += [("model.layers.0.self_attn.q_norm.weight", [16]), ("model.layers.0.self_attn.k_norm.weight", [16]),
               ("model.layers.0.mlp.gate.weight", [3, 64])]
for e in range(3):
    moe_shapes += [("model.layers.0.mlp.experts.%d.gate_proj.weight" % e, [32, 64]),
                   ("model.layers.0.mlp.experts.%d.up_proj.weight" % e, [32, 64]),
                   ("model.layers.0.mlp.experts.%d.down_proj.weight" % e, [64, 32])]
moe_good = [(n, s, "F16") for n, s in moe_shapes]
hf_dir("hf_moe_missing_expert", config=moe_cfg, st=st_bytes([e for e in moe_good if "experts.2.up" not in e[0]]))
hf_dir("hf_moe_expert_shape", config=moe_cfg,
       st=st_bytes([(n, [33, 64] if "experts.1.gate" in n else s, t) for n, s, t in moe_good]))
hf_dir("hf_moe_expert_dtype", config=moe_cfg,
       st=st_bytes([(n, s, "BF16" if "experts.1.down" in n else t) for n, s, t in moe_good]))
hf_dir("hf_moe_no_router", config=moe_cfg, st=st_bytes([e for e in moe_good if "mlp.gate.weight" not in e[0]]))
hf_dir("hf_moe_topk_too_many", config=dict(moe_cfg, num_experts_per_tok=4), st=st_bytes(moe_good))
hf_dir("hf_moe_dense_layers", config=dict(moe_cfg, mlp_only_layers=[0]), st=st_bytes(moe_good))

with open(os.path.join(work, "cases.txt"), "w") as f:
    f.write("\n".join(cases) + "\n")
PY
[ -s "$work/cases.txt" ] || { echo "case generator failed"; exit 1; }

fails=0; n=0
while IFS= read -r f; do
  n=$((n + 1))
  "$BIN" generate --device cpu -m "$f" -p hi -n 1 >"$work/out" 2>"$work/err"
  rc=$?
  name=$(basename "$f")
  lines=$(wc -l <"$work/err")
  problem=""
  [ "$rc" -eq 1 ] || problem="exit $rc, expected 1"
  [ -z "$problem" ] && [ -s "$work/out" ] && problem="stdout not empty"
  [ -z "$problem" ] && [ "$lines" -ne 1 ] && problem="$lines lines on stderr"
  [ -z "$problem" ] && ! grep -qF "$name" "$work/err" && problem="stderr does not name $name"
  if [ -n "$problem" ]; then
    echo "FAIL $name: $problem"; head -c 2000 "$work/err" | sed 's/^/    /'
    fails=$((fails + 1))
  else
    echo "ok   $name: $(cat "$work/err")"
  fi
done <"$work/cases.txt"
echo "$n cases, $fails failed"
[ "$n" -ge 20 ] || { echo "too few cases generated"; exit 1; }
[ "$fails" -eq 0 ] || exit 1
# The GGUF cases are cut from the model: without it they did not run, a skip, not a pass.
[ -f "${MODEL:-}" ] || { echo "GGUF cases not run: default model missing (${MODEL:-})"; exit 77; }
exit 0
