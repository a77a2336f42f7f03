"""Published training runs as data: the schema of one measured run.

A row is one end-to-end training configuration whose layout and throughput were published
(or measured on the user's own machine): where it comes from (``source``, ``source_ref``),
the hardware, the model's shape, the training layout and what was measured. The schema is
the one of ``shared/reference/runs/train.json`` (every key present, unknown values null),
so a user's own runs in that schema load unchanged; unknown keys are rejected.

The project's catalog lives in ``hwspecs/data/runs/``: ``train.json`` (rows a profile may
be fitted on) and ``targets.json`` (test targets, never fitted on). Like every spec here,
this module computes nothing.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class RunSpecModel(BaseModel):
    """Base of the run schema: unknown keys are errors, values are kept as given."""

    model_config = ConfigDict(extra="forbid")


class SourceRef(RunSpecModel):
    """Where a row comes from: a repository file at a commit, a paper's table or a web page."""

    kind: Literal["repo", "paper", "web", "local"]
    repo: str | None = None
    path: str | None = None
    commit: str | None = None
    table: str | None = None
    config: str | None = None
    arxiv: str | None = None
    url: str | None = None


class RunHardware(RunSpecModel):
    """The machine the run used."""

    accelerator: str = Field(description="catalog accelerator slug where one exists")
    accelerator_desc: str | None = None
    num_gpus: int = Field(ge=1, description="GPUs (chips for TPU) of the run")
    gpus_per_node: int | None = Field(None, ge=1)
    scale_out: str | None = Field(None, description="the scale-out network, as the source says")
    caveats: str | None = None
    cluster: str | None = Field(
        None,
        description="catalog cluster the run's machine is (absent: the accelerator's "
        "reference cluster, grown to the run's GPU count)",
    )


class RunMoE(RunSpecModel):
    """Mixture-of-experts shape."""

    experts: int = Field(ge=1)
    top_k: int = Field(ge=1)
    expert_ffn: int = Field(ge=1)
    shared_experts: int = Field(0, ge=0)
    shared_expert_ffn: int | None = None
    moe_layers: int | None = None
    dense_layers: int | None = None
    #: Node-limited routing: a token's experts lie on at most this many nodes (DeepSeek-V3
    #: §2.1.2); rows in the shared format state it in ``notes`` (:func:`node_limit`).
    max_nodes_per_token: int | None = Field(None, ge=1)
    notes: str | None = None


class RunMLA(RunSpecModel):
    """Multi-head latent attention ranks (DeepSeek-V2/V3 style)."""

    q_lora_rank: int | None = Field(None, ge=1)
    kv_lora_rank: int = Field(ge=1)
    qk_rope_head_dim: int = Field(ge=1)
    qk_nope_head_dim: int = Field(ge=1)
    v_head_dim: int = Field(ge=1)


class RunModel(RunSpecModel):
    """The model's shape as it ran (a shallow stand-in keeps the layer count that ran)."""

    name: str
    hf_id: str | None = None
    params_b: float | None = None
    active_params_b: float | None = None
    layers: int = Field(ge=1)
    hidden: int = Field(ge=1)
    ffn: int = Field(ge=1)
    heads: int = Field(ge=1)
    kv_heads: int | None = Field(None, ge=1)
    head_dim: int | None = Field(None, ge=1)
    vocab: int = Field(ge=1)
    mlp: str = Field(description="MLP kind as the source names it (SwiGLU, GELU, ...)")
    tied_embeddings: bool | None = None
    moe: RunMoE | None = None
    mla: RunMLA | None = None
    arch_notes: str | None = None


class RunTraining(RunSpecModel):
    """The training layout and recipe; free-text fields keep the source's wording."""

    task: str = "pretrain"
    seq_len: int = Field(ge=1)
    global_batch_seqs: int | None = Field(None, ge=1)
    global_batch_tokens: int = Field(ge=1)
    micro_batch: int | None = Field(None, ge=1)
    grad_accum: int | None = Field(None, ge=1)
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    cp: int = Field(1, ge=1)
    dp: int | None = Field(None, ge=1)
    ep: int | None = Field(None, ge=1)
    etp: int | None = Field(None, ge=1)
    vpp: int | None = Field(None, ge=1)
    pp_schedule: str | None = None
    zero_stage: int | str | None = None
    fsdp: bool | str | None = None
    sequence_parallel: bool | None = None
    recompute: str | None = None
    precision: str = "bf16"
    optimizations: str | None = None
    cuda_graphs: bool | None = Field(
        None,
        description="the layers replayed from CUDA graphs captured whole (one per iteration, "
        "Megatron-Core's cuda_graph_impl full_iteration, or one per layer); None: not stated",
    )
    ep_comm_overlap: bool | None = Field(
        None,
        description="EP all-to-alls overlapped with another micro-batch's compute "
        "(Megatron-Core's moe_a2a_overlap / overlap_moe_expert_parallel_comm: combined 1F1B); "
        "None: not stated",
    )
    grad_dtype: Literal["fp32", "bf16", "fp16"] | None = Field(
        None,
        description="the gradient buffer's dtype, which the data-parallel reduction sends "
        "and the optimizer reads (Megatron-Core's grad_reduce_in_fp32 false: the parameters' "
        "bf16); None: not stated, the precision recipe's default",
    )
    pp_layout: str | None = Field(
        None,
        description="each virtual pipeline stage's layers in Megatron-Core's "
        "--pipeline-model-parallel-layout notation (E embedding, t layer, m MTP module, "
        "L loss, '|' between stages: 'Et*4|(t*4|)*14tmL'); None: not stated",
    )
    mtp_modules: int | None = Field(
        None,
        ge=0,
        description="multi-token-prediction modules the run trained beside the model "
        "(DeepSeek-V3 §2.2; Megatron-Core's mtp_num_layers); None: not stated",
    )
    expert_routing: Literal["consecutive"] | None = Field(
        None,
        description="a benchmark gate that routed each token to fixed experts in place of the "
        "learned router: 'consecutive', token t to experts kt … kt+k−1 mod E (NeMo "
        "AutoModel's FakeBalancedGate); None: the model's router",
    )
    lora_rank: int | None = Field(
        None, ge=1, description="LoRA adapter rank r (task lora); None: not stated"
    )
    lora_targets: str | None = Field(
        None,
        description="the linears the adapters sit on, in the planner's module names joined by "
        "',' (q_proj, …; the supplement's quote keeps the source's own); None: not stated",
    )
    lora_dropout: float | None = Field(
        None, ge=0, lt=1, description="dropout on the adapter input (task lora); None: not stated"
    )
    framework: str | None = None
    framework_version: str | None = None


class RunMeasured(RunSpecModel):
    """What the run measured (per GPU unless named otherwise)."""

    step_time_s: float | None = Field(None, gt=0)
    tokens_per_s_per_gpu: float | None = Field(None, gt=0)
    samples_per_s_per_gpu: float | None = None
    model_tflops_per_gpu: float | None = None
    hw_tflops_per_gpu: float | None = None
    mfu: float | None = None
    mfu_definition: str | None = None
    hfu: float | None = None
    memory_gb_per_gpu: float | None = None
    other: dict | None = None


class RunSupplement(RunSpecModel):
    """A setting the row's table left out and the same release's launch script states: the
    field it fills (dotted, e.g. ``training.vpp``), its value and the file that sets it."""

    field: str
    value: int | float | str | bool
    source_ref: SourceRef
    quote: str = Field(description="the launch script's own lines that set it")
    release: str | None = Field(
        None,
        description="the release whose recipe sets it (the row's training.framework_version), "
        "where the recipe lives at that release's tag rather than at the table's commit",
    )


class RunRow(RunSpecModel):
    """One measured training run."""

    id: str
    source: str
    source_ref: SourceRef
    year: int | None = None
    confirmation: str | None = None
    group: str | None = Field(
        None, description="rows that are one configuration measured with different releases"
    )
    hardware: RunHardware
    model: RunModel
    training: RunTraining
    measured: RunMeasured
    derived_fields: list[str] = Field(default_factory=list)
    inferred_fields: list[str] = Field(default_factory=list)
    #: Settings filled from the source's launch script where its table printed none
    #: (the project's catalog only; ``scripts/build_runs_catalog.py``).
    supplements: list[RunSupplement] = Field(default_factory=list)
    notes: str | None = None

    @property
    def group_key(self) -> str:
        """The configuration group (the row's own id where no group is given)."""
        return self.group or self.id


class RunCatalog(RunSpecModel):
    """A list of runs (the JSON file is the bare list; this wraps it for validation)."""

    rows: list[RunRow]


#: The MLA ranks as the reference rows' architecture notes state them.
MLA_PATTERN = re.compile(
    r"q_lora_rank (\d+), kv_lora_rank (\d+), qk_nope (\d+), qk_rope (\d+), v_head (\d+)"
)
#: "MLA as DeepSeek-V3": the ranks of DeepSeek-V3's MLA (arXiv 2412.19437 §4.2).
DEEPSEEK_V3_MLA = {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                   "qk_rope_head_dim": 64, "v_head_dim": 128}  # fmt: skip


#: "node-limited routing (<=4 nodes)": the reference rows' MoE notes on DeepSeek-V3's router.
NODE_LIMIT_PATTERN = re.compile(r"node-limited routing \(<=\s*(\d+) nodes?\)")


def node_limit(moe_notes: str | None) -> int | None:
    """The most nodes a token's experts lie on, as an MoE note states it, else None."""
    found = NODE_LIMIT_PATTERN.search(moe_notes or "")
    return int(found.group(1)) if found else None


def mla_ranks(arch_notes: str | None) -> dict | None:
    """The MLA ranks an architecture note states, or None for other attention."""
    if not arch_notes or "MLA" not in arch_notes:
        return None
    found = MLA_PATTERN.search(arch_notes)
    if found is None:
        return dict(DEEPSEEK_V3_MLA) if "as DeepSeek-V3" in arch_notes else None
    q, kv, nope, rope, v = (int(x) for x in found.groups())
    return {"q_lora_rank": q, "kv_lora_rank": kv, "qk_nope_head_dim": nope,
            "qk_rope_head_dim": rope, "v_head_dim": v}  # fmt: skip
