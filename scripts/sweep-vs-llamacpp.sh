#!/usr/bin/env bash
# Runs llama.cpp's llama-bench and `llmi bench` on the same GGUF with the same prompt and
# generation lengths, threads and repetitions, and prints both rates side by side with
# the ratio llmi / llama.cpp.
#
#   scripts/sweep-vs-llamacpp.sh [-m MODEL] [-p 128,512] [-n 128] [-r 3] [-t THREADS]
#                                [--llama-bench PATH] [--llmi PATH] [-o md|csv]
#
# Matching tests: llama-bench "pp P" (P prompt tokens, no generation) against llmi's
# prefill tok/s at -p P -n 0; llama-bench "tg N" (N tokens decoded one at a time from an
# empty context) against llmi's decode tok/s at -p 1 -n N+1 (the first token comes from
# the one-token prefill, the N after it are decode steps).  Both report mean ± sd over -r runs;
# both use an f16 KV cache (llama-bench's default).
# llama-bench comes from $LLAMA_BENCH, --llama-bench, or the reference build below.
# On a CPU that advertises AMX without granting it (this VM), llama.cpp's native build dies
# with SIGILL in prompt processing: set LLAMA_LIBS to a no-AMX libggml-cpu build (the
# cmake line is in docs/PERF.md, "Machine") and/or LLAMA_BENCH_ARGS="--repack 0".
set -eu
cd "$(dirname "$0")/.."
MODEL="${MODEL:-$(scripts/fetch-model.sh --path)}"
LLAMA_BENCH="${LLAMA_BENCH:-/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-bench}"
LLMI_BIN="${LLMI:-./llmi}"
P=512; N=128; R=3; T=$(nproc); FMT=md
while [ $# -gt 0 ]; do
  case "$1" in
    -m) MODEL="$2"; shift 2 ;;
    -p) P="$2"; shift 2 ;;
    -n) N="$2"; shift 2 ;;
    -r) R="$2"; shift 2 ;;
    -t) T="$2"; shift 2 ;;
    -o) FMT="$2"; shift 2 ;;
    --llama-bench) LLAMA_BENCH="$2"; shift 2 ;;
    --llmi) LLMI_BIN="$2"; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "sweep-vs-llamacpp.sh: unknown flag '$1'" >&2; exit 2 ;;
  esac
done
[ -x "$LLAMA_BENCH" ] || { echo "sweep-vs-llamacpp.sh: llama-bench not found at $LLAMA_BENCH (set LLAMA_BENCH or --llama-bench)" >&2; exit 2; }
[ -x "$LLMI_BIN" ] || { echo "sweep-vs-llamacpp.sh: llmi not found at $LLMI_BIN (make, or --llmi)" >&2; exit 2; }
[ -f "$MODEL" ] || { echo "sweep-vs-llamacpp.sh: model $MODEL not found" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
NP1=$(echo "$N" | tr ',' '\n' | awk '{printf "%s%d", (NR>1?",":""), $1+1}')

echo "llama-bench: -p $P -n $N -r $R -t $T ${LLAMA_BENCH_ARGS:-}" >&2
# shellcheck disable=SC2086
LD_LIBRARY_PATH="${LLAMA_LIBS:+$LLAMA_LIBS:}${LD_LIBRARY_PATH:-}" \
  "$LLAMA_BENCH" -m "$MODEL" -p "$P" -n "$N" -r "$R" -t "$T" ${LLAMA_BENCH_ARGS:-} -o json >"$tmp/lcpp.json" 2>"$tmp/lcpp.err" \
  || { echo "sweep-vs-llamacpp.sh: llama-bench failed: $(tail -n 3 "$tmp/lcpp.err")" >&2; exit 1; }
echo "llmi bench: prefill" >&2
"$LLMI_BIN" bench -m "$MODEL" -p "$P" -n 0 -r "$R" -t "$T" --kv-type f16 --device cpu -o json >"$tmp/pp.json"
echo "llmi bench: decode" >&2
"$LLMI_BIN" bench -m "$MODEL" -p 1 -n "$NP1" -r "$R" -t "$T" --kv-type f16 --device cpu -o json >"$tmp/tg.json"

python3 - "$tmp" "$FMT" <<'PY'
import json, sys
d, fmt = sys.argv[1], sys.argv[2]
lc = json.load(open(f"{d}/lcpp.json"))
pp = {r["n_prompt"]: r for r in json.load(open(f"{d}/pp.json"))}
tg = {r["n_gen"] - 1: r for r in json.load(open(f"{d}/tg.json"))}
rows = []
for r in lc:
    if r["n_gen"] == 0 and r["n_prompt"] in pp:
        m = pp[r["n_prompt"]]; test = f"pp{r['n_prompt']}"; ours, osd = m["prefill_tps_mean"], m["prefill_tps_sd"]
    elif r["n_prompt"] == 0 and r["n_gen"] in tg:
        m = tg[r["n_gen"]]; test = f"tg{r['n_gen']}"; ours, osd = m["decode_tps_mean"], m["decode_tps_sd"]
    else:
        continue
    rows.append((test, r["avg_ts"], r["stddev_ts"], ours, osd, ours / r["avg_ts"] if r["avg_ts"] else float("nan"),
                 r.get("type_k", ""), m["kv_type"], r.get("n_threads", ""), m["threads"]))
first = json.load(open(f"{d}/pp.json"))[0]
print(f"model {first['model']} ({first['weight_dtype']}), llmi {first['commit']} on {first['device']}, {first['date']}",
      file=sys.stderr)
if fmt == "csv":
    print("test,llamacpp_tps,llamacpp_sd,llmi_tps,llmi_sd,ratio,llamacpp_kv,llmi_kv,llamacpp_threads,llmi_threads")
    for r in rows: print(",".join(str(x) for x in r))
else:
    print("| test | llama.cpp t/s | llmi t/s | llmi / llama.cpp | kv (llama.cpp / llmi) | threads |")
    print("| --- | ---: | ---: | ---: | --- | ---: |")
    for t, a, asd, b, bsd, ratio, kl, km, tl, tm in rows:
        print(f"| {t} | {a:.2f} ± {asd:.2f} | {b:.2f} ± {bsd:.2f} | {ratio:.2f} | {kl} / {km} | {tl} / {tm} |")
PY
