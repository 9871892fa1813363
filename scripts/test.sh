#!/usr/bin/env bash
# Installs missing dependencies, configures, builds and runs every CPU test, then the sanitizer and fuzzing
# configuration (scripts/robustness.sh: the parsers' tests under ASan + UBSan, every fuzz target 30 s).
#
#   scripts/test.sh                 # CUDA build if a toolkit is found (compile + link), plus a CPU-only build
#                                   # configured without PCRE2 (proves NullTokenizer preprocesses and trains there;
#                                   # it skips the `mpi` equivalence suites and the `faults` trials, whose code
#                                   # both builds share)
#   BUILD_DIR=out scripts/test.sh   # another build directory (default: build)
#   SKIP_CPU_ONLY=1 scripts/test.sh # skip the second, CPU-only configuration
#   ROBUSTNESS=0 scripts/test.sh    # without the sanitizer + fuzzing configuration (scripts/robustness.sh: a
#                                   # third, clang build, which CI runs)
#
# GPU tests (ctest label `gpu`) run on a GPU machine through scripts/gpu/run.sh, not here.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh --tests

JOBS=${JOBS:-$(nproc)}
BUILD_DIR=${BUILD_DIR:-build}
GENERATOR=()
command -v ninja >/dev/null 2>&1 && GENERATOR=(-G Ninja)
export PATH="$PATH:/usr/local/cuda/bin"
# Compile through ccache when it is there (scripts/deps.sh --tests installs it): a fresh clone's build reuses
# the objects of earlier builds, its paths hashed relative to the repository so that any clone location hits.
LAUNCHER=()
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
  LAUNCHER=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
            -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi

configure_build_test() {  # dir, ctest labels to leave out, extra cmake args...
  local dir=$1 skip=$2
  shift 2
  echo "== configure $dir $*"
  cmake -S . -B "$dir" "${GENERATOR[@]}" "${LAUNCHER[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >"$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log"; exit 1; }
  grep -E "megatron.cpp:" "$dir.configure.log" || true
  echo "== build $dir"
  cmake --build "$dir" -j "$JOBS"
  echo "== test $dir"
  (cd "$dir" && ctest -LE "$skip" --output-on-failure -j "$JOBS")
}

configure_build_test "$BUILD_DIR" gpu -DMEGATRON_TOKENIZERS=ON
if [ "${SKIP_CPU_ONLY:-0}" != "1" ] && grep -q "CUDA backend ON" "$BUILD_DIR.configure.log"; then
  configure_build_test "$BUILD_DIR-cpu-only" "gpu|mpi|faults" -DMEGATRON_CUDA=OFF -DMEGATRON_TOKENIZERS=ON -DMEGATRON_TOKENIZERS_REGEX=OFF
fi
if [ "${ROBUSTNESS:-1}" = "1" ]; then
  BUILD_DIR="$BUILD_DIR-sanitize" scripts/robustness.sh
fi
