"""What a micro-batch keeps from its input-gradient pass (B) until its weight pass (W).

Zero-bubble schedules (ZB-H1, ZB-H2, ZB-V, DualPipeV) split the backward pass: B computes
the gradient of each layer's input and W, run later, the gradients of its weights
(``dW = Xᵀ·dY``). Between the two a micro-batch still holds, per layer, what W needs: the
input ``X`` and the output gradient ``dY`` of every weight GEMM — the zero-bubble paper's
``M_W`` (Qi et al. 2023, §2 and Table 1: ``32·s·b·h`` for a GPT layer against
``M_B = 34·s·b·h + 5·a·s²·b``). Two implementations hold different amounts:

* ``"inputs"`` — the paper's (and its Megatron-LM implementation's): B frees every stored
  tensor W does not read, so ``M_W`` = the weight GEMMs' inputs + their output gradients;
* ``"graph"`` — ``torch.distributed.pipelining`` (torchtitan): B runs
  ``torch.autograd.grad`` with ``retain_graph=True``, so the whole saved graph stays until W,
  plus the output gradients W reads: ``M_W = M_B + dY``.

Under recomputation the weight GEMMs' inputs are recomputed in B and then kept for W, so
both forms count the layer's tensors without recomputation. Under DeepSeek-V3's FP8 recipe
(``fp8_linear_inputs``, TransformerEngine's ``te_fp8_linear_inputs``) the weight-gradient
GEMM reads FP8 operands — the cached input and
the output gradient quantized to FP8 (arXiv 2412.19437 §3.3.1, Figure 6) — so ``M_W`` is
counted at one byte per element. Routed experts see ``k`` copies of each token (balanced
routing), as everywhere else here.

DualPipe (bidirectional) is not covered by :func:`planner.pipeline.closed_form.
peak_activation_units`: at F = B = W the simulator shows its per-rank peak stays at
``p + 1`` stages' worth while ``M_W ≤ 2·M_B``, which holds under DeepSeek-V3's recipe.
"""

from __future__ import annotations

from planner.cost.activations import ActivationShape, layer_activation_tensors
from planner.spec.job import WeightPassMemory
from planner.spec.measures import FP8_BYTES, MemoryMeasures
from planner.spec.model import ModelSpec
from planner.structure.linears import expert_fold, layer_linears, token_rows

#: Stored tensors that are weight-GEMM inputs, whole (Q/K/V or MLA down projections, the
#: output projection, gate/up and the router, the routed experts' gathered tokens, MLA's
#: latents feeding its up projections).
WHOLE_INPUTS = (
    "attention.qkv_input",
    "attention.out_proj_input",
    "attention.latents",
    "mlp.up_input",
    "moe.expert_input",
)
#: Stored MLP intermediates whose last part (the activation's output) feeds down_proj.
INTERMEDIATES = ("mlp.intermediate", "moe.expert_intermediate", "moe.shared_intermediate")


def output_gradient_bytes(
    model: ModelSpec, shape: ActivationShape, moe_layer: bool, linears=None
) -> float:
    """Bytes of ``dY`` of every weight GEMM of one layer on one rank, for one micro-batch.

    Rows are the rank's tokens before the sequence-parallel split (the GEMMs run on the
    gathered sequence), times each module's token share and copies; widths are the
    module's output features on one TP rank (:meth:`planner.structure.linears.Linear.local_shape`).
    ``linears``: the layer's :func:`planner.structure.linears.layer_linears`, when the caller has them.
    """
    tokens, e = shape.local_tokens, shape.element_bytes
    total = 0.0
    for linear in linears or layer_linears(model, moe_layer, shape.tp):
        _, out = linear.local_shape(shape.tp, shape.etp)
        fold = expert_fold(shape.tp, shape.etp)
        total += token_rows(linear, model, tokens, shape.ep, fold) * out * e
    return total


def weight_input_bytes(model: ModelSpec, shape: ActivationShape, moe_layer: bool) -> float:
    """Bytes of the weight GEMMs' inputs of one layer (the stored tensors W reads)."""
    whole = shape.model_copy(update={"recompute": "none", "measures": MemoryMeasures()})
    tensors = layer_activation_tensors(model, whole, moe_layer)
    parts_per_width = 3 if model.mlp_kind == "swiglu" else 2  # gate, up, product / in, out
    inputs = sum(tensors.get(name, 0.0) for name in WHOLE_INPUTS)
    return inputs + sum(tensors.get(name, 0.0) for name in INTERMEDIATES) / parts_per_width


def weight_pass_bytes_per_layer(
    model: ModelSpec,
    shape: ActivationShape,
    moe_layer: bool,
    kept: WeightPassMemory = "inputs",
    linears=None,
) -> float:
    """``M_W`` of one layer on one rank for one micro-batch (see the module docstring);
    ``linears``: the layer's :func:`planner.structure.linears.layer_linears`, when the caller has them."""
    grads = output_gradient_bytes(model, shape, moe_layer, linears)
    if kept == "graph":
        whole = shape.model_copy(update={"recompute": "none"})
        return sum(layer_activation_tensors(model, whole, moe_layer).values()) + grads
    held = weight_input_bytes(model, shape, moe_layer) + grads
    if shape.measures.fp8_weight_gradient_inputs:  # FP8 operands (DeepSeek-V3 Figure 6; TE)
        held *= FP8_BYTES / shape.element_bytes
    return held
