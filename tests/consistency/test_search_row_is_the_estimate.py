"""The search's row and the single-layout report are one computation (DESIGN.md, "One home
per quantity"): for random valid layouts of every catalog model under every schedule, ZeRO
stage and recompute policy, the columns model's row (what the search screens and ranks)
agrees part by part with the report of that layout over every pipeline rank."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hwspecs.catalog import load_accelerator, load_cluster
from hwspecs.errors import PlanError
from planner import api
from planner.comm.context_parallel import cp_inner_degree
from planner.comm.terms import rank_shape
from planner.comm.topology import degrees
from planner.comm.traffic import AXES
from planner.cost.memory import MEMORY_PARTS
from planner.estimate import estimate, layout_columns
from planner.evaluate import evaluate_columns
from planner.memory_report import memory_report
from planner.pipeline import closed_form
from planner.pipeline.schedules import SCHEDULES
from planner.spec.layout import CP_ALGORITHMS, DEFAULT_MESH_ORDER, Layout
from planner.spec.model import load_model
from planner.spec.recompute import module_policies
from planner.spec.rules import check_layout

MODELS = api.catalog_names("models")
CLUSTER = load_cluster("dgx-h100")
ACCELERATOR = load_accelerator(CLUSTER.accelerator)
SEQ_LEN = 4096


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


@st.composite
def jobs_and_layouts(draw):
    """A catalog model, a job and a layout that check_layout accepts (others are assumed away)."""
    name = draw(st.sampled_from(MODELS))
    model = load_model(name)
    schedule = draw(st.sampled_from(list(SCHEDULES)))
    spec = SCHEDULES[schedule]
    tp = draw(st.sampled_from(_divisors(model.num_attention_heads, 8)))
    pp = draw(st.sampled_from([p for p in (1, 2, 3, 4, 6, 8, 16) if p <= model.num_layers]))
    if spec.fixed_vpp is not None:
        vpp = spec.fixed_vpp
    elif schedule == "interleaved-1f1b":
        vpp = draw(st.sampled_from([2, 3, 4]))
    else:
        vpp = 1
    assume(pp > 1 or schedule in ("gpipe", "1f1b"))
    cp = draw(st.sampled_from([1, 2, 4]))
    cp_algorithm = draw(st.sampled_from(CP_ALGORITHMS)) if cp > 1 else "all-gather"
    dp = draw(st.sampled_from([1, 2, 4, 8]))
    ep, etp = 1, None
    if model.is_moe:
        ep = draw(st.sampled_from(_divisors(model.num_routed_experts, 64)))
        etp = draw(st.sampled_from([None, 1]))
    m = draw(st.sampled_from([pp, 2 * pp, 3 * pp, 4 * pp]))
    mbs = draw(st.sampled_from([1, 2]))
    layout_fields = dict(
        tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, etp=etp, vpp=vpp, schedule=schedule,
        micro_batch_size=mbs, num_microbatches=m,
        zero_stage=draw(st.sampled_from([0, 1, 2, 3])),
        recompute=draw(st.sampled_from(["none", "selective", "dots", "full", *module_policies(model)])),
        sequence_parallel=draw(st.booleans()), cp_algorithm=cp_algorithm,
        pipeline_layer_split=draw(st.sampled_from(["auto", "work-balanced"])),
    )  # fmt: skip
    try:
        layout = Layout(**layout_fields)
        job = api.build_job(name, SEQ_LEN, global_batch_size=dp * m * mbs,
                            ep_comm_overlap=model.is_moe and draw(st.booleans()),
                            cuda_graphs=draw(st.booleans()))  # fmt: skip
        inner = cp_inner_degree(degrees(layout), DEFAULT_MESH_ORDER, CLUSTER.scale_up_domain_size)
        check_layout(layout, job.model, SEQ_LEN, cp_inner=inner)
        closed_form._check(schedule, pp, m, vpp)
    except (PlanError, ValueError):
        assume(False)
    assume(layout.num_gpus <= CLUSTER.num_gpus)
    return job, layout


def _row(job, layout):
    m = layout.resolved_num_microbatches(job.global_batch_size)
    row = evaluate_columns(job, CLUSTER, ACCELERATOR, layout_columns(layout, m))
    return {key: value[0] for key, value in row.items()}


PROPERTY = settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.filter_too_much]
)


@PROPERTY
@given(jobs_and_layouts())
def test_memory_of_the_search_row_is_the_worst_rank_of_every_rank(case):
    job, layout = case
    row = _row(job, layout)
    report = memory_report(job, layout, ACCELERATOR)
    assert math.isclose(row["memory_per_gpu_bytes"], report.total_bytes, rel_tol=1e-9)
    peak = report.per_stage[int(row["peak_rank"])]
    assert math.isclose(peak.total_bytes, report.total_bytes, rel_tol=1e-9)
    for part in MEMORY_PARTS:
        assert math.isclose(
            row[f"memory_{part}_bytes"], getattr(peak, part), rel_tol=1e-9, abs_tol=1.0
        ), part


@PROPERTY
@given(jobs_and_layouts())
def test_estimate_reports_the_search_row(case):
    job, layout = case
    row = _row(job, layout)
    assume(row["valid"])
    report = estimate(job, layout, CLUSTER)
    assert math.isclose(report.step_time_s, row["step_time_s"], rel_tol=1e-12)
    assert math.isclose(report.memory_per_gpu_bytes, row["memory_per_gpu_bytes"], rel_tol=1e-9)
    assert report.fits == (row["memory_per_gpu_bytes"] <= report.usable_bytes)


def test_the_strategy_reaches_every_model_and_schedule():
    """The property above is not vacuous: it draws every catalog model and schedule."""
    seen_models, seen_schedules, seen_cp = set(), set(), set()

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
    @given(jobs_and_layouts())
    def collect(case):
        seen_models.add(case[0].model.name)
        seen_schedules.add(case[1].schedule)
        if case[1].cp > 1:
            seen_cp.add(case[1].cp_algorithm)

    collect()
    assert seen_schedules == set(SCHEDULES)
    assert seen_cp == set(CP_ALGORITHMS)
    assert len(seen_models) == len(MODELS)


@pytest.mark.parametrize("name", MODELS)
def test_every_model_has_a_layout_whose_memory_rows_agree_at_every_rank(name):
    """Deterministic companion of the property: one layout per model, every rank examined."""
    model = load_model(name)
    pp = 4 if model.num_layers >= 8 else 2
    layout = Layout(pp=pp, dp=8, ep=8 if model.is_moe else 1, num_microbatches=4 * pp)
    job = api.build_job(name, SEQ_LEN, global_batch_size=8 * 4 * pp)
    row = _row(job, layout)
    report = memory_report(job, layout, ACCELERATOR)
    assert np.isclose(row["memory_per_gpu_bytes"], report.total_bytes, rtol=1e-9)


@PROPERTY
@given(jobs_and_layouts())
def test_data_parallel_traffic_reduces_the_parameters_memory_holds(case):
    """The DP (and expert-DP) gradient traffic is sized by the parameters of the rank that
    holds the most, as the memory model counts them (MTP, MLA's whole down-projections,
    replicated KV heads and DualPipe's two copies included)."""
    job, layout = case
    spec = SCHEDULES[layout.schedule]
    shape = rank_shape(
        job.model, np.asarray(layout.tp), np.asarray(layout.pp), np.asarray(layout.ep),
        np.asarray(spec.fixed_vpp or layout.vpp), layout.pipeline_layer_split, layout.etp,
        layout.schedule in ("zbv", "dualpipev"), layout.schedule == "dualpipe",
    )  # fmt: skip
    report = memory_report(job, layout, ACCELERATOR)
    expert = max(stage.num_expert_params for stage in report.per_stage)
    dense = max(stage.num_params - stage.num_expert_params for stage in report.per_stage)
    if layout.ep == 1:  # routed experts replicated like the dense weights: one gradient group
        dense = max(stage.num_params for stage in report.per_stage)
        expert = 0
    assert math.isclose(float(shape.dense_params), dense, rel_tol=1e-6, abs_tol=1)
    assert math.isclose(float(shape.expert_params), expert, rel_tol=1e-6, abs_tol=1)


@PROPERTY
@given(jobs_and_layouts())
def test_comm_exposes_what_the_estimate_exposes_per_axis(case):
    job, layout = case
    row = _row(job, layout)
    assume(row["valid"])
    report = api.comm(job, layout, CLUSTER.id)
    exposed = {axis.axis: axis.exposed_time_s for axis in report.axes}
    raw = {axis.axis: axis.time_s for axis in report.axes}
    for axis in AXES:
        assert math.isclose(exposed.get(axis, 0.0), row[f"{axis}_exposed_time_s"],
                            rel_tol=1e-9, abs_tol=1e-12), axis  # fmt: skip
        assert math.isclose(raw.get(axis, 0.0), row[f"{axis}_time_s"], rel_tol=1e-9,
                            abs_tol=1e-12), axis  # fmt: skip


@PROPERTY
@given(jobs_and_layouts(), st.sampled_from([0.0, 0.05, 0.2]))
def test_memory_and_estimate_say_fits_alike(case, headroom):
    job, layout = case
    row = _row(job, layout)
    assume(row["valid"])
    by_memory = api.memory(job, layout, ACCELERATOR.id, headroom)
    by_estimate = api.estimate(job, layout, CLUSTER.id, mem_headroom=headroom)
    usable = ACCELERATOR.hbm_bytes * (1 - headroom)
    assert by_memory.usable_bytes == by_estimate.usable_bytes == usable
    assert by_memory.fits == by_estimate.fits == (row["memory_per_gpu_bytes"] <= usable)


@st.composite
def any_layouts(draw):
    """Degrees drawn without regard to the rules (most break one)."""
    name = draw(st.sampled_from(MODELS))
    model = load_model(name)
    fields = dict(
        tp=draw(st.sampled_from([1, 2, 3, 4, 8, 16])), cp=draw(st.sampled_from([1, 2, 3, 4])),
        pp=draw(st.sampled_from([1, 2, 4, 7, 16, 64])), dp=draw(st.sampled_from([1, 2, 3, 8])),
        ep=draw(st.sampled_from([1, 2, 3, 8, 16] if model.is_moe else [1, 2])),
        sequence_parallel=draw(st.booleans()),
    )  # fmt: skip
    fields["etp"] = draw(st.sampled_from([None, 1, 2]))
    fields["cp_algorithm"] = draw(st.sampled_from(CP_ALGORITHMS))
    return name, fields


@settings(max_examples=300, deadline=None)
@given(any_layouts(), st.sampled_from([4096, 4100, 6144]))
def test_check_layout_and_the_search_reject_by_the_same_rule(case, seq_len):
    """One rule table: the rule check_layout names is the first the search's screen counts."""
    from planner.candidates import SearchSpace, rejection_masks
    from planner.spec.rules import RULES, first_broken, layout_columns_for_rules

    name, fields = case
    model = load_model(name)
    layout = Layout(**fields)
    job = api.build_job(name, seq_len, global_batch_size=layout.dp * 64)
    columns = layout_columns_for_rules(layout)
    found = first_broken(RULES, model, seq_len, columns)
    try:
        check_layout(layout, model, seq_len)
        raised = None
    except PlanError as error:
        raised = str(error)
    assert (raised is None) == (found is None)
    if found is None:
        return
    assert raised == found[0].message(model, seq_len, {**fields, "etp": layout.expert_tp,
                                                         "vpp": layout.vpp})  # fmt: skip
    grid = {k: v for k, v in columns.items() if k != "split"}
    grid["micro_batch_size"] = np.array([1])
    space = SearchSpace(allow_cross_node_tp=True)
    hits = [reason for reason, mask in rejection_masks(job, CLUSTER, grid, space) if mask.any()]
    assert hits and hits[0] == found[0].reason(model)


@PROPERTY
@given(jobs_and_layouts())
def test_collectives_count_the_layers_the_busiest_rank_runs(case):
    """Layers per micro-batch on the busiest rank, as the collectives count them, are the
    layers the memory model places there (DualPipe: the mean of a rank's two stages)."""
    job, layout = case
    spec = SCHEDULES[layout.schedule]
    shape = rank_shape(
        job.model, np.asarray(layout.tp), np.asarray(layout.pp), np.asarray(layout.ep),
        np.asarray(spec.fixed_vpp or layout.vpp), layout.pipeline_layer_split, layout.etp,
        spec.v_shape, spec.bidirectional,
    )  # fmt: skip
    report = memory_report(job, layout, ACCELERATOR)
    held = max(stage.num_layers for stage in report.per_stage)  # DualPipe: own + mirror
    per_microbatch = held / 2 if spec.bidirectional else held
    assert math.isclose(float(shape.layers), per_microbatch)


@PROPERTY
@given(jobs_and_layouts(), st.sampled_from([None, "lora", "qlora", "dora"]))
def test_the_memory_report_is_the_scalar_memory_model_on_every_rank(case, recipe):
    """The report (the columns model with every rank examined) against the scalar formulas
    one rank at a time (tests/consistency/reference_memory.py), full training and
    fine-tuning recipes alike."""
    from reference_memory import reference_ranks

    job, layout = case
    if recipe is not None:
        job = job.model_copy(update={"finetune": api.build_finetune(recipe=recipe)})
    try:
        expected = reference_ranks(job, layout, ACCELERATOR)
    except PlanError:
        assume(False)
    report = memory_report(job, layout, ACCELERATOR)
    for stage, ref in zip(report.per_stage, expected, strict=True):
        for key in ("num_layers", "num_params", "num_expert_params"):
            assert getattr(stage, key) == ref[key], key
        assert math.isclose(stage.inflight_microbatches, ref["inflight_microbatches"])
        for part in MEMORY_PARTS:
            assert math.isclose(getattr(stage, part), ref[part], rel_tol=1e-9, abs_tol=1.0), part
    if recipe is not None and report.recipe_breakdown_bytes is not None:
        peak = expected[report.peak_rank]["recipe"]
        assert report.recipe_breakdown_bytes.keys() == peak.keys()
        for key, value in peak.items():
            assert math.isclose(report.recipe_breakdown_bytes[key], value, rel_tol=1e-9,
                                abs_tol=1.0), key  # fmt: skip
