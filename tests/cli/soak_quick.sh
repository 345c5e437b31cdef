#!/usr/bin/env bash
# The soak in small (scripts/soak.sh --quick): mixed requests under a KV pool of 6 blocks
# on the ASan/UBSan binary, every request checked (token counts, stop strings, logprobs),
# preemption required; a leak fails it at exit.  The issue's 500 requests (~85 s on a quiet
# 2-core machine with the packed kernels; 200 took 34 s); LLMI_SOAK_REQUESTS=N for another count.
. "$(dirname "$0")/../lib/common.sh"
need_model
cd "$(dirname "$0")/../.."
out=$(scripts/soak.sh --quick -n "${LLMI_SOAK_REQUESTS:-500}" --bin "$LLMI_SAN" -m "$MODEL" --out "$TMP/soak" 2>&1); rc=$?
echo "$out"
[ $rc -eq 0 ] || { KEEP=("$TMP/soak"); fail "soak failed"; }
