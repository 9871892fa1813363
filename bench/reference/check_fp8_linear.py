"""Checks fp8_linear.py (the FP8 linear of the PyTorch peer, torchao's dynamic tensorwise recipe) on random
inputs, on the CPU by default (torch._scaled_mm has a CPU kernel in current torch):

    python3 bench/reference/check_fp8_linear.py [--device cpu|cuda] [--compile]

1. the scales and casts: tensorwise_scale / to_float8 equal an independent computation (amax in Python
   doubles, fp8 max 448 / 57344, the float32 scale, a saturating cast) bit for bit, and tiny gradients
   (1e-7, below e5m2's normal range) survive the cast because of the scale;
2. every torch._scaled_mm call obeys the rules of the cuBLAS kernel (first operand row-major, second
   column-major, all of M, K, N multiples of 16, not both operands e5m2, float32 scalar scales); the calls are
   the three GEMMs (forward e4m3 x e4m3 with fast accumulation, dgrad and wgrad e5m2 x e4m3 without);
3. without autocast (fp32 activations, fp32 outputs) the forward and both gradients equal an explicit fp32
   emulation (quantise x, W and the output gradient with the same scales through torch's float8 dtypes,
   dequantise, matmul in fp32) to fp32 accumulation-order error;
4. under bf16 autocast (the bench's setting: fp32 parameters, bf16 activations) they equal the emulation to
   bf16 rounding, and they are within FP8's error (normwise relative error < 10%, and above 0.1%: the
   quantisation really happens) of the bf16 linear's (F.linear under autocast); a bias is added in bf16 and
   gets the summed gradient;
5. the model: GPT(..., fp8="tensorwise") runs exactly the layers' linears (4 per layer) in FP8 and nothing
   else (12 _scaled_mm calls per layer per forward+backward), and its loss (1%) and gradients (20%: the
   per-linear FP8 errors compound through the layers' dgrads) stay close to the bf16 model's, for a
   Llama-style model (RMSNorm, SwiGLU, GQA, RoPE, no biases) and a GPT-2-style one (LayerNorm, GELU, biases);
6. with --compile: torch.compile(fullgraph=True) of the linear's forward (no graph breaks; backward through
   AOTAutograd, as the bench runs it) gives the eager results: exactly with inductor's emulate_precision_casts,
   within 3% with its default, which skips the bf16 rounding of the autocast copy of x inside the fused cast
   to fp8 (torchao's Float8Linear gets the same); and the whole FP8 model's loss compiles with fullgraph=True
   (forward and backward). Slow on the CPU (inductor compiles C++).

If torch._scaled_mm does not run on the device, the script says so and swaps in an fp32 emulation of it, so the
structure (layouts, dtypes, scales, the call sequence) is still checked, but not the kernel's numbers.
Exits 1 on the first failed check.
"""
import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fp8_linear as fl  # noqa: E402
from gpt_model import GPT, Config  # noqa: E402

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}
FAILURES = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        FAILURES.append(what)


def rel(a, b):
    """Normwise relative error of a against b (in fp64)."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


# ---- the independent emulation ------------------------------------------------------------------------------

def emu_quantise(t, fp8_dtype):
    """-> (fp8 tensor, float32 scale): amax in a Python double, scale = max / amax rounded to float32."""
    amax = float(t.detach().double().abs().max())
    scale = torch.tensor(FP8_MAX[fp8_dtype] / max(amax, 1e-12), dtype=torch.float32)
    scaled = t.detach().float() * scale
    return scaled.clamp(-FP8_MAX[fp8_dtype], FP8_MAX[fp8_dtype]).to(fp8_dtype), scale


def emu_linear(x2, w, g2):
    """y = x W^T, dx = g W, dW = g^T x on dequantised fp8 values, in fp32. x2 [M, K], w [N, K], g2 [M, N]."""
    (xq, sx), (wq, sw), (gq, sg) = emu_quantise(x2, E4M3), emu_quantise(w, E4M3), emu_quantise(g2, E5M2)
    xd, wd, gd = xq.float() / sx, wq.float() / sw, gq.float() / sg
    return xd @ wd.t(), gd @ wd, gd.t() @ xd


# ---- torch._scaled_mm with cuBLAS's rules asserted ------------------------------------------------------------

REAL_SCALED_MM = torch._scaled_mm
CALLS = []


def emulated_scaled_mm(a, b, *, scale_a, scale_b, out_dtype, use_fast_accum=False, bias=None, scale_result=None):
    return ((a.float() @ b.float()) * (scale_a * scale_b)).to(out_dtype)


def make_checked_scaled_mm(inner):
    def checked(a, b, *, scale_a, scale_b, out_dtype, use_fast_accum=False, **kw):
        M, K = a.shape
        N = b.shape[1]
        problems = []
        if not (a.dim() == 2 and b.dim() == 2 and b.shape[0] == K):
            problems.append(f"shapes {tuple(a.shape)} x {tuple(b.shape)}")
        if not (a.stride(1) == 1 and a.stride(0) >= max(K, 1)):
            problems.append(f"first operand not row-major (strides {a.stride()})")
        if not (b.stride(0) == 1 and b.stride(1) >= max(K, 1)):
            problems.append(f"second operand not column-major (strides {b.stride()})")
        if M % 16 or K % 16 or N % 16:
            problems.append(f"M, K, N = {M}, {K}, {N} not all multiples of 16")
        if a.dtype not in FP8_MAX or b.dtype not in FP8_MAX or (a.dtype == E5M2 and b.dtype == E5M2):
            problems.append(f"operand dtypes {a.dtype}, {b.dtype}")
        for s in (scale_a, scale_b):
            if s.dtype != torch.float32 or s.numel() != 1:
                problems.append(f"scale {s.dtype} {tuple(s.shape)}")
        CALLS.append(dict(a=a.dtype, b=b.dtype, fast=use_fast_accum, out=out_dtype, mkn=(M, K, N), problems=problems))
        return inner(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype, use_fast_accum=use_fast_accum,
                     **kw)
    return checked


def scaled_mm_runs(device):
    try:
        a = torch.randn(32, 32, device=device).to(E4M3)
        b = torch.randn(32, 32, device=device).to(E4M3).t()
        one = torch.ones((), device=device)
        REAL_SCALED_MM(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        return True
    except Exception as e:  # noqa: BLE001
        print(f"torch._scaled_mm does not run on {device}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        return False


# ---- the checks ----------------------------------------------------------------------------------------------

def check_casts(dev):
    gen = torch.Generator(device=dev).manual_seed(1)
    for name, t, fp8 in [("activation bf16 -> e4m3", torch.randn(256, 512, device=dev, generator=gen).bfloat16(), E4M3),
                         ("weight fp32 -> e4m3", torch.randn(384, 512, device=dev, generator=gen) * 0.02, E4M3),
                         ("tiny gradient bf16 -> e5m2",
                          (torch.randn(256, 384, device=dev, generator=gen) * 1e-7).bfloat16(), E5M2)]:
        s = fl.tensorwise_scale(t, fp8)
        q = fl.to_float8(t, s, fp8)
        eq, es = emu_quantise(t, fp8)
        check(s.dtype == torch.float32 and s.item() == es.item() and torch.equal(q.view(torch.uint8).cpu(),
                                                                                 eq.view(torch.uint8).cpu()),
              f"cast {name}: scale {s.item():.6g} and fp8 bits equal the independent computation")
        deq = q.float() / s
        check(rel(deq, t.float()) < (0.07 if fp8 == E4M3 else 0.14) and q.float().abs().max().item() <= FP8_MAX[fp8],
              f"cast {name}: dequantised within the format's rounding (rel {rel(deq, t.float()):.4f}), "
              f"max |q| {q.float().abs().max().item():g} <= {FP8_MAX[fp8]:g}")
    zero = torch.zeros(32, 32, device=dev)
    check(torch.isfinite(fl.tensorwise_scale(zero, E4M3)).item() and
          fl.to_float8(zero, fl.tensorwise_scale(zero, E4M3), E4M3).float().abs().max().item() == 0,
          "an all-zero tensor gets a finite scale (amax floored at 1e-12) and casts to zeros")


def run_linear(x, w, b, gy, autocast, dev, fn):
    """-> (y, dx, dW, db or None) of fn(x, w, b) with gradient gy."""
    x = x.detach().clone().requires_grad_(True)
    w = w.detach().clone().requires_grad_(True)
    b = b.detach().clone().requires_grad_(True) if b is not None else None
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=autocast):
        y = fn(x, w, b)
    y.backward(gy)
    return y.detach(), x.grad, w.grad, (b.grad if b is not None else None)


def check_linear(dev, emulated_kernel):
    gen = torch.Generator(device=dev).manual_seed(2)
    B, S, K, N = 2, 128, 512, 384
    x = torch.randn(B, S, K, device=dev, generator=gen)
    x[:, :, 7] *= 20.0  # an outlier channel: the scale follows the whole tensor's amax
    w = torch.randn(N, K, device=dev, generator=gen) * 0.02
    b = torch.randn(N, device=dev, generator=gen) * 0.1
    for autocast in (False, True):
        tag = "bf16 autocast" if autocast else "fp32, no autocast"
        gy = torch.randn(B, S, N, device=dev, generator=gen) * 1e-6  # small, as loss gradients are
        gy = gy.bfloat16() if autocast else gy
        CALLS.clear()
        y, dx, dw, _ = run_linear(x, w, None, gy, autocast, dev, fl.fp8_linear)
        calls = list(CALLS)
        check(len(calls) == 3 and all(not c["problems"] for c in calls),
              f"[{tag}] 3 _scaled_mm calls, each with cuBLAS's layouts, alignment, dtypes and scales"
              + "".join(f"\n        {c['problems']}" for c in calls if c["problems"]))
        want = [(E4M3, E4M3, True), (E5M2, E4M3, False), (E5M2, E4M3, False)]
        got = [(c["a"], c["b"], c["fast"]) for c in calls]
        check(got == want, f"[{tag}] forward e4m3 x e4m3 fast-accum, dgrad and wgrad e5m2 x e4m3 (got {got})")
        out = torch.bfloat16 if autocast else torch.float32
        check(y.dtype == out and dx.dtype == x.dtype and dw.dtype == torch.float32 and y.shape == (B, S, N),
              f"[{tag}] dtypes: y {y.dtype}, dx {dx.dtype} (x's), dW {dw.dtype} (the fp32 parameter's)")
        xin = x.bfloat16() if autocast else x  # what the GEMM quantises: the autocast copy of x; W as it is
        ey, edx, edw = emu_linear(xin.reshape(-1, K), w, gy.reshape(-1, N))
        # fp32: only the summation order differs; bf16: the outputs' rounding (2^-9 relative) on top
        tol = 2e-6 if not autocast else 2 ** -8
        for name, got_t, emu in [("y", y.reshape(-1, N), ey), ("dx", dx.reshape(-1, K), edx), ("dW", dw, edw)]:
            err = ((got_t.float() - emu).abs() - tol * emu.abs()).max().item()
            bound = 1e-6 * emu.abs().max().item()
            check(err <= bound, f"[{tag}] {name} equals the fp32 emulation (max excess over {tol:.2g}·|ref|: "
                                f"{err:.3g}, allowed {bound:.3g}; normwise rel {rel(got_t, emu):.2e})")
        if emulated_kernel:
            continue
        ry, rdx, rdw, _ = run_linear(x, w, None, gy, autocast, dev,
                                     lambda x_, w_, b_: F.linear(x_, w_, b_))
        for name, got_t, ref in [("y", y, ry), ("dx", dx, rdx), ("dW", dw, rdw)]:
            e = rel(got_t, ref)
            check(1e-3 < e < 0.10, f"[{tag}] {name} vs the {'bf16' if autocast else 'fp32'} linear: "
                                   f"normwise rel error {e:.4f} (FP8 level: in (0.001, 0.10))")
    # a bias: added in bf16 after the FP8 GEMM, gradient = the summed output gradient
    gy = (torch.randn(B, S, N, device=dev, generator=gen) * 1e-6).bfloat16()
    y0, _, _, _ = run_linear(x, w, None, gy, True, dev, fl.fp8_linear)
    y1, _, _, db = run_linear(x, w, b, gy, True, dev, fl.fp8_linear)
    check(y1.dtype == torch.bfloat16 and torch.equal(y1, y0 + b.bfloat16()) and db.dtype == torch.float32 and
          rel(db, gy.float().sum((0, 1))) < 1e-2,
          "bias: y = fp8 GEMM + bias in bf16; its gradient is the summed output gradient (fp32 parameter)")


def tiny_models():
    llama = Config(num_layers=2, hidden_size=128, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=352,
                   seq_length=64, max_position_embeddings=64, padded_vocab_size=512, position_embedding_type="rope",
                   rotary_base=500000.0, swiglu=True, normalization="RMSNorm",
                   untie_embeddings_and_output_weights=True, disable_bias_linear=True)
    gpt2 = Config(num_layers=2, hidden_size=128, num_attention_heads=4, num_query_groups=4, ffn_hidden_size=512,
                  seq_length=64, max_position_embeddings=64, padded_vocab_size=512)
    return [("llama-style", llama), ("gpt2-style (biases)", gpt2)]


def check_model(dev, emulated_kernel):
    for name, c in tiny_models():
        results = {}
        for mode in ("none", "tensorwise"):
            torch.manual_seed(0)
            m = GPT(c, dtype=torch.float32, device=dev, fp8=mode)
            m.init_like_megatron()
            if mode == "tensorwise":
                inner, counted = m._fp8_linear, []
                m._fp8_linear = lambda x, w, b=None, _f=inner: (counted.append(tuple(w.shape)), _f(x, w, b))[1]
            gen = torch.Generator(device=dev).manual_seed(3)
            batch = torch.randint(0, c.padded_vocab_size, (2, c.seq_length + 1), device=dev, generator=gen)
            CALLS.clear()
            with torch.autocast(dev, dtype=torch.bfloat16):
                loss = m.loss(batch[:, :-1], batch[:, 1:])
            loss.backward()
            results[mode] = (loss.item(), {n: p.grad.clone() for n, p in m.named()})
            if mode == "tensorwise":
                L = c.num_layers
                check(len(counted) == 4 * L and len(CALLS) == 12 * L and all(not k["problems"] for k in CALLS),
                      f"model {name}: {len(counted)} FP8 linears (want {4 * L}: qkv, proj, fc1, fc2 per layer) and "
                      f"{len(CALLS)} _scaled_mm calls (want {12 * L}), all within cuBLAS's rules")
        (l0, g0), (l1, g1) = results["none"], results["tensorwise"]
        check(abs(l1 - l0) / abs(l0) < 1e-2, f"model {name}: loss fp8 {l1:.5f} vs bf16 {l0:.5f}")
        if emulated_kernel:
            continue
        worst = max(((rel(g1[n], g0[n]), n) for n in g0 if g0[n].norm() > 0), key=lambda t: t[0])
        # each linear's FP8 error is ~4-6% (checked above); a gradient that passed through several FP8 dgrads
        # on its way down collects them (about in quadrature), hence the looser bound here
        check(worst[0] < 0.20, f"model {name}: every parameter's gradient within 20% (normwise) of the bf16 "
                               f"model's; worst {worst[0]:.4f} ({worst[1]})")


def check_compile(dev):
    torch._scaled_mm = REAL_SCALED_MM  # no shim inside the traced code

    def forward(x, w, b):  # compiled like the bench's loss: forward traced, backward by AOTAutograd
        with torch.autocast(dev, dtype=torch.bfloat16):
            return fl.fp8_linear(x, w, b)

    def step(fwd, x, w, b, gy):
        x, w, b = (t.detach().clone().requires_grad_(True) for t in (x, w, b))
        y = fwd(x, w, b)
        y.backward(gy)
        return y.detach(), x.grad, w.grad, b.grad

    gen = torch.Generator(device=dev).manual_seed(4)
    x = torch.randn(256, 256, device=dev, generator=gen)
    w = torch.randn(128, 256, device=dev, generator=gen) * 0.02
    b = torch.randn(128, device=dev, generator=gen) * 0.1
    gy = (torch.randn(256, 128, device=dev, generator=gen) * 1e-6).bfloat16()
    eager = step(forward, x, w, b, gy)
    import torch._inductor.config as inductor_config
    # emulate_precision_casts: inductor keeps the bf16 rounding of the autocast copy of x that its fused cast
    # kernel would otherwise skip (x fp32 -> bf16 -> fp32 * scale becomes x fp32 * scale); with it the compiled
    # code must equal eager exactly; with the default (what the bench and torchao users run) x's fp8 values may
    # differ by an fp8 rounding step here and there
    for emulate, bound in ((True, 1e-6), (False, 3e-2)):
        torch._dynamo.reset()
        saved = inductor_config.emulate_precision_casts
        inductor_config.emulate_precision_casts = emulate
        try:
            compiled = step(torch.compile(forward, fullgraph=True), x, w, b, gy)
        except Exception as e:  # noqa: BLE001
            check(False, f"torch.compile(fullgraph=True) of fp8_linear forward+backward: {type(e).__name__}: "
                         f"{str(e).splitlines()[0][:300]}")
            return
        finally:
            inductor_config.emulate_precision_casts = saved
        for name, e, cpl in zip(("y", "dx", "dW", "db"), eager, compiled):
            check(e.dtype == cpl.dtype and rel(cpl, e) <= bound,
                  f"compiled (fullgraph, emulate_precision_casts={emulate}) {name} vs eager: normwise rel "
                  f"{rel(cpl, e):.2e} (allowed {bound:g}), dtype {cpl.dtype}")
    # the whole FP8 model in one graph (the bench compiles the loss the same way, without fullgraph)
    for name, c in tiny_models():
        torch._dynamo.reset()
        torch.manual_seed(0)
        m = GPT(c, dtype=torch.float32, device=dev, fp8="tensorwise")
        m.init_like_megatron()
        gen = torch.Generator(device=dev).manual_seed(3)
        batch = torch.randint(0, c.padded_vocab_size, (2, c.seq_length + 1), device=dev, generator=gen)

        def loss_fn(tokens, labels):
            with torch.autocast(dev, dtype=torch.bfloat16):
                return m.loss(tokens, labels)

        try:
            lc = torch.compile(loss_fn, fullgraph=True)(batch[:, :-1], batch[:, 1:])
            lc.backward()
        except Exception as e:  # noqa: BLE001
            check(False, f"model {name}: torch.compile(fullgraph=True) of the FP8 model's loss: "
                         f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
            continue
        le = loss_fn(batch[:, :-1], batch[:, 1:])
        check(abs(lc.item() - le.item()) / le.item() < 1e-2 and
              all(p.grad is not None and torch.isfinite(p.grad).all() for _, p in m.named()),
              f"model {name}: the FP8 model compiles as one graph (fullgraph=True), forward and backward; loss "
              f"compiled {lc.item():.5f} vs eager {le.item():.5f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--compile", action="store_true", help="also check torch.compile(fullgraph=True) (slow on CPU)")
    ap.add_argument("--emulated-kernel", action="store_true",
                    help="use the fallback (torch._scaled_mm emulated in fp32) even where the kernel runs")
    a = ap.parse_args()
    dev = a.device
    print(f"torch {torch.__version__}, device {dev}")
    emulated_kernel = a.emulated_kernel or not scaled_mm_runs(dev)
    if emulated_kernel:
        print("FALLBACK: torch._scaled_mm is replaced by an fp32 emulation of it; the checks below test the FP8 "
              "linear's structure (layouts, dtypes, scales, calls), not the kernel's numbers")
    torch._scaled_mm = make_checked_scaled_mm(emulated_scaled_mm if emulated_kernel else REAL_SCALED_MM)
    try:
        check_casts(dev)
        check_linear(dev, emulated_kernel)
        check_model(dev, emulated_kernel)
        if a.compile and not emulated_kernel:
            check_compile(dev)
    finally:
        torch._scaled_mm = REAL_SCALED_MM
    print(f"{len(FAILURES)} check(s) failed" if FAILURES else "all checks passed")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
