"""The collectives of one training step, per parallel axis: counts, sizes and overlap rules.

Each term counts the collectives one GPU takes part in during one optimizer step, on the
pipeline rank where the term is largest ("busiest rank"), with ``m`` micro-batches of
``b`` sequences of ``s`` tokens, hidden size ``h``, activation bytes ``a``:

* **tp** (Megatron-LM, Shoeybi et al. 2019 §3; Korthikanti et al. 2022 §4.2.2): per layer per
  micro-batch, 2 all-reduces of the [b, s/cp, h] activation in forward and 2 in backward, or
  with sequence parallelism 2 all-gathers + 2 reduce-scatters each way (same bytes); full
  recompute repeats the forward ones; one more at the embedding and at the LM head; the
  SP norm-weight gradients once per step; the vocabulary-parallel cross-entropy's 3
  all-reduces of one FP32 per token per micro-batch (:func:`vocab_parallel_loss_bytes`).
  With expert tensor parallelism ``etp = 1 < tp`` (Megatron-Core's MoE parallel folding) the
  routed experts are whole and the TP ranks dispatch their own tokens through the EP
  all-to-all: an MoE layer without shared experts keeps only its attention block's half.
* **cp** (Llama 3 §3.3.2, all-gather based CP): per layer per micro-batch an all-gather of K
  and V for the whole sequence in forward (repeated under full recompute), another in
  backward (the gathered copy is not kept for backward, as TransformerEngine's
  ``AttnFuncWithCPAndKVAllGather`` does) and a reduce-scatter of their gradients; GQA keeps only ``max(1, kv_heads/tp)``
  heads per TP rank (MLA gathers its compressed latent + rotary key).
* **pp** (Narayanan et al. 2021 §4.1, scatter/gather optimisation): one send of the
  activation (÷ tp) per micro-batch per chunk forward and one gradient backward; ``vpp``
  chunks (2 for the V-shaped zbv / dualpipev) multiply the sends.
* **dp** over the dp·cp ranks holding the same dense weights (ZeRO, Rajbhandari et al. 2020
  §5, §7): stage 0 all-reduces the gradients (gradient dtype) once per step; stage 1
  reduce-scatters them once per step (Megatron's distributed optimizer accumulates in the
  full buffer); stage 2 keeps only its gradient shard, so it reduce-scatters every
  micro-batch (hidden behind the backward passes but the last); stages 1–2 all-gather the
  updated weights (weight dtype) after the step; stage 3
  (FSDP, resharded after forward) all-gathers each layer's weights in forward and again in
  backward and reduce-scatters its gradients, every micro-batch.
* **edp**: the same for routed-expert weights over dp·cp·(tp/etp)/ep ranks (MoE with ep > 1).
* **ep** (GShard / DeepSeek-V3 §3.2): per MoE layer per micro-batch, dispatch and combine
  all-to-alls of ``b·s/(cp·tp)`` tokens × top-k × h, in forward and backward (+ forward
  again under full recompute); with an FP8 recipe the forward dispatch is FP8. Under
  node-limited routing (:func:`ep_routing`) each token crosses IB once per destination
  node and is forwarded over NVLink (the ``node-limited`` all-to-all of :mod:`planner.comm.collectives`).

Message sizes follow nccl-tests (see :mod:`planner.comm.collectives`); ``bytes_per_step`` is what one
GPU sends. Raw time = count × the cheapest algorithm's time for the message on the group's
placement. **Exposed** time needs compute times (:class:`planner.comm.report.ComputeTimes`,
per micro-batch on the busiest rank); without them every term is reported fully exposed
(exposed = raw). With them: TP is exposed (with ``tp_comm_overlap`` it hides behind the m·(F+B) GEMMs); CP's
all-gather and reduce-scatter are exposed ("the all-gather communication latency is exposed
in the critical path", Llama 3 §3.3.2: attention needs the whole K and V first); PP exposes the 2·(pp·chunks − 1) fill
and drain transfers plus any steady-state excess over m·(F+B); DP gradients hide behind the
last micro-batch's backward except the last bucket (one layer); ZeRO-1/2 weight all-gathers
hide behind the next step's first forward except the first bucket; FSDP all-gathers are
prefetched behind m·(F+B) except the first, its reduce-scatters behind m·B except the
last; EP is exposed unless the schedule overlaps it (dualpipe, dualpipev: behind m·(F+B),
the all-to-alls of the F&B-paired chunks only; the warm-up forwards and drain backwards
that run alone expose theirs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.spec.job import Job
from planner.spec.layout import expert_data_parallel_size
from planner.spec.precision import DTYPE_BYTES
from planner.structure.params import busiest_rank_params
from planner.structure.stages import pipeline_rank_layers

#: Schedules that overlap one micro-batch's EP all-to-all with another's compute
#: (DeepSeek-V3 §3.2.1 DualPipe; the V form keeps the F&B overlap).
#: All-reduces of the vocabulary-parallel cross-entropy per micro-batch (max, sum-exp, target).
VOCAB_PARALLEL_LOSS_ALL_REDUCES = 3
#: Report order of the axes and the placement group each one's collectives run on.
AXIS_GROUPS: dict[str, str] = {
    "tp": "tp", "cp": "cp", "ep": "ep", "pp": "pp", "dp": "dp_cp", "edp": "edp",
}  # fmt: skip
RULES: dict[str, str] = {
    "exposed": "exposed: nothing to hide behind (hidden behind m·(F+B) with TP overlap on)",
    "cp_exposed": "exposed: attention waits for the gathered K and V (Llama 3 §3.3.2)",
    "cp_ring": "each step's transfer hidden behind the block already held, except its excess "
    "over that block's attention; plus the step's kernels, rescaling and what its short "
    "block kernel loses to its length (Liu et al. 2023; FlashAttention-3 Figs. 5-6)",
    "cp_a2a": "exposed: attention waits for its heads' whole sequence (Jacobs et al. 2023)",
    "pp_steady": "fill and drain transfers exposed; steady state hidden behind m·(F+B)",
    "dp_grad": "hidden behind the last micro-batch's backward except the last bucket (one layer)",
    "dp_param": "hidden behind the next step's first forward except the first bucket",
    "fsdp_gather": "prefetched behind m·(F+B) except the first layer's gather",
    "fsdp_grad": "hidden behind m·B except the last layer's reduce-scatter",
    "ep": "exposed unless the schedule overlaps it (dualpipe, dualpipev: the F&B-paired chunks' "
    "EP terms together behind m·(F+B), which runs on the SMs the all-to-all kernels leave; "
    "the unpaired warm-up and drain chunks' exposed)",
}
NO_COMPUTE_RULE = "no compute times given: exposed = raw"
NO_OVERLAP_RULE = (
    "the accelerator runs collectives on the cores that compute "
    "(overlaps_communication = false): exposed = raw"
)


def ep_routing(model) -> tuple[int, int, int | None] | None:
    """(top-k, max nodes (or groups) per token, expert groups) of an MoE model with
    node-limited routing, else None.

    DeepSeek-V3 §2.1.2 / §3.2.2: each token's experts lie on at most M nodes (M groups of
    the router's, :func:`planner.comm.collectives.nodes_reached`); the EP all-to-all then
    costs as :mod:`planner.comm.collectives`'s ``node-limited`` algorithm.
    """
    if not model.is_moe or model.max_nodes_per_token is None:
        return None
    return model.num_experts_per_token, model.max_nodes_per_token, model.num_expert_groups


def vocab_parallel_loss_bytes(micro_batch_size, local_tokens_per_sequence):
    """Bytes of each all-reduce of the vocabulary-parallel cross-entropy: one FP32 per token.

    Megatron-LM's ``_VocabParallelCrossEntropy`` (Shoeybi et al. 2019 §3, the output
    embedding's "fuse the output with the cross-entropy loss") and torch's ``loss_parallel``
    all-reduce over TP, in forward, the per-token max logit, the sum of exponentials and
    the target's logit: :data:`VOCAB_PARALLEL_LOSS_ALL_REDUCES` messages of ``[b, s/cp]``
    FP32 values per micro-batch. Backward is local (softmax minus one-hot).
    """
    return micro_batch_size * local_tokens_per_sequence * DTYPE_BYTES["fp32"]


@dataclass
class RankShape:
    """What the busiest pipeline rank holds, per term (parameters are elements on one TP rank)."""

    layers: np.ndarray  # most transformer layers on one rank
    moe_layers: np.ndarray  # most MoE layers on one rank
    dense_params: np.ndarray  # parameters replicated over dp·cp (all but split experts)
    expert_params: np.ndarray  # routed-expert parameters, split over ep·etp (when ep > 1)
    dense_bucket: np.ndarray  # one layer's dense parameters: the DP bucket
    expert_bucket: np.ndarray


def rank_shape(
    model, tp, pp, ep, chunks, split="auto", etp=None, v_shape=False, mirrored=False
) -> RankShape:
    """Layers per micro-batch and parameters of the busiest rank, as the memory model holds
    them (:func:`planner.structure.stages.busiest_rank_layers`,
    :func:`planner.structure.params.busiest_rank_params`: DualPipe's two copies included)."""
    table, pipeline, rows = pipeline_rank_layers(model, pp, chunks, v_shape, mirrored, split)
    moe_layers = table["moe_layers"].max(axis=-1)[pipeline].reshape(rows)
    routed = model.num_routed_experts * model.mlp_params(model.moe_ffn_hidden_size or 1)
    dense_layer = model.layer_params(moe_layer=False)
    moe_layer = model.layer_params(moe_layer=True) - routed * (ep > 1) if model.is_moe else 0
    dense_params, expert_params, all_params = busiest_rank_params(
        model, tp, pp, ep, etp, chunks, v_shape, mirrored, split
    )
    # Routed experts replicated at ep 1 reduce with the dense weights over dp·cp.
    dense_params = np.where(ep > 1, dense_params, all_params)
    has_dense = not model.is_moe or model.num_dense_layers > 0
    layer_norms = 2 * model.norm_params()
    expert_tp = tp if etp is None else etp
    return RankShape(
        layers=table["layers"].max(axis=-1)[pipeline].reshape(rows),
        moe_layers=moe_layers,
        dense_params=dense_params,
        expert_params=np.where(ep > 1, expert_params, 0.0),
        dense_bucket=(np.maximum(dense_layer * has_dense, moe_layer) - layer_norms) / tp
        + layer_norms,
        expert_bucket=routed * (ep > 1) / (ep * expert_tp),
    )


@dataclass
class Term:
    """Collectives of one kind on one axis per step: ``count`` × ``message_bytes``."""

    axis: str
    op: str
    what: str
    count: np.ndarray
    message_bytes: np.ndarray
    rule: str
    bucket_bytes: np.ndarray | float = 0.0
    #: Placement group it runs on (None: the axis's, AXIS_GROUPS); context-parallel terms
    #: run on the groups of planner.comm.context_parallel.
    group: str | None = None
    #: Ring attention: compute each transfer hides behind, and seconds each one adds.
    overlap_s: np.ndarray | float = 0.0
    extra_s: np.ndarray | float = 0.0


def step_terms(
    job: Job, tp, cp, pp, dp, ep, chunks, b, m, sp, full, zero, split="auto", v_shape=False,
    etp=None, mirrored=False, cp_algorithm=None, cp_inner=1, rates=None,
):  # fmt: skip
    """All collective terms of one step; every argument may be a numpy array (one row each).

    ``chunks``: model chunks per rank (vpp; 2 for zbv / dualpipev); ``sp``: sequence
    parallel; ``full``: 1 under full recompute; ``zero``: ZeRO stage; ``etp``: the routed
    experts' TP degree (None: tp); ``cp_algorithm``: codes of
    :data:`planner.spec.layout.CP_ALGORITHMS` (None: all-gather), ``cp_inner``: hierarchical
    CP's inner degree, ``rates``: the GPU's rates for ring attention's block compute
    (:mod:`planner.comm.context_parallel`).
    """
    from planner.comm.context_parallel import context_parallel_terms

    model, precision, s, h = job.model, job.precision, job.seq_len, job.model.hidden_size
    act_b, grad_b = precision.activation_bytes, DTYPE_BYTES[precision.gradient_dtype]
    weight_b = DTYPE_BYTES[precision.weight_dtype]
    shape = rank_shape(model, tp, pp, ep, chunks, split, etp, v_shape, mirrored)
    expert_tp = tp if etp is None else etp
    layers = shape.layers

    def on(condition):
        return np.where(condition, 1, 0)

    act = b * (s / cp) * h * act_b  # one [b, s/cp, h] activation
    # Per layer and micro-batch, of each collective type: 2 fwd + 2 bwd (+ 2 recomputed fwd).
    # The vocabulary-parallel embedding adds one on the first stage (its output summed over
    # TP: reduce-scatter under SP, all-reduce without; the gradient's all-gather under SP)
    # and the LM head one on the last (its input gathered under SP; the input gradient's
    # reduce-scatter, or all-reduce without SP). The busiest rank is the most of the three.
    # [pipeline, rank] arrays per distinct pipeline, each row's pipeline (flat)
    ranks, pipeline, rows = pipeline_rank_layers(model, pp, chunks, v_shape, mirrored, split)
    full = np.asarray(full)
    per_layer = 4 + 2 * full
    # With whole routed experts (etp < tp) and no shared experts an MoE layer keeps only the
    # attention block's collectives: each MoE layer on a rank has ``moe_saving`` fewer.
    folded = (expert_tp < tp) & (model.num_shared_experts == 0) & model.is_moe
    moe_saving = np.where(folded, 2 + full, 0)
    # Per pipeline and (per_layer, moe_saving) pair — full recompute or not, folded or
    # not: four — the busiest rank's collectives per micro-batch and its head share.
    pairs = np.array([(4 + 2 * f, (2 + f) * g) for f in (0, 1) for g in (0, 1)])
    tp_per_rank = (
        ranks["layers"][:, None] * pairs[:, :1] - ranks["moe_layers"][:, None] * pairs[:, 1:]
        + ranks["embedding"][:, None] + ranks["head"][:, None]
    )  # fmt: skip
    most = tp_per_rank.max(axis=-1)
    # The head's rank, when it is the busiest, also runs the vocabulary-parallel loss (for
    # the micro-batches that end there: half of them on each of DualPipe's ends).
    busiest = tp_per_rank >= most[..., None]
    head_most = np.where(busiest, ranks["head"][:, None], 0.0).max(axis=-1)
    pair = np.broadcast_to(2 * (per_layer > 4) + (moe_saving > 0), rows).reshape(-1)
    per_microbatch = most[pipeline, pair].reshape(rows)
    head_share = head_most[pipeline, pair].reshape(rows)
    passes = per_microbatch * m
    sp_on, sp_off = on((tp > 1) & sp), on((tp > 1) & ~np.asarray(sp))
    what_tp = "activations per layer (attention + MLP) and at the embedding / LM head, fwd + bwd"
    # Under SP the norm weights see only part of the sequence: their gradients are summed
    # over TP once per step (Megatron-LM's all-reduce of sequence-parallel norm gradients):
    # two per layer the rank holds, and the final norm with the head.
    norm_weights = (2 * ranks["held_layers"] + ranks["held_head"]).max(axis=-1)
    norms = norm_weights[pipeline].reshape(rows) * model.norm_params() * grad_b
    loss_calls = m * VOCAB_PARALLEL_LOSS_ALL_REDUCES * on(tp > 1) * head_share
    terms = [
        Term("tp", "all-reduce", what_tp, passes * sp_off, act, "exposed"),
        Term("tp", "all-gather", "sequence-parallel " + what_tp, passes * sp_on, act, "exposed"),
        Term("tp", "reduce-scatter", "sequence-parallel " + what_tp, passes * sp_on, act,
             "exposed"),
        Term("tp", "all-reduce", "sequence-parallel norm weight gradients", sp_on, norms,
             "exposed"),
        Term("tp", "all-reduce", "vocabulary-parallel cross-entropy: max logit, sum of exp, "
             "target logit", loss_calls, vocab_parallel_loss_bytes(b, s / cp), "exposed"),
    ]  # fmt: skip
    if model.attention_kind == "mla":
        kv_token = (model.kv_lora_rank + model.qk_rope_head_dim) * act_b + 0 * tp
    else:
        kv_token = 2 * np.maximum(model.num_kv_heads // tp, 1) * model.head_dim * act_b
    kv = b * s * kv_token  # K and V of the whole sequence
    # Busiest rank's sends per step (forward activations + backward gradients). With two
    # ranks an interleaved pipeline's last chunk still sends back to rank 0, but a V's
    # bottom hop stays on rank 1 (ZB-V, DualPipeV), so each rank sends one each way.
    two_ranks = np.where(v_shape, 2 * m, m * (2 * chunks - 1))
    sends = np.where(pp >= 3, 2 * m * chunks, np.where(pp == 2, two_ranks, 0))
    all_gather = True if cp_algorithm is None else np.asarray(cp_algorithm) == 0
    gathers = on((cp > 1) & all_gather)  # the all-gather form (the other algorithms below)
    terms += [
        Term("cp", "all-gather", "K and V, whole sequence, per layer, fwd + bwd",
             layers * m * (2 + full) * gathers, kv, "cp_exposed"),
        Term("cp", "reduce-scatter", "K and V gradients per layer", layers * m * gathers, kv,
             "cp_exposed"),
        Term("pp", "p2p", "activations forward, gradients backward", sends, act / tp,
             "pp_steady"),
    ]  # fmt: skip
    if cp_algorithm is not None:
        terms += context_parallel_terms(
            job, tp, cp, b, m, layers, full, cp_algorithm, cp_inner, rates
        )
    if model.is_moe:
        # The busiest rank's receive (ModelSpec.routed_load_factor) gates each all-to-all.
        load = model.routed_load_factor(ep)
        routed_tokens = b * s / (cp * tp) * model.num_experts_per_token * load * h
        dispatch_b = DTYPE_BYTES["fp8"] if precision.gemm_dtype == "fp8" else act_b
        per_layer = shape.moe_layers * m * on(ep > 1)
        terms += [
            Term("ep", "all-to-all", "token dispatch, forward", per_layer * (1 + full),
                 routed_tokens * dispatch_b, "ep"),
            Term("ep", "all-to-all", "combine fwd; dispatch and combine bwd",
                 per_layer * (3 + full), routed_tokens * act_b, "ep"),
        ]  # fmt: skip
    groups = [("dp", shape.dense_params, shape.dense_bucket, dp * cp)]
    if model.is_moe:
        edp = expert_data_parallel_size(dp, cp, tp, ep, expert_tp)
        groups.append(("edp", shape.expert_params, shape.expert_bucket, edp))
    units = np.maximum(layers, 1)  # FSDP wraps each transformer layer
    trained = trainable_adapter_params(job, tp, ep, shape, etp)
    for axis, params, bucket, size in groups:
        live = on((size > 1) & (params > 0))
        zero1, zero2, fsdp = (on(zero == stage) * live for stage in (1, 2, 3))
        grads, weights = params * grad_b, params * weight_b
        gathered = weights  # ZeRO-3 gathers every weight, frozen or not
        if trained is not None:  # only the adapters have gradients and updates
            adapter_b = DTYPE_BYTES[job.finetune.adapter_weight_dtype]
            grads = weights = trained[axis] * adapter_b
            bucket = bucket * 0 + trained[axis] / np.maximum(units, 1)
            grad_b = weight_b = adapter_b
        terms += [
            Term(axis, "all-reduce", "gradients (ZeRO-0)", on(zero == 0) * live, grads,
                 "dp_grad", bucket * grad_b),
            Term(axis, "reduce-scatter", "gradients once per step (ZeRO-1)", zero1, grads,
                 "dp_grad", bucket * grad_b),
            Term(axis, "reduce-scatter", "gradients every micro-batch (ZeRO-2)", m * zero2,
                 grads, "fsdp_grad"),
            Term(axis, "all-gather", "updated weights (ZeRO-1/2)", zero1 + zero2, weights,
                 "dp_param", bucket * weight_b),
            Term(axis, "all-gather", "weights per layer, fwd + bwd (ZeRO-3)",
                 2 * m * units * fsdp, gathered / units, "fsdp_gather"),
            Term(axis, "reduce-scatter", "gradients per layer (ZeRO-3)", m * units * fsdp,
                 grads / units, "fsdp_grad"),
        ]  # fmt: skip
    return terms


def trainable_adapter_params(job: Job, tp, ep, shape: RankShape, etp=None) -> dict | None:
    """Adapter parameters the busiest rank synchronizes over dp (dense) and edp (experts).

    None for full training. A fine-tuning recipe (LoRA, QLoRA, DoRA, VeRA) reduces and
    updates only its adapters; the frozen base has no gradients to exchange.
    """
    spec = job.finetune
    if spec is None or not spec.trains_adapters:
        return None
    from planner.spec.finetune import layer_adapter_params

    tp, ep, etp = np.broadcast_arrays(np.asarray(tp), np.asarray(ep), np.asarray(
        tp if etp is None else etp))  # fmt: skip
    pairs, inverse = np.unique(
        np.stack([tp.ravel(), ep.ravel(), etp.ravel()], axis=-1), axis=0, return_inverse=True
    )
    table = np.array([  # per distinct (tp, ep, etp): dense- and MoE-layer (dense, expert) adapters
        [*layer_adapter_params(job.model, spec, False, int(t), int(e)),
         *(layer_adapter_params(job.model, spec, True, int(t), int(e), int(x))
           if job.model.is_moe else (0.0, 0.0))]
        for t, e, x in pairs
    ])  # fmt: skip
    rows = table[inverse.reshape(-1)].reshape(*tp.shape, 4)
    dense_layers = shape.layers - shape.moe_layers

    def lookup(index: int, part: int) -> np.ndarray:
        return rows[..., 2 * index + part]

    dense = dense_layers * lookup(0, 0) + shape.moe_layers * lookup(1, 0)
    expert = shape.moe_layers * lookup(1, 1)
    return {"dp": dense, "edp": expert}
