#!/usr/bin/env bash
# On nvidia-h200-x8, after `BUILD_TARGETS=pretrain_gpt scripts/gpu/fp8_bench.sh build`: the layouts users run on
# one node of eight GPUs, each a short pretrain_gpt run on mock data (logs in $OUT/node_*.log, a table last).
# Stages (each fits one 600 s device call; ITERS, RUN_TIMEOUT change the lengths):
#   plan      the memory planner's advice for 8 GPUs (--dry-run-layouts 8, on the host, seconds) for the three
#             shapes below, printed next to what the other stages measure.
#   8b        Llama-3-8B shape (seq 4096, mbs 1, GBS 256), bf16 and FP8 (hybrid, delayed, --fp8-param-gather
#             at DP=8): DP=8 with the distributed optimizer, TP=2 + SP x DP=4, TP=2 + SP x PP=2 (interleaved,
#             8 layers per virtual stage) x DP=2. Six runs of ~1.5 min: PRECISIONS=bf16 / fp8 splits them over
#             two calls if one would run past 600 s. The planner (CPU, --dry-run --dry-run-world-size 8) puts
#             them at 76.4 / 74.1 (DP=8), 49.8 (TP=2 x DP=4, FP8) and 35.9 GiB (TP=2 x PP=2 x DP=2, FP8).
#   scaling   a 16-layer 8B-shaped model that fits one GPU: one GPU at GBS 32 against DP=8 at GBS 256 (the same
#             work per GPU), for the scaling efficiency (per-GPU tokens/s of DP=8 over one GPU's).
#   70b       a 70B shape (80 layers, h 8192, GQA 64/8, ffn 28672, seq 4096, GBS 32) in the layout the planner
#             ranks first for 8 GPUs (its row is parsed from the plan; TP=4 x PP=2 with full recomputation and a
#             quarter of the optimizer state on the host when this was written, the offload's pinned memory held
#             to the node's), 3 iterations.
#   mixtral   a Mixtral-8x7B shape (32 layers, h 4096, 8 experts of ffn 14336, top-2, seq 4096, GBS 64) in the
#             planner's first layout with expert parallelism, on the carried real-text corpus when there is one
#             (mixtral_on_text), per-layer MoE losses logged (--moe-per-layer-logging, a line under each log
#             line) for the load balance.
#   overlap   the 8B shape at TP=8 + SP (DP=1, GBS 32) and TP=4 + SP x DP=2 (GBS 64), --tp-comm-overlap off and on.
#   scripts/gpu/node_bench.sh [plan] [8b] [scaling] [70b] [mixtral] [overlap]   (default: plan 8b)
# The summary sets each run beside the planner's step-time estimate and peak for its own flags (--dry-run).
# GPUS=4 rehearses the stages on nvidia-h200-x4: the same layouts with DP halved, the global batches scaled to
# 32 sequences per GPU (GBS_PER_GPU), TP=8 left out; --dry-run-layouts for that many GPUs. LAYERS_70B and
# LAYERS_MIXTRAL (default 80 and 32) cut those shapes' depth, so that fewer GPUs rehearse their layers' kernels
# and the planner's figures for them (GPUS=2 LAYERS_70B=8 LAYERS_MIXTRAL=8 ... 70b mixtral).
set -uo pipefail
cd "$(dirname "$0")/../.."
export GPUS=${GPUS:-8}
source scripts/gpu/two_gpus.sh  # OUT, the environment, MPI (GPUS ranks)
GBS_PER_GPU=${GBS_PER_GPU:-32}  # 256 sequences on 8 GPUs
# The planner's GPU budget (GiB allocated per GPU): an H200's 140 GiB less ~5 GiB of the caching pool's
# fragmentation (peak reserved over peak allocated: 4.1 GiB for the 70B's layers, 5.0 for Mixtral's on 2x H200,
# bench/RESULTS.md) and ~3 GiB outside the pool (CUDA context, NCCL's buffers, the libraries' workspaces).
PLAN_GPU_GIB=${PLAN_GPU_GIB:-130}
STAGES=" ${*:-plan 8b} "
ITERS=${ITERS:-4}
RUN_TIMEOUT=${RUN_TIMEOUT:-240}
BIN=${BIN:-build-gpu/tools/pretrain_gpt}
COMMON=(--bf16 --mock-data --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --hidden-dropout 0
        --attention-dropout 0 --eval-iters 0 --device cuda --log-interval 1 --swiglu --normalization RMSNorm
        --position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights
        --group-query-attention --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1)
LLAMA3_8B=(--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --num-query-groups 8 --ffn-hidden-size 14336
           --vocab-size 128256 --rotary-base 500000)
LLAMA_70B=(--num-layers "${LAYERS_70B:-80}" --hidden-size 8192 --num-attention-heads 64 --num-query-groups 8 --ffn-hidden-size 28672
           --vocab-size 128256 --rotary-base 500000 --global-batch-size 32)
MIXTRAL=(--num-layers "${LAYERS_MIXTRAL:-32}" --hidden-size 4096 --num-attention-heads 32 --num-query-groups 8 --ffn-hidden-size 14336
         --vocab-size 32000 --rotary-base 1000000 --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 14336
         --moe-grouped-gemm --moe-token-dispatcher-type alltoall --moe-aux-loss-coeff 1e-2
         --moe-router-load-balancing-type aux_loss --global-batch-size 64)
DISTOPT=(--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather)
FP8=(--fp8-format hybrid --fp8-recipe delayed)

run() {  # run <name> <command...>
  local name=$1
  shift
  echo "== $name: $*" | tee "$OUT/node_$name.log"
  timeout -k 10 "$RUN_TIMEOUT" "$@" >>"$OUT/node_$name.log" 2>&1
  echo "   rc $?" | tee -a "$OUT/node_$name.log"
  grep -E "error|watchdog|out of memory" "$OUT/node_$name.log" | head -3
  grep -E " iteration +[0-9]+/" "$OUT/node_$name.log" | tail -1 | cut -c1-220
  # The planner's figures for the same flags (--dry-run on the host, a second), for the summary's comparison.
  local ranks=1 flags=() after_bin=0
  [ "$1" = mpirun ] && ranks=$GPUS
  for a in "$@"; do
    [ $after_bin = 1 ] && flags+=("$a")
    [ "$a" = "$BIN" ] && after_bin=1
  done
  "$BIN" "${flags[@]}" --dry-run --dry-run-world-size "$ranks" 2>&1 |
    grep -E "^estimated step time|^predicted peak allocated" | sed 's/^/planner: /' >>"$OUT/node_$name.log"
}

# The planner's first layout for 8 GPUs as flags: "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2
# ..." from the first row of --dry-run-layouts (TP PP CP DP [EP] recompute model-state ...).
first_layout() {  # first_layout <model flags...>
  "$BIN" "$@" "${COMMON[@]}" --train-iters 3 --dry-run-layouts "$GPUS" --dry-run-gpu-memory "$PLAN_GPU_GIB" 2>&1 | python3 -c '
import sys
lines = sys.stdin.read().splitlines()
head = next((i for i, l in enumerate(lines) if l.split()[:4] == ["TP", "PP", "CP", "DP"]), None)
if head is None or head + 1 >= len(lines) or not lines[head + 1].split()[0].isdigit():
    tail = " / ".join(l.strip() for l in lines[-3:])
    sys.exit(f"the planner listed no layout that fits: {tail}")
cols, row = lines[head].split(), lines[head + 1].split()
v = dict(zip(cols, row))
flags = ["--tensor-model-parallel-size", v["TP"], "--pipeline-model-parallel-size", v["PP"],
         "--context-parallel-size", v["CP"]]
if "EP" in v: flags += ["--expert-model-parallel-size", v["EP"]]
if int(v["TP"]) > 1: flags.append("--sequence-parallel")
recompute = row[cols.index("recompute")]
if recompute == "full": flags += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
elif recompute == "selective": flags += ["--recompute-granularity", "selective", "--recompute-modules", row[cols.index("recompute") + 1]]
state = " ".join(row[cols.index("recompute") + (2 if recompute == "selective" else 1):-3])
if state.startswith("offload"):
    flags += ["--use-distributed-optimizer", "--optimizer-cpu-offload", "--optimizer-offload-fraction", state.split()[1],
              "--overlap-cpu-optimizer-d2h-h2d"]
elif state.startswith("distributed"): flags += ["--use-distributed-optimizer", "--overlap-grad-reduce"]
elif state.startswith("fsdp"): flags += ["--use-megatron-fsdp"]
print(" ".join(flags))'
}

# Mixtral's flags on the carried real-text corpus when it is there (scripts/gpu/prepare_text_corpus.sh: a byte-level
# BPE of 32,000 tokens, Mixtral's vocabulary size), else as given: on mock data's uniform random tokens the router
# drifts to a few experts within iterations (on 2x H200 the load-balancing loss went 1.01 -> 1.56 in 4), which says
# nothing about a real run's balance. Prints the flags one per line (no flag has a space in it).
mixtral_on_text() {
  if [ ! -f .deps/docs/docs_text_document.bin ]; then printf '%s\n' "$@"; return; fi
  local skip=0 a
  for a in "$@"; do
    if [ $skip = 1 ]; then skip=0; continue; fi
    case $a in --mock-data) continue ;; --vocab-size) skip=1; continue ;; esac
    printf '%s\n' "$a"
  done
  printf '%s\n' --data-path .deps/docs/docs_text_document --split 98,1,1 --data-cache-path "$OUT/data-cache" \
    --tokenizer-type GPT2BPETokenizer --vocab-file .deps/docs/vocab.json --merge-file .deps/docs/merges.txt
}

if [[ $STAGES == *" plan "* ]]; then
  for shape in LLAMA3_8B LLAMA_70B MIXTRAL; do
    declare -n args=$shape
    gbs=(); [ "$shape" = LLAMA3_8B ] && gbs=(--global-batch-size $(( GBS_PER_GPU * GPUS )))
    echo "== planner, $shape, $GPUS GPUs ($PLAN_GPU_GIB GiB each):"
    "$BIN" "${args[@]}" "${COMMON[@]}" "${gbs[@]}" --train-iters 3 --dry-run-layouts "$GPUS" --dry-run-gpu-memory "$PLAN_GPU_GIB" 2>&1 |
      grep -A6 -E "^ +TP +PP" | tee "$OUT/node_plan_$shape.txt"
    unset -n args
  done
fi

if [[ $STAGES == *" 8b "* ]]; then
  B=(--global-batch-size $(( GBS_PER_GPU * GPUS )) --train-iters "$ITERS")
  for precision in ${PRECISIONS:-bf16 fp8}; do
    extra=(); [ $precision = fp8 ] && extra=("${FP8[@]}")
    gather=(); [ $precision = fp8 ] && gather=(--fp8-param-gather)
    # shellcheck disable=SC2086
    run 8b_dp${GPUS}_$precision "${MPI[@]}" "$BIN" "${LLAMA3_8B[@]}" "${COMMON[@]}" "${B[@]}" "${DISTOPT[@]}" "${extra[@]}" \
      "${gather[@]}"
    run 8b_tp2_dp$(( GPUS / 2 ))_$precision "${MPI[@]}" "$BIN" "${LLAMA3_8B[@]}" "${COMMON[@]}" "${B[@]}" "${DISTOPT[@]}" \
      "${extra[@]}" --tensor-model-parallel-size 2 --sequence-parallel
    run 8b_tp2_pp2_dp$(( GPUS / 4 ))_$precision "${MPI[@]}" "$BIN" "${LLAMA3_8B[@]}" "${COMMON[@]}" "${B[@]}" "${DISTOPT[@]}" \
      "${extra[@]}" --tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 2 \
      --num-layers-per-virtual-pipeline-stage 8
  done
fi

if [[ $STAGES == *" scaling "* ]]; then
  HALF=("${LLAMA3_8B[@]}")
  HALF[1]=16  # --num-layers 16: fits one GPU with the optimizer on it
  run scaling_1gpu "$BIN" "${HALF[@]}" "${COMMON[@]}" --global-batch-size 32 --train-iters "$ITERS" \
    --use-distributed-optimizer
  run scaling_dp$GPUS "${MPI[@]}" "$BIN" "${HALF[@]}" "${COMMON[@]}" --global-batch-size $(( 32 * GPUS )) \
    --train-iters "$ITERS" \
    "${DISTOPT[@]}"
fi

if [[ $STAGES == *" 70b "* ]]; then
  if LAYOUT=$(first_layout "${LLAMA_70B[@]}"); then
    echo "70B: the planner's first layout: $LAYOUT"
    # shellcheck disable=SC2086
    run 70b "${MPI[@]}" "$BIN" "${LLAMA_70B[@]}" "${COMMON[@]}" --train-iters 3 $LAYOUT
  else
    echo "70B: not run"
  fi
fi

if [[ $STAGES == *" mixtral "* ]]; then
  if LAYOUT=$(first_layout "${MIXTRAL[@]}"); then
    echo "Mixtral 8x7B: the planner's first layout: $LAYOUT"
    # A real run's warm-up (the first iterations at a fraction of the rate): on real text COMMON's two-iteration
    # warm-up to 3e-4 blew the 8-layer rehearsal up (grad norm 8 -> 351, lm loss 11.2 -> 27.2 at iteration 3, the
    # router collapsing onto two experts), and the balance measured would be that of a diverged run.
    # shellcheck disable=SC2086,SC2046
    run mixtral "${MPI[@]}" "$BIN" $(mixtral_on_text "${MIXTRAL[@]}" "${COMMON[@]}") --train-iters "$ITERS" \
      --lr-warmup-iters 100 --lr-decay-iters 1000 --moe-per-layer-logging $LAYOUT
    grep -E "^  per-layer" "$OUT/node_mixtral.log" | tail -1 | cut -c1-400  # the last iteration's balance per layer
  else
    echo "Mixtral 8x7B: not run"
  fi
fi

if [[ $STAGES == *" overlap "* ]]; then
  for tp in 8 4; do
    [ "$tp" -le "$GPUS" ] || continue
    gbs=$(( 32 * GPUS / tp ))  # 32 sequences per TP group: 32 at TP=8 (DP=1), 64 at TP=4 x DP=2
    base=("${LLAMA3_8B[@]}" "${COMMON[@]}" --global-batch-size "$gbs" --train-iters "$ITERS" "${DISTOPT[@]}"
          --tensor-model-parallel-size "$tp" --sequence-parallel)
    run "8b_tp${tp}_overlap_off" "${MPI[@]}" "$BIN" "${base[@]}"
    run "8b_tp${tp}_overlap_on" "${MPI[@]}" "$BIN" "${base[@]}" --tp-comm-overlap
  done
fi

echo
echo "======== node_bench summary (mean of the last 2 log lines; MFU against 989 TFLOP/s bf16; the planner's --dry-run) ========"
for f in "$OUT"/node_*.log; do
  [ -f "$f" ] || continue
  python3 - "$f" <<'PY'
import re, sys
path = sys.argv[1]
text = open(path).read()
its = re.findall(r"elapsed time per iteration \(ms\): ([\d.]+) \| throughput per GPU \(TFLOP/s/GPU\): ([\d.]+).*?tokens per second per GPU: (\d+)", text)
peak = [float(x) for x in re.findall(r"peak allocated ([\d.]+)", text)]
plan_step = re.findall(r"planner: estimated step time: ([\d.]+) s", text)
plan_peak = [float(x) for x in re.findall(r"planner: predicted peak allocated: ([\d.]+)", text)]
name = path.rsplit("/", 1)[-1][5:-4]
if not its:
    print(f"{name:28s} no iteration logged")
    sys.exit(0)
last = its[-2:]
ms = sum(float(a) for a, _, _ in last) / len(last)
tf = sum(float(b) for _, b, _ in last) / len(last)
tok = sum(float(c) for _, _, c in last) / len(last)
plan = (f"  planner {1000 * float(plan_step[0]):9.1f} ms, {max(plan_peak):6.2f} GiB"
        if plan_step and plan_peak else "  planner: no estimate")
print(f"{name:28s} tok/s/GPU {tok:9.0f}  TFLOP/s/GPU {tf:7.1f}  MFU {100 * tf / 989:5.1f}%  ms/iter {ms:9.1f}  "
      f"peak GiB {max(peak) if peak else float('nan'):7.2f}{plan}")
PY
done
for shape in LLAMA3_8B LLAMA_70B MIXTRAL; do
  [ -f "$OUT/node_plan_$shape.txt" ] && { echo "planner's first rows, $shape:"; head -3 "$OUT/node_plan_$shape.txt"; }
done
exit 0
