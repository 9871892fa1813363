#!/usr/bin/env python3
"""What a tensor-parallel ring step costs on this machine's GPUs, measured with PyTorch's NCCL (the same library
our Communicator calls), so the overlap's budget is known before blaming the schedule: for each transfer size,
the all-gather and reduce-scatter collectives, one ring step as a batched send/recv to the next rank, a GEMM of
the chunk's rows alone, and the GEMM while each transfer runs on a side stream (the pair's time against the longer of the two alone
and their sum; "hidden" is the share of the shorter one that the overlap hid).

    torchrun --nproc-per-node 2 scripts/gpu/tp_comm_probe.py [--rows 2048] [--hidden 4096]
    python3 scripts/gpu/tp_comm_probe.py --copy-engine      (the same transfers by the copy engines)

Shapes default to the Llama-3-8B linears at seq 4096, TP=2: each rank's chunk is rows x hidden bf16 (16 MiB),
the GEMMs are qkv (N 3072), proj (K 2048), fc1 (N 14336) and fc2 (K 7168) on one chunk's rows. Times are
medians over --reps repetitions (CUDA events, after warm-up), printed by rank 0."""
import argparse
import os
import statistics

import torch
import torch.distributed as dist


def timed(fn, reps, stream=None):
    """Median milliseconds of fn() over reps runs, each between two events on the current stream."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_engine_probe(args):
    """One process driving both GPUs: each GPU's chunk copied to the other by the copy engines (a peer
    cudaMemcpyAsync, no kernel), alone and while both GPUs run the chunk GEMMs."""
    import time
    devs = [torch.device("cuda", i) for i in range(2)]
    r, h = args.rows, args.hidden
    chunks = [torch.randn(r, h, device=d, dtype=torch.bfloat16) for d in devs]
    landed = [torch.empty(r, h, device=d, dtype=torch.bfloat16) for d in devs]
    sides = [torch.cuda.Stream(device=d) for d in devs]
    mains = [torch.cuda.Stream(device=d) for d in devs]

    def sync():
        for d in devs:
            torch.cuda.synchronize(d)

    def timed_host(fn):
        for _ in range(3):
            fn()
        sync()
        times = []
        for _ in range(args.reps):
            sync()
            t = time.perf_counter()
            fn()
            sync()
            times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)

    def copies():
        for i in range(2):
            with torch.cuda.device(devs[i]), torch.cuda.stream(sides[i]):
                landed[1 - i].copy_(chunks[i], non_blocking=True)

    t_copy = timed_host(copies)
    print(f"copy engines: both GPUs' {r} x {h} bf16 chunks to the other GPU: {t_copy:.4f} ms "
          f"({chunks[0].numel() * 2 / t_copy / 1e6:.0f} GB/s each way; host-timed, launch included)")
    print("| GEMM on one chunk (both GPUs) | alone ms | with the peer copies ms | serial sum | hidden |")
    print("|---|---|---|---|---|")
    for name, (k, n) in {"qkv": (h, 3072), "proj": (2048, h), "fc1": (h, 14336), "fc2": (7168, h)}.items():
        a = [torch.randn(r, k, device=d, dtype=torch.bfloat16) for d in devs]
        w = [torch.randn(n, k, device=d, dtype=torch.bfloat16) for d in devs]

        def gemms():
            for i in range(2):
                with torch.cuda.device(devs[i]), torch.cuda.stream(mains[i]):
                    torch.matmul(a[i], w[i].t())

        def both():
            copies()
            gemms()

        t_gemm, t_both = timed_host(gemms), timed_host(both)
        serial = t_gemm + t_copy
        hidden = (serial - t_both) / max(serial - max(t_gemm, t_copy), 1e-9)
        print(f"| {name} | {t_gemm:.4f} | {t_both:.4f} | {serial:.4f} | {100 * hidden:.0f}% |")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--sm-carveout", type=int, default=0,
                        help="leave this many SMs out of the GEMMs (cuBLASLt's SM count target, through PyTorch's "
                             "_set_sm_carveout_experimental) so the transfer's kernels find free SMs")
    parser.add_argument("--copy-engine", action="store_true",
                        help="one process, two GPUs: the peer copies by the copy engines instead of NCCL")
    args = parser.parse_args()
    if args.sm_carveout:
        torch.backends.cuda.preferred_blas_library("cublaslt")  # the carve-out is a cuBLASLt attribute
        torch._C._set_sm_carveout_experimental(args.sm_carveout)
    if args.copy_engine:
        copy_engine_probe(args)
        return
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda")
    r, h = args.rows, args.hidden
    chunk = torch.randn(r, h, device=dev, dtype=torch.bfloat16)
    gathered = torch.empty(world * r, h, device=dev, dtype=torch.bfloat16)
    incoming = torch.empty_like(chunk)
    side = torch.cuda.Stream()
    nxt, prv = (rank + 1) % world, (rank - 1) % world

    def ring_step():
        ops = [dist.P2POp(dist.isend, chunk, nxt), dist.P2POp(dist.irecv, incoming, prv)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()

    rows = []
    bytes_moved = chunk.numel() * chunk.element_size()
    t_ag = timed(lambda: dist.all_gather_into_tensor(gathered, chunk), args.reps)
    t_rs = timed(lambda: dist.reduce_scatter_tensor(incoming, gathered), args.reps)
    t_p2p = timed(ring_step, args.reps)
    rows.append(("all-gather (collective)", t_ag, bytes_moved * (world - 1) / t_ag / 1e6))
    rows.append(("reduce-scatter (collective)", t_rs, bytes_moved * (world - 1) / t_rs / 1e6))
    rows.append(("ring step (send + recv)", t_p2p, bytes_moved / t_p2p / 1e6))

    gemms = {"qkv": (h, 3072), "proj": (2048, h), "fc1": (h, 14336), "fc2": (7168, h)}
    gemm_rows = []
    for name, (k, n) in gemms.items():
        a = torch.randn(r, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        t_gemm = timed(lambda: torch.matmul(a, w.t()), args.reps)

        def overlapped(transfer):
            def run():
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    transfer()
                torch.matmul(a, w.t())
                torch.cuda.current_stream().wait_stream(side)
            return run

        tflops = 2 * r * k * n / t_gemm / 1e9
        for label, transfer, t_transfer in (
                ("ring step", ring_step, t_p2p),
                ("all-gather", lambda: dist.all_gather_into_tensor(gathered, chunk), t_ag),
                ("reduce-scatter", lambda: dist.reduce_scatter_tensor(incoming, gathered), t_rs)):
            t_both = timed(overlapped(transfer), args.reps)
            gemm_rows.append((name, r, n, k, t_gemm, tflops, label, t_both, max(t_gemm, t_transfer),
                              t_gemm + t_transfer))

    if rank == 0:
        print(f"SM carve-out {args.sm_carveout}, world {world}, chunk {r} x {h} bf16 = {bytes_moved / 2**20:.1f} MiB, "
              f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, torch {torch.__version__}")
        print("| transfer | ms | GB/s per rank (bytes received) |")
        print("|---|---|---|")
        for name, t, bw in rows:
            print(f"| {name} | {t:.4f} | {bw:.0f} |")
        print("| GEMM on one chunk | M x N x K | alone ms | TFLOP/s | transfer on a side stream | both ms | "
              "ideal max(gemm, transfer) | serial sum | hidden |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, m, n, k, t, tf, label, both, ideal, serial in gemm_rows:
            hidden = (serial - both) / max(serial - ideal, 1e-9)
            print(f"| {name} | {m}x{n}x{k} | {t:.4f} | {tf:.0f} | {label} | {both:.4f} | {ideal:.4f} | {serial:.4f} "
                  f"| {100 * hidden:.0f}% |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
