"""What a MoE layer's token dispatcher moves in HBM around its experts: the permutations of
the routed token copies (their all-to-alls are the communication model's,
:mod:`planner.comm.terms`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.cost.op_time import OpTime, memory_op
from planner.spec.model import ModelSpec

if TYPE_CHECKING:
    from planner.cost.compute import GpuRates

#: Passes over one routed token copy (``h`` elements each, read or written) that Megatron-Core's
#: all-to-all token dispatcher makes around its experts in the forward
#: (``megatron/core/transformer/moe/token_dispatcher.py``, ``MoEAlltoAllTokenDispatcher``, at
#: NVIDIA/Megatron-LM d98e8a6): "permutation 1" gathers each token's copies into expert order
#: (read, write), "permutation 2" sorts the received copies by local expert and the
#: un-permutation 2 restores their order (read, write each; only with more than one local
#: expert), and un-permutation 1 reads the copies back and sums each token's (read, then
#: ``1/k`` write). The backward runs the inverse of each, the same traffic. DeepEP's fused
#: dispatch (Megatron's ``flex`` dispatcher) folds part of it into the all-to-all: this is
#: the upper count.
MOE_PERMUTE_PASSES = 2 + 1  # permutation 1; un-permutation 1 (plus 1/k for its write)
MOE_SORT_PASSES = 2 + 2  # permutation 2 and un-permutation 2, with several local experts


def moe_permutation_time(
    model: ModelSpec,
    sent_copies: float,
    received_copies: float,
    local_experts: float,
    rates: GpuRates,
    e: float,
) -> OpTime:
    """The MoE token dispatcher's permutations in one layer: of the ``sent_copies`` of the
    rank's own tokens (:data:`MOE_PERMUTE_PASSES`, the un-permutation's sum ``1/k`` more) and,
    where the rank holds several experts, of the ``received_copies`` it computes
    (:data:`MOE_SORT_PASSES`; the busiest rank's under imbalanced routing); memory-bound at
    HBM rate, the backward as much as the forward."""
    passes = sent_copies * (MOE_PERMUTE_PASSES + 1 / model.num_experts_per_token)
    passes += received_copies * MOE_SORT_PASSES if local_experts > 1 else 0.0
    moved = passes * model.hidden_size * e
    return memory_op("moe.permutation", moved, moved, 0.0, rates.hbm_bytes_per_s)
