#!/usr/bin/env bash
# A fuzzing campaign: runs libFuzzer targets one after the other (under nice: the cores
# are shared), each for SECONDS of wall time, on a work corpus outside the tree seeded
# from tests/fuzz/corpus/NAME, and prints one line per target for docs/RELIABILITY.md:
#   target  cpu_s  execs  edges(cov)  features  corpus  crashes
#   tests/fuzz/campaign.sh SECONDS [NAME...]     (default: every target; needs `make fuzz`)
# Crashes land in $FUZZ_OUT/NAME/ (default /tmp/llmi-fuzz-campaign) as crash-*/leak-*/timeout-*.
set -u
cd "$(dirname "$0")/../.."
secs=${1:?usage: tests/fuzz/campaign.sh SECONDS [NAME...]}; shift
names=("$@")
[ ${#names[@]} -eq 0 ] && names=($(cd tests/fuzz && ls fuzz_*.c | sed 's/\.c$//'))
out=${FUZZ_OUT:-/tmp/llmi-fuzz-campaign}
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=1
printf '%-22s %7s %10s %7s %9s %7s %s\n' target cpu_s execs edges features corpus crashes
for n in "${names[@]}"; do
  bin=build-fuzz/$n
  [ -x "$bin" ] || { echo "$n: $bin not built (make fuzz)"; continue; }
  mkdir -p "$out/$n/work" "$out/$n/artifacts"
  log="$out/$n/log.txt"
  /usr/bin/time -f 'cputime %U %S' -o "$out/$n/time.txt" nice -n 10 "$bin" "$out/$n/work" "tests/fuzz/corpus/$n" \
      -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$out/$n/artifacts/" >"$log" 2>&1
  cpu=$(awk '/^cputime/ {printf "%.0f", $2 + $3}' "$out/$n/time.txt")
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(echo "$last" | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
  ft=$(echo "$last" | sed -n 's/.*ft: \([0-9]*\).*/\1/p')
  corp=$(echo "$last" | sed -n 's/.*corp: \([0-9]*\).*/\1/p')
  crashes=$(ls "$out/$n/artifacts" | wc -l)
  printf '%-22s %7s %10s %7s %9s %7s %s\n' "$n" "$cpu" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$crashes"
done
