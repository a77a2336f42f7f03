"""The winning layout as a trainer's own settings: Megatron-LM arguments, torchtitan overrides.

What each trainer can run is data here (:data:`TRAINER_SCHEDULES`, :data:`TRAINER_ETP`):
``plan --emit TRAINER`` restricts its search to it, so the emitted winner is always a
layout the trainer runs. Flag and field names are checked by a test against the names
extracted from each trainer's source (``tests/data/trainer_flags.json``, with the commit).

- Megatron-LM (``megatron/training/arguments.py``): the schedules are
  ``forward_backward_pipelining_without_interleaving`` (1F1B) and ``..._with_interleaving``;
  layers go as ``--num-layers`` and, when they do not divide evenly, as
  ``--decoder-first/last-pipeline-num-layers`` (one stage per rank) or
  ``--pipeline-model-parallel-layout`` (any split, virtual stages included).
- torchtitan (``torchtitan/config/configs.py``, configs are Python with tyro overrides):
  ``pipeline_parallel_schedule`` names torch.distributed.pipelining's classes; expert
  parallelism borrows ranks from FSDP and TP (no expert TP degree: etp 1).
"""

from __future__ import annotations

from pydantic import BaseModel

from hwspecs.errors import PlanError
from planner.spec.precision import LOW_PRECISION_GEMM_DTYPES
from planner.spec.recompute import MEGATRON_MODULES, recompute_modules

#: llmplan schedule → the trainer's name for it; a schedule not listed is one it cannot run.
TRAINER_SCHEDULES: dict[str, dict[str, str]] = {
    "megatron": {"1f1b": "1f1b", "interleaved-1f1b": "interleaved-1f1b"},
    # torch.distributed.pipelining.schedules.get_schedule_class names.
    "torchtitan": {
        "gpipe": "GPipe",
        "1f1b": "1F1B",
        "interleaved-1f1b": "Interleaved1F1B",
        "zbv": "ZBVZeroBubble",
        "dualpipev": "DualPipeV",
    },
}
#: Routed-expert TP degrees a trainer runs, as a rule: "any" (1 or tp) or "1".
TRAINER_ETP = {"megatron": "any", "torchtitan": "1"}
TRAINER_NAMES = {"megatron": "Megatron-LM", "torchtitan": "torchtitan"}


class Emitted(BaseModel):
    """A trainer's settings for one layout: the text to run, and what it could not say."""

    trainer: str
    text: str
    notes: list[str]


def check_trainer(trainer: str) -> None:
    if trainer not in TRAINER_SCHEDULES:
        raise PlanError(
            f"unknown --emit target '{trainer}'; choose one of: {', '.join(TRAINER_SCHEDULES)}"
        )


def trainer_schedules(trainer: str, pinned: list[str] | None) -> list[str]:
    """The schedules a search for ``trainer`` may use: the pinned ones it runs, else all it runs."""
    check_trainer(trainer)
    supported = list(TRAINER_SCHEDULES[trainer])
    if pinned is None:
        return supported
    kept = [name for name in pinned if name in supported]
    if not kept:
        raise PlanError(
            f"--emit {trainer}: {TRAINER_NAMES[trainer]} runs none of the pinned schedules "
            f"({', '.join(pinned)}); it runs {', '.join(supported)}"
        )
    return kept


def emit_settings(entry: dict, trainer: str, job, layers_per_stage: list[int]) -> Emitted:
    """``entry`` (a plan result) as ``trainer``'s settings; ``layers_per_stage`` in torch order."""
    check_trainer(trainer)
    lay = entry["layout"]
    if lay["schedule"] not in TRAINER_SCHEDULES[trainer] and lay["pp"] > 1:
        raise PlanError(
            f"{TRAINER_NAMES[trainer]} has no '{lay['schedule']}' schedule; it runs "
            f"{', '.join(TRAINER_SCHEDULES[trainer])} (plan --emit {trainer} searches only those)"
        )
    if trainer == "megatron":
        return _megatron(lay, job, layers_per_stage)
    return _torchtitan(lay, job, layers_per_stage)


#: Megatron-Core's --cp-comm-type of each CP algorithm (megatron/core/transformer/
#: transformer_config.py: "p2p", "a2a", "allgather", "a2a+p2p").
MEGATRON_CP_COMM_TYPE = {"all-gather": "allgather", "ring": "p2p", "ulysses": "a2a",
                         "hierarchical": "a2a+p2p"}  # fmt: skip


def _combined_1f1b(lay: dict, job) -> bool:
    """Whether the layout was timed with Megatron-Core's combined 1F1B hiding its EP
    all-to-alls (:func:`planner.comm.rows.runs_combined_1f1b`)."""
    from planner.comm.rows import runs_combined_1f1b

    full = lay["recompute"] == "full"
    return bool(runs_combined_1f1b(job, [lay["schedule"]], lay["pp"], lay["vpp"], lay["ep"],
                                   full).any())  # fmt: skip


def _megatron(lay: dict, job, layers: list[int]) -> Emitted:
    etp = lay.get("etp") or lay["tp"]
    num_layers = sum(layers)
    args = [
        f"--num-layers {num_layers}",
        f"--tensor-model-parallel-size {lay['tp']}",
        f"--pipeline-model-parallel-size {lay['pp']}",
        f"--context-parallel-size {lay['cp']}",
        f"--micro-batch-size {lay['micro_batch_size']}",
        f"--global-batch-size {job.global_batch_size}",
        f"--seq-length {job.seq_len}",
    ]
    if job.model.is_moe:
        args += [
            f"--expert-model-parallel-size {lay['ep']}",
            f"--expert-tensor-parallel-size {etp}",
        ]
        if _combined_1f1b(lay, job):  # TransformerConfig's flag (ArgumentGroupFactory)
            args.append("--overlap-moe-expert-parallel-comm")
    if job.cuda_graphs:  # one graph for the iteration, the optimizer outside it
        args.append("--cuda-graph-impl full_iteration")
    mtp = job.model.num_mtp_modules
    if mtp:  # on the last stage, with the head (as the layout below and the cost model)
        args.append(f"--mtp-num-layers {mtp}")
    vpp = lay["vpp"] if lay["schedule"] == "interleaved-1f1b" else 1
    even = len(set(layers)) == 1
    if even and vpp > 1:
        args.append(f"--num-layers-per-virtual-pipeline-stage {layers[0]}")
    elif not even and vpp == 1 and len(set(layers[1:-1])) <= 1 and lay["pp"] > 2:
        args += [
            f"--decoder-first-pipeline-num-layers {layers[0]}",
            f"--decoder-last-pipeline-num-layers {layers[-1]}",
        ]
    elif not even:
        args.append(f'--pipeline-model-parallel-layout "{_megatron_layout(layers, mtp)}"')
    notes = []
    if lay["sequence_parallel"] and lay["tp"] > 1:
        args.append("--sequence-parallel")
    if job.tp_comm_overlap and lay["tp"] > 1:  # TransformerEngine's userbuffers need SP
        if lay["sequence_parallel"]:
            args.append("--tp-comm-overlap")
        else:
            notes.append("TP communication overlap was assumed: --tp-comm-overlap needs SP")
    if lay["recompute"] == "selective":
        args.append("--recompute-granularity selective")
    elif recompute_modules(lay["recompute"]):  # Megatron-Core's selective modules
        modules = [name for name in MEGATRON_MODULES if name in recompute_modules(lay["recompute"])]
        args.append(f"--recompute-granularity selective --recompute-modules {' '.join(modules)}")
    elif lay["recompute"] == "full":
        args.append(
            "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
        )
    elif lay["recompute"] == "dots":
        notes.append(
            "recompute dots (only the projections' outputs kept) has no Megatron-LM setting: "
            "selective recomputation keeps more, full recomputation less"
        )
    if lay["zero_stage"] >= 1:
        args.append("--use-distributed-optimizer")
    if lay["cp"] > 1:  # Megatron-Core's names of the CP algorithms (--cp-comm-type)
        algorithm = lay.get("cp_algorithm") or "all-gather"
        args.append(f"--cp-comm-type {MEGATRON_CP_COMM_TYPE[algorithm]}")
        if algorithm == "hierarchical" and lay.get("cp_inner"):
            inner = lay["cp_inner"]
            args.append(f"--hierarchical-context-parallel-sizes {inner} {lay['cp'] // inner}")
        elif algorithm == "hierarchical":
            notes.append(
                "hierarchical CP: set --hierarchical-context-parallel-sizes to the CP ranks of "
                "one NVLink domain and cp over them (the layout leaves cp_inner to the cluster)"
            )
    if lay["zero_stage"] >= 2:
        notes.append(
            f"ZeRO {lay['zero_stage']}: Megatron-LM's distributed optimizer shards optimizer "
            "states and gradients; parameters sharded too need --use-torch-fsdp2"
        )
    recipe = job.precision.recipe
    if recipe.startswith("bf16"):
        args.append("--bf16")
    elif recipe.startswith("fp16"):
        args.append("--fp16")
    elif recipe.startswith("fp8"):
        args.append("--bf16 --fp8-format hybrid")
    elif recipe.startswith("fp4"):  # TransformerEngine's NVFP4BlockScaling
        args.append("--bf16 --fp4-format e2m1 --fp4-recipe nvfp4")
    return Emitted(trainer="megatron", text=" \\\n  ".join(args), notes=notes)


def _megatron_layout(layers: list[int], mtp: int = 0) -> str:
    """Megatron-LM's layout string: stages split by '|', E embedding, t a layer, m an MTP
    module (on the last stage), L the loss."""
    stages = [f"t*{count}" if count > 1 else "t" * count for count in layers]
    stages[0] = "E" + stages[0]
    stages[-1] = stages[-1] + "m" * mtp + "L"
    text, start = "", 0
    while start < len(stages) - 1:  # runs of equal stages as Megatron's "(t*8|)*14"
        end = start
        while end + 1 < len(stages) - 1 and stages[end + 1] == stages[start]:
            end += 1
        run = end - start + 1
        text += f"{stages[start]}|" if run == 1 else f"({stages[start]}|)*{run},"
        start = end + 1
    return text + stages[-1]


def _torchtitan(lay: dict, job, layers: list[int]) -> Emitted:
    fsdp = lay["dp"] if lay["zero_stage"] >= 1 else 1
    schedule = TRAINER_SCHEDULES["torchtitan"].get(lay["schedule"], "1F1B")
    tokens_per_microbatch = lay["micro_batch_size"] * job.seq_len
    settings = {
        "parallelism.data_parallel_replicate_degree": lay["dp"] // fsdp,
        "parallelism.data_parallel_shard_degree": fsdp,
        "parallelism.fsdp_reshard_after_forward": "always" if lay["zero_stage"] >= 3 else "never",
        "parallelism.tensor_parallel_degree": lay["tp"],
        "parallelism.enable_sequence_parallel": bool(lay["sequence_parallel"] and lay["tp"] > 1),
        "parallelism.context_parallel_degree": lay["cp"],
        "parallelism.pipeline_parallel_degree": lay["pp"],
        "parallelism.pipeline_parallel_schedule": schedule,
        "parallelism.num_pp_microbatches": lay["num_microbatches"],
        "parallelism.expert_parallel_degree": lay["ep"],
        "training.num_tokens_per_microbatch_per_dp_rank": tokens_per_microbatch,
        "training.num_tokens_per_train_step": job.global_batch_tokens,
        "training.max_context_length": job.seq_len,
    }
    notes = []
    if job.tp_comm_overlap and lay["tp"] > 1:
        notes.append(
            "TP communication overlap was assumed: torchtitan's async TP runs under torch.compile "
            "with symmetric memory; enable it in the config, or re-plan with --no-tp-comm-overlap"
        )
    if lay["pp"] > 1:
        first, last, middle = layers[0], layers[-1], layers[1:-1]
        if len(set(middle or [first])) == 1:
            full = middle[0] if middle else first
            settings["parallelism.pipeline_parallel_first_stage_less_layers"] = full - first
            settings["parallelism.pipeline_parallel_last_stage_less_layers"] = full - last
        else:
            notes.append(
                f"layers per stage {layers} are not one size with a smaller first/last stage: "
                "set parallelism.module_fqns_per_model_part in the config to match"
            )
    if job.precision.gemm_dtype in LOW_PRECISION_GEMM_DTYPES:
        notes.append(
            f"precision {job.precision.recipe}: the plan timed {job.precision.gemm_dtype.upper()} "
            "GEMMs; torchtitan converts its linear layers by the config's model converters, "
            "which these settings do not set"
        )
    if lay["recompute"] != "none":
        notes.append(
            f"recompute {lay['recompute']}: torchtitan chooses activation checkpointing by the "
            "config's activation_checkpoint class (SelectiveAC or FullAC) in its config registry"
        )
    text = " \\\n  ".join(
        _tyro_flag(key, value) for key, value in settings.items() if value is not None
    )
    return Emitted(trainer="torchtitan", text=text, notes=notes)


def _tyro_flag(key: str, value) -> str:
    """tyro's spelling: ``--section.field value``; booleans ``--section.field`` / ``.no-field``."""
    if isinstance(value, bool):
        section, field = key.split(".")
        return f"--{key}" if value else f"--{section}.no-{field}"
    return f"--{key} {value}"
