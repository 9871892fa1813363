"""Parity: the PyTorch reference retraces a run of ours from the same weights on the same batches.

    python3 bench/reference/parity.py DIR [--device cuda|cpu]

DIR is what `bench_parity_export` wrote: config.json (model + optimizer settings, dtype), weights.safetensors
(our initial weights), batches.npy (int64 [iterations, global_batch, seq + 1]) and ours.json (our loss, grad
norm and lr of every iteration). The reference follows Megatron's mixed precision, as ours does: parameters in
the run's dtype (bf16 or fp32), fp32 main gradients accumulated over the micro-batches (each micro-batch's
loss divided by their number), the global-norm clip (coefficient clip / (norm + 1e-6) when < 1), AdamW on fp32
master weights with the lr we used at that step and no weight decay on biases and 1-D parameters, masters
rounded back into the parameters. It prints both runs side by side and exits 1 when a loss or grad norm
differs by more than the tolerance (relative): 1e-2 for bf16, 1e-4 for fp32.
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_model import GPT, Config, no_weight_decay  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tolerance", type=float, default=0.0, help="0: 1e-2 for bf16, 1e-4 for fp32")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    meta = json.load(open(os.path.join(a.dir, "config.json")))
    ours = json.load(open(os.path.join(a.dir, "ours.json")))
    batches = torch.from_numpy(np.load(os.path.join(a.dir, "batches.npy")))
    c = Config.from_dict(meta["model"])
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32, "fp32": torch.float32}[meta["dtype"]]
    tol = a.tolerance or (1e-2 if dtype == torch.bfloat16 else 1e-4)
    opt = meta["optimizer"]
    mbs = int(meta["micro_batch_size"])

    model = GPT(c, dtype=dtype, device=a.device)
    model.load(load_file(os.path.join(a.dir, "weights.safetensors")))
    params = model.named()
    masters = [p.detach().float().clone() for _, p in params]
    main_grads = [torch.zeros_like(m) for m in masters]
    for m, g in zip(masters, main_grads):
        m.grad = g
    decay = [m for (n, p), m in zip(params, masters) if not no_weight_decay(n, p.shape)]
    no_decay = [m for (n, p), m in zip(params, masters) if no_weight_decay(n, p.shape)]
    adam = torch.optim.AdamW([{"params": decay, "weight_decay": opt["weight_decay"]},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=1.0, betas=(opt["adam_beta1"], opt["adam_beta2"]), eps=opt["adam_eps"])

    rows, worst = [], 0.0
    for it, step in enumerate(ours["steps"]):
        batch = batches[it].to(a.device)
        num_micro = batch.shape[0] // mbs
        for g in main_grads:
            g.zero_()
        loss_sum = 0.0
        for m in range(num_micro):
            mb = batch[m * mbs:(m + 1) * mbs]
            loss = model.loss(mb[:, :-1], mb[:, 1:])
            (loss / num_micro).backward()
            loss_sum += loss.item()
            for (_, p), g in zip(params, main_grads):
                g += p.grad.float()
                p.grad = None
        loss_ref = loss_sum / num_micro
        norm_ref = math.sqrt(sum(float((g.double() ** 2).sum()) for g in main_grads))
        clip = opt["clip_grad"]
        if clip > 0:
            coeff = clip / (norm_ref + 1e-6)
            if coeff < 1.0:
                for g in main_grads:
                    g.mul_(coeff)
        for group in adam.param_groups:
            group["lr"] = step["lr"]
        adam.step()
        with torch.no_grad():
            for (_, p), m in zip(params, masters):
                p.copy_(m.to(p.dtype))
        d_loss = abs(step["loss"] - loss_ref) / abs(loss_ref)
        d_norm = abs(step["grad_norm"] - norm_ref) / abs(norm_ref)
        worst = max(worst, d_loss, d_norm)
        rows.append((it + 1, step["loss"], loss_ref, d_loss, step["grad_norm"], norm_ref, d_norm))

    print(f"parity: {meta['name']} dtype {meta['dtype']} on {a.device}, tolerance {tol:g} (relative)")
    print("| iter | loss ours | loss torch | rel | grad norm ours | grad norm torch | rel |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]:.6f} | {r[2]:.6f} | {r[3]:.1e} | {r[4]:.6f} | {r[5]:.6f} | {r[6]:.1e} |")
    ok = worst <= tol
    print(f"parity {'PASS' if ok else 'FAIL'}: largest relative difference {worst:.2e} over {len(rows)} iterations")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
