#!/usr/bin/env bash
# On the GPU machine, one call: the MoE router's GPU suites (top-k routing and Sinkhorn balancing, each against the
# CPU's bits) and Sinkhorn's speed: bench_ops --only router (one cooperative launch iterating on the device) beside Megatron's
# loop in PyTorch on the same shapes (bench/reference/sinkhorn_peer.py). Logs under $OUT; a table last.
#   scripts/gpu/router_bench.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
T0=$(date +%s)
since() { echo "-- $1 at $(( $(date +%s) - T0 )) s"; }
BUILD_TARGETS="test_ops_router_sinkhorn test_ops_router bench_ops" scripts/gpu/fp8_bench.sh build || exit 1
since build
for t in test_ops_router_sinkhorn test_ops_router; do
  timeout 120 build-gpu/tests/$t --gtest_filter='*Gpu*' >"$OUT/$t.log" 2>&1
  echo "$t (GPU cases): $(grep -E "^\[  (PASSED|FAILED) " "$OUT/$t.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure|error:" "$OUT/$t.log" | head -8
done
since tests
timeout 120 build-gpu/bench/bench_ops --only router >"$OUT/bench_router.log" 2>&1 || tail -3 "$OUT/bench_router.log"
timeout 120 python3 bench/reference/sinkhorn_peer.py >"$OUT/sinkhorn_peer.log" 2>&1 || tail -3 "$OUT/sinkhorn_peer.log"
since bench
echo "== Sinkhorn balancing: ours (one launch on the device) and Megatron's loop in PyTorch"
grep -E "^device|^\| (family|router)" "$OUT/bench_router.log"
grep -E "^\|" "$OUT/sinkhorn_peer.log"
