r"""The PyTorch peer for benchmarks: the reference GPT (gpt_model.py) trained the way a strong PyTorch user
would: torch.compile, SDPA (flash) attention, bf16 autocast over fp32 parameters, fused AdamW, gradient
accumulation to the global batch, global-norm clipping; random tokens (mock data).

    python3 bench/reference/bench_reference.py --model gpt2-124m --micro-batch-size 64 --global-batch-size 512
    python3 bench/reference/bench_reference.py --model llama-0.89b --micro-batch-size 8 --global-batch-size 32
    python3 bench/reference/bench_reference.py --model mixtral-8x-0.9b --micro-batch-size 2 --global-batch-size 16
    python3 bench/reference/bench_reference.py --model llama3-8b-layers --micro-batch-size 1 --global-batch-size 8 \
        --fp8 tensorwise

--fp8 none|tensorwise (default none): with tensorwise, the four linears of every transformer layer (QKV,
attention output projection, MLP fc1 and fc2) run their forward GEMM and both backward GEMMs (dgrad, wgrad) in
FP8 through torch._scaled_mm with dynamic tensorwise scaling, the recipe torchao's float8 training uses by
default (Float8LinearConfig(), recipe "tensorwise"): per-tensor amax scales computed every step inside the
compiled graph, float8_e4m3fn for the input and the weight, float8_e5m2 for the output gradient, saturating
casts, fast accumulation in the forward GEMM only, bf16 outputs (bench/reference/fp8_linear.py). The embedding,
the output layer (logits), the MoE router and the MoE experts stay in bf16. The RESULT json names the mode
("fp8"); MFU stays against the bf16 dense peak (989 TFLOP/s) whatever the mode. bench/reference/
check_fp8_linear.py checks the FP8 linear against an fp32 emulation and the bf16 linear.

llama3-8b-layers is Llama-3-8B's layer shape (hidden 4096, 32 heads in 8 query groups, SwiGLU FFN 14336,
RMSNorm, RoPE base 500000, no linear biases, untied embeddings, vocabulary 128256, seq 4096) with 8 layers by
default (--num-layers N for more or fewer): 2.80B parameters at 8 layers, 1.05B of them the two embeddings.

--device cpu runs the same code on the CPU (bf16 CPU autocast, AdamW not fused; use --no-compile and a small
--num-layers / --seq-length) for quick functional checks; timings and memory there mean nothing.

MoE models run their experts with --moe-impl loop (a GEMM pair per expert, outside the compiled graph: its
slice sizes are data), grouped (torch._grouped_mm, compiled with the rest) or auto (the default: both are timed
on a few micro-batches after compiling, the faster one is kept). The RESULT json names the one used, whether
the MoE experts are inside the compiled graph, and the probe timings.

Prints one line starting with "RESULT" (json): tokens/s, ms/iteration, TFLOP/s (Megatron's formula), MFU
against 989 TFLOP/s, peak allocated GiB.

mixtral-8x-0.9b is the Llama-style 0.89B with every MLP replaced by 8 SwiGLU experts of 5632 (top-2, aux loss
1e-2) at seq 4096: 4.76B parameters, so fp32 parameters, gradients and AdamW's two moments alone take 71 GiB
(16 B a parameter), before activations: it needs a GPU with more than 80 GB (an H200). Measured on an H200
(torch 2.11, gbs 16): mbs 2 peaks at 96.5 GiB allocated, mbs 1 at 89.2 GiB; grouped beat the loop in the probe
(194 vs 253-303 ms per micro-batch forward+backward at mbs 2).
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_model import GPT, Config, has_grouped_mm, megatron_flops_per_iteration, no_weight_decay  # noqa: E402

MODELS = {
    # GPT-2 124M: vocab 50257 padded to 50304 (Megatron pads to a multiple of 128).
    "gpt2-124m": dict(num_layers=12, hidden_size=768, num_attention_heads=12, num_query_groups=12,
                      ffn_hidden_size=3072, seq_length=1024, max_position_embeddings=1024, padded_vocab_size=50304,
                      vocab_size=50257),
    # Llama-style 0.89B: vocab 32000 (a multiple of 128 already).
    "llama-0.89b": dict(num_layers=16, hidden_size=2048, num_attention_heads=16, num_query_groups=8,
                        ffn_hidden_size=5632, seq_length=2048, max_position_embeddings=2048,
                        padded_vocab_size=32000, vocab_size=32000, position_embedding_type="rope", swiglu=True,
                        normalization="RMSNorm", untie_embeddings_and_output_weights=True,
                        disable_bias_linear=True),
    # Llama-3-8B's layers (8 of its 32 by default): vocab 128256 (a multiple of 128), RoPE base 500000.
    "llama3-8b-layers": dict(num_layers=8, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
                             ffn_hidden_size=14336, seq_length=4096, max_position_embeddings=4096,
                             padded_vocab_size=128256, vocab_size=128256, position_embedding_type="rope",
                             rotary_base=500000.0, swiglu=True, normalization="RMSNorm",
                             untie_embeddings_and_output_weights=True, disable_bias_linear=True),
    # Mixtral-style MoE on the Llama-style 0.89B: 8 experts of 5632 (SwiGLU), top-2, switch aux loss 1e-2.
    "mixtral-8x-0.9b": dict(num_layers=16, hidden_size=2048, num_attention_heads=16, num_query_groups=8,
                            ffn_hidden_size=5632, seq_length=4096, max_position_embeddings=4096,
                            padded_vocab_size=32000, vocab_size=32000, position_embedding_type="rope", swiglu=True,
                            normalization="RMSNorm", untie_embeddings_and_output_weights=True,
                            disable_bias_linear=True, num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=5632,
                            moe_aux_loss_coeff=1e-2),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--micro-batch-size", type=int, required=True)
    ap.add_argument("--global-batch-size", type=int, required=True)
    ap.add_argument("--iters", type=int, default=10, help="timed iterations (after --warmup)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--seq-length", type=int, default=0, help="override the model's sequence length (long context)")
    ap.add_argument("--num-layers", type=int, default=0, help="override the model's layer count (quick checks)")
    ap.add_argument("--moe-impl", choices=["auto", "loop", "grouped"], default="auto",
                    help="MoE experts: per-expert loop, torch._grouped_mm, or the faster of the two (timed)")
    ap.add_argument("--moe-probe-micro-batches", type=int, default=3,
                    help="--moe-impl auto: timed forward+backward micro-batches per implementation")
    ap.add_argument("--fp8", choices=["none", "tensorwise"], default="none",
                    help="tensorwise: the layers' linears (QKV, proj, fc1, fc2) in FP8 via torch._scaled_mm with "
                         "dynamic tensorwise scales (torchao's float8 training recipe)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: functional checks only (with --no-compile and a small model)")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    spec = dict(MODELS[a.model])
    if a.seq_length:
        spec["seq_length"] = spec["max_position_embeddings"] = a.seq_length
    if a.num_layers:
        spec["num_layers"] = a.num_layers
    vocab = spec.pop("vocab_size")
    c = Config(**spec)
    dev = a.device
    cuda = dev == "cuda"
    model = GPT(c, dtype=torch.float32, device=dev, fp8=a.fp8)
    model.init_like_megatron()
    model.moe_compute_dtype = torch.bfloat16  # the expert GEMMs in bf16, as autocast runs every other GEMM
    named = model.named()
    opt = torch.optim.AdamW([{"params": [p for n, p in named if not no_weight_decay(n, p.shape)], "weight_decay": 0.1},
                             {"params": [p for n, p in named if no_weight_decay(n, p.shape)], "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=cuda)

    def loss_fn(tokens, labels):
        with torch.autocast(dev, dtype=torch.bfloat16):
            return model.loss(tokens, labels)

    step_loss = loss_fn if a.no_compile else torch.compile(loss_fn)
    num_micro = a.global_batch_size // a.micro_batch_size
    gen = torch.Generator(device=dev).manual_seed(0)

    def micro_batch():
        return torch.randint(0, vocab, (a.micro_batch_size, c.seq_length + 1), device=dev, generator=gen)

    moe = {}
    if c.num_experts:
        moe = pick_moe_impl(a, model, step_loss, micro_batch)

    def iteration():
        total = 0.0
        for _ in range(num_micro):
            batch = micro_batch()
            loss = step_loss(batch[:, :-1], batch[:, 1:]) / num_micro
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total

    for _ in range(a.warmup):
        iteration()
    sync(dev)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.iters):
        loss = iteration()
    loss = float(loss)
    sync(dev)
    seconds = (time.perf_counter() - t0) / a.iters
    tokens = a.global_batch_size * c.seq_length
    tflops = megatron_flops_per_iteration(c, a.global_batch_size) / seconds / 1e12
    result = dict(impl="pytorch-compile" if not a.no_compile else "pytorch-eager", model=a.model, seq_length=c.seq_length,
                  micro_batch_size=a.micro_batch_size, global_batch_size=a.global_batch_size,
                  ms_per_iteration=seconds * 1e3, tokens_per_s=tokens / seconds, tflops_per_gpu=tflops,
                  mfu=tflops / 989.0, peak_allocated_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
                  device=torch.cuda.get_device_name() if cuda else "cpu", torch=torch.__version__,
                  parameters=sum(p.numel() for _, p in named), num_layers=c.num_layers, fp8=a.fp8,
                  loss=loss, **moe)
    print("RESULT " + json.dumps(result), flush=True)


def pick_moe_impl(a, model, step_loss, micro_batch):
    """Sets model.moe_impl from --moe-impl; auto times forward+backward of a few micro-batches with each
    implementation (after one untimed micro-batch that compiles it) and keeps the faster. Returns the json
    fields: the implementation, whether the experts are inside the compiled graph (the loop runs them eagerly,
    between graph breaks), and the probe timings (ms per micro-batch)."""
    candidates = ["loop", "grouped"] if a.moe_impl == "auto" else [a.moe_impl]
    if "grouped" in candidates and not has_grouped_mm():
        if a.moe_impl == "grouped":
            raise SystemExit(f"torch {torch.__version__} has no torch._grouped_mm")
        candidates.remove("grouped")
    timings, errors = {}, {}
    if len(candidates) > 1:
        for impl in candidates:
            model.moe_impl = impl
            try:
                step_loss(*split(micro_batch())).backward()  # compiles
                sync(a.device)
                t0 = time.perf_counter()
                for _ in range(a.moe_probe_micro_batches):
                    step_loss(*split(micro_batch())).backward()
                sync(a.device)
                timings[impl] = round((time.perf_counter() - t0) / a.moe_probe_micro_batches * 1e3, 2)
            except Exception as e:  # noqa: BLE001 (a grouped GEMM or compile this torch cannot do: use the other)
                errors[impl] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                print(f"moe-impl {impl} failed in the probe: {errors[impl]}", file=sys.stderr, flush=True)
            model.zero_grad(set_to_none=True)
        # The timed run compiles afresh: after the probe's switch, the recompiled winner measured 9% slower
        # than the same implementation compiled alone (mixtral-8x-0.9b, H200, torch 2.11).
        if not a.no_compile:
            torch._dynamo.reset()
        if a.device == "cuda":
            torch.cuda.empty_cache()
        if not timings:
            raise SystemExit(f"no MoE implementation ran: {errors}")
        chosen = min(timings, key=timings.get)
    else:
        chosen = candidates[0]
    model.moe_impl = chosen
    print(f"moe-impl {chosen} (probe ms per micro-batch fwd+bwd: {timings or 'not probed'})", file=sys.stderr,
          flush=True)
    out = dict(moe_impl=chosen, moe_compiled=(chosen == "grouped" and not a.no_compile),
               moe_impl_probe_ms=timings)
    if errors:
        out["moe_impl_errors"] = errors
    return out


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def split(batch):
    return batch[:, :-1], batch[:, 1:]


if __name__ == "__main__":
    main()
