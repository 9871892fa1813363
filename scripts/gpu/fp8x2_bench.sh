#!/usr/bin/env bash
# On nvidia-h200-x2, after build-gpu/tools/pretrain_gpt exists (scripts/gpu/run.sh, or fp8_bench.sh build): FP8
# training over both GPUs next to bf16 in the same call (logs in $OUT/fp8x2_*.log, a table last).
#   check     one GPU, the Llama-style 0.89B on mock data (seq 2048, mbs 4, GBS 16, 10 iterations, FP8 delayed with
#             the distributed optimizer) with and without --fp8-param-gather: the losses side by side (bf16
#             parameters: the weights are rounded once from the masters instead of twice, so close, not equal)
#   8b-dp     Llama-3-8B shape (32 layers, h 4096, GQA 32/8, ffn 14336, vocab 128256, seq 4096, mbs 1, GBS 32),
#             DP=2 with the distributed optimizer (both overlap flags): bf16, FP8 delayed and FP8 tensorwise with
#             --fp8-param-gather, and FP8 delayed without it; each run's peak next to the planner's (--dry-run)
#   8b-tp     the same model at TP=2 + SP: bf16, FP8 delayed, FP8 tensorwise
#   converge  the Llama-style 0.89B on real text (.deps/docs from scripts/gpu/prepare_text_corpus.sh; seq 2048,
#             mbs 4, GBS 16, CONVERGE_ITERS iterations, one seed and data order) at DP=2 (FP8 with
#             --fp8-param-gather) and at TP=2 + SP: bf16, FP8 delayed, FP8 tensorwise; the mean lm loss of the
#             last 50 iterations of each, and each FP8 run's against its layout's bf16
#   converge-noise  after converge (its DP logs in $OUT): DP=2 FP8 delayed without --fp8-param-gather, and a bf16
#             and an FP8 delayed run at another seed, to see how far runs land apart
#   converge-dp  the DP=2 bf16 and FP8 delayed runs (with and without --fp8-param-gather) alone, named after
#             CONVERGE_ITERS (CONVERGE_ITERS=500: the length of the single-GPU FP8 convergence runs)
# All FP8 runs use --fp8-format hybrid (E4M3 forward, E5M2 gradients). TFLOP/s is Megatron's formula (the bf16
# FLOPs of the model: FP8 runs are not credited twice), MFU against 989 TFLOP/s.
#   scripts/gpu/fp8x2_bench.sh [check|8b-dp|8b-tp|converge|converge-noise|converge-dp]...   (ITERS_8B=6, CONVERGE_ITERS=300, RUN_TIMEOUT=s per run)
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/two_gpus.sh  # OUT, the environment, MPI
RUN_TIMEOUT=${RUN_TIMEOUT:-240}
BIN=build-gpu/tools/pretrain_gpt
L8B=(--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention --num-query-groups 8
     --ffn-hidden-size 14336 --seq-length 4096 --max-position-embeddings 4096 --vocab-size 128256
     --rotary-base 500000 --swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear
     --untie-embeddings-and-output-weights --micro-batch-size 1 --global-batch-size 32 --bf16 --mock-data
     --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --hidden-dropout 0
     --attention-dropout 0 --eval-iters 0 --device cuda --log-interval 1 --train-iters "${ITERS_8B:-6}")
CONVERGE_ITERS=${CONVERGE_ITERS:-300}
L089=(--num-layers 16 --hidden-size 2048 --num-attention-heads 16 --group-query-attention --num-query-groups 8
      --ffn-hidden-size 5632 --seq-length 2048 --max-position-embeddings 2048 --position-embedding-type rope
      --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear
      --micro-batch-size 4 --global-batch-size 16 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine
      --lr-warmup-iters 50 --weight-decay 0.1 --adam-beta2 0.95 --clip-grad 1.0 --bf16 --hidden-dropout 0
      --attention-dropout 0 --seed 1234 --log-interval 1 --eval-interval 100000 --eval-iters 0 --device cuda)
CONVERGE=("${L089[@]}" --train-iters "$CONVERGE_ITERS" --data-path .deps/docs/docs_text_document --split 98,1,1
          --data-cache-path "$OUT/data-cache" --tokenizer-type GPT2BPETokenizer --vocab-file .deps/docs/vocab.json
          --merge-file .deps/docs/merges.txt)
DP=(--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather)
TP=(--tensor-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer)
DELAYED=(--fp8-format hybrid --fp8-recipe delayed)
TENSORWISE=(--fp8-format hybrid --fp8-recipe tensorwise)

run() {  # run <name> <pretrain_gpt flags...>: the planner's prediction, then the two-GPU run
  local name=$1
  shift
  "$BIN" "$@" --dry-run --dry-run-world-size 2 2>&1 | grep -o "predicted peak allocated: [0-9.]* GiB" \
    >"$OUT/fp8x2_$name.plan"
  echo "== $name: $*" >"$OUT/fp8x2_$name.log"
  local t0=$(date +%s)
  timeout -k 10 "$RUN_TIMEOUT" "${MPI[@]}" "$BIN" "$@" >>"$OUT/fp8x2_$name.log" 2>&1
  echo "$name: rc $?, $(( $(date +%s) - t0 )) s ($(cat "$OUT/fp8x2_$name.plan"))"
  grep -iE "error|watchdog|out of memory" "$OUT/fp8x2_$name.log" | head -4
  grep -E " iteration +[0-9]+/" "$OUT/fp8x2_$name.log" | tail -1 | cut -c1-240
}

last50() {  # the mean lm loss of a log's last 50 iterations
  grep -E " iteration +[0-9]+/" "$OUT/fp8x2_$1.log" | tail -50 | grep -oE "lm loss: [0-9.E+-]+" |
    awk '{s += $3; n++} END {if (n) printf "%.5f", s / n}'
}

converged() {  # converged <bf16 run> <fp8 run>: last-50 means and the relative difference
  local a b
  a=$(last50 "$1"); b=$(last50 "$2")
  awk -v a="$a" -v b="$b" -v n1="$1" -v n2="$2" \
    'BEGIN {if (a && b) printf "%s %.5f vs %s %.5f: %+.2f%%\n", n2, b, n1, a, 100 * (b - a) / a; else print n2 ": no losses"}'
}

one_gpu() {  # one_gpu <name> <pretrain_gpt flags...>: a run on the first GPU
  local name=$1
  shift
  echo "== $name: $*" >"$OUT/fp8x2_$name.log"
  CUDA_VISIBLE_DEVICES=0 timeout -k 10 "$RUN_TIMEOUT" "$BIN" "$@" >>"$OUT/fp8x2_$name.log" 2>&1
  echo "$name: rc $?"
  grep -iE "error|out of memory" "$OUT/fp8x2_$name.log" | head -4
}

for stage in "$@"; do
  case $stage in
    check)
      small=("${L089[@]}" --train-iters 10 --lr-warmup-iters 2 --mock-data --vocab-size 32000 --use-distributed-optimizer "${DELAYED[@]}")
      one_gpu check_fp8 "${small[@]}"
      one_gpu check_fp8_gather "${small[@]}" --fp8-param-gather
      scripts/gpu/compare_losses.py "$OUT/fp8x2_check_fp8.log" "$OUT/fp8x2_check_fp8_gather.log" \
        "one GPU, --fp8-param-gather vs without" | tee "$OUT/fp8x2_check.txt" ;;
    8b-dp)
      run 8b_dp_bf16 "${L8B[@]}" "${DP[@]}"
      run 8b_dp_fp8_delayed "${L8B[@]}" "${DP[@]}" "${DELAYED[@]}" --fp8-param-gather
      run 8b_dp_fp8_tensorwise "${L8B[@]}" "${DP[@]}" "${TENSORWISE[@]}" --fp8-param-gather
      run 8b_dp_fp8_delayed_nogather "${L8B[@]}" "${DP[@]}" "${DELAYED[@]}" ;;
    8b-tp)
      run 8b_tp_bf16 "${L8B[@]}" "${TP[@]}"
      run 8b_tp_fp8_delayed "${L8B[@]}" "${TP[@]}" "${DELAYED[@]}"
      run 8b_tp_fp8_tensorwise "${L8B[@]}" "${TP[@]}" "${TENSORWISE[@]}" ;;
    converge)
      [ -f .deps/docs/docs_text_document.bin ] || { echo "no .deps/docs: run scripts/gpu/prepare_text_corpus.sh" >&2; exit 2; }
      run conv_dp_bf16 "${CONVERGE[@]}" "${DP[@]}"
      run conv_dp_fp8_delayed "${CONVERGE[@]}" "${DP[@]}" "${DELAYED[@]}" --fp8-param-gather
      run conv_dp_fp8_tensorwise "${CONVERGE[@]}" "${DP[@]}" "${TENSORWISE[@]}" --fp8-param-gather
      run conv_tp_bf16 "${CONVERGE[@]}" "${TP[@]}"
      run conv_tp_fp8_delayed "${CONVERGE[@]}" "${TP[@]}" "${DELAYED[@]}"
      run conv_tp_fp8_tensorwise "${CONVERGE[@]}" "${TP[@]}" "${TENSORWISE[@]}"
      {
        for l in dp tp; do
          for r in delayed tensorwise; do converged "conv_${l}_bf16" "conv_${l}_fp8_$r"; done
        done
      } | tee "$OUT/fp8x2_converge.txt" ;;
    converge-noise)
      # How far two bf16-equivalent runs land apart: DP=2 FP8 delayed without --fp8-param-gather (same seed),
      # and bf16 against FP8 delayed with it at another seed.
      run conv_dp_fp8_delayed_nogather "${CONVERGE[@]}" "${DP[@]}" "${DELAYED[@]}"
      run conv_dp_bf16_seed4321 "${CONVERGE[@]}" "${DP[@]}" --seed 4321
      run conv_dp_fp8_delayed_seed4321 "${CONVERGE[@]}" "${DP[@]}" "${DELAYED[@]}" --fp8-param-gather --seed 4321
      {
        converged conv_dp_bf16 conv_dp_fp8_delayed_nogather
        converged conv_dp_fp8_delayed conv_dp_fp8_delayed_nogather
        converged conv_dp_bf16_seed4321 conv_dp_fp8_delayed_seed4321
      } | tee -a "$OUT/fp8x2_converge.txt" ;;
    converge-dp)
      # The DP=2 runs alone at CONVERGE_ITERS (named after it): bf16, FP8 delayed with and without the gather.
      n=conv${CONVERGE_ITERS}_dp
      run ${n}_bf16 "${CONVERGE[@]}" "${DP[@]}"
      run ${n}_fp8_delayed "${CONVERGE[@]}" "${DP[@]}" "${DELAYED[@]}" --fp8-param-gather
      run ${n}_fp8_delayed_nogather "${CONVERGE[@]}" "${DP[@]}" "${DELAYED[@]}"
      {
        converged ${n}_bf16 ${n}_fp8_delayed
        converged ${n}_bf16 ${n}_fp8_delayed_nogather
      } | tee -a "$OUT/fp8x2_converge.txt" ;;
    *) echo "unknown stage $stage (check, 8b-dp, 8b-tp, converge, converge-noise, converge-dp)" >&2 ;;
  esac
done

echo
echo "================ fp8x2_bench summary (mean of the last 3 log lines; MFU against 989 TFLOP/s) ================"
printf "%-30s %10s %12s %8s %10s %10s\n" run TFLOP/s tok/s/GPU MFU "peak GiB" "planned"  # peak: the larger rank's
for f in "$OUT"/fp8x2_*.log; do
  [ -f "$f" ] || continue
  name=$(basename "$f" .log | sed 's/^fp8x2_//')
  tail3=$(grep -E " iteration +[0-9]+/" "$f" | tail -3)
  tfl=$(echo "$tail3" | grep -oE "TFLOP/s/GPU\): [0-9.]+" | grep -oE "[0-9.]+$" | awk '{s += $1; n++} END {if (n) printf "%.1f", s / n}')
  tok=$(echo "$tail3" | grep -oE "tokens per second per GPU: [0-9.]+" | grep -oE "[0-9.]+$" |
        awk '{s += $1; n++} END {if (n) printf "%.0f", s / n}')
  peak=$(grep -oE "memory \(GiB\): peak allocated [0-9.]+" "$f" | grep -oE "[0-9.]+$" | sort -n | tail -1)
  plan=$(grep -oE "[0-9.]+ GiB" "$OUT/fp8x2_$name.plan" 2>/dev/null | head -1)
  mfu=$(awk -v t="$tfl" 'BEGIN {if (t) printf "%.1f%%", 100 * t / 989}')
  printf "%-30s %10s %12s %8s %10s %10s\n" "$name" "${tfl:--}" "${tok:--}" "${mfu:--}" "${peak:--}" "${plan:--}"
done
cat "$OUT"/fp8x2_check.txt "$OUT"/fp8x2_converge.txt 2>/dev/null
exit 0
