#!/usr/bin/env bash
# Soak: one long `llmi generate --prompts` run of mixed requests under KV pressure, checked
# request by request and for memory growth (docs/RELIABILITY.md, issue 15).
#   scripts/soak.sh                 10,000 requests, ./llmi, RSS checked
#   scripts/soak.sh --quick         500 short requests on llmi-san (as the suite runs it)
#   options: -n N (requests), --bin PATH, -m MODEL, --out DIR (kept; default a temp dir)
# The requests: prompts of 3..~260 tokens (a third open with one of 4 shared preambles,
# so the prefix cache hits and evicts), max_tokens 1..32, ignore_eos on most (their token
# count is then exact), a random stop string on 30%, logprobs 1..5 on 20%, temperature
# 0..1 with per-request seeds, prompt-lookup speculation (spec ngram, k 1..5) on 30%.
# The KV pool (--num-blocks) holds a few long requests at once with --max-seqs 32, so the
# scheduler preempts all the time.
# Checks: every request answered once, in order, none refused; finish "length" => exactly
# max_tokens tokens; "stop" => <= max_tokens, the request had stop strings and the text
# holds none of them; "eos" => ignore_eos off; logprobs => one entry per token with the
# asked number of alternatives; speculation stats where asked; preemptions > 0; and (full
# mode) RSS at the end within 5% of RSS once the first 1,000 requests are done.  Prints
# one summary line; exit 0 = pass.
set -u
cd "$(dirname "$0")/.."
N=10000 QUICK=0 BIN=./llmi OUT="" MODEL_ARG=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; N=500; BIN=./llmi-san ;;
    -n) N=$2; shift ;;
    --bin) BIN=$2; shift ;;
    -m) MODEL_ARG=$2; shift ;;
    --out) OUT=$2; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "soak.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done
MODEL=${MODEL_ARG:-${MODEL:-$(scripts/fetch-model.sh --path)}}
[ -f "$MODEL" ] || { echo "soak.sh: model $MODEL missing (scripts/fetch-model.sh)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "soak.sh: $BIN not built" >&2; exit 2; }
if [ -z "$OUT" ]; then OUT=$(mktemp -d /tmp/llmi-soak-XXXXXX); trap 'rm -rf "$OUT"' EXIT; fi
mkdir -p "$OUT"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
maxgen=32; [ $QUICK -eq 1 ] && maxgen=8
words=240; [ $QUICK -eq 1 ] && words=40

python3 - "$N" "$maxgen" "$words" "${LLMI_TEST_SEED:-15}" >"$OUT/prompts.jsonl" <<'PY'
import json, random, sys
n, maxgen, maxwords, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
r = random.Random(seed)
vocab = ("the of and to in a is that for it as was with be by on not he this are or his from at which but have "
         "an they you were her she there one all we their can has been if more when will would who so no time "
         "river mountain city music number water light story question answer system memory engine token").split()
preambles = [" ".join(r.choice(vocab) for _ in range(r.randint(20, maxwords // 2))) + "." for _ in range(4)]
stops = [" the", ".", ",", " and", "\n", " of", "ing", " a"]
for i in range(n):
    body = " ".join(r.choice(vocab) for _ in range(r.randint(2, maxwords // 2)))
    prompt = (r.choice(preambles) + " " + body) if r.random() < 1 / 3 else body
    req = {"prompt": prompt, "max_tokens": r.randint(1, maxgen), "seed": r.randrange(1 << 31),
           "temperature": round(r.random(), 2), "ignore_eos": r.random() < 0.8}
    if r.random() < 0.3:
        req["stop"] = r.sample(stops, r.randint(1, 2))
    if r.random() < 0.2:
        req["logprobs"] = r.randint(1, 5)
    if r.random() < 0.3:
        req["spec"], req["spec_k"] = "ngram", r.randint(1, 5)
    print(json.dumps(req))
PY

# Blocks of 16 tokens: the longest request is ~260+32 tokens (19 blocks); 24 hold only a
# few at once while up to 32 sequences compete.
blocks=24; [ $QUICK -eq 1 ] && blocks=6
start=$(date +%s)
"$BIN" generate -m "$MODEL" --device cpu --prompts "$OUT/prompts.jsonl" --json --block-size 16 \
    --num-blocks $blocks --max-seqs 32 -c 1024 >"$OUT/out.jsonl" 2>"$OUT/stderr.txt" &
pid=$!
# RSS samples: "<requests answered> <VmRSS kB>", twice a second.
: >"$OUT/rss.txt"
while kill -0 $pid 2>/dev/null; do
  rss=$(awk '/^VmRSS/ {print $2}' /proc/$pid/status 2>/dev/null)
  [ -n "$rss" ] && echo "$(wc -l <"$OUT/out.jsonl") $rss" >>"$OUT/rss.txt"
  sleep 0.5
done
wait $pid; rc=$?
secs=$(( $(date +%s) - start ))
[ $rc -eq 0 ] || { echo "soak: llmi exited $rc after ${secs}s: $(tail -n 5 "$OUT/stderr.txt")"; exit 1; }

python3 - "$OUT" "$N" "$QUICK" "$secs" <<'PY'
import json, sys
out, n, quick, secs = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
reqs = [json.loads(l) for l in open(out + "/prompts.jsonl")]
res = [json.loads(l) for l in open(out + "/out.jsonl")]
bad = []
def check(c, msg):
    if not c: bad.append(msg)
check(len(res) == n, "%d answers for %d requests" % (len(res), n))
tokens = preempted = cached = 0
finishes = {}
for i, (q, a) in enumerate(zip(reqs, res)):
    if len(bad) > 10: break
    check(a.get("index") == i, "answer %d has index %s" % (i, a.get("index")))
    if "error" in a:
        bad.append("request %d refused: %s" % (i, a["error"])); continue
    g, f, mx = a["generated_tokens"], a["finish_reason"], q["max_tokens"]
    finishes[f] = finishes.get(f, 0) + 1
    tokens += g; preempted += a["preempted"]; cached += a["cached_tokens"]
    check(len(a["tokens"]) == g, "request %d: %d token ids, generated_tokens %d" % (i, len(a["tokens"]), g))
    if f == "length": check(g == mx, "request %d: finish length after %d tokens, max_tokens %d" % (i, g, mx))
    elif f == "stop":
        check(g <= mx and "stop" in q, "request %d: finish stop (%d tokens, max %d, stops %s)" % (i, g, mx, q.get("stop")))
        check(not any(s in a["text"] for s in q.get("stop", [])), "request %d: text holds a stop string" % i)
    elif f == "eos": check(g <= mx and not q["ignore_eos"], "request %d: eos with ignore_eos or past max" % i)
    else: bad.append("request %d: finish %s" % (i, f))
    if q.get("ignore_eos") and "stop" not in q:
        check(f == "length", "request %d: ignore_eos, no stop, finish %s" % (i, f))
    if q.get("spec"):
        check("spec_steps" in a, "request %d: asked for speculation, its answer has no spec stats" % i)
    if q.get("logprobs"):
        lp = a.get("logprobs", [])
        check(len(lp) == g and all(len(t["top"]) == q["logprobs"] for t in lp),
              "request %d: logprobs %d entries for %d tokens" % (i, len(lp), g))
check(preempted > 0, "no preemption: the KV pool did not force any")
samples = [tuple(map(int, l.split())) for l in open(out + "/rss.txt") if l.strip()]
first = max(1, n // 10) if quick else 1000
at_first = next((kb for done, kb in samples if done >= first), None)
end = samples[-1][1] if samples else None
rss = "RSS n/a (too few samples)"
if at_first and end:
    rss = "RSS after %d requests %.1f MiB, at the end %.1f MiB (%+.1f%%)" % (first, at_first / 1024, end / 1024,
                                                                         100.0 * (end - at_first) / at_first)
    if not quick: check(end <= at_first * 1.05, "RSS grew more than 5%")
stats = [l.strip() for l in open(out + "/stderr.txt") if "preemptions" in l]
print("soak: %d requests in %ds, %d tokens generated, %d prompt tokens cached, %d preemptions, finish %s; %s%s" % (
    len(res), secs, tokens, cached, preempted, json.dumps(finishes, sort_keys=True), rss,
    " (ASan: RSS not judged)" if quick else ""))
if stats: print("llmi: " + stats[-1].split("llmi: ", 1)[-1])
for b in bad[:10]: print("FAIL:", b)
sys.exit(1 if bad else 0)
PY
