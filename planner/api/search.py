"""The search: the ranked plan with the winners' estimates, a sweep over GPU counts or
sequence lengths, the page sample and the hand-off to a trainer."""

from __future__ import annotations

from pydantic import BaseModel

from hwspecs.errors import PlanError, unknown_name_error
from planner.api.inputs import (
    _checked_headroom,
    build_job,
    build_search_space,  # noqa: F401
    with_profile,
)
from planner.api.layout import _with_time_to_train
from planner.cost.profile import flop_shares
from planner.explain import (
    cp_algorithm_lines,
    explain_plan,
    layer_split_lines,
    profile_term_lines,
)
from planner.rank import RANK_MODES, RankSettings, explain_ranking


def rank_settings(
    rank: str, accelerator: str, profile, seq_len: int, attention_share: float | None = None
) -> RankSettings:
    """``--rank`` checked, with the band measured for ``profile`` on ``accelerator``
    (:func:`planner.runs.ratio_error.ranking_band`) and the layouts it was measured on
    (the profile's, or the ideal model's band's: the shipped profile's runs);
    ``attention_share``: the job's attention FLOP share, said where beyond the runs'."""
    from planner.layout_range import measured_layout_range
    from planner.runs.ratio_error import ranking_band

    if rank not in RANK_MODES:
        raise PlanError(f"unknown rank '{rank}'; choose one of: {', '.join(RANK_MODES)}",
                        field="rank", allowed=list(RANK_MODES), got=rank)  # fmt: skip
    band, source = ranking_band(accelerator, profile)
    layouts = measured_layout_range(profile, accelerator)
    return RankSettings(
        mode=rank,
        band=band,
        band_source=source,
        layout_range=layouts,
        seq_len=seq_len,
        attention_share=attention_share,
    )


class PlanResult(BaseModel):
    """The ranked plan: the query, what was screened, rejections and the top results."""

    query: dict
    candidates_evaluated: int
    feasible: int
    rejected: dict[str, int]
    results: list[dict]
    explanation: list[str] = []


def _time_to_train_ranking(objective: str, results: list[dict]) -> list[str]:
    """Under objective time_to_train: the winner's and runner-up's expected wall times."""
    if objective != "time_to_train" or len(results) < 2:
        return []
    first, second = (entry["time_to_train"] for entry in results[:2])
    return [
        f"ranked by expected wall time of {first['train_tokens']:.4g} tokens, failures included: "
        f"{first['wall_time_days']:.2f} days (goodput {100 * first['goodput']:.1f}%) vs "
        f"{second['wall_time_days']:.2f} days (goodput {100 * second['goodput']:.1f}%) for the "
        f"runner-up"
    ]


def plan(
    job,
    cluster: str,
    gpus: int | None,
    space,
    objective: str = "step_time",
    mem_headroom: float | None = None,
    top: int = 5,
    mfu_dtype: str = "bf16",
    order: str | None = None,
    progress=None,
    refine_top: int | None = None,
    profile: str | None = None,
    training=None,
    rank: str = "robust",
    stack: str | None = None,
    every_output: bool = True,
    with_table: bool = True,
):
    """Search every layout and return the top ones with their full estimates; also the table
    (a pandas DataFrame of the ranked rows; ``with_table`` False: None, and no pandas).
    ``refine_top``: rows re-timed by the event simulator (default
    :data:`planner.refine.DEFAULT_REFINE_TOP`); ``profile`` and ``stack``: see :func:`with_profile` (None: the ideal model);
    ``training`` (:func:`build_training`) adds each result's time to train and the
    ``expected_wall_time_s`` column; objective ``time_to_train`` ranks by it. ``rank``:
    ``robust`` (layouts within the measured ratio error of the fastest are ties, ordered by
    :mod:`planner.rank`'s rules) or ``time`` (by predicted step time alone).
    ``every_output``: the table holds every output (False: the layout and what the
    ranking reads, :func:`planner.search.search`; the results are the same). With neither
    every output nor the table, only the rows that can reach the first ``top`` are timed
    (:func:`planner.search.search`'s ``only_top``; the results are the same)."""
    from hwspecs.catalog import load_accelerator, load_cluster
    from planner.comm.mesh import resolve_order
    from planner.cost.profile import profile_label
    from planner.estimate import estimates
    from planner.search import OBJECTIVES, layout_of_row, search

    objective = objective.replace("-", "_")
    if objective not in OBJECTIVES:
        raise PlanError(f"unknown objective '{objective}'; choose one of: {', '.join(OBJECTIVES)}")
    if objective == "time_to_train" and training is None:
        raise PlanError("--objective time-to-train needs --train-tokens (e.g. 15T or 2e12)")
    mem_headroom = _checked_headroom(mem_headroom)
    spec = load_cluster(cluster)
    gpus = gpus or spec.num_gpus
    if gpus > spec.num_gpus:
        raise PlanError(f"--gpus {gpus} exceeds cluster {spec.id}'s {spec.num_gpus} GPUs")
    accelerator = load_accelerator(spec.accelerator)
    job = with_profile(job, spec.accelerator, profile, stack)
    attention_share = flop_shares(job.model, job.seq_len)[0]
    ranking = rank_settings(
        rank, spec.accelerator, job.efficiency_profile, job.seq_len, attention_share
    )
    mesh = resolve_order(order) if order else None
    from planner.refine import DEFAULT_REFINE_TOP

    if refine_top is not None and refine_top < 0:
        raise PlanError(f"--refine-top must be ≥ 0, got {refine_top}")
    found = search(
        job, spec, accelerator, gpus, space, objective, mem_headroom, mesh, mfu_dtype, progress,
        DEFAULT_REFINE_TOP if refine_top is None else refine_top,
        training=training, rank_settings=ranking, every_output=every_output,
        only_top=None if every_output or with_table else top,
    )  # fmt: skip
    results = []
    rows = found.top_rows(top)
    layouts = [layout_of_row(row, job.model.is_moe) for row in rows]
    details = estimates(job, layouts, spec, gpus, mfu_dtype, mem_headroom, order=mesh)
    for place, (row, layout, detail) in enumerate(zip(rows, layouts, details, strict=True), 1):
        if training is not None:
            detail = _with_time_to_train(detail, job, training)
        entry = detail.model_dump(mode="json")
        entry["layout"]["num_microbatches"] = layout.num_microbatches
        simulated = row["step_time_simulated_s"] == row["step_time_simulated_s"]  # not NaN
        entry["simulated"] = (  # the event simulator's pipeline, stage by stage
            {
                "pipeline_time_closed_form_s": float(row["pipeline_time_s"]),
                "pipeline_time_simulated_s": float(row["pipeline_time_simulated_s"]),
                "step_time_simulated_s": float(row["step_time_simulated_s"]),
            }
            if simulated
            else None
        )
        entry["rank_by_time"] = int(row["rank_by_time"])
        entry["equivalent_to_best"] = bool(row["equivalent_to_best"])
        entry["preference"] = str(row["preference"])
        results.append({"rank": place, **entry})
    query = {
        "model": job.model.name,
        "cluster": spec.id,
        "num_gpus": gpus,
        "seq_len": job.seq_len,
        "global_batch_tokens": job.global_batch_tokens,
        "objective": objective,
        "rank": ranking.mode,
        "ratio_error_band": ranking.band,
        "ratio_error_source": ranking.band_source,
        "measured_layout_range": (
            ranking.layout_range.model_dump() if ranking.layout_range is not None else None
        ),
        "mem_headroom": mem_headroom,
        "precision": job.precision.recipe,
        "optimizer": job.precision.optimizer,
        "recipe": job.finetune.recipe if job.finetune is not None else "full",
        "finetune": job.finetune.model_dump() if job.finetune is not None else None,
        "space": space.model_dump() if space else None,
        "profile": profile_label(job.efficiency_profile),
        "stack": stack,
        "tp_comm_overlap": bool(job.tp_comm_overlap),
        "ep_comm_overlap": job.ep_comm_overlap,
        "cuda_graphs": job.cuda_graphs,
        "attention_kernel": job.attention_kernel,
    }
    if training is not None:
        query["training"] = training.model_dump()
    if job.model.is_moe:  # the routing load the plan assumed
        query["moe_imbalance"] = job.model.moe_imbalance
        query["moe_capacity_factor"] = job.model.moe_capacity_factor
    if not results:
        from planner.explain import infeasible_reasons

        headline, reasons = infeasible_reasons(
            found, accelerator, mem_headroom, gpus, spec.num_gpus
        )
        error = PlanError(headline, field="gpus" if found.smallest_memory else None)
        error.reasons = reasons
        raise error
    result = PlanResult(
        query=query,
        candidates_evaluated=found.candidates_evaluated,
        feasible=found.feasible,
        rejected=found.rejected,
        results=results,
        explanation=explain_ranking(found.columns, ranking, objective)
        + _time_to_train_ranking(objective, results)
        + explain_plan(found, results, accelerator, mem_headroom)
        + layer_split_lines(job.model, results[0])
        + cp_algorithm_lines(job, spec, results, mesh)
        + profile_term_lines(job.efficiency_profile),
    )
    return result, found.table if with_table else None


SWEEP_QUANTITIES = ("gpus", "seq_len")


class SweepPoint(BaseModel):
    """The best layout at one value of the swept quantity (None figures: nothing fits)."""

    value: int
    num_gpus: int
    seq_len: int
    feasible: int
    layout: dict | None = None
    step_time_s: float | None = None
    mfu: float | None = None
    tokens_per_s_per_gpu: float | None = None
    cluster_tokens_per_s: float | None = None
    time_to_train: dict | None = None
    #: The efficiency profile the point's plan used (:func:`planner.cost.profile.profile_label`).
    profile: str | None = None


class SweepResult(BaseModel):
    """The plan's winner at each point of a sweep of ``quantity``."""

    quantity: str
    query: dict
    points: list[SweepPoint]


def sweep(
    job_fields: dict,
    cluster: str,
    quantity: str,
    values: list[int],
    gpus: int | None = None,
    space=None,
    objective: str = "step_time",
    mem_headroom: float = 0.05,
    training=None,
    profile: str | None = None,
    stack: str | None = None,
) -> SweepResult:
    """Run :func:`plan` at each value of ``quantity`` (``gpus`` or ``seq_len``) and keep
    the winner: where scaling stops paying shows in step time, MFU, days and goodput.

    ``job_fields``: :func:`build_job`'s arguments (``seq_len`` is replaced when swept);
    ``profile`` and ``stack``: see :func:`with_profile`."""
    from hwspecs.catalog import load_cluster
    from planner.candidates import SearchSpace

    if quantity not in SWEEP_QUANTITIES:
        raise unknown_name_error("sweep quantity", quantity, SWEEP_QUANTITIES)
    if not values:
        raise PlanError(f"--{quantity.replace('_', '-')}: give at least one value to sweep")
    space = space or SearchSpace()
    points = []
    for value in values:
        fields = {**job_fields, "seq_len": value} if quantity == "seq_len" else job_fields
        job = build_job(**fields)
        point_gpus = value if quantity == "gpus" else gpus
        try:
            result, _ = plan(
                job, cluster, point_gpus, space, objective, mem_headroom, top=1,
                training=training, profile=profile, stack=stack, every_output=False,
                with_table=False,
            )  # fmt: skip
        except PlanError as error:  # nothing fits at this point: the sweep goes on
            if getattr(error, "reasons", None) is None:
                raise
            gpus_here = point_gpus or load_cluster(cluster).num_gpus
            points.append(
                SweepPoint(value=value, num_gpus=gpus_here, seq_len=job.seq_len, feasible=0)
            )
            continue
        point = {
            "value": value,
            "num_gpus": result.query["num_gpus"],
            "seq_len": job.seq_len,
            "feasible": result.feasible,
            "profile": result.query["profile"],
        }
        if result.results:
            best = result.results[0]
            point |= {
                "layout": best["layout"],
                "step_time_s": best["step_time_s"],
                "mfu": best["mfu"],
                "tokens_per_s_per_gpu": best["tokens_per_s_per_gpu"],
                "cluster_tokens_per_s": best["tokens_per_s_per_gpu"] * best["num_gpus"],
                "time_to_train": best.get("time_to_train"),
            }
        points.append(SweepPoint(**point))
    query = {
        "model": job_fields["model"],
        "cluster": cluster,
        "objective": objective,
        "values": values,
        "training": training.model_dump() if training is not None else None,
    }
    return SweepResult(quantity=quantity, query=query, points=points)


def plan_page_sample(table):
    """The rows a plan page draws: the Pareto front and a grid sample of the feasible cloud.

    ``table`` is :func:`plan`'s table (ranked, feasible rows); see :mod:`planner.results`.
    """
    from planner.results import page_sample

    return page_sample(table["step_time_s"].to_numpy(), table["memory_per_gpu_bytes"].to_numpy())


def emit_settings(entry: dict, trainer: str, job):
    """A plan result's layout as ``trainer``'s settings (see :mod:`planner.handoff`), with
    the TP communication overlap the result was timed with."""
    from planner.handoff import emit_settings as emit
    from planner.spec.layout import model_layers_per_virtual_stage

    job = job.model_copy(
        update={
            "tp_comm_overlap": bool(entry.get("tp_comm_overlap")),
            "ep_comm_overlap": bool(entry.get("ep_comm_overlap")),
            "cuda_graphs": bool(entry.get("cuda_graphs")),
        }
    )
    lay = entry["layout"]
    split = lay.get("pipeline_layer_split", "auto")
    layers = model_layers_per_virtual_stage(
        job.model, lay["pp"], lay["vpp"], split, lay["schedule"]
    )
    return emit(entry, trainer, job, [int(count) for count in layers])


def trainer_schedules(trainer: str, pinned: list[str] | None) -> list[str]:
    """The schedules a search for ``trainer`` may use (see :mod:`planner.handoff`)."""
    from planner.handoff import trainer_schedules as schedules

    return schedules(trainer, pinned)
