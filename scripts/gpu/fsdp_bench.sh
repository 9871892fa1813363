#!/usr/bin/env bash
# On nvidia-h200-x2, after build-gpu/tools/pretrain_gpt exists (scripts/gpu/carried_tools.sh install, or
# scripts/gpu/run.sh): Megatron FSDP against the distributed optimizer, each a short bf16 pretrain_gpt run over
# both GPUs on mock data (logs in $OUT/fsdp_*.log, a table last).
#   8b       Llama-3-8B shape (32 layers, h 4096, GQA 32/8, ffn 14336, vocab 128256, seq 4096, mbs 1, GBS 32):
#            DP=2 with the distributed optimizer (both overlap flags), --use-megatron-fsdp optim_grads_params
#            with both overlap flags (prefetched all-gathers, reduce-scatters left running) and without them
#            (every collective waited for); tokens/s, MFU, each rank's peak memory next to the planner's
#            (--dry-run of the same flags), and the FSDP runs' losses against the distributed optimizer's.
#   8b-mbs2  the same two overlapped runs at micro-batch 2 (half the FSDP collectives per token; FSDP's
#            memory savings pay for the larger micro-batch), and optim_grads (values whole, gradients sharded)
#            at micro-batch 1.
#   largest  the largest Llama-shaped model the planner fits on two H200s with FSDP and full recomputation
#            (40 layers, h 5120, GQA 40/8, ffn 13824, vocab 128256: 12.3B parameters): predicted against
#            measured peak, tokens/s, MFU.
#   scripts/gpu/fsdp_bench.sh [8b|8b-mbs2|largest]...   (ITERS_8B=6, ITERS_LARGEST=4, RUN_TIMEOUT=s per run)
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/two_gpus.sh  # OUT, the environment, MPI
RUN_TIMEOUT=${RUN_TIMEOUT:-240}
BIN=build-gpu/tools/pretrain_gpt
LLAMA=(--group-query-attention --seq-length 4096 --max-position-embeddings 4096 --vocab-size 128256
       --rotary-base 500000 --swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear
       --untie-embeddings-and-output-weights --micro-batch-size 1 --global-batch-size 32 --bf16 --mock-data
       --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --hidden-dropout 0
       --attention-dropout 0 --eval-iters 0 --device cuda --log-interval 1)
L8B=(--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --num-query-groups 8 --ffn-hidden-size 14336)
L12B=(--num-layers 40 --hidden-size 5120 --num-attention-heads 40 --num-query-groups 8 --ffn-hidden-size 13824)
FULL=(--recompute-granularity full --recompute-method uniform --recompute-num-layers 1)
OVERLAP=(--overlap-grad-reduce --overlap-param-gather)

run() {  # run <name> <pretrain_gpt flags...>: the planner's prediction, then the two-GPU run
  local name=$1
  shift
  "$BIN" "$@" --dry-run --dry-run-world-size 2 2>&1 | grep -o "predicted peak allocated: [0-9.]* GiB" \
    >"$OUT/fsdp_$name.plan"
  echo "== $name: $*" | tee "$OUT/fsdp_$name.log"
  timeout -k 10 "$RUN_TIMEOUT" "${MPI[@]}" "$BIN" "$@" >>"$OUT/fsdp_$name.log" 2>&1
  echo "   rc $? ($(cat "$OUT/fsdp_$name.plan"))" | tee -a "$OUT/fsdp_$name.log"
  grep -iE "error|watchdog|out of memory" "$OUT/fsdp_$name.log" | head -4
  grep -E " iteration +[0-9]+/" "$OUT/fsdp_$name.log" | tail -1 | cut -c1-220
}

compare_losses() {  # compare_losses <reference run> <run>: the largest relative difference of the lm losses
  scripts/gpu/compare_losses.py "$OUT/fsdp_$1.log" "$OUT/fsdp_$2.log" "$2 vs $1"
}

STAGES=("$@")
[ ${#STAGES[@]} -gt 0 ] || STAGES=(8b largest)
for stage in "${STAGES[@]}"; do
  case $stage in
    8b)
      it=(--train-iters "${ITERS_8B:-6}")
      run 8b_distopt "${LLAMA[@]}" "${L8B[@]}" "${it[@]}" --use-distributed-optimizer "${OVERLAP[@]}"
      run 8b_fsdp "${LLAMA[@]}" "${L8B[@]}" "${it[@]}" --use-megatron-fsdp "${OVERLAP[@]}"
      run 8b_fsdp_sync "${LLAMA[@]}" "${L8B[@]}" "${it[@]}" --use-megatron-fsdp
      compare_losses 8b_distopt 8b_fsdp | tee "$OUT/fsdp_compare.txt"
      compare_losses 8b_distopt 8b_fsdp_sync | tee -a "$OUT/fsdp_compare.txt" ;;
    8b-mbs2)
      it=(--train-iters "${ITERS_8B:-6}")
      run 8b_distopt_mbs2 "${LLAMA[@]}" "${L8B[@]}" "${it[@]}" --micro-batch-size 2 --use-distributed-optimizer \
        "${OVERLAP[@]}"
      run 8b_fsdp_mbs2 "${LLAMA[@]}" "${L8B[@]}" "${it[@]}" --micro-batch-size 2 --use-megatron-fsdp "${OVERLAP[@]}"
      run 8b_fsdp_optim_grads "${LLAMA[@]}" "${L8B[@]}" "${it[@]}" --use-megatron-fsdp \
        --data-parallel-sharding-strategy optim_grads "${OVERLAP[@]}"
      compare_losses 8b_distopt_mbs2 8b_fsdp_mbs2 | tee -a "$OUT/fsdp_compare.txt" ;;
    largest)
      run 12b_fsdp_full "${LLAMA[@]}" "${L12B[@]}" --train-iters "${ITERS_LARGEST:-4}" --use-megatron-fsdp \
        "${OVERLAP[@]}" "${FULL[@]}" ;;
    *) echo "unknown stage $stage (8b, 8b-mbs2, largest)" >&2 ;;
  esac
done

echo
echo "================ fsdp_bench summary (mean of the last 3 log lines; MFU against 989 TFLOP/s bf16) ================"
for f in "$OUT"/fsdp_*.log; do
  [ -f "$f" ] || continue
  name=$(basename "$f" .log | sed 's/^fsdp_//')
  tfl=$(grep -E " iteration +[0-9]+/" "$f" | tail -3 | grep -oE "TFLOP/s/GPU\): [0-9.]+" | grep -oE "[0-9.]+$" |
        awk '{s += $1; n++} END {if (n) printf "%.1f", s / n}')
  tps=$(grep -E " iteration +[0-9]+/" "$f" | tail -3 | grep -oE "tokens per second per GPU: [0-9.]+" |
        grep -oE "[0-9.]+$" | awk '{s += $1; n++} END {if (n) printf "%.0f", s / n}')
  mfu=$(awk -v t="${tfl:-0}" 'BEGIN { printf "%.1f%%", 100 * t / 989 }')
  peaks=$(grep -oE "\[rank [0-9]\] \[after iteration [0-9]+\] memory \(GiB\): peak allocated [0-9.]+" "$f" |
          sed -E 's/\[rank ([0-9])\].*peak allocated ([0-9.]+)/\1 \2/' |
          awk '{if ($2 > m[$1]) m[$1] = $2} END {for (r in m) printf "r%s %s ", r, m[r]}')
  printf '%-14s tok/s/GPU %7s  TFLOP/s/GPU %6s  MFU %6s  peak GiB %s| planned %s\n' "$name" "${tps:--}" \
    "${tfl:--}" "$mfu" "${peaks:--}" "$(grep -oE "[0-9.]+ GiB" "$OUT/fsdp_$name.plan" 2>/dev/null)"
done
[ -f "$OUT/fsdp_compare.txt" ] && cat "$OUT/fsdp_compare.txt"
exit 0
