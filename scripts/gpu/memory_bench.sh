#!/usr/bin/env bash
# On the GPU machine: the memory options -- activation recomputation and optimizer CPU offload -- on the
# Llama-style 0.89B (seq 2048, mock data, bf16, the distributed optimizer), after
# `scripts/gpu/fp8_bench.sh build` (or any build-gpu with pretrain_gpt):
#   bitwise   --deterministic-mode, mbs 4: none, full uniform 1 and selective mlp must log identical losses and
#             grad norms for 6 iterations (the recomputed forwards repeat the forward bit for bit on the GPU)
#   norms     --deterministic-mode, mbs 4: none and selective layernorm must log identical losses and grad norms
#             (the norms' outputs normalised again in the backward by the same kernel)
#   speed     mbs 4, gbs 32: none, selective mlp, full uniform 1 (tokens/s, TFLOP/s, peak memory)
#   big       the largest micro-batch without recomputation (24, measured before) and 4x it (96) with full
#             recomputation, gbs = mbs
#   offload   mbs 4, gbs 32, --deterministic-mode: none, --optimizer-cpu-offload at fractions 1.0 and 0.5 (the
#             losses must agree to ~1e-6: the host update runs in double, the device's in fp32), and a checkpoint
#             saved with offload
#   overlap   mbs 4, gbs 32, --deterministic-mode --overlap-grad-reduce: none, and offload 1.0 and 0.5 each without
#             and with --overlap-cpu-optimizer-d2h-h2d (the overlapped runs must log the same numbers as the plain
#             offload: the same copies and the same host arithmetic, only on other streams and earlier)
#   offload8b Llama-3-8B's shape (32 layers) with full recomputation and OFFLOAD8B_FRACTION (default 0.6) of the
#             optimizer state offloaded, mbs 1, gbs 8, seq 4096 (an H200: 141 GB; the host holds ~128 GiB);
#             OFFLOAD8B_EXTRA: more flags (e.g. "--overlap-grad-reduce --overlap-cpu-optimizer-d2h-h2d")
# Logs under $OUT.
#   scripts/gpu/memory_bench.sh bitwise speed big offload
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
    norms)
      LN=(--recompute-granularity selective --recompute-modules layernorm)
      run det_none --micro-batch-size 4 --global-batch-size 16 --deterministic-mode
      run det_layernorm --micro-batch-size 4 --global-batch-size 16 --deterministic-mode "${LN[@]}"
      if [ -n "$(numbers det_none)" ] && [ "$(numbers det_none)" = "$(numbers det_layernorm)" ]; then
        echo "bitwise layernorm: identical to none ($(numbers det_none | wc -l) iterations)"
      else
        echo "bitwise layernorm: DIFFERS from none"; diff <(numbers det_none) <(numbers det_layernorm) | head -4
      fi ;;
    speed)
      run mbs4_none --micro-batch-size 4 --global-batch-size 32
      run mbs4_selective_mlp --micro-batch-size 4 --global-batch-size 32 "${SELECTIVE[@]}"
      run mbs4_full --micro-batch-size 4 --global-batch-size 32 "${FULL[@]}" ;;
    big)
      run mbs24_none --micro-batch-size 24 --global-batch-size 24
      run mbs96_full --micro-batch-size 96 --global-batch-size 96 "${FULL[@]}" ;;
    offload)
      OFF=(--micro-batch-size 4 --global-batch-size 32 --deterministic-mode)
      run off_none "${OFF[@]}"
      run off_1.0 "${OFF[@]}" --optimizer-cpu-offload --optimizer-offload-fraction 1.0 --save "$OUT/ckpt-offload" \
        --save-interval 6
      run off_0.5 "${OFF[@]}" --optimizer-cpu-offload --optimizer-offload-fraction 0.5
      for r in off_1.0 off_0.5; do
        echo "$r vs none, largest relative loss difference: $(paste <(grep -o "lm loss: [0-9.E+-]*" "$OUT/off_none.log" |
          awk '{print $3}') <(grep -o "lm loss: [0-9.E+-]*" "$OUT/$r.log" | awk '{print $3}') |
          awk '{d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > m) m = d} END {printf "%.2e over %d iterations", m, NR}')"
      done
      grep -h "offloaded to host" "$OUT/off_1.0.log" | head -1
      ls "$OUT/ckpt-offload" 2>&1 | head -3 ;;
    overlap)
      OV=(--micro-batch-size 4 --global-batch-size 32 --deterministic-mode --overlap-grad-reduce)
      run ov_none "${OV[@]}"
      for f in 1.0 0.5; do
        run ov_$f "${OV[@]}" --optimizer-cpu-offload --optimizer-offload-fraction $f
        run ov_${f}_overlap "${OV[@]}" --optimizer-cpu-offload --optimizer-offload-fraction $f \
          --overlap-cpu-optimizer-d2h-h2d
        if [ -n "$(numbers ov_$f)" ] && [ "$(numbers ov_$f)" = "$(numbers ov_${f}_overlap)" ]; then
          echo "offload $f overlapped: identical to plain offload ($(numbers ov_$f | wc -l) iterations)"
        else
          echo "offload $f overlapped: DIFFERS from plain offload"; diff <(numbers ov_$f) <(numbers ov_${f}_overlap) | head -4
        fi
      done ;;
    offload8b)
      L8B=(--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --num-query-groups 8 --ffn-hidden-size 14336
           --seq-length 4096 --max-position-embeddings 4096 --vocab-size 128256 --rotary-base 500000)
      timeout 400 build-gpu/tools/pretrain_gpt "${LLAMA[@]}" "${L8B[@]}" --micro-batch-size 1 --global-batch-size 8 \
        --train-iters 4 "${FULL[@]}" --optimizer-cpu-offload --optimizer-offload-fraction "${OFFLOAD8B_FRACTION:-0.6}" \
        ${OFFLOAD8B_EXTRA:-} >"$OUT/offload8b.log" 2>&1
      grep -E "parameters:|optimizer state|iteration +[1-4]/|peak allocated|error|out of memory" "$OUT/offload8b.log" |
        cut -c1-330 ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
  echo "-- $stage at $(( $(date +%s) - T0 )) s"
done
