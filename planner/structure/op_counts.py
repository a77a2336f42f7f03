"""Operations dispatched per pass: what a fixed per-operation host cost multiplies.

An eager framework pays a fixed host cost for every operation it dispatches (Python, the
dispatcher, autograd bookkeeping, a kernel launch), whatever the operation's size. Where
the accelerator records one (:attr:`hwspecs.schema.Accelerator.op_overhead_s`, measured by
``llmplan calibrate`` on a CPU), each pass's time gains ``operations × op_overhead_s``
(:func:`planner.cost.compute.dispatch_time`).

The counts are ATen operations as PyTorch 2.13's dispatcher sees them (a
``TorchDispatchMode`` counts every call, views included) for the reference implementation,
``validate/workloads/model.py`` in eager mode, one micro-batch (``tests/structure/test_op_counts.py``
counts them again). Reference pieces:

* a Llama layer (fused RMSNorm twice, GQA attention with RoPE through
  ``scaled_dot_product_attention``, fused SwiGLU, 7 linears): 72 forward, 85 input-gradient
  and 38 weight-gradient operations;
* its MoE layer (router, top-k, capacity dispatch, the experts as one batched SwiGLU, combine):
  116, 110, 37;
* the ends: the embedding (and the RoPE tables' slices) 3, 0, 2; the final norm, LM head
  and cross-entropy 15, 16, 8.

Other model kinds are counted by the difference of their pieces from the reference
(:data:`LINEAR_OPS` per linear more or fewer; LayerNorm, GELU, learned positions, biases
by their own counts, standalone). Shapes do not change counts, so how TP, CP and EP split
a layer does not either; the parallel forms' own operations are counted the same way on
torch's implementations in ``validate/workloads`` (2 ranks, one layer by layer-count
difference: :mod:`validate.op_census`, which ``tests/validate/test_validate.py`` runs again):

* **DTensor TP** (:func:`tensor_parallel_ops`): per layer and for the ends, the operations
  it adds (redistributions, views), how many operations run on DTensors (each pays
  sharding propagation: :attr:`hwspecs.schema.Accelerator.sharded_op_overhead_s`) and the
  functional collectives it issues (:attr:`~hwspecs.schema.Accelerator.
  functional_collective_overhead_s` each). Autograd runs a layer's backward as one pass;
  the weight-gradient operations are put on DTensors (every one touches a sharded weight),
  the rest under the input gradient. MoE layers take the dense layer's figures. The
  planner steps every TP parameter as a DTensor; without sequence parallelism torch
  leaves the two norms' weights plain (2 of a layer's 9 tensors).
* **FSDP2** (ZeRO-2/3, :data:`FSDP_UNIT_OPS`): each wrapped unit's pre/post-forward and
  pre/post-backward work (unshard copy-in, reshard, gradient copy-out), per layer and for
  the root module (embedding, final norm and head).
* **DDP** (ZeRO-0/1 over dp·cp > 1 ranks, :data:`DDP_BACKWARD_OPS_PER_TENSOR`): its
  gradient hook's operations per parameter tensor in each backward.
* **All-gather CP** (:data:`CP_LAYER_OPS`, ``validate/workloads/context_parallel.py``):
  packing and unpacking K and V around the all-gather, the GQA expansion and the mask in
  forward; the re-gather, the GQA sums and the reduce-scatter packing in backward.
* **EP** (:data:`EP_LAYER_OPS`, ``validate/workloads/moe.py``): the views and transposes
  that lay each MoE layer's blocks out for its two all_to_all exchanges, both ways.

The optimizer runs ``OPTIMIZER_OPS_PER_TENSOR`` operations per parameter tensor
(torch.optim's single-tensor loop, ``foreach=False``) plus one ``zero_`` when the gradient
is kept between steps (``zero_grad(set_to_none=False)``, as the reference does); on
DTensor parameters (FSDP2's, DTensor TP's) all but the step counter's
(:data:`STEP_COUNTER_OPS`) run on DTensors.

"""

from __future__ import annotations

from typing import NamedTuple

from planner.spec.model import ModelSpec


class PassOps(NamedTuple):
    """Operations of one piece for one micro-batch: forward, input gradient, weight gradient."""

    forward: float
    input_grad: float
    weight_grad: float

    def __add__(self, other: PassOps) -> PassOps:  # type: ignore[override]
        return PassOps(*(a + b for a, b in zip(self, other, strict=True)))

    def __mul__(self, factor: float) -> PassOps:  # type: ignore[override]
        return PassOps(*(a * factor for a in self))

    __rmul__ = __mul__


NO_OPS = PassOps(0, 0, 0)
#: The reference Llama layer (7 linears) and MoE layer (4 attention linears, a router and
#: three stacked expert weights), counted in the whole model (see the module docstring).
DENSE_LAYER_OPS = PassOps(72, 85, 38)
MOE_LAYER_OPS = PassOps(116, 110, 37)
#: ``nn.Linear`` on a (b, s, h) input: t, view, mm, _unsafe_view; dX: t, view, mm, view;
#: dW: t, mm, t, view, detach, add_ (accumulate). A bias adds sum, add_, detach to dW.
LINEAR_OPS = PassOps(4, 4, 6)
LINEAR_BIAS_OPS = PassOps(0, 0, 3)
#: Per norm, LayerNorm (native_layer_norm; its backward, detach; two accumulations) minus
#: the reference's fused RMSNorm (pow, mean, add, rsqrt, mul, mul; 9 dX; 2 dW).
LAYERNORM_MINUS_RMSNORM = PassOps(1 - 6, 2 - 9, 2 - 2)
#: GELU MLP activation (gelu; gelu_backward, detach) minus the fused SwiGLU (2; 9).
GELU_MINUS_SWIGLU = PassOps(1 - 2, 2 - 9, 0)
#: RoPE on one tensor (slice ×2, neg, cat, unsqueeze ×2, mul ×2, add; 10 in backward).
ROPE_OPS = PassOps(9, 10, 0)
#: Learned position embedding: a lookup and an add; its backward a scatter-add and add_.
LEARNED_POSITIONS_OPS = PassOps(2, 0, 2)
#: Embedding lookup and the RoPE tables' two slices; W: embedding_dense_backward, add_.
EMBEDDING_OPS = PassOps(3, 0, 2)
#: Final norm, LM head linear and cross-entropy (view ×2, log_softmax, nll_loss, detach).
HEAD_OPS = PassOps(15, 16, 8)

#: torch.optim single-tensor step, operations per parameter tensor (counted in torch 2.13;
#: Lion is not in torch.optim: lucidrains/lion-pytorch's ``update_fn``, 8 in-place ops).
OPTIMIZER_OPS_PER_TENSOR = {
    "adamw": 10,
    "sgd": 1,
    "sgd-momentum": 3,
    "lion": 8,
    "adafactor": 22,
    "muon": 28,
}
#: ``zero_grad(set_to_none=False)``: one ``zero_`` per tensor.
ZERO_GRAD_OPS_PER_TENSOR = 1
#: Operations per tensor on the optimizer's plain step counter (AdamW: ``step_t += 1`` and
#: reading it back, ``_local_scalar_dense``); the others run on the parameter's type.
STEP_COUNTER_OPS = {"adamw": 2}


class TensorParallelOps(NamedTuple):
    """What DTensor TP changes in one piece's dispatch, per micro-batch."""

    added: PassOps  # operations beyond the plain piece's (redistributions, views)
    on_dtensors: PassOps  # of all the piece's operations, those on DTensors
    collectives: PassOps  # functional collectives issued


#: torch 2.13 DTensor TP of the reference layer and ends (ColwiseParallel / RowwiseParallel
#: with PrepareModuleInput; with sequence parallelism SequenceParallel norms and a
#: vocabulary-parallel loss), tp = 2, counted by layer-count difference (1 and 3 layers):
#: a layer runs 89 forward (49 plain) and 136 backward (50 plain) operations under SP, 83
#: (55) and 130 (64) without; the ends 26 (11) and 30 (4) under SP, 23 (14) and 27 (11)
#: without. Keys: sequence parallel.
TP_LAYER_OPS = {
    True: TensorParallelOps(PassOps(17, 13, 0), PassOps(40, 48, 38), PassOps(4, 4, 0)),
    False: TensorParallelOps(PassOps(11, 7, 0), PassOps(28, 28, 38), PassOps(2, 2, 0)),
}
TP_ENDS_OPS = {
    True: TensorParallelOps(PassOps(8, 4, 0), PassOps(15, 16, 10), PassOps(2, 2, 0)),
    False: TensorParallelOps(PassOps(5, 1, 0), PassOps(9, 6, 10), PassOps(1, 1, 0)),
}
#: FSDP2 (torch 2.13 ``fully_shard``, reshard after forward) per wrapped layer and for the
#: root module, beyond the plain model's operations: a layer runs 94 forward and 176
#: backward operations (72 and 123 unwrapped), the ends 35 and 59 (18 and 26).
FSDP_UNIT_OPS = PassOps(22, 53, 0)
FSDP_ROOT_OPS = PassOps(17, 33, 0)
#: DDP (``gradient_as_bucket_view``): a layer's backward runs 141 operations (123 without),
#: 2 for each of its 9 parameter tensors; the ends 32 (26) for their 3.
DDP_BACKWARD_OPS_PER_TENSOR = 2
#: All-gather CP over 2 ranks (with DDP over them): a layer runs 94 forward and 173
#: backward operations, 72 and 123 + 18 (DDP) without CP.
CP_LAYER_OPS = PassOps(22, 32, 0)
#: EP over 2 ranks (with DDP): a MoE layer runs 128 forward and 176 backward operations,
#: 116 and 147 + 14 (DDP, 7 non-expert tensors) without EP.
EP_LAYER_OPS = PassOps(12, 15, 0)


def tensor_parallel_ops(sequence_parallel: bool, ends: bool = False) -> TensorParallelOps:
    """DTensor TP's changes to one layer's dispatch (or the ends', ``ends``)."""
    return (TP_ENDS_OPS if ends else TP_LAYER_OPS)[bool(sequence_parallel)]


def optimizer_sharded_ops_per_tensor(optimizer: str) -> int:
    """Of :func:`optimizer_ops_per_tensor`, the operations on a DTensor parameter's type."""
    return optimizer_ops_per_tensor(optimizer) - STEP_COUNTER_OPS.get(optimizer, 0)


def _reference_linears(moe_layer: bool) -> int:
    return 8 if moe_layer else 7  # 4 attention + (router + 3 stacked experts | 3 MLP)


def layer_pass_ops(model: ModelSpec, moe_layer: bool) -> PassOps:
    """Operations of one layer for one micro-batch: the reference layer plus the
    differences of ``model``'s pieces (module docstring)."""
    from planner.structure.linears import layer_linears

    ops = MOE_LAYER_OPS if moe_layer else DENSE_LAYER_OPS
    linears = layer_linears(model, moe_layer)
    ops = ops + LINEAR_OPS * (len(linears) - _reference_linears(moe_layer))
    if model.norm_kind == "layernorm":
        ops = ops + LAYERNORM_MINUS_RMSNORM * 2
    if model.mlp_kind == "gelu":
        ops = ops + GELU_MINUS_SWIGLU * (1 + (moe_layer and model.num_shared_experts > 0))
    if model.position_embedding != "rope":
        ops = ops + ROPE_OPS * -2
    if model.linear_bias:
        ops = ops + LINEAR_BIAS_OPS * len(linears)
    elif model.qkv_bias:
        ops = ops + LINEAR_BIAS_OPS * 3
    return ops


def embedding_pass_ops(model: ModelSpec) -> PassOps:
    """The first stage's embedding (and learned positions) for one micro-batch."""
    learned = model.position_embedding == "learned"
    return EMBEDDING_OPS + (LEARNED_POSITIONS_OPS if learned else NO_OPS)


def head_pass_ops(model: ModelSpec) -> PassOps:
    """The last stage's final norm, LM head and loss for one micro-batch."""
    ops = HEAD_OPS + (LAYERNORM_MINUS_RMSNORM if model.norm_kind == "layernorm" else NO_OPS)
    return ops + (LINEAR_BIAS_OPS if model.linear_bias else NO_OPS)


def layer_param_tensors(model: ModelSpec, moe_layer: bool) -> int:
    """Parameter tensors of one layer: two norms (with biases for LayerNorm), one per linear
    module (experts stored stacked, one tensor per module name) and its biases."""
    from planner.structure.linears import layer_linears

    linears = len(layer_linears(model, moe_layer))
    norms = 2 * (2 if model.norm_kind == "layernorm" else 1)
    biases = linears if model.linear_bias else 3 * model.qkv_bias
    return norms + linears + biases + (moe_layer and model.router_bias)


def ends_param_tensors(model: ModelSpec) -> tuple[int, int]:
    """(first stage's, last stage's) extra tensors: embeddings; final norm and LM head."""
    first = 1 + (model.position_embedding == "learned")
    last = (2 if model.norm_kind == "layernorm" else 1) + (not model.tied_embeddings)
    return first, last


def rank_param_tensors(model: ModelSpec, finetune, dense_layers, moe_layers, first, last):
    """Trainable tensors a rank's optimizer steps (arrays over ranks work too): its layers'
    (:func:`layer_param_tensors`) and its ends', or, under an adapter recipe, each targeted
    linear's two adapter matrices (A and B)."""
    if finetune is not None and finetune.trains_adapters:
        from planner.spec.finetune import targeted_linears

        def per_layer(moe_layer: bool) -> int:
            return 2 * len(targeted_linears(model, finetune, moe_layer))

        dense, moe = per_layer(False), per_layer(True) if model.is_moe else 0
        return dense_layers * dense + moe_layers * moe
    dense = layer_param_tensors(model, False)
    moe = layer_param_tensors(model, True) if model.is_moe else 0
    embedding, head = ends_param_tensors(model)
    return dense_layers * dense + moe_layers * moe + first * embedding + last * head


def optimizer_ops_per_tensor(optimizer: str) -> int:
    """Operations of one optimizer step and gradient reset per parameter tensor."""
    return OPTIMIZER_OPS_PER_TENSOR[optimizer] + ZERO_GRAD_OPS_PER_TENSOR
