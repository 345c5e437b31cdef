#!/usr/bin/env bash
# Speculative decoding (prompt lookup, or a draft model) vs none, side by side in one run (docs/PERF.md):
# the input-quoting task "Repeat the following text with the typos fixed: <~300 tokens>"
# on wikitext-2 paragraphs with deterministic typos, greedy, --chat, at batch 1 (REPS
# interleaved pairs) and batch 16 (one pair, all prompts prefilled in the first step).  Prints a markdown table of decode tok/s
# and the acceptance figures; the two sides produce the same tokens (checked).
#   scripts/bench-spec.sh [MODEL]      env: LLMI (./llmi), REPS (3), N (256), SPEC_ARGS (""),
#                                      SPEC (ngram, or draft: DRAFT is the draft model, default MODEL)
set -eu
cd "$(dirname "$0")/.."
LLMI="${LLMI:-./llmi}"
MODEL="${1:-$(scripts/fetch-model.sh --path)}"
REPS="${REPS:-3}"
N="${N:-256}"
SPEC_ARGS="${SPEC_ARGS:-}"
SPEC="${SPEC:-ngram}"
case "$SPEC" in
  ngram) SPEC_FLAGS=(--spec ngram) ;;
  draft) SPEC_FLAGS=(--spec draft --draft-model "${DRAFT:-$MODEL}") ;;
  *) echo "SPEC: ngram or draft" >&2; exit 2 ;;
esac
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 - ../shared/data/wikitext-2-raw/wiki.test.raw "$TMP" <<'PY'
import json, random, sys
rnd = random.Random(11)
paras = [l.strip() for l in open(sys.argv[1], encoding="utf-8") if len(l.split()) > 230 and not l.startswith(" =")]
def typos(text):
    words = text.split()[:220]
    for i in range(3, len(words), 13):
        w = words[i]
        if len(w) > 3:
            j = rnd.randrange(1, len(w) - 2)
            words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2:]
    return " ".join(words)
reqs = [json.dumps({"prompt": "Repeat the following text with the typos fixed:\n\n" + typos(p)}) for p in paras[:16]]
open(f"{sys.argv[2]}/b1.jsonl", "w").write(reqs[0] + "\n")
open(f"{sys.argv[2]}/b16.jsonl", "w").write("\n".join(reqs) + "\n")
PY
run() {  # run NAME PROMPTS SPEC...
  local name=$1 prompts=$2; shift 2
  "$LLMI" generate --device cpu -m "$MODEL" --chat --prompts "$prompts" -n "$N" --temp 0 --json "$@" \
    >"$TMP/$name.json" 2>"$TMP/$name.err"
}
for r in $(seq 1 "$REPS"); do
  run "b1-off-$r" "$TMP/b1.jsonl" --spec off
  run "b1-ngram-$r" "$TMP/b1.jsonl" "${SPEC_FLAGS[@]}" $SPEC_ARGS
done
# Batch 16: every prompt prefilled in the first step (a budget that holds them all), so
# each request's decode rate (tokens after its first over the time after it) is decode only.
run b16-off "$TMP/b16.jsonl" --spec off --max-batch-tokens 8192
run b16-ngram "$TMP/b16.jsonl" "${SPEC_FLAGS[@]}" --max-batch-tokens 8192 $SPEC_ARGS
python3 - "$TMP" "$REPS" "$SPEC" <<'PY'
import json, re, statistics as S, sys
d, reps, spec = sys.argv[1], int(sys.argv[2]), sys.argv[3]
load = lambda n: [json.loads(l) for l in open(f"{d}/{n}.json")]
def wall_gen(n):
    m = re.search(r"([0-9.]+) generated tok/s", open(f"{d}/{n}.err").read())
    return float(m.group(1)) if m else float("nan")
print(f"| batch | run | tokens | decode tok/s off | decode tok/s {spec} | ratio | acceptance | mean accepted length |")
print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
ratios = []
for r in range(1, reps + 1):
    off, ng = load(f"b1-off-{r}")[0], load(f"b1-ngram-{r}")[0]
    assert off["tokens"] == ng["tokens"], "greedy outputs differ"
    ratios.append(ng["decode_tok_s"] / off["decode_tok_s"])
    print(f"| 1 | {r} | {off['generated_tokens']} | {off['decode_tok_s']:.1f} | {ng['decode_tok_s']:.1f} | "
          f"{ratios[-1]:.2f}x | {100 * ng['spec_acceptance_rate']:.0f}% | {ng['spec_mean_accepted_len']:.2f} |")
off, ng = load("b16-off"), load("b16-ngram")
assert [o["tokens"] for o in off] == [o["tokens"] for o in ng], "greedy outputs differ (batch 16)"
mo, mn = S.mean(o["decode_tok_s"] for o in off), S.mean(o["decode_tok_s"] for o in ng)
prop, acc, steps = (sum(o[k] for o in ng) for k in ("spec_proposed", "spec_accepted", "spec_steps"))
print(f"| 16 | per request (mean) | {sum(o['generated_tokens'] for o in off)} | {mo:.1f} | {mn:.1f} | {mn / mo:.2f}x | "
      f"{100 * acc / prop:.0f}% | {1 + acc / steps:.2f} |")
print(f"| 16 | all generated / wall | | {wall_gen('b16-off'):.1f} | {wall_gen('b16-ngram'):.1f} | "
      f"{wall_gen('b16-ngram') / wall_gen('b16-off'):.2f}x | | |")
print(f"\nbatch 1: decode speed-up {S.mean(ratios):.2f}x (mean of {reps} interleaved pairs)")
PY
