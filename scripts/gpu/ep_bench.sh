#!/usr/bin/env bash
# On nvidia-h200-x2, after build-gpu/tools/pretrain_gpt is built: expert parallelism over both GPUs.
#   mixtral  the one-GPU Mixtral-style model (16 layers, h 2048, GQA 16/8, 8 SwiGLU experts of 5632, top-2,
#            alltoall dispatcher, seq 4096, mbs 2, GBS 32, distributed optimizer) at EP=1 (every GPU holds every
#            expert; DP=2) and at EP=2 (each GPU holds 4 experts): the same per-GPU batch and the same samples,
#            so tokens/s per GPU compare directly and the losses must agree to bf16 tolerance.
#   large    16 experts of the same shape (9.1B parameters: more than one GPU holds with its optimizer state)
#            at EP=2 with the distributed optimizer, mbs 2, GBS 32.
#   parity   the mixtral pair on real text (.deps/data's fortunes, GPT-2 BPE, tokenised here if needed) with a
#            gentler schedule (lr 1e-4, 10 warm-up iterations) over PARITY_ITERS (30), so that bf16 rounding is
#            not amplified by a diverging mock-data run: EP=2's losses against EP=1's.
# Logs in $OUT/ep_<name>.log; a table last (MFU by Megatron's MoE FLOPs formula), then each run's last timer
# report (--timing-log-level 2: the alltoall exchanges' timers next to the forward and backward computes, in
# ms per iteration as (min, max) over the ranks).
#   scripts/gpu/ep_bench.sh [mixtral] [large] [parity]   (ITERS=8, RUN_TIMEOUT=s per run)
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/two_gpus.sh  # OUT, the environment, MPI
STAGES=" ${*:-mixtral large} "
ITERS=${ITERS:-8}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
BIN=build-gpu/tools/pretrain_gpt
MOE=(--num-layers 16 --hidden-size 2048 --num-attention-heads 16 --group-query-attention --num-query-groups 8
     --ffn-hidden-size 5632 --seq-length 4096 --max-position-embeddings 4096 --vocab-size 32000
     --position-embedding-type rope --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights
     --disable-bias-linear --moe-router-topk 2 --moe-ffn-hidden-size 5632 --moe-grouped-gemm
     --moe-token-dispatcher-type alltoall --moe-aux-loss-coeff 1e-2 --moe-router-load-balancing-type aux_loss
     --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --weight-decay 0.1 --adam-beta2 0.95 --bf16
     --mock-data --hidden-dropout 0 --attention-dropout 0 --log-interval 1 --eval-interval 100000 --eval-iters 0
     --device cuda --micro-batch-size 2 --global-batch-size 32 --train-iters "$ITERS" --seed 1234
     --use-distributed-optimizer --overlap-grad-reduce --timing-log-level 2)

run() {  # run <name> <command...>
  local name=$1
  shift
  echo "== $name: $*" | tee "$OUT/ep_$name.log"
  timeout -k 10 "$RUN_TIMEOUT" "$@" >>"$OUT/ep_$name.log" 2>&1
  echo "   rc $?" | tee -a "$OUT/ep_$name.log"
  grep -E "parameters:|error|watchdog" "$OUT/ep_$name.log" | head -3 | cut -c1-200
  grep -E " iteration +[0-9]+/" "$OUT/ep_$name.log" | tail -1 | cut -c1-240
}

compare() {  # compare <EP=1 run> <EP=2 run>: the largest relative difference of their lm losses
  scripts/gpu/compare_losses.py "$OUT/ep_$1.log" "$OUT/ep_$2.log" "$2 against $1" | tee -a "$OUT/ep_compare.txt"
}

if [[ $STAGES == *" mixtral "* ]]; then
  run mixtral_ep1 "${MPI[@]}" "$BIN" "${MOE[@]}" --num-experts 8
  run mixtral_ep2 "${MPI[@]}" "$BIN" "${MOE[@]}" --num-experts 8 --expert-model-parallel-size 2
  compare mixtral_ep1 mixtral_ep2
fi
if [[ $STAGES == *" parity "* ]]; then
  D=.deps/data
  if [ ! -f "$D/fortunes_text_document.bin" ] && [ -f "$D/fortunes.jsonl" ]; then
    build-gpu/tools/preprocess_data --input "$D/fortunes.jsonl" --output-prefix "$D/fortunes" --tokenizer-type \
      GPT2BPETokenizer --vocab-file "$D/vocab.json" --merge-file "$D/merges.txt" --append-eod --workers 8 | tail -1
  fi
  REAL=()
  for ((i = 0; i < ${#MOE[@]}; i++)); do  # MOE without mock data, its vocabulary and its schedule
    case ${MOE[$i]} in
      --mock-data) ;;
      --vocab-size | --lr | --lr-warmup-iters | --train-iters) i=$((i + 1)) ;;
      *) REAL+=("${MOE[$i]}") ;;
    esac
  done
  REAL+=(--lr 1e-4 --lr-warmup-iters 10 --train-iters "${PARITY_ITERS:-30}" --data-path "$D/fortunes_text_document"
         --split 98,1,1 --tokenizer-type GPT2BPETokenizer --vocab-file "$D/vocab.json" --merge-file "$D/merges.txt"
         --data-cache-path "$OUT/data-cache" --num-experts 8)
  run parity_ep1 "${MPI[@]}" "$BIN" "${REAL[@]}"
  run parity_ep2 "${MPI[@]}" "$BIN" "${REAL[@]}" --expert-model-parallel-size 2
  compare parity_ep1 parity_ep2
fi
if [[ $STAGES == *" large "* ]]; then
  run large16_ep2 "${MPI[@]}" "$BIN" "${MOE[@]}" --num-experts 16 --expert-model-parallel-size 2
fi

echo
echo "================ ep_bench summary (mean of the last 3 log lines; MFU against 989 TFLOP/s bf16) ================"
for f in "$OUT"/ep_*.log; do
  [ -f "$f" ] || continue
  tfl=$(grep -E " iteration +[0-9]+/" "$f" | tail -3 | grep -oE "TFLOP/s/GPU\): [0-9.]+" | grep -oE "[0-9.]+$" |
        awk '{s += $1; n++} END {if (n) printf "%.1f", s / n}')
  tps=$(grep -E " iteration +[0-9]+/" "$f" | tail -3 | grep -oE "tokens per second per GPU: [0-9.]+" | grep -oE "[0-9.]+$" |
        awk '{s += $1; n++} END {if (n) printf "%.0f", s / n}')
  mfu=$(awk -v t="${tfl:-0}" 'BEGIN { printf "%.1f%%", 100 * t / 989 }')
  peak=$(grep -oE "peak allocated [0-9.]+" "$f" | grep -oE "[0-9.]+" | sort -n | tail -1)
  params=$(grep -oE "parameters: [0-9]+" "$f" | head -1 | grep -oE "[0-9]+$")
  printf '%-12s params %6s B  tok/s/GPU %7s  TFLOP/s/GPU %6s  MFU %6s  peak GiB %6s\n' "$(basename "$f" .log | sed 's/^ep_//')" \
    "$(awk -v p="${params:-0}" 'BEGIN { printf "%.2f", p / 1e9 }')" "${tps:--}" "${tfl:--}" "$mfu" "${peak:--}"
done
[ -f "$OUT/ep_compare.txt" ] && cat "$OUT/ep_compare.txt"
for f in "$OUT"/ep_*.log; do  # the last timer report of each run: computes and the token exchanges
  [ -f "$f" ] || continue
  echo "-- $(basename "$f" .log | sed 's/^ep_//'): last timer report (ms per iteration, (min, max) over ranks)"
  last_timer_report "$f" "forward-backward |forward-compute|backward-compute|all-grads-sync|moe-"
done
exit 0
