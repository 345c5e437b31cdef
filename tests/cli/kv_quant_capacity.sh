#!/usr/bin/env bash
# Issue 12: with a fixed --kv-mem, q8 and fp8 KV hold twice the blocks of f16 (and four
# times f32's), so twice the sequences decode together at the same context.  The largest
# batch without preemption: --max-seqs B decodes B together with none preempted, and
# --max-seqs B+1 either preempts or never decodes B+1 together.
# The expected counts come from the formats, not from llmi: SmolLM2-135M has 30 layers,
# 3 KV heads of 64 (its config.json); a 16-token block holds K and V for every layer:
# f32 4 bytes a value, f16 2, fp8 1 (its per-(layer, head) scales live outside the blocks),
# q8 34 bytes per 32 values (llama.cpp's q8_0: 32 int8 + one f16 scale).
. "$(dirname "$0")/../lib/common.sh"
need_model
declare -A B=([f32]=1 [f16]=2 [q8]=4 [fp8]=4)   # the python below derives them from the formats
for t in f32 f16 q8 fp8; do
    for b in ${B[$t]} $((B[$t] + 1)); do
        "$LLMI" bench --device cpu -m "$MODEL" --kv-type "$t" --kv-mem 6M --num-requests 6 --max-seqs "$b" \
            --input-len 112 --output-len 16 --seed 7 -o json >"$TMP/$t.$b.json" 2>"$TMP/err" ||
            fail "bench --kv-type $t --max-seqs $b failed: $(cat "$TMP/err")"
    done
done
python3 - "$TMP" <<'PY' || exit 1
import json, sys
d = sys.argv[1]
mem, layers, kv_dim, block, ctx = 6 << 20, 30, 3 * 64, 16, 112 + 16 - 1   # the last token is never fed
value_bytes = {"f32": 4 * kv_dim, "f16": 2 * kv_dim, "fp8": kv_dim, "q8": kv_dim // 32 * 34}
batch = {}
for t, vb in value_bytes.items():
    blocks = mem // (block * 2 * layers * vb)
    want = blocks // -(-ctx // block)
    row = json.load(open(f"{d}/{t}.{want}.json"))[0]
    got = (row["kv_blocks_total"], row["decode_batch_max"], row["preemptions"], row["finished_length"])
    assert got == (blocks, want, 0, 6), (t, "blocks, decode batch, preemptions, finished: want", (blocks, want, 0, 6), "got", got)
    over = json.load(open(f"{d}/{t}.{want + 1}.json"))[0]
    assert over["preemptions"] > 0 or over["decode_batch_max"] <= want, (t, want + 1, over["preemptions"], over["decode_batch_max"])
    batch[t] = want
    print(f"{t}: {blocks} blocks; {want} sequences of {ctx} tokens decode together, none preempted;",
          f"--max-seqs {want + 1}: {over['preemptions']} preempted, at most {over['decode_batch_max']} decoding together")
assert batch["q8"] >= 2 * batch["f16"] and batch["fp8"] >= 2 * batch["f16"] and batch["f16"] >= 2 * batch["f32"], batch
PY
