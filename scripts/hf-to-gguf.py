#!/usr/bin/env python3
"""Runs llama.cpp's own converter (convert_hf_to_gguf.py) on one of the tiny Hugging Face
test checkpoints, so the GGUF loader is checked against a file llama.cpp wrote, with the
same weights as the safetensors whose transformers logits are the reference.

Not run by CI: run once by hand, commit the output, record it in docs/REFERENCES.md.

    python3 scripts/hf-to-gguf.py LLAMA_CPP_DIR HF_DIR --outtype bf16 --outfile OUT.gguf

LLAMA_CPP_DIR is vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist (its gguf-py is put
first on the path).  Needs torch, transformers, numpy, sentencepiece (PyPI).

The one change to the converter: the test models' tokenizer is a byte-level BPE trained
here, whose pre-tokenizer hash llama.cpp does not know (it refuses unknown ones), so
get_vocab_base_pre answers "qwen2".  That names only the pre-tokenizer written to
tokenizer.ggml.pre (the logits tests load no tokenizer); tensors, names, shapes and
hyper-parameters are the converter's own.  For the same reason (the test models have no
SentencePiece tokenizer.model), Gemma2Model and Phi3MiniModel write the GPT-2-style
vocabulary that the converter's own Gemma3Model (and Phi3MiniModel, for Phi-4's
GPT2Tokenizer) write when a checkpoint has no tokenizer.model.
"""
import runpy
import sys

if len(sys.argv) < 3:
    sys.exit(__doc__)
LC = sys.argv[1]
sys.path.insert(0, LC + "/gguf-py")
sys.path.insert(0, LC)
import conversion.base as base  # noqa: E402  (the converter's package, from LC)

base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
import conversion.gemma as gemma  # noqa: E402

import conversion.phi as phi  # noqa: E402

gemma.Gemma2Model.set_vocab = lambda self: self._set_vocab_gpt2()
phi.Phi3MiniModel.set_vocab = lambda self: self._set_vocab_gpt2()
sys.argv = [LC + "/convert_hf_to_gguf.py"] + sys.argv[2:]
runpy.run_path(LC + "/convert_hf_to_gguf.py", run_name="__main__")
