#!/usr/bin/env bash
# bench/profile bad input: a one-line error before any work starts, exit 1 or 2, nothing
# on stdout, no crash (ASan/UBSan build).
. "$(dirname "$0")/../lib/common.sh"
L="$LLMI_SAN"
T="$TESTDATA/bench"
expect_error "unknown preset" "$L" bench --device cpu --dummy llama-9b -p 8 -n 2
expect_error "malformed.json" "$L" bench --device cpu --dummy "$T/malformed.json" -p 8 -n 2
expect_error "intermediate_size" "$L" bench --device cpu --dummy "$T/bad-shape.json" -p 8 -n 2
expect_error "absent.json" "$L" bench --device cpu --dummy "$T/absent.json" -p 8 -n 2
expect_error "-p" "$L" bench --device cpu --dummy "$T/tiny-llama.json" -p 0 -n 2
expect_error "-p" "$L" bench --device cpu --dummy "$T/tiny-llama.json" -p 8,-3 -n 2
expect_error "-n" "$L" bench --device cpu --dummy "$T/tiny-llama.json" -p 8 -n -1
expect_error "-b" "$L" bench --device cpu --dummy "$T/tiny-llama.json" -p 8 -n 2 -b 0
expect_error "-r" "$L" bench --device cpu --dummy "$T/tiny-llama.json" -p 8 -n 2 -r 0
expect_error "--output-len" "$L" bench --device cpu --dummy "$T/tiny-llama.json" --num-requests 4 --output-len 0
expect_error "--input-len" "$L" bench --device cpu --dummy "$T/tiny-llama.json" --num-requests 4 --input-len -5
expect_error "--range-ratio" "$L" bench --device cpu --dummy "$T/tiny-llama.json" --num-requests 4 --range-ratio 1.5
expect_error "--kv-type" "$L" bench --device cpu --dummy "$T/tiny-llama.json" -p 8 --kv-type f32,q4
# Throughput and --ppl run one engine: a second --kv-type or --block-size was dropped silently.
expect_error "--kv-type" "$L" bench --device cpu --dummy "$T/tiny-llama.json" --num-requests 2 --kv-type f32,f16
expect_error "--block-size" "$L" bench --device cpu --dummy "$T/tiny-llama.json" --num-requests 2 --block-size 16,32
expect_error "--kv-type" "$L" bench --device cpu -m "$MODEL" --ppl /etc/hostname --kv-type f32,f16
expect_error "--dummy-dtype" "$L" bench --device cpu --dummy "$T/tiny-llama.json" --dummy-dtype f8
expect_error "-o" "$L" bench --device cpu --dummy "$T/tiny-llama.json" -p 8 -o xml
expect_error "--bogus" "$L" bench --device cpu --dummy "$T/tiny-llama.json" --bogus
expect_error "tokenizer" "$L" bench --device cpu --dummy "$T/tiny-llama.json" --ppl /etc/hostname
# Longer than the context (tiny model: 1024).
expect_error "context" "$L" bench --device cpu --dummy "$T/tiny-llama.json" -p 1000 -n 100
expect_error "context" "$L" bench --device cpu --dummy "$T/tiny-llama.json" --num-requests 3 --input-len 1020 --output-len 10
# A request that cannot fit the KV cache even alone.
expect_error "KV blocks" "$L" bench --device cpu --dummy "$T/tiny-llama.json" -p 64 -n 8 --num-blocks 2 --block-size 16
expect_error "KV blocks" "$L" bench --device cpu --dummy "$T/tiny-llama.json" --num-requests 2 --input-len 64 --num-blocks 3
expect_error "KV blocks" "$L" profile --device cpu --dummy "$T/tiny-llama.json" -p 64 -n 8 --num-blocks 2
expect_error "unknown preset" "$L" profile --device cpu --dummy nope-1b
expect_error "-p" "$L" profile --device cpu --dummy "$T/tiny-llama.json" -p 0
expect_error "--trace" "$L" profile --device cpu --dummy "$T/tiny-llama.json" -p 8 -n 2 --trace /nonexistent/dir/t.json
