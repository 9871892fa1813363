#!/usr/bin/env bash
# On nvidia-h200-x2, after scripts/gpu/run.sh has built build-gpu/: the pipeline-parallel figures, each a short
# bf16 pretrain_gpt run over both GPUs (logs in $OUT/pp_*.log, a table last).
#   1. Llama-3-8B shape (32 layers, h 4096, 32 heads, 8 query groups, ffn 14336, vocab 128256, seq 4096, mbs 1,
#      GBS 32, rope base 500000): PP=2 1F1B, PP=2 interleaved with 2 and 4 chunks per rank, next to TP=2 + SP and
#      DP=2 with the distributed optimizer in the same call; each run profiles iterations 3-4 (--profile-dir) for
#      each stage's measured bubble next to (p-1)/(v*m); each rank's peak memory (1F1B: stage 0 holds the most
#      micro-batches).
#   2. GPT-2 124M shape with tied embeddings (the embedding-group all-reduce over NCCL) on real text
#      (.deps/data, scripts/gpu/prepare_data.sh): PP=2 against one GPU, 50 iterations, losses compared.
#   2b. (8b-balanced) the same three with the output layer's weight counted: the first stage takes 17 of the 32
#      layers (the 128256-word output layer costs about 2.2 layers' FLOPs), by --decoder-first-pipeline-num-layers
#      without interleaving and by --pipeline-model-parallel-layout with 2 and 4 chunks per rank.
#   2c. (8b-steady) the balanced three without the profiler, 10 iterations, level-2 timers (P2P_NCHANNELS=n: also
#      1F1B and v=4 with NCCL_MAX_P2P_NCHANNELS=n; NO_OVERLAP=1: also v=4 with --no-overlap-p2p-communication).
#   CLOCKS=1 samples each GPU's SM clock and power during every run (nvidia-smi) and logs their means.
#   3. The same 8B shape at TP=2 + SP with --tp-comm-overlap (the collectives pipelined with the GEMMs), next
#      to the TP=2 + SP row without it.
#   scripts/gpu/pp_bench.sh [8b-pp|8b-balanced|8b-steady|gpt2|8b-others|all]...   (stages run in the order given; ITERS_8B=5,
#   ITERS_GPT2=50; RUN_TIMEOUT=s bounds each run so a hang cannot eat the lease; PROF=dir keeps the Chrome
#   traces out of $OUT)
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/two_gpus.sh  # OUT, the environment, MPI
STAGES=" ${*:-all} "
want() { [[ $STAGES == *" all "* || $STAGES == *" $1 "* ]]; }
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
PROF=${PROF:-$OUT}
ITERS_8B=${ITERS_8B:-5}
ITERS_GPT2=${ITERS_GPT2:-50}
BIN=build-gpu/tools/pretrain_gpt
LLAMA3_8B=(--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention --num-query-groups 8
           --ffn-hidden-size 14336 --seq-length 4096 --max-position-embeddings 4096 --vocab-size 128256
           --rotary-base 500000 --swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear
           --untie-embeddings-and-output-weights --micro-batch-size 1 --global-batch-size 32 --train-iters "$ITERS_8B"
           --bf16 --mock-data --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2
           --hidden-dropout 0 --attention-dropout 0 --eval-iters 0 --device cuda --log-interval 1
           --profile --profile-step-start 3 --profile-step-end 5)

run() {  # run <name> <command...>
  local name=$1
  shift
  echo "== $name: $*" | tee "$OUT/pp_$name.log"
  local sampler=
  if [ -n "${CLOCKS:-}" ]; then  # each GPU's SM clock and power twice a second, for the run's summary line
    nvidia-smi --query-gpu=index,clocks.sm,power.draw --format=csv,noheader,nounits -lms 500 >"$OUT/pp_$name.clocks" &
    sampler=$!
  fi
  timeout -k 10 "$RUN_TIMEOUT" "$@" >>"$OUT/pp_$name.log" 2>&1
  echo "   rc $?" | tee -a "$OUT/pp_$name.log"
  if [ -n "$sampler" ]; then
    kill "$sampler" 2>/dev/null
    # The second half of the samples (the steady iterations): mean SM clock and power per GPU.
    awk -F', *' '{n++; i[n] = $1; c[n] = $2; p[n] = $3} END {for (k = int(n / 2) + 1; k <= n; k++) {sc[i[k]] += c[k];
         sp[i[k]] += p[k]; m[i[k]]++} for (g in m) printf "gpu %s: SM clock %.0f MHz, power %.0f W\n", g, sc[g] / m[g], sp[g] / m[g]}' \
      "$OUT/pp_$name.clocks" | sort | tee -a "$OUT/pp_$name.log"
  fi
  grep -E "error|watchdog|bubble" "$OUT/pp_$name.log" | head -4
  grep -E " iteration +[0-9]+/" "$OUT/pp_$name.log" | tail -1 | cut -c1-220
}

if want 8b-pp; then
  run 8b_pp2 "${MPI[@]}" "$BIN" "${LLAMA3_8B[@]}" --pipeline-model-parallel-size 2 --profile-dir "$PROF/prof_pp2"
  run 8b_pp2_v2 "${MPI[@]}" "$BIN" "${LLAMA3_8B[@]}" --pipeline-model-parallel-size 2 \
    --num-layers-per-virtual-pipeline-stage 8 --profile-dir "$PROF/prof_pp2_v2"
  run 8b_pp2_v4 "${MPI[@]}" "$BIN" "${LLAMA3_8B[@]}" --pipeline-model-parallel-size 2 \
    --num-layers-per-virtual-pipeline-stage 4 --profile-dir "$PROF/prof_pp2_v4"
fi
if want 8b-balanced; then
  run 8b_pp2_bal "${MPI[@]}" "$BIN" "${LLAMA3_8B[@]}" --pipeline-model-parallel-size 2 \
    --decoder-first-pipeline-num-layers 17 --profile-dir "$PROF/prof_pp2_bal"
  run 8b_pp2_v2_bal "${MPI[@]}" "$BIN" "${LLAMA3_8B[@]}" --pipeline-model-parallel-size 2 \
    --pipeline-model-parallel-layout "Et*9|t*8|t*8|t*7L" --profile-dir "$PROF/prof_pp2_v2_bal"
  run 8b_pp2_v4_bal "${MPI[@]}" "$BIN" "${LLAMA3_8B[@]}" --pipeline-model-parallel-size 2 \
    --pipeline-model-parallel-layout "Et*5|(t*4|)*6,t*3L" --profile-dir "$PROF/prof_pp2_v4_bal"
fi
if want 8b-steady; then
  # The balanced layouts again without the profiler, over ITERS_STEADY (10) iterations with the level-2 timers, for
  # the throughput comparison (the profiled runs above synchronise at their profiled iterations) and each stage's
  # compute time per iteration (forward-compute + backward-compute: a slower compute under the transfers shows
  # there). With P2P_NCHANNELS set, 1F1B and v=4 once more with NCCL_MAX_P2P_NCHANNELS at that value: the
  # point-to-point kernels then hold fewer SMs while they wait for their peer during the computation.
  STEADY=()
  for ((i = 0; i < ${#LLAMA3_8B[@]}; i++)); do
    case ${LLAMA3_8B[$i]} in
      --profile) ;;
      --profile-step-start | --profile-step-end) i=$((i + 1)) ;;
      --train-iters) STEADY+=(--train-iters "${ITERS_STEADY:-10}"); i=$((i + 1)) ;;
      *) STEADY+=("${LLAMA3_8B[$i]}") ;;
    esac
  done
  STEADY+=(--pipeline-model-parallel-size 2 --timing-log-level 2)
  run 8b_steady_1f1b "${MPI[@]}" "$BIN" "${STEADY[@]}" --decoder-first-pipeline-num-layers 17
  run 8b_steady_v2 "${MPI[@]}" "$BIN" "${STEADY[@]}" --pipeline-model-parallel-layout "Et*9|t*8|t*8|t*7L"
  run 8b_steady_v4 "${MPI[@]}" "$BIN" "${STEADY[@]}" --pipeline-model-parallel-layout "Et*5|(t*4|)*6,t*3L"
  if [ -n "${P2P_NCHANNELS:-}" ]; then
    export NCCL_MAX_P2P_NCHANNELS=$P2P_NCHANNELS
    run 8b_steady_1f1b_ch$P2P_NCHANNELS "${MPI[@]}" -x NCCL_MAX_P2P_NCHANNELS "$BIN" "${STEADY[@]}" \
      --decoder-first-pipeline-num-layers 17
    run 8b_steady_v4_ch$P2P_NCHANNELS "${MPI[@]}" -x NCCL_MAX_P2P_NCHANNELS "$BIN" "${STEADY[@]}" \
      --pipeline-model-parallel-layout "Et*5|(t*4|)*6,t*3L"
    unset NCCL_MAX_P2P_NCHANNELS
  fi
  if [ -n "${NO_OVERLAP:-}" ]; then  # v=4 with Megatron's non-overlapped batches and waits
    run 8b_steady_v4_no_overlap "${MPI[@]}" "$BIN" "${STEADY[@]}" --no-overlap-p2p-communication \
      --pipeline-model-parallel-layout "Et*5|(t*4|)*6,t*3L"
  fi
fi
if want gpt2; then
  D=.deps/data
  if [ ! -f "$D/fortunes_text_document.bin" ] && [ -f "$D/fortunes.jsonl" ]; then  # prepare_data.sh left it to us
    build-gpu/tools/preprocess_data --input "$D/fortunes.jsonl" --output-prefix "$D/fortunes" --tokenizer-type \
      GPT2BPETokenizer --vocab-file "$D/vocab.json" --merge-file "$D/merges.txt" --append-eod --workers 8 | tail -1
  fi
  GPT2=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024
        --micro-batch-size 8 --global-batch-size 32 --train-iters "$ITERS_GPT2" --bf16 --lr 6e-4 --min-lr 6e-5
        --lr-decay-style cosine --lr-warmup-iters 5 --weight-decay 0.1 --hidden-dropout 0 --attention-dropout 0
        --eval-iters 0 --device cuda --log-interval 1 --deterministic-mode --data-path "$D/fortunes_text_document"
        --split 98,1,1 --tokenizer-type GPT2BPETokenizer --vocab-file "$D/vocab.json" --merge-file "$D/merges.txt"
        --data-cache-path "$OUT/data-cache")
  run gpt2_pp1 "$BIN" "${GPT2[@]}"
  run gpt2_pp2 "${MPI[@]}" "$BIN" "${GPT2[@]}" --pipeline-model-parallel-size 2
  scripts/gpu/compare_losses.py "$OUT/pp_gpt2_pp1.log" "$OUT/pp_gpt2_pp2.log" "GPT-2 tied, PP=2 vs one GPU" |
    tee "$OUT/pp_gpt2_compare.txt"
fi
if want 8b-others; then
  run 8b_tp2_sp "${MPI[@]}" "$BIN" "${LLAMA3_8B[@]}" --tensor-model-parallel-size 2 --sequence-parallel
  run 8b_tp2_sp_overlap "${MPI[@]}" "$BIN" "${LLAMA3_8B[@]}" --tensor-model-parallel-size 2 --sequence-parallel \
    --tp-comm-overlap
  run 8b_dp2 "${MPI[@]}" "$BIN" "${LLAMA3_8B[@]}" --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
fi

echo
echo "================ pp_bench summary (mean of the last 3 log lines; MFU against 989 TFLOP/s bf16) ================"
for f in "$OUT"/pp_8b_*.log; do
  [ -f "$f" ] || continue
  tfl=$(grep -E " iteration +[0-9]+/" "$f" | tail -3 | grep -oE "TFLOP/s/GPU\): [0-9.]+" | grep -oE "[0-9.]+$" |
        awk '{s += $1; n++} END {if (n) printf "%.1f", s / n}')
  tps=$(grep -E " iteration +[0-9]+/" "$f" | tail -3 | grep -oE "tokens per second per GPU: [0-9.]+" | grep -oE "[0-9.]+$" |
        awk '{s += $1; n++} END {if (n) printf "%.0f", s / n}')
  mfu=$(awk -v t="${tfl:-0}" 'BEGIN { printf "%.1f%%", 100 * t / 989 }')
  peaks=$(grep -oE "\[rank [0-9]\] \[after iteration [0-9]+\] memory \(GiB\): peak allocated [0-9.]+" "$f" |
          sed -E 's/\[rank ([0-9])\].*peak allocated ([0-9.]+)/r\1 \2/' | sort | tr '\n' ' ')
  bubble=$(grep -oE "stage 0 [0-9.]+ stage 1 [0-9.]+ \| ideal.*" "$f" | head -1)
  printf '%-10s tok/s/GPU %7s  TFLOP/s/GPU %6s  MFU %6s  peak GiB %s %s\n' "$(basename "$f" .log | sed 's/^pp_8b_//')" \
    "${tps:--}" "${tfl:--}" "$mfu" "${peaks:--}" "${bubble:+ bubble $bubble}"
done
[ -f "$OUT/pp_gpt2_compare.txt" ] && cat "$OUT/pp_gpt2_compare.txt"
for f in "$OUT"/pp_8b_steady_*.log; do  # the last timer report of the steady runs: each stage's compute and waits
  [ -f "$f" ] || continue
  echo "-- $(basename "$f" .log | sed 's/^pp_8b_//'): last timer report (ms per iteration, (min, max) over ranks)"
  last_timer_report "$f" "forward-backward |forward-compute|backward-compute|-recv|-send"
done
exit 0
