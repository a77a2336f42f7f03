"""Context parallelism by all-to-all (DeepSpeed-Ulysses, Jacobs et al. 2023;
TransformerEngine's ``AttnFuncWithCPAndQKVOA2A``).

Each rank holds ``s/cp`` tokens (the load-balanced chunks of
:func:`validate.workloads.context_parallel.local_positions`) of every head. One all-to-all
re-shards Q, K and V (packed into one message) from sequence to heads: rank ``g`` gets the
whole sequence of heads group ``g`` (``heads/cp`` query heads and ``kv_heads/cp`` KV heads,
which GQA maps onto each other), attention runs causally by position on it, and a second
all-to-all returns the output to sequence shards. Backward mirrors them: the output
gradient goes to heads, dQ, dK, dV (packed) come back — per layer and micro-batch two
all-to-alls each way, the planner's Ulysses terms (:mod:`planner.comm.context_parallel`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from validate.workloads.context_parallel import (
    causal_mask,
    flash_backward,
    flash_forward,
    gathered_positions,
)


def _to_heads(tensors: list[torch.Tensor], group) -> list[torch.Tensor]:
    """``(b, H, s/cp, d)`` tensors of this rank's tokens → ``(b, H/cp, s, d)`` of its heads
    (sequence in rank order), in one all-to-all."""
    cp = dist.get_world_size(group)
    parts = [t.unflatten(1, (cp, -1)).transpose(0, 1) for t in tensors]  # (cp, b, H/cp, s, d)
    send = torch.cat(parts, dim=2).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    sizes = [p.shape[2] for p in parts]
    return [x.permute(1, 2, 0, 3, 4).flatten(2, 3) for x in received.split(sizes, dim=2)]


def _to_sequence(tensors: list[torch.Tensor], group) -> list[torch.Tensor]:
    """The inverse of :func:`_to_heads`: ``(b, H/cp, s, d)`` → ``(b, H, s/cp, d)``."""
    cp = dist.get_world_size(group)
    parts = [t.unflatten(2, (cp, -1)).permute(2, 0, 1, 3, 4) for t in tensors]  # (cp, b, …)
    send = torch.cat(parts, dim=2).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    sizes = [p.shape[2] for p in parts]
    return [x.transpose(0, 1).flatten(1, 2) for x in received.split(sizes, dim=2)]


class UlyssesAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, group):
        q, k, v = _to_heads([q, k, v], group)
        repeat = q.shape[1] // k.shape[1]
        out, lse = flash_forward(
            q, k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1), 0.0,
            False, attn_mask=mask,
        )  # fmt: skip
        (local,) = _to_sequence([out], group)
        local = local.transpose(1, 2).contiguous().transpose(1, 2)  # (b, s, heads, d) in memory
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.group = group
        return local

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, mask = ctx.saved_tensors
        group = ctx.group
        (grad_heads,) = _to_heads([grad_out.contiguous()], group)
        repeat = q.shape[1] // k.shape[1]
        grad_q, grad_k, grad_v = flash_backward(
            grad_heads, q, k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1),
            out, lse, 0.0, False, attn_mask=mask,
        )  # fmt: skip
        grad_k = grad_k.unflatten(1, (-1, repeat)).sum(2)
        grad_v = grad_v.unflatten(1, (-1, repeat)).sum(2)
        grad_q, grad_k, grad_v = _to_sequence([grad_q, grad_k, grad_v], group)
        return grad_q, grad_k, grad_v, None, None


def ulysses_attention(group: dist.ProcessGroup, positions: torch.Tensor, seq_len: int):
    """An attention core for :class:`~validate.workloads.model.Attention` over the CP group."""
    cp = dist.get_world_size(group)
    whole = gathered_positions(seq_len, cp)
    mask = causal_mask(whole, whole).to(positions.device)

    def core(q, k, v):
        return UlyssesAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), mask, group)

    return core
