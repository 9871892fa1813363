#!/usr/bin/env bash
# On the GPU machine, one call: attention dropout on GPUs. Builds the dropout suite, the attention suite, bench_ops
# and pretrain_gpt; runs both suites; benches attention with and without dropout 0.1 (cuDNN's generator and the
# by-index mask); then trains the 0.89B Llama-style model of bench_models.sh (mbs 4, gbs 32, 12 iterations)
# without dropout, with Megatron's default dropouts (no dropout flag: attention and hidden 0.1) and with the
# defaults drawing attention masks by index. Logs under $OUT; prints a table last.
#   scripts/gpu/dropout_bench.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
T0=$(date +%s)
since() { echo "-- $1 at $(( $(date +%s) - T0 )) s"; }
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCUDNN_FRONTEND_ROOT="$PWD/.deps/cudnn_frontend" >"$OUT/configure.log" 2>&1 &&
  cmake --build build-gpu -j "$(nproc)" --target test_ops_attention_dropout test_ops_attention bench_ops pretrain_gpt \
    >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head; exit 1; }
since build
for t in test_ops_attention_dropout test_ops_attention; do
  timeout 120 build-gpu/tests/$t >"$OUT/$t.log" 2>&1
  echo "$t: $(grep -E "^\[  (PASSED|FAILED) " "$OUT/$t.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure|error:" "$OUT/$t.log" | head -8
done
since tests
timeout 120 build-gpu/bench/bench_ops --only attention >"$OUT/bench_attention.log" 2>&1
since bench
LLAMA=(--num-layers 16 --hidden-size 2048 --num-attention-heads 16 --group-query-attention --num-query-groups 8
       --ffn-hidden-size 5632 --seq-length 2048 --max-position-embeddings 2048 --vocab-size 32000
       --position-embedding-type rope --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights
       --disable-bias-linear --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --bf16 --mock-data
       --log-interval 1 --eval-interval 100000 --eval-iters 0 --device cuda --micro-batch-size 4
       --global-batch-size 32 --train-iters 12)
model() {  # model(name, extra flags...)
  local name=$1; shift
  timeout 100 build-gpu/tools/pretrain_gpt "${LLAMA[@]}" "$@" >"$OUT/model_$name.log" 2>&1
  echo "model $name: $(grep -E "iteration +([4-9]|1[0-2])/" "$OUT/model_$name.log" |
    grep -o "per iteration (ms): [0-9.]*" | awk '{s+=$4; n++} END {if (n) printf "%.1f ms/iter", s/n}') |" \
    "loss at 12: $(grep -E "iteration +12/" "$OUT/model_$name.log" | grep -o "lm loss: [0-9.E+-]*")"
  grep -iE "error|out of memory" "$OUT/model_$name.log" | head -2
}
model no_dropout --attention-dropout 0 --hidden-dropout 0
model megatron_defaults
model defaults_by_index --attention-dropout-masks by-index
since models
echo "== attention with dropout (bench_ops --only attention)"
grep -E "dropout" "$OUT/bench_attention.log"
