#!/usr/bin/env python3
"""Makes the control vectors of testdata/control with llama.cpp's own generator
(llama-cvector-generator), for tests/cli/control_vector.sh (llmi's --control-vector against
llama.cpp applying the same files: scripts/ref-llamacpp.py greedy-cvec and ppl-flags).

Not run by CI (CI has no llama.cpp): run once by hand, commit the output, and record the
versions in docs/REFERENCES.md.  Needs a build of the llama-cpp-python 0.3.36 sdist's
vendor/llama.cpp with the llama-cvector-generator target.

    python3 scripts/make-control-vectors.py LLAMA_CVECTOR_GENERATOR MODEL.gguf testdata/control

Each vector is the difference between the model's hidden states on positive and negative
prompts (SmolLM2's chat template, one prompt per line with \\n for newlines, as the generator
reads them) after each layer 1..n_layers-1, reduced by PCA or by the mean; the generator
writes one unit-norm F32 "direction.N" tensor per layer.  Output: OUTDIR/<name>.gguf and the
prompt files (OUTDIR/prompts/<pair>.{positive,negative}.txt).
"""
import os
import subprocess
import sys

SYSTEM = "<|im_start|>system\\n{}<|im_end|>\\n<|im_start|>user\\n{}<|im_end|>\\n<|im_start|>assistant\\n{}"

HAPPY = [("Act like a person who is extremely happy", "Who are you?", "I'm the happiest person in this world"),
         ("Act like a person who is extremely happy", "Hello", "Hello, I'm having the best day ever!"),
         ("You are in a very good mood", "Hi", "Hi, I'm very excited to meet you"),
         ("You are the happiest person", "What are you feeling?", "Everything is just perfect right now!")]
SAD = [("Act like a person who is extremely sad", "Who are you?", "I'm the saddest person in this world"),
       ("Act like a person who is extremely sad", "Hello", "Hello, I'm having the worst day ever."),
       ("You are in a very bad mood", "Hi", "Hi, I don't want to talk to anyone"),
       ("You are the saddest person", "What are you feeling?", "Everything is just terrible right now.")]
PIRATE = [("Talk like a pirate", "Who are you?", "Arr, I be a pirate of the seven seas, matey!"),
          ("Talk like a pirate", "Hello", "Ahoy there, ye scurvy landlubber!"),
          ("You are a pirate captain", "Where are we going?", "We be sailin' for the treasure, arr!"),
          ("You are a pirate captain", "What do you want?", "Gold, rum and a fair wind, me hearty!")]
PLAIN = [("Talk like a normal person", "Who are you?", "I am an ordinary person who lives in the city."),
         ("Talk like a normal person", "Hello", "Hello, nice to meet you."),
         ("You are an office worker", "Where are we going?", "We are going to the meeting room."),
         ("You are an office worker", "What do you want?", "A quiet afternoon and a cup of coffee.")]

PAIRS = {"happy": (HAPPY, SAD), "pirate": (PIRATE, PLAIN)}
# name -> (prompt pair, method)
VECTORS = {"happy-pca": ("happy", "pca"), "happy-mean": ("happy", "mean"), "pirate-pca": ("pirate", "pca")}


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    generator, model, outdir = sys.argv[1:4]
    os.makedirs(os.path.join(outdir, "prompts"), exist_ok=True)
    for pair, rows in PAIRS.items():
        for kind, part in zip(("positive", "negative"), rows):
            with open(os.path.join(outdir, "prompts", f"{pair}.{kind}.txt"), "w", encoding="utf-8") as f:
                f.write("".join(SYSTEM.format(*r) + "\n" for r in part))
    for name, (pair, method) in VECTORS.items():
        files = [os.path.join(outdir, "prompts", f"{pair}.{kind}.txt") for kind in ("positive", "negative")]
        out = os.path.join(outdir, f"{name}.gguf")
        cmd = [generator, "-m", model, "-t", "2", "--positive-file", files[0], "--negative-file", files[1],
               "--method", method, "-o", out]
        subprocess.run(cmd, check=True, capture_output=True)
        print(" ".join(["llama-cvector-generator"] + cmd[1:]), file=sys.stderr)


if __name__ == "__main__":
    main()
