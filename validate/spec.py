"""What a validation run is: a small workload, a planner :class:`Layout`, and how to run it.

Nothing here imports torch: the CLI, :mod:`validate.compare` and the tests build and read
these specs without it. :class:`Workload` is the small Llama-style model the ranks train
(:mod:`validate.workloads.model`); :meth:`Workload.model_spec` is the same model as the
planner's :class:`~planner.spec.model.ModelSpec`, so the prediction is for exactly what runs.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hwspecs.errors import PlanError
from planner.api import Job, Layout, ModelSpec, PrecisionSpec, check_layout

#: Schedules the pipeline workload can run, by the planner's name (torch's class in
#: :mod:`validate.workloads.pipeline`). ``llmplan:<name>`` runs the planner's own action
#: list through torch's pipeline runtime.
PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zbv", "dualpipev")


class Workload(BaseModel):
    """A small Llama-style decoder (RMSNorm, GQA with RoPE, SwiGLU, optional MoE), FP32.

    ``fused_kernels`` stores what Megatron's fused kernels store: RMSNorm keeps its input
    and the per-token ``1/rms``, SwiGLU keeps its two inputs and recomputes ``silu`` in
    backward. Off, plain torch ops run and autograd keeps every intermediate.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "tiny-llama"
    num_layers: int = Field(4, gt=0)
    hidden_size: int = Field(64, gt=0)
    ffn_hidden_size: int = Field(192, gt=0)
    num_attention_heads: int = Field(4, gt=0)
    num_kv_heads: int = Field(2, gt=0)
    vocab_size: int = Field(512, gt=0)
    seq_len: int = Field(128, gt=0)
    num_routed_experts: int = Field(0, ge=0)
    num_experts_per_token: int = Field(0, ge=0)
    moe_ffn_hidden_size: int | None = Field(None, gt=0)
    num_dense_layers: int = Field(0, ge=0, description="first layers with a dense MLP")
    fused_kernels: bool = True
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return self.num_routed_experts > 0

    def is_moe_layer(self, index: int) -> bool:
        return self.is_moe and index >= self.num_dense_layers

    def model_spec(self) -> ModelSpec:
        """The planner's description of exactly this model."""
        moe = {}
        if self.is_moe:
            moe = {
                "num_routed_experts": self.num_routed_experts,
                "num_experts_per_token": self.num_experts_per_token,
                "moe_ffn_hidden_size": self.moe_ffn_hidden_size,
                "num_dense_layers": self.num_dense_layers,
            }
        return ModelSpec(
            name=self.name,
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            ffn_hidden_size=self.ffn_hidden_size,
            num_attention_heads=self.num_attention_heads,
            num_kv_heads=self.num_kv_heads,
            vocab_size=self.vocab_size,
            mlp_kind="swiglu",
            norm_kind="rmsnorm",
            position_embedding="rope",
            **moe,
        )


class RunSpec(BaseModel):
    """One layout to launch: a name, the workload, the planner layout and the step counts.

    The global batch is ``dp × micro_batch_size × num_microbatches`` sequences. Layouts
    without pipeline parallelism run one micro-batch per step. ``inject_failure`` makes
    ``failure_rank`` raise or hang on its first step (to test the launcher's reporting).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    workload: Workload = Workload()
    layout: Layout
    warmup_steps: int = Field(2, ge=1, description="the first two are checked against serial")
    timed_steps: int = Field(3, ge=1)
    check_reference_loss: bool = True
    inject_failure: Literal["raise", "hang"] | None = None
    failure_rank: int = Field(1, ge=0)

    @model_validator(mode="after")
    def _runnable(self) -> RunSpec:
        layout, workload = self.layout, self.workload
        check_layout(self.planner_layout(), workload.model_spec(), workload.seq_len)
        if layout.pp == 1 and self.num_microbatches != 1:
            raise PlanError(
                f"{self.name}: layouts without pipeline parallelism run one micro-batch per "
                f"step, got num_microbatches {self.num_microbatches}"
            )
        planner_own = layout.schedule.startswith("llmplan:")
        if layout.pp > 1 and not planner_own and layout.schedule not in PIPELINE_SCHEDULES:
            raise PlanError(
                f"{self.name}: schedule '{layout.schedule}' cannot run; choose one of: "
                f"{', '.join(PIPELINE_SCHEDULES)} (or llmplan:<name>)"
            )
        if layout.ep > 1 and (layout.ep != layout.dp or layout.cp != 1 or layout.tp != 1):
            raise PlanError(f"{self.name}: the EP workload needs ep == dp with cp = tp = 1")
        if layout.cp > 1 and layout.cp_algorithm == "hierarchical" and layout.cp_inner is None:
            raise PlanError(
                f"{self.name}: hierarchical CP on one machine needs its inner degree "
                f"(cp_inner): the CP ranks of one scale-up domain are all of them here"
            )
        if layout.cp > 1 and (layout.tp > 1 or layout.pp > 1):
            raise PlanError(f"{self.name}: the CP workload combines only with dp")
        if layout.recompute not in ("none", "full"):
            raise PlanError(
                f"{self.name}: the workloads recompute none or full, got '{layout.recompute}'"
            )
        if layout.recompute == "full" and max(layout.pp, layout.tp, layout.cp, layout.ep) > 1:
            raise PlanError(f"{self.name}: full recomputation runs on dp layouts only")
        if layout.tp > 1 and layout.pp > 1:
            raise PlanError(f"{self.name}: TP × PP is not among the workloads")
        if layout.zero_stage in (2, 3) and layout.pp > 1 and layout.dp > 1:
            raise PlanError(f"{self.name}: PP × DP runs with DDP (zero_stage 0)")
        if self.inject_failure and self.failure_rank >= layout.num_gpus:
            raise PlanError(f"{self.name}: failure_rank {self.failure_rank} ≥ world size")
        return self

    @property
    def world_size(self) -> int:
        return self.layout.num_gpus

    @property
    def num_microbatches(self) -> int:
        return self.layout.num_microbatches or (self.layout.pp if self.layout.pp > 1 else 1)

    @property
    def global_batch_size(self) -> int:
        """Sequences per optimizer step."""
        return self.layout.dp * self.layout.micro_batch_size * self.num_microbatches

    def job(self) -> Job:
        """The planner's job for this run: FP32 AdamW, flash-style attention, no CUDA overhead;
        zero-bubble schedules keep the whole graph until W, as torch.distributed.pipelining's
        split backward does (``retain_graph=True``)."""
        return Job(
            model=self.workload.model_spec(),
            seq_len=self.workload.seq_len,
            global_batch_tokens=self.global_batch_size * self.workload.seq_len,
            precision=PrecisionSpec(recipe="fp32", optimizer="adamw"),
            flash_attention=True,
            runtime_overhead_bytes=0,
            weight_pass_memory="graph",
        )

    def planner_layout(self) -> Layout:
        """The layout as the planner costs it (``llmplan:`` prefix dropped)."""
        return self.layout.model_copy(
            update={
                "schedule": self.layout.schedule.removeprefix("llmplan:"),
                "num_microbatches": self.num_microbatches,
            }
        )
