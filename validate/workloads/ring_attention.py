"""Context parallelism by ring attention (Liu et al. 2023; the load-balanced split of
Brandon et al. 2023 and TransformerEngine's ``AttnFuncWithCPAndKVP2P``).

Each rank keeps its queries (chunks ``r`` and ``2·cp − 1 − r`` of ``2·cp``, as
:func:`validate.workloads.context_parallel.local_positions` lays them out) and K/V blocks
travel around the ring: at step ``i`` rank ``r`` holds the block of rank ``r − i``. With the
zig-zag split no step needs a mask but the first: the own block is causal by position; a
block from an earlier rank (``j < r``) is seen whole through its first chunk; a block from a
later rank (``j > r``) is seen whole by the second query chunk only (TransformerEngine's
three cases). Partial outputs are merged by their log-sum-exp (the blockwise softmax of
Liu et al. §3).

Forward: cp − 1 sends of the packed K/V block to the next rank. Backward (with the final
output and log-sum-exp, as flash attention's backward takes them): the K/V block travels the
ring again while each block's dK, dV accumulate on the ranks it visits, and the sum returns
to its owner — cp − 1 sends of the block and cp − 1 of its gradient, the planner's ring
terms (:mod:`planner.comm.context_parallel`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from validate.workloads.context_parallel import causal_mask, flash_backward, flash_forward


def _exchange(tensor: torch.Tensor, group) -> torch.Tensor:
    """Send ``tensor`` to the next rank of the ring and receive the previous rank's."""
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    nxt = dist.get_global_rank(group, (rank + 1) % cp)
    prev = dist.get_global_rank(group, (rank - 1) % cp)
    received = torch.empty_like(tensor)
    ops = [
        dist.P2POp(dist.isend, tensor.contiguous(), nxt, group),
        dist.P2POp(dist.irecv, received, prev, group),
    ]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return received


def _block_view(step: int, rank: int, cp: int, q_len: int):
    """(query rows, key columns) of step ``step`` on rank ``rank`` (slices of the local
    queries and of the block), or None for the own block (causal by position)."""
    owner = (rank - step) % cp
    half = q_len // 2
    if owner == rank:
        return None
    if owner < rank:
        return slice(None), slice(0, half)
    return slice(half, None), slice(None)


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, own_mask, group):
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        repeat = q.shape[1] // k.shape[1]
        s = q.shape[2]
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=q.dtype)
        block = torch.stack([k, v])
        for step in range(cp):
            if step < cp - 1:  # the next block arrives while this one is computed on
                incoming = _exchange(block, group)
            view = _block_view(step, rank, cp, s)
            bk, bv = (t.repeat_interleave(repeat, dim=1) for t in block)
            if view is None:
                o, m = flash_forward(q, bk, bv, 0.0, False, attn_mask=own_mask)
                rows = slice(None)
            else:
                rows, cols = view
                o, m = flash_forward(q[:, :, rows], bk[:, :, cols], bv[:, :, cols], 0.0, False)
            new = torch.logaddexp(lse[:, :, rows], m)
            out[:, :, rows] = out[:, :, rows] * torch.exp(lse[:, :, rows] - new)[..., None] + (
                o * torch.exp(m - new)[..., None]
            )
            lse[:, :, rows] = new
            if step < cp - 1:
                block = incoming
        out = out.transpose(1, 2).contiguous().transpose(1, 2)  # (b, s, heads, d) in memory
        ctx.save_for_backward(q, k, v, out, lse, own_mask)
        ctx.group = group
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, own_mask = ctx.saved_tensors
        group = ctx.group
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        repeat = q.shape[1] // k.shape[1]
        s = q.shape[2]
        grad_q = torch.zeros_like(q)
        block = torch.stack([k, v])
        own_grad = None
        travelling = None  # dK, dV of the block held, summed over the ranks it visited
        for step in range(cp):
            view = _block_view(step, rank, cp, s)
            bk, bv = (t.repeat_interleave(repeat, dim=1) for t in block)
            if view is None:
                rows, cols, mask = slice(None), slice(None), own_mask
            else:
                (rows, cols), mask = view, None
            dq, dk, dv = flash_backward(
                grad_out[:, :, rows].contiguous(), q[:, :, rows].contiguous(),
                bk[:, :, cols].contiguous(), bv[:, :, cols].contiguous(),
                out[:, :, rows].contiguous(), lse[:, :, rows].contiguous(), 0.0, False,
                attn_mask=mask,
            )  # fmt: skip
            grad_q[:, :, rows] += dq
            grad = torch.zeros_like(block)
            grad[0][:, :, cols] = dk.unflatten(1, (-1, repeat)).sum(2)
            grad[1][:, :, cols] = dv.unflatten(1, (-1, repeat)).sum(2)
            if step == 0:
                own_grad = grad  # added when the block's gradient comes home
            else:
                travelling = grad if travelling is None else travelling + grad
            if step < cp - 1:  # pass the block on (and, after the first step, its gradient)
                block = _exchange(block, group)
            if step > 0:
                received = _exchange(travelling, group)
                travelling = received if step < cp - 1 else None
                if step == cp - 1:
                    own_grad = own_grad + received
        return grad_q, own_grad[0], own_grad[1], None, None


def ring_attention(group: dist.ProcessGroup, positions: torch.Tensor, seq_len: int):
    """An attention core for :class:`~validate.workloads.model.Attention` over the CP ring."""
    mask = causal_mask(positions, positions).to(positions.device)

    def core(q, k, v):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        return RingAttention.apply(q, k, v, mask, group)

    return core
