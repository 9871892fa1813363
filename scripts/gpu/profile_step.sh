#!/usr/bin/env bash
# On the GPU machine, after the build: where one training iteration's GPU time goes. Runs pretrain_gpt under
# Nsight Compute, recording only iteration 2 (pretrain_gpt --profile marks it with cudaProfilerStart/Stop),
# and prints the kernels' summed duration by kernel, largest first, with the share of the total.
#
#   scripts/gpu/profile_step.sh gpt2|llama [micro-batch]     (one micro-batch per iteration)
#
# With --kernels instead: the GPU's own record of a real run (--use-pytorch-profiler: CUPTI, the clocks the run
# had, the gaps between kernels), iterations 3-4 of 5 (ITERS-2 and ITERS-1 of ITERS) at the benchmark's batch (moe: scripts/gpu/moe_model.sh's
# Mixtral-style model at mbs 2, GBS 16); prints how busy the GPU was and the time by kernel, and leaves the
# Chrome trace in $OUT/kernels_<model>/trace.json.
#   scripts/gpu/profile_step.sh --kernels gpt2|llama|llama8b|moe [micro-batch] [global batch]
# llama8b: Llama-3-8B-shaped layers (8 of them, fp8_bench.sh's shape) at mbs 1, GBS 8. EXTRA_ARGS is appended to
# the run's flags (e.g. EXTRA_ARGS="--fp8-format hybrid --fp8-recipe delayed"), and TAG names its output folder.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
kernels=0
[ "${1:-}" = --kernels ] && { kernels=1; shift; }
model=${1:-gpt2}
mbs=${2:-8}
case $model in
  gpt2) ARGS=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024
              --vocab-size 50257) ;;
  llama) ARGS=(--num-layers 16 --hidden-size 2048 --num-attention-heads 16 --group-query-attention --num-query-groups 8
               --ffn-hidden-size 5632 --seq-length 2048 --max-position-embeddings 2048 --vocab-size 32000
               --position-embedding-type rope --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights
               --disable-bias-linear) ;;
  llama8b) ARGS=(--num-layers 8 --hidden-size 4096 --num-attention-heads 32 --group-query-attention
                 --num-query-groups 8 --ffn-hidden-size 14336 --seq-length 4096 --max-position-embeddings 4096
                 --vocab-size 128256 --rotary-base 500000 --position-embedding-type rope --swiglu
                 --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear
                 --use-distributed-optimizer) ;;
  moe) source scripts/gpu/moe_model.sh
       ARGS=("${MOE[@]}") ;;
  *) echo "model: gpt2, llama, llama8b or moe" >&2; exit 2 ;;
esac
if [ $kernels = 1 ]; then
  case $model in
    moe) mbs=${2:-2}; gbs=${3:-16} ;;
    llama8b) mbs=${2:-1}; gbs=${3:-8} ;;
    *) gbs=${3:-$(( mbs * 4 ))} ;;
  esac
  read -r -a extra <<<"${EXTRA_ARGS:-}"
  model="${model}${TAG:+_$TAG}"
  iters=${ITERS:-5}  # the last two but one are recorded (iterations ITERS-2 and ITERS-1)
  dir="$OUT/kernels_${model}"
  rm -rf "$dir"
  # Later flags win, so the model's own batch and iteration count are overridden here.
  timeout ${RUN_TIMEOUT:-300} $BUILD/tools/pretrain_gpt "${ARGS[@]}" --micro-batch-size "$mbs" --global-batch-size "$gbs" \
    --train-iters "$iters" --lr 3e-4 --bf16 --mock-data --hidden-dropout 0 --attention-dropout 0 --log-interval 1 \
    --eval-iters 0 --device cuda --profile --use-pytorch-profiler --profile-dir "$dir" \
    --profile-step-start $(( iters - 2 )) --profile-step-end "$iters" "${extra[@]}" >"$OUT/kernels_${model}.log" 2>&1
  echo "rc $? | $model mbs $mbs gbs $gbs"
  grep -E "elapsed time per iteration" "$OUT/kernels_${model}.log" | tail -3 | cut -c1-200
  grep -E "GPU busy|by kernel|^  +[0-9]|error|Error" "$OUT/kernels_${model}.log" | cut -c1-220 | head -40
  exit 0
fi
csv="$OUT/profile_${model}.csv"
ncu --profile-from-start off --metrics gpu__time_duration.sum --csv --log-file "$csv" \
  $BUILD/tools/pretrain_gpt "${ARGS[@]}" --micro-batch-size "$mbs" --global-batch-size "$mbs" --train-iters 3 \
  --lr 3e-4 --bf16 --mock-data --hidden-dropout 0 --attention-dropout 0 --log-interval 1 --eval-iters 0 \
  --device cuda --profile --profile-step-start 2 --profile-step-end 3 >"$OUT/profile_${model}.log" 2>&1
python3 - "$csv" "$model" "$mbs" <<'PY'
import csv, sys, collections
path, model, mbs = sys.argv[1:4]
rows = [r for r in csv.reader(l for l in open(path) if l.startswith('"'))]
head = rows[0]
ki, mi, vi = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
unit_i = head.index("Metric Unit")
total = collections.Counter(); count = collections.Counter()
for r in rows[1:]:
    if r[mi] != "gpu__time_duration.sum": continue
    v = float(r[vi].replace(",", ""))
    scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(r[unit_i], 1.0)
    name = r[ki].split("(")[0][:90]
    total[name] += v * scale; count[name] += 1
s = sum(total.values())
print(f"profile {model} mbs {mbs}: {sum(count.values())} kernels, {s/1e3:.2f} ms of kernel time in one iteration")
print("| kernel | calls | ms | share |")
print("|---|---|---|---|")
for name, us in total.most_common(30):
    print(f"| {name} | {count[name]} | {us/1e3:.3f} | {100*us/s:.1f}% |")
PY
