"""Hardware specs as data: accelerators, link tiers and clusters.

Every spec is a pydantic model loaded from one TOML file under ``hwspecs/data/``. Unknown
keys are rejected, units are in the field names (``bf16_tflops`` is dense TFLOP/s,
``hbm_bytes`` bytes, ``bytes_per_s_per_direction`` bytes per second in one direction,
``latency_s`` seconds), and every number carries its source: each file has a ``[sources]``
table whose keys are the dotted names of the numeric fields (``bf16_tflops``,
``matmul_efficiency.bf16``) and whose values cite where the number comes from. A number
without a source is a validation error. Figures that are not measured but chosen say so
in their source, starting with ``default:``.
"""

from __future__ import annotations

import itertools
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, model_validator

from hwspecs.attention import curve_at, curve_errors

DType = Literal["fp32", "tf32", "bf16", "fp16", "fp8", "fp4"]
#: A pipeline runtime's compute actions: a forward, a full backward, or a split backward's
#: input-gradient and weight-gradient parts.
PipelineAction = Literal["forward", "backward", "input_grad", "weight_grad"]
#: A data-parallel wrapper's own host time: FSDP per wrapped unit, DDP per call, per pass.
DataParallelCost = Literal["fsdp_unit_forward", "fsdp_unit_backward", "ddp_forward",
                           "ddp_backward"]  # fmt: skip
DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4")

#: Prefix of a source string that marks a documented default rather than a measurement.
DEFAULT_SOURCE_PREFIX = "default:"


class SpecModel(BaseModel):
    """Base for all specs: unknown keys are errors, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _holds_numbers(item) -> bool:
    """A number, or a list (of lists) holding one: a value a catalog must cite."""
    if isinstance(item, (list, tuple)):
        return any(_holds_numbers(x) for x in item)
    return isinstance(item, (int, float)) and not isinstance(item, bool)


def numeric_field_paths(model: BaseModel, prefix: str = "") -> list[str]:
    """Dotted names of every numeric value given in ``model`` (nested models and dicts).

    Fields left at their schema default are not listed: their defaults are documented in
    the field descriptions.
    """
    paths: list[str] = []
    for name in type(model).model_fields:
        if name == "sources" or name not in model.model_fields_set:
            continue
        value = getattr(model, name)
        path = f"{prefix}{name}"
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, (int, float)):
            paths.append(path)
        elif isinstance(value, BaseModel):
            paths.extend(numeric_field_paths(value, prefix=f"{path}."))
        elif isinstance(value, dict):
            paths.extend(f"{path}.{key}" for key, item in value.items() if _holds_numbers(item))
        elif isinstance(value, (list, tuple)):
            if any(isinstance(item, BaseModel) for item in value):
                for index, item in enumerate(value):
                    paths.extend(numeric_field_paths(item, prefix=f"{path}.{index}."))
            elif any(isinstance(item, (int, float)) for item in value):
                paths.append(path)
    return paths


#: Validation context under which numbers may lack a source (a user's own file): they are
#: listed in :attr:`SourcedSpec.unsourced` instead of failing.
SOURCES_OPTIONAL = {"sources": "optional"}


class SourcedSpec(SpecModel):
    """A spec whose every numeric field must be cited in ``sources`` (a catalog file); a
    user's own file, validated with :data:`SOURCES_OPTIONAL`, may leave some uncited."""

    sources: dict[str, str] = Field(
        default_factory=dict,
        description="dotted numeric field name -> citation (or 'default: why')",
    )
    _unsourced: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="after")
    def _every_number_has_a_source(self, info: ValidationInfo) -> SourcedSpec:
        missing = [path for path in numeric_field_paths(self) if not self._source_for(path)]
        if missing and (info.context or {}).get("sources") != "optional":
            raise ValueError(f"numbers without a source in [sources]: {', '.join(missing)}")
        self._unsourced = tuple(missing)
        return self

    @property
    def unsourced(self) -> tuple[str, ...]:
        """Dotted names of the numbers given without a source (only in a user's own file)."""
        return self._unsourced

    def _source_for(self, path: str) -> str | None:
        """The citation for ``path``, falling back to a parent path (``tiers.0``)."""
        parts = path.split(".")
        for end in range(len(parts), 0, -1):
            found = self.sources.get(".".join(parts[:end]))
            if found:
                return found
        return None

    def source_of(self, path: str) -> str:
        """The citation of one numeric field (empty string if it has none)."""
        return self._source_for(path) or ""


class Accelerator(SourcedSpec):
    """One accelerator (GPU or TPU chip): dense peak FLOP/s, HBM, links, achievable efficiency."""

    id: str
    name: str
    vendor: str
    kind: Literal["gpu", "tpu"] = "gpu"
    fp32_tflops: float | None = Field(None, gt=0, description="dense non-tensor FP32")
    tf32_tflops: float | None = Field(None, gt=0, description="dense tensor-core TF32")
    bf16_tflops: float = Field(gt=0, description="dense BF16 matmul peak")
    fp16_tflops: float | None = Field(None, gt=0)
    fp8_tflops: float | None = Field(None, gt=0)
    fp4_tflops: float | None = Field(None, gt=0)
    hbm_bytes: int = Field(gt=0, description="usable HBM capacity as tools report it")
    runtime_overhead_bytes: int | None = Field(
        None,
        ge=0,
        description="HBM the runtime holds outside the program's buffers that hbm_bytes still "
        "counts; unset: the CUDA context and cuBLAS/NCCL workspaces of a GPU, a documented "
        "default of 1 GiB (planner.cost.memory); 0 where hbm_bytes is already what the runtime "
        "leaves the program (XLA on TPU reports its capacity net of its own reservation)",
    )
    hbm_bytes_per_s: float = Field(gt=0, description="peak HBM bandwidth")
    tdp_w: float | None = Field(None, gt=0)
    num_compute_units: int | None = Field(
        None, gt=0, description="SMs (NVIDIA) or CUs (AMD) that GEMM tiles are spread over"
    )
    scale_up_link: str | None = Field(None, description="link tier id of the scale-up fabric")
    scale_up_domain_size: int = Field(1, ge=1, description="GPUs in one scale-up domain")
    nic_link: str | None = Field(None, description="link tier id of the scale-out NIC")
    nics_per_gpu: float = Field(1.0, gt=0)
    matmul_efficiency: dict[DType, float] = Field(
        default_factory=dict,
        description="achievable fraction of dense peak for large GEMMs, per dtype",
    )
    attention_forward_efficiency: dict[DType, float] = Field(
        default_factory=dict,
        description="achievable fraction of dense peak of the fused attention forward kernel "
        "(causal); unset dtypes run attention at the matmul efficiency",
    )
    attention_backward_efficiency: dict[DType, float] = Field(
        default_factory=dict,
        description="the same for the attention backward kernel, on FlashAttention's FLOP "
        "count (2.5x the forward's: the scores are recomputed)",
    )
    attention_kernels: dict[str, list[float]] = Field(
        default_factory=dict,
        description="[forward, backward] fractions of the dense BF16 peak of each "
        "named fused attention kernel a stack may run (flash-attention-1, flash-attention-2, "
        "cudnn, flash-attention-3; causal, head dim 128), measured or derived from a "
        "measured kernel by a published speed-up (hwspecs/data/README.md rule 7), for a job "
        "that names its kernel; "
        "attention_*_efficiency are the rates of a job that names none",
    )
    attention_seq_lens: list[int] = Field(
        default_factory=list, description="the sequence lengths attention_curves measure"
    )
    attention_curves: dict[str, list[list[float]]] = Field(
        default_factory=dict,
        description="[forward, backward] fractions of the dense BF16 peak of a fused attention "
        "kernel at each of attention_seq_lens (hwspecs.attention); a kernel without one runs "
        "at its single attention_kernels rate at every length",
    )
    attention_default_kernel: str | None = Field(
        None, description="the kernel whose rates attention_*_efficiency.bf16 record"
    )
    hbm_bandwidth_efficiency: float = Field(
        0.8, gt=0, le=1, description="achievable fraction of peak HBM bandwidth"
    )
    op_overhead_s: float | None = Field(
        None,
        ge=0,
        description="fixed host seconds per dispatched operation (eager framework dispatch, "
        "autograd, launch), added per pass by planner.structure.op_counts; unset: 0, i.e. hidden "
        "behind device time (GPUs launching asynchronously)",
    )
    sharded_op_overhead_s: float | None = Field(
        None,
        ge=0,
        description="fixed host seconds per operation on a sharded-tensor wrapper (torch "
        "DTensor: sharding propagation, then the local op) in place of op_overhead_s; "
        "unset: op_overhead_s",
    )
    functional_collective_overhead_s: float | None = Field(
        None,
        ge=0,
        description="host seconds a collective issued through torch's functional "
        "collectives (DTensor redistribution) costs beyond the c10d call the link's fits "
        "measure; unset: 0",
    )
    pipeline_action_overhead_s: dict[PipelineAction, float] = Field(
        default_factory=dict,
        description="host seconds a pipeline runtime spends per action beyond the action's "
        "operations (torch.distributed.pipelining: buffers, autograd calls), per kind: "
        "forward, backward (full), input_grad and weight_grad (split backward); unset: 0",
    )
    data_parallel_overhead_s: dict[DataParallelCost, float] = Field(
        default_factory=dict,
        description="host seconds a data-parallel wrapper spends beyond its operations "
        "(hooks, bookkeeping): FSDP per wrapped unit, DDP per call, in forward and in "
        "backward; unset: 0",
    )
    overlaps_communication: bool = Field(
        True,
        description="whether collectives run beside compute (GPUs and TPUs: copy engines, "
        "NCCL or ICI, while the SMs compute); false where the same cores run both (a CPU "
        "rank whose gloo threads share its core): every collective is then exposed",
    )
    notes: str = ""

    @model_validator(mode="after")
    def _efficiencies_are_fractions(self) -> Accelerator:
        for field in ("matmul_efficiency", "attention_forward_efficiency",
                      "attention_backward_efficiency"):  # fmt: skip
            for dtype, value in getattr(self, field).items():
                if not 0 < value <= 1:
                    raise ValueError(f"{field}.{dtype} must be in (0, 1], got {value}")
                if self.peak_tflops(dtype) is None:
                    raise ValueError(f"{field}.{dtype} given but {dtype}_tflops is not")
        for kernel, fractions in self.attention_kernels.items():
            if len(fractions) != 2 or not all(0 < value <= 1 for value in fractions):
                raise ValueError(
                    f"attention_kernels.{kernel} must be [forward, backward] in (0, 1], "
                    f"got {fractions}"
                )
        default = [self.attention_forward_efficiency.get("bf16"),
                   self.attention_backward_efficiency.get("bf16")]  # fmt: skip
        points = {**self.attention_kernels, **({None: default} if all(default) else {})}
        errors = curve_errors(self.attention_seq_lens, self.attention_curves,
                              self.attention_default_kernel, points)  # fmt: skip
        if errors:
            raise ValueError("; ".join(errors))
        return self

    def peak_tflops(self, dtype: str) -> float | None:
        """Dense peak TFLOP/s for ``dtype`` (None where the accelerator has no such unit)."""
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype '{dtype}'; choose one of: {', '.join(DTYPES)}")
        return getattr(self, f"{dtype}_tflops")

    def peak_flops_per_s(self, dtype: str = "bf16") -> float:
        """Dense peak FLOP/s for ``dtype``; raises if the accelerator lacks it."""
        tflops = self.peak_tflops(dtype)
        if tflops is None:
            raise ValueError(f"accelerator '{self.id}' has no {dtype} peak in its spec")
        return tflops * 1e12

    def achievable_matmul_flops_per_s(self, dtype: str = "bf16") -> float:
        """Peak × matmul efficiency; raises if the catalog records no efficiency for ``dtype``."""
        if dtype not in self.matmul_efficiency:
            from hwspecs.errors import PlanError

            if self.peak_tflops(dtype) is None:
                units = ", ".join(d for d in DTYPES if self.peak_tflops(d) is not None)
                raise PlanError(
                    f"accelerator '{self.id}' has no {dtype} units (its spec lists {units}): "
                    f"choose a precision whose GEMMs run in one of them, or an accelerator "
                    f"with {dtype}"
                )
            recorded = ", ".join(sorted(self.matmul_efficiency)) or "none"
            raise PlanError(
                f"accelerator '{self.id}' has no matmul_efficiency for {dtype} "
                f"(recorded: {recorded}); add one with its source"
            )
        return self.peak_flops_per_s(dtype) * self.matmul_efficiency[dtype]

    def attention_curve(
        self, dtype: str = "bf16", kernel: str | None = None
    ) -> tuple[list[int], list[float], list[float]] | None:
        """(sequence lengths, forward FLOP/s, backward FLOP/s) of the fused attention kernel
        a job of ``dtype`` attention runs (``kernel``'s where the catalog measured it, else
        the default kernel's) where :attr:`attention_curves` records it (BF16); None
        otherwise."""
        if dtype != "bf16":
            return None
        measured = kernel in self.attention_kernels
        curve = self.attention_curves.get(kernel if measured else self.attention_default_kernel)
        if curve is None:
            return None
        peak = self.peak_flops_per_s(dtype)
        forward, backward = ([peak * f for f in values] for values in curve)
        return list(self.attention_seq_lens), forward, backward

    def achievable_attention_flops_per_s(
        self, dtype: str = "bf16", kernel: str | None = None, seq_len: float | None = None
    ) -> tuple[float, float]:
        """(forward, backward) FLOP/s of the fused attention kernels for ``dtype``: those of
        ``kernel`` where the catalog measured it (BF16), else the accelerator's default; at
        ``seq_len`` tokens per sequence where :meth:`attention_curve` records the kernel's
        rate by length (None: the single recorded rate).

        Where the catalog records no attention measurement, attention runs at the matmul
        rate (documented default rule 6 in ``hwspecs/data/README.md``).
        """
        curve = self.attention_curve(dtype, kernel) if seq_len is not None else None
        if curve is not None:
            return curve_at(curve, seq_len)
        matmul = self.achievable_matmul_flops_per_s(dtype)
        peak = self.peak_flops_per_s(dtype)
        if dtype == "bf16" and kernel in self.attention_kernels:
            forward, backward = self.attention_kernels[kernel]
            return peak * forward, peak * backward
        forward = self.attention_forward_efficiency.get(dtype)
        backward = self.attention_backward_efficiency.get(dtype)
        return (
            matmul if forward is None else peak * forward,
            matmul if backward is None else peak * backward,
        )


class CollectiveFit(SpecModel):
    """A measured ``t = alpha_s + S / bytes_per_s`` for one collective on one group size.

    ``S`` is nccl-tests' message size (the all-reduce buffer, the all-gather output, the
    reduce-scatter input, the all-to-all send buffer, the p2p message), so ``bytes_per_s``
    is its algorithm bandwidth. Where a link lists the fit for an op and group size, the
    planner uses it instead of the ring / pairwise formulas (:func:`planner.comm.collectives.
    algorithm_costs`): a measured runtime (gloo on loopback) that follows no ring factor.
    """

    op: Literal["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "p2p"]
    group_size: int = Field(ge=2)
    alpha_s: float = Field(ge=0)
    bytes_per_s: float = Field(gt=0, description="algorithm bandwidth S / (t - alpha_s)")


class LinkTier(SourcedSpec):
    """One kind of link: NVLink generation, an InfiniBand/RoCE NIC, PCIe, TPU ICI, DCN.

    ``bytes_per_s_per_direction`` is per GPU for scale-up fabrics (all of a GPU's NVLinks
    together) and per port for NICs. ``busbw_efficiency`` holds achievable bus bandwidth as
    a fraction of that figure, per collective algorithm, from nccl-tests measurements.
    """

    id: str
    name: str
    kind: Literal["scale-up", "scale-out", "host", "torus", "dcn"]
    bytes_per_s_per_direction: float = Field(gt=0)
    links_per_gpu: int | None = Field(None, ge=1)
    bytes_per_s_per_direction_per_link: float | None = Field(None, gt=0)
    latency_s: float = Field(ge=0, description="per-hop / per-message latency (alpha)")
    busbw_efficiency: dict[str, float] = Field(
        default_factory=dict, description="algorithm (ring, tree, nvls, ...) -> fraction"
    )
    in_network_reduction: bool = Field(
        False, description="switch-side reduction (NVLink SHARP / NVLS, IB SHARP)"
    )
    collective_fits: list[CollectiveFit] = Field(
        default_factory=list,
        description="measured per-(op, group size) fits used instead of the algorithm formulas "
        "on a group that stays on this link (llmplan calibrate writes them; catalog links have "
        "none)",
    )
    notes: str = ""

    def collective_fit(self, op: str, group_size: int) -> CollectiveFit | None:
        """The measured fit of ``op`` on ``group_size`` ranks, if the link lists one."""
        return next(
            (f for f in self.collective_fits if (f.op, f.group_size) == (op, group_size)), None
        )

    @model_validator(mode="after")
    def _efficiencies_positive(self) -> LinkTier:
        for algorithm, value in self.busbw_efficiency.items():
            if not 0 < value <= 1.5:
                raise ValueError(f"busbw_efficiency.{algorithm} must be in (0, 1.5], got {value}")
        return self


class ClusterTier(SpecModel):
    """One level of a cluster's network, innermost first.

    ``group_size`` is how many GPUs sit under one instance of this level (8 for an NVLink
    domain of 8, 16 for a rack of 2 servers, 3,072 for a pod); ``oversubscription`` is the
    ratio of downlink to uplink bandwidth at this level's switches (7.0 for 1:7).
    """

    name: str
    link: str = Field(description="link tier id used at this level")
    group_size: int = Field(ge=1)
    oversubscription: float = Field(1.0, ge=1.0)


class Cluster(SourcedSpec):
    """A cluster: accelerator, node and scale-up domain size, network levels or torus."""

    id: str
    name: str
    accelerator: str = Field(description="accelerator id")
    num_gpus: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    scale_up_domain_size: int = Field(ge=1)
    tiers: list[ClusterTier] = Field(min_length=1)
    torus_shape: list[int] | None = Field(
        None,
        description="chips per torus axis of one ICI domain (TPU); multiplies to scale_up_domain_size",
    )
    torus_wraparound: bool = True
    storage_bytes_per_s: float | None = Field(
        None,
        gt=0,
        description="sustained write bandwidth of the checkpoint storage, all writers together; "
        "unset: hwspecs/data/reliability.toml's per-GPU default times num_gpus",
    )
    restart_time_s: float | None = Field(
        None,
        gt=0,
        description="seconds from an interruption to training again (detect, reschedule, "
        "re-initialize, load the checkpoint); unset: hwspecs/data/reliability.toml's default",
    )
    notes: str = ""

    @model_validator(mode="after")
    def _tiers_nest(self) -> Cluster:
        sizes = [tier.group_size for tier in self.tiers]
        for inner, outer in itertools.pairwise(sizes):
            if outer < inner or outer % inner:
                raise ValueError(f"tier group sizes must grow and divide each other, got {sizes}")
        if self.scale_up_domain_size % self.gpus_per_node and (
            self.gpus_per_node % self.scale_up_domain_size
        ):
            raise ValueError(
                f"scale_up_domain_size {self.scale_up_domain_size} and gpus_per_node "
                f"{self.gpus_per_node} must divide one another"
            )
        if self.torus_shape is not None:
            product = 1
            for size in self.torus_shape:
                product *= size
            if product != self.scale_up_domain_size:
                raise ValueError(
                    f"torus_shape {self.torus_shape} holds {product} chips, "
                    f"scale_up_domain_size is {self.scale_up_domain_size}"
                )
        return self
