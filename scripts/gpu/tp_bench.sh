#!/usr/bin/env bash
# On nvidia-h200-x2, after scripts/gpu/run.sh has built build-gpu/: the tensor-parallel figures, each
# a short bf16 pretrain_gpt run on mock data over both GPUs (logs in $OUT/tp_*.log, a table last).
#   1. Llama-3-8B shape (32 layers, h 4096, 32 heads, 8 query groups, ffn 14336, vocab 128256, seq 4096, mbs 1,
#      rope base 500000, SwiGLU, RMSNorm, untied, no bias) at TP=2 with --sequence-parallel (bar: >= 50% MFU
#      per GPU), and at TP=2 without SP (activation memory against SP);
#   2. Llama-style 0.89B (16 layers, h 2048, 16 heads, 8 query groups, ffn 5632, vocab 32000, seq 2048, mbs 8,
#      GBS 32) at TP=2, with and without SP.
# Each GPU rank prints "memory (GiB): peak allocated P | ... | model state S | peak activations A".
#   scripts/gpu/tp_bench.sh [8b|small|all]   (default all; ITERS=..., ITERS_8B=... change the lengths)
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/two_gpus.sh  # OUT, the environment, MPI
WHAT=${1:-all}
ITERS=${ITERS:-20}
ITERS_8B=${ITERS_8B:-10}
BIN=build-gpu/tools/pretrain_gpt
COMMON=(--bf16 --mock-data --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2
        --hidden-dropout 0 --attention-dropout 0 --eval-iters 0 --device cuda --swiglu --normalization RMSNorm
        --position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights
        --group-query-attention --tensor-model-parallel-size 2)
LLAMA_089B=(--num-layers 16 --hidden-size 2048 --num-attention-heads 16 --num-query-groups 8 --ffn-hidden-size 5632
            --seq-length 2048 --max-position-embeddings 2048 --vocab-size 32000 --micro-batch-size 8
            --global-batch-size 32 --train-iters "$ITERS" --log-interval 5)
LLAMA3_8B=(--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --num-query-groups 8 --ffn-hidden-size 14336
           --seq-length 4096 --max-position-embeddings 4096 --vocab-size 128256 --rotary-base 500000
           --micro-batch-size 1 --global-batch-size 8 --train-iters "$ITERS_8B" --log-interval 2)

run() {  # run <name> <command...>
  local name=$1
  shift
  echo "== $name: $*" | tee "$OUT/tp_$name.log"
  "$@" >>"$OUT/tp_$name.log" 2>&1
  echo "   rc $?" | tee -a "$OUT/tp_$name.log"
  grep -E "parameters:|memory \(GiB\)|error|watchdog" "$OUT/tp_$name.log" | head -6
  grep -E " iteration +[0-9]+/" "$OUT/tp_$name.log" | tail -1
}

if [ "$WHAT" = all ] || [ "$WHAT" = 8b ]; then
  run 8b_tp2_sp "${MPI[@]}" "$BIN" "${COMMON[@]}" "${LLAMA3_8B[@]}" --sequence-parallel
  run 8b_tp2 "${MPI[@]}" "$BIN" "${COMMON[@]}" "${LLAMA3_8B[@]}"
fi
if [ "$WHAT" = all ] || [ "$WHAT" = small ]; then
  run 089b_tp2 "${MPI[@]}" "$BIN" "${COMMON[@]}" "${LLAMA_089B[@]}"
  run 089b_tp2_sp "${MPI[@]}" "$BIN" "${COMMON[@]}" "${LLAMA_089B[@]}" --sequence-parallel
fi

echo
echo "================ tp_bench summary (last log line; MFU against 989 TFLOP/s bf16; memory: max over the 2 ranks) ================"
for f in "$OUT"/tp_*.log; do
  [ -f "$f" ] || continue
  line=$(grep -E " iteration +[0-9]+/" "$f" | tail -1)
  tps=$(echo "$line" | grep -oE "tokens per second per GPU: [0-9.]+" | grep -oE "[0-9.]+$")
  tfl=$(echo "$line" | grep -oE "TFLOP/s/GPU\): [0-9.]+" | grep -oE "[0-9.]+$")
  ms=$(echo "$line" | grep -oE "iteration \(ms\): [0-9.]+" | grep -oE "[0-9.]+$")
  mfu=$(awk -v t="${tfl:-0}" 'BEGIN { printf "%.1f%%", 100 * t / 989 }')
  peak=$(grep -oE "peak allocated [0-9.]+" "$f" | grep -oE "[0-9.]+" | sort -n | tail -1)
  act=$(grep -oE "peak activations \(peak allocated - model state\) [0-9.]+" "$f" | grep -oE "[0-9.]+$" | sort -n | tail -1)
  printf '%-14s tok/s/GPU %9s  TFLOP/s/GPU %7s  MFU %6s  ms/iter %9s  peak GiB %7s  activations GiB %7s\n' \
    "$(basename "$f" .log | sed 's/^tp_//')" "${tps:--}" "${tfl:--}" "$mfu" "${ms:--}" "${peak:--}" "${act:--}"
done
exit 0
