"""One parallel layout, validated once.

The same :class:`Layout` is costed by the planner, printed by the CLI and launched by the
validator. Axes are ``tp`` (tensor), ``cp`` (context), ``pp`` (pipeline), ``dp`` (data) and
``ep`` (expert, carved out of the ``dp·cp`` ranks, and of ``tp`` too when ``etp = 1``);
``tp·cp·pp·dp`` is the GPU count. Its invariants against a model and job are checked in
:func:`check_layout`, with messages that name both numbers.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from hwspecs.errors import PlanError
from planner.pipeline.schedules.registry import V_SHAPE_SCHEDULES
from planner.spec.pipeline_layout import is_layout_notation, layout_layers, layout_stages
from planner.spec.recompute import checked_recompute

#: A recomputation policy (planner.spec.recompute): a whole-layer one or Megatron-Core modules.
RecomputeName = Annotated[str, AfterValidator(checked_recompute)]
#: The named layer splits (:func:`layers_per_virtual_stage`).
LAYER_SPLITS: tuple[str, ...] = ("auto", "even", "first-last-fewer", "balanced", "work-balanced")


def checked_layer_split(split: str) -> str:
    """A named split, or a layout in Megatron-Core's notation (its stage count and layers are
    checked against each layout: :func:`planner.spec.pipeline_layout.layout_layers`)."""
    if split in LAYER_SPLITS:
        return split
    if not is_layout_notation(split):
        raise PlanError(
            f"pipeline_layer_split '{split}' unknown; choose one of: {', '.join(LAYER_SPLITS)}, "
            f"or a layout in Megatron-Core's notation, e.g. 'Et*4|(t*4|)*14tmL'"
        )
    layout_stages(split)  # its repeats unroll
    return split


#: How a pipeline's layers split over its stages: a named rule or a written layout.
LayerSplit = Annotated[str, AfterValidator(checked_layer_split)]
#: Context-parallel algorithms (planner.comm.context_parallel): Llama 3's K/V all-gather,
#: ring attention, DeepSpeed-Ulysses all-to-all, Ulysses inside the scale-up domain with a
#: ring across (Megatron-Core's ``a2a+p2p``).
CpAlgorithm = Literal["all-gather", "ring", "ulysses", "hierarchical"]
CP_ALGORITHMS: tuple[str, ...] = ("all-gather", "ring", "ulysses", "hierarchical")


class MeshAxis(StrEnum):
    """An axis of the device mesh; the members compare and hash as their lower-case names."""

    TP = "tp"  # tensor: each layer's matrices split (Megatron-LM)
    CP = "cp"  # context: the sequence split
    EP = "ep"  # expert: routed experts spread, carved out of dp·cp (and tp under etp 1)
    PP = "pp"  # pipeline: layers in stages
    DP = "dp"  # data: replicas (sharded under ZeRO/FSDP)


#: Mesh axes, innermost first, as Llama 3 orders them ([TP, CP, PP, DP]) with EP inside DP.
DEFAULT_MESH_ORDER: tuple[MeshAxis, ...] = (
    MeshAxis.TP, MeshAxis.CP, MeshAxis.EP, MeshAxis.PP, MeshAxis.DP
)  # fmt: skip


class Layout(BaseModel):
    """Degrees of parallelism and the per-layout training knobs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tp: int = Field(1, ge=1)
    cp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    ep: int = Field(
        1, ge=1, description="expert parallel; divides dp·cp (ep/tp of it does under etp 1)"
    )
    etp: int | None = Field(
        None,
        ge=1,
        description="expert tensor parallel (Megatron-Core --expert-tensor-parallel-size): "
        "1 or tp; None means tp. With 1 the routed experts are whole on every rank and the "
        "TP ranks fold into the EP group (MoE parallel folding)",
    )
    cp_algorithm: CpAlgorithm = Field(
        "all-gather",
        description="how CP ranks exchange K and V: 'all-gather' (Llama 3 §3.3.2), 'ring' "
        "(ring attention, Liu et al. 2023), 'ulysses' (all-to-all, Jacobs et al. 2023), "
        "'hierarchical' (Ulysses over the CP ranks in one scale-up domain, ring across "
        "domains: Megatron-Core's a2a+p2p)",
    )
    cp_inner: int | None = Field(
        None,
        ge=1,
        description="hierarchical CP: the Ulysses (all-to-all) degree inside, a ring over "
        "cp/cp_inner groups outside (Megatron-Core --hierarchical-context-parallel-sizes "
        "[cp_inner, cp/cp_inner]); divides cp; None: the CP ranks in one scale-up domain",
    )
    vpp: int = Field(1, ge=1, description="virtual pipeline stages (chunks) per rank")
    micro_batch_size: int = Field(1, ge=1, description="sequences per micro-batch")
    num_microbatches: int | None = Field(
        None, ge=1, description="micro-batches per step per pipeline; default from the batch"
    )
    schedule: str = "1f1b"
    zero_stage: int = Field(1, ge=0, le=3)
    sequence_parallel: bool = True
    recompute: RecomputeName = "none"
    pipeline_layer_split: LayerSplit = Field(
        "auto",
        description="'first-last-fewer': one layer fewer on the first and last stage "
        "(Llama 3 §3.3.2); 'balanced': stage sizes differ by at most one, the extra layers "
        "on the middle stages; 'auto' picks 'even', else 'first-last-fewer', else 'balanced'; "
        "'work-balanced': the first and last stage's layers chosen so that the busiest rank, "
        "the LM head and MTP modules counted, does the least work (Megatron-LM's "
        "--decoder-first/last-pipeline-num-layers)",
    )

    @model_validator(mode="after")
    def _cp_inner_divides_cp(self) -> Layout:
        if self.cp_inner is None:
            return self
        if self.cp_algorithm != "hierarchical":
            raise ValueError(
                f"cp_inner {self.cp_inner} is the inner degree of cp_algorithm hierarchical, "
                f"not of {self.cp_algorithm} (leave it unset)"
            )
        if self.cp % self.cp_inner:
            raise ValueError(f"cp_inner {self.cp_inner} does not divide cp {self.cp}")
        return self

    @property
    def num_gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def expert_tp(self) -> int:
        """Tensor-parallel degree of the routed experts: ``etp``, or ``tp`` when not given."""
        return self.tp if self.etp is None else self.etp

    @property
    def expert_zero_group_size(self) -> int:
        """Ranks over which ZeRO shards routed-expert states: the expert-data-parallel group."""
        return int(expert_data_parallel_size(self.dp, self.cp, self.tp, self.ep, self.expert_tp))

    @property
    def zero_group_size(self) -> int:
        """Ranks over which ZeRO shards dense model states (:func:`zero_group_size`)."""
        return zero_group_size(self.dp, self.cp)

    def resolved_num_microbatches(self, global_batch_size: int | None) -> int:
        """Micro-batches per step from the global batch (sequences), or the explicit count."""
        if self.num_microbatches is not None:
            return self.num_microbatches
        if global_batch_size is None:
            return self.pp * self.vpp if self.vpp > 1 else self.pp
        per_replica = self.dp * self.micro_batch_size
        if global_batch_size % per_replica:
            raise PlanError(
                f"global batch of {global_batch_size} sequences is not divisible by "
                f"dp {self.dp} × micro_batch_size {self.micro_batch_size}"
            )
        return global_batch_size // per_replica


def cp_algorithm_codes(column, shape) -> np.ndarray:
    """Each row's index in :data:`CP_ALGORITHMS` (strings, Labels or codes; None: all-gather)."""
    if column is None:
        return np.zeros(shape, dtype=np.int64)
    values = getattr(column, "values", None)
    if values is not None:  # Labels
        lookup = np.array([CP_ALGORITHMS.index(str(v)) for v in values], dtype=np.int64)
        return np.broadcast_to(lookup[column.codes], shape)
    array = np.asarray(column)
    if array.dtype.kind in "iu":
        return np.broadcast_to(array.astype(np.int64), shape)
    names, inverse = np.unique(array.astype(str).ravel(), return_inverse=True)
    unknown = [n for n in names if n not in CP_ALGORITHMS]
    if unknown:
        raise PlanError(f"cp_algorithm '{unknown[0]}' unknown; choose one of: "
                        f"{', '.join(CP_ALGORITHMS)}")  # fmt: skip
    lookup = np.array([CP_ALGORITHMS.index(n) for n in names], dtype=np.int64)
    return np.broadcast_to(lookup[inverse].reshape(array.shape), shape)


def sequence_parallel_column(sequence_parallel, tp) -> np.ndarray:
    """Sequence parallelism per row as bool, and only where tp > 1 (it splits activations
    over the TP ranks: Korthikanti et al. 2022 §4.2.2); numpy columns or scalars."""
    return np.asarray(sequence_parallel).astype(bool) & (np.asarray(tp) > 1)


def resolved_etp(etp, tp) -> np.ndarray:
    """The routed experts' TP degree per row: ``etp`` where given, ``tp`` where it is None
    (or 0 in an integer column); numpy columns or scalars."""
    if etp is None:
        return np.asarray(tp, dtype=np.int64)
    column = np.asarray(etp)
    if column.dtype == object:  # None where a layout leaves etp out
        column = np.array([0 if v is None else v for v in column.ravel()]).reshape(column.shape)
    return np.where(column > 0, column, tp).astype(np.int64)


def zero_group_size(dp, cp):
    """Ranks over which ZeRO shards dense model states and gradients are reduced: dp·cp (CP
    ranks hold the same weights). Works on numpy columns."""
    return dp * cp


def expert_data_parallel_size(dp, cp, tp, ep, etp):
    """Ranks holding the same routed experts (ZeRO shards their states over them):
    ``dp·cp·(tp/etp)/ep``, i.e. dp·cp over the part of the EP group carved out of it
    (Megatron-Core's expert-data-parallel group under MoE parallel folding); at least 1.
    Works on numpy columns."""
    return np.maximum(dp * cp * (tp // etp) // ep, 1)


def layers_per_virtual_stage(
    num_layers: int,
    pp: int,
    vpp: int = 1,
    split: LayerSplit = "auto",
    ends: tuple[float, float] = (0.0, 0.0),
    schedule: str = "1f1b",
    num_mtp_modules: int | None = None,
) -> np.ndarray:
    """Transformer layers in each virtual stage, in torch's stage order (chunk c, rank r → c·pp + r).

    ``first-last-fewer`` gives the first and the last virtual stage one layer fewer, as
    Llama 3 405B did (126 layers on 16 stages: 7, 8, …, 8, 7), leaving room for the
    embedding and the LM head. ``balanced`` spreads ``L mod S`` extra layers over the
    middle stages (DeepSeek-V3's 61 layers on 16 stages: 3, 4, …, 4, 3, 3).
    ``work-balanced`` (:func:`work_balanced_layers`) reads ``ends``, the first and the last
    stage's work beyond their layers in layers (:func:`end_stage_work`), and ``schedule``,
    which places the stages on ranks. Any other split is a layout in Megatron-Core's
    notation (:mod:`planner.spec.pipeline_layout`), its layers as written (and, where
    ``num_mtp_modules`` is given, the model's MTP modules on its last stage).
    """
    if split == "work-balanced":
        from planner.spec.work_balance import work_balanced_layers  # it reads this module

        return work_balanced_layers(num_layers, pp, vpp, ends, schedule)
    stages = pp * vpp
    if split not in LAYER_SPLITS:  # a written layout
        return layout_layers(split, num_layers, stages, num_mtp_modules)
    if split == "auto":
        if num_layers % stages == 0:
            split = "even"
        elif stages > 1 and (num_layers + 2) % stages == 0:
            split = "first-last-fewer"
        else:
            split = "balanced"
    if split != "first-last-fewer" and num_layers < stages:
        raise PlanError(
            f"num_layers {num_layers} is fewer than pp·vpp = {pp}·{vpp} = {stages} stages"
        )
    if split == "balanced":
        layers = np.full(stages, num_layers // stages, dtype=np.int64)
        extra = num_layers % stages
        start = (stages - extra) // 2
        layers[start : start + extra] += 1
        return layers
    if split == "even":
        if num_layers % stages:
            raise PlanError(
                f"num_layers {num_layers} is not divisible by pp·vpp = {pp}·{vpp} = {stages}"
            )
        return np.full(stages, num_layers // stages, dtype=np.int64)
    if stages == 1 or (num_layers + 2) % stages:
        raise PlanError(
            f"num_layers {num_layers} cannot be split over pp·vpp = {stages} stages, neither "
            f"evenly nor with one layer fewer on the first and last stage"
        )
    layers = np.full(stages, (num_layers + 2) // stages, dtype=np.int64)
    layers[0] -= 1
    layers[-1] -= 1
    return layers


def end_stage_work(model) -> tuple[float, float]:
    """What the first and the last virtual stage run beyond their transformer layers, in
    mean transformer layers of ``model``, by matmul parameters per token (a matmul parameter
    costs 2 FLOPs per token forward and 6 per training step, Kaplan et al. 2020; the
    attention's score and context products, which grow with the sequence, are left out).

    The first stage's embedding is a lookup (0). The last stage's LM head multiplies its
    vocab × hidden matrix (tied or not), and each MTP module runs its 2h → h projection, one
    transformer layer (top-k experts) and a second pass through the shared head
    (DeepSeek-V3 §2.2): DeepSeek-V3's head is 1.6 layers, head and MTP module 4.4.
    """
    dense = model.num_dense_layers if model.is_moe else model.num_layers
    layers = dense * model.layer_params(moe_layer=False)
    layers += model.num_moe_layers * model.layer_params(moe_layer=True, active=True)
    mean_layer = layers / model.num_layers
    head = model.vocab_size * model.hidden_size
    mtp_layer = model.layer_params(moe_layer=model.is_moe, active=True)
    mtp = model.mtp_module_params() - model.layer_params(moe_layer=model.is_moe) + mtp_layer
    return 0.0, (head + model.num_mtp_modules * (mtp + head)) / mean_layer


def model_layers_per_virtual_stage(
    model, pp: int, vpp: int = 1, split: LayerSplit = "auto", schedule: str = "1f1b"
) -> np.ndarray:
    """:func:`layers_per_virtual_stage` of ``model``: its layers, and for the
    ``work-balanced`` split its ends' work (:func:`end_stage_work`) on ``schedule``'s
    placement of the stages."""
    ends = end_stage_work(model) if split == "work-balanced" else (0.0, 0.0)
    return layers_per_virtual_stage(
        model.num_layers, pp, vpp, split, ends, schedule, model.num_mtp_modules
    )


def dense_and_moe_layers_per_virtual_stage(
    model, pp: int, vpp: int = 1, split: LayerSplit = "auto", schedule: str = "1f1b"
) -> tuple[np.ndarray, np.ndarray]:
    """(dense, MoE) transformer layers in each virtual stage
    (:func:`model_layers_per_virtual_stage`); an MoE model's first ``num_dense_layers``
    layers are dense (DeepSeek-V3's first three), the rest MoE."""
    layers = model_layers_per_virtual_stage(model, pp, vpp, split, schedule)
    starts = np.concatenate([[0], np.cumsum(layers)[:-1]])
    first_moe = model.num_dense_layers if model.is_moe else model.num_layers
    dense = np.clip(first_moe - starts, 0, layers)
    return dense, layers - dense


def check_expert_tp(tp: int, ep: int, dp_cp: int, etp: int | None) -> int:
    """Check ``etp`` against tp, ep and dp·cp; return the TP ranks folded into EP (tp/etp).

    Megatron-Core's MoE parallel folding (``--expert-tensor-parallel-size``): etp is tp
    (the experts split like the dense MLP) or 1 (whole experts; the tp/etp TP ranks join
    the EP group, whose other ``ep/(tp/etp)`` ranks are carved out of dp·cp).
    """
    etp = tp if etp is None else etp
    if etp not in (1, tp):
        raise PlanError(f"etp must be 1 or tp (={tp}); got {etp}")
    fold = tp // etp
    if ep % fold:
        raise PlanError(
            f"ep {ep} is not a multiple of tp/etp = {fold} (with etp 1 the TP ranks are part "
            f"of each EP group)"
        )
    if dp_cp % (ep // fold):
        carved = f"ep/(tp/etp) = {ep // fold}" if fold > 1 else f"ep {ep}"
        raise PlanError(f"{carved} does not divide dp·cp = {dp_cp} (EP is carved out of dp·cp)")
    return fold


def virtual_stage_ranks(schedule: str, pp: int, vpp: int) -> np.ndarray:
    """The pipeline rank that holds each virtual stage, in torch's stage numbering.

    Interleaved (and every one-chunk schedule): stage c·pp + r sits on rank r. V-shape
    schedules (ZB-V, DualPipeV): rank r holds stages r and 2·pp − 1 − r, so the first and
    the last stage share rank 0. DualPipe runs the pipeline in both directions with every
    rank holding stages r and pp − 1 − r; the direction that starts on rank r is counted
    here, the mirrored copy shows up as the schedule's second parameter copy.
    """
    stages = np.arange(pp * vpp)
    if schedule in V_SHAPE_SCHEDULES:
        if vpp != 2:
            raise PlanError(
                f"schedule '{schedule}' holds exactly 2 chunks per rank (vpp 2), got {vpp}"
            )
        return np.where(stages < pp, stages, 2 * pp - 1 - stages)
    return stages % pp
