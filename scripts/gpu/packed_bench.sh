#!/usr/bin/env bash
# On the GPU machine: documents inside sequences on the Llama-style 0.89B (seq 2048, mbs 8, gbs 32, bf16, the
# distributed optimizer) on real text (.deps/docs from scripts/gpu/prepare_text_corpus.sh, carried with .deps),
# after `BUILD_TARGETS=pretrain_gpt scripts/gpu/fp8_bench.sh build`:
#   rows       the rows attended whole (causal over 2048 tokens, documents seeing each other)
#   documents  --reset-attention-mask --reset-position-ids: each document attends only to itself (cuDNN's ragged
#              offsets); the log's TFLOP/s counts only the attention computed, tokens/s is comparable as it is
# Prints per run: ms/iter (mean of iterations 3-ITERS), tokens/s, TFLOP/s, peak memory, the first and last loss.
#   scripts/gpu/packed_bench.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
ITERS=${ITERS:-12}
mkdir -p "$OUT"
LLAMA=(--num-layers 16 --hidden-size 2048 --num-attention-heads 16 --group-query-attention --num-query-groups 8
       --ffn-hidden-size 5632 --seq-length 2048 --max-position-embeddings 2048 --vocab-size 32000
       --position-embedding-type rope --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights
       --disable-bias-linear --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --weight-decay 0.1
       --adam-beta2 0.95 --bf16 --hidden-dropout 0 --attention-dropout 0 --log-interval 1 --eval-interval 100000
       --eval-iters 0 --device cuda --use-distributed-optimizer --micro-batch-size 8 --global-batch-size 32
       --train-iters "$ITERS" --data-path .deps/docs/docs_text_document --split 98,1,1
       --data-cache-path "$OUT/data-cache" --tokenizer-type GPT2BPETokenizer --vocab-file .deps/docs/vocab.json
       --merge-file .deps/docs/merges.txt)
run() {  # name, flags...
  local name=$1; shift
  timeout 200 build-gpu/tools/pretrain_gpt "${LLAMA[@]}" "$@" >"$OUT/$name.log" 2>&1
  echo "$name: $(grep -E "iteration +([3-9]|[1-9][0-9])/" "$OUT/$name.log" | grep -o "per iteration (ms): [0-9.]*" |
    awk '{s+=$4; n++} END {if (n) printf "%.1f ms/iter", s/n}') | $(grep -E "iteration +$ITERS/" "$OUT/$name.log" |
    grep -o "TFLOP/s/GPU): [0-9.]*\|tokens per second per GPU: [0-9]*" | tr '\n' ' ') | $(grep -o "peak allocated [0-9.]*" \
    "$OUT/$name.log" | head -1) | loss $(grep -o "lm loss: [0-9.E+-]*" "$OUT/$name.log" | sed -n '1p;$p' |
    awk '{print $3}' | tr '\n' ' ')"
  grep -iE "error|out of memory|nan" "$OUT/$name.log" | head -3
}
run rows
run documents --reset-attention-mask --reset-position-ids
