#!/usr/bin/env bash
# Grammar-constrained requests on the CUDA backend (CPU emulation, tests/cuda-emu): a step
# that holds one samples on the host from whole logit rows while the others in the batch
# are unconstrained, and steps without one go back to device sampling and decode graphs.
# Every constrained output (greedy and sampled, seeds from the run's seed) must be a whole
# sentence of its grammar, checked by Python regexes written from the grammars; the
# unconstrained ones must generate (to their length, or to an end-of-generation token the
# random model may well sample).
. "$(dirname "$0")/../lib/common.sh"
need_emu
M="$TESTDATA/hf/llama-gqa-rope3"
echo "seed $SEED"
python3 - "$TMP/prompts.jsonl" "$SEED" <<'PY' || fail "making prompts"
import json, random, sys
rng = random.Random(int(sys.argv[2]))
gs = ['root ::= ("- " [a-z]{1,6} "\\n"){3}', 'root ::= "yes" | "no" | "maybe"', 'root ::= [0-9]{1,4} ("." [0-9]{1,2})?']
with open(sys.argv[1], "w") as f:
    for i in range(9):
        r = {"prompt": " ".join(rng.choice(["the", "cat", "sat", "on", "a", "mat", "and"]) for _ in range(1 + i)),
             "seed": rng.randrange(1 << 30), "temperature": 0 if i % 2 else 1.2, "top_k": 0, "top_p": 1, "min_p": 0}
        if i % 3 != 2:
            r["grammar"] = gs[i % 3 if i % 3 < 2 else 2]
        f.write(json.dumps(r) + "\n")
PY
KEEP=("$TMP/prompts.jsonl")
emu_run grammar generate -m "$M" --prompts "$TMP/prompts.jsonl" -n 32 --json --no-stats --device cuda
grep -q "graph launches" "$TMP/grammar.err" || fail "no decode graph ran once the constrained requests were done"
python3 - "$TMP/grammar.out" "$TMP/prompts.jsonl" <<'PY' || fail "a constrained output on cuda is outside its grammar"
import json, re, sys
outs = [json.loads(l) for l in open(sys.argv[1])]
reqs = [json.loads(l) for l in open(sys.argv[2])]
rx = {'root ::= ("- " [a-z]{1,6} "\\n"){3}': r"(- [a-z]{1,6}\n){3}", 'root ::= "yes" | "no" | "maybe"': "yes|no|maybe"}
n = 0
for o, r in zip(outs, reqs):
    g = r.get("grammar")
    if g is None:
        assert o["finish_reason"] in ("length", "eos") and o["generated_tokens"] >= 1, o
        continue
    assert o["finish_reason"] == "eos", (r, o["text"], o["finish_reason"])
    assert re.fullmatch(rx[g], o["text"]), (g, o["text"])
    n += 1
print(f"{n} constrained outputs on cuda, each a whole sentence of its grammar: {[o['text'] for o in outs[:2]]}")
PY
echo "$(grep 'EMU stats' "$TMP/grammar.err")"
