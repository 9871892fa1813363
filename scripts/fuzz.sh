#!/usr/bin/env bash
# Runs every libFuzzer target of a fuzz build (cmake/Sanitizers.cmake, -DMEGATRON_FUZZ=ON) from its seed corpus.
#
#   scripts/fuzz.sh                       # each target for 1,000,000 inputs (RUNS), JOBS targets at a time
#   SECONDS_EACH=30 scripts/fuzz.sh       # each target for a fixed time instead (CI: scripts/robustness.sh)
#   TARGETS="jsonl npy_cache" scripts/fuzz.sh
#
# BUILD_DIR (default build-sanitize, the one scripts/robustness.sh configures) must hold the fuzz_* executables
# and fuzz-seeds/ (cmake --build BUILD_DIR --target fuzz-all). Each target's new corpus and any finding go to $OUT_DIR/<target>/ (default
# BUILD_DIR/fuzz-out). Prints one line per target: inputs run, seconds, inputs/s, corpus size, findings; exits
# non-zero when any target found something (the crashing input and its log are kept; rerun a finding with
# BUILD_DIR/fuzz/fuzz_<target> <input>).
set -uo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build-sanitize}
OUT_DIR=${OUT_DIR:-$BUILD_DIR/fuzz-out}
RUNS=${RUNS:-1000000}
SECONDS_EACH=${SECONDS_EACH:-}
JOBS=${JOBS:-$(nproc)}
MAX_LEN=${MAX_LEN:-16384}
ALL_TARGETS=$(ls "$BUILD_DIR"/fuzz/fuzz_* 2>/dev/null | grep -v make_seeds | sed 's|.*/fuzz_||' | tr '\n' ' ')
TARGETS=${TARGETS:-$ALL_TARGETS}
[ -n "$TARGETS" ] || { echo "fuzz.sh: no fuzz_* executables in $BUILD_DIR/fuzz (build the fuzz-all target)" >&2; exit 2; }
[ -d "$BUILD_DIR/fuzz-seeds" ] || { echo "fuzz.sh: no $BUILD_DIR/fuzz-seeds (build the fuzz-seeds target)" >&2; exit 2; }

# Sanitizer reports are findings; a leak inside a third-party library is not ours (scripts/lsan.supp).
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/scripts/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

run_target() {  # target
  local t=$1 dir="$OUT_DIR/$1"
  rm -rf "$dir"
  mkdir -p "$dir/corpus" "$dir/findings"
  local limit=(-runs="$RUNS")
  [ -n "$SECONDS_EACH" ] && limit=(-max_total_time="$SECONDS_EACH")
  "$BUILD_DIR/fuzz/fuzz_$t" "${limit[@]}" -max_len="$MAX_LEN" -timeout=20 -rss_limit_mb=3072 \
    -print_final_stats=1 -artifact_prefix="$dir/findings/" "$dir/corpus" "$BUILD_DIR/fuzz-seeds/$t" \
    >"$dir/log" 2>&1
  echo $? >"$dir/status"
}

echo "fuzz.sh: targets: $TARGETS ($([ -n "$SECONDS_EACH" ] && echo "$SECONDS_EACH s" || echo "$RUNS inputs") each, $JOBS at a time)"
running=0
for t in $TARGETS; do
  run_target "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$JOBS" ]; then
    wait -n
    running=$((running - 1))
  fi
done
wait

failed=0
printf "%-26s %12s %9s %10s %8s %9s\n" target inputs seconds inputs/s corpus findings
for t in $TARGETS; do
  dir="$OUT_DIR/$t"
  runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$dir/log" | tail -1 | awk '{print $2}')
  secs=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$dir/log" | tail -1 | awk '{print $5}')
  corpus=$(ls "$dir/corpus" | wc -l)
  findings=$(ls "$dir/findings" | wc -l)
  status=$(cat "$dir/status")
  [ "$status" = 0 ] && [ "$findings" = 0 ] || { failed=1; findings="$findings (exit $status)"; }
  rate=$([ -n "$secs" ] && [ "${secs:-0}" -gt 0 ] && echo $(( ${runs:-0} / secs )) || echo -)
  printf "%-26s %12s %9s %10s %8s %9s\n" "$t" "${runs:-?}" "${secs:-?}" "$rate" "$corpus" "$findings"
  if [ "$status" != 0 ]; then
    echo "---- fuzz_$t: last lines of $dir/log"
    tail -40 "$dir/log"
  fi
done
exit $failed
