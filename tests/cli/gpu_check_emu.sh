#!/usr/bin/env bash
# scripts/gpu-check.sh, the one command a device session runs, rehearsed on the CPU emulation
# of CUDA (GPU_CHECK_DEVICE=emu): its e2e, bench, profile, ab, tput and ncu phases at the rehearsal's small
# shapes, every cuda step on build-emu/llmi and every cpu step on ./llmi.  A device session
# has 15 minutes in all, so the script's own plumbing (its command lines, the parsing of each
# step's stdout apart from its stderr, the comparisons' rules, the table) must already work
# here: exit 0, and every row the phases promise present and ok (or, where the
# rehearsal cannot have it, "not available"); GPU_CHECK_AB=all, so that the A/B rows a
# device already decided (skipped there by default) still run here.  The figures are the emulator's, not results.
. "$(dirname "$0")/../lib/common.sh"
need_emu
ROOT=$(dirname "$TESTDATA")
# The ncu phase against a stand-in ncu (no Nsight Compute here): it runs the command it is
# given, with ncu's options stripped off, and on --import prints a report in ncu's raw CSV
# form (a header, a units row, a row a launch), so that the phase's command lines, its
# parsing and its rows are what run.
mkdir -p "$TMP/bin"
cat > "$TMP/bin/ncu" << 'NCU'
#!/usr/bin/env bash
if [ "$1" = --import ]; then
  echo '"ID","Kernel Name","dram__bytes_read.sum","dram__throughput.avg.pct_of_peak_sustained_elapsed","gpu__time_duration.sum","launch__grid_size","launch__registers_per_thread","sm__warps_active.avg.pct_of_peak_sustained_active"'
  echo '"","","byte","%","nsecond","","register/thread","%"'
  echo '"0","llmi_int4_tc_gemv_kernel<1, 4>(llmi_i4g_dev, int)","13107200","71.5","4100","384","96","40.1"'
  exit 0
fi
out=
while [ $# -gt 0 ]; do
  case "$1" in
    -f) shift ;;
    -o) out=$2; shift 2 ;;
    --kernel-name-base|--kernel-name|--launch-skip|--launch-count|--metrics) shift 2 ;;
    *) break ;;
  esac
done
"$@" && : > "$out.ncu-rep"
NCU
chmod +x "$TMP/bin/ncu"
# (MODEL unset: the suite exports SmolLM2 there, and the rehearsal wants its tiny model)
env -u MODEL PATH="$TMP/bin:$PATH" OUT=$TMP/gc GPU_CHECK_DEVICE=emu GPU_CHECK_AB=all BUDGET=500 \
  bash "$ROOT/scripts/gpu-check.sh" --phase e2e,bench,profile,ab,tput,moe,ncu >"$TMP/gc.log" 2>&1
rc=$?
work=$(sed -n 's/.*; work dir \(\/tmp\/gpu-check\.[A-Za-z0-9]*\))$/\1/p' "$TMP/gc.log")
[ -n "$work" ] && [ -d "$work" ] && rm -rf "$work"
[ -f "$TMP/gc/gpu-check.tsv" ] || fail "gpu-check wrote no table (exit $rc): $(tail -5 "$TMP/gc.log")"
python3 - "$TMP/gc/gpu-check.tsv" "$rc" <<'PY' || fail "gpu-check's table: $(sed -n '/^check /,$p' "$TMP/gc.log" | grep -v '| ok ')"
import sys
rows = {}
for line in open(sys.argv[1], encoding="utf-8").read().splitlines()[1:]:
    check, result, figure = line.split("\t")
    rows[check] = (result, figure)
models = ["llama-gqa-rope3", "llama-attn-bias", "llama-headdim", "mistral-sharded", "qwen2-bias-tied", "qwen3-qknorm",
          "gemma2-capped", "gemma2-classic", "gemma3-scaled", "gemma3-swa", "mixtral-tiny", "qwen3moe-nonorm",
          "qwen3moe-tiny", "qwen2-yarn", "llama-yarn-params", "phi3-fused", "phi3-swa", "phi3-longrope",
          "phi4mini-partial", "smollm3-nope", "granite-mult", "granitemoe-tiny"]
want_ok = (["device", "binaries (this tree)", "cuda backend starts"]
           + [f"greedy 4 tokens cuda vs cpu {m}" for m in models]
           + ["greedy --spec ngram cuda vs cpu without (llama-gqa-rope3)",
              "prompt logprobs cuda vs transformers (HF test models)",
              "--lora cuda vs PEFT (2 adapters on f32; q/v on Q4_K_M)",
              "batch 64, chunk 48, 12 blocks: cuda vs cpu alone", "batch 64 forced preemption",
              "WikiText-2 ppl cuda vs cpu (2 x 128)", "WikiText-2 ppl --kv-type q8 cuda vs cpu (2 x 128)",
              "WikiText-2 ppl --kv-type fp8 cuda vs cpu (2 x 128)"]
           + [f"tiny llama (rehearsal) {r}" for r in ("bf16 decode b1 (target 170)", "bf16 decode b32",
              "TTFT p128 (target 55 ms)", "TTFT p128 with LLMI_GEMM_TUNE=8",
              "TTFT p128 with register-loaded tiles (LLMI_ATTN_TILES=sync)",
              "bf16 decode b1 on cuBLASLt (LLMI_DENSE_GEMV=off)",
              "decode b8 p64: tensor-core (cp.async, register tiles) vs fp32 attention", "int4 decode b1 (target 400)",
              "int4 decode b16", "int4 decode b1, b16 on 6e0b768's kernels (LLMI_I4_GEMV=mma)",
              "int4 decode b1, b16 on the warp GEMV", "int4 decode b16 on the chunk GEMV",
              "int4 decode b16 by dequant + GEMM")]
           + [f"profile tiny llama (rehearsal) {r}" for r in ("bf16 p128 b1 prefill", "bf16 p128 b1 decode",
              "int4 decode b1", "int4 decode b16", "bf16 decode b8 p64")]
           + [f"ncu tiny llama (rehearsal) {r}" for r in ("int4 decode b1", "int4 decode b16",
              "bf16 decode attention b8 p64")]
           + ["throughput 8/8 x4 (target 15000)", "throughput 128/8 x4 (target 2300)",
              "throughput 62/62 x4 (target 10000)", "throughput 128/8 x1: --max-batch-tokens 512 vs 128",
              "throughput 8/8 x4: --max-seqs 64 --max-batch-tokens 1024 (vLLM's offline defaults)",
              "cpu references"]
           + [f"tiny moe (rehearsal) {r}" for r in ("bf16 decode b1", "bf16 decode b16", "TTFT p128",
              "throughput 8/8 x4")])
may_be_missing = {"spec ngram on cuda: proposals verified", "measured ceilings (torch)",
                  # (SmolLM2's GGUF only: the rehearsal's model is a tiny HF directory)
                  "WikiText-2 ppl cuda vs cpu on the same bf16 weights (2 x 128)",
                  "greedy 4 tokens cuda vs cpu on the same bf16 weights (llama-gqa-rope3)",
                  "batch 64 cuda vs cpu alone on the same bf16 weights"}
bad = [f"{c}: {rows[c][0]} {rows[c][1]}" if c in rows else f"{c}: no row" for c in want_ok
       if rows.get(c, ("",))[0] != "ok"]
bad += [f"{c}: {r} {f}" for c, (r, f) in rows.items()
        if c not in want_ok and not (c in may_be_missing and r in ("ok", "not available"))]
assert not bad, "; ".join(bad)
assert sys.argv[2] == "0", f"exit {sys.argv[2]} with every row ok"
# the figures parsed from each step's stdout are numbers, not the fallbacks of a failed parse
for c in want_ok:
    assert "?" not in rows[c][1] and rows[c][1], f"{c}: figure '{rows[c][1]}'"
# a profile row names ops with their share and time, the int4 ones their linears
import re
for c in want_ok:
    if c.startswith("profile "):
        assert re.fullmatch(r"step [0-9.]+ ms: ([a-z_]+ [0-9]+% [0-9.]+ ms( [0-9]+ GB/s)?(, |$))+", rows[c][1]), f"{c}: figure '{rows[c][1]}'"
        if "int4" in c:
            assert re.search(r"mlp_up|qkv|mlp_down|o_proj", rows[c][1]), f"{c}: no linear among the largest ops"
    if c.startswith("ncu "):   # the stand-in's one launch, parsed
        assert rows[c][1] == ("llmi_int4_tc_gemv_kernel<1, 4> x1: 4.1 us, DRAM 72% (3197 GB/s read), warps 40%, "
                              "96 regs, grid 384"), f"{c}: figure '{rows[c][1]}'"
print(f"gpu-check on the emulation: exit 0, {len(rows)} rows, {sum(r == 'ok' for r, _ in rows.values())} ok")
print("\n".join(f"  {c}: {f}" for c, (r, f) in rows.items() if c.startswith(("batch", "WikiText", "throughput 62"))))
PY
