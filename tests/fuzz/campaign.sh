#!/usr/bin/env bash
# A fuzzing campaign: runs libFuzzer targets one after the other (under nice: the cores
# are shared), on a work corpus outside the tree seeded from tests/fuzz/corpus/NAME, and
# prints one line per target for docs/RELIABILITY.md:
#   target  cpu_s  execs  edges(cov)  features  corpus  crashes
#   tests/fuzz/campaign.sh SECONDS [NAME...]        each target for SECONDS of wall time
#   tests/fuzz/campaign.sh --cpu SECONDS [NAME...]  each target until it has used SECONDS of
#                                                   CPU time (on a busy machine wall time says
#                                                   little)
# Default: every target; needs `make fuzz`.  The work corpus is kept, so a second campaign
# on the same $FUZZ_OUT continues from where the first stopped.
# Holding: while the file $FUZZ_HOLD (default /tmp/llmi-fuzz-hold) exists the fuzzer is
# stopped (SIGINT: it writes its stats and exits) and restarted on the same corpus when the
# file goes, the CPU time and executions adding up: for timing other work on a quiet
# machine.  (SIGSTOP instead would trip libFuzzer's wall-clock -timeout on resume and
# report a false hang.)
# Crashes land in $FUZZ_OUT/NAME/ (default /tmp/llmi-fuzz-campaign) as crash-*/leak-*/timeout-*.
set -u
cd "$(dirname "$0")/../.."
cpu_mode=0
[ "${1:-}" = "--cpu" ] && { cpu_mode=1; shift; }
secs=${1:?usage: tests/fuzz/campaign.sh [--cpu] SECONDS [NAME...]}; shift
names=("$@")
[ ${#names[@]} -eq 0 ] && names=($(cd tests/fuzz && ls fuzz_*.c | sed 's/\.c$//'))
out=${FUZZ_OUT:-/tmp/llmi-fuzz-campaign}
hold=${FUZZ_HOLD:-/tmp/llmi-fuzz-hold}
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=1
tck=$(getconf CLK_TCK)

# CPU seconds (user + system) of a live process, from /proc (fields 14 and 15 of stat).
cpu_of() { awk -v t="$tck" '{ sub(/^.*\) /, ""); printf "%.0f", ($12 + $13) / t }' "/proc/$1/stat" 2>/dev/null; }

printf '%-22s %7s %10s %7s %9s %7s %s\n' target cpu_s execs edges features corpus crashes
for n in "${names[@]}"; do
  bin=build-fuzz/$n
  [ -x "$bin" ] || { echo "$n: $bin not built (make fuzz)"; continue; }
  mkdir -p "$out/$n/work" "$out/$n/artifacts"
  log="$out/$n/log.txt"
  : >"$log"
  total_cpu=0 total_execs=0 start=$(date +%s)
  while :; do
    while [ -e "$hold" ]; do sleep 5; done
    wall=$secs
    [ $cpu_mode -eq 1 ] && wall=$((secs * 1000))   # stopped by CPU time below, not by libFuzzer
    [ $cpu_mode -eq 0 ] && wall=$((secs - ($(date +%s) - start))) && [ "$wall" -le 0 ] && break
    nice -n 10 "$bin" "$out/$n/work" "tests/fuzz/corpus/$n" \
        -max_total_time="$wall" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$out/$n/artifacts/" >"$log.run" 2>&1 &
    pid=$!
    cpu=0 held=0
    while kill -0 "$pid" 2>/dev/null; do
      c=$(cpu_of "$pid"); [ -n "$c" ] && cpu=$c
      if { [ $cpu_mode -eq 1 ] && [ $((total_cpu + cpu)) -ge "$secs" ]; } || [ -e "$hold" ]; then
        [ -e "$hold" ] && held=1
        kill -INT "$pid" 2>/dev/null   # libFuzzer prints its final stats and exits
        break
      fi
      sleep 2
    done
    wait "$pid" 2>/dev/null
    cat "$log.run" >>"$log"
    e=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log.run" | tail -1)
    [ -z "$e" ] && e=$(grep -E '^#[0-9]+' "$log.run" | tail -1 | sed -n 's/^#\([0-9]*\).*/\1/p')
    total_cpu=$((total_cpu + cpu)) total_execs=$((total_execs + ${e:-0}))
    # go on only after a hold; a finished budget, a crash or an exit of its own ends the target
    [ $held -eq 1 ] && { [ $cpu_mode -eq 0 ] || [ "$total_cpu" -lt "$secs" ]; } || break
  done
  rm -f "$log.run"
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(echo "$last" | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
  ft=$(echo "$last" | sed -n 's/.*ft: \([0-9]*\).*/\1/p')
  corp=$(echo "$last" | sed -n 's/.*corp: \([0-9]*\).*/\1/p')
  crashes=$(ls "$out/$n/artifacts" | wc -l)
  printf '%-22s %7s %10s %7s %9s %7s %s\n' "$n" "$total_cpu" "$total_execs" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$crashes"
done
