#!/usr/bin/env bash
# On a GPU machine of GPUS GPUs (default: all of them), after `BUILD_TARGETS=pretrain_gpt scripts/gpu/fp8_bench.sh
# build`: every parallel layout over all the GPUs trains a small Llama-style model (8 layers, h 1024, GQA 16/8,
# seq 2048, bf16, mock data, the same seed) for ITERS iterations, and its losses are held to one GPU's run of the
# same model (scripts/gpu/compare_losses.py). The CPU suites prove these layouts equal to one rank in fp32; this
# is the GPU smoke at more than two ranks: nothing hangs, the copy-engine rings close over every GPU, and the
# losses track one GPU's within bf16's reduction-order noise (LOSS_TOL, default 2e-2 relative at any iteration; the
# four-GPU runs of 2026-11-29 stayed under 5.5e-3). Logs in $OUT/layout_*.log, a table last; the exit status is 1
# when a run failed or a layout's losses left the bound.
#   GPUS=4 scripts/gpu/layouts_check.sh [dense] [moe] [fp8]   (default: all three groups)
set -uo pipefail
cd "$(dirname "$0")/../.."
GPUS=${GPUS:-$(nvidia-smi -L | wc -l)}
export GPUS
source scripts/gpu/two_gpus.sh  # OUT, the environment, MPI (GPUS ranks)
ITERS=${ITERS:-8}
RUN_TIMEOUT=${RUN_TIMEOUT:-150}
BIN=${BIN:-build-gpu/tools/pretrain_gpt}
MODEL=(--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --group-query-attention --num-query-groups 8
       --ffn-hidden-size 2816 --seq-length 2048 --max-position-embeddings 2048 --vocab-size 32000 --swiglu
       --normalization RMSNorm --position-embedding-type rope --disable-bias-linear
       --untie-embeddings-and-output-weights --micro-batch-size 1 --global-batch-size 16 --train-iters "$ITERS"
       --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 --bf16 --mock-data
       --hidden-dropout 0 --attention-dropout 0 --seed 1234 --log-interval 1 --eval-iters 0 --device cuda)
MOE=(--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 1408 --moe-grouped-gemm
     --moe-token-dispatcher-type alltoall --moe-aux-loss-coeff 1e-2 --moe-router-load-balancing-type aux_loss)
FP8=(--fp8-format hybrid --fp8-recipe delayed)
DISTOPT=(--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather)
HALF=$(( GPUS / 2 ))
GROUPS_RUN=" ${*:-dense moe fp8} "
rows=()
failed=()
LOSS_TOL=${LOSS_TOL:-2e-2}

run() {  # run <name> <ranks> <flags...>: one pretrain_gpt run, its log $OUT/layout_<name>.log
  local name=$1 ranks=$2
  shift 2
  local launch=()
  [ "$ranks" -gt 1 ] && launch=(mpirun -np "$ranks" -x NCCL_NVLS_ENABLE -x OMPI_ALLOW_RUN_AS_ROOT
                                -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM --bind-to none)
  local t0=$(date +%s)
  echo "== $name ($ranks GPUs): $*" >"$OUT/layout_$name.log"
  timeout -k 10 "$RUN_TIMEOUT" "${launch[@]}" "$BIN" "${MODEL[@]}" "$@" >>"$OUT/layout_$name.log" 2>&1
  local rc=$?
  echo "$name: rc $rc, $(( $(date +%s) - t0 )) s"
  [ $rc -eq 0 ] && return
  failed+=("$name (exit status $rc)")
  grep -iE "error|watchdog|timed out|out of memory" "$OUT/layout_$name.log" | head -3
}
compare() {  # compare <reference> <name>
  local row
  row=$(python3 scripts/gpu/compare_losses.py "$OUT/layout_$1.log" "$OUT/layout_$2.log" "$2 vs $1" --max-rel "$LOSS_TOL")
  [ $? -eq 0 ] || failed+=("$2 (losses)")
  rows+=("$row")
}

if [[ $GROUPS_RUN == *" dense "* ]]; then
  run one_gpu 1
  run dp${GPUS}_distopt "$GPUS" "${DISTOPT[@]}"
  run tp${GPUS}_sp "$GPUS" --tensor-model-parallel-size "$GPUS" --sequence-parallel
  run tp${GPUS}_sp_overlap "$GPUS" --tensor-model-parallel-size "$GPUS" --sequence-parallel --tp-comm-overlap
  interleave=(); [ $(( 8 / GPUS )) -ge 2 ] && interleave=(--num-layers-per-virtual-pipeline-stage 1)  # PP=8: 1F1B
  run pp${GPUS} "$GPUS" --pipeline-model-parallel-size "$GPUS" "${interleave[@]}"
  run cp${GPUS}_p2p "$GPUS" --context-parallel-size "$GPUS" --cp-comm-type p2p
  run cp${GPUS}_a2a "$GPUS" --context-parallel-size "$GPUS" --cp-comm-type a2a
  if [ "$GPUS" -ge 4 ]; then
    run tp2_pp2_dp$(( GPUS / 4 )) "$GPUS" --tensor-model-parallel-size 2 --sequence-parallel \
      --pipeline-model-parallel-size 2 "${DISTOPT[@]}"
    run tp2_cp$HALF "$GPUS" --tensor-model-parallel-size 2 --sequence-parallel --context-parallel-size "$HALF"
fi
for name in dp${GPUS}_distopt tp${GPUS}_sp tp${GPUS}_sp_overlap pp${GPUS} cp${GPUS}_p2p cp${GPUS}_a2a \
            tp2_pp2_dp$(( GPUS / 4 )) tp2_cp$HALF; do
  [ -f "$OUT/layout_$name.log" ] && compare one_gpu "$name"
done
run qk_norm_one_gpu 1 --qk-layernorm  # Qwen3's per-head q/k norms, their gradients summed over TP
run qk_norm_tp${GPUS}_sp "$GPUS" --qk-layernorm --tensor-model-parallel-size "$GPUS" --sequence-parallel
compare qk_norm_one_gpu qk_norm_tp${GPUS}_sp
fi

if [[ $GROUPS_RUN == *" moe "* ]]; then
  run moe_one_gpu 1 "${MOE[@]}"
  run moe_ep$GPUS "$GPUS" "${MOE[@]}" --expert-model-parallel-size "$GPUS" "${DISTOPT[@]}"
  run moe_ep${HALF}_tp2_etp1 "$GPUS" "${MOE[@]}" --expert-model-parallel-size "$HALF" --tensor-model-parallel-size 2 \
    --sequence-parallel --expert-tensor-parallel-size 1
  compare moe_one_gpu moe_ep$GPUS
  compare moe_one_gpu moe_ep${HALF}_tp2_etp1
  # Qwen2-MoE's gated shared expert (the gate's one-column GEMM).
  SHARED=(--moe-shared-expert-intermediate-size 1024 --moe-shared-expert-gate)
  run moe_shared_gate_one_gpu 1 "${MOE[@]}" "${SHARED[@]}"
  run moe_shared_gate_ep$GPUS "$GPUS" "${MOE[@]}" "${SHARED[@]}" --expert-model-parallel-size "$GPUS"
  compare moe_shared_gate_one_gpu moe_shared_gate_ep$GPUS
  # Sinkhorn routing (balanced on the device by one cooperative launch per router call) instead of the aux loss.
  SINKHORN=(--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 1408 --moe-grouped-gemm
            --moe-token-dispatcher-type alltoall --moe-router-load-balancing-type sinkhorn)
  run moe_sinkhorn_one_gpu 1 "${SINKHORN[@]}"
  run moe_sinkhorn_ep$GPUS "$GPUS" "${SINKHORN[@]}" --expert-model-parallel-size "$GPUS"
  compare moe_sinkhorn_one_gpu moe_sinkhorn_ep$GPUS
fi

if [[ $GROUPS_RUN == *" fp8 "* ]]; then
  run fp8_one_gpu 1 "${FP8[@]}" --use-distributed-optimizer
  run fp8_dp${GPUS}_param_gather "$GPUS" "${FP8[@]}" "${DISTOPT[@]}" --fp8-param-gather
  run fp8_tp${GPUS}_sp "$GPUS" "${FP8[@]}" --tensor-model-parallel-size "$GPUS" --sequence-parallel
  compare fp8_one_gpu fp8_dp${GPUS}_param_gather
  compare fp8_one_gpu fp8_tp${GPUS}_sp
fi

echo
echo "================ layouts_check: losses against one GPU over $ITERS iterations ($GPUS GPUs, bf16) ================"
printf '%s\n' "${rows[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
