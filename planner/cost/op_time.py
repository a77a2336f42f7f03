"""Seconds of one operation for one micro-batch on one GPU (the unit every compute model
returns: :mod:`planner.cost.compute`, :mod:`planner.cost.attention_times`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class OpTime(BaseModel):
    """Seconds of one operation for one micro-batch on one GPU: forward, B, W."""

    model_config = ConfigDict(frozen=True)

    name: str
    forward_s: float
    input_grad_s: float
    weight_grad_s: float
    forward_flops: float
    bound: str  # "compute" or "memory" (of the forward); "overhead": dispatch_time
    #: W where the weight gradient accumulates into a buffer kept over the micro-batches
    #: (:func:`planner.cost.stage_times.accumulates_gradients`): the GEMM reads and writes
    #: that buffer (:attr:`GpuRates.gradient_bytes`); None: as ``weight_grad_s``.
    weight_grad_accumulate_s: float | None = None

    @property
    def total_s(self) -> float:
        return self.forward_s + self.input_grad_s + self.weight_grad_s

    @property
    def accumulating_weight_grad_s(self) -> float:
        """W when the gradient buffer is accumulated into."""
        accumulate = self.weight_grad_accumulate_s
        return self.weight_grad_s if accumulate is None else accumulate


def memory_op(
    name: str, forward_bytes: float, input_grad_bytes: float, weight_grad_bytes: float,
    bytes_per_s: float,
) -> OpTime:  # fmt: skip
    """A memory-bound operation: each pass's HBM bytes at ``bytes_per_s``, no FLOPs."""
    return OpTime(
        name=name,
        forward_s=forward_bytes / bytes_per_s,
        input_grad_s=input_grad_bytes / bytes_per_s,
        weight_grad_s=weight_grad_bytes / bytes_per_s,
        forward_flops=0.0,
        bound="memory",
    )
