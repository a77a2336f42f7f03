"""Mixture-of-experts block with top-k routing and expert parallelism over all_to_all.

Routing: softmax over the top-k router logits of each token (Mixtral, Jiang et al. 2024),
dropless (no capacity factor). Each (token, slot) pair is sent to its expert; experts are
SwiGLU MLPs stored stacked (``w1``, ``w3``: ``E × h × f``; ``w2``: ``E × f × h``).

Under expert parallelism (:func:`shard_experts`) rank ``r`` of the EP group keeps experts
``[r·E/ep, (r+1)·E/ep)``. A forward then runs two all_to_all exchanges per MoE layer
(dispatch the routed tokens, combine the expert outputs), plus one small exchange of the
per-expert token counts; backward runs the two large ones again in reverse. Every rank
sends ``tokens·k·h`` elements in the dispatch; the combine sends what its own experts
processed, so per-rank combine bytes follow the routing while their sum over ranks does not.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd

from validate.spec import Workload
from validate.workloads.model import swiglu


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
        #: Expert-parallel group and this rank's first expert (set by :func:`shard_experts`).
        self.ep_group: dist.ProcessGroup | None = None
        self.first_expert = 0

    @property
    def num_local_experts(self) -> int:
        return self.w1.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        logits = self.router(tokens)
        top_logits, expert_ids = logits.topk(self.top_k, dim=-1)
        weights = F.softmax(top_logits, dim=-1)
        flat_experts = expert_ids.flatten()
        order = flat_experts.argsort(stable=True)
        routed = tokens[order // self.top_k]
        counts = torch.bincount(flat_experts, minlength=self.num_experts)
        if self.ep_group is None:
            out = self._run_experts(routed, counts)
        else:
            out = self._dispatch_run_combine(routed, counts)
        # Gather with the inverse permutation: autograd keeps only the indices.
        unsorted = out[order.argsort()]
        combined = (unsorted.view(-1, self.top_k, shape[-1]) * weights.unsqueeze(-1)).sum(1)
        return combined.view(shape)

    def _run_experts(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Rows of ``routed`` are grouped by local expert, ``counts`` rows each."""
        outputs = []
        for e, rows in enumerate(routed.split(counts.tolist())):
            hidden = swiglu(rows @ self.w1[e], rows @ self.w3[e], self.fused)
            outputs.append(hidden @ self.w2[e])
        return torch.cat(outputs)

    def _dispatch_run_combine(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        group, ep = self.ep_group, dist.get_world_size(self.ep_group)
        local = self.num_local_experts
        # counts_in[src, e]: rows rank src sends to this rank's local expert e.
        counts_in = torch.empty_like(counts)
        dist.all_to_all_single(counts_in, counts, group=group)
        send_splits = counts.view(ep, local).sum(1).tolist()
        counts_in = counts_in.view(ep, local)
        recv_splits = counts_in.sum(1).tolist()
        received = all_to_all_single_autograd(routed, recv_splits, send_splits, group)
        # Received rows are ordered (source rank, expert); regroup them by expert.
        source_major = torch.arange(ep * local).view(ep, local)
        chunk_of = torch.repeat_interleave(source_major.flatten(), counts_in.flatten())
        by_expert = (chunk_of % local) * ep + chunk_of // local
        regroup = by_expert.argsort(stable=True)
        out = self._run_experts(received[regroup], counts_in.sum(0))
        back = out[regroup.argsort()]
        return all_to_all_single_autograd(back, send_splits, recv_splits, group)


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
        module.first_expert = first
    return expert_params
