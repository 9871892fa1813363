#!/usr/bin/env bash
# On the GPU machine, one call: the Mixtral-style model of moe_bench.sh (16 layers, 8 experts, top-2, seq 4096,
# mbs 2, gbs 16) built from this tree and from OLD_TREE (an unpacked `git archive` of an earlier commit), run
# alternately A B A B for ITERS iterations each (default 10), for a before/after figure measured on the same
# machine in the same call. The first iterations pay one-off costs (cuDNN graphs, GEMM algorithm choices for
# each new expert-row family), so each run reports the mean ms/iter of its last half. Then, with PROFILE=1,
# the model at one micro-batch per iteration: its wall time, and one iteration under Nsight Compute (the
# summed GPU time per kernel name, largest first). Logs under $OUT.
#   [ROUNDS=2] [ITERS=10] OLD_TREE=old PROFILE=1 scripts/gpu/moe_ab.sh [extra pretrain_gpt flags...]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
ITERS=${ITERS:-10}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
T0=$(date +%s)
since() { echo "-- $1 at $(( $(date +%s) - T0 )) s"; }
build() {  # build(source dir, build dir)
  local src=$1 dir=$2
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCUDNN_FRONTEND_ROOT="$PWD/.deps/cudnn_frontend" >"$OUT/configure-$(basename "$dir").log" 2>&1 &&
    cmake --build "$dir" -j "$(nproc)" --target pretrain_gpt >"$OUT/build-$(basename "$dir").log" 2>&1 ||
    { grep -E "error|FAILED" "$OUT/build-$(basename "$dir").log" | head; exit 1; }
}
build . build-gpu
if [ -n "${OLD_TREE:-}" ]; then
  [ -e "$OLD_TREE/.deps" ] || ln -s "$PWD/.deps" "$OLD_TREE/.deps"  # the carried dependencies
  build "$OLD_TREE" build-old
fi
since build
source scripts/gpu/moe_model.sh
run() {  # run(name, binary)
  local name=$1 bin=$2 first=$(( ITERS / 2 + 1 ))
  timeout 120 "$bin" "${MOE[@]}" --train-iters "$ITERS" "${@:3}" >"$OUT/$name.log" 2>&1
  echo "$name: $(grep -E "iteration +[0-9]+/" "$OUT/$name.log" | awk -v first=$first '
      { split($0, f, "iteration +"); split(f[2], it, "/"); if (it[1] + 0 < first) next;
        if (match($0, /per iteration \(ms\): [0-9.]+/)) { s += substr($0, RSTART + 20, RLENGTH - 20); n++ } }
      END { if (n) printf "%.1f ms/iter (iterations %d-%d)", s / n, first, first + n - 1 }') | $(grep -o \
      "peak allocated [0-9.]*" "$OUT/$name.log" | head -1)"
  grep -iE "error|out of memory" "$OUT/$name.log" | head -2
}
for round in $(seq 1 "${ROUNDS:-2}"); do
  run "new_$round" build-gpu/tools/pretrain_gpt "$@"
  [ -n "${OLD_TREE:-}" ] && run "old_$round" build-old/tools/pretrain_gpt "$@"
done
since runs
if [ "${PROFILE:-0}" = 1 ]; then
  # One micro-batch per iteration: its wall time without the profiler against the GPU time of its kernels
  # (each launch timed alone by Nsight Compute, iteration 8, after the one-off costs): the difference is time
  # the GPU waited for the host.
  ONE_MB=(--global-batch-size 2 --train-iters 10)
  run one_microbatch build-gpu/tools/pretrain_gpt "$@" "${ONE_MB[@]}"
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout 300 "$NCU" --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \
    --page raw build-gpu/tools/pretrain_gpt "${MOE[@]}" "$@" "${ONE_MB[@]}" --profile --profile-step-start 8 \
    --profile-step-end 9 >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
  python3 scripts/gpu/kernel_times.py "$OUT/ncu.csv" --top 30
  since profile
fi
