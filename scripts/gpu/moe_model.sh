# Sourced by the MoE GPU scripts: MOE, the Mixtral-style model they measure (MOE_LAYERS layers, h 2048, GQA
# 16/8, 8 experts top-2 with expert ffn 5632, seq 4096, mbs 2, gbs 16, 6 iterations on mock data, bf16 with the
# alltoall dispatcher and the aux loss). MOE_LAYERS defaults to 16 on a GPU of 100 GiB or more and to 10 below
# (an 80 GB H100: each layer's experts take ~5 GiB of parameters, gradients and Adam state).
gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
MOE_LAYERS=${MOE_LAYERS:-$([ "${gpu_mib:-0}" -lt 102400 ] 2>/dev/null && echo 10 || echo 16)}
MOE=(--num-layers "$MOE_LAYERS" --hidden-size 2048 --num-attention-heads 16 --group-query-attention --num-query-groups 8
     --ffn-hidden-size 5632 --seq-length 4096 --max-position-embeddings 4096 --vocab-size 32000
     --position-embedding-type rope --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights
     --disable-bias-linear --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 5632 --moe-grouped-gemm
     --moe-token-dispatcher-type alltoall --moe-aux-loss-coeff 1e-2 --moe-router-load-balancing-type aux_loss
     --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --weight-decay 0.1 --adam-beta2 0.95 --bf16
     --mock-data --hidden-dropout 0 --attention-dropout 0 --log-interval 1 --eval-interval 100000 --eval-iters 0
     --device cuda --micro-batch-size 2 --global-batch-size 16 --train-iters 6)
