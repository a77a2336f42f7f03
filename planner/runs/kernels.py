"""The kernels a published run's software ran, read from what its framework and its source
say (the attention kernel, whether attention was fused at all, the loss kernel), so that a
runs-check row is timed at what it ran rather than at the accelerator's default."""

from __future__ import annotations

from hwspecs.catalog import catalog_names, load_accelerator
from hwspecs.runs import RunRow
from planner.spec.stack import stack_attention_kernel

#: llm-foundry models whose large-scale H100 benchmarks ran its Triton attention: that
#: table's sweep (mosaicml/llm-foundry @5e85bd62d ``scripts/train/benchmarking/sweep.py``)
#: passes ``--attn_impl triton`` for 13b and 30b and ``flash`` (FlashAttention-2, the
#: ``gpu-flash2`` extra) for the others.
FOUNDRY_LARGE_SCALE_TRITON = frozenset({"mpt-13b", "mpt-30b"})


def foundry_attention_kernel(row: RunRow) -> str:
    """The attention kernel an llm-foundry benchmark row ran. ``submit_benchmarks.py``'s
    ``--attn_impl`` defaults to ``triton`` (FlashAttention's Triton port,
    ``flash_attn_triton.py``: FlashAttention-1's speed by its own docstring) and overrides
    the model YAML's; ``sweep.sh``, which produced every table but the large-scale one (the
    A100 tables @300cc5c58, the H100 ones @b2a43a147), passes none. The large-scale table's
    ``sweep.py`` names one per model (:data:`FOUNDRY_LARGE_SCALE_TRITON`). The A100 entries
    record no attention kernel, so there the name changes nothing."""
    large_scale = "large scale" in (row.source_ref.table or "").lower()
    if large_scale and (row.model.name or "").lower() not in FOUNDRY_LARGE_SCALE_TRITON:
        return "flash-attention-2"
    return "flash-attention-1"


def attention_kernel(row: RunRow) -> str | None:
    """The fused attention kernel a row's stack ran, where its software says: llm-foundry's
    (:func:`foundry_attention_kernel`). Megatron-Core rows (NeMo, Megatron-Bridge) ran
    TransformerEngine's, cuDNN's where the accelerator records it
    (:func:`planner.spec.stack.stack_attention_kernel`). Other rows take the accelerator's
    default rates (None)."""
    framework = (row.training.framework or "").lower()
    if "llm-foundry" in framework:
        return foundry_attention_kernel(row)
    if "megatron-core" in framework and row.hardware.accelerator in catalog_names("accelerator"):
        measured = load_accelerator(row.hardware.accelerator).attention_kernels
        return stack_attention_kernel("megatron", measured)
    return None


def ran_flash_attention(row: RunRow) -> bool:
    """Whether a row's stack ran a fused attention kernel. Megatron-LM gained FlashAttention
    (``--use-flash-attn``) with NVIDIA/Megatron-LM pull request 267, opened 2022-12 and merged
    in 2023, and BigScience's Megatron-DeepSpeed never merged its port (pull request 357), so
    Megatron-LM and Megatron-DeepSpeed runs published in 2022 or earlier ran ``CoreAttention``
    unfused: batched GEMMs and ``FusedScaleMaskSoftmax`` over the stored scores (the 5as²b of
    Korthikanti et al. 2022, whose selective recomputation exists to drop them). Every other
    row ran a fused kernel (:func:`attention_kernel` says which where its software does)."""
    framework = (row.training.framework or "").lower()
    megatron_lm = "megatron" in framework and "megatron-core" not in framework
    return not (megatron_lm and row.year is not None and row.year <= 2022)


def cross_entropy_kernel(row: RunRow) -> str:
    """The loss kernel a row's stack ran: llm-foundry's MPT computes its loss with
    FlashAttention's fused ``CrossEntropyLoss`` unless configured otherwise
    (mosaicml/llm-foundry ``llmfoundry/models/mpt/modeling_mpt.py``: ``loss_fn`` defaults to
    ``fused_crossentropy``; its benchmark configs set none); other rows the unfused one."""
    return "fused" if "llm-foundry" in (row.training.framework or "").lower() else "unfused"
