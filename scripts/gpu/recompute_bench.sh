#!/usr/bin/env bash
# On the GPU machine: activation recomputation on the Llama-style 0.89B (seq 2048, mock data, bf16, the
# distributed optimizer), after `scripts/gpu/fp8_bench.sh build` (or any build-gpu with pretrain_gpt):
#   bitwise   --deterministic-mode, mbs 4: none, full uniform 1 and selective mlp must log identical losses and
#             grad norms for 6 iterations (the recomputed forwards repeat the forward bit for bit on the GPU)
#   speed     mbs 4, gbs 32: none, selective mlp, full uniform 1 (tokens/s, TFLOP/s, peak memory)
#   big       the largest micro-batch without recomputation (24, measured before) and 4x it (96) with full
#             recomputation, gbs = mbs
# Logs under $OUT.
#   scripts/gpu/recompute_bench.sh bitwise speed big
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
T0=$(date +%s)
LLAMA=(--num-layers 16 --hidden-size 2048 --num-attention-heads 16 --group-query-attention --num-query-groups 8
       --ffn-hidden-size 5632 --seq-length 2048 --max-position-embeddings 2048 --vocab-size 32000
       --position-embedding-type rope --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights
       --disable-bias-linear --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --weight-decay 0.1
       --adam-beta2 0.95 --bf16 --mock-data --hidden-dropout 0 --attention-dropout 0 --log-interval 1
       --eval-interval 100000 --eval-iters 0 --device cuda --use-distributed-optimizer --train-iters 6)
FULL=(--recompute-granularity full --recompute-method uniform --recompute-num-layers 1)
SELECTIVE=(--recompute-granularity selective --recompute-modules mlp)
run() {  # name, flags...: one pretrain_gpt run; prints ms/iter (iterations 3-6), tokens/s, TFLOP/s, peak memory
  local name=$1; shift
  timeout 200 build-gpu/tools/pretrain_gpt "${LLAMA[@]}" "$@" >"$OUT/$name.log" 2>&1
  echo "$name: $(grep -E "iteration +[3-6]/" "$OUT/$name.log" | grep -o "per iteration (ms): [0-9.]*" |
    awk '{s+=$4; n++} END {if (n) printf "%.1f ms/iter", s/n}') | $(grep -E "iteration +6/" "$OUT/$name.log" |
    grep -o "TFLOP/s/GPU): [0-9.]*\|tokens per second per GPU: [0-9]*" | tr '\n' ' ') | $(grep -o "peak allocated [0-9.]*" \
    "$OUT/$name.log" | head -1)"
  grep -iE "error|out of memory" "$OUT/$name.log" | head -3
}
# The losses and grad norms of a run's log lines, for bitwise comparison.
numbers() { grep -o "lm loss: [0-9.E+-]* .*grad norm: [0-9.]*" "$OUT/$1.log" | sed 's/ | loss scale: [0-9.]* |//'; }
for stage in "$@"; do
  case $stage in
    bitwise)
      for r in none full selective; do
        case $r in none) extra=() ;; full) extra=("${FULL[@]}") ;; selective) extra=("${SELECTIVE[@]}") ;; esac
        run det_$r --micro-batch-size 4 --global-batch-size 16 --deterministic-mode "${extra[@]}" >/dev/null
      done
      for r in full selective; do
        if [ -n "$(numbers det_none)" ] && [ "$(numbers det_none)" = "$(numbers det_$r)" ]; then
          echo "bitwise $r: identical to none ($(numbers det_none | wc -l) iterations)"
        else
          echo "bitwise $r: DIFFERS from none"; diff <(numbers det_none) <(numbers det_$r) | head -4
        fi
      done ;;
    speed)
      run mbs4_none --micro-batch-size 4 --global-batch-size 32
      run mbs4_selective_mlp --micro-batch-size 4 --global-batch-size 32 "${SELECTIVE[@]}"
      run mbs4_full --micro-batch-size 4 --global-batch-size 32 "${FULL[@]}" ;;
    big)
      run mbs24_none --micro-batch-size 24 --global-batch-size 24
      run mbs96_full --micro-batch-size 96 --global-batch-size 96 "${FULL[@]}" ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
  echo "-- $stage at $(( $(date +%s) - T0 )) s"
done
