"""Work kept over calls returns what a fresh computation returns.

The search does some work once and reads it again: the event simulator once per distinct
pipeline among the top rows (:func:`planner.refine.refine`), the busiest rank's parameters
once per model and key over the timed blocks (:func:`planner.structure.params.
busiest_rank_params`), the busiest rank's layers once per distinct pipeline
(:func:`planner.structure.stages.pipeline_rank_layers`). Each must give what the work done
afresh gives, and never one model's answer for another.
"""

from __future__ import annotations

import numpy as np

import planner.refine as refine_module
from hwspecs.catalog import load_accelerator, load_cluster
from planner import api
from planner.estimate import layout_columns
from planner.evaluate import evaluate_columns
from planner.refine import refine
from planner.spec.layout import Layout
from planner.spec.model import load_model
from planner.structure import params
from planner.structure.stages import busiest_rank_layers, rank_structure

CLUSTER = load_cluster("dgx-h100")
H100 = load_accelerator("h100-sxm")
JOB = api.build_job("llama3-8b", 4096, global_batch_size=64)


def _row(layout: Layout) -> tuple[dict, int]:
    m = layout.resolved_num_microbatches(JOB.global_batch_size)
    row = evaluate_columns(JOB, CLUSTER, H100, layout_columns(layout, m))
    return {key: value[0] for key, value in row.items()} | {"num_microbatches": m}, m


def test_rows_with_one_pipeline_are_simulated_once(monkeypatch):
    """Two rows that differ only in the ZeRO stage (which the pipeline's stage durations do
    not see here) run one simulation and get the same simulated time; a third with another
    pipeline runs its own."""
    calls = []
    simulate = refine_module.simulated_step_time

    def counted(*args, **kwargs):
        calls.append(1)
        return simulate(*args, **kwargs)

    monkeypatch.setattr(refine_module, "simulated_step_time", counted)
    layouts = [
        Layout(pp=4, dp=2, schedule="1f1b", zero_stage=1),
        Layout(pp=4, dp=2, schedule="1f1b", zero_stage=0),
        Layout(pp=4, dp=2, schedule="zb-h1", zero_stage=1),
    ]
    rows = [_row(layout)[0] for layout in layouts]
    assert rows[0]["forward_s"] == rows[1]["forward_s"]  # the premise: same durations
    refined = refine(JOB, H100, layouts, rows)
    assert len(calls) == 2
    assert refined[0]["pipeline_time_simulated_s"] == refined[1]["pipeline_time_simulated_s"]
    fresh = refine(JOB, H100, layouts[1:2], rows[1:2])[0]
    assert fresh["pipeline_time_simulated_s"] == refined[1]["pipeline_time_simulated_s"]


def test_busiest_rank_params_are_each_models_own():
    """The same key asked of two models (one after the other, then again) gives each model's
    own parameters: the values kept per model never answer for another."""
    columns = (np.array([2]), np.array([4]), np.array([1]), np.array([2]), np.array([1]),
               np.array([False]), np.array([False]))  # fmt: skip
    small, large = load_model("llama3-8b"), load_model("llama3-70b")
    first = params.busiest_rank_params(small, *columns)
    other = params.busiest_rank_params(large, *columns)
    assert [float(v[0]) for v in first] != [float(v[0]) for v in other]
    params._BUSIEST.clear()
    assert [float(v[0]) for v in params.busiest_rank_params(large, *columns)] == [
        float(v[0]) for v in other
    ]
    assert [float(v[0]) for v in params.busiest_rank_params(small, *columns)] == [
        float(v[0]) for v in first
    ]


def test_busiest_rank_layers_are_each_pipelines_ranks():
    """Rows of several pipelines read their own pipeline's per-rank layers (the arrays are
    worked out once per distinct pipeline and read by index)."""
    model = load_model("deepseek-v3")
    pp = np.array([4, 8, 4, 16])
    chunks = np.array([1, 1, 2, 1])
    ranks = busiest_rank_layers(model, pp, chunks, np.zeros(4, bool), np.zeros(4, bool))
    for row, (p, c) in enumerate(zip(pp, chunks, strict=True)):
        schedule = "interleaved-1f1b" if c > 1 else "1f1b"
        own = rank_structure(model, int(p), int(c), schedule, "auto")
        expected = np.add(own.dense_layers, own.moe_layers)
        assert ranks["layers"][row, : int(p)].tolist() == expected.tolist()
        assert not ranks["layers"][row, int(p) :].any()
