"""Context parallelism: all-gather based causal attention (Llama 3 §3.3.2).

torch's ``context_parallel`` needs CUDA, so the algorithm is written here, following the
Llama 3 paper (Dubey et al. 2024, §3.3.2) and TransformerEngine's
``AttnFuncWithCPAndKVAllGather``. The sequence is cut into ``2·cp`` chunks and rank ``r``
holds chunks ``r`` and ``2·cp − 1 − r``, so every rank has the same share of the causal
work.

Forward: all-gather K and V (packed into one message) over the CP group, then attention of
the local queries against the whole sequence, causally masked by global position.
Backward: all-gather K and V again (the gathered copy is not kept, as in
TransformerEngine), compute the gradients, and reduce-scatter dK and dV (one packed
message) back to their owners. Per layer and micro-batch, each rank therefore takes part in
two all-gathers and one reduce-scatter of the whole sequence's K and V — the planner's CP
terms.

Saved for backward per layer: the local q, k, v, the output and the FP32 log-sum-exp, as
flash attention saves them (torch's CPU flash kernel computes both passes).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

flash_forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def local_positions(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """Global positions of rank ``rank``'s tokens: chunks ``rank`` and ``2·cp − 1 − rank``."""
    chunk = seq_len // (2 * cp)
    first = torch.arange(rank * chunk, (rank + 1) * chunk)
    last_start = (2 * cp - 1 - rank) * chunk
    return torch.cat([first, torch.arange(last_start, last_start + chunk)])


def gathered_positions(seq_len: int, cp: int) -> torch.Tensor:
    """Global positions of the all-gathered keys: every rank's tokens, in rank order."""
    return torch.cat([local_positions(seq_len, cp, rank) for rank in range(cp)])


def causal_mask(q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """Additive mask: 0 where a query may see a key (key position ≤ query position), else −inf."""
    visible = q_positions[:, None] >= k_positions[None, :]
    return torch.zeros(visible.shape).masked_fill(~visible, float("-inf"))


def _all_gather_kv(k: torch.Tensor, v: torch.Tensor, group) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of the whole sequence, ``(b, kv_heads, s, d)``, keys in rank order."""
    cp = dist.get_world_size(group)
    packed = torch.stack([k, v])  # (2, b, kv_heads, s/cp, d)
    gathered = packed.new_empty((cp * 2, *packed.shape[1:]))
    dist.all_gather_single(gathered, packed, group=group)
    whole = (
        gathered.view(cp, *packed.shape).permute(1, 2, 3, 0, 4, 5).flatten(3, 4)
    )  # (2, b, kv_heads, s, d)
    return whole[0], whole[1]


def _reduce_scatter_kv(grad_k: torch.Tensor, grad_v: torch.Tensor, group):
    """Sum the whole-sequence dK, dV over the CP group; each rank keeps its own keys' share."""
    cp = dist.get_world_size(group)
    b, heads, s, d = grad_k.shape
    packed = torch.stack([grad_k, grad_v]).view(2, b, heads, cp, s // cp, d)
    packed = packed.permute(3, 0, 1, 2, 4, 5).flatten(0, 1).contiguous()  # (cp·2, b, …)
    mine = packed.new_empty((2, *packed.shape[1:]))
    dist.reduce_scatter_single(mine, packed, group=group)
    return mine[0], mine[1]


class AllGatherAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, group):
        group_size = q.shape[1] // k.shape[1]
        k_all, v_all = _all_gather_kv(k, v, group)
        k_all = k_all.repeat_interleave(group_size, dim=1)
        v_all = v_all.repeat_interleave(group_size, dim=1)
        out, lse = flash_forward(q, k_all, v_all, 0.0, False, attn_mask=mask)
        del k_all, v_all
        # Lay the output out as (b, s, heads, d), the layout ``wo`` reads, so it is stored once.
        out = out.transpose(1, 2).contiguous().transpose(1, 2)
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.group = group
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, mask = ctx.saved_tensors
        group = ctx.group
        group_size = q.shape[1] // k.shape[1]
        k_all, v_all = _all_gather_kv(k, v, group)
        grad_q, grad_k, grad_v = flash_backward(
            grad_out,
            q,
            k_all.repeat_interleave(group_size, dim=1),
            v_all.repeat_interleave(group_size, dim=1),
            out,
            lse,
            0.0,
            False,
            attn_mask=mask,
        )
        # GQA: each KV head's gradient is the sum over the query heads that share it.
        grad_k = grad_k.unflatten(1, (-1, group_size)).sum(2)
        grad_v = grad_v.unflatten(1, (-1, group_size)).sum(2)
        grad_k, grad_v = _reduce_scatter_kv(grad_k, grad_v, group)
        return grad_q, grad_k, grad_v, None, None


def all_gather_attention(group: dist.ProcessGroup, positions: torch.Tensor, seq_len: int):
    """An attention core for :class:`~validate.workloads.model.Attention` over the CP group."""
    cp = dist.get_world_size(group)
    mask = causal_mask(positions, gathered_positions(seq_len, cp)).to(positions.device)

    def core(q, k, v):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        return AllGatherAttention.apply(q, k, v, mask, group)

    return core
