"""Hierarchical context parallelism (Megatron-Core's ``--cp-comm-type a2a+p2p`` with
``--hierarchical-context-parallel-sizes [k, cp/k]``): Ulysses over the ``k`` inner CP ranks,
ring attention over the ``cp/k`` groups of them.

CP rank ``r`` holds chunks ``r`` and ``2·cp − 1 − r`` of ``2·cp``
(:func:`validate.workloads.context_parallel.local_positions`); its inner group is the CP
ranks ``k·⌊r/k⌋ … k·⌊r/k⌋ + k − 1``, its outer ring the ranks ``r mod k + k·j``. One
all-to-all over the inner group re-shards Q, K, V from sequence to heads
(:mod:`validate.workloads.ulysses_attention`): a rank then holds its inner group's ``2k``
chunks of ``1/k`` of the heads. Sorted by position those are the group's ``k`` low chunks
and then its ``k`` high ones, which is the zig-zag split ring attention expects of a rank
(:mod:`validate.workloads.ring_attention`): a block from an earlier group is seen whole
through its low half, one from a later group by the high queries only. The ring runs over
the outer group, and a second all-to-all returns the output to sequence shards; backward
mirrors both — per layer and micro-batch the inner Ulysses' two all-to-alls each way and
the outer ring's cp/k − 1 steps, the planner's hierarchical terms
(:mod:`planner.comm.context_parallel`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from validate.workloads.context_parallel import causal_mask, local_positions
from validate.workloads.ring_attention import RingAttention
from validate.workloads.ulysses_attention import _to_heads, _to_sequence


class _SequenceToHeads(torch.autograd.Function):
    """Q, K, V in one all-to-all to heads; their gradients in one back."""

    @staticmethod
    def forward(ctx, group, q, k, v):
        ctx.group = group
        return tuple(_to_heads([q, k, v], group))

    @staticmethod
    def backward(ctx, grad_q, grad_k, grad_v):
        grads = [g.contiguous() for g in (grad_q, grad_k, grad_v)]
        return None, *_to_sequence(grads, ctx.group)


class _HeadsToSequence(torch.autograd.Function):
    """The attention output back to sequence shards; its gradient to heads."""

    @staticmethod
    def forward(ctx, group, out):
        ctx.group = group
        (local,) = _to_sequence([out.contiguous()], group)
        return local

    @staticmethod
    def backward(ctx, grad):
        (heads,) = _to_heads([grad.contiguous()], ctx.group)
        return None, heads


def inner_and_outer_ranks(
    cp_ranks: list[int], inner: int
) -> tuple[list[list[int]], list[list[int]]]:
    """The inner groups (consecutive CP ranks) and outer rings (every ``inner``-th) of one
    CP group's global ranks, as the planner places them (the inner degree innermost)."""
    inner_groups = [cp_ranks[i : i + inner] for i in range(0, len(cp_ranks), inner)]
    outer_rings = [cp_ranks[j::inner] for j in range(inner)]
    return inner_groups, outer_rings


def hierarchical_attention(groups: tuple, positions: torch.Tensor, seq_len: int):
    """An attention core for :class:`~validate.workloads.model.Attention` over ``groups``,
    this rank's (inner, outer) process groups."""
    inner_group, outer_group = groups
    inner = dist.get_world_size(inner_group)
    cp = inner * dist.get_world_size(outer_group)
    first = dist.get_rank(outer_group) * inner  # the inner group's first CP rank
    union = torch.cat([local_positions(seq_len, cp, r) for r in range(first, first + inner)])
    order = torch.argsort(union).to(positions.device)
    back = torch.argsort(order)
    mask = causal_mask(union[order.cpu()], union[order.cpu()]).to(positions.device)

    def core(q, k, v):
        q, k, v = _SequenceToHeads.apply(inner_group, q.contiguous(), k.contiguous(),
                                         v.contiguous())  # fmt: skip
        q, k, v = (t[:, :, order].contiguous() for t in (q, k, v))
        out = RingAttention.apply(q, k, v, mask, outer_group)
        return _HeadsToSequence.apply(inner_group, out[:, :, back])

    return core
