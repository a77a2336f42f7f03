"""The search's fast paths against the straightforward computation they replace.

The screen runs its rules on (degrees, schedule/vpp, micro-batch, SP) rows and expands ZeRO
× recompute afterwards; the closed forms take pp, m and vpp as columns; the evaluation times
only the rows that fit; ranking sorts numpy columns. Each must give what the plain form
gives, row for row.
"""

import numpy as np
import pandas as pd
import pytest

from hwspecs.errors import PlanError
from planner.candidates import (
    SearchSpace,
    _schedule_options,
    expand_rows,
    screening_grid,
)
from planner.estimate import layout_columns
from planner.evaluate import evaluate_columns
from planner.memory_report import memory_report
from planner.pipeline import closed_form as cf
from planner.pipeline.schedules import SCHEDULES
from planner.search import RANKING_COLUMNS, RANKING_KEYS, _ranking
from planner.spec.layout import Layout
from tests.columns.screened_grid import DGX, H100, JOB, MOE_JOB, screened_grid


def _legal_rows(name: str, rng: np.random.Generator, count: int):
    """Random (pp, m, vpp) rows that the schedule accepts."""
    spec = SCHEDULES[name]
    rows = []
    while len(rows) < count:
        pp = int(rng.choice([1, 2, 3, 4, 6, 8]))
        vpp = spec.fixed_vpp or (int(rng.integers(2, 5)) if name == "interleaved-1f1b" else 1)
        m = int(rng.integers(1, 5 * pp + 3))
        try:
            cf.step_time(name, pp, m, vpp)
        except PlanError:  # an illegal row: draw another
            continue
        rows.append((pp, m, vpp))
    return np.array(rows).T


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_closed_forms_on_columns_equal_one_call_per_row(name):
    rng = np.random.default_rng(5)
    pp, m, vpp = _legal_rows(name, rng, 40)
    f, b, w = rng.uniform(0.2, 3.0, (3, len(pp)))
    step = cf.step_time(name, pp, m, vpp, f, b, w)
    busy = cf.busy_time(name, pp, m, vpp, f, b, w)
    rank = rng.integers(0, pp)
    inflight = cf.activation_microbatches_at(name, pp, m, vpp, rank)
    for i in range(len(pp)):
        args = (name, int(pp[i]), int(m[i]), int(vpp[i]))
        assert step[i] == cf.step_time(*args, f[i], b[i], w[i])
        assert busy[i] == cf.busy_time(*args, f[i], b[i], w[i])
        assert inflight[i] == cf.peak_activation_microbatches(*args)[rank[i]]


def test_closed_forms_on_columns_reject_an_illegal_row_with_its_message():
    with pytest.raises(PlanError, match="dualpipe needs an even pp"):
        cf.step_time("dualpipe", np.array([4, 3]), np.array([8, 8]), np.array([1, 1]))


def _full_grid(job, gpus, space):
    """The candidate grid as one meshgrid over every knob (the plain construction)."""
    divisors = [d for d in range(1, gpus + 1) if gpus % d == 0]
    tps = [d for d in divisors if d <= 64]
    cps = [d for d in divisors if d <= space.max_cp]
    pps = [d for d in divisors if d <= job.model.num_layers + 2]
    experts = job.model.num_routed_experts if job.model.is_moe else 1
    eps = [d for d in range(1, experts + 1) if experts % d == 0]
    t, c, p, x = (a.ravel() for a in np.meshgrid(tps, cps, pps, eps, indexing="ij"))
    keep = gpus % (t * c * p) == 0
    t, c, p, x = t[keep], c[keep], p[keep], x[keep]
    # Each degree row once per CP algorithm where cp > 1, once (the first) where cp = 1.
    algorithms = [(i, a) for i in range(len(t)) for a in range(len(space.cp_algorithm))
                  if a == 0 or c[i] > 1]  # fmt: skip
    row, algorithm = (np.array(v) for v in zip(*algorithms, strict=True))
    t, c, p, x = t[row], c[row], p[row], x[row]
    pairs = _schedule_options(space, job.model.num_layers)
    index = np.meshgrid(
        np.arange(len(t)),
        np.arange(len(pairs)),
        space.micro_batch_size,
        space.zero_stage,
        np.arange(len(space.recompute)),
        space.sequence_parallel,
        indexing="ij",
    )
    degree, pair, mbs, zero, recompute, sp = (g.ravel() for g in index)
    columns = {
        "tp": t[degree],
        "cp": c[degree],
        "pp": p[degree],
        "dp": (gpus // (t * c * p))[degree],
        "ep": x[degree],
        "vpp": np.array([v for _, v in pairs])[pair],
        "micro_batch_size": mbs,
        "schedule": np.array([n for n, _ in pairs], dtype=object)[pair],
        "zero_stage": zero,
        "recompute": np.array(space.recompute, dtype=object)[recompute],
        "sequence_parallel": sp.astype(bool),
        "cp_algorithm": np.array(space.cp_algorithm, dtype=object)[algorithm[degree]],
    }
    keep = (columns["tp"] > 1) | ~columns["sequence_parallel"]
    return {k: v[keep] for k, v in columns.items()}


@pytest.mark.parametrize(
    "space", [SearchSpace(), SearchSpace(zero_stage=[1, 3], recompute=["full", "none"])]
)
def test_screened_rows_expand_to_the_full_grid_in_its_order(space):
    grid = screening_grid(JOB, DGX, 64, space)
    expanded = expand_rows(grid.columns(), grid.cells, grid.shape, space)
    plain = _full_grid(JOB, 64, space)
    for key, column in plain.items():
        np.testing.assert_array_equal(expanded[key], column, err_msg=key)


@pytest.mark.parametrize("job", [JOB, MOE_JOB], ids=["dense", "moe"])
def test_timing_only_rows_that_fit_changes_none_of_their_numbers(job):
    space = SearchSpace(micro_batch_size=[1, 4])
    columns = expand_rows(*screened_grid(job, DGX, 64, space), space)
    pick = np.random.default_rng(0).choice(len(columns["tp"]), size=400, replace=False)
    columns = {k: v[np.sort(pick)] for k, v in columns.items()}
    columns["pipeline_layer_split"] = np.full(400, "auto", dtype=object)
    limit = H100.hbm_bytes * 0.6  # some rows fit, some do not
    plain = evaluate_columns(job, DGX, H100, columns)
    screened = evaluate_columns(job, DGX, H100, columns, memory_limit_bytes=limit)
    assert list(screened) == list(plain)
    timed = plain["valid"] & (plain["memory_per_gpu_bytes"] <= limit)
    assert timed.any() and (~timed).any()
    for key, value in plain.items():
        if key.startswith("memory_") or key in ("peak_rank", "valid", "checkpoint_bytes_per_rank"):
            np.testing.assert_array_equal(screened[key], value, err_msg=key)
        else:
            np.testing.assert_array_equal(screened[key][timed], value[timed], err_msg=key)
            assert np.isnan(screened[key][~timed]).all(), key


@pytest.mark.parametrize("objective", ["step_time", "memory", "mfu", "time_to_train"])
def test_numpy_ranking_equals_the_stable_table_sort(objective):
    rng = np.random.default_rng(2)
    table = pd.DataFrame(  # few distinct values: many ties, broken by row order
        {
            "step_time_s": rng.integers(0, 5, 300) * 0.5,
            "memory_per_gpu_bytes": rng.integers(0, 4, 300) * 2.0**30,
            "mfu": rng.integers(0, 5, 300) * 0.1,
            "expected_wall_time_s": rng.integers(0, 5, 300) * 1e6,
            "row": np.arange(300),
        }
    )
    order = _ranking({k: table[k].to_numpy() for k in RANKING_COLUMNS}, objective)
    names, ascending = RANKING_KEYS[objective]
    expected = table.sort_values(list(names), ascending=list(ascending), kind="stable")
    np.testing.assert_array_equal(table["row"].to_numpy()[order], expected["row"].to_numpy())


@pytest.mark.parametrize("pp, tp, zero", [(4, 2, 1), (2, 1, 0), (8, 1, 3)])
def test_dualpipe_examined_slots_hold_the_true_memory_peak(pp, tp, zero):
    """DualPipe's ranks hold two directions (states, embedding and head of both ends): the
    per-structure table's examined ranks peak where memory_report, over every rank, does."""
    layout = Layout(tp=tp, pp=pp, dp=64 // (tp * pp), schedule="dualpipe", zero_stage=zero)
    m = layout.resolved_num_microbatches(JOB.global_batch_size)
    row = evaluate_columns(JOB, DGX, H100, layout_columns(layout, m))
    assert row["memory_per_gpu_bytes"][0] == memory_report(JOB, layout, H100).total_bytes
