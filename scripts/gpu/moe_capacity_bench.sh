#!/usr/bin/env bash
# On the GPU machine, one call: the cost of expert capacity (token dropping) on the Mixtral-style model of
# moe_bench.sh (16 layers, 8 experts, top-2, seq 4096, mbs 2, gbs 16): the capacity GPU suite, then the model
# without capacity, with --moe-expert-capacity-factor 1.0 under both drop policies, and -- when OLD_TREE names
# an unpacked source tree of an earlier commit (git archive) -- the same capacity run built from that tree, for
# a before/after figure. Logs under $OUT; prints the mean ms/iter of iterations 3-6 per run.
#   OLD_TREE=old scripts/gpu/moe_capacity_bench.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
T0=$(date +%s)
since() { echo "-- $1 at $(( $(date +%s) - T0 )) s"; }
build() {  # build(source dir, build dir, targets...)
  local src=$1 dir=$2; shift 2
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCUDNN_FRONTEND_ROOT="$PWD/.deps/cudnn_frontend" >"$OUT/configure-$(basename "$dir").log" 2>&1 &&
    cmake --build "$dir" -j "$(nproc)" --target "$@" >"$OUT/build-$(basename "$dir").log" 2>&1 ||
    { grep -E "error|FAILED" "$OUT/build-$(basename "$dir").log" | head; exit 1; }
}
build . build-gpu test_ops_router_capacity pretrain_gpt
if [ -n "${OLD_TREE:-}" ]; then
  [ -e "$OLD_TREE/.deps" ] || ln -s "$PWD/.deps" "$OLD_TREE/.deps"  # the carried dependencies
  build "$OLD_TREE" build-old pretrain_gpt
fi
since build
(cd build-gpu && timeout 60 ctest -R router_capacity --timeout 55) 2>&1 | grep -E "Test +#|tests passed"
source scripts/gpu/moe_model.sh
ours() {  # ours(name, binary, extra flags...)
  local name=$1 bin=$2; shift 2
  timeout 80 "$bin" "${MOE[@]}" --moe-expert-gemm grouped "$@" >"$OUT/$name.log" 2>&1
  echo "$name: $(grep -E "iteration +[3-6]/" "$OUT/$name.log" | grep -o "per iteration (ms): [0-9.]*" |
    awk '{s+=$4; n++} END {if (n) printf "%.1f ms/iter", s/n}') | lm loss at 6: $(grep -E "iteration +6/" \
    "$OUT/$name.log" | grep -o "lm loss: [0-9.E+-]*")"
  grep -iE "error|out of memory" "$OUT/$name.log" | head -2
}
ours no_capacity build-gpu/tools/pretrain_gpt
ours capacity_probs build-gpu/tools/pretrain_gpt --moe-expert-capacity-factor 1.0
ours capacity_position build-gpu/tools/pretrain_gpt --moe-expert-capacity-factor 1.0 --moe-token-drop-policy position
[ -n "${OLD_TREE:-}" ] && ours capacity_probs_host build-old/tools/pretrain_gpt --moe-expert-capacity-factor 1.0
since runs
