"""Activation-memory measures a training recipe may take (DeepSeek-V3, arXiv 2412.19437).

DeepSeek-V3 trained without tensor parallelism by shrinking what each layer keeps for the
backward pass (§3.2.3 "Extremely Memory Saving with Minimal Overhead", §3.3.3
"Low-Precision Storage and Communication"). Each measure is a switch here, off by
default, so a job opts in (``Job.memory_measures``; the deepseek-v3 catalog entry names
``deepseek-v3`` as the set it was trained with). What each switch removes or narrows,
tensor by tensor, is :func:`planner.cost.activations.apply_memory_measures`.

One more switch is not a recipe's choice but what TransformerEngine does under FP8:
its ``Linear``, ``LayerNormLinear`` and ``GroupedLinear`` keep the quantized, column-wise
FP8 copy of their input for the weight gradient and drop the 16-bit one
(NVIDIA/TransformerEngine ``transformer_engine/pytorch/module/linear.py``: "Discard
row-wise data since it is not needed in backward pass", ``update_usage(rowwise_usage=False,
columnwise_usage=True)``; TE 1.x saved the FP8 transpose ``inputmat_t``). A Megatron-Core
stack takes it under FP8 (:func:`planner.spec.stack.stack_memory_measures`), a job can name
it (``te-fp8``).

Measures that cost no GPU memory in this model need no switch: the EMA of the parameters
lives in CPU memory (§3.2.3), and the planner keeps no EMA on the GPU to begin with; the
MTP module shares the embedding and output head with the main model on the same pipeline
rank (§3.2.3), which :func:`planner.structure.params.mtp_params_per_rank` counts that way for every
model with MTP modules.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from hwspecs.errors import PlanError

#: Bytes per element of DeepSeek-V3's E5M6 format for the attention output (12 bits, §3.3.3).
E5M6_BYTES = 12 / 8
#: Bytes per element of an FP8 (E4M3) activation cache (§3.3.3).
FP8_BYTES = 1.0


class MemoryMeasures(BaseModel):
    """Which activation-memory measures a job takes: DeepSeek-V3's, and TransformerEngine's
    FP8 input caches."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    recompute_norms_and_mla_up_proj: bool = False
    """§3.2.3: every RMSNorm and MLA's query/KV up-projections are recomputed in the
    backward pass; their outputs are not stored (MLA keeps its down-projected latents)."""
    fp8_linear_inputs: bool = False
    """§3.3.3: the inputs of the FP8 Linear layers are cached in FP8, the input of the
    Linear after attention in E5M6. Only under FP8 GEMMs (see :meth:`for_gemm_dtype`)."""
    swiglu_input_cached: bool = False
    """§3.3.3: the MoE SwiGLU's inputs are cached in FP8 and its output recomputed in the
    backward pass. The routing weight is taken to be applied at that recomputed output
    (the combine in §3.2.2 accumulates per node, so weights are applied on the expert
    side; Megatron-core's ``activation_func_with_probs`` does it this way), so the experts'
    weighted outputs are not stored either."""
    te_fp8_linear_inputs: bool = False
    """TransformerEngine under FP8: every FP8 Linear keeps its input as the column-wise FP8
    copy its weight gradient reads (one byte an element; MXFP8's E8M0 scales, one per 32,
    are left out), the attention output besides the 16-bit one the fused attention keeps
    for its own backward. Only under FP8 GEMMs."""
    probs_in_expert_activation: bool = False
    """Megatron-Core from 0.13 (2025-07): the routing probabilities scale the routed experts'
    activation (``transformer/moe/experts.py``'s ``activation_func_with_probs``, fused as
    ``fusions/fused_bias_swiglu.py``'s ``weighted_bias_swiglu_impl``, which saves the
    activation's input and the probabilities) rather than their outputs at the combine (the
    token dispatcher's ``unpermute`` takes no probabilities, ``token_dispatcher.py`` at
    ``core_v0.13.0``), so the experts' outputs are not stored for the probabilities'
    gradient. Any GEMM dtype."""

    @property
    def any(self) -> bool:
        return (
            self.recompute_norms_and_mla_up_proj
            or self.fp8_linear_inputs
            or self.swiglu_input_cached
            or self.te_fp8_linear_inputs
            or self.probs_in_expert_activation
        )

    @property
    def recomputed_modules(self) -> frozenset[str]:
        """The Megatron-Core selective recompute modules (:mod:`planner.spec.recompute`)
        whose work these measures rerun: the norms and MLA's up-projections (``layernorm``,
        ``mla_up_proj``), the MoE SwiGLU's output (``moe_act``)."""
        names = {"layernorm", "mla_up_proj"} if self.recompute_norms_and_mla_up_proj else set()
        return frozenset(names | ({"moe_act"} if self.swiglu_input_cached else set()))

    @property
    def fp8_weight_gradient_inputs(self) -> bool:
        """Whether the weight gradients read FP8-cached inputs (either FP8 cache)."""
        return self.fp8_linear_inputs or self.te_fp8_linear_inputs

    def for_gemm_dtype(self, gemm_dtype: str) -> MemoryMeasures:
        """The measures that apply under ``gemm_dtype``: FP8 caches need FP8 GEMMs."""
        if gemm_dtype == "fp8":
            return self
        return self.model_copy(
            update={
                "fp8_linear_inputs": False,
                "swiglu_input_cached": False,
                "te_fp8_linear_inputs": False,
            }
        )


#: Named sets of measures (``--memory-measures``).
MEASURE_SETS: dict[str, MemoryMeasures] = {
    "none": MemoryMeasures(),
    "deepseek-v3": MemoryMeasures(
        recompute_norms_and_mla_up_proj=True, fp8_linear_inputs=True, swiglu_input_cached=True
    ),
    "te-fp8": MemoryMeasures(te_fp8_linear_inputs=True),
}


def measures_label(measures: MemoryMeasures) -> str:
    """The named set ``measures`` is (``deepseek-v3``, ``te-fp8``), else the switches it
    turns on, ``+``-joined (``none`` for none)."""
    named = [name for name, value in MEASURE_SETS.items() if value == measures]
    if named:
        return named[0]
    return "+".join(name for name, on in measures.model_dump().items() if on)


def memory_measures(name: str) -> MemoryMeasures:
    """A named set of measures; one-line error naming the choices otherwise."""
    if name not in MEASURE_SETS:
        raise PlanError(f"memory_measures must be one of: {', '.join(MEASURE_SETS)}; got '{name}'")
    return MEASURE_SETS[name]
