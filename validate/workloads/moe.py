"""Mixture-of-experts block with top-k routing, fixed expert capacity, and EP over all_to_all.

Routing: softmax over the top-k router logits of each token (Mixtral, Jiang et al. 2024).
Dispatch is capacity-based, as in GShard (Lepikhin et al. 2020, §2.2) and Switch
Transformer (Fedus et al. 2021, §2.1): each sequence may send each expert at most
``capacity = ceil(s·k / E)`` tokens (capacity factor 1), first choices before second
choices and earlier tokens before later ones; the rest are dropped (their slot adds
nothing, the residual carries the token). Every expert therefore processes a fixed
``[sequences, capacity]`` block, padded with zeros, and the experts run as one batched
matmul. Experts are SwiGLU MLPs stored stacked (``w1``, ``w3``: ``E × h × f``; ``w2``:
``E × f × h``).

Under expert parallelism (:func:`shard_experts`) rank ``r`` of the EP group keeps experts
``[r·E/ep, (r+1)·E/ep)``. A forward runs two all_to_all exchanges per MoE layer (dispatch
the padded blocks, combine the expert outputs), backward the same two in reverse. With
fixed capacity the splits are equal and known in advance: every rank sends
``(ep − 1)/ep · b·E·capacity·h`` elements per exchange, ``(ep − 1)/ep · b·s·k·h`` when
``E`` divides ``s·k`` — the planner's EP term, whatever the routing does. The exchanges are
blocking ``c10d`` all_to_all calls in an autograd function (:class:`AllToAll`), as the CP
workload's all-gathers, FSDP2's and DDP's collectives are: on gloo, torch's functional
collectives (``all_to_all_single_autograd``) cost about 1 ms more per call than the
``c10d`` call the calibration fits (measured on 2 ranks, 4 KiB–1 MiB), which no other
parallel form here pays.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from validate.spec import Workload
from validate.workloads.model import swiglu


class AllToAll(torch.autograd.Function):
    """Equal-split all_to_all over ``group`` (``c10d``, blocking); its backward is the same
    exchange of the gradient (each block goes back to the rank it came from)."""

    @staticmethod
    def forward(ctx, blocks: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        received = torch.empty_like(blocks)
        dist.all_to_all_single(received, blocks.contiguous(), group=group)
        return received

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        returned = torch.empty_like(grad)
        dist.all_to_all_single(returned, grad.contiguous(), group=ctx.group)
        return returned, None


def expert_capacity(seq_len: int, top_k: int, num_experts: int) -> int:
    """Tokens one sequence may send each expert at capacity factor 1 (GShard, Switch)."""
    return math.ceil(seq_len * top_k / num_experts)


def capacity_positions(expert_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Position of each (token, choice) in its expert's queue, per sequence.

    ``expert_ids`` is ``(b, s, k)``. Queues fill choice-major (every token's first choice
    before any second choice, GShard §2.2), then in token order.
    """
    b, s, k = expert_ids.shape
    order = expert_ids.transpose(1, 2).reshape(b, k * s)
    onehot = F.one_hot(order, num_experts)
    position = (onehot.cumsum(1) - 1).gather(-1, order.unsqueeze(-1)).squeeze(-1)
    return position.view(b, k, s).transpose(1, 2)


class MoE(nn.Module):
    def __init__(self, workload: Workload):
        super().__init__()
        h, f, num_experts = (
            workload.hidden_size,
            workload.moe_ffn_hidden_size,
            workload.num_routed_experts,
        )
        self.top_k = workload.num_experts_per_token
        self.num_experts = num_experts
        self.fused = workload.fused_kernels
        self.router = nn.Linear(h, num_experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(num_experts, h, f) * 0.02)
        self.w3 = nn.Parameter(torch.randn(num_experts, h, f) * 0.02)
        self.w2 = nn.Parameter(torch.randn(num_experts, f, h) * 0.02)
        #: Expert-parallel group (set by :func:`shard_experts`).
        self.ep_group: dist.ProcessGroup | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        num_experts, k = self.num_experts, self.top_k
        capacity = expert_capacity(s, k, num_experts)
        top_logits, expert_ids = self.router(x).topk(k, dim=-1)
        weights = F.softmax(top_logits, dim=-1)
        with torch.no_grad():
            position = capacity_positions(expert_ids, num_experts)
            kept = position < capacity
            sequence = torch.arange(b).view(b, 1, 1).expand(b, s, k)
            slot = ((sequence * num_experts + expert_ids) * capacity + position)[kept]
            token = torch.arange(b * s).view(b, s, 1).expand(b, s, k)[kept]
        tokens = x.reshape(b * s, h)
        blocks = tokens.new_zeros(b * num_experts * capacity, h).index_copy(0, slot, tokens[token])
        # Expert-major: (E, b·capacity, h), the layout the all_to_all splits by rank.
        blocks = (
            blocks.view(b, num_experts, capacity, h).transpose(0, 1).reshape(num_experts, -1, h)
        )
        out = self._run_experts(blocks) if self.ep_group is None else self._exchange_run(blocks)
        out = out.view(num_experts, b, capacity, h).transpose(0, 1).reshape(-1, h)
        gathered = out[slot] * weights[kept].unsqueeze(-1)
        return tokens.new_zeros(b * s, h).index_add(0, token, gathered).view(b, s, h)

    def _run_experts(self, blocks: torch.Tensor) -> torch.Tensor:
        """``blocks``: ``(local experts, rows, h)``; one batched SwiGLU MLP over all experts."""
        hidden = swiglu(torch.bmm(blocks, self.w1), torch.bmm(blocks, self.w3), self.fused)
        return torch.bmm(hidden, self.w2)

    def _exchange_run(self, blocks: torch.Tensor) -> torch.Tensor:
        """Send each rank its experts' blocks, run the local experts, send the outputs back."""
        group, ep = self.ep_group, dist.get_world_size(self.ep_group)
        num_experts, rows, h = blocks.shape
        local = num_experts // ep
        received = AllToAll.apply(blocks.reshape(-1, h), group)
        # Received: (source rank, local expert, rows, h) -> (local expert, sources·rows, h).
        received = received.view(ep, local, rows, h).transpose(0, 1).reshape(local, -1, h)
        out = self._run_experts(received)
        back = out.view(local, ep, rows, h).transpose(0, 1).reshape(-1, h)
        returned = AllToAll.apply(back, group)
        return returned.view(num_experts, rows, h)


def shard_experts(model: nn.Module, group: dist.ProcessGroup) -> list[nn.Parameter]:
    """Keep this rank's experts in every MoE block; return the expert parameters it holds."""
    rank, ep = dist.get_rank(group), dist.get_world_size(group)
    expert_params = []
    for module in model.modules():
        if not isinstance(module, MoE):
            continue
        local = module.num_experts // ep
        first = rank * local
        for name in ("w1", "w2", "w3"):
            whole = getattr(module, name)
            part = nn.Parameter(whole.detach()[first : first + local].clone())
            setattr(module, name, part)
            expert_params.append(part)
        module.ep_group = group
    return expert_params
