#!/usr/bin/env bash
# On the GPU machine, after scripts/gpu/run.sh (or with BUILD_TARGETS_ONLY=1, which builds just what this
# needs): the model measurements side by side in one call, on one GPU:
#   1. pretrain_gpt vs the PyTorch peer (bench/reference/bench_reference.py: torch.compile, SDPA flash,
#      fused AdamW) on GPT-2 124M (gbs 512) and the Llama-style 0.89B (gbs 32), same micro-batch;
#   2. parity: parity_export then bench/reference/parity.py, bf16 on the GPU (GPT-2-style and Llama-style
#      small models, 20 iterations) and fp32 on the CPU;
#   3. determinism: two --deterministic-mode runs, losses compared.
# Logs under $OUT; a markdown table is printed last (and written to $OUT/bench_models.md).
#
#   4. long context (--only llama-long): the Llama-style 0.89B at 16k and 32k tokens per sequence (one
#      sequence per micro-batch, CP = 1), ours and the peer, attention included in the FLOPs.
#   5. MoE (--only moe): the Llama-style 0.89B at seq 4096 with every MLP a Mixtral-style MoE (8 SwiGLU experts
#      of 5632, top-2, switch aux loss 1e-2; 4.76B parameters), gbs 16, mbs 2 (mbs 1 where 2 does not fit):
#      ours with grouped GEMM and the alltoall dispatcher, 12 iterations (MOE_ITERS), the mean of the last 5:
#      each expert-GEMM shape family is timed when routing first produces it, which goes on for several
#      iterations (--use-pytorch-profiler shows it), so the mean is taken after that warm-up, as the peer's
#      is after torch.compile's; the peer (--model mixtral-8x-0.9b,
#      --moe-impl auto: the faster of its per-expert loop and torch._grouped_mm, named in its row) at the same
#      mbs. fp32 weights, gradients and Adam moments alone are 70-80 GiB here (the peer peaks at 96.5 GiB at
#      mbs 2, 89 GiB at mbs 1), so a GPU under 100 GiB (an H100) runs 10 layers; MOE_LAYERS=N sets the count.
#      PEER_MOE_IMPL=loop|grouped pins the peer's experts.
#      Not in the default set (no --only): pass --only moe.
#   6. observability (--only observability): the 0.89B at the defaults, with level-1 and level-2 timers and
#      the straggler detector, and with TensorBoard, side by side (docs/observability.md). Not in the default set.
#
#   scripts/gpu/bench_models.sh [--skip-peer] [--only gpt2|llama|llama-long|moe|observability|parity|determinism]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
BUILD=${BUILD:-build-gpu}
SKIP_PEER=0
ONLY=""
while [ $# -gt 0 ]; do
  case $1 in
    --skip-peer) SKIP_PEER=1 ;;
    --only) ONLY=$2; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
want() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }
want_explicit() { [[ ",$ONLY," == *",$1,"* ]]; }

if [ "${BUILD_TARGETS_ONLY:-0}" = 1 ]; then
  cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCUDNN_FRONTEND_ROOT="$PWD/.deps/cudnn_frontend" >"$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
  cmake --build $BUILD -j "$(nproc)" --target pretrain_gpt parity_export >"$OUT/build_models.log" 2>&1 ||
    { grep -E "error|FAILED" "$OUT/build_models.log" | head -30; exit 1; }
fi
PRETRAIN=$BUILD/tools/pretrain_gpt
EXPORT=$BUILD/bench/parity_export
rows=()

GPT2=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024
      --vocab-size 50257)
LLAMA=(--num-layers 16 --hidden-size 2048 --num-attention-heads 16 --group-query-attention --num-query-groups 8
       --ffn-hidden-size 5632 --seq-length 2048 --max-position-embeddings 2048 --vocab-size 32000
       --position-embedding-type rope --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights
       --disable-bias-linear)
source scripts/gpu/moe_model.sh  # for MOE_LAYERS (16, or 10 on a GPU under 100 GiB); MOE is redefined here
MOE=("${LLAMA[@]}" --seq-length 4096 --max-position-embeddings 4096 --num-experts 8 --moe-router-topk 2
     --moe-ffn-hidden-size 5632 --moe-grouped-gemm --moe-token-dispatcher-type alltoall --moe-aux-loss-coeff 1e-2
     --moe-router-load-balancing-type aux_loss)
COMMON=(--lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --weight-decay 0.1 --adam-beta2 0.95
        --bf16 --mock-data --hidden-dropout 0 --attention-dropout 0 --log-interval 1 --eval-interval 100000
        --eval-iters 0 --device cuda)

# ours: mean over the last 5 log lines of ms/iteration, TFLOP/s, tokens/s; peak allocated after the first.
ours() {  # name mbs gbs iters model-args...
  local name=$1 mbs=$2 gbs=$3 iters=$4
  shift 4
  local log="$OUT/ours_${name}_mbs${mbs}.log"
  $PRETRAIN "$@" "${COMMON[@]}" --micro-batch-size "$mbs" --global-batch-size "$gbs" --train-iters "$iters" >"$log" 2>&1
  local rc=$?
  python3 - "$log" "$name" "$mbs" "$gbs" "$rc" <<'EOF'
import re, sys
log, name, mbs, gbs, rc = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
text = open(log).read()
its = re.findall(r"elapsed time per iteration \(ms\): ([\d.]+) \| throughput per GPU \(TFLOP/s/GPU\): ([\d.]+).*?tokens per second per GPU: (\d+)", text)
mem = re.search(r"peak allocated ([\d.]+)", text)
if rc != "0" or len(its) < 2:
    err = [l for l in text.splitlines() if "error" in l.lower()][:3]
    print(f"| ours | {name} | {mbs} | {gbs} | FAILED (rc {rc}) {' / '.join(err)} | | | | |")
    sys.exit(0)
last = its[-5:] if len(its) >= 6 else its[1:]
ms = sum(float(x[0]) for x in last) / len(last)
tf = sum(float(x[1]) for x in last) / len(last)
tok = sum(float(x[2]) for x in last) / len(last)
print(f"| ours | {name} | {mbs} | {gbs} | {ms:.1f} | {tok:,.0f} | {tf:.1f} | {100 * tf / 989:.1f}% | {float(mem.group(1)) if mem else float('nan'):.2f} |")
EOF
}

peer() {  # name mbs gbs [seq]; PEER_ARGS: more bench_reference.py arguments
  local log="$OUT/peer_$1_mbs$2${4:+_seq$4}.log"
  PYTHONUNBUFFERED=1 python3 bench/reference/bench_reference.py --model "$1" --micro-batch-size "$2" \
    --global-batch-size "$3" --iters ${PEER_ITERS:-6} --warmup 3 ${4:+--seq-length $4} ${PEER_ARGS:-} >"$log" 2>&1
  python3 - "$log" "$1${4:+ seq $4}" "$2" "$3" <<'EOF'
import json, sys
log, name, mbs, gbs = sys.argv[1:5]
lines = [l for l in open(log) if l.startswith("RESULT ")]
if not lines:
    tail = open(log).read().strip().splitlines()[-2:]
    print(f"| pytorch compile | {name} | {mbs} | {gbs} | FAILED {' / '.join(tail)[:200]} | | | | |")
    sys.exit(0)
r = json.loads(lines[-1][7:])
if "moe_impl" in r:
    name += f" ({r['moe_impl']} experts{'' if r['moe_compiled'] else ', eager'})"
if r.get("fp8", "none") != "none":
    name += f" (fp8 {r['fp8']})"
if "moe_impl" in r and r.get("num_layers", 16) != 16:
    name += f"-{r['num_layers']}layers"
print(f"| pytorch compile | {name} | {mbs} | {gbs} | {r['ms_per_iteration']:.1f} | {r['tokens_per_s']:,.0f} | "
      f"{r['tflops_per_gpu']:.1f} | {100 * r['mfu']:.1f}% | {r['peak_allocated_gib']:.2f} |")
EOF
}

if want gpt2; then
  rows+=("$(ours gpt2-124m 64 512 8 "${GPT2[@]}")")
  rows+=("$(ours gpt2-124m 32 512 8 "${GPT2[@]}")")
  [ $SKIP_PEER = 0 ] && rows+=("$(peer gpt2-124m 64 512)")
fi
if want llama; then
  rows+=("$(ours llama-0.89b 8 32 10 "${LLAMA[@]}")")
  rows+=("$(ours llama-0.89b 16 32 10 "${LLAMA[@]}")")
  [ $SKIP_PEER = 0 ] && rows+=("$(peer llama-0.89b 8 32)")
fi

if want llama-long; then
  for seq in 16384 32768; do
    long=("${LLAMA[@]}")
    long[${#long[@]}]=--seq-length; long[${#long[@]}]=$seq
    long[${#long[@]}]=--max-position-embeddings; long[${#long[@]}]=$seq
    gbs=$(( 131072 / seq ))
    rows+=("$(ours "llama-0.89b-seq$seq" 1 $gbs 8 "${long[@]}")")
    [ $SKIP_PEER = 0 ] && rows+=("$(PEER_ITERS=4 peer llama-0.89b 1 $gbs $seq)")
  done
fi

# The cost of watching (--only observability): the 0.89B at mbs 8 at the defaults (no timers, no TensorBoard,
# no straggler detector), then with Megatron's level-1 and level-2 timers and the straggler detector, then with
# TensorBoard's event files (refused where the build found no Protobuf), then the defaults again; one call, one
# GPU, the same settings.
if want_explicit observability; then
  rows+=("$(ours llama-0.89b-defaults 8 32 10 "${LLAMA[@]}")")
  rows+=("$(ours llama-0.89b-timers1-straggler 8 32 10 "${LLAMA[@]}" --timing-log-level 1 --log-straggler)")
  rows+=("$(ours llama-0.89b-timers2-straggler 8 32 10 "${LLAMA[@]}" --timing-log-level 2 --log-straggler)")
  rows+=("$(ours llama-0.89b-tensorboard 8 32 10 "${LLAMA[@]}" --tensorboard-dir "$OUT/tensorboard" \
            --log-timers-to-tensorboard --timing-log-level 1)")
  # The defaults once more, last: the spread of two runs of one configuration, against which the costs above
  # are read (a 1% bar needs to know the noise).
  rows+=("$(ours llama-0.89b-defaults-again 8 32 10 "${LLAMA[@]}")")
fi

if want_explicit moe; then
  moe_name=mixtral-8x-0.9b$([ "$MOE_LAYERS" != 16 ] && echo "-${MOE_LAYERS}layers")
  # mbs 2, else 1 (out of memory or any other failure at 2); the peer at the mbs ours ran, with the same fallback.
  moe_mbs=""
  for mbs in 2 1; do
    row=$(ours "$moe_name" $mbs 16 ${MOE_ITERS:-12} "${MOE[@]}" --num-layers "$MOE_LAYERS")
    rows+=("$row")
    if [[ $row != *FAILED* ]]; then moe_mbs=$mbs; break; fi
  done
  if [ $SKIP_PEER = 0 ]; then
    for mbs in ${moe_mbs:-2} 1; do
      row=$(PEER_ARGS="--moe-impl ${PEER_MOE_IMPL:-auto} --num-layers $MOE_LAYERS" peer mixtral-8x-0.9b $mbs 16)
      rows+=("$row")
      [[ $row != *FAILED* || $mbs = 1 ]] && break
    done
  fi
fi

parity_rows=()
parity() {  # name device dtype-flag args...
  local name=$1 device=$2 dtflag=$3
  shift 3
  local dir="$OUT/parity_$name"
  rm -rf "$dir"
  $EXPORT --parity-dir "$dir" --parity-name "$name" "$@" $dtflag --device "$device" --mock-data \
    --hidden-dropout 0 --attention-dropout 0 --train-iters 20 --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine \
    --lr-warmup-iters 3 --weight-decay 0.1 --clip-grad 1.0 --micro-batch-size 4 --global-batch-size 8 \
    --seed 11 >"$OUT/parity_$name.export.log" 2>&1 || { parity_rows+=("| $name | export FAILED: $(tail -1 "$OUT/parity_$name.export.log") |"); return; }
  python3 bench/reference/parity.py "$dir" --device "$device" >"$OUT/parity_$name.log" 2>&1
  parity_rows+=("| $name | $(tail -1 "$OUT/parity_$name.log") |")
}
SMALL_GPT=(--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 256 --max-position-embeddings 256
           --vocab-size 4096)
SMALL_LLAMA=(--num-layers 4 --hidden-size 256 --num-attention-heads 8 --group-query-attention --num-query-groups 2
             --ffn-hidden-size 688 --seq-length 256 --vocab-size 4096 --position-embedding-type rope --swiglu
             --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear)
if want parity; then
  parity gpt2style_bf16_gpu cuda --bf16 "${SMALL_GPT[@]}"
  parity llamastyle_bf16_gpu cuda --bf16 "${SMALL_LLAMA[@]}"
  parity gpt2style_fp32_cpu cpu "" "${SMALL_GPT[@]/256/64}"
  parity llamastyle_fp32_cpu cpu "" "${SMALL_LLAMA[@]/256/64}"
fi

det_row=""
if want determinism; then
  for run in 1 2; do
    $PRETRAIN "${SMALL_LLAMA[@]}" "${COMMON[@]}" --deterministic-mode --micro-batch-size 4 --global-batch-size 16 \
      --train-iters 30 --seed 5 >"$OUT/deterministic_$run.log" 2>&1
    grep -o "lm loss: [0-9.E+-]*" "$OUT/deterministic_$run.log" >"$OUT/deterministic_$run.losses"
  done
  n=$(wc -l <"$OUT/deterministic_1.losses")
  if [ "$n" -gt 0 ] && cmp -s "$OUT/deterministic_1.losses" "$OUT/deterministic_2.losses"; then
    det_row="determinism: two --deterministic-mode runs, $n logged losses, identical"
  else
    det_row="determinism: FAILED ($n losses; diff: $(diff "$OUT/deterministic_1.losses" "$OUT/deterministic_2.losses" | head -2 | tr '\n' ' '))"
  fi
fi

{
  echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
  if [ ${#rows[@]} -gt 0 ]; then
    echo
    echo "| impl | model | mbs | gbs | ms/iter | tokens/s | TFLOP/s/GPU | MFU | peak alloc GiB |"
    echo "|---|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
  fi
  if [ ${#parity_rows[@]} -gt 0 ]; then
    echo
    echo "| parity run | result |"
    echo "|---|---|"
    printf '%s\n' "${parity_rows[@]}"
  fi
  [ -n "$det_row" ] && echo && echo "$det_row"
} | tee "$OUT/bench_models.md"
