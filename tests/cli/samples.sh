#!/usr/bin/env bash
# generate --samples N and a --prompts line's "n" (vLLM's n), end to end on SmolLM2:
#   - N completions of a prompt, in order (index, sample), sample j equal token for token to
#     a run of the prompt alone with seed + j (vLLM's seeding of n), under ASan/UBSan too;
#   - the prompt is computed once: samples after the first take its whole blocks from the
#     prefix cache (cached_tokens), though all N arrive together; with --no-prefix-cache each
#     computes it;
#   - a line's "n" and "seed" over the flag's; a plain line gets the flag's count;
#   - bench --samples: N sequences per prompt, prompts counted as requests, the prefix shared;
#   - bad counts: one line naming the flag or the line, exit 2.
. "$(dirname "$0")/../lib/common.sh"
need_model
L="$LLMI_SAN"
P="Write a short poem about the sea, the wind, the old lighthouse keeper and his dog who waits by the door every evening."
gen=(generate --device cpu -m "$MODEL" --json --no-stats --chat -n 12 --ignore-eos)
toks() { python3 -c 'import json,sys; print(" ".join(str(t) for t in json.load(sys.stdin)["tokens"]))'; }

"$LLMI" "${gen[@]}" -p "$P" --samples 4 -s "$SEED" >"$TMP/four.jsonl" || fail "--samples 4 run"
"$LLMI_SAN" "${gen[@]}" -p "$P" --samples 4 -s "$SEED" >"$TMP/four-san.jsonl" || fail "--samples 4 run (san)"
cmp -s "$TMP/four.jsonl" "$TMP/four-san.jsonl" ||
  python3 -c 'import json,sys; a=[json.loads(l)["tokens"] for l in open(sys.argv[1])]; b=[json.loads(l)["tokens"] for l in open(sys.argv[2])]; sys.exit(a != b)' \
    "$TMP/four.jsonl" "$TMP/four-san.jsonl" || fail "--samples: llmi-san gave other tokens"
for j in 0 1 2 3; do
  "$LLMI" "${gen[@]}" -p "$P" -s $((SEED + j)) | toks >"$TMP/alone$j" || fail "alone run, seed $((SEED + j))"
done
"$LLMI" "${gen[@]}" -p "$P" --samples 4 -s "$SEED" --no-prefix-cache >"$TMP/nocache.jsonl" || fail "--no-prefix-cache run"
python3 - "$TMP" <<'PY' || fail "--samples"
import json, sys
d = sys.argv[1]
rs = [json.loads(l) for l in open(f"{d}/four.jsonl")]
assert [(r["index"], r["sample"]) for r in rs] == [(0, j) for j in range(4)], [(r["index"], r["sample"]) for r in rs]
for j, r in enumerate(rs):
    alone = [int(t) for t in open(f"{d}/alone{j}").read().split()]
    assert r["tokens"] == alone, (j, r["tokens"], alone)
assert len({tuple(r["tokens"]) for r in rs}) > 1, "four samples, all the same"
n = rs[0]["prompt_tokens"]
whole = (n - 1) // 16 * 16           # whole blocks short of the last token (--block-size 16)
cached = [r["cached_tokens"] for r in rs]
assert whole > 0 and cached == [0] + [whole] * 3, (cached, n)
nc = [json.loads(l) for l in open(f"{d}/nocache.jsonl")]
assert [r["cached_tokens"] for r in nc] == [0] * 4 and [r["tokens"] for r in nc] == [r["tokens"] for r in rs]
print(f"--samples 4: each as its seed alone; prompt {n} tokens, cached {cached} (none without the prefix cache)")
PY

# a line's "n" and "seed"; a plain line takes --samples; a line's "n": 1 overrides it
printf '{"prompt": "%s", "n": 3, "seed": 100}\n%s\n{"prompt": "%s", "n": 1}\n' "$P" "$P" "$P" >"$TMP/p.jsonl"
"$LLMI" generate --device cpu -m "$MODEL" --json --no-stats -n 12 --ignore-eos --prompts "$TMP/p.jsonl" --samples 2 \
  -s "$SEED" >"$TMP/p.out" || fail "--prompts with n"
for s in 100 101 102; do
  printf '{"prompt": "%s", "seed": %d}\n' "$P" $s >"$TMP/one.jsonl"
  "$LLMI" generate --device cpu -m "$MODEL" --json --no-stats -n 12 --ignore-eos --prompts "$TMP/one.jsonl" | toks \
    >"$TMP/seed$s" || fail "seed $s alone"
done
python3 - "$TMP" <<'PY' || fail "--prompts n"
import json, sys
d = sys.argv[1]
rs = [json.loads(l) for l in open(f"{d}/p.out")]
got = [(r["index"], r["sample"]) for r in rs]
assert got == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0)], got
for j, s in enumerate((100, 101, 102)):
    assert rs[j]["tokens"] == [int(t) for t in open(f"{d}/seed{s}").read().split()], (j, s)
print("--prompts: a line's n and seed (seed + j), --samples for the plain line, n 1 over it")
PY

# bench --samples: each prompt's N sequences arrive together and share its prefill
"$LLMI" bench --device cpu -m "$MODEL" --num-requests 4 --samples 3 --input-len 40 --output-len 4 --temp 1 -o json \
  >"$TMP/b.json" 2>"$TMP/b.err" || fail "bench --samples: $(tail -3 "$TMP/b.err")"
"$LLMI" bench --device cpu -m "$MODEL" --num-requests 4 --samples 3 --input-len 40 --output-len 4 --temp 1 \
  >"$TMP/b.md" 2>"$TMP/b.err" || fail "bench --samples md: $(tail -3 "$TMP/b.err")"
python3 - "$TMP/b.json" "$TMP/b.md" <<'PY' || fail "bench --samples"
import json, sys
r = json.load(open(sys.argv[1]))[0]
got = {k: r[k] for k in ("num_requests", "samples", "prompt_tokens", "output_tokens", "cached_prompt_tokens")}
assert got == {"num_requests": 4, "samples": 3, "prompt_tokens": 480, "output_tokens": 48,
               "cached_prompt_tokens": 4 * 2 * 32}, got
assert abs(r["requests_per_s"] * r["elapsed_s"] - 4) < 1e-6, (r["requests_per_s"], r["elapsed_s"])
assert "4 req x3 samples in40/out4" in open(sys.argv[2]).read()
print("bench --samples 3: 4 prompts, 12 sequences, 256 of 480 prompt tokens cached")
PY
expect_error "--samples" "$L" bench --device cpu -m "$MODEL" --turns 2 --samples 2 --num-requests 1
expect_error "--samples" "$L" generate --device cpu -m "$MODEL" -p hi --samples 0
expect_error "--samples" "$L" generate --device cpu -m "$MODEL" -p hi --samples 1025
expect_error "--samples" "$L" generate --device cpu -m "$MODEL" -cnv --samples 2
printf '{"prompt": "x", "n": 0}\n' >"$TMP/b1.jsonl"
expect_error "b1.jsonl:1: \"n\"" "$L" generate --device cpu -m "$MODEL" --prompts "$TMP/b1.jsonl"
printf '{"prompt": "x"}\n{"prompt": "x", "n": 2.5}\n' >"$TMP/b2.jsonl"
expect_error "b2.jsonl:2: \"n\"" "$L" generate --device cpu -m "$MODEL" --prompts "$TMP/b2.jsonl"
echo "samples: ok"
