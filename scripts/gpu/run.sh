#!/usr/bin/env bash
# On the GPU machine (device tool), in one call: build, run every test (GPU-labelled ones included) and the
# op benchmarks; logs go to $OUT (or ./gpu-out), a short table is printed last.
#
#   scripts/gpu/run.sh [--tests-only|--bench-only] [--bench-families gemm,attention,...]
#   CTEST_ARGS="-LE mpi" scripts/gpu/run.sh --tests-only      (one GPU: skip the two-rank entries)
# With more than one GPU it also runs scripts/gpu/layouts_check.sh (every layout of all the GPUs against one).
#
# The machine has no network, no cudnn-frontend headers and no PCRE2 headers: carry them in .deps/
# (scripts/gpu/prepare.sh puts cudnn_frontend/ and pcre2/ there) by naming `.deps` in the device call's carry
# list. With .deps/pcre2 the build must have every tokenizer (-DMEGATRON_TOKENIZERS=ON).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0   # never use NVLink multicast on shared machines
MODE=all
FAMILIES=""
while [ $# -gt 0 ]; do
  case $1 in
    --tests-only) MODE=tests ;;
    --bench-only) MODE=bench ;;
    --bench-families) FAMILIES=$2; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

BUILD=build-gpu
summary=()
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
echo "commit $commit" | tee -a "$OUT/gpu.txt"

t0=$(date +%s)
TOKENIZER_ARGS=()
if [ -f .deps/pcre2/include/pcre2.h ]; then
  TOKENIZER_ARGS=(-DPCRE2_ROOT="$PWD/.deps/pcre2" -DMEGATRON_TOKENIZERS=ON)
else
  echo "no .deps/pcre2 (run scripts/gpu/prepare.sh and carry .deps): the PCRE2 tokenizers are skipped" | tee -a "$OUT/gpu.txt"
fi
if [ -x .deps/protobuf/bin/protoc ]; then
  TOKENIZER_ARGS+=(-DProtobuf_ROOT="$PWD/.deps/protobuf")
else
  echo "no .deps/protobuf (run scripts/gpu/prepare.sh and carry .deps): --tensorboard-dir is refused" | tee -a "$OUT/gpu.txt"
fi
if ! cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
     -DCUDNN_FRONTEND_ROOT="$PWD/.deps/cudnn_frontend" "${TOKENIZER_ARGS[@]}" >"$OUT/configure.log" 2>&1; then
  tail -30 "$OUT/configure.log"; echo "configure FAILED"; exit 1
fi
if ! cmake --build $BUILD -j "$(nproc)" >"$OUT/build.log" 2>&1; then
  grep -E "error|FAILED" "$OUT/build.log" | head -40; echo "build FAILED"; exit 1
fi
summary+=("build: ok in $(( $(date +%s) - t0 )) s")
summary+=("$(grep -o 'megatron_tokenizers: NullTokenizer and the families.*' "$OUT/configure.log")")

if [ $MODE != bench ]; then
  rm -rf $BUILD/gtest-results
  # CTEST_ARGS narrows the run, e.g. CTEST_ARGS="-LE mpi" on a one-GPU machine (the mpi GPU entries need two).
  (cd $BUILD && ctest --output-on-failure -j 4 --timeout 600 ${CTEST_ARGS:-}) >"$OUT/ctest.log" 2>&1
  rc=$?
  grep -E "^\s*[0-9]+/[0-9]+ Test|tests passed|tests failed" "$OUT/ctest.log" | tail -60
  # The first failures in full, so the reply shows why.
  grep -E "\[  FAILED  \]|Failure|error:" "$OUT/ctest.log" | head -40
  summary+=("tests: $(grep -E 'tests passed' "$OUT/ctest.log" | tail -1) (rc $rc)")
  # gtest-level counts from the XML reports: executable, tests run, failures, skipped.
  summary+=("$(printf '%-38s %6s %6s %6s' 'ctest entry' tests failed skipped)")
  for x in $BUILD/gtest-results/*.xml; do
    [ -f "$x" ] || continue
    n=$(grep -o '<testsuites tests="[0-9]*"' "$x" | grep -o '[0-9]*')
    f=$(grep -o '<testsuites tests="[0-9]*" failures="[0-9]*"' "$x" | grep -o 'failures="[0-9]*"' | grep -o '[0-9]*')
    s=$(grep -c 'result="skipped"' "$x")
    summary+=("$(printf '%-38s %6s %6s %6s' "$(basename "$x" .xml)" "$n" "$f" "$s")")
  done
fi

# On a machine of several GPUs, every parallel layout over all of them against one GPU's losses (a few minutes).
gpus=$(nvidia-smi -L | wc -l)
if [ $MODE != bench ] && [ "$gpus" -gt 1 ] && [ -x $BUILD/tools/pretrain_gpt ]; then
  GPUS=$gpus OUT="$OUT" scripts/gpu/layouts_check.sh >"$OUT/layouts.log" 2>&1
  lrc=$?
  summary+=("layouts of $gpus GPUs against one (scripts/gpu/layouts_check.sh): rc $lrc")
  while IFS= read -r line; do summary+=("  $line"); done < <(sed -n '/^================ layouts_check/,$p' "$OUT/layouts.log" | tail -n +2)
fi

if [ $MODE != tests ]; then
  args=(--markdown "$OUT/bench_ops.md")
  [ -n "$FAMILIES" ] && args+=(--only "$FAMILIES")
  $BUILD/bench/bench_ops "${args[@]}" >"$OUT/bench.log" 2>&1
  summary+=("bench: rc $?")
fi

echo
echo "================ summary ================"
printf '%s\n' "${summary[@]}"
[ -f "$OUT/bench_ops.md" ] && cat "$OUT/bench_ops.md"
[ -f "$OUT/bench.log" ] && grep -i -E "failed|error" "$OUT/bench.log" | head -20
exit 0
