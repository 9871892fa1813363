#!/usr/bin/env bash
# On nvidia-h200-x2, after build-gpu/tools/pretrain_gpt is built: context parallelism over both GPUs.
#   8b      Llama-3-8B shape at seq SEQ_8B (default 32768), CP=2, mbs 1, GBS GBS_8B (default 4), distributed
#           optimizer over DP x CP, with --cp-comm-type p2p (ring; its blocks by NCCL, then by the copy engines:
#           --cp-comm-transport copy-engine) and a2a. The recomputation is the least the
#           memory planner (--dry-run) says fits 139 GiB: none, selective (mlp) or full; the run's log names it.
#   longest the same shape at seq SEQ_LONG (default 131072, the longest the planner fits at CP=2: 125 GiB with full
#           recomputation; 163840 plans 134, 196608 142; 65536 without recomputation plans 237), GBS 1, 3 iterations.
#   8b-offload  the 8b stage's shape without recomputation, OFFLOAD_FRACTION (default 0.7) of the optimizer on
#           the host with overlapped transfers (the planner: 164 GiB with everything on the GPU, 133 at 0.7), p2p
#           and a2a (A2A_OFFLOAD_FRACTION, default 0.8); GBS_8B=16 amortises the host's update over 16 micro-batches
#   trace   the 8b stage's shape with the copy-engine ring, iteration 2 profiled on both ranks with the GPUs' own
#           kernel and copy records (--use-pytorch-profiler), a window drawn by scripts/gpu/plot_tp_trace.py
#           ($OUT/cp_ring_timeline.png: attention steps and block pushes, and on each GPU's rows whether the
#           peer copies ran beside attention kernels)
#   small   the Llama-style 0.89B at seq 16384 on real text (.deps/data's fortunes, GPT-2 BPE, tokenised here if
#           needed), mbs 1, GBS 8, 50 iterations: one GPU (CP=1) against CP=2 (p2p, by NCCL and by the copy
#           engines), tokens/s per GPU and losses.
#   packed  the 0.89B at seq 65536 on packed variable-length documents (.deps/docs re-cut into documents of 1k-64k
#           tokens by scripts/gpu/recut_documents.py; --reset-attention-mask --reset-position-ids
#           --calculate-per-token-loss), mbs 1, GBS 8, ITERS_PACKED (default 8) iterations: fixed CP=2 against
#           dynamic CP (--hybrid-context-parallel --max-seqlen-per-dp-cp-rank 32768: a micro-batch whose longest
#           document fits 32768 tokens runs whole on one rank, side by side with another). Each rank's
#           forward-backward time comes from the level-1 timers (--timing-log-option all, every iteration); a
#           rank's idle time is the slowest rank's forward-backward minus its own (it waits for it at the gradient
#           reduction), summed over iterations 3 on.
# Each run's log is $OUT/cp_<name>.log; a table is printed last (MFU by Megatron's formula, attention included).
#   scripts/gpu/cp_bench.sh [8b] [8b-offload] [trace] [longest] [small] [packed]   (ITERS_8B=4, ITERS_SMALL=50, RUN_TIMEOUT=s per run)
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/two_gpus.sh  # OUT, the environment, MPI
STAGES=" ${*:-8b} "
ITERS_8B=${ITERS_8B:-4}
SEQ_8B=${SEQ_8B:-32768}
GBS_8B=${GBS_8B:-4}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
GPU_GIB=${GPU_GIB:-139}
BIN=build-gpu/tools/pretrain_gpt
LLAMA3_8B=(--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention --num-query-groups 8
           --ffn-hidden-size 14336 --seq-length "$SEQ_8B" --max-position-embeddings "$SEQ_8B" --vocab-size 128256
           --rotary-base 500000 --swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear
           --untie-embeddings-and-output-weights --micro-batch-size 1 --global-batch-size "$GBS_8B"
           --train-iters "$ITERS_8B" --bf16 --mock-data --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine
           --lr-warmup-iters 2 --hidden-dropout 0 --attention-dropout 0 --eval-iters 0 --device cuda --log-interval 1
           --context-parallel-size 2 --use-distributed-optimizer --overlap-grad-reduce)

# The least recomputation whose planned peak fits GPU_GIB (the planner runs on the host, in a second).
pick_recompute() {  # pick_recompute <flags...>  -> prints the recompute flags
  local option peak
  for option in "" "--recompute-granularity selective --recompute-modules mlp" \
                "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"; do
    # shellcheck disable=SC2086
    peak=$("$BIN" "$@" $option --dry-run --dry-run-world-size 2 2>&1 | grep -oE "predicted peak allocated: [0-9.]+" |
           grep -oE "[0-9.]+$" | sort -n | tail -1)
    if [ -n "$peak" ] && awk -v p="$peak" -v g="$GPU_GIB" 'BEGIN { exit !(p < g) }'; then
      echo "$option"
      return
    fi
  done
  echo "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
}

run() {  # run <name> <command...>
  local name=$1
  shift
  echo "== $name: $*" | tee "$OUT/cp_$name.log"
  timeout -k 10 "$RUN_TIMEOUT" "$@" >>"$OUT/cp_$name.log" 2>&1
  echo "   rc $?" | tee -a "$OUT/cp_$name.log"
  grep -E "error|watchdog|predicted" "$OUT/cp_$name.log" | head -4
  grep -E " iteration +[0-9]+/" "$OUT/cp_$name.log" | tail -1 | cut -c1-220
}

if [[ $STAGES == *" 8b "* ]]; then
  RECOMPUTE=$(pick_recompute "${LLAMA3_8B[@]}" --cp-comm-type p2p)
  echo "seq $SEQ_8B at CP=2: recomputation '${RECOMPUTE:-none}' (the least that the planner fits in $GPU_GIB GiB)"
  # shellcheck disable=SC2086
  run 8b_p2p "${MPI[@]}" "$BIN" "${LLAMA3_8B[@]}" --cp-comm-type p2p $RECOMPUTE
  # shellcheck disable=SC2086
  run 8b_p2p_copy_engine "${MPI[@]}" "$BIN" "${LLAMA3_8B[@]}" --cp-comm-type p2p --cp-comm-transport copy-engine \
    $RECOMPUTE
  # shellcheck disable=SC2086
  run 8b_a2a "${MPI[@]}" "$BIN" "${LLAMA3_8B[@]}" --cp-comm-type a2a $RECOMPUTE
fi

if [[ $STAGES == *" 8b-offload "* ]]; then  # no recomputation: the optimizer partly on the host instead
  OFFLOAD=(--optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d)
  run 8b_p2p_offload "${MPI[@]}" "$BIN" "${LLAMA3_8B[@]}" --cp-comm-type p2p "${OFFLOAD[@]}" \
    --optimizer-offload-fraction "${OFFLOAD_FRACTION:-0.7}"
  # a2a held 4 GiB more than p2p at the 8b stage (its all-to-all buffers): a tenth more of the optimizer leaves
  run 8b_a2a_offload "${MPI[@]}" "$BIN" "${LLAMA3_8B[@]}" --cp-comm-type a2a "${OFFLOAD[@]}" \
    --optimizer-offload-fraction "${A2A_OFFLOAD_FRACTION:-0.8}"
fi

if [[ $STAGES == *" trace "* ]]; then  # the copy-engine ring of the 8b stage profiled: is the KV exchange hidden?
  RECOMPUTE=${RECOMPUTE-$(pick_recompute "${LLAMA3_8B[@]}" --cp-comm-type p2p)}
  # shellcheck disable=SC2086
  run 8b_ring_trace "${MPI[@]}" "$BIN" "${LLAMA3_8B[@]}" --cp-comm-type p2p --cp-comm-transport copy-engine \
    $RECOMPUTE --train-iters 3 --profile --profile-step-start 2 --profile-step-end 3 --profile-ranks 0 1 \
    --profile-dir "$OUT/cp_trace" --use-pytorch-profiler
  python3 scripts/gpu/plot_tp_trace.py "$OUT/cp_trace/trace.json" "$OUT/cp_ring_timeline.png" --rows \
    cp-attention,cp-comm --start-us "${TRACE_START_US:-0}" --window-us "${TRACE_WINDOW_US:-6000}" |
    tee "$OUT/cp_trace_summary.txt"
fi

if [[ $STAGES == *" longest "* ]]; then
  SEQ=${SEQ_LONG:-131072}
  LONG=("${LLAMA3_8B[@]}")
  for ((i = 1; i < ${#LONG[@]}; i++)); do  # the 8b stage's flags at the longer sequence, one sequence per iteration
    case ${LONG[$((i - 1))]} in
      --seq-length | --max-position-embeddings) LONG[i]=$SEQ ;;
      --global-batch-size) LONG[i]=1 ;;
      --train-iters) LONG[i]=3 ;;
    esac
  done
  run 8b_longest "${MPI[@]}" "$BIN" "${LONG[@]}" --cp-comm-type p2p --recompute-granularity full \
    --recompute-method uniform --recompute-num-layers 1
fi
if [[ $STAGES == *" small "* ]]; then
  D=.deps/data
  if [ ! -f "$D/fortunes_text_document.bin" ] && [ -f "$D/fortunes.jsonl" ]; then
    build-gpu/tools/preprocess_data --input "$D/fortunes.jsonl" --output-prefix "$D/fortunes" --tokenizer-type \
      GPT2BPETokenizer --vocab-file "$D/vocab.json" --merge-file "$D/merges.txt" --append-eod --workers 8 | tail -1
  fi
  SMALL=(--num-layers 16 --hidden-size 2048 --num-attention-heads 16 --group-query-attention --num-query-groups 8
         --ffn-hidden-size 5632 --seq-length 16384 --max-position-embeddings 16384 --position-embedding-type rope
         --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear
         --micro-batch-size 1 --global-batch-size 8 --train-iters "${ITERS_SMALL:-50}" --bf16 --lr 3e-4 --min-lr 3e-5
         --lr-decay-style cosine --lr-warmup-iters 5 --weight-decay 0.1 --adam-beta2 0.95 --hidden-dropout 0
         --attention-dropout 0 --eval-iters 0 --device cuda --log-interval 1 --use-distributed-optimizer
         --data-path "$D/fortunes_text_document" --split 98,1,1 --tokenizer-type GPT2BPETokenizer
         --vocab-file "$D/vocab.json" --merge-file "$D/merges.txt" --data-cache-path "$OUT/data-cache")
  run small_cp1 "$BIN" "${SMALL[@]}"
  run small_cp2 "${MPI[@]}" "$BIN" "${SMALL[@]}" --context-parallel-size 2 --cp-comm-type p2p
  run small_cp2_copy_engine "${MPI[@]}" "$BIN" "${SMALL[@]}" --context-parallel-size 2 --cp-comm-type p2p \
    --cp-comm-transport copy-engine
  scripts/gpu/compare_losses.py "$OUT/cp_small_cp1.log" "$OUT/cp_small_cp2.log" "0.89B seq 16384, CP=2 vs one GPU" |
    tee "$OUT/cp_small_compare.txt"
  scripts/gpu/compare_losses.py "$OUT/cp_small_cp2.log" "$OUT/cp_small_cp2_copy_engine.log" \
    "0.89B seq 16384, CP=2 ring by the copy engines vs by NCCL" | tee -a "$OUT/cp_small_compare.txt"
fi
if [[ $STAGES == *" packed "* ]]; then
  P=$OUT/docs_1k_64k
  python3 scripts/gpu/recut_documents.py .deps/docs/docs_text_document "$P" --min-tokens 1024 --max-tokens 65536
  PACKED=(--num-layers 16 --hidden-size 2048 --num-attention-heads 16 --group-query-attention --num-query-groups 8
          --ffn-hidden-size 5632 --seq-length 65536 --max-position-embeddings 65536 --position-embedding-type rope
          --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear
          --micro-batch-size 1 --global-batch-size 8 --train-iters "${ITERS_PACKED:-8}" --bf16 --lr 3e-4 --min-lr 3e-5
          --lr-decay-style cosine --lr-warmup-iters 2 --weight-decay 0.1 --adam-beta2 0.95 --hidden-dropout 0
          --attention-dropout 0 --eval-iters 0 --device cuda --log-interval 1 --use-distributed-optimizer
          --data-path "$P" --split 98,1,1 --tokenizer-type GPT2BPETokenizer --vocab-file .deps/docs/vocab.json
          --merge-file .deps/docs/merges.txt --data-cache-path "$OUT/data-cache" --reset-attention-mask
          --reset-position-ids --calculate-per-token-loss --context-parallel-size 2 --timing-log-level 1
          --timing-log-option all)
  run packed_fixed_cp2 "${MPI[@]}" "$BIN" "${PACKED[@]}"
  run packed_dynamic_cp "${MPI[@]}" "$BIN" "${PACKED[@]}" --hybrid-context-parallel --max-seqlen-per-dp-cp-rank 32768
  for name in packed_fixed_cp2 packed_dynamic_cp; do  # each report's forward-backward per rank (log interval 1)
    echo "-- $name: forward-backward ms by rank, iterations 3 on; idle = the slowest rank's time minus one's own"
    awk '/times across ranks \(ms\):/ {it++} /^  [a-z]/ {on = ($1 == "forward-backward:")}
         on && /rank/ && it >= 3 {t[it, $2 + 0] = $3; if ($2 + 0 > top) top = $2 + 0; last = it}
         END {for (i = 3; i <= last; i++) {m = 0; for (r = 0; r <= top; r++) if (t[i, r] > m) m = t[i, r];
                line = "iteration " i ":"; for (r = 0; r <= top; r++) {line = line " " t[i, r]; idle[r] += m - t[i, r]}
                span += m; print line}
              for (r = 0; r <= top; r++) printf "rank %d idle %.0f ms of %.0f (%.1f%%)\n", r, idle[r], span,
                                                100 * idle[r] / span}' "$OUT/cp_$name.log" | tee "$OUT/cp_${name}_ranks.txt"
  done
fi

echo
echo "================ cp_bench summary (mean of the last 2 log lines; MFU against 989 TFLOP/s bf16) ================"
for f in "$OUT"/cp_*.log; do
  [ -f "$f" ] || continue
  tfl=$(grep -E " iteration +[0-9]+/" "$f" | tail -2 | grep -oE "TFLOP/s/GPU\): [0-9.]+" | grep -oE "[0-9.]+$" |
        awk '{s += $1; n++} END {if (n) printf "%.1f", s / n}')
  tps=$(grep -E " iteration +[0-9]+/" "$f" | tail -2 | grep -oE "tokens per second per GPU: [0-9.]+" | grep -oE "[0-9.]+$" |
        awk '{s += $1; n++} END {if (n) printf "%.0f", s / n}')
  mfu=$(awk -v t="${tfl:-0}" 'BEGIN { printf "%.1f%%", 100 * t / 989 }')
  peak=$(grep -oE "peak allocated [0-9.]+" "$f" | grep -oE "[0-9.]+" | sort -n | tail -1)
  rec=$(grep -oE -- "--recompute-granularity [a-z]+" "$f" | head -1)
  printf '%-8s seq %6s tok/s/GPU %7s  TFLOP/s/GPU %6s  MFU %6s  peak GiB %6s  %s\n' \
    "$(basename "$f" .log | sed 's/^cp_//')" "$(grep -oE -- "--seq-length [0-9]+" "$f" | head -1 | cut -d' ' -f2)" "${tps:--}" "${tfl:--}" "$mfu" "${peak:--}" "${rec:-no recompute}"
done
exit 0
