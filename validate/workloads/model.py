"""A small Llama-style decoder in plain torch: RMSNorm, GQA with RoPE, SwiGLU, optional MoE.

The module tree follows torchtitan's Llama (``tok_embeddings``, ``layers`` keyed by their
global index, ``norm``, ``output``) so that the parallel forms can address modules by name:
pipeline stages drop the layers and ends they do not hold; tensor parallelism shards
``attention.w{q,k,v,o}`` and ``feed_forward.w{1,2,3}``.

Attention keeps the ``(batch, seq, heads, head_dim)`` memory layout through
``scaled_dot_product_attention`` so the CPU flash kernel returns its output in the layout
``wo`` reads; with ``fused_kernels`` on, autograd then stores per layer what Megatron's
fused kernels store, the tensors :mod:`planner.cost.activations` counts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from validate.spec import Workload


class _RMSNormFunction(torch.autograd.Function):
    """RMSNorm that saves its input and the per-token ``1/rms`` (Apex/Megatron's fused norm)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return x * rstd * weight

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, rstd = ctx.saved_tensors
        normed = x * rstd
        grad_weight = (grad_out * normed).sum(dim=tuple(range(grad_out.dim() - 1)))
        g = grad_out * weight
        mean = (g * normed).mean(-1, keepdim=True)
        grad_x = g.sub_(normed.mul_(mean)).mul_(rstd)
        return grad_x, grad_weight, None


class _SwiGLUFunction(torch.autograd.Function):
    """``silu(a) · b`` saving only ``a`` and ``b`` (Megatron's fused bias-SwiGLU recomputes silu)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return F.silu(a) * b

    @staticmethod
    def backward(ctx, grad_out):
        # Two new tensors, the input gradients, as a fused kernel allocates: with
        # sig = σ(a) and silu = a·sig, d silu/da = sig + silu·(1 − sig), computed in sig.
        a, b = ctx.saved_tensors
        sig = torch.sigmoid(a)
        silu = torch.mul(a, sig)
        sig.addcmul_(sig, silu, value=-1).add_(silu)
        grad_b = silu.mul_(grad_out)
        grad_a = sig.mul_(b).mul_(grad_out)
        return grad_a, grad_b


def swiglu(a: torch.Tensor, b: torch.Tensor, fused: bool) -> torch.Tensor:
    return _SwiGLUFunction.apply(a, b) if fused else F.silu(a) * b


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, fused: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.fused = fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return _RMSNormFunction.apply(x, self.weight, self.eps)
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_tables(workload: Workload) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of RoPE for every position, shape ``(seq_len, head_dim)`` (Su et al. 2021)."""
    d = workload.head_dim
    inv_freq = 1.0 / (workload.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = torch.outer(torch.arange(workload.seq_len, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape ``(b, s, heads, d)``; cos/sin are ``(s, d)`` for its positions."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Attention(nn.Module):
    """GQA attention. Head counts come from the (possibly TP-sharded) weights at run time."""

    def __init__(self, workload: Workload):
        super().__init__()
        h, d = workload.hidden_size, workload.head_dim
        self.head_dim = d
        self.wq = nn.Linear(h, workload.num_attention_heads * d, bias=False)
        self.wk = nn.Linear(h, workload.num_kv_heads * d, bias=False)
        self.wv = nn.Linear(h, workload.num_kv_heads * d, bias=False)
        self.wo = nn.Linear(workload.num_attention_heads * d, h, bias=False)
        #: Replaced by all-gather attention under context parallelism.
        self.core = causal_attention

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        d = self.head_dim
        q = apply_rope(self.wq(x).view(b, s, -1, d), cos, sin)
        k = apply_rope(self.wk(x).view(b, s, -1, d), cos, sin)
        v = self.wv(x).view(b, s, -1, d)
        out = self.core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal SDPA on ``(b, heads, s, d)`` views; GQA without repeating K and V."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


class FeedForward(nn.Module):
    """SwiGLU MLP: ``w2(silu(w1 x) · w3 x)``."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, fused: bool):
        super().__init__()
        self.w1 = nn.Linear(hidden_size, ffn_hidden_size, bias=False)
        self.w2 = nn.Linear(ffn_hidden_size, hidden_size, bias=False)
        self.w3 = nn.Linear(hidden_size, ffn_hidden_size, bias=False)
        self.fused = fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(swiglu(self.w1(x), self.w3(x), self.fused))


class TransformerBlock(nn.Module):
    def __init__(self, workload: Workload, index: int):
        super().__init__()
        fused = workload.fused_kernels
        self.attention_norm = RMSNorm(workload.hidden_size, workload.norm_eps, fused)
        self.attention = Attention(workload)
        self.ffn_norm = RMSNorm(workload.hidden_size, workload.norm_eps, fused)
        if workload.is_moe_layer(index):
            from validate.workloads.moe import MoE

            self.feed_forward = MoE(workload)
        else:
            self.feed_forward = FeedForward(workload.hidden_size, workload.ffn_hidden_size, fused)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    """The whole model, or one pipeline stage of it once ends and layers are dropped.

    ``forward`` takes token ids when it holds the embedding, hidden states otherwise, and
    returns logits when it holds the output head, hidden states otherwise.
    """

    def __init__(self, workload: Workload):
        super().__init__()
        self.workload = workload
        self.tok_embeddings: nn.Module | None = nn.Embedding(
            workload.vocab_size, workload.hidden_size
        )
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(workload, i) for i in range(workload.num_layers)}
        )
        self.norm: nn.Module | None = RMSNorm(
            workload.hidden_size, workload.norm_eps, workload.fused_kernels
        )
        self.output: nn.Module | None = nn.Linear(
            workload.hidden_size, workload.vocab_size, bias=False
        )
        cos, sin = rope_tables(workload)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        #: Positions of this rank's tokens (set by context parallelism); None: all of them.
        self.positions: torch.Tensor | None = None
        #: Full recomputation: each layer keeps only its input and reruns its forward in
        #: backward (``torch.utils.checkpoint``, non-reentrant).
        self.recompute_layers = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        if self.positions is None:
            # x, not h: under sequence parallelism h holds only this rank's sequence shard.
            cos, sin = self.rope_cos[: x.shape[1]], self.rope_sin[: x.shape[1]]
        else:
            cos, sin = self.rope_cos[self.positions], self.rope_sin[self.positions]
        for layer in self.layers.values():
            if self.recompute_layers and torch.is_grad_enabled():
                h = checkpoint(layer, h, cos, sin, use_reentrant=False)
            else:
                h = layer(h, cos, sin)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h


def build_model(workload: Workload) -> Transformer:
    """The full model, initialised identically on every rank from ``workload.seed``."""
    torch.manual_seed(workload.seed)
    model = Transformer(workload)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("weight") and param.dim() == 2:
                nn.init.normal_(param, std=0.02)
    return model


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy over a ``(b, s, vocab)`` batch."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def synthetic_batch(workload: Workload, num_sequences: int, step: int):
    """Token ids and next-token labels, the same on every rank for a given step."""
    generator = torch.Generator().manual_seed(workload.seed * 1_000_003 + step)
    tokens = torch.randint(
        workload.vocab_size, (num_sequences, workload.seq_len + 1), generator=generator
    )
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
