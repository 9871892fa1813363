#!/usr/bin/env bash
# The memory planner (pretrain_gpt --dry-run, trainer/memory_plan.h) against measured peaks: each configuration
# runs one training iteration and prints the log's "peak allocated" next to the plan's prediction.
#   scripts/memory_plan_check.sh cpu    # tiny models on CPU ranks (mpiexec for TP/PP layouts)
#   scripts/memory_plan_check.sh cuda   # GPT-2 124M, the Llama-style 0.89B and 8B-shaped layers on one GPU
# BIN: the pretrain_gpt to use (default build/tools/pretrain_gpt, or build-gpu/ for cuda).
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-cpu}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ "$MODE" = cuda ]; then BIN=${BIN:-build-gpu/tools/pretrain_gpt}; else BIN=${BIN:-build/tools/pretrain_gpt}; fi
COMMON=(--train-iters 1 --lr 1e-4 --mock-data --attention-dropout 0 --hidden-dropout 0 --eval-iters 0
        --use-distributed-optimizer --device "$MODE")
LLAMA=(--position-embedding-type rope --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights
       --disable-bias-linear --group-query-attention)
check() {  # ranks name flags...
  local ranks=$1 name=$2; shift 2
  local launch=()
  [ "$ranks" -gt 1 ] && launch=(mpiexec --oversubscribe -n "$ranks")
  local predicted measured
  predicted=$("$BIN" "${COMMON[@]}" "$@" --dry-run --dry-run-world-size "$ranks" 2>&1 |
    grep -o "predicted peak allocated: [0-9.]*" | grep -o "[0-9.]*$")
  measured=$(timeout 300 "${launch[@]}" "$BIN" "${COMMON[@]}" "$@" 2>&1 | grep -o "peak allocated [0-9.]*" |
    grep -o "[0-9.]*$" | sort -g | tail -1)
  awk -v n="$name" -v p="$predicted" -v m="$measured" 'BEGIN {
    if (m == "" || p == "") { printf "%-44s predicted %s measured %s (missing)\n", n, p, m; exit }
    printf "%-44s predicted %8.3f GiB  measured %8.3f GiB  error %+6.1f%%\n", n, p, m, 100 * (p - m) / m }'
}
if [ "$MODE" = cpu ]; then
  T=(--num-layers 4 --hidden-size 256 --num-attention-heads 4 --num-query-groups 2 --ffn-hidden-size 704
     --seq-length 256 --max-position-embeddings 256 --vocab-size 4096 "${LLAMA[@]}")
  G=(--num-layers 4 --hidden-size 256 --num-attention-heads 4 --ffn-hidden-size 1024 --seq-length 256
     --max-position-embeddings 256 --vocab-size 4096 --bf16)
  check 1 "llama-tiny mbs 4" "${T[@]}" --bf16 --micro-batch-size 4 --global-batch-size 4
  check 1 "llama-tiny mbs 8" "${T[@]}" --bf16 --micro-batch-size 8 --global-batch-size 8
  check 1 "gpt-tiny mbs 4" "${G[@]}" --micro-batch-size 4 --global-batch-size 4
  check 1 "llama-tiny mbs 8 full recompute" "${T[@]}" --bf16 --micro-batch-size 8 --global-batch-size 8 \
    --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
  check 1 "llama-tiny mbs 8 selective mlp" "${T[@]}" --bf16 --micro-batch-size 8 --global-batch-size 8 \
    --recompute-granularity selective --recompute-modules mlp
  check 1 "llama-tiny mbs 4 fp32 FP8" "${T[@]}" --micro-batch-size 4 --global-batch-size 4 --fp8-format hybrid
  check 2 "llama-tiny mbs 4 TP=2 SP" "${T[@]}" --bf16 --micro-batch-size 4 --global-batch-size 4 \
    --tensor-model-parallel-size 2 --sequence-parallel
  check 2 "llama-tiny mbs 2 PP=2 gbs 8" "${T[@]}" --bf16 --micro-batch-size 2 --global-batch-size 8 \
    --pipeline-model-parallel-size 2
  check 4 "llama-tiny mbs 1 PP=2 x2 chunks gbs 8" "${T[@]}" --bf16 --micro-batch-size 1 --global-batch-size 8 \
    --pipeline-model-parallel-size 4 --num-layers 8 --num-layers-per-virtual-pipeline-stage 1
  check 2 "llama-tiny mbs 8 CP=2" "${T[@]}" --bf16 --micro-batch-size 8 --global-batch-size 8 --context-parallel-size 2
else
  L089=(--num-layers 16 --hidden-size 2048 --num-attention-heads 16 --num-query-groups 8 --ffn-hidden-size 5632
        --seq-length 2048 --max-position-embeddings 2048 --vocab-size 32000 --bf16 "${LLAMA[@]}")
  L8B=(--num-layers 8 --hidden-size 4096 --num-attention-heads 32 --num-query-groups 8 --ffn-hidden-size 14336
       --seq-length 4096 --max-position-embeddings 4096 --vocab-size 128256 --rotary-base 500000 --bf16 "${LLAMA[@]}")
  GPT2=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024
        --vocab-size 50257 --bf16)
  check 1 "gpt2-124m mbs 16" "${GPT2[@]}" --micro-batch-size 16 --global-batch-size 16
  check 1 "gpt2-124m mbs 64" "${GPT2[@]}" --micro-batch-size 64 --global-batch-size 64
  check 1 "llama-0.89b mbs 1" "${L089[@]}" --micro-batch-size 1 --global-batch-size 1
  check 1 "llama-0.89b mbs 4" "${L089[@]}" --micro-batch-size 4 --global-batch-size 4
  check 1 "llama-0.89b mbs 16" "${L089[@]}" --micro-batch-size 16 --global-batch-size 16
  check 1 "llama-0.89b mbs 8 selective mlp" "${L089[@]}" --micro-batch-size 8 --global-batch-size 8 \
    --recompute-granularity selective --recompute-modules mlp
  check 1 "llama-0.89b mbs 16 full recompute" "${L089[@]}" --micro-batch-size 16 --global-batch-size 16 \
    --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
  check 1 "llama-0.89b mbs 4 FP8" "${L089[@]}" --micro-batch-size 4 --global-batch-size 4 --fp8-format hybrid
  check 1 "llama3-8b 8 layers mbs 1" "${L8B[@]}" --micro-batch-size 1 --global-batch-size 1
  check 1 "llama3-8b 8 layers mbs 1 FP8" "${L8B[@]}" --micro-batch-size 1 --global-batch-size 1 --fp8-format hybrid
fi
