#!/usr/bin/env bash
# On the GPU machine: the FP8 measurements, in stages (several per call, in order):
#   build    configure and build what they need (test_ops_fp8, test_nn_fp8_linear, bench_ops, pretrain_gpt; or
#            BUILD_TARGETS)
#   build-old  pretrain_gpt from OLD_TREE (an unpacked `git archive` of an earlier commit) into build-old, for a
#            before/after in one call: then `PRETRAIN=build-old/tools/pretrain_gpt RUN_TAG=old` runs the stages
#            below with that binary (their logs named *_old)
#   ops      the FP8 and gemm op suites on the GPU (against the CPU) and the cast-transpose bandwidth
#   llama    the Llama-style 0.89B (seq 2048, mbs 4, gbs 32): RECIPES of bf16 and the FP8 recipes (hybrid
#            format) delayed, tensorwise, blockwise (all four by default)
#   llama8b  Llama-3-8B-shaped layers (h 4096, GQA 32/8, ffn 14336, vocab 128256, seq 4096, LAYERS8B layers,
#            mbs 1, gbs 8): RECIPES as for llama
#   peer8b   the PyTorch peer on the same shapes: bf16 autocast and torch._scaled_mm tensorwise FP8
#   converge the Llama-style 0.89B on real text (.deps/docs from scripts/gpu/prepare_text_corpus.sh; seq 2048,
#            gbs 8, CONVERGE_ITERS iterations, the same seed): CONVERGE_RUNS of bf16, delayed, tensorwise,
#            blockwise (all four by default); prints each
#            run's mean loss over the last 50 iterations (bench/plot_fp8_convergence.py plots the logs)
# Logs under $OUT; the tokens/s, TFLOP/s and peak memory lines are printed.
#   scripts/gpu/fp8_bench.sh build ops llama
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
T0=$(date +%s)
since() { echo "-- $1 at $(( $(date +%s) - T0 )) s"; }
LAYERS8B=${LAYERS8B:-8}
COMMON=(--lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --weight-decay 0.1 --adam-beta2 0.95 --bf16
        --mock-data --hidden-dropout 0 --attention-dropout 0 --log-interval 1 --eval-interval 100000 --eval-iters 0
        --device cuda --use-distributed-optimizer)
LLAMA=(--num-layers 16 --hidden-size 2048 --num-attention-heads 16 --group-query-attention --num-query-groups 8
       --ffn-hidden-size 5632 --seq-length 2048 --max-position-embeddings 2048 --vocab-size 32000
       --position-embedding-type rope --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights
       --disable-bias-linear --micro-batch-size 4 --global-batch-size 32 --train-iters 6)
LLAMA8B=(--num-layers "$LAYERS8B" --hidden-size 4096 --num-attention-heads 32 --group-query-attention
         --num-query-groups 8 --ffn-hidden-size 14336 --seq-length 4096 --max-position-embeddings 4096
         --vocab-size 128256 --rotary-base 500000 --position-embedding-type rope --swiglu --normalization RMSNorm
         --untie-embeddings-and-output-weights --disable-bias-linear --micro-batch-size 1 --global-batch-size 8
         --train-iters 6)
CONVERGE_ITERS=${CONVERGE_ITERS:-500}
CONVERGE=(--num-layers 16 --hidden-size 2048 --num-attention-heads 16 --group-query-attention --num-query-groups 8
          --ffn-hidden-size 5632 --seq-length 2048 --max-position-embeddings 2048 --position-embedding-type rope
          --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear
          --micro-batch-size 4 --global-batch-size 8 --train-iters "$CONVERGE_ITERS" --lr 3e-4 --min-lr 3e-5
          --lr-decay-style cosine --lr-warmup-iters 50 --weight-decay 0.1 --adam-beta2 0.95 --clip-grad 1.0 --bf16
          --hidden-dropout 0 --attention-dropout 0 --seed 1234 --log-interval 1 --eval-interval 100 --eval-iters 4
          --data-path .deps/docs/docs_text_document --split 98,1,1 --data-cache-path "$OUT/data-cache"
          --tokenizer-type GPT2BPETokenizer --vocab-file .deps/docs/vocab.json --merge-file .deps/docs/merges.txt
          --device cuda --use-distributed-optimizer)
# A convergence run: the log, its wall time, and the mean lm loss of its last 50 iterations.
converge() {
  local name=$1; shift
  local t0=$(date +%s)
  timeout 240 build-gpu/tools/pretrain_gpt "$@" >"$OUT/$name.log" 2>&1
  echo "$name: $(( $(date +%s) - t0 )) s, $(grep -c "lm loss:" "$OUT/$name.log") iterations logged, mean lm loss of" \
    "the last 50: $(grep "lm loss:" "$OUT/$name.log" | tail -50 | grep -o "lm loss: [0-9.E+-]*" |
      awk '{s+=$3; n++} END {if (n) printf "%.5f", s/n}'), tokens/s at the end: $(grep "lm loss:" "$OUT/$name.log" |
      tail -1 | grep -o "tokens per second per GPU: [0-9]*" | grep -o "[0-9]*$")"
  grep -iE "error|out of memory" "$OUT/$name.log" | head -3
}
# Our run: the mean of iterations 3..6 and the peak memory line.
ours() {
  local name=$1; shift
  name=$name${RUN_TAG:+_$RUN_TAG}
  timeout 150 "${PRETRAIN:-build-gpu/tools/pretrain_gpt}" "$@" >"$OUT/$name.log" 2>&1
  echo "$name: $(grep -E "iteration +[3-6]/" "$OUT/$name.log" | grep -o "per iteration (ms): [0-9.]*" |
    awk '{s+=$4; n++} END {if (n) printf "%.1f ms/iter", s/n}') | $(grep -E "iteration +6/" "$OUT/$name.log" |
    grep -o "TFLOP/s/GPU): [0-9.]*\|tokens per second per GPU: [0-9]*" | tr '\n' ' ')"
  grep -iE "error|peak|out of memory" "$OUT/$name.log" | head -3
}
for stage in "$@"; do
  case $stage in
    build)
      TOKENIZER_ARGS=()  # the carried PCRE2 and protobuf (scripts/gpu/prepare.sh), as scripts/gpu/run.sh
      [ -f .deps/pcre2/include/pcre2.h ] && TOKENIZER_ARGS=(-DPCRE2_ROOT="$PWD/.deps/pcre2" -DMEGATRON_TOKENIZERS=ON)
      [ -x .deps/protobuf/bin/protoc ] && TOKENIZER_ARGS+=(-DProtobuf_ROOT="$PWD/.deps/protobuf")
      [ -d .deps/cupti ] && TOKENIZER_ARGS+=(-DCUPTI_ROOT="$PWD/.deps/cupti")
      cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DCUDNN_FRONTEND_ROOT="$PWD/.deps/cudnn_frontend" "${TOKENIZER_ARGS[@]}" >"$OUT/configure.log" 2>&1 &&
        cmake --build build-gpu -j "$(nproc)" --target ${BUILD_TARGETS:-test_ops_fp8 test_ops_fp8_block test_ops_gemm test_nn_fp8_linear bench_ops pretrain_gpt} \
          >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head; exit 1; } ;;
    build-old)
      [ -n "${OLD_TREE:-}" ] || { echo "build-old: set OLD_TREE to an unpacked git archive" >&2; exit 2; }
      [ -e "$OLD_TREE/.deps" ] || ln -s "$PWD/.deps" "$OLD_TREE/.deps"  # the carried dependencies
      cmake -S "$OLD_TREE" -B build-old -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DCUDNN_FRONTEND_ROOT="$PWD/.deps/cudnn_frontend" >"$OUT/configure-old.log" 2>&1 &&
        cmake --build build-old -j "$(nproc)" --target pretrain_gpt >"$OUT/build-old.log" 2>&1 ||
        { grep -E "error|FAILED" "$OUT/build-old.log" | head; exit 1; } ;;
    ops)
      (cd build-gpu && timeout 200 ctest -R "fp8|gemm" -LE mpi --timeout 180) 2>&1 | grep -E "Test +#|tests passed|Failed"
      timeout 240 build-gpu/bench/bench_ops --only fp8,gemm >"$OUT/bench_fp8.log" 2>&1
      grep -E "fp8|GB/s" "$OUT/bench_fp8.log" | cut -c1-160 | head -30 ;;
    llama | llama8b)
      shape=LLAMA; [ "$stage" = llama8b ] && shape=LLAMA8B
      declare -n args=$shape
      for run in ${RECIPES:-bf16 delayed tensorwise blockwise}; do
        if [ "$run" = bf16 ]; then ours "${stage}_bf16" "${args[@]}" "${COMMON[@]}"
        else ours "${stage}_fp8_$run" "${args[@]}" "${COMMON[@]}" --fp8-format hybrid --fp8-recipe "$run"; fi
      done
      unset -n args ;;
    peer8b)
      for mode in none tensorwise; do
        timeout 200 python3 bench/reference/bench_reference.py --model llama3-8b-layers --num-layers "$LAYERS8B" \
          --micro-batch-size 1 --global-batch-size 8 --iters 4 --warmup 2 --fp8 $mode >"$OUT/peer8b_$mode.log" 2>&1
        echo "peer $mode: $(grep RESULT "$OUT/peer8b_$mode.log" | cut -c1-400)"
        grep -iE "error|out of memory" "$OUT/peer8b_$mode.log" | tail -2
      done ;;
    converge)
      for run in ${CONVERGE_RUNS:-bf16 delayed tensorwise blockwise}; do
        if [ "$run" = bf16 ]; then converge converge_bf16 "${CONVERGE[@]}"
        else converge "converge_fp8_$run" "${CONVERGE[@]}" --fp8-format hybrid --fp8-recipe "$run"; fi
      done ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
  since "$stage"
done
