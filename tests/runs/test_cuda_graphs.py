"""CUDA graphs: a job whose layers replay from graphs pays no per-kernel launch cost, and
the published runs whose release recipe captured their layers whole say so."""

from __future__ import annotations

import json

import pytest

from hwspecs.catalog import load_profile, load_runs
from planner import api
from planner.runs.rows import model_spec, run_job


def _with_kernel_cost(profile, seconds: float):
    """``profile`` with its per-kernel term set to ``seconds`` (whatever a refit left it at)."""
    terms = dict(profile.terms)
    terms["kernel_overhead_s"] = terms["kernel_overhead_s"].model_copy(update={"value": seconds})
    return profile.model_copy(update={"terms": terms})


def test_cuda_graphs_drop_the_per_kernel_cost_and_nothing_else():
    profile = _with_kernel_cost(load_profile("b200"), 1e-5)
    layout = api.Layout(tp=1, pp=1, dp=8, micro_batch_size=1)
    results = {}
    for graphs in (False, True):
        job = api.build_job("llama3-8b", 8192, global_batch_size=128, cuda_graphs=graphs)
        job = job.model_copy(update={"efficiency_profile": profile})
        results[graphs] = api.estimate(job, layout, "dgx-b200", 8)
    eager, graphed = results[False], results[True]
    assert graphed.cuda_graphs and not eager.cuda_graphs
    assert eager.time_breakdown_s["profile_kernels"] > 0
    assert graphed.time_breakdown_s["profile_kernels"] == 0
    saved = eager.step_time_s - graphed.step_time_s
    assert saved == pytest.approx(eager.time_breakdown_s["profile_kernels"], rel=1e-9)
    others = {k: v for k, v in eager.time_breakdown_s.items() if k != "profile_kernels"}
    assert others == {k: graphed.time_breakdown_s[k] for k in others}


def test_cuda_graphs_change_nothing_in_the_ideal_model():
    job = api.build_job("llama3-8b", 4096, global_batch_size=64)
    graphed = api.build_job("llama3-8b", 4096, global_batch_size=64, cuda_graphs=True)
    assert graphed.cuda_graphs and not job.cuda_graphs
    layout = api.Layout(tp=1, pp=1, dp=8, micro_batch_size=1)
    times = [api.estimate(j, layout, "dgx-h100", 8).step_time_s for j in (job, graphed)]
    assert times[0] == times[1]


#: Rows whose release recipe replayed the layers from graphs (Megatron-Bridge's workload
#: configs at the release's tag: one graph per iteration from 26.06, Llama 3 8B's in 25.11;
#: per-layer graphs in 25.09's perf_matrix), and rows of the same models whose release
#: captured only parts of a layer (attention, router: TransformerEngine graphs) or nothing.
GRAPHED = (
    "mbridge-26.06-gb200-deepseekv3-pretrain-mxfp8-256g-main",
    "mbridge-25.11-gb200-llama3-8b-pretrain-fp8-cs-8g-main",
    "mbridge-25.09-b200-llama3-8b-pretrain-fp8[prec-8g-main",
)
EAGER = (
    "mbridge-26.04-gb200-deepseekv3-pretrain-mxfp8-256g-main",
    "mbridge-26.06-h100-llama3-1-405b-pretrain-fp8-1024g-main",
)


def test_runs_take_cuda_graphs_from_their_release_recipe():
    rows = {row.id: row for row in load_runs("train")}
    for ids, expected in ((GRAPHED, True), (EAGER, False)):
        for row_id in ids:
            row = rows[row_id]
            assert bool(row.training.cuda_graphs) is expected, row_id
            assert run_job(row, model_spec(row)).cuda_graphs is expected
    supplement = next(s for s in rows[GRAPHED[0]].supplements if s.field == "training.cuda_graphs")
    assert supplement.release == rows[GRAPHED[0]].training.framework_version
    assert supplement.source_ref.repo == "NVIDIA-NeMo/Megatron-Bridge"
    assert "full_iteration" in supplement.quote
    graphed = {row.id for row in rows.values() if row.training.cuda_graphs}
    assert all(row_id.startswith("mbridge-") for row_id in graphed)
    assert len(graphed) == 30


def test_a_release_recipe_fills_only_rows_of_that_release():
    """A supplement from a release's recipe (at its tag, not at the table's commit) fills
    only rows that name that release; another release's row is refused."""
    from tests.runs.test_runs import _catalog_build

    build = _catalog_build()
    entry = next(e for e in json.loads(build.SUPPLEMENTS.read_text())
                 if e["field"] == "training.cuda_graphs")  # fmt: skip
    row = next(r for r in load_runs("train") if r.id == entry["ids"][0])
    raw = json.loads(row.model_dump_json())
    raw["training"]["cuda_graphs"], raw["supplements"] = None, []
    assert build.supplemented(raw, [entry])["training"]["cuda_graphs"] is True
    raw["training"]["framework_version"] = "NeMo 24.01 container"
    with pytest.raises(SystemExit, match="another commit"):
        build.supplemented(raw, [entry])
