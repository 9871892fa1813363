#!/usr/bin/env bash
# On nvidia-h200-x2, after scripts/gpu/run.sh has built build-gpu/: the tensor-parallel figures, each
# a short bf16 pretrain_gpt run on mock data over both GPUs (logs in $OUT/tp_*.log, a table last).
#   1. Llama-3-8B shape (32 layers, h 4096, 32 heads, 8 query groups, ffn 14336, vocab 128256, seq 4096, mbs 1,
#      rope base 500000, SwiGLU, RMSNorm, untied, no bias) at TP=2 with --sequence-parallel (bar: >= 50% MFU
#      per GPU), and at TP=2 without SP (activation memory against SP);
#   2. Llama-style 0.89B (16 layers, h 2048, 16 heads, 8 query groups, ffn 5632, vocab 32000, seq 2048, mbs 8,
#      GBS 32) at TP=2, with and without SP.
#   3. (overlap) the 8B shape at TP=2 + SP without and with --tp-comm-overlap, then with each of its parts turned
#      off in turn (--disable-tp-comm-overlap-ag, -overlap-rs, -bulk-dgrad, -bulk-wgrad, -split-ag, -split-rs)
#      and with --tp-comm-overlap-rs-dgrad (SKIP_PARTS=1: not those), and with the NCCL transport instead of the copy
#      engines (--tp-comm-overlap-transport nccl); GBS_8B (default 8) samples an iteration.
#   3b. (overlap-trace) the 8B shape with --tp-comm-overlap, iteration 3 profiled on both ranks (--profile-dir
#      $OUT/tp_trace, with the GPUs' own kernel and copy records: --use-pytorch-profiler), and a 3 ms window of it drawn by scripts/gpu/plot_tp_trace.py ($OUT/tp_overlap_timeline.png).
#   4. (overlap-losses) the 0.89B at TP=2 + SP on real text (.deps/docs, scripts/gpu/prepare_text_corpus.sh),
#      ITERS_LOSSES (default 50) iterations with --tp-comm-overlap and without, losses compared (bf16 tolerance).
# Each GPU rank prints "memory (GiB): peak allocated P | ... | model state S | peak activations A".
#   scripts/gpu/tp_bench.sh [8b|small|overlap|overlap-trace|overlap-losses|all]   (default all = 8b and small; ITERS=...,
#   ITERS_8B=... change the lengths; RUN_TIMEOUT=s bounds each run)
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/two_gpus.sh  # OUT, the environment, MPI
WHAT=${1:-all}
ITERS=${ITERS:-20}
ITERS_8B=${ITERS_8B:-10}
GBS_8B=${GBS_8B:-8}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
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
           --micro-batch-size 1 --global-batch-size "$GBS_8B" --train-iters "$ITERS_8B" --log-interval 2)

run() {  # run <name> <command...>
  local name=$1
  shift
  echo "== $name: $*" | tee "$OUT/tp_$name.log"
  timeout -k 10 "$RUN_TIMEOUT" "$@" >>"$OUT/tp_$name.log" 2>&1
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
if [ "$WHAT" = overlap ]; then
  run 8b_sp "${MPI[@]}" "$BIN" "${COMMON[@]}" "${LLAMA3_8B[@]}" --sequence-parallel
  run 8b_sp_overlap "${MPI[@]}" "$BIN" "${COMMON[@]}" "${LLAMA3_8B[@]}" --sequence-parallel --tp-comm-overlap
  run 8b_sp_overlap_nccl "${MPI[@]}" "$BIN" "${COMMON[@]}" "${LLAMA3_8B[@]}" --sequence-parallel --tp-comm-overlap \
    --tp-comm-overlap-transport nccl
  [ -n "${SKIP_PARTS:-}" ] && PARTS="" || PARTS="overlap-ag overlap-rs bulk-dgrad bulk-wgrad split-ag split-rs"
  for part in $PARTS; do
    run "8b_sp_overlap_no_$part" "${MPI[@]}" "$BIN" "${COMMON[@]}" "${LLAMA3_8B[@]}" --sequence-parallel \
      --tp-comm-overlap "--disable-tp-comm-$part"
  done
  [ -z "${SKIP_PARTS:-}" ] && run 8b_sp_overlap_rs_dgrad "${MPI[@]}" "$BIN" "${COMMON[@]}" "${LLAMA3_8B[@]}" --sequence-parallel \
    --tp-comm-overlap --tp-comm-overlap-rs-dgrad
fi
if [ "$WHAT" = overlap-trace ]; then  # iteration 3 of the 8B shape profiled on both ranks, drawn
  run 8b_sp_overlap_trace "${MPI[@]}" "$BIN" "${COMMON[@]}" "${LLAMA3_8B[@]}" --sequence-parallel --tp-comm-overlap \
    --train-iters 4 --profile --profile-step-start 3 --profile-step-end 4 --profile-ranks 0 1 \
    --profile-dir "$OUT/tp_trace" --use-pytorch-profiler
  python3 scripts/gpu/plot_tp_trace.py "$OUT/tp_trace/trace.json" "$OUT/tp_overlap_timeline.png" --start-us 20000 |
    tee "$OUT/tp_trace_summary.txt"
fi
if [ "$WHAT" = overlap-losses ]; then
  D=.deps/docs  # scripts/gpu/prepare_text_corpus.sh: 6.3 M tokens of real text, GPT-2 BPE with a 32000-word vocabulary
  REAL=()
  for arg in "${COMMON[@]}" "${LLAMA_089B[@]}"; do [ "$arg" != --mock-data ] && REAL+=("$arg"); done
  REAL+=(--train-iters "${ITERS_LOSSES:-50}" --log-interval 1 --data-path "$D/docs_text_document" --split 98,1,1
         --tokenizer-type GPT2BPETokenizer --vocab-file "$D/vocab.json" --merge-file "$D/merges.txt"
         --data-cache-path "$OUT/data-cache" --sequence-parallel)  # the later --train-iters and --log-interval win
  run 089b_real_sp "${MPI[@]}" "$BIN" "${REAL[@]}"
  run 089b_real_sp_overlap "${MPI[@]}" "$BIN" "${REAL[@]}" --tp-comm-overlap
  scripts/gpu/compare_losses.py "$OUT/tp_089b_real_sp.log" "$OUT/tp_089b_real_sp_overlap.log" \
    "0.89B TP=2 + SP, --tp-comm-overlap vs off, real text" | tee "$OUT/tp_overlap_losses.txt"
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
[ -f "$OUT/tp_overlap_losses.txt" ] && cat "$OUT/tp_overlap_losses.txt"
exit 0
