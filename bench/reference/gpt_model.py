"""The PyTorch reference of megatron.cpp's GPT model (src/megatron/nn/), written from the same contracts.

Same architecture options, same parameter names (Megatron-core's state-dict keys) and layouts, so weights
exported by our C++ model (safetensors) load here unchanged:
  - embedding.word_embeddings.weight [Vpad, h], embedding.position_embeddings.weight [max_pos, h] (learned)
  - decoder.layers.i.input_layernorm.{weight,bias}, .self_attention.linear_qkv.{weight,bias} with Megatron's
    fused QKV rows per query group (R query heads, then the key head, then the value head, D rows each),
    .self_attention.linear_proj, .pre_mlp_layernorm, .mlp.linear_fc1 ([gate; up] with SwiGLU), .mlp.linear_fc2
  - decoder.final_layernorm, output_layer.weight (untied only)
  - with num_experts > 0 (Mixtral-style MoE MLP in every layer, replacing .mlp.linear_fc1/2):
    .mlp.router.weight [E, h] (no bias, run in fp32), .mlp.experts.linear_fc1.weight [E, F or 2F, h] ([gate; up]
    rows per expert with SwiGLU) and .mlp.experts.linear_fc2.weight [E, h, F], F = moe_ffn_hidden_size, no expert
    biases. load() also takes Megatron's grouped-GEMM keys (.mlp.experts.linear_fc1.weight0 .. weight{E-1}) and
    stacks them.
RoPE rotates the half layout (pairs i, i + rot/2) with the fp32 angle pos * inv_freq, inv_freq computed in
double and rounded to fp32, as our kernels do. GELU is the tanh approximation. The loss is the mean
cross-entropy over the padded vocabulary, computed in fp32.

MoE routing is Megatron's default softmax top-k (--moe-router-pre-softmax off): fp32 router logits, top-k over
the logits, softmax over the k picked (so each token's k probabilities sum to 1). With moe_aux_loss_coeff > 0
and gradients on, every layer adds Megatron's switch load-balancing loss to the loss (see switch_aux_loss), the
same gradient as Megatron's MoEAuxLossAutoScaler for bf16 (the bench divides the loss by the micro-batch count,
as Megatron scales the aux-loss gradient by 1 / num_micro_batches). The experts run one of three ways
(GPT.moe_impl): "loop" (a GEMM pair per expert over its slice of the expert-sorted tokens; outside
torch.compile's graph, the slice sizes being data), "grouped" (torch._grouped_mm over the same sorted tokens:
static shapes, compiles; where this torch has it) and "dense" (every expert on every token, weighted by the
sparse routing probabilities: the test oracle).

FP8 (GPT(..., fp8="tensorwise")): the four linears of every layer (linear_qkv, linear_proj, linear_fc1,
linear_fc2) run their forward and both backward GEMMs in FP8 through torch._scaled_mm with dynamic tensorwise
scales, torchao's float8 training recipe (fp8_linear.py). The embedding, the output layer, the MoE router and
the MoE experts stay as they are (the experts in moe_compute_dtype).
"""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

FP8_MODES = ("none", "tensorwise")


@dataclass
class Config:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    ffn_hidden_size: int
    seq_length: int
    max_position_embeddings: int
    padded_vocab_size: int
    position_embedding_type: str = "learned_absolute"  # learned_absolute | rope | none
    rotary_percent: float = 1.0
    rotary_base: float = 10000.0
    swiglu: bool = False
    normalization: str = "LayerNorm"  # LayerNorm | RMSNorm
    norm_epsilon: float = 1e-5
    untie_embeddings_and_output_weights: bool = False
    disable_bias_linear: bool = False
    init_method_std: float = 0.02
    num_experts: int = 0  # 0: dense MLP; > 0: an MoE MLP in every layer
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int = 0  # 0: ffn_hidden_size
    moe_aux_loss_coeff: float = 0.0

    @property
    def head_dim(self):
        return self.hidden_size // self.num_attention_heads

    @property
    def expert_ffn(self):
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    @classmethod
    def from_dict(cls, d):
        fields = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in fields})


def megatron_flops_per_iteration(c: Config, batch: int, vocab: int | None = None) -> float:
    """Megatron's num_floating_point_operations (causal halving included), for `batch` sequences.

    With experts every layer is an MoE layer (Megatron's default --moe-layer-freq 1) and its MLP term is the
    routed one, moe_ffn_hidden_size * topk (no shared expert); Megatron counts no router GEMM."""
    s, h, L = c.seq_length, c.hidden_size, c.num_layers
    n, g, d = c.num_attention_heads, c.num_query_groups, c.head_dim
    k = 3 if c.swiglu else 2
    V = vocab if vocab is not None else c.padded_vocab_size
    tokens = batch * s
    mlp = c.expert_ffn * c.moe_router_topk if c.num_experts else c.ffn_hidden_size
    return (tokens * (6 * h * mlp * k * L + 6 * L * (h * (n * d + 2 * g * d) + n * d * h) + 6 * h * V)
            + 6 * n * d * L * batch * s * s)


def causal_attention(q, k, v):
    """Causal scaled dot-product attention with grouped heads: q [b, n, s, d], k and v [b, g, s, d].

    torch's fused SDPA where this torch has it (grouped heads natively from 2.5); older versions (Debian 12's
    torch 1.13, which the CPU benchmark uses) get the same math written out: softmax(q k^T / sqrt(d) + causal
    mask) v, with k and v repeated over each group's heads."""
    n, g = q.shape[1], k.shape[1]
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    if sdpa is not None and g != n:
        try:
            return sdpa(q, k, v, is_causal=True, enable_gqa=True)
        except TypeError:  # 2.0 - 2.4: no enable_gqa
            pass
    if g != n:
        k, v = k.repeat_interleave(n // g, dim=1), v.repeat_interleave(n // g, dim=1)
    if sdpa is not None:
        return sdpa(q, k, v, is_causal=True)
    s = q.shape[2]
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v


def has_grouped_mm() -> bool:
    return hasattr(torch, "_grouped_mm")


def _eager_only(fn):
    """Keeps fn out of torch.compile's graph (the loop's slice sizes are data); a no-op on torches without it."""
    compiler = getattr(torch, "compiler", None)
    return compiler.disable(fn) if compiler is not None and hasattr(compiler, "disable") else fn


def activation(hidden, swiglu: bool):
    if swiglu:
        gate, up = hidden.chunk(2, dim=-1)
        return F.silu(gate) * up
    return F.gelu(hidden, approximate="tanh")


def route(logits, topk: int):
    """Megatron's softmax top-k without pre-softmax: logits [T, E] (fp32) -> probs [T, k] (fp32, summing to 1 over
    the k), expert indices [T, k], the routing map [T, E] (1 where routed, fp32)."""
    top_logits, top_idx = torch.topk(logits, topk, dim=-1)
    probs = torch.softmax(top_logits, dim=-1, dtype=torch.float32)
    routing_map = torch.zeros_like(logits).scatter(1, top_idx, 1.0)
    return probs, top_idx, routing_map


def switch_aux_loss(logits, routing_map, topk: int, coeff: float):
    """Megatron's switch_load_balancing_loss_func on one micro-batch (T tokens, no TP/SP/CP):
    E * coeff / (k * T^2) * sum_e (sum_t softmax(logits)[t, e]) * tokens_per_expert[e]; the counts carry no
    gradient."""
    T, E = logits.shape
    scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
    tokens_per_expert = routing_map.sum(dim=0).detach()
    return (scores.sum(dim=0) * tokens_per_expert).sum() * (E * coeff / (topk * T * T))


@_eager_only
def _experts_loop(xs, counts, w1, w2, swiglu: bool):
    """xs [T*k, h] sorted by expert, counts [E]: one GEMM pair per expert on its slice."""
    outs = []
    w1s, w2s = w1.unbind(0), w2.unbind(0)
    for e, chunk in enumerate(torch.split(xs, counts.tolist())):
        outs.append(F.linear(activation(F.linear(chunk, w1s[e]), swiglu), w2s[e]))
    return torch.cat(outs)


def _experts_grouped(xs, counts, w1, w2, swiglu: bool):
    """The same with torch._grouped_mm: offsets are the running ends of each expert's rows."""
    offs = torch.cumsum(counts, dim=0).to(torch.int32)
    hidden = torch._grouped_mm(xs, w1.transpose(-2, -1), offs=offs)
    return torch._grouped_mm(activation(hidden, swiglu), w2.transpose(-2, -1), offs=offs)


def moe_mlp(x, router_w, w1, w2, c: Config, impl: str, compute_dtype=None):
    """The MoE MLP on x [b, s, h]: -> (output [b, s, h], aux loss or None).

    Tokens are sorted by expert (stable), the experts run on their contiguous slices, outputs are gathered back
    to [T, k, h] and summed with the routing probabilities in fp32. compute_dtype (default: x's) is what the
    expert GEMMs run in: the bench passes bf16 (torch._grouped_mm is bf16 on the GPU, and autocast does not
    cover it), which is what autocast gives the loop's F.linear too."""
    b, s, h = x.shape
    E, k = c.num_experts, c.moe_router_topk
    xt = x.reshape(b * s, h)
    T = xt.shape[0]
    with torch.autocast(device_type=x.device.type, enabled=False):
        logits = F.linear(xt.float(), router_w.float())
    probs, top_idx, routing_map = route(logits, k)
    aux = None
    if c.moe_aux_loss_coeff > 0 and torch.is_grad_enabled():
        aux = switch_aux_loss(logits, routing_map, k, c.moe_aux_loss_coeff)
    cdt = compute_dtype or xt.dtype
    w1c, w2c = w1.to(cdt), w2.to(cdt)
    if impl == "dense":
        ys = torch.stack([F.linear(activation(F.linear(xt.to(cdt), w1c[e]), c.swiglu), w2c[e]) for e in range(E)], 1)
        dense_probs = torch.zeros_like(logits).scatter(1, top_idx, probs)  # [T, E]
        out = (ys.float() * dense_probs[..., None]).sum(dim=1)
        return out.to(cdt).view(b, s, h), aux
    flat_idx = top_idx.reshape(-1)  # entry i = t * k + j
    order = torch.sort(flat_idx, stable=True).indices
    xs = xt.index_select(0, order // k).to(cdt)
    counts = routing_map.sum(dim=0).to(torch.int64)
    if impl == "grouped":
        ys = _experts_grouped(xs, counts, w1c, w2c, c.swiglu)
    elif impl == "loop":
        ys = _experts_loop(xs, counts, w1c, w2c, c.swiglu)
    else:
        raise ValueError(f"unknown MoE implementation {impl!r}")
    inverse = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    ys = ys.index_select(0, inverse).view(T, k, h)
    out = (ys.float() * probs[..., None]).sum(dim=1)
    return out.to(cdt).view(b, s, h), aux


class RotaryTable:
    """cos/sin [s, rot/2] in fp32, the same numbers our CUDA kernels compute."""

    def __init__(self, c: Config, device):
        rot = int(c.head_dim * c.rotary_percent)
        self.rot = rot
        inv = torch.tensor([c.rotary_base ** (-2.0 * i / rot) for i in range(rot // 2)], dtype=torch.float64)
        inv = inv.to(torch.float32).to(device)
        pos = torch.arange(c.seq_length, dtype=torch.float32, device=device)
        angle = pos[:, None] * inv[None, :]
        self.cos, self.sin = torch.cos(angle), torch.sin(angle)

    def apply(self, x):  # x [b, s, heads, d]
        rot, half = self.rot, self.rot // 2
        xf = x.float()
        x1, x2, tail = xf[..., :half], xf[..., half:rot], xf[..., rot:]
        cos, sin = self.cos[None, : x.shape[1], None, :], self.sin[None, : x.shape[1], None, :]
        y = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, tail], dim=-1)
        return y.to(x.dtype)


class GPT(torch.nn.Module):
    def __init__(self, c: Config, dtype=torch.float32, device="cpu", fp8: str = "none"):
        super().__init__()
        if fp8 not in FP8_MODES:
            raise ValueError(f"fp8 must be one of {FP8_MODES}, not {fp8!r}")
        self.c = c
        # "tensorwise": the layers' linears in FP8 (fp8_linear.py); a plain attribute, read at trace time.
        # Imported only when asked for: the float8 dtypes need torch >= 2.1 (the CPU bench runs on 1.13).
        self.fp8 = fp8
        if fp8 != "none":
            from fp8_linear import fp8_linear
            self._fp8_linear = fp8_linear
        h, bias = c.hidden_size, not c.disable_bias_linear
        n, g, d = c.num_attention_heads, c.num_query_groups, c.head_dim
        P = lambda *shape: torch.nn.Parameter(torch.empty(*shape, dtype=dtype, device=device))
        self.params = torch.nn.ParameterDict()
        self.names = []

        def add(name, *shape):
            key = name.replace(".", "__")
            self.params[key] = P(*shape)
            self.names.append(name)

        add("embedding.word_embeddings.weight", c.padded_vocab_size, h)
        if c.position_embedding_type == "learned_absolute":
            add("embedding.position_embeddings.weight", c.max_position_embeddings, h)
        ln_bias = c.normalization == "LayerNorm"
        for i in range(c.num_layers):
            p = f"decoder.layers.{i}."
            add(p + "input_layernorm.weight", h)
            if ln_bias:
                add(p + "input_layernorm.bias", h)
            add(p + "self_attention.linear_qkv.weight", g * (n // g + 2) * d, h)
            if bias:
                add(p + "self_attention.linear_qkv.bias", g * (n // g + 2) * d)
            add(p + "self_attention.linear_proj.weight", h, n * d)
            if bias:
                add(p + "self_attention.linear_proj.bias", h)
            add(p + "pre_mlp_layernorm.weight", h)
            if ln_bias:
                add(p + "pre_mlp_layernorm.bias", h)
            if c.num_experts:
                E, F_ = c.num_experts, c.expert_ffn
                add(p + "mlp.router.weight", E, h)
                add(p + "mlp.experts.linear_fc1.weight", E, F_ * (2 if c.swiglu else 1), h)
                add(p + "mlp.experts.linear_fc2.weight", E, h, F_)
            else:
                add(p + "mlp.linear_fc1.weight", c.ffn_hidden_size * (2 if c.swiglu else 1), h)
                if bias:
                    add(p + "mlp.linear_fc1.bias", c.ffn_hidden_size * (2 if c.swiglu else 1))
                add(p + "mlp.linear_fc2.weight", h, c.ffn_hidden_size)
                if bias:
                    add(p + "mlp.linear_fc2.bias", h)
        add("decoder.final_layernorm.weight", h)
        if ln_bias:
            add("decoder.final_layernorm.bias", h)
        if c.untie_embeddings_and_output_weights:
            add("output_layer.weight", c.padded_vocab_size, h)
        self.rope = RotaryTable(c, device) if c.position_embedding_type == "rope" else None
        # MoE: how the experts run ("loop" | "grouped" | "dense") and the dtype of their GEMMs (None: the
        # activations'); plain attributes, read at trace time (torch.compile guards on them).
        self.moe_impl = "grouped" if has_grouped_mm() else "loop"
        self.moe_compute_dtype = None

    def p(self, name):
        return self.params[name.replace(".", "__")]

    def has(self, name):
        return name.replace(".", "__") in self.params

    def named(self):
        return [(n, self.p(n)) for n in self.names]

    def init_like_megatron(self, seed=1234):
        """Normal(0, std) weights (output projections std / sqrt(2L)), zero biases, unit norm weights."""
        gen = torch.Generator().manual_seed(seed)
        c = self.c
        with torch.no_grad():
            for name, t in self.named():
                if name.endswith("layernorm.weight"):
                    t.fill_(1.0)
                elif name.endswith(".bias"):
                    t.zero_()
                else:
                    std = c.init_method_std
                    if name.endswith("linear_proj.weight") or name.endswith("linear_fc2.weight"):
                        std = std / math.sqrt(2.0 * c.num_layers)
                    t.copy_(torch.randn(t.shape, generator=gen) * std)

    def load(self, tensors: dict):
        with torch.no_grad():
            for name, t in self.named():
                if name in tensors:
                    src = tensors[name]
                elif ".mlp.experts." in name and all(f"{name}{e}" in tensors for e in range(t.shape[0])):
                    src = torch.stack([tensors[f"{name}{e}"] for e in range(t.shape[0])])  # Megatron's per-expert
                else:
                    raise KeyError(f"weights file lacks {name}")
                if tuple(src.shape) != tuple(t.shape):
                    raise ValueError(f"{name}: file has shape {tuple(src.shape)}, model {tuple(t.shape)}")
                t.copy_(src.to(t.dtype))

    def norm(self, x, prefix):
        c = self.c
        w = self.p(prefix + ".weight")
        if c.normalization == "LayerNorm":
            return F.layer_norm(x, (x.shape[-1],), w, self.p(prefix + ".bias"), c.norm_epsilon)
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + c.norm_epsilon)
        return (y * w.float()).to(x.dtype)

    def linear(self, x, prefix):
        """The layers' linears (qkv, proj, fc1, fc2): in FP8 when self.fp8 says so."""
        b = self.p(prefix + ".bias") if self.has(prefix + ".bias") else None
        if self.fp8 == "tensorwise":
            return self._fp8_linear(x, self.p(prefix + ".weight"), b)
        return F.linear(x, self.p(prefix + ".weight"), b)

    def forward(self, tokens):
        """tokens [b, s] -> logits [b, s, Vpad] (the activation dtype)."""
        return self.forward_with_aux(tokens)[0]

    def forward_with_aux(self, tokens):
        """-> (logits, the sum of the layers' MoE load-balancing losses or None)."""
        c = self.c
        b, s = tokens.shape
        n, g, d = c.num_attention_heads, c.num_query_groups, c.head_dim
        r = n // g
        x = F.embedding(tokens, self.p("embedding.word_embeddings.weight"))
        if self.has("embedding.position_embeddings.weight"):
            x = x + self.p("embedding.position_embeddings.weight")[:s][None]
        aux_loss = None
        for i in range(c.num_layers):
            p = f"decoder.layers.{i}."
            ln = self.norm(x, p + "input_layernorm")
            qkv = self.linear(ln, p + "self_attention.linear_qkv").view(b, s, g, r + 2, d)
            q = qkv[:, :, :, :r].reshape(b, s, n, d)
            k, v = qkv[:, :, :, r], qkv[:, :, :, r + 1]
            if self.rope is not None:
                q, k = self.rope.apply(q), self.rope.apply(k)
            attn = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            attn = attn.transpose(1, 2).reshape(b, s, n * d)
            x = x + self.linear(attn, p + "self_attention.linear_proj")
            ln = self.norm(x, p + "pre_mlp_layernorm")
            if c.num_experts:
                y, aux = moe_mlp(ln, self.p(p + "mlp.router.weight"), self.p(p + "mlp.experts.linear_fc1.weight"),
                                 self.p(p + "mlp.experts.linear_fc2.weight"), c, self.moe_impl,
                                 self.moe_compute_dtype)
                if aux is not None:
                    aux_loss = aux if aux_loss is None else aux_loss + aux
                x = x + y
            else:
                act = activation(self.linear(ln, p + "mlp.linear_fc1"), c.swiglu)
                x = x + self.linear(act, p + "mlp.linear_fc2")
        x = self.norm(x, "decoder.final_layernorm")
        w = self.p("output_layer.weight") if c.untie_embeddings_and_output_weights else self.p(
            "embedding.word_embeddings.weight")
        return F.linear(x, w), aux_loss

    def loss(self, tokens, labels):
        """The mean cross-entropy, plus the layers' MoE load-balancing losses where those are on."""
        logits, aux = self.forward_with_aux(tokens)
        lm = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))
        return lm if aux is None else lm + aux


def no_weight_decay(name: str, shape) -> bool:
    """Megatron's rule: biases and 1-D parameters are not decayed."""
    return name.endswith(".bias") or len(shape) == 1
