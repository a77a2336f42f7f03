"""Model states and the optimizer step of the examined pipeline ranks, for the columns model.

:func:`planner.evaluate.evaluate_columns` looks at a few ranks ("slots") of each pipeline
structure. What those ranks hold depends only on the structure (tp, ep, pp, vpp, schedule,
split); the ZeRO group and stage vary per row. This module computes the per-structure part
once per distinct rank (slots of different structures often hold the same) and leaves the
per-row part as column arithmetic:

* **A recipe's model states** (:func:`planner.cost.adapters.rank_state_bytes`) are, part
  by part, ``fixed + dense / d + expert / x`` with ``d`` and ``x`` the ZeRO divisors of
  the dense and expert states: the function is affine in ``1/d`` and ``1/x``, so three
  probes — every divisor infinite, only the dense ones 1, only the expert ones 1 — recover
  the three terms (``fixed`` is VeRA's shared projections, whole on every rank).
* **The optimizer step** (:func:`planner.cost.optimizers.optimizer_step_cost` on the rank's
  trainable parameters, unsharded): full training updates every parameter, an adapter
  recipe only the adapters (in their own dtypes). Muon's matrices are the rank's local
  (TP/EP-split) weight matrices, or the adapters' A and B. The per-row ZeRO share and Muon's
  gather follow :func:`planner.cost.optimizers.muon_distribution`, the times
  :func:`planner.cost.optimizers.optimizer_step_time`'s roofline.
"""

from __future__ import annotations

import math

import numpy as np

from planner.cost import adapters as ft
from planner.cost.optimizers import muon_distribution, optimizer_step_cost
from planner.spec.finetune import FinetuneSpec, layer_adapter_params, targeted_linears
from planner.spec.job import Job
from planner.spec.precision import BytesPerParam, PrecisionSpec, zero_shard_factors
from planner.structure.linears import layer_linears

STATE_PARTS = ("weights", "gradients", "master_weights", "optimizer_states")
#: The first ZeRO stage that shards each part (Rajbhandari et al. 2020, §5).
FIRST_SHARDED_STAGE = {"weights": 3, "gradients": 2, "master_weights": 1, "optimizer_states": 1}
#: Precision recipe whose weight dtype is the adapter dtype (its gradient dtype is set too).
ADAPTER_PRECISION = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16-mixed"}
#: Bytes per element of the matrices Muon gathers (BF16, the dtype Newton–Schulz runs in).
MUON_GATHER_BYTES = 2.0

_KEPT_WHOLE = zero_shard_factors(0, 1)
_DROPPED = BytesPerParam(
    weights=math.inf, gradients=math.inf, master_weights=math.inf, optimizer_states=math.inf
)


def adapter_precision(precision: PrecisionSpec, spec: FinetuneSpec) -> PrecisionSpec:
    """The dtypes an adapter update touches: adapter weights and gradients, the adapter
    master (none by default) and the job's optimizer-state dtype."""
    dtype = spec.adapter_weight_dtype
    return PrecisionSpec(
        recipe=ADAPTER_PRECISION[dtype],
        optimizer=precision.optimizer,
        grad_dtype=dtype,
        master_dtype=spec.adapter_master_dtype,
        optimizer_state_dtype=precision.state_dtype,
    )


def _trainable(
    job: Job,
    params: tuple[float, float],
    layers: tuple[float, float],
    tp: int,
    ep: int,
    etp: int | None = None,
):
    """(trainable parameters, the routed experts' among them, Muon matrices (rows, cols,
    count), update precision) of a rank holding ``params`` (dense, expert); routed experts
    split by ``etp`` (None: tp)."""
    model, spec = job.model, job.finetune
    shapes: list[tuple[float, float, float]] = []
    muon = job.precision.optimizer == "muon"
    if spec is None or not spec.trains_adapters:
        for moe_layer, num_layers in zip((False, True), layers, strict=True):
            if not (muon and num_layers):
                continue
            for linear in layer_linears(model, moe_layer, tp):
                width_in, width_out = linear.local_shape(tp, etp)
                shapes.append((width_out, width_in, num_layers * linear.local_count(ep)))
        return sum(params), params[1], shapes, job.precision
    adapters = expert_adapters = 0.0
    for moe_layer, num_layers in zip((False, True), layers, strict=True):
        if not num_layers:
            continue
        dense_part, expert_part = layer_adapter_params(model, spec, moe_layer, tp, ep, etp)
        adapters += num_layers * (dense_part + expert_part)
        expert_adapters += num_layers * expert_part
        if not muon or spec.recipe == "vera":  # VeRA trains vectors d and b: AdamW under Muon
            continue
        r = spec.lora_rank
        for linear in targeted_linears(model, spec, moe_layer, tp):
            width_in, width_out = linear.local_shape(tp, etp)
            copies = num_layers * linear.local_count(ep)
            shapes += [(r, width_in, copies), (width_out, r, copies)]
    return adapters, expert_adapters, shapes, adapter_precision(job.precision, spec)


def slot_states(
    job: Job,
    tp: np.ndarray,
    ep: np.ndarray,
    dense_params: np.ndarray,
    expert_params: np.ndarray,
    dense_layers: np.ndarray,
    moe_layers: np.ndarray,
    etp: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Per examined rank ([structure, slot] arrays, ``tp``, ``ep`` and ``etp`` per structure, layers
    counted in both directions for DualPipe): the optimizer's unsharded cost and, under an
    adapter recipe, the state terms. Each distinct rank is worked out once."""
    tuned = job.finetune if job.finetune is not None and job.finetune.trains_adapters else None
    keys = ["optimizer_bytes", "optimizer_expert_bytes", "newton_schulz_flops",
            "newton_schulz_bytes", "muon_params"]  # fmt: skip
    if tuned:
        keys += [f"{part}_{term}" for part in STATE_PARTS for term in ("fixed", "dense", "expert")]
    shape = np.shape(dense_params)
    etp = np.asarray(tp if etp is None else etp)
    ranks = np.stack(
        [
            *np.broadcast_arrays(
                np.asarray(tp)[:, None], np.asarray(ep)[:, None], etp[:, None], dense_params
            ),
            expert_params,
            dense_layers,
            moe_layers,
        ],
        axis=-1,
    ).reshape(-1, 7)
    index: dict[tuple, int] = {}  # each distinct rank's row in ``values``
    inverse = np.array([index.setdefault(rank, len(index)) for rank in map(tuple, ranks.tolist())])
    values = [
        _rank_states(job, tuned, int(t), int(x), *rank[1:], etp=int(rank[0]))
        for t, x, *rank in index
    ]
    inverse = inverse.reshape(shape)
    return {key: np.array([value[key] for value in values])[inverse] for key in keys}


def _rank_states(
    job, tuned, tp, ep, dense, expert, dense_layers, moe_layers, etp=None
) -> dict[str, float]:
    layers = (float(dense_layers), float(moe_layers))
    etp = None if etp == tp else etp
    params, expert_params, shapes, precision = _trainable(job, (dense, expert), layers, tp, ep, etp)
    muon = precision.optimizer == "muon"
    matrices = math.fsum(r * c * n for r, c, n in shapes) if muon else 0.0
    # max(): the matrices are the rank's parameters summed another way (rounding only).
    cost = optimizer_step_cost(precision, max(params, matrices), shapes if muon else ())
    values = {
        "optimizer_bytes": cost.bytes_moved,
        # The routed experts' part, by parameter count (exact for AdamW, whose bytes per
        # parameter are uniform): ZeRO shards it over the dp·cp·(tp/etp)/ep ranks, not dp·cp.
        "optimizer_expert_bytes": cost.bytes_moved * expert_params / params if params else 0.0,
        "newton_schulz_flops": cost.newton_schulz_flops,
        "newton_schulz_bytes": cost.newton_schulz_bytes,
        "muon_params": cost.muon_params_per_gpu,
    }
    if tuned:

        def probe(dense_shard, expert_shard) -> dict[str, float]:
            states = ft.rank_state_bytes(
                job.model, tuned, job.precision, (dense, expert), layers, tp, ep,
                (dense_shard, expert_shard), etp=etp,
            )  # fmt: skip
            return states.memory_parts()

        fixed = probe(_DROPPED, _DROPPED)
        only_dense, only_expert = probe(_KEPT_WHOLE, _DROPPED), probe(_DROPPED, _KEPT_WHOLE)
        for part in STATE_PARTS:
            values[f"{part}_fixed"] = fixed[part]
            values[f"{part}_dense"] = only_dense[part] - fixed[part]
            values[f"{part}_expert"] = only_expert[part] - fixed[part]
    return values


def optimizer_columns(
    slots: dict[str, np.ndarray],
    zero: np.ndarray,
    zero_group: np.ndarray,
    hbm_bytes_per_s: float,
    matmul_flops_per_s: float,
    comm_bytes_per_s: np.ndarray,
    muon_scheme: str = "gather",
    dispatch_s: np.ndarray | float = 0.0,
    expert_group: np.ndarray | int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(update seconds, Muon gather seconds) per row, for the slot whose step is longest.

    Under ZeRO ≥ 1 a rank updates its ``1/(dp·cp)`` slice of the dense parameters and its
    ``1/expert_group`` slice of the routed experts' (the expert-data-parallel group,
    :func:`planner.spec.layout.expert_data_parallel_size`, as the memory model shards them;
    default: dp·cp); Muon's Newton–Schulz share and gathered bytes follow
    :func:`planner.cost.optimizers.muon_distribution` over the dp·cp group. ``dispatch_s`` (per
    slot): the step's fixed per-operation cost, whatever the shard.
    """
    share = np.where(zero >= 1, 1.0 / zero_group, 1.0)
    expert_group = zero_group if expert_group is None else np.asarray(expert_group)
    expert_share = np.where(zero >= 1, 1.0 / expert_group, 1.0)
    comm_factor, ns_share = np.zeros(len(zero)), np.ones(len(zero))
    if slots["muon_params"].any():
        pairs, inverse = np.unique(np.stack([zero_group, zero]), axis=1, return_inverse=True)
        found = np.array([muon_distribution(int(g), int(z), muon_scheme) for g, z in pairs.T])
        comm_factor, ns_share = found[inverse.reshape(-1)].T
    expert_bytes = slots["optimizer_expert_bytes"]
    elementwise = (
        (slots["optimizer_bytes"] - expert_bytes) * share[:, None]
        + expert_bytes * expert_share[:, None]
    ) / hbm_bytes_per_s
    newton_schulz = ns_share[:, None] * np.maximum(
        slots["newton_schulz_flops"] / matmul_flops_per_s,
        slots["newton_schulz_bytes"] / hbm_bytes_per_s,
    )
    gathered = comm_factor[:, None] * slots["muon_params"] * MUON_GATHER_BYTES
    with np.errstate(divide="ignore", invalid="ignore"):
        comm = np.where(gathered > 0, gathered / comm_bytes_per_s[:, None], 0.0)
    update = elementwise + newton_schulz + dispatch_s
    pick = np.arange(len(zero)), np.argmax(update + comm, axis=1)
    return update[pick], comm[pick]
