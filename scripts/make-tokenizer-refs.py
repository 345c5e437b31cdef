#!/usr/bin/env python3
"""Builds testdata/tokenizer/: Hugging Face tokenizer directories and the reference
encodings llmi's tokenizer must reproduce exactly (tests/test_tokenizer.c).

References come from Hugging Face `tokenizers` (ids, decode) and jinja2 (chat templates);
nothing here is llmi code.  Run from the repository root:

    pip install tokenizers transformers gguf sentencepiece protobuf jinja2 zstandard
    python3 scripts/make-tokenizer-refs.py

Outputs (see testdata/tokenizer/PROVENANCE.md):
  smollm2/        tokenizer.json + tokenizer_config.json + generation_config.json rebuilt
                  from the SmolLM2-135M-Instruct GGUF with SmolLM2's HF settings
  llama-spm/      tokenizer.json + tokenizer_config.json made by transformers' GGUF converter
                  from llama.cpp's ggml-vocab-llama-spm.gguf, and that .gguf itself
  llama3-trim/, qwen2-trim/, gpt2-trim/
                  tokenizer.json.zst: the first TRIM ids of llama.cpp's vocab files with the
                  Llama-3 / Qwen2 / GPT-2 pre-tokenizers (trimmed to keep the repo small)
  */refs.jsonl.zst one JSON object per line:
        t   text
        a   add_special used for "ids" (absent = false)
        ids encode(t, add_special_tokens=a) with special tokens parsed
        np  ids with special-token strings encoded as text (only when it differs)
        d   decode(ids) when it differs from t;  ds  decode(ids, skip_special) when != d
  llama-spm/refs-legacy.jsonl.zst
                  the same for the legacy Llama-2 form (normalizer Prepend+Replace), which is
                  what llama.cpp does with the .gguf vocab: llmi's GGUF path is checked on it
  chat.jsonl      jinja2 renderings of real chat templates (name, template, system, user, bos, out)
"""
import json
import os
import random
import sys
import unicodedata

import zstandard
from gguf import GGUFReader
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

SEED = 20261121
N_STRINGS = 2200
TRIM = 12000
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "testdata", "tokenizer")
SMOL_GGUF = os.environ.get("LLMI_MODEL", "/root/.cache/llmi/SmolLM2-135M-Instruct.Q4_1.gguf")
LLAMACPP = os.environ.get("LLAMACPP", "/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp")
WIKI = os.environ.get("WIKI", "/work/shared/data/wikitext-2-raw/wiki.test.raw")

GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# tiktoken's o200k_base pattern (openai_public.py), as GPT-4o's and Phi-4-mini's tokenizer.json
# carry it; llama.cpp's pre name "gpt-4o"
O200K_RE = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
            r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
            r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Mistral's Tekken (Mistral-Nemo, Mistral-Small-3.x tokenizer.json): o200k's without the
# contractions and with single digits; llama.cpp's pre name "tekken" (ignore_merges, BOS)
TEKKEN_RE = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
             r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
             r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def read_gguf_tokenizer(path):
    r = GGUFReader(path)
    out = {}
    for k, f in r.fields.items():
        if not k.startswith("tokenizer.") and k != "general.architecture":
            continue
        tname = f.types[0].name if f.types else ""
        if tname == "ARRAY":
            et = f.types[1].name
            if et == "STRING":
                out[k] = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            else:
                out[k] = [f.parts[i][0].item() for i in f.data]
        elif tname == "STRING":
            out[k] = bytes(f.parts[f.data[0]]).decode("utf-8")
        else:
            out[k] = f.parts[f.data[0]][0].item()
    return out


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


# ---------------------------------------------------------------- tokenizers
def build_smollm2():
    g = read_gguf_tokenizer(SMOL_GGUF)
    tokens, types = g["tokenizer.ggml.tokens"], g["tokenizer.ggml.token_type"]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ")) for m in g["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    bos, eos = g["tokenizer.ggml.bos_token_id"], g["tokenizer.ggml.eos_token_id"]
    cfg = {
        "add_prefix_space": False,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": tokens[bos], "eos_token": tokens[eos],
        "unk_token": tokens[g["tokenizer.ggml.unknown_token_id"]],
        "pad_token": tokens[g["tokenizer.ggml.padding_token_id"]],
        "chat_template": g["tokenizer.chat_template"],
        "clean_up_tokenization_spaces": False,
        "model_max_length": 8192,
        "tokenizer_class": "GPT2Tokenizer",
        "vocab_size": len(tokens),
    }
    gen = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": eos}
    return tok, cfg, gen


def spm_dict(path):
    g = read_gguf_tokenizer(path)
    d = {"tokenizer_type": g["tokenizer.ggml.model"], "tokens": g["tokenizer.ggml.tokens"],
         "scores": g.get("tokenizer.ggml.scores"), "token_type": g.get("tokenizer.ggml.token_type")}
    if "tokenizer.ggml.merges" in g:
        d["merges"] = g["tokenizer.ggml.merges"]
    if "tokenizer.ggml.pre" in g:
        d["pre_tokenizer_type"] = g["tokenizer.ggml.pre"]
    return g, d


def build_llama_spm(legacy):
    # transformers' own GGUF -> fast tokenizer conversion (the module needs no torch).
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, phi3_tokenizer
    path = os.path.join(LLAMACPP, "models", "ggml-vocab-llama-spm.gguf")
    g, d = spm_dict(path)
    tok, _ = convert_gguf_tokenizer(g["general.architecture"], d)
    if legacy:
        # The Llama-2 hub form (and llama.cpp's behaviour): prepend "▁" to every segment.
        leg = phi3_tokenizer(d).backend_tokenizer
        tok.normalizer = leg.normalizer
        tok.pre_tokenizer = leg.pre_tokenizer
    tokens = d["tokens"]
    bos, eos = g["tokenizer.ggml.bos_token_id"], g["tokenizer.ggml.eos_token_id"]
    # llama.cpp and transformers add BOS to a sentencepiece vocab unless told otherwise.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{tokens[bos]}:0 $A:0", pair=f"{tokens[bos]}:0 $A:0 {tokens[bos]}:1 $B:1",
        special_tokens=[(tokens[bos], bos)])
    cfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": tokens[bos], "eos_token": tokens[eos],
           "unk_token": tokens[g["tokenizer.ggml.unknown_token_id"]], "legacy": legacy,
           "clean_up_tokenization_spaces": False, "tokenizer_class": "LlamaTokenizer",
           "chat_template": LLAMA2_TEMPLATE}
    return tok, cfg, path


def build_trimmed(vocab_file, regex, nfc, ignore_merges):
    path = os.path.join(LLAMACPP, "models", vocab_file)
    g = read_gguf_tokenizer(path)
    tokens, types = g["tokenizer.ggml.tokens"], g["tokenizer.ggml.token_type"]
    vocab = {}
    for i, t in enumerate(tokens[:TRIM]):
        if types[i] == 1:
            vocab.setdefault(t, len(vocab))
    for ch in bytes_to_unicode().values():   # every byte must stay encodable
        vocab.setdefault(ch, len(vocab))
    merges = []
    for m in g["tokenizer.ggml.merges"]:
        a, b = m.split(" ")
        if a in vocab and b in vocab and a + b in vocab:
            merges.append((a, b))
    specials = [t for i, t in enumerate(tokens) if types[i] == 3][:40]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges))
    tok.normalizer = normalizers.NFC() if nfc else None
    if regex is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    if regex in (LLAMA3_RE, TEKKEN_RE):   # llama.cpp's add_bos for these pre names
        bos = "<|begin_of_text|>"
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, tok.token_to_id(bos))])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok, path


# ---------------------------------------------------------------- strings
WS = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", "  \n", " \t ", "\n ", "\r", "\u00a0", "\u3000",
      "\u2003", "\u2009", "\x0b", "\x0c", "\u2028", "\u0085", "\u200b", "\ufeff", "\u180e", "\u202f"]
WORDS = ["the", "The", "HELLO", "world", "Hello", "tokenizer", "don", "I", "a", "ä", "Äpfel", "naïve",
         "café", "résumé", "über", "straße", "ſ", "K", "ǅ", "Ⅻ", "ﬁ", "œuvre", "x", "ab", "zzz", "CamelCase",
         "snake_case", "foo-bar", "e.g.", "http://example.com/a?b=c&d=1", "user@mail.org", "C++", "__init__"]
PUNCT = list("!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~") + ["...", "!!!", "?!", "—", "–", "“", "”", "‘", "’", "«", "»",
                                                     "¿", "¡", "•", "…", "©", "®", "™", "°", "±", "§", "¶",
                                                     "->", "=>", "::", "//", "/*", "*/", "{}", "()", "[]", "<>"]
CONTR = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'LL", "'D", "’s", "'x", "''", "'"]
EMOJI = ["😀", "👍", "👍🏽", "👍🏿", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🇺🇸", "❤️", "✨", "🤖", "🧑🏻‍💻", "👩‍❤️‍👨",
         "🙂", "🔥", "💯", "🎉", "☺", "⌚", "🫠"]
SCRIPTS = {
    "cjk": [(0x4E00, 0x9FFF)], "hira": [(0x3041, 0x3096)], "kata": [(0x30A1, 0x30FA)],
    "hangul": [(0xAC00, 0xD7A3)], "arabic": [(0x0621, 0x064A)], "hebrew": [(0x05D0, 0x05EA)],
    "deva": [(0x0905, 0x0939), (0x093E, 0x094C)], "cyr": [(0x0410, 0x044F)], "greek": [(0x0391, 0x03A9), (0x03B1, 0x03C9)],
    "thai": [(0x0E01, 0x0E2E)], "latin1": [(0x00C0, 0x00FF)], "math": [(0x1D400, 0x1D433)],
}
COMBINING = ["\u0301", "\u0300", "\u0308", "\u0327", "\u0303", "\u20dd", "\u0323\u0302"]
NUMS_EXTRA = ["½", "²", "٣", "१२३", "Ⅻ", "①", "３", "0.5", "1,000,000", "3.14159", "-42", "1e10", "0x1F"]


def rand_script(rng, name):
    lo, hi = rng.choice(SCRIPTS[name])
    return "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8)))


def rand_piece(rng, specials, wiki):
    k = rng.random()
    if k < 0.18:
        return rng.choice(WORDS)
    if k < 0.32:
        return rng.choice(WS) * rng.randint(1, 3)
    if k < 0.42:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 24)))
    if k < 0.46:
        return rng.choice(NUMS_EXTRA)
    if k < 0.55:
        return "".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 3)))
    if k < 0.60:
        return rng.choice(CONTR)
    if k < 0.66:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 3)))
    if k < 0.80:
        return rand_script(rng, rng.choice(list(SCRIPTS)))
    if k < 0.85:
        base = rng.choice("aeiouAEOnc") if rng.random() < 0.7 else rand_script(rng, "deva")[:1]
        return base + "".join(rng.choice(COMBINING) for _ in range(rng.randint(1, 2)))
    if k < 0.90 and specials:
        s = rng.choice(specials)
        return s if rng.random() < 0.8 else s[: rng.randint(1, max(1, len(s) - 1))]
    if k < 0.95:
        line = rng.choice(wiki)[:300]
        return line[: rng.randint(1, len(line))] if rng.random() < 0.5 else line
    return chr(rng.choice([0x01, 0x07, 0x1B, 0x7F, 0xAD, 0x200D, 0x2060, 0xE000, 0xFFFD, 0x1F3FB]))


def make_strings(specials, seed):
    rng = random.Random(seed)
    wiki = [ln for ln in open(WIKI, encoding="utf-8").read().split("\n") if ln.strip()]
    out = ["", " ", "  ", "\n", " \n", "Hello world", " Hello world", "Hello World!", "  leading spaces",
           "trailing spaces   ", "\t\ttabs", "a\r\nb", "123456789", "1 2 3", "I'm here, you're there; they'll go.",
           "I'M HERE, YOU'RE", "ied 4 ½ months", "Äpfel", "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅",
           "Hello\n\n\nworld", "   Hello\n    Hello", "e\u0301 vs \u00e9", "\u00a0\u00a0nbsp", "\u0085nel\u0085"]
    out += [s for s in specials[:12]]
    out += [" " + s + " x" for s in specials[:6]]
    # a few wikitext lines verbatim
    out += [w[:600] for w in rng.sample(wiki, 120)]
    while len(out) < N_STRINGS - 4:
        n = rng.choice([1, 2, 3, 5, 8, 13, 20, 30])
        sep = rng.random() < 0.5
        parts = []
        for _ in range(n):
            parts.append(rand_piece(rng, specials, wiki))
            if sep and rng.random() < 0.6:
                parts.append(" ")
        out.append("".join(parts))
    # long inputs, 10-50 KB
    for size in (10_000, 20_000, 30_000, 45_000):
        parts = []
        total = 0
        while total < size:
            p = rng.choice(wiki) + "\n" if rng.random() < 0.6 else rand_piece(rng, specials, wiki)
            parts.append(p)
            total += len(p.encode())
        out.append("".join(parts))
    return out


def make_refs(tok, strings, seed, nfc=False):
    rng = random.Random(seed)
    lines = []
    for s in strings:
        add = rng.random() < 0.15
        tok.encode_special_tokens = False
        ids = tok.encode(s, add_special_tokens=add).ids
        tok.encode_special_tokens = True
        np_ = tok.encode(s, add_special_tokens=add).ids
        tok.encode_special_tokens = False
        rec = {"t": s}
        if add:
            rec["a"] = True
        rec["ids"] = ids
        if np_ != ids:
            rec["np"] = np_
        d = tok.decode(ids, skip_special_tokens=False)
        ds = tok.decode(ids, skip_special_tokens=True)
        if d != s:
            rec["d"] = d
        if ds != d:
            rec["ds"] = ds
        lines.append(json.dumps(rec, ensure_ascii=False))
    return ("\n".join(lines) + "\n").encode("utf-8")


def write_zst(path, data):
    with open(path, "wb") as f:
        f.write(zstandard.ZstdCompressor(level=19).compress(data))
    print(f"{path}: {len(data)} bytes -> {os.path.getsize(path)} compressed", file=sys.stderr)


def added_contents(tok):
    return [t.content for t in tok.get_added_tokens_decoder().values()]


ADDED_FLAGS = [("<mask>", dict(lstrip=True, special=True)), ("<mask>x", dict(special=False)),
               ("[R]", dict(rstrip=True, special=True)), ("both", dict(lstrip=True, rstrip=True, special=False)),
               ("cat", dict(single_word=True, special=False)), ("Dog", dict(single_word=True, special=True)),
               ("\u00e9t\u00e9", dict(normalized=True, special=False)), ("naïve", dict(normalized=True, special=True))]


def build_added_flags(base, seed):
    """qwen2-trim plus added tokens exercising lstrip / rstrip / single_word / normalized and a
    longest-match overlap (<mask> vs <mask>x); the NFC normalizer makes "normalized" matter."""
    tok = Tokenizer.from_str(base.to_str())
    for content, kw in ADDED_FLAGS:
        kw = dict(kw)
        kw.setdefault("normalized", False)
        special = kw.pop("special")
        t = AddedToken(content, **kw)
        (tok.add_special_tokens if special else tok.add_tokens)([t])
    d = os.path.join(OUT, "added-flags")
    save_dir(d, tok, compress=True)
    rng = random.Random(seed + 7)
    contents = [c for c, _ in ADDED_FLAGS] + ["e\u0301te\u0301", "nai\u0308ve", "cats", "concat", "_cat", "Dogs"]
    strings = [" <mask> ", "a  <mask>", "a\t\n <mask>x", "[R]   b", "[R]\n\nz", "x  both  y", "cat", "a cat b",
               "concat", "cats", "_cat", "cat_", "(cat)", "Dog!", "hotDog", "été", "e\u0301te\u0301", "naïve",
               "nai\u0308ve", " <mask>   [R] both cat Dog été"]
    base_strings = make_strings(contents, seed + 7)
    while len(strings) < 2000:
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            parts.append(rng.choice(contents) if r < 0.4 else rng.choice(WS) if r < 0.7 else rng.choice(base_strings)[:80])
        strings.append("".join(parts))
    write_zst(os.path.join(d, "refs.jsonl.zst"), make_refs(tok, strings, seed + 7))


# ---------------------------------------------------------------- chat templates
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")

MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

QWEN25_TEMPLATE_FILE = "models/templates/Qwen-Qwen2.5-7B-Instruct.jinja"
QWEN3_TEMPLATE_FILE = "models/templates/Qwen-Qwen3-0.6B.jinja"


# Gemma 3's chat template: google/gemma-3-4b-it's tokenizer_config.json (the same text in
# gemma-3-1b-it and 27b-it), image parts included.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)


# microsoft/phi-4's chat template (ChatML with <|im_sep|>, the assistant turn opened inside the
# user message, no add_generation_prompt branch), as llama.cpp's tests/test-chat-template.cpp
# carries it (the "phi-4" entry, llama-cpp-python 0.3.36's vendor tree)
PHI4_TEMPLATE = (
    "{% for message in messages %}{% if (message['role'] == 'system') %}{{'<|im_start|>system<|im_sep|>' + "
    "message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>' + "
    "message['content'] + '<|im_end|><|im_start|>assistant<|im_sep|>'}}{% elif (message['role'] == 'assistant') %}"
    "{{message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}"
)


# microsoft/Phi-4-mini-instruct's chat template (tokenizer_config.json's chat_template: every
# message as '<|' + role + '|>' + content + '<|end|>', no newlines, a system message's tools
# inside <|tool|>...<|/tool|>; the generation prompt '<|assistant|>'), as quoted verbatim by
# guidance's chat_templates.py ("phi_4_mini_template", citing that file at line 104) and by
# onnxruntime-genai's tokenizer tests ("From HuggingFace Python output for
# 'microsoft/Phi-4-mini-instruct'"); llama.cpp 0.3.36 carries no copy of it
PHI4_MINI_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and "
    "message['tools'] is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + "
    "message['tools'] + '<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + "
    "message['content'] + '<|end|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}"
)


def render_chat(smol_template):
    import jinja2

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    # transformers defines strftime_now (today's date); the date used is recorded so the test
    # can substitute the date of its own run
    import datetime
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    templates = [("chatml", "smollm2", smol_template, "", ""),
                 ("llama3", "llama3", LLAMA3_TEMPLATE, "<|begin_of_text|>", "<|eot_id|>"),
                 ("llama2", "llama2", LLAMA2_TEMPLATE, "<s>", "</s>"),
                 ("mistral", "mistral", MISTRAL_TEMPLATE, "<s>", "</s>"),
                 ("gemma", "gemma3", GEMMA3_TEMPLATE, "<bos>", "<eos>"),
                 ("phi4", "phi-4", PHI4_TEMPLATE, "", "<|im_end|>"),
                 ("phi4mini", "phi-4-mini", PHI4_MINI_TEMPLATE, "", "<|endoftext|>")]
    for kind, fn in (("chatml", QWEN25_TEMPLATE_FILE), ("chatml", QWEN3_TEMPLATE_FILE),
                     ("llama3", "models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja"),
                     ("llama3", "models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja"),
                     ("llama3", "models/templates/meta-llama-Llama-3.3-70B-Instruct.jinja"),
                     ("gemma", "models/templates/google-gemma-2-2b-it.jinja"),
                     ("phi3", "models/templates/microsoft-Phi-3.5-mini-instruct.jinja"),
                     ("mistral-tekken", "models/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja"),
                     ("mistral-v7", "models/templates/Mistral-Small-3.2-24B-Instruct-2506.jinja"),
                     ("mistral-v7", "models/templates/unsloth-mistral-Devstral-Small-2507.jinja"),
                     ("mistral-v7", "models/templates/mistralai-Ministral-3-14B-Reasoning-2512.jinja"),
                     ("granite", "models/templates/ibm-granite-granite-3.3-2B-Instruct.jinja"),
                     ("granite4", "models/templates/ibm-granite-granite-4.0.jinja"),
                     ("granite4", "models/templates/ibm-granite-granite-4.1.jinja")):
        p = os.path.join(LLAMACPP, fn)
        if os.path.exists(p):
            bos, eos = (("<|begin_of_text|>", "<|eot_id|>") if kind == "llama3" else ("<bos>", "<eos>")
                        if kind == "gemma" else ("<s>", "<|endoftext|>") if kind == "phi3"
                        else ("<|end_of_text|>", "<|end_of_text|>") if kind.startswith("granite")
                        else ("<s>", "</s>") if kind.startswith("mistral") else ("", "<|im_end|>"))
            templates.append((kind, os.path.basename(fn), open(p, encoding="utf-8").read(), bos, eos))
    convs = [(None, "Hello!"), ("You are terse.", "What is 2+2?"), ("", "hi"),
             ("Multi\nline system.", "  spaced user text \n"), (None, "Unicode: 你好 🚀 é")]
    out = []
    for kind, name, tpl, bos, eos in templates:
        t = env.from_string(tpl)
        for system, user in convs:
            if (kind == "mistral" or name == "google-gemma-2-2b-it.jinja") and system is not None:
                continue   # the template rejects a system message
            msgs = ([] if system is None else [{"role": "system", "content": system}]) + [
                {"role": "user", "content": user}]
            s = t.render(messages=msgs, add_generation_prompt=True, bos_token=bos, eos_token=eos)
            rec = {"kind": kind, "name": name, "template": tpl, "bos": bos, "eos": eos,
                   "system": system, "user": user, "out": s}
            if "strftime_now" in tpl:
                # the date as the template writes it (its strftime_now format), which the test
                # replaces with its own run's
                import re
                fmt = re.search(r'strftime_now\(["\']([^"\']+)["\']\)', tpl).group(1)
                rec["today"] = datetime.datetime.now().strftime(fmt)
                if fmt != "%d %b %Y":
                    rec["today_fmt"] = fmt
            out.append(json.dumps(rec, ensure_ascii=False))
    return ("\n".join(out) + "\n").encode("utf-8")


def save_dir(d, tok, cfg=None, gen=None, compress=False, merges_as_strings=False):
    os.makedirs(d, exist_ok=True)
    js = tok.to_str(pretty=False)
    if merges_as_strings:   # the older "a b" spelling of merges, which HF still reads
        j = json.loads(js)
        j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
        js = json.dumps(j, ensure_ascii=False, separators=(",", ":"))
    js = js.encode("utf-8")
    if compress:
        write_zst(os.path.join(d, "tokenizer.json.zst"), js)
    else:
        open(os.path.join(d, "tokenizer.json"), "wb").write(js)
    if cfg is not None:
        json.dump(cfg, open(os.path.join(d, "tokenizer_config.json"), "w"), ensure_ascii=False, indent=1)
    if gen is not None:
        json.dump(gen, open(os.path.join(d, "generation_config.json"), "w"), indent=1)


SPM_FIRST = '"pre_tokenizer":{"type":"Metaspace","replacement":"\u2581","prepend_scheme":"first","split":false}'
SPM_SPLIT = '"pre_tokenizer":{"type":"Metaspace","replacement":"\u2581","prepend_scheme":"always","split":true}'


def main():
    os.makedirs(OUT, exist_ok=True)
    smol, cfg, gen = build_smollm2()
    d = os.path.join(OUT, "smollm2")
    save_dir(d, smol, cfg, gen)
    # reload from disk: the references must come from the committed file itself
    smol = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    write_zst(os.path.join(d, "refs.jsonl.zst"), make_refs(smol, make_strings(added_contents(smol), SEED), SEED))

    spm, cfg, gguf_path = build_llama_spm(legacy=False)
    d = os.path.join(OUT, "llama-spm")
    save_dir(d, spm, cfg)
    spm = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    strings = make_strings(added_contents(spm), SEED + 1)
    write_zst(os.path.join(d, "refs.jsonl.zst"), make_refs(spm, strings, SEED + 1))
    # the older Metaspace form (prepend_scheme "always", split into words at every "▁"); the
    # test makes this tokenizer.json by editing the committed one the same way
    split = Tokenizer.from_str(spm.to_str().replace(SPM_FIRST, SPM_SPLIT))
    write_zst(os.path.join(d, "refs-split.jsonl.zst"), make_refs(split, strings[:700], SEED + 1))
    leg, _, _ = build_llama_spm(legacy=True)
    write_zst(os.path.join(d, "refs-legacy.jsonl.zst"), make_refs(leg, strings, SEED + 1))
    for ext in ("", ".inp", ".out"):   # the vocab and llama.cpp's own test vectors for it
        with open(gguf_path + ext, "rb") as f, open(os.path.join(d, "ggml-vocab-llama-spm.gguf" + ext), "wb") as g:
            g.write(f.read())

    for name, vf, rx, nfc, im in (("llama3-trim", "ggml-vocab-llama-bpe.gguf", LLAMA3_RE, False, True),
                                  ("qwen2-trim", "ggml-vocab-qwen2.gguf", QWEN2_RE, True, False),
                                  ("gpt2-trim", "ggml-vocab-gpt-2.gguf", None, False, False)):
        tok, _ = build_trimmed(vf, rx, nfc, im)
        d = os.path.join(OUT, name)
        save_dir(d, tok, compress=True, merges_as_strings=name == "gpt2-trim")
        seed = SEED + len(name)
        write_zst(os.path.join(d, "refs.jsonl.zst"), make_refs(tok, make_strings(added_contents(tok), seed), seed))
        if name == "qwen2-trim":
            build_added_flags(tok, seed)
    for name, rx, im, pre in (("o200k-trim", O200K_RE, False, "gpt-4o"), ("tekken-trim", TEKKEN_RE, True, "tekken")):
        build_split_kind(name, rx, im, pre)

    open(os.path.join(OUT, "chat.jsonl"), "wb").write(render_chat(cfg_smol_template()))


def write_tokenizer_gguf(path, tok, pre, bos):
    """A GGUF with only tok's vocabulary as llama.cpp's converter writes a byte-level BPE:
    tokens by id (added specials type 3, the rest 1), "a b" merges, tokenizer.ggml.pre, the
    BOS id when the pre name adds one (no add_bos_token key: the reader's default for the name)."""
    import gguf
    j = json.loads(tok.to_str())
    vocab = dict(j["model"]["vocab"])
    specials = {a["content"]: a["id"] for a in j["added_tokens"]}
    vocab.update(specials)
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    assert all(t is not None for t in tokens)
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]])
    if bos:
        w.add_bos_token_id(specials[bos])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def build_split_kind(name, rx, ignore_merges, pre):
    """A trimmed Llama-3 vocabulary behind another Split regex (o200k, Tekken): its
    tokenizer.json, HF's encodings of the usual strings, and the same vocabulary as a GGUF
    with llama.cpp's pre name for the regex (vocab.gguf.zst, for the GGUF reader)."""
    tok, _ = build_trimmed("ggml-vocab-llama-bpe.gguf", rx, False, ignore_merges)
    d = os.path.join(OUT, name)
    save_dir(d, tok, compress=True)
    seed = SEED + len(name)
    write_zst(os.path.join(d, "refs.jsonl.zst"), make_refs(tok, make_strings(added_contents(tok), seed), seed))
    tmp = os.path.join(d, "vocab.gguf")
    write_tokenizer_gguf(tmp, tok, pre, "<|begin_of_text|>" if rx == TEKKEN_RE else None)
    write_zst(tmp + ".zst", open(tmp, "rb").read())
    os.remove(tmp)


def cfg_smol_template():
    return read_gguf_tokenizer(SMOL_GGUF)["tokenizer.chat_template"]


if __name__ == "__main__":
    main()
