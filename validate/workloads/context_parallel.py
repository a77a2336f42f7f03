"""Context parallelism: load-balanced causal ring attention over isend/irecv.

torch's ``context_parallel`` needs CUDA, so the ring is written here (Liu et al. 2023,
"Ring Attention"; the causal load balancing of Llama 3 §3.3.2 and zigzag ring attention).
The sequence is cut into ``2·cp`` chunks and rank ``r`` holds chunks ``r`` and
``2·cp − 1 − r``, so every rank has the same share of the causal work.

Forward: the K/V block (K and V packed into one message) travels the ring ``cp − 1`` hops;
each rank merges the partial attention of its queries against every block by log-sum-exp.
Backward: the block travels again, now with its accumulated K/V gradients (one message of
K, V, dK, dV per hop, ``cp − 1`` hops), and one last hop returns dK, dV to their owner.
Per layer and rank the bytes sent are therefore ``(cp − 1)·2·KV`` forward and
``(cp − 1)·4·KV + 2·KV`` backward, with ``KV`` the bytes of one local K (or V).

Saved for backward per layer: the local q, k, v, the output and the FP32 log-sum-exp,
as flash attention saves them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def local_positions(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """Global positions of rank ``rank``'s tokens: chunks ``rank`` and ``2·cp − 1 − rank``."""
    chunk = seq_len // (2 * cp)
    first = torch.arange(rank * chunk, (rank + 1) * chunk)
    last_start = (2 * cp - 1 - rank) * chunk
    return torch.cat([first, torch.arange(last_start, last_start + chunk)])


def _ring_exchange(tensor: torch.Tensor, group: dist.ProcessGroup) -> tuple[torch.Tensor, list]:
    """Send ``tensor`` to the next rank of the ring and receive the previous rank's copy."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    send_to = dist.get_global_rank(group, (rank + 1) % size)
    recv_from = dist.get_global_rank(group, (rank - 1) % size)
    received = torch.empty_like(tensor)
    ops = [
        dist.P2POp(dist.isend, tensor, send_to, group),
        dist.P2POp(dist.irecv, received, recv_from, group),
    ]
    return received, dist.batch_isend_irecv(ops)


def _wait(works) -> None:
    for work in works:
        work.wait()


def _block_scores(q, k, q_pos, k_pos, scale):
    """Scaled, causally masked scores of local queries against one K block (GQA expanded)."""
    group = q.shape[1] // k.shape[1]
    scores = q @ k.repeat_interleave(group, dim=1).transpose(-1, -2) * scale
    mask = q_pos[:, None] >= k_pos[None, :]
    return scores.masked_fill(~mask, float("-inf"))


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, positions, group, seq_len):
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        scale = q.shape[-1] ** -0.5
        group_size = q.shape[1] // k.shape[1]
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32)
        block = torch.stack([k, v])
        for step in range(cp):
            works = []
            if step < cp - 1:
                incoming, works = _ring_exchange(block, group)
            source = (rank - step) % cp
            k_pos = local_positions(seq_len, cp, source)
            scores = _block_scores(q, block[0], positions, k_pos, scale)
            block_lse = torch.logsumexp(scores, dim=-1)
            safe = torch.where(torch.isinf(block_lse), 0.0, block_lse)
            probs = torch.exp(scores - safe[..., None])
            block_out = probs @ block[1].repeat_interleave(group_size, dim=1)
            new_lse = torch.logaddexp(lse, block_lse)
            new_safe = torch.where(torch.isinf(new_lse), 0.0, new_lse)
            out = (
                out * torch.exp(lse - new_safe)[..., None]
                + block_out
                * torch.exp(safe - new_safe)[..., None]
                * (~torch.isinf(block_lse))[..., None]
            )
            lse = new_lse
            if works:
                _wait(works)
                block = incoming
        # Lay the output out as (b, s, heads, d), the layout ``wo`` reads, so it is stored once.
        out = out.transpose(1, 2).contiguous().transpose(1, 2)
        ctx.save_for_backward(q, k, v, out, lse, positions)
        ctx.group, ctx.seq_len = group, seq_len
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, positions = ctx.saved_tensors
        group, seq_len = ctx.group, ctx.seq_len
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        scale = q.shape[-1] ** -0.5
        group_size = q.shape[1] // k.shape[1]
        delta = (grad_out * out).sum(-1, keepdim=True)
        grad_q = torch.zeros_like(q)
        # The travelling message: K, V and the gradients accumulated for them so far.
        block = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)])
        for step in range(cp):
            source = (rank - step) % cp
            k_pos = local_positions(seq_len, cp, source)
            k_rep = block[0].repeat_interleave(group_size, dim=1)
            v_rep = block[1].repeat_interleave(group_size, dim=1)
            scores = _block_scores(q, block[0], positions, k_pos, scale)
            probs = torch.exp(scores - lse[..., None])
            grad_v = probs.transpose(-1, -2) @ grad_out
            grad_scores = probs * (grad_out @ v_rep.transpose(-1, -2) - delta)
            grad_q += grad_scores @ k_rep * scale
            grad_k = grad_scores.transpose(-1, -2) @ q * scale
            block = block.clone()
            block[2] += grad_k.unflatten(1, (-1, group_size)).sum(2)
            block[3] += grad_v.unflatten(1, (-1, group_size)).sum(2)
            if step < cp - 1:
                block, works = _ring_exchange(block, group)
                _wait(works)
        # The block held now belongs to the next rank: return its gradients home.
        if cp > 1:
            grads, works = _ring_exchange(block[2:].contiguous(), group)
            _wait(works)
        else:
            grads = block[2:]
        return grad_q, grads[0], grads[1], None, None, None


def ring_attention(group: dist.ProcessGroup, positions: torch.Tensor, seq_len: int):
    """An attention core for :class:`~validate.workloads.model.Attention` over the CP ring."""

    def core(q, k, v):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        return RingAttention.apply(q, k, v, positions, group, seq_len)

    return core
