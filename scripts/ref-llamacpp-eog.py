#!/usr/bin/env python3
"""Reference data for llmi's end-of-generation rule (src/tok/tok_eog.c): which token ids
llama.cpp's vocabulary loader treats as end-of-generation.

  scripts/ref-llamacpp-eog.py write OUTDIR
      writes small vocabulary-only GGUF files (SentencePiece vocabularies, no tensors), one
      per case of the rule: texts of every token type, FIM spellings, ids named by keys,
      and llama.cpp's two exceptions.
  scripts/ref-llamacpp-eog.py ref EOG_BIN OUTDIR [EXTRA.gguf ...]
      runs EOG_BIN (a program linked against llama.cpp that prints, per file given, the
      ids llama_vocab_is_eog() accepts; see docs/REFERENCES.md) on every .gguf in OUTDIR and
      the extra files, and writes OUTDIR/eog.json: {file name: [ids]}.

No third-party Python packages: the GGUF writer below follows the GGUF v3 layout.
"""
import json
import os
import struct
import subprocess
import sys

T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR = 4, 5, 6, 7, 8, 9


def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _val(t, v):
    if t == T_U32:
        return struct.pack("<I", v)
    if t == T_I32:
        return struct.pack("<i", v)
    if t == T_F32:
        return struct.pack("<f", v)
    if t == T_BOOL:
        return struct.pack("<?", v)
    if t == T_STR:
        return _str(v)
    raise ValueError(t)


def write_gguf(path, kvs):
    """kvs: list of (key, type, value); arrays as (key, T_ARR, (elem_type, [values]))."""
    out = [b"GGUF", struct.pack("<IQQ", 3, 0, len(kvs))]
    for key, t, v in kvs:
        out.append(_str(key) + struct.pack("<I", t))
        if t == T_ARR:
            et, items = v
            out.append(struct.pack("<IQ", et, len(items)) + b"".join(_val(et, x) for x in items))
        else:
            out.append(_val(t, v))
    with open(path, "wb") as f:
        f.write(b"".join(out))


def vocab_gguf(path, tokens, types, eos, extra=()):
    """A llama-architecture, SentencePiece ("llama") vocabulary with the given tokens."""
    n = len(tokens)
    kvs = [
        ("general.architecture", T_STR, "llama"),
        ("general.name", T_STR, os.path.basename(path)),
        ("llama.context_length", T_U32, 256),
        ("llama.embedding_length", T_U32, 64),
        ("llama.block_count", T_U32, 1),
        ("llama.feed_forward_length", T_U32, 128),
        ("llama.attention.head_count", T_U32, 4),
        ("llama.attention.head_count_kv", T_U32, 4),
        ("llama.attention.layer_norm_rms_epsilon", T_F32, 1e-5),
        ("llama.rope.dimension_count", T_U32, 16),
        ("llama.vocab_size", T_U32, n),
        ("tokenizer.ggml.model", T_STR, "llama"),
        ("tokenizer.ggml.tokens", T_ARR, (T_STR, tokens)),
        ("tokenizer.ggml.scores", T_ARR, (T_F32, [-float(i) for i in range(n)])),
        ("tokenizer.ggml.token_type", T_ARR, (T_I32, types)),
        ("tokenizer.ggml.unknown_token_id", T_U32, 0),
        ("tokenizer.ggml.bos_token_id", T_U32, 1),
        ("tokenizer.ggml.eos_token_id", T_U32, eos),
    ]
    kvs += [(k, T_U32, v) for k, v in extra]
    write_gguf(path, kvs)


SPACE = "\u2581"
# (file, tokens, types, eos, extra keys); types: 1 normal, 2 unknown, 3 control
CASES = [
    ("rule.gguf",
     ["<unk>", "<s>", "</s>", "<|im_end|>", "<reponame>", "<|repo|>", "<end_of_turn>", "<|fim_pad|>",
      "<|file_sep|>", "hello", "<|start|>", SPACE],
     [2, 3, 3, 1, 3, 3, 1, 3, 3, 1, 3, 1], 2, ()),
    ("named.gguf",
     ["<unk>", "<s>", "</s>", "<|im_end|>", "<reponame>", "<|repo|>", "<end_of_turn>", "<|fim_pad|>",
      "<|file_sep|>", "hello", "<|start|>", SPACE],
     [2, 3, 3, 1, 3, 3, 1, 3, 3, 1, 3, 1], 2,
     (("tokenizer.ggml.eot_token_id", 9), ("tokenizer.ggml.fim_pad_token_id", 10))),
    ("harmony.gguf", ["<unk>", "<s>", "<|end|>", "<|return|>", "<|call|>", SPACE], [2, 3, 3, 3, 3, 1], 3, ()),
    ("end-kept.gguf", ["<unk>", "<s>", "<|end|>", "<|return|>", "x", SPACE], [2, 3, 3, 3, 1, 1], 3, ()),
    ("solar.gguf", ["<unk>", "<s>", "<|end|>", "<|calls|>", "<|flush|>", SPACE], [2, 3, 3, 3, 3, 1], 3, ()),
    ("tool-response.gguf", ["<unk>", "<s>", "</s>", "<|tool_response>", SPACE], [2, 3, 3, 3, 1], 2, ()),
]


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "write":
        os.makedirs(sys.argv[2], exist_ok=True)
        for name, toks, types, eos, extra in CASES:
            vocab_gguf(os.path.join(sys.argv[2], name), toks, types, eos, extra)
        return
    if len(sys.argv) >= 4 and sys.argv[1] == "ref":
        eog_bin, outdir = sys.argv[2], sys.argv[3]
        files = [os.path.join(outdir, c[0]) for c in CASES] + sys.argv[4:]
        res = subprocess.run([eog_bin] + files, check=True, capture_output=True, text=True).stdout
        ref = {}
        for line in res.splitlines():
            path, _, rest = line.partition(":")
            ids = [int(x.split("(")[0]) for x in rest.split()]
            ref[os.path.basename(path)] = ids
        with open(os.path.join(outdir, "eog.json"), "w") as f:
            json.dump(ref, f, indent=1, sort_keys=True)
            f.write("\n")
        print(json.dumps(ref, sort_keys=True))
        return
    sys.exit(__doc__)


if __name__ == "__main__":
    main()
