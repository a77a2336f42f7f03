"""What a job's software stack does by default that its step time depends on.

Tensor-parallel communication overlap (all-gather/GEMM and GEMM/reduce-scatter pipelining,
TransformerEngine's userbuffers): Megatron-Core's performance recipes turn it on — NeMo's
``pretrain_recipe_performance`` adds ``MegatronCommOverlapCallback(tp_comm_overlap=True)``
(NVIDIA/NeMo @0189a3b ``nemo/collections/llm/recipes/llama3_70b.py``) and Megatron-Bridge's
performance configs set ``CommOverlapConfig(tp_comm_overlap=True)``; Megatron-LM's own
``--tp-comm-overlap`` is off unless given (``action='store_true'``,
``megatron/training/arguments.py``), as torch's async TP is unless enabled.

On TPU, XLA overlaps collectives with compute where libtpu's asynchronous collective fusion
is on, and MaxText's TPU configurations turn it on (AI-Hypercomputer/maxtext @76bd53b0f
``MaxText/configs/v5p/*.sh`` and @9bc243c ``MaxText/configs/largest_job/*.sh`` export
``LIBTPU_INIT_ARGS`` with ``--xla_tpu_enable_async_collective_fusion=true
--xla_tpu_enable_async_collective_fusion_multiple_steps=true
--xla_tpu_overlap_compute_collective_tc=true``); XLA's decomposition of a collective into
steps overlapped with the dependent matmul is Wang et al. 2023 (ASPLOS, "Overlap
communication with dependent computation via decomposition in large deep learning models").
So the JAX stack overlaps TP on a TPU; on GPUs its default is off.

A named stack takes its own default (on for Megatron-Core and for JAX on TPU, off for the
others); a job that names none is planned for a stack configured to overlap TP, as the
planner's other recommendations (zero-bubble and DualPipe schedules) assume the stack that
runs them:
``--emit megatron`` writes ``--tp-comm-overlap`` and every output says which was assumed. A
published run is credited with overlap only where its framework is known to have run it
(:func:`framework_overlaps_tp`).
"""

from __future__ import annotations

#: Stacks whose recipes overlap TP communication with the GEMMs by default.
STACKS_OVERLAPPING_TP = frozenset({"megatron"})


#: Stacks that overlap TP communication on a TPU (XLA's asynchronous collective fusion).
STACKS_OVERLAPPING_TP_ON_TPU = frozenset({"jax"})


def default_tp_comm_overlap(stack: str | None, accelerator_kind: str | None = None) -> bool:
    """Whether a job on ``stack`` overlaps TP communication by default on an accelerator of
    ``accelerator_kind`` (``gpu``, ``tpu``; None, no stack named: planned with overlap
    on)."""
    if stack is None or stack in STACKS_OVERLAPPING_TP:
        return True
    return accelerator_kind == "tpu" and stack in STACKS_OVERLAPPING_TP_ON_TPU


def stack_attention_kernel(stack: str | None, measured) -> str | None:
    """The fused attention kernel ``stack`` runs, where the accelerator records its rate
    (``measured``: the kernels of ``Accelerator.attention_kernels``): Megatron-Core runs
    attention through TransformerEngine, which prefers its cuDNN-backed FusedAttention on
    Hopper and newer (NVIDIA/TransformerEngine ``transformer_engine/pytorch/attention.py``:
    "Disabling FlashAttention to give FusedAttention preference on Hopper+ for performance
    reasons"); other stacks, or no record: None (the accelerator's default rates)."""
    return "cudnn" if stack == "megatron" and "cudnn" in measured else None


#: Stacks whose FP8 Linear layers are TransformerEngine's (planner.spec.measures).
STACKS_ON_TRANSFORMER_ENGINE = frozenset({"megatron"})


def stack_memory_measures(stack: str | None, measures):
    """``measures`` with what ``stack``'s kernels do anyway: Megatron-Core's FP8 Linear
    layers are TransformerEngine's, which keep their inputs in FP8 for the weight gradient
    (:attr:`planner.spec.measures.MemoryMeasures.te_fp8_linear_inputs`; it applies only
    under FP8 GEMMs), and its MoE layers (0.13 on) apply the routing probabilities inside
    the experts' activation (:attr:`~planner.spec.measures.MemoryMeasures.
    probs_in_expert_activation`). Other stacks, or none named: ``measures`` as they are
    (torchao's ``Float8Linear`` keeps the 16-bit input and casts it again in the backward)."""
    if stack not in STACKS_ON_TRANSFORMER_ENGINE:
        return measures
    return measures.model_copy(
        update={"te_fp8_linear_inputs": True, "probs_in_expert_activation": True}
    )


def _megatron_core(framework: str | None) -> bool:
    """Whether a published run's framework is Megatron-Core (NeMo, Megatron-Bridge)."""
    return "megatron-core" in (framework or "").lower()


def framework_on_transformer_engine(framework: str | None) -> bool:
    """Whether a published run's FP8 Linear layers were TransformerEngine's: Megatron-Core's
    are (its ``TELinear`` layers)."""
    return _megatron_core(framework)


def framework_applies_probs_in_experts(framework: str | None) -> bool:
    """Whether a published run's Megatron-Core applied the routing probabilities inside
    the experts' activation (Megatron-Core 0.13 and later,
    :attr:`planner.spec.measures.MemoryMeasures.probs_in_expert_activation`): every
    Megatron-Bridge release the catalog holds does (the first, in the NeMo 25.09 container,
    requires ``megatron-core>=0.14.0a0``: its ``pyproject.toml`` at NVIDIA-NeMo/
    Megatron-Bridge@bf71eba). NeMo rows (containers to 25.07) are taken not to: no row's
    Megatron-Core version was checked, and those before 2025-07 predate 0.13."""
    return _megatron_core(framework) and "megatron-bridge" in (framework or "").lower()


def framework_adapter_dtypes(framework: str | None) -> dict[str, str]:
    """The adapter weight and master dtypes a published run's framework kept (the
    :class:`planner.spec.finetune.FinetuneSpec` fields), where they differ from PEFT's FP32
    adapters without a master copy: Megatron-Core's adapters are model parameters, in the
    model's 16-bit dtype (NVIDIA-NeMo/Megatron-Bridge ``src/megatron/bridge/peft/lora.py``:
    ``lora_dtype`` "Default None (will use model's dtype)"), whose FP32 main copies its
    distributed optimizer keeps. Other frameworks: none (the spec's defaults)."""
    if _megatron_core(framework):
        return {"adapter_dtype": "bf16", "adapter_master_dtype": "fp32"}
    return {}


def framework_lora_dropout_position(framework: str | None) -> str:
    """Where a published run's framework applies LoRA dropout: NeMo AutoModel's
    ``PeftConfig`` defaults ``dropout_position`` to ``post``, on the adapter's output
    (NVIDIA-NeMo/Automodel @36044ad ``nemo_automodel/components/_peft/lora.py`` lines 54 and
    333-351); PEFT's ``LoraLayer`` and the rest drop the adapter's input, ``pre``."""
    return "post" if "automodel" in (framework or "").lower() else "pre"


def framework_overlaps_tp(framework: str | None, accelerator_kind: str | None = None) -> bool:
    """Whether a published run's framework overlapped TP communication: Megatron-Core's
    (NeMo, Megatron-Bridge) performance recipes, which the published tables ran, and
    MaxText on a TPU, whose configurations turn on libtpu's asynchronous collective fusion;
    Megatron-LM and Megatron-DeepSpeed runs, older than TransformerEngine's comm overlap or
    without it, and every other stack did not."""
    on_tpu_maxtext = accelerator_kind == "tpu" and "maxtext" in (framework or "").lower()
    return _megatron_core(framework) or on_tpu_maxtext
