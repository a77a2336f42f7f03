"""Activation memory per layer, tensor by tensor.

Each stored tensor of a transformer layer is listed with its size and how tensor
parallelism splits it, following the accounting of Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models", §4.1 and Table 2). Configured as
their GPT layer (LayerNorm, MHA, 4h GELU MLP, dropout, no flash attention) it gives exactly
``sbh(34 + 5as/h)`` bytes with 16-bit activations; TP without sequence parallelism keeps
the ``10·sbh`` of norms, their outputs and dropout masks whole on every rank; sequence
parallelism splits those too; selective recomputation drops the ``5as²b`` score terms;
full recomputation keeps only the layer input. The same accounting for a Llama layer
(RMSNorm, GQA, SwiGLU, flash attention, no dropout) derives its own constants: GQA
shrinks K and V, SwiGLU stores gate, up and their product (``3f`` instead of ``2·4h``),
flash attention stores the FP32 log-sum-exp instead of the ``s × s`` scores (Dao et al.
2022).
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, ConfigDict

from planner.spec.measures import E5M6_BYTES, FP8_BYTES, MemoryMeasures
from planner.spec.model import ModelSpec
from planner.spec.recompute import recompute_modules
from planner.structure.linears import kv_heads_per_rank

#: Bytes of a dropout mask element (PyTorch stores masks as uint8/bool).
DROPOUT_MASK_BYTES = 1
#: Flash attention keeps its softmax log-sum-exp statistics in FP32.
LSE_BYTES = 4


class ActivationShape(BaseModel):
    """The sizes that decide activation memory on one rank for one micro-batch."""

    model_config = ConfigDict(frozen=True)

    seq_len: int
    micro_batch_size: int
    tp: int = 1
    cp: int = 1
    sequence_parallel: bool = False
    flash_attention: bool = True
    recompute: str = "none"
    element_bytes: float = 2.0
    measures: MemoryMeasures = MemoryMeasures()
    #: Expert parallelism: decides the busiest rank's routed load (ModelSpec.routed_load_factor).
    ep: int = 1
    #: The routed experts' TP degree (None: tp). With etp < tp a rank holds ``etp/tp`` of the
    #: routed rows at width ``f/etp`` (MoE parallel folding, planner.structure.linears.expert_fold).
    etp: int | None = None

    @property
    def routed_share(self) -> float:
        """Share of the routed tokens' [k·tokens, h] tensors (expert input and output) a rank
        stores: the TP-replicated share, or ``etp/tp`` when the TP ranks fold into EP."""
        fold = 1 if self.etp is None else self.tp // self.etp
        return self.replicated_share if fold == 1 else 1.0 / fold

    @property
    def local_tokens(self) -> float:
        """Tokens of one micro-batch on this rank before the SP split: s·b / cp."""
        return self.seq_len * self.micro_batch_size / self.cp

    @property
    def replicated_share(self) -> float:
        """Share of a TP-replicated tensor a rank stores: 1/tp under SP, else all of it."""
        return 1.0 / self.tp if self.sequence_parallel else 1.0


def attention_tensors(model: ModelSpec, shape: ActivationShape) -> dict[str, float]:
    """Stored tensors of the attention block (bytes), before recomputation is applied."""
    tokens, e, t = shape.local_tokens, shape.element_bytes, shape.tp
    h, rep = model.hidden_size, shape.replicated_share
    heads = model.num_attention_heads / t
    tensors = {
        "attention.norm_input": tokens * h * e * rep,
        "attention.qkv_input": tokens * h * e * rep,
    }
    if model.attention_kind == "mla":
        q_rank = model.q_lora_rank or 0
        kv_rank, rope = model.kv_lora_rank, model.qk_rope_head_dim
        # Down-projected latents are small and computed whole on every TP rank; each is
        # stored before (for its norm) and after its RMSNorm (for the up projection).
        tensors["attention.latents"] = tokens * e * (2 * q_rank + (kv_rank + rope) + kv_rank)
        tensors["attention.query"] = tokens * heads * model.head_dim * e
        tensors["attention.key_value"] = (
            tokens * heads * (model.head_dim + model.value_head_dim) * e
        )
    else:
        kv = kv_heads_per_rank(model, t)
        tensors["attention.query"] = tokens * heads * model.head_dim * e
        tensors["attention.key_value"] = tokens * 2 * kv * model.head_dim * e
    if shape.flash_attention:
        tensors["attention.softmax_lse"] = tokens * heads * LSE_BYTES
    else:
        # Scores for the local queries against all keys: a·(s/cp)·s·b per rank.
        scores = heads * tokens * shape.seq_len
        tensors["attention.softmax_output"] = scores * e
        if model.dropout > 0:
            tensors["attention.dropout_mask"] = scores * DROPOUT_MASK_BYTES
            tensors["attention.dropout_output"] = scores * e
    tensors["attention.out_proj_input"] = tokens * heads * model.value_head_dim * e
    if model.dropout > 0:
        tensors["attention.residual_dropout_mask"] = tokens * h * DROPOUT_MASK_BYTES * rep
    return tensors


def _mlp_intermediates(model: ModelSpec, tokens: float, ffn: float, e: float, t: int) -> float:
    """SwiGLU: gate and up outputs plus their product (3f); GELU: its input and output (2f)."""
    stored = 3 if model.mlp_kind == "swiglu" else 2
    return tokens * stored * ffn * e / t


def mlp_tensors(model: ModelSpec, shape: ActivationShape, moe_layer: bool) -> dict[str, float]:
    """Stored tensors of the MLP / MoE block (bytes), before recomputation."""
    tokens, e, t = shape.local_tokens, shape.element_bytes, shape.tp
    h, rep = model.hidden_size, shape.replicated_share
    tensors = {
        "mlp.norm_input": tokens * h * e * rep,
        "mlp.up_input": tokens * h * e * rep,
    }
    if not moe_layer:
        tensors["mlp.intermediate"] = _mlp_intermediates(model, tokens, model.ffn_hidden_size, e, t)
    else:
        # The busiest EP rank's routed copies (balanced routing: k per token).
        k = model.num_experts_per_token * model.routed_load_factor(shape.ep)
        f = model.moe_ffn_hidden_size
        tensors["moe.router_logits"] = tokens * model.num_routed_experts * 4 * rep
        routed = shape.routed_share
        tensors["moe.expert_input"] = tokens * k * h * e * routed
        # Rows × etp/tp at width f/etp: the same bytes as rows at f/tp, whatever the etp.
        tensors["moe.expert_intermediate"] = _mlp_intermediates(model, tokens * k, f, e, t)
        tensors["moe.expert_output"] = tokens * k * h * e * routed
        if model.num_shared_experts:
            shared_ffn = model.num_shared_experts * f
            tensors["moe.shared_intermediate"] = _mlp_intermediates(model, tokens, shared_ffn, e, t)
    if model.dropout > 0:
        tensors["mlp.residual_dropout_mask"] = tokens * h * DROPOUT_MASK_BYTES * rep
    return tensors


#: What a layer keeps under ``dots`` as the other policies store it: its input, the
#: projections' outputs its backward reads (queries, keys, values; the router's logits) and
#: the routed tokens and expert outputs, which come through the all-to-all and are not
#: recomputed. :func:`dots_tensors` adds MLA's latents, the output projection's output and
#: the MLP's first projections, which it sizes itself.
DOTS_KEPT = ("attention.norm_input", "attention.query", "attention.key_value",
             "moe.router_logits", "moe.expert_input", "moe.expert_output")  # fmt: skip


def dots_tensors(model: ModelSpec, shape: ActivationShape, moe_layer: bool) -> dict[str, float]:
    """The tensors a layer keeps when only matmul outputs are saved: JAX's
    ``jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims`` (MaxText's
    ``remat_policy=minimal``: its ``decoders.py`` saves ``query_proj``, ``key_proj``,
    ``value_proj``, ``out_proj``, ``mlpwi*`` and ``mlpwo``), of which the backward reads the
    layer input, the queries, keys and values (the attention core's backward), the output
    projection's output (the MLP's norm input is rebuilt from it and the layer input) and
    the MLP's first projections (gate and up under SwiGLU, one under GELU/ReLU). The
    norms, the activation, the attention core (a batched product or a fused kernel, not a
    projection) and its softmax statistics are recomputed. The memory measures are a
    Megatron recipe's and do not apply."""
    tokens, e, h, rep = (
        shape.local_tokens,
        shape.element_bytes,
        model.hidden_size,
        shape.replicated_share,
    )
    raw = {**attention_tensors(model, shape), **mlp_tensors(model, shape, moe_layer)}
    kept = {name: raw[name] for name in DOTS_KEPT if name in raw}
    if model.attention_kind == "mla":  # the down-projections' outputs, not their normed copies
        latent = (model.q_lora_rank or 0) + model.kv_lora_rank + model.qk_rope_head_dim
        kept["attention.latents"] = tokens * latent * e
    kept["attention.out_proj_output"] = tokens * h * e * rep
    first = 2 if model.mlp_kind == "swiglu" else 1  # of the 3 (SwiGLU) or 2 (GELU) stored
    for name in ("mlp.intermediate", "moe.expert_intermediate", "moe.shared_intermediate"):
        if name in raw:
            kept[name] = raw[name] * first / (first + 1)
    return kept


def layer_activation_tensors(
    model: ModelSpec, shape: ActivationShape, moe_layer: bool = False
) -> dict[str, float]:
    """Bytes of every tensor one layer keeps for backward on one rank, one micro-batch.

    ``selective`` drops the attention score tensors (recomputed); ``full`` keeps only the
    layer input (``2sbh``, split under SP), the checkpoint of Korthikanti et al. §4.2;
    ``dots`` keeps the projections' outputs (:func:`dots_tensors`).
    """
    if shape.recompute == "dots":
        return dots_tensors(model, shape, moe_layer)
    if shape.recompute == "full":
        return {
            "layer_input_checkpoint": shape.local_tokens
            * model.hidden_size
            * shape.element_bytes
            * shape.replicated_share
        }
    tensors = {**attention_tensors(model, shape), **mlp_tensors(model, shape, moe_layer)}
    if shape.measures.any:
        tensors = apply_memory_measures(model, shape, tensors, moe_layer)
    modules = recompute_modules(shape.recompute)
    if "core_attn" in modules:
        for name in (
            "attention.softmax_output",
            "attention.dropout_mask",
            "attention.dropout_output",
        ):
            tensors.pop(name, None)
    if modules - {"core_attn"}:
        tensors = megatron_module_tensors(model, shape, tensors, moe_layer, modules)
    return tensors


def megatron_module_tensors(
    model: ModelSpec, shape: ActivationShape, tensors: dict[str, float], moe_layer: bool,
    modules: frozenset[str],
) -> dict[str, float]:  # fmt: skip
    """The layer's stored tensors less what Megatron-Core's selective ``modules`` rerun
    (:mod:`planner.spec.recompute`; ``megatron/core/transformer/transformer_layer.py`` and
    ``moe/experts.py``). ``layernorm``, ``mla_up_proj`` and ``moe_act`` checkpoint without
    their output (``CheckpointWithoutOutput``: the output's storage is freed once the next
    module has read it, FP8 copies included since Megatron-Core 0.14); ``mlp`` and
    ``shared_experts`` checkpoint their module, whose input the layer keeps anyway:

    * ``layernorm``: the norm outputs feeding the QKV (or MLA down) projections and the MLP;
    * ``mla_up_proj``: MLA's up-projected queries, keys and values (its latents stay);
    * ``moe_act``: the routed experts' activation output (what the down projection saves);
    * ``mlp`` (dense layers): the MLP's intermediates and its input, which TransformerEngine's
      fused ``LayerNormLinear`` saves inside the checkpointed module (the residual stream,
      ``mlp.norm_input``, is the checkpoint's input);
    * ``shared_experts`` (MoE layers): the shared experts' intermediates."""
    out = dict(tensors)
    if "layernorm" in modules:
        out.pop("attention.qkv_input", None)
        out.pop("mlp.up_input", None)
    if "mla_up_proj" in modules and model.attention_kind == "mla":
        out.pop("attention.query", None)
        out.pop("attention.key_value", None)
    if "moe_act" in modules and moe_layer and "moe.expert_intermediate" in out:
        out["moe.expert_intermediate"] *= 1 - _activation_output_share(model, shape)
    if "mlp" in modules and not moe_layer:
        out.pop("mlp.intermediate", None)
        out.pop("mlp.up_input", None)
    if "shared_experts" in modules and moe_layer:
        out.pop("moe.shared_intermediate", None)
    return out


def _activation_output_share(model: ModelSpec, shape: ActivationShape) -> float:
    """The share of the routed experts' stored intermediates that is the activation's
    output: one of the 3 (SwiGLU: gate, up, product) or 2 (GELU) widths at 16 bits, its
    one-byte copy under TransformerEngine's FP8 caches, none where DeepSeek-V3's cached
    SwiGLU inputs already leave it out (:func:`apply_memory_measures`)."""
    stored = 3 if model.mlp_kind == "swiglu" else 2
    measures = shape.measures
    if measures.swiglu_input_cached:
        return 0.0
    if measures.te_fp8_linear_inputs:
        output = FP8_BYTES / shape.element_bytes
        return output / (stored - 1 + output)
    return 1.0 / stored


def apply_memory_measures(
    model: ModelSpec, shape: ActivationShape, tensors: dict[str, float], moe_layer: bool
) -> dict[str, float]:
    """The layer's stored tensors under DeepSeek-V3's measures (:mod:`planner.spec.measures`),
    or TransformerEngine's FP8 input caches (:func:`te_fp8_linear_inputs`).

    * Recomputed norms and MLA up-projections (arXiv 2412.19437 §3.2.3): the norm outputs
      (``qkv_input``, ``up_input``) go; MLA keeps only its down-projected latents (the
      inputs of their norms, ``(q_rank + kv_rank + rope)`` per token) and drops the
      up-projected queries, keys and values.
    * FP8 Linear inputs (§3.3.3): the routed experts' input (the FP8-dispatched tokens) and
      the dense MLP's down-projection input are kept in FP8, the attention output (input
      of the output projection, also read by attention's backward) in E5M6; norm outputs
      still stored are FP8 too.
    * Cached SwiGLU inputs (§3.3.3): routed and shared experts keep their gate and up
      outputs in FP8 and recompute the product; the experts' weighted outputs are not kept.
    * Routing probabilities inside the experts' activation (Megatron-Core from 0.13,
      ``probs_in_expert_activation``): the experts' outputs are not kept either.
    """
    measures, e = shape.measures, shape.element_bytes
    out = dict(tensors)
    if measures.recompute_norms_and_mla_up_proj:  # Megatron-Core's layernorm and mla_up_proj
        out = megatron_module_tensors(model, shape, out, moe_layer, measures.recomputed_modules)
        if model.attention_kind == "mla":  # and the latents' own norms: their inputs only
            latent = (model.q_lora_rank or 0) + model.kv_lora_rank + model.qk_rope_head_dim
            out["attention.latents"] = shape.local_tokens * latent * e
    if measures.fp8_linear_inputs:
        for name in ("attention.qkv_input", "mlp.up_input", "moe.expert_input"):
            if name in out:
                out[name] *= FP8_BYTES / e
        out["attention.out_proj_input"] *= E5M6_BYTES / e
        if "mlp.intermediate" in out:  # SwiGLU: gate, up (BF16) + product (FP8); GELU: in + out
            stored = 3 if model.mlp_kind == "swiglu" else 2
            per_width = out["mlp.intermediate"] / stored
            out["mlp.intermediate"] = per_width * (stored - 1 + FP8_BYTES / e)
    elif measures.te_fp8_linear_inputs:  # DeepSeek-V3's FP8 caches include these
        out = te_fp8_linear_inputs(model, out, e)
    if measures.swiglu_input_cached and moe_layer:
        stored = 3 if model.mlp_kind == "swiglu" else 2
        for name in ("moe.expert_intermediate", "moe.shared_intermediate"):
            if name in out:  # keep the activation's inputs (stored − 1 of them) in FP8
                out[name] *= (stored - 1) / stored * FP8_BYTES / e
    if moe_layer and (measures.swiglu_input_cached or measures.probs_in_expert_activation):
        out.pop("moe.expert_output", None)
    return out


def te_fp8_linear_inputs(model: ModelSpec, tensors: dict[str, float], e: float) -> dict:
    """The layer's tensors with TransformerEngine's FP8 Linear inputs
    (:attr:`planner.spec.measures.MemoryMeasures.te_fp8_linear_inputs`): the norm outputs
    feeding the QKV and MLP projections and the routed experts' tokens are kept in FP8
    instead; the product the activation hands the down projection too (the activation's
    own inputs stay 16-bit, saved by the activation function); the attention output gains
    an FP8 copy beside the one the fused attention keeps."""
    out = dict(tensors)
    for name in ("attention.qkv_input", "mlp.up_input", "moe.expert_input"):
        if name in out:
            out[name] *= FP8_BYTES / e
    if "attention.out_proj_input" in out:
        out["attention.out_proj_input"] *= (e + FP8_BYTES) / e
    stored = 3 if model.mlp_kind == "swiglu" else 2
    for name in ("mlp.intermediate", "moe.expert_intermediate", "moe.shared_intermediate"):
        if name in out:  # the activation's inputs (stored − 1) stay; its output in FP8
            out[name] *= (stored - 1 + FP8_BYTES / e) / stored
    return out


def activation_bytes_per_layer(
    model: ModelSpec, shape: ActivationShape, moe_layer: bool = False
) -> float:
    """Total bytes one layer keeps for backward on one rank for one micro-batch."""
    return math.fsum(layer_activation_tensors(model, shape, moe_layer).values())


def recompute_working_bytes(model: ModelSpec, shape: ActivationShape, moe_layer: bool) -> float:
    """Under full recomputation, one layer's activations are rebuilt during its backward."""
    if shape.recompute != "full":
        return 0.0
    whole = shape.model_copy(update={"recompute": "none"})
    return activation_bytes_per_layer(model, whole, moe_layer)


def rebuilt_layer_bytes(model: ModelSpec, shape: ActivationShape) -> float:
    """The larger of a dense and a MoE layer rebuilt during its backward under full
    recomputation (:func:`recompute_working_bytes`): the one a rank holds at its peak."""
    return max(
        recompute_working_bytes(model, shape, False),
        recompute_working_bytes(model, shape, True) if model.is_moe else 0.0,
    )


def backward_working_bytes(model: ModelSpec, shape: ActivationShape) -> float:
    """Activation gradients alive together at the peak of one layer's backward (bytes).

    Autograd frees a node's saved tensors only after the node has produced its input
    gradients, so the largest node's gradients exist on top of the stored activations.
    That node is the MLP activation: a fused SwiGLU backward (Megatron-LM's
    ``bias_swiglu_back``) holds the incoming gradient of ``[s·b, f]`` and writes the
    gradients of its two inputs (gate and up), ``3·s·b·f/tp`` elements; GELU holds the
    incoming gradient and writes one, ``2·s·b·f/tp``. An MoE layer's experts see ``k``
    copies of each token (balanced routing). Not part of Korthikanti et al.'s stored
    activations (§4.1), which count what is saved for backward, not what backward makes.
    """
    tokens, e, t = shape.local_tokens, shape.element_bytes, shape.tp
    per_token = 3 if model.mlp_kind == "swiglu" else 2
    widest = model.ffn_hidden_size
    if model.is_moe:
        routed = model.num_experts_per_token * model.routed_load_factor(shape.ep)
        routed *= model.moe_ffn_hidden_size or 0
        dense = model.ffn_hidden_size if model.num_dense_layers else 0
        widest = max(dense, routed, model.num_shared_experts * (model.moe_ffn_hidden_size or 0))
    return tokens * per_token * widest * e / t


def layer_working_beside_logits(layer_working, logits_bytes, holds_head):
    """The working bytes of one layer's backward a rank adds on top of its logits buffers
    (numpy-friendly): ``layer_working`` is what lives only inside a layer's backward, the
    layer rebuilt by recomputation (:func:`recompute_working_bytes`, and the adapters' rebuilt
    tensors and dequantized weights) plus the activation gradients at the backward's peak
    (:func:`backward_working_bytes`).

    The loss turn (logits, FP32 probabilities and their gradient, :func:`logits_buffer_bytes`)
    ends before the last layer's backward starts: autograd frees the cross-entropy's saved
    tensors when its backward has run and the logits' gradient once the LM head's backward
    has consumed it, and only then does the last layer rebuild its activations (torch's
    MemTracker on a checkpointed model: ``tests/validate/test_recompute_memory.py``). So on
    the rank holding the head only the larger of the two is alive at the peak,
    ``max(layer_working, logits) − logits`` on top of the logits there, the whole working
    set elsewhere.
    """
    return layer_working - holds_head * np.minimum(layer_working, logits_bytes)


def first_stage_tensors(model: ModelSpec, shape: ActivationShape) -> dict[str, float]:
    """Embedding-side tensors: only a dropout mask (the lookup's backward needs token ids)."""
    if model.dropout <= 0:
        return {}
    tokens = shape.local_tokens
    return {
        "embedding.dropout_mask": tokens
        * model.hidden_size
        * DROPOUT_MASK_BYTES
        * shape.replicated_share
    }


def last_stage_tensors(model: ModelSpec, shape: ActivationShape) -> dict[str, float]:
    """Per-micro-batch tensors of the final norm and the LM head input, and of the MTP
    modules (DeepSeek-V3 §2.2, on the last stage): per module the inputs of its two norms
    and of its ``2h → h`` projection, one layer's tensors, and its own head's norm and input."""
    tokens, e, h = shape.local_tokens, shape.element_bytes, model.hidden_size
    tensors = {
        "final_norm.input": tokens * h * e * shape.replicated_share,
        "lm_head.input": tokens * h * e * shape.replicated_share,
    }
    if model.num_mtp_modules:
        per_module = tokens * h * e * (2 + 2 + 2) * shape.replicated_share
        per_module += activation_bytes_per_layer(model, shape, model.is_moe)
        tensors["mtp.modules"] = model.num_mtp_modules * per_module
    return tensors


def logits_buffer_bytes(
    model: ModelSpec, shape: ActivationShape, cross_entropy: str = "unfused"
) -> float:
    """Logits, the FP32 softmax the cross-entropy keeps, and the logits' gradient.

    Vocabulary split over TP; one micro-batch at the turn from forward to backward, where
    the logits (activation dtype), the FP32 probabilities and the gradient of the logits
    (activation dtype) are alive together. With 128K-token vocabularies this is large:
    s·b·V·(2 + 4 + 2)/tp bytes in 16-bit training. A ``fused`` cross-entropy keeps no FP32
    probabilities: FlashAttention's ``CrossEntropyLoss`` (Dao-AILab/flash-attention
    ``flash_attn/losses/cross_entropy.py``) saves one FP32 log-sum-exp per token and writes
    the gradient in the logits' dtype, s·b·V·(2 + 2)/tp bytes.
    """
    per_element = logits_bytes_per_element(shape.element_bytes, cross_entropy)
    return shape.local_tokens * model.vocab_size * per_element / shape.tp


def logits_bytes_per_element(element_bytes: float, cross_entropy: str = "unfused") -> float:
    """Bytes alive per logit at the loss (:func:`logits_buffer_bytes`): the logits and their
    gradient in the activation dtype, and unfused the FP32 probabilities."""
    return 2 * element_bytes + (0 if cross_entropy == "fused" else 4)
