#!/usr/bin/env bash
# On the GPU machine, one call: build what the MoE measurements need, run the token-dispatch GPU suite, the
# MoE op benchmarks (grouped expert GEMMs against dense GEMMs of the same FLOPs, permute bandwidth), our
# Mixtral-style model with the single cuBLAS grouped launch (--moe-expert-gemm grouped; bench_models.sh --only
# moe runs the per-expert default) and the PyTorch peer (torch._grouped_mm experts). Logs under $OUT.
#   scripts/gpu/moe_bench.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
T0=$(date +%s)
since() { echo "$1 at $(( $(date +%s) - T0 )) s"; }
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCUDNN_FRONTEND_ROOT="$PWD/.deps/cudnn_frontend" >"$OUT/configure.log" 2>&1 &&
  cmake --build build-gpu -j "$(nproc)" --target test_ops_moe_permute bench_ops pretrain_gpt >"$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$OUT/build.log" | head; exit 1; }
since build
(cd build-gpu && timeout 60 ctest -L gpu -R moe_permute --timeout 55) 2>&1 | grep -E "Test +#|tests passed"
timeout "${BENCH_SECONDS:-110}" build-gpu/bench/bench_ops --only moe --markdown "$OUT/moe.md" >"$OUT/bench.log" 2>&1
grep -hE "^\||grouped_gemm" "$OUT/bench.log" "$OUT/moe.md" 2>/dev/null | cut -c1-200 | head -50
since bench
source scripts/gpu/moe_model.sh
timeout 80 build-gpu/tools/pretrain_gpt "${MOE[@]}" --moe-expert-gemm grouped >"$OUT/ours_grouped.log" 2>&1
grep -E "iteration +[3-6]/" "$OUT/ours_grouped.log" | grep -o "per iteration (ms): [0-9.]*.*tokens per second per GPU: [0-9]*"
grep -iE "error|peak alloc" "$OUT/ours_grouped.log" | head -3
since ours
timeout 150 python3 bench/reference/bench_reference.py --model mixtral-8x-0.9b --micro-batch-size 2 \
  --global-batch-size 16 --iters 5 --warmup 2 --moe-impl grouped --num-layers "$MOE_LAYERS" >"$OUT/peer.log" 2>&1
grep RESULT "$OUT/peer.log" | cut -c1-400
since total
