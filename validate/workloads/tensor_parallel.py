"""Tensor and sequence parallelism with DTensor (Megatron-LM's split, torchtitan's plan).

Attention: ``wq``/``wk``/``wv`` column-parallel (heads split), ``wo`` row-parallel. MLP:
``w1``/``w3`` column-parallel, ``w2`` row-parallel. Embedding row-parallel (vocabulary
split), output head column-parallel with a vocabulary-parallel cross-entropy
(``loss_parallel``). With sequence parallelism the norms run on sequence shards and each
block's input is all-gathered and its output reduce-scattered (Korthikanti et al. 2022,
§4.2.2); without it the row-parallel outputs are all-reduced.

Under sequence parallelism each rank's norm weights see only its sequence shard, so their
gradients come out of backward as ``Partial`` DTensors. :func:`reduce_partial_gradients`
all-reduces them once per step, as Megatron-LM's ``_allreduce_layernorm_grads`` does;
left ``Partial``, every optimizer op reading the gradient would all-reduce it again (AdamW
reads it three times).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


def apply_tensor_parallel(model: nn.Module, mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Shard ``model`` in place over the 1-D ``mesh``."""
    sp = sequence_parallel
    stream = Shard(1) if sp else Replicate()
    top: dict = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=stream)
    if model.norm is not None and sp:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        top["output"] = ColwiseParallel(
            input_layouts=stream, output_layouts=Shard(-1), use_local_output=False
        )
    parallelize_module(model, mesh, top)
    for layer in model.layers.values():
        plan = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=stream),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=stream),
        }
        # Each block's input becomes one DTensor shared by its column-parallel projections,
        # so backward reduces its gradient once (SP: one reduce-scatter; else one all-reduce)
        # instead of once per projection (3 for Q/K/V, 2 for w1/w3).
        plan["attention"] = PrepareModuleInput(
            input_layouts=(stream, None, None), desired_input_layouts=(Replicate(), None, None)
        )
        plan["feed_forward"] = PrepareModuleInput(
            input_layouts=(stream,), desired_input_layouts=(Replicate(),)
        )
        if sp:
            plan["attention_norm"] = SequenceParallel()
            plan["ffn_norm"] = SequenceParallel()
        parallelize_module(layer, mesh, plan)


def reduce_partial_gradients(model: nn.Module) -> None:
    """All-reduce, once, every gradient left ``Partial`` over TP (the SP norm weights)."""
    for param in model.parameters():
        grad = param.grad
        if isinstance(grad, DTensor) and any(isinstance(p, Partial) for p in grad.placements):
            param.grad = grad.redistribute(placements=[Replicate()] * len(grad.placements))
