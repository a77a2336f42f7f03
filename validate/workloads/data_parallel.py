"""Data parallelism and ZeRO with torch's own wrappers, by the layout's ``zero_stage``.

=========  =========================================================================
stage      torch
=========  =========================================================================
0          ``DistributedDataParallel`` (gradients as bucket views, one all-reduce per bucket)
1          DDP + ``ZeroRedundancyOptimizer`` (optimizer states sharded by parameter)
2          FSDP2 ``fully_shard(reshard_after_forward=False)`` per layer and at the root
3          FSDP2 ``fully_shard(reshard_after_forward=True)``
=========  =========================================================================

The optimizer is AdamW in FP32 with ``foreach=False`` (the multi-tensor path allocates a
temporary copy of all optimizer states during ``step``, which no accounting includes).
Gradients persist between steps (``zero_grad(set_to_none=False)``), as Megatron's
contiguous gradient buffer and DDP's buckets keep them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.parallel import DistributedDataParallel

LEARNING_RATE = 1e-2


def adamw(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=LEARNING_RATE, foreach=False)


def wrap_data_parallel(
    model: nn.Module,
    zero_stage: int,
    group: dist.ProcessGroup | None,
    mesh: DeviceMesh | None = None,
    ignored_params: list[nn.Parameter] = (),
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Wrap ``model`` for data parallelism over ``group`` (or ``mesh`` for FSDP2).

    ``ignored_params`` (EP's experts) are left out of DDP's gradient all-reduce.
    Without a group the model and a plain AdamW are returned.
    """
    if group is None and mesh is None:
        return model, adamw(model.parameters())
    if zero_stage >= 2:
        from torch.distributed.fsdp import fully_shard

        reshard = zero_stage == 3
        for layer in model.layers.values():
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        return model, adamw(model.parameters())
    if ignored_params:
        ignored = {id(p) for p in ignored_params}
        names = [name for name, p in model.named_parameters() if id(p) in ignored]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)
    wrapped = DistributedDataParallel(
        model, process_group=group, gradient_as_bucket_view=True, forward_sync_buffers=False
    )
    if zero_stage == 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer = ZeroRedundancyOptimizer(
            wrapped.parameters(),
            optimizer_class=torch.optim.AdamW,
            process_group=group,
            lr=LEARNING_RATE,
            foreach=False,
        )
        return wrapped, optimizer
    return wrapped, adamw(wrapped.parameters())
