#!/usr/bin/env bash
# On nvidia-h200-x2, after scripts/gpu/run.sh has built build-gpu/: the data-parallel figures,
# each a short bf16 pretrain_gpt run on mock data (logs in $OUT/dp_*.log, a table last).
#   1. Llama-style 0.89B (16 layers, h 2048, 16 heads, 8 query groups, ffn 5632, SwiGLU, RMSNorm, RoPE,
#      untied, vocab 32000, seq 2048, mbs 8): one GPU at GBS 32 vs DP=2 at GBS 64 (the same work per GPU),
#      replicated and distributed optimizer, both with overlapped reduction; DP=2 at GBS 32 too (the
#      PyTorch DDP peer's setting).
#   2. Optimizer state per GPU with and without --use-distributed-optimizer (the DP=2 runs above print
#      "optimizer state per rank ... computed, ... allocated" and each rank's peak memory).
#   3. A Llama-3-8B-shaped model (32 layers, h 4096, 32 heads, 8 query groups, ffn 14336, vocab 128256,
#      seq 4096, mbs 1) at DP=2 with the distributed optimizer.
#   scripts/gpu/dp_bench.sh [small|memory|8b|all]   (default all; ITERS=... changes the length)
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/two_gpus.sh  # OUT, the environment, MPI
WHAT=${1:-all}
ITERS=${ITERS:-20}
BIN=build-gpu/tools/pretrain_gpt
COMMON=(--bf16 --mock-data --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2
        --hidden-dropout 0 --attention-dropout 0 --train-iters "$ITERS" --log-interval 5 --eval-iters 0
        --device cuda --swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear
        --untie-embeddings-and-output-weights --group-query-attention)
LLAMA_089B=(--num-layers 16 --hidden-size 2048 --num-attention-heads 16 --num-query-groups 8 --ffn-hidden-size 5632
            --seq-length 2048 --max-position-embeddings 2048 --vocab-size 32000 --micro-batch-size 8)
LLAMA3_8B=(--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --num-query-groups 8 --ffn-hidden-size 14336
           --seq-length 4096 --max-position-embeddings 4096 --vocab-size 128256 --rotary-base 500000
           --micro-batch-size 1)

run() {  # run <name> <command...>
  local name=$1
  shift
  echo "== $name: $*" | tee "$OUT/dp_$name.log"
  "$@" >>"$OUT/dp_$name.log" 2>&1
  echo "   rc $?" | tee -a "$OUT/dp_$name.log"
  grep -E "optimizer state|memory \(GiB\)|error|watchdog" "$OUT/dp_$name.log" | head -6
  grep -E " iteration +[0-9]+/" "$OUT/dp_$name.log" | tail -1
}

if [ "$WHAT" = all ] || [ "$WHAT" = small ] || [ "$WHAT" = memory ]; then
  run 089b_1gpu_gbs32 "$BIN" "${COMMON[@]}" "${LLAMA_089B[@]}" --global-batch-size 32
  run 089b_dp2_gbs64 "${MPI[@]}" "$BIN" "${COMMON[@]}" "${LLAMA_089B[@]}" --global-batch-size 64 \
    --overlap-grad-reduce
  run 089b_dp2_gbs64_distopt "${MPI[@]}" "$BIN" "${COMMON[@]}" "${LLAMA_089B[@]}" --global-batch-size 64 \
    --overlap-grad-reduce --use-distributed-optimizer --overlap-param-gather
  run 089b_dp2_gbs32 "${MPI[@]}" "$BIN" "${COMMON[@]}" "${LLAMA_089B[@]}" --global-batch-size 32 \
    --overlap-grad-reduce
fi
if [ "$WHAT" = all ] || [ "$WHAT" = 8b ]; then
  ITERS_8B=${ITERS_8B:-10}
  run 8b_dp2_distopt "${MPI[@]}" "$BIN" "${COMMON[@]}" "${LLAMA3_8B[@]}" --global-batch-size 8 \
    --train-iters "$ITERS_8B" --log-interval 2 --overlap-grad-reduce --use-distributed-optimizer --overlap-param-gather
fi

echo
echo "================ dp_bench summary (last log line of each run: tokens/s per GPU, TFLOP/s/GPU) ================"
for f in "$OUT"/dp_*.log; do
  [ -f "$f" ] || continue
  line=$(grep -E " iteration +[0-9]+/" "$f" | tail -1)
  tps=$(echo "$line" | grep -oE "tokens per second per GPU: [0-9.]+" | grep -oE "[0-9.]+$")
  tfl=$(echo "$line" | grep -oE "TFLOP/s/GPU\): [0-9.]+" | grep -oE "[0-9.]+$")
  ms=$(echo "$line" | grep -oE "iteration \(ms\): [0-9.]+" | grep -oE "[0-9.]+$")
  opt=$(grep -oE "optimizer state per rank \(.*" "$f" | head -1 | sed 's/.*: //')
  peak=$(grep -oE "peak allocated [0-9.]+" "$f" | grep -oE "[0-9.]+" | sort -n | tail -1)
  printf '%-28s tok/s/GPU %9s  TFLOP/s/GPU %7s  ms/iter %8s  peak GiB %7s  optimizer %s\n' \
    "$(basename "$f" .log | sed 's/^dp_//')" "${tps:--}" "${tfl:--}" "${ms:--}" "${peak:--}" "${opt:--}"
done
exit 0
