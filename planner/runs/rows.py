"""A published run as the planner's inputs: model, job, cluster and a search space.

Every layout field the row publishes is pinned (one value in the :class:`SearchSpace`);
the ones it leaves out keep the search's full range, so the prediction is what a new user
would get by pinning what they know and letting ``llmplan plan`` choose the rest. A row
the model cannot express raises :class:`Uncovered` with the reason, counted by
``runs check`` as coverage.
"""

from __future__ import annotations

import re

from pydantic import ValidationError

from hwspecs.catalog import catalog_names, load_accelerator
from hwspecs.errors import PlanError
from hwspecs.runs import RunRow
from planner.candidates import SearchSpace
from planner.runs.finetune import run_finetune
from planner.runs.kernels import attention_kernel, cross_entropy_kernel, ran_flash_attention
from planner.runs.uncovered import Uncovered
from planner.spec.job import Job
from planner.spec.measures import MemoryMeasures, memory_measures
from planner.spec.model import ModelSpec
from planner.spec.precision import PrecisionSpec
from planner.spec.recompute import MEGATRON_MODULES, checked_recompute, module_policies
from planner.spec.stack import (
    framework_applies_probs_in_experts,
    framework_on_transformer_engine,
    framework_overlaps_tp,
)


def precision_recipe(text: str) -> str:
    """The planner's precision recipe for a row's precision text: NVFP4 (``fp4-mixed``, the
    only FP4 recipe published runs name), FP8, FP16 or BF16 mixed precision."""
    lower = text.lower()
    if lower.split(" ")[0] == "fp32":  # a local run (llmplan validate --out): FP32 throughout
        return "fp32"
    if "fp4" in lower:
        if "nvfp4" not in lower:
            raise Uncovered("FP4 training other than NVFP4 is not modelled")
        return "fp4-mixed"
    if "fp8" in lower:
        return "fp8-mixed"
    if "fp16" in lower and "bf16" not in lower:
        return "fp16-mixed"
    return "bf16-mixed"


def mlp_is_gated(mlp: str) -> bool:
    """Whether a row's MLP text names a gated MLP (SwiGLU, GeGLU, "gated": three matrices,
    Shazeer 2020, arXiv 2002.05202); "non-gated" and "ungated" say it is not."""
    lower = mlp.lower()
    if re.search(r"\b(non|un)-?gated\b", lower):
        return False
    return "glu" in lower or "gated" in lower


#: A sliding window an architecture note states ("alternating full / 128-token sliding-window
#: attention").
SLIDING_WINDOW = re.compile(r"(\d[\d,]*)-token sliding[- ]window", re.IGNORECASE)


def sliding_window_fields(num_layers: int, arch_notes: str | None) -> dict:
    """The sliding window a row's architecture note states: on every other layer where it
    says "alternating" (GPT-OSS: 18 of 36), else on every layer."""
    found = SLIDING_WINDOW.search(arch_notes or "")
    if found is None:
        return {}
    alternating = "alternating" in (arch_notes or "").lower()
    return {
        "sliding_window": int(found[1].replace(",", "")),
        "num_sliding_window_layers": num_layers // 2 if alternating else num_layers,
    }


#: A row's configuration label trained with multi-token prediction ("DeepSeekV3 (w/ MTP)").
WITH_MTP = re.compile(r"\bw/\s*MTP\b", re.IGNORECASE)
#: The MTP depth an architecture note states ("MTP depth 1").
MTP_DEPTH = re.compile(r"\bMTP depth (\d+)")


def mtp_modules(row: RunRow) -> int:
    """The MTP modules a row trained (DeepSeek-V3 §2.2): ``training.mtp_modules`` where the
    row (or its launch script's supplement) states it; else the depth its architecture note
    states, where its configuration is labelled as trained with MTP ("w/ MTP"); 0 where the
    row does not say (its benchmark may have left MTP out: "some benchmark rows exclude
    MTP")."""
    if row.training.mtp_modules is not None:
        return row.training.mtp_modules
    depth = MTP_DEPTH.search(row.model.arch_notes or "")
    return int(depth.group(1)) if depth and WITH_MTP.search(row.notes or "") else 0


def expert_routing_fields(row: RunRow) -> dict:
    """The routing a row's MoE layers ran, as the model's routing limit: the model's
    node-limited routing where the row states it (``max_nodes_per_token``); a benchmark gate
    that sends token t to the k consecutive experts kt … kt+k−1 mod E
    (``training.expert_routing = "consecutive"``: NeMo AutoModel's ``FakeBalancedGate``) is
    group-limited routing to one of E/k groups of k experts, so under the contiguous expert
    placement a token's copies reach ⌈k / experts-per-node⌉ nodes
    (:func:`planner.comm.collectives.nodes_reached`), not the learned router's up to k."""
    moe = row.model.moe
    if row.training.expert_routing != "consecutive":
        return {"max_nodes_per_token": moe.max_nodes_per_token}
    if moe.experts % moe.top_k:
        raise Uncovered("consecutive expert routing with top-k not dividing the experts")
    return {"num_expert_groups": moe.experts // moe.top_k, "max_nodes_per_token": 1}


def model_spec(row: RunRow) -> ModelSpec:
    """The row's architecture as a ModelSpec (gated MLPs as SwiGLU's three matrices, other
    MLPs as two; shared experts counted in units of one routed expert's FFN; the routing
    limit the row's gate kept: :func:`expert_routing_fields`)."""
    m = row.model
    fields: dict = {
        "name": m.name,
        "num_layers": m.layers,
        "hidden_size": m.hidden,
        "ffn_hidden_size": m.ffn,
        "num_attention_heads": m.heads,
        "num_kv_heads": m.kv_heads or m.heads,
        "vocab_size": m.vocab,
        "tied_embeddings": bool(m.tied_embeddings),
        "mlp_kind": "swiglu" if mlp_is_gated(m.mlp) else "gelu",
    }
    if m.head_dim:
        fields["head_dim"] = m.head_dim
    if m.mla is not None:
        fields.update(
            attention_kind="mla",
            num_kv_heads=m.heads,
            head_dim=m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim,
            q_lora_rank=m.mla.q_lora_rank,
            kv_lora_rank=m.mla.kv_lora_rank,
            qk_rope_head_dim=m.mla.qk_rope_head_dim,
            v_head_dim=m.mla.v_head_dim,
        )
    elif m.arch_notes and "MLA" in m.arch_notes:
        raise Uncovered("MLA model without its ranks (model.mla)")
    if mtp_modules(row):
        fields["num_mtp_modules"] = mtp_modules(row)
    fields |= sliding_window_fields(m.layers, m.arch_notes)
    if m.moe is not None:
        shared_ffn = m.moe.shared_expert_ffn or m.moe.expert_ffn
        fields.update(
            num_routed_experts=m.moe.experts,
            num_experts_per_token=m.moe.top_k,
            moe_ffn_hidden_size=m.moe.expert_ffn,
            num_shared_experts=round(m.moe.shared_experts * shared_ffn / m.moe.expert_ffn),
            num_dense_layers=min(m.moe.dense_layers or 0, m.layers),
            **expert_routing_fields(row),
        )
    try:
        return ModelSpec(**fields)
    except ValidationError as error:
        raise Uncovered(f"model not expressible: {error.errors()[0]['msg']}") from None


def _schedule_pins(text: str | None, pp: int, vpp: int | None) -> dict:
    from planner.pipeline.schedules import SCHEDULES

    if pp == 1:
        return {"schedule": ["1f1b"], "vpp": [1]}
    lower = (text or "").lower()
    # The planner's own name (a local run's); a bare "1F1B" keeps the published reading below
    # (interleaved where the row gives virtual stages).
    if lower in SCHEDULES and lower != "1f1b":
        return {"schedule": [lower], "vpp": [vpp or 1]}
    if "dualpipe" in lower:
        return {"schedule": ["dualpipe"]}
    if "interleaved" in lower or (vpp or 1) > 1:
        found = re.search(r"vp\s*=\s*(\d+)", lower)
        pinned = vpp or (int(found.group(1)) if found else None)
        return {"schedule": ["interleaved-1f1b"], **({"vpp": [pinned]} if pinned else {})}
    if "1f1b" in lower:
        return {"schedule": ["1f1b"], "vpp": [1]}
    return {}


def _zero_pins(zero, fsdp) -> dict:
    """ZeRO stage from the row's zero_stage / fsdp text (unpublished: searched)."""
    if isinstance(zero, str) and zero.strip().isdigit():  # a CSV cell
        zero = int(zero)
    if isinstance(zero, int):
        return {"zero_stage": [zero]}
    text = f"{zero or ''} {fsdp if isinstance(fsdp, str) else ''}".lower()
    if "bf16optimizer" in text or "distributed optimizer" in text:
        return {"zero_stage": [1]}
    if "shard_grad_op" in text or "not resharded" in text:
        return {"zero_stage": [2]}
    if "fsdp" in text or "full_shard" in text:
        return {"zero_stage": [3]}
    return {}


def sharded_further(row: RunRow, space: SearchSpace) -> SearchSpace | None:
    """Where no layout fits under a row's ZeRO stage and that stage is the source's inference
    (``training.zero_stage`` in its ``inferred_fields``: "the trainer's default"), the stages
    above it, searched: the run ran, so it sharded at least that much (Megatron-Bridge's
    recipes switch some configurations to Megatron-FSDP, which the summary tables do not
    print). None where the stage was published or nothing is above it."""
    pinned = space.zero_stage
    if "training.zero_stage" not in row.inferred_fields or len(pinned) != 1 or pinned[0] >= 3:
        return None
    return space.model_copy(update={"zero_stage": list(range(pinned[0] + 1, 4))})


def _recompute_pins(text: str | None) -> dict:
    lower = (text or "").lower()
    if not lower or "rmsnorm" in lower:  # partial recompute: a memory measure (run_job)
        return {}
    names = lower.replace(",", " ").replace("+", " ").split()
    if names and all(name in MEGATRON_MODULES for name in names):  # --recompute-modules
        return {"recompute": [checked_recompute("+".join(names))]}
    if lower.startswith("none"):
        return {"recompute": ["none"]}
    if "minimal" in lower:  # MaxText's: only the projections' outputs saved
        return {"recompute": ["dots"]}
    if "selective" in lower:
        return {"recompute": ["selective"]}
    if "full" in lower or "checkpoint" in lower or "remat" in lower:
        return {"recompute": ["full"]}
    return {}


def search_space(row: RunRow, model: ModelSpec) -> SearchSpace:
    """Every published layout field pinned; the others at the search's defaults."""
    t, gpus = row.training, row.hardware.num_gpus
    dp = t.dp or gpus // (t.tp * t.pp * t.cp)
    if t.tp * t.pp * t.cp * dp != gpus:
        raise Uncovered("tp·pp·cp·dp is not the GPU count")
    pins: dict = {"tp": [t.tp], "pp": [t.pp], "cp": [t.cp], "dp": [dp]}
    if model.is_moe:
        if t.ep:
            pins["ep"] = [t.ep]
        if t.etp:
            pins["etp"] = [t.etp]
    else:
        pins["ep"] = [1]
    if t.micro_batch:
        pins["micro_batch_size"] = [replica_micro_batch(row, dp)]
    if t.sequence_parallel is not None:
        pins["sequence_parallel"] = [t.sequence_parallel]
    pins |= _schedule_pins(t.pp_schedule, t.pp, t.vpp)
    pins |= _zero_pins(t.zero_stage, t.fsdp)
    pins |= _recompute_pins(t.recompute)
    if "recompute" not in pins and ran_recompute_modules(row):
        pins["recompute"] = ["none", *module_policies(model), "full"]
    if t.cp > 1:
        pins["cp_algorithm"] = [cp_algorithm(row)]
    # The run ran: its TP may cross a node and its CP be as large as it was. Its layer split
    # is the layout it states (``training.pp_layout``), else its trainer's default, even
    # where the layers divide (Megatron-LM splits evenly unless told otherwise): ``auto``.
    return SearchSpace(
        **pins, allow_cross_node_tp=True, max_cp=max(64, t.cp), max_interleave=max(8, t.vpp or 1),
        pipeline_layer_split=t.pp_layout or "auto",
    )  # fmt: skip


def ran_recompute_modules(row: RunRow) -> bool:
    """Whether a row's software offered Megatron-Core's selective recompute modules, which
    an unpublished recompute setting is then searched over (:func:`search_space`):
    Megatron-Bridge's runs, whose performance recipes set ``recompute_modules`` per model and
    system (``src/megatron/bridge/perf_recipes``, NVIDIA-NeMo/Megatron-Bridge @067f987: the
    DeepSeek-V3 recipes ``mla_up_proj``, GPT-OSS ``layernorm`` and ``moe_act``); the modules
    came with Megatron-Core 0.13 (2025-07; ``megatron/core/transformer/moe/README.md``),
    before Megatron-Bridge's first performance table (25.09). Older NeMo and Megatron-LM
    rows had only whole-layer policies."""
    return "megatron-bridge" in (row.training.framework or "").lower()


def replica_micro_batch(row: RunRow, dp: int) -> int:
    """The sequences one data-parallel replica runs per micro-batch. MaxText's
    ``per_device_batch_size``, which its rows publish as the micro-batch, counts every chip,
    the TP, CP and PP ones too (its pyconfig: global batch = per_device_batch_size · chips ·
    gradient_accumulation_steps), so a replica runs the global batch over dp · accumulation
    steps; other stacks publish the micro-batch per replica."""
    t = row.training
    if "maxtext" in (t.framework or "").lower() and t.global_batch_seqs:
        per_replica, rest = divmod(t.global_batch_seqs, dp * (t.grad_accum or 1))
        if per_replica and not rest:
            return per_replica
    return t.micro_batch


def cp_algorithm(row: RunRow) -> str:
    """The context-parallel algorithm a row's software runs by default (no row states its
    own): Megatron-Core's ``--cp-comm-type`` defaults to ``p2p``, TransformerEngine's ring
    attention (``AttnFuncWithCPAndKVP2P``), under NeMo and Megatron-Bridge; torch's
    ``context_parallel`` (FSDP2/DTensor stacks) rotates K/V by all-gather by default
    (``set_rotate_method('allgather')``); Llama 3 all-gathers K and V (§3.3.2)."""
    return "ring" if stack_label(row) == "megatron" else "all-gather"


def _accelerator_kind(row: RunRow) -> str | None:
    """``gpu`` or ``tpu`` for a row on a catalog accelerator, else None."""
    if row.hardware.accelerator not in catalog_names("accelerator"):
        return None
    return load_accelerator(row.hardware.accelerator).kind


def run_measures(partial: bool, framework: str | None) -> MemoryMeasures:
    """The memory measures a row ran: DeepSeek-V3's set where its recompute text names them,
    else TransformerEngine's FP8 caches where its FP8 layers were TE's, else none; and the
    routing probabilities inside the experts' activation where its Megatron-Core applied
    them there (:func:`planner.spec.stack.framework_applies_probs_in_experts`)."""
    on_te = framework_on_transformer_engine(framework)
    name = "deepseek-v3" if partial else ("te-fp8" if on_te else "none")
    probs = framework_applies_probs_in_experts(framework)
    return memory_measures(name).model_copy(update={"probs_in_expert_activation": probs})


def run_job(row: RunRow, model: ModelSpec) -> Job:
    """The row's job: its model at its sequence length, batch and precision, whether its
    framework overlapped TP communication (:func:`planner.spec.stack.framework_overlaps_tp`),
    TransformerEngine's FP8 input caches where its FP8 layers were TE's
    (:func:`planner.spec.stack.framework_on_transformer_engine`), the attention kernel it
    ran (:mod:`planner.runs.kernels`), whether it replayed its layers from CUDA graphs
    (``training.cuda_graphs``) and overlapped its EP all-to-alls with another micro-batch
    (``training.ep_comm_overlap``), both filled from the release's recipe where the table
    says nothing."""
    t = row.training
    finetune = run_finetune(row)
    # RMSNorm and MLA up-projection recomputation is DeepSeek-V3's measure set (§3.2.3),
    # which a row names by its recompute text (planner.spec.measures).
    partial = model.attention_kind == "mla" and "rmsnorm" in (t.recompute or "").lower()
    try:
        return Job(
            model=model,
            seq_len=t.seq_len,
            global_batch_tokens=t.global_batch_tokens,
            precision=PrecisionSpec(recipe=precision_recipe(t.precision), grad_dtype=t.grad_dtype),
            memory_measures=run_measures(partial, t.framework),
            tp_comm_overlap=framework_overlaps_tp(t.framework, _accelerator_kind(row)),
            attention_kernel=attention_kernel(row),
            flash_attention=ran_flash_attention(row),
            cross_entropy=cross_entropy_kernel(row),
            cuda_graphs=bool(t.cuda_graphs),
            ep_comm_overlap=bool(t.ep_comm_overlap),
            finetune=finetune,
        )
    except ValidationError as error:
        raise Uncovered(f"job not expressible: {error.errors()[0]['msg']}") from None
    except PlanError as error:
        raise Uncovered(f"job not expressible: {error}") from None


def precision_label(row: RunRow) -> str:
    """bf16, fp8, fp4 or fp16: the GEMM precision family of the row, for grouping."""
    lower = row.training.precision.lower()
    for label in ("fp4", "fp8"):
        if label in lower:
            return label
    return "fp16" if "fp16" in lower and "bf16" not in lower else "bf16"


def stack_label(row: RunRow) -> str:
    """The software family a user would name for their own job (never a source)."""
    lower = (row.training.framework or "").lower()
    if "deepspeed" in lower:
        return "deepspeed"
    if "megatron" in lower or ("nemo" in lower and "automodel" not in lower):
        return "megatron"
    if "maxtext" in lower or "jax" in lower or "pax" in lower:
        return "jax"
    if "fsdp" in lower or "composer" in lower or "automodel" in lower:
        return "pytorch-fsdp"
    return "other"
