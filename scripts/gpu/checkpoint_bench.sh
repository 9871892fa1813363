#!/usr/bin/env bash
# On the GPU machine (device tool), after a build into build-gpu/ (scripts/gpu/run.sh --tests-only, or the
# targets below): checkpoint figures for bench/RESULTS.md and the GPU acceptance checks of issue 7.
#   1. save and load GB/s: a GPT-2 124M-shaped bf16 model (weights + fp32 masters + Adam moments, ~1.7 GB),
#      synchronous --save every 10 iterations, then --load;
#   2. --async-save: the same run; the training thread's stall at a save step (snapshot to pinned memory)
#      against the step time, and the background write time;
#   1b. generate from the saved checkpoint on CUDA (the cached-attention kernel, tokens/s);
#   3. bit-exact resume on GPU: 20 iterations straight vs 10 + --load + 10 (log lines of 11..20 compared,
#      hidden dropout 0.1 so the RNG state matters).
# The HF parity tests run separately: MEGATRON_HF_PARITY=1 build-gpu/tests/test_checkpoint_hf_parity.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
CK=${CK:-/tmp/megatron_ckpt_bench}
rm -rf "$CK"
P=build-gpu/tools/pretrain_gpt
MODEL="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024
  --micro-batch-size 8 --global-batch-size 8 --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine --lr-warmup-iters 2
  --bf16 --mock-data --vocab-size 50257 --attention-dropout 0 --log-interval 1 --eval-interval 1000 --eval-iters 1
  --device cuda"
step_ms() { grep -o "iteration *$2/.*elapsed time per iteration (ms): [0-9.]*" "$1" | grep -o "[0-9.]*$"; }

echo "== 1. synchronous save / load"
$P $MODEL --train-iters 30 --hidden-dropout 0 --save "$CK/sync" --save-interval 10 > "$OUT/ckpt_sync.log" 2>&1
grep -E "saved checkpoint|error" "$OUT/ckpt_sync.log"
du -sh "$CK/sync/iter_0000010"
$P $MODEL --train-iters 31 --hidden-dropout 0 --load "$CK/sync" > "$OUT/ckpt_load.log" 2>&1
grep -E "loaded checkpoint|error" "$OUT/ckpt_load.log"

echo "== 1b. generate on CUDA from that checkpoint (KV cache, bf16; ids: no tokenizer on this machine)"
build-gpu/tools/generate --load "$CK/sync" --prompt-ids "464 3290 318 257" --max-new-tokens 64 --greedy \
  --device cuda 2>&1 | tail -3

echo "== 2. asynchronous save"
$P $MODEL --train-iters 30 --hidden-dropout 0 --save "$CK/async" --save-interval 10 --async-save > "$OUT/ckpt_async.log" 2>&1
grep -E "snapshot|asynchronous save|error" "$OUT/ckpt_async.log"
echo "step times (ms) around the save at iteration 20 (sync run | async run): the save itself happens after"
echo "iteration 20's timing; the stall is the snapshot time above, the rest shows in iterations 21-23"
for it in 19 20 21 22 23; do
  echo "  iteration $it: $(step_ms "$OUT/ckpt_sync.log" $it) | $(step_ms "$OUT/ckpt_async.log" $it)"
done

echo "== 3. bit-exact resume on GPU (hidden dropout 0.1)"
$P $MODEL --train-iters 20 --hidden-dropout 0.1 > "$OUT/resume_full.log" 2>&1
$P $MODEL --train-iters 20 --hidden-dropout 0.1 --save "$CK/resume" --exit-interval 10 > "$OUT/resume_first.log" 2>&1
$P $MODEL --train-iters 20 --hidden-dropout 0.1 --load "$CK/resume" > "$OUT/resume_second.log" 2>&1
# "N lm loss: X grad norm: Y" per iteration.
pick() { grep -E "iteration +[0-9]+/" "$1" | sed -E 's/.*iteration +([0-9]+)\/.*(lm loss: [^|]*).*(grad norm: [^|]*).*/\1 \2 \3/'; }
pick "$OUT/resume_full.log" | awk '$1 > 10' > "$OUT/resume_a.txt"
pick "$OUT/resume_second.log" > "$OUT/resume_b.txt"
if [ "$(wc -l < "$OUT/resume_b.txt")" -eq 10 ] && diff "$OUT/resume_a.txt" "$OUT/resume_b.txt" >/dev/null; then
  echo "resume: iterations 11..20 identical (loss and grad norm of 10 log lines)"
else
  echo "resume: MISMATCH"; diff "$OUT/resume_a.txt" "$OUT/resume_b.txt" | head -20
fi
rm -rf "$CK"
