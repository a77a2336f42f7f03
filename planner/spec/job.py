"""The training job: model, sequence length, global batch, precision and fine-tuning recipe."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hwspecs.profile import EfficiencyProfile
from planner.spec.finetune import FinetuneSpec, check_targets
from planner.spec.measures import MemoryMeasures
from planner.spec.model import ModelSpec
from planner.spec.precision import PrecisionSpec

#: What zero-bubble schedules keep between B and W (:mod:`planner.cost.weight_pass`).
WeightPassMemory = Literal["inputs", "graph"]
#: How Ulysses CP meets more ranks than a TP rank's KV heads (:mod:`planner.cost.context_parallel`).
UlyssesKvHeads = Literal["whole", "replicate"]
#: Fused attention kernels a stack may run (measured per accelerator: ``attention_kernels``).
AttentionKernel = Literal["flash-attention-1", "flash-attention-2", "cudnn", "flash-attention-3"]
#: How the loss is computed from the logits (:func:`planner.cost.activations.logits_buffer_bytes`).
CrossEntropyKernel = Literal["unfused", "fused"]


class Job(BaseModel):
    """What is trained: the model, at which sequence length and batch, in which precision.

    ``global_batch_tokens`` is the number of tokens per optimizer step (Llama 3 405B:
    16,777,216 = 2,048 sequences of 8,192). ``flash_attention`` stores no attention score
    matrix (Dao et al. 2022); set it off to reproduce Korthikanti et al.'s accounting.
    ``finetune`` trains adapters on a frozen (for QLoRA: NF4) base; None is full training.
    ``memory_measures``: DeepSeek-V3's activation-memory measures taken (none by default).
    ``weight_pass_memory``: what zero-bubble schedules keep between B and W — the weight
    GEMMs' inputs and output gradients (``inputs``, the zero-bubble paper's M_W) or the
    whole saved graph plus those gradients (``graph``, torch.distributed.pipelining).
    ``ulysses_kv_heads``: Ulysses CP's all-to-all over more ranks than a TP rank has KV
    heads — refused (``whole``: TransformerEngine's ``AttnFuncWithCPAndQKVOA2A``, which
    Megatron-Core's a2a CP runs, re-shards whole heads) or the K/V heads repeated up to the
    degree before it (``replicate``: verl's Ulysses, ``repeat_kv`` by ``degree // kv_heads``).
    ``tp_comm_overlap``: the stack pipelines TP collectives with the GEMMs they feed or
    follow (:mod:`planner.spec.stack`); the profile's ``tp_comm_overlap`` term is the share it
    hides (:mod:`planner.cost.profile`); the ideal model exposes every TP collective. None:
    the named stack's default (``planner.api.with_profile``), else no overlap.
    ``ep_comm_overlap``: Megatron-Core's combined 1F1B (``overlap_moe_expert_parallel_comm``):
    in interleaved 1F1B, or without pipelining, one micro-batch's forward runs beside
    another's backward and each hides the other's EP all-to-alls
    (:func:`planner.comm.rows.ep_paired_share`); off by default, as in Megatron-Core (its
    performance recipes set it per model). DualPipe overlaps them whatever this says.
    ``cuda_graphs``: the layers' kernels replay from CUDA graphs, captured whole: one graph
    for the iteration (Megatron-Core's ``cuda_graph_impl="full_iteration"``, torch's
    ``torch.cuda.graph`` around the step) or one per layer, forward and backward
    (Megatron-Core's per-layer ``local`` graphs over the whole layer, its older
    ``enable_cuda_graph``), so no layer kernel pays a host launch: the profile's per-kernel
    cost (``kernel_overhead_s``, :mod:`planner.cost.profile`) is not charged. Graphs of
    parts of a layer (``cuda_graph_modules`` attention, router, MLP) are not modelled:
    leave this off for them. Off by default, as in Megatron-Core.
    ``attention_kernel``: the fused attention kernel the stack runs (FlashAttention-1 or
    its Triton port, FlashAttention-2, cuDNN's, FlashAttention-3), timed at the
    accelerator's rates for it (``Accelerator.attention_kernels``: measured, or derived from
    a measured kernel by a published speed-up); None: the accelerator's default attention
    rates.
    ``cross_entropy``: the loss over the logits as separate ops that keep FP32 probabilities
    (``unfused``: torch's ``cross_entropy`` on upcast logits, Megatron-LM's
    ``vocab_parallel_cross_entropy``) or one kernel that keeps a per-token FP32 log-sum-exp
    only (``fused``: FlashAttention's ``CrossEntropyLoss``, llm-foundry's default loss).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelSpec
    seq_len: int = Field(gt=0)
    global_batch_tokens: int | None = Field(None, gt=0)
    precision: PrecisionSpec = PrecisionSpec()
    flash_attention: bool = True
    finetune: FinetuneSpec | None = None
    memory_measures: MemoryMeasures = MemoryMeasures()
    weight_pass_memory: WeightPassMemory = "inputs"
    ulysses_kv_heads: UlyssesKvHeads = "whole"
    tp_comm_overlap: bool | None = None
    ep_comm_overlap: bool = False
    cuda_graphs: bool = False
    attention_kernel: AttentionKernel | None = None
    cross_entropy: CrossEntropyKernel = "unfused"
    efficiency_profile: EfficiencyProfile | None = Field(
        None,
        description="fitted terms of the accelerator (and stack) the step loses beyond the "
        "ideal model (planner.cost.profile); None: the ideal model",
    )
    runtime_overhead_bytes: int | None = Field(
        None,
        ge=0,
        description="HBM the runtime holds outside the program's buffers; None: the "
        "accelerator's (hwspecs Accelerator.runtime_overhead_bytes: CUDA context and "
        "workspaces on GPUs, none on TPUs)",
    )

    @model_validator(mode="after")
    def _batch_holds_whole_sequences(self) -> Job:
        if self.global_batch_tokens is not None and self.global_batch_tokens % self.seq_len:
            below = self.global_batch_tokens // self.seq_len * self.seq_len
            nearest = ", ".join(f"{n:,}" for n in (below, below + self.seq_len) if n > 0)
            raise ValueError(
                f"global_batch_tokens {self.global_batch_tokens:,} is not a multiple of "
                f"seq_len {self.seq_len:,} (nearest: {nearest}; or give --global-batch-size)"
            )
        return self

    @model_validator(mode="after")
    def _adapter_targets_exist(self) -> Job:
        if self.finetune is not None:
            check_targets(self.model, self.finetune)
        return self

    @property
    def active_memory_measures(self) -> MemoryMeasures:
        """The measures that apply under this job's GEMM dtype (FP8 caches need FP8 GEMMs)."""
        return self.memory_measures.for_gemm_dtype(self.precision.gemm_dtype)

    @property
    def global_batch_size(self) -> int | None:
        """Sequences per optimizer step."""
        if self.global_batch_tokens is None:
            return None
        return self.global_batch_tokens // self.seq_len
