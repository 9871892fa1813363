#!/usr/bin/env bash
# On the GPU machine after scripts/gpu/run.sh has built build-gpu/: a short bf16 pretrain_gpt run of a
# GPT-2 124M-shaped model on mock data (Megatron's log line: tokens/s, TFLOP/s/GPU, peak memory).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
ITERS=${ITERS:-20}
MBS=${MBS:-8}
GBS=${GBS:-32}
build-gpu/tools/pretrain_gpt --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 \
  --max-position-embeddings 1024 --micro-batch-size "$MBS" --global-batch-size "$GBS" --train-iters "$ITERS" \
  --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine --lr-warmup-iters 2 --bf16 --mock-data --vocab-size 50257 \
  --hidden-dropout 0 --attention-dropout 0 --log-interval 5 --eval-interval 1000 --eval-iters 1 \
  --device cuda 2>&1 | tee "$OUT/pretrain_smoke.log" | grep -E "iteration|memory|parameters|error"
