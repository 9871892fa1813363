"""The peer of bench_ops' router rows: Megatron-LM's Sinkhorn balancing (moe_utils.sinkhorn, as its router calls it
on the fp32 logits under no_grad) in plain PyTorch, timed on the same shapes and the same kind of logits (uniform
in [-1, 1)). Megatron's loop tests `error > tol` on a device tensor, so every iteration waits for the GPU: that
host round trip is part of what it costs, and is timed here as it runs in training.

    python3 bench/reference/sinkhorn_peer.py [--device cuda]

Prints one markdown row per shape: milliseconds per call (median of 30 after 5 warm-up calls), the iterations to
convergence and the microseconds per iteration.
"""
import argparse
import statistics
import time

import torch


def megatron_sinkhorn(logits, tol=1e-4):
    """Megatron's algorithm: alternate row and column scalings of exp(logits) until d1 moves by <= tol on average."""
    cost = torch.exp(logits)
    rows, cols = cost.shape
    d0 = torch.ones(rows, device=cost.device, dtype=cost.dtype)
    d1 = torch.ones(cols, device=cost.device, dtype=cost.dtype)
    previous = d1
    error = 1e9
    iterations = 0
    while error > tol:
        d0 = (1 / rows) * 1 / (torch.sum(d1 * cost, 1) + 1e-8)
        d1 = (1 / cols) * 1 / (torch.sum(d0.unsqueeze(1) * cost, 0) + 1e-8)
        error = torch.mean(torch.abs(previous - d1))
        previous = d1
        iterations += 1
    return d1 * cost * d0.unsqueeze(1), iterations


def median_ms(fn, device, warmup=5, iters=30):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    shapes = [(4096, 8), (8192, 8), (16384, 8), (8192, 64), (8192, 128)]
    print("| peer | shape | ms | iterations | us per iteration |\n|---|---|---|---|---|")
    with torch.no_grad():
        for tokens, experts in shapes:
            generator = torch.Generator(device="cpu").manual_seed(31 + experts)
            logits = (torch.rand(tokens, experts, generator=generator) * 2 - 1).to(a.device)
            _, iterations = megatron_sinkhorn(logits)
            ms = median_ms(lambda: megatron_sinkhorn(logits), a.device)
            print(f"| PyTorch (Megatron's loop) | [{tokens}, {experts}] | {ms:.4f} | {iterations} | "
                  f"{1000 * ms / iterations:.1f} |")


if __name__ == "__main__":
    main()
