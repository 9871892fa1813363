#!/usr/bin/env bash
# CI's sanitizer and fuzzing part (scripts/test.sh runs it after the main builds; docs/robustness.md):
#   1. installs clang-19 and its runtime libraries (scripts/deps.sh --tests --sanitizers) and configures BUILD_DIR
#      (default build-sanitize) with clang, AddressSanitizer + UndefinedBehaviorSanitizer (every finding fatal)
#      and libFuzzer's instrumentation, CPU backend, -O1 with line tables only (ASan's advice: -O1 keeps its reports
#      exact; compiles ~15% faster than -O2 -g, and reports still name file and line);
#   2. builds the fuzz targets, their seed corpora and the tests of SANITIZE_TESTS, and runs those tests under
#      the sanitizers (no suppressions for our code; scripts/lsan.supp names third-party leaks only);
#   3. runs every fuzz target for FUZZ_SECONDS (default 30) from its seeds, FUZZ_JOBS (default 4) at a time
#      (scripts/fuzz.sh): three rounds of 30 s for the 11 targets; on two cores each gets half of one.
# Exits non-zero on any failed test, sanitizer report or fuzz finding. Prints the time of each step.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh --tests --sanitizers
BUILD_DIR=${BUILD_DIR:-build-sanitize}
JOBS=${JOBS:-$(nproc)}
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
FUZZ_JOBS=${FUZZ_JOBS:-4}
# The suites that read outside bytes or write files (data, tokenizers, checkpoints, the command line, the
# tools' bad inputs) and the runtime under them; the op tables' numerics are the main build's job.
SANITIZE_TESTS=${SANITIZE_TESTS:-'^test_(data_|checkpoint_(checkpoint_io|safetensors|sharded_tensor|hf_convert|convert_commands)$|train_|core_|tensor_|runtime_|tools_bad_inputs)'}
GENERATOR=()
command -v ninja >/dev/null 2>&1 && GENERATOR=(-G Ninja)
LAUNCHER=()
if command -v ccache >/dev/null 2>&1; then  # paths hashed relative to the clone, as scripts/test.sh does
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
  # This configuration compiles with line tables (-g), for which ccache also hashes the working directory
  # unless told not to: without this, a clone at another path would compile everything anew.
  export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
  LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi

step_start=$SECONDS
step() {  # name
  echo "== robustness: $1 (previous step $((SECONDS - step_start)) s)"
  step_start=$SECONDS
}

step "configure $BUILD_DIR"
cmake -S . -B "$BUILD_DIR" "${GENERATOR[@]}" "${LAUNCHER[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
  -DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19 -DMEGATRON_CUDA=OFF -DMEGATRON_FUZZ=ON \
  -DMEGATRON_TOKENIZERS=ON -DMEGATRON_BUILD_BENCH=OFF >"$BUILD_DIR.configure.log" 2>&1 ||
  { cat "$BUILD_DIR.configure.log"; exit 1; }

step "build the fuzz targets, their seeds and the sanitizer tests"
tests=$(cd "$BUILD_DIR" && ctest -N -R "$SANITIZE_TESTS" | awk '/Test *#/ {print $3}' | sed 's/_np[0-9]*$//' | sort -u)
cmake --build "$BUILD_DIR" -j "$JOBS" --target fuzz-all $tests

step "run the tests under AddressSanitizer + UndefinedBehaviorSanitizer"
# Leak checking is off for these suites (the fuzzers keep it): several run the tools, whose MPI_Init loads
# OpenMPI's plugins and MPI_Finalize unloads them, so LeakSanitizer sees their process-lifetime allocations
# from an unknown module that no library-name suppression can match. Memory errors and undefined behaviour
# stay fatal.
export ASAN_OPTIONS=abort_on_error=1:detect_leaks=0
export LSAN_OPTIONS=suppressions=$PWD/scripts/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
(cd "$BUILD_DIR" && ctest -R "$SANITIZE_TESTS" -LE gpu --output-on-failure -j "$JOBS")

step "fuzz every target for $FUZZ_SECONDS s"
BUILD_DIR=$BUILD_DIR SECONDS_EACH=$FUZZ_SECONDS JOBS=$FUZZ_JOBS scripts/fuzz.sh

step "done"
