"""Work done once per distinct value and broadcast, against the same rows worked out alone.

The columns model computes activations, the pipeline's compute, model states, the optimizer
step, communication buffers, placeability and every collective's bytes and raw time once
per distinct combination of the fields they read (:mod:`planner.columns.codes`), and ranks by a
sort that fixes ties only. A row evaluated among many others must get exactly what it gets
evaluated alone, where nothing is shared.
"""

import numpy as np
import pandas as pd
import pytest

from planner.candidates import (
    SearchSpace,
    expand_index,
    expand_rows,
)
from planner.columns.codes import Labels, distinct_rows, unique_rows
from planner.comm.traffic import axis_times_vectorized
from planner.evaluate import evaluate_columns
from planner.search import RANKING_KEYS, _ranking, _smallest
from planner.spec.job import Job
from planner.spec.model import load_model
from planner.spec.precision import PrecisionSpec
from tests.columns.screened_grid import DGX, H100, JOB, MOE_JOB, screened_grid

MUON_JOB = Job(
    model=load_model("llama3-8b"),
    seq_len=4096,
    global_batch_tokens=4096 * 256,
    precision=PrecisionSpec(optimizer="muon"),
)


def _search_rows(job: Job, count: int, seed: int) -> dict:
    """``count`` random rows of the search's screened candidates on 64 GPUs."""
    space = SearchSpace()
    columns = expand_rows(*screened_grid(job, DGX, 64, space), space)
    pick = np.sort(np.random.default_rng(seed).choice(len(columns["tp"]), count, replace=False))
    rows = {k: np.asarray(v)[pick] for k, v in columns.items()}
    # The same layouts with twice the micro-batches, and on half the replicas (where dp is
    # even): rows that share structure and shape but not m, or not the ZeRO group.
    more = {**rows, "num_microbatches": rows["num_microbatches"] * 2}
    ep_rest = rows["ep"] // (rows["tp"] // rows["etp"])  # EP ranks carved out of dp·cp
    even = (rows["dp"] % 2 == 0) & ((rows["dp"] // 2 * rows["cp"]) % ep_rest == 0)
    fewer = {k: v[even] for k, v in more.items()}
    fewer["dp"] = fewer["dp"] // 2
    rows = {k: np.concatenate([rows[k], more[k], fewer[k]]) for k in rows}
    rows["pipeline_layer_split"] = np.full(len(rows["tp"]), "auto", dtype=object)
    return rows


def _one(columns: dict, row: int) -> dict:
    return {k: v[row : row + 1] for k, v in columns.items()}


#: An accelerator with every host cost (per operation, DTensor, pipeline action): the
#: data-parallel wrapper then enters the pipeline's key.
H100_HOST = H100.model_copy(
    update={
        "op_overhead_s": 2e-5,
        "sharded_op_overhead_s": 9e-5,
        "functional_collective_overhead_s": 1e-3,
        "pipeline_action_overhead_s": {"forward": 1e-3, "input_grad": 2e-3, "weight_grad": 3e-3},
        "data_parallel_overhead_s": {"fsdp_unit_forward": 4e-4, "ddp_forward": 6e-4},
    }
)


@pytest.mark.parametrize(
    ("job", "accelerator"),
    [(JOB, H100), (MOE_JOB, H100), (MUON_JOB, H100), (JOB, H100_HOST)],
    ids=["dense", "moe", "muon", "host-costs"],
)
def test_rows_evaluated_together_equal_rows_evaluated_alone(job, accelerator):
    columns = _search_rows(job, 200, seed=3)
    together = evaluate_columns(job, DGX, accelerator, columns)
    for row in np.random.default_rng(4).choice(len(columns["tp"]), 12, replace=False):
        alone = evaluate_columns(job, DGX, accelerator, _one(columns, row))
        assert list(alone) == list(together)
        for key, value in alone.items():
            np.testing.assert_array_equal(together[key][row], value[0], err_msg=key)


@pytest.mark.parametrize("job", [JOB, MOE_JOB], ids=["dense", "moe"])
def test_screened_rows_together_equal_rows_screened_alone(job):
    columns = _search_rows(job, 100, seed=5)
    n = len(columns["tp"])
    huge = {**columns, "dp": columns["dp"] * 1024}  # more GPUs than the cluster has
    columns = {k: np.concatenate([columns[k], huge[k]]) for k in columns}
    limit = H100.hbm_bytes * 0.6  # some rows fit, some do not
    together = evaluate_columns(job, DGX, H100, columns, memory_limit_bytes=limit)
    assert together["valid"][:n].any() and not together["valid"][n:].any()
    for row in np.random.default_rng(6).choice(2 * n, 12, replace=False):
        alone = evaluate_columns(job, DGX, H100, _one(columns, row), memory_limit_bytes=limit)
        for key, value in alone.items():
            np.testing.assert_array_equal(together[key][row], value[0], err_msg=key)


@pytest.mark.parametrize("overlap", [False, True], ids=["tp-exposed", "tp-overlapped"])
def test_communication_of_rows_together_equals_each_row_alone(overlap):
    columns = _search_rows(MOE_JOB, 200, seed=7)
    rng = np.random.default_rng(8)
    n = len(columns["tp"])
    forward, backward = rng.uniform(1e-3, 5e-2, (2, n))
    fields = {
        "tp": columns["tp"],
        "cp": columns["cp"],
        "pp": columns["pp"],
        "dp": columns["dp"],
        "ep": columns["ep"],
        "etp": columns["etp"],
        "vpp": columns["vpp"],
        "micro_batch_size": columns["micro_batch_size"],
        "num_microbatches": columns["num_microbatches"],
        "zero_stage": columns["zero_stage"],
        "sequence_parallel": columns["sequence_parallel"],
        "recompute": columns["recompute"],
        "schedule": columns["schedule"],
    }
    together = axis_times_vectorized(
        MOE_JOB, DGX, **fields, forward_s=forward, backward_s=backward, tp_comm_overlap=overlap
    )
    coded = {**fields, "recompute": Labels.of(fields["recompute"])}
    coded["schedule"] = Labels.of(fields["schedule"])
    as_labels = axis_times_vectorized(
        MOE_JOB, DGX, **coded, forward_s=forward, backward_s=backward, tp_comm_overlap=overlap
    )
    for row in rng.choice(n, 40, replace=False):
        alone = axis_times_vectorized(
            MOE_JOB,
            DGX,
            **{k: v[row : row + 1] for k, v in fields.items()},
            forward_s=forward[row : row + 1],
            backward_s=backward[row : row + 1],
            tp_comm_overlap=overlap,
        )
        for key, value in alone.items():
            if isinstance(value, dict):  # {link: column}: other rows may use more links
                assert set(value) <= set(together[key]), key
                for link, column in together[key].items():
                    expected = value[link][0] if link in value else 0.0
                    np.testing.assert_array_equal(column[row], expected, err_msg=key)
                    np.testing.assert_array_equal(as_labels[key][link][row], expected)
            else:
                np.testing.assert_array_equal(together[key][row], value[0], err_msg=key)
                np.testing.assert_array_equal(as_labels[key][row], value[0], err_msg=key)


def test_scalar_layout_keeps_its_shape():
    out = axis_times_vectorized(JOB, DGX, tp=8, dp=8, zero_stage=1)
    assert np.ndim(out["dp_time_s"]) == 0 and out["dp_time_s"] > 0


def test_distinct_rows_match_numpy_unique():
    rng = np.random.default_rng(0)
    n = 5000
    columns = [
        rng.integers(0, 8, n),  # small ints: their own codes
        rng.integers(0, 3, n) * 4096,  # large ints: a lookup table
        rng.integers(-2, 2, n),  # negative: hashed
        rng.random(n) < 0.5,
        rng.choice([0.5, 1.5, np.inf], n),
        rng.choice(np.array(["1f1b", "gpipe", "zbv"], dtype=object), n),
        Labels.of(rng.choice(np.array(["none", "full"], dtype=object), n)),
    ]
    chosen, inverse = distinct_rows(*columns)
    plain = np.stack([np.asarray(column).astype(str) for column in columns], axis=1)
    unique, expected = np.unique(plain, axis=0, return_inverse=True)
    assert len(chosen) == len(unique)
    np.testing.assert_array_equal(plain[chosen][inverse], plain)  # same tuple as its row
    assert len(np.unique(inverse)) == len(chosen)
    pairs = np.unique(np.stack([inverse, expected.reshape(-1)]), axis=1)
    assert pairs.shape[1] == len(chosen)  # one distinct tuple, one index
    rows, index = unique_rows(*columns)
    assert len(rows) == len(chosen)
    assert all(
        tuple(str(value) for value in rows[index[i]]) == tuple(plain[i]) for i in range(0, n, 97)
    )


@pytest.mark.parametrize("objective", list(RANKING_KEYS))
def test_ranking_equals_a_lexicographic_sort_with_nan_and_signed_zeros(objective):
    rng = np.random.default_rng(11)
    for _ in range(50):
        n = int(rng.integers(0, 120))
        first = rng.integers(0, 6, n).astype(float)
        second = rng.integers(0, 3, n).astype(float)
        first[rng.random(n) < 0.1] = np.nan
        second[rng.random(n) < 0.1] = np.nan
        first[rng.random(n) < 0.1] = -0.0
        columns = {"step_time_s": first, "mfu": first, "memory_per_gpu_bytes": second,
                   "expected_wall_time_s": first}  # fmt: skip
        names, ascending = RANKING_KEYS[objective]
        keys = [columns[k] if up else -columns[k] for k, up in zip(names, ascending, strict=True)]
        np.testing.assert_array_equal(_ranking(columns, objective), np.lexsort(keys[::-1]))


def test_smallest_row_is_the_first_of_the_least():
    rng = np.random.default_rng(12)
    for _ in range(50):
        memory = rng.integers(0, 5, 200).astype(float)
        rows = np.sort(rng.choice(200, int(rng.integers(1, 200)), replace=False))
        least = memory[rows].min()
        expected = next(row for row in rows if memory[row] == least)
        assert _smallest(memory, rows) == expected


def test_table_is_ranked_with_a_fresh_index():
    from planner.search import search

    found = search(JOB, DGX, H100, 64, SearchSpace(micro_batch_size=[1, 2]))
    table = found.table
    assert isinstance(table.index, pd.RangeIndex) and table.index[0] == 0
    steps = table["step_time_s"].to_numpy()
    assert (np.diff(steps) >= 0).all()
    assert table["schedule"].map(type).eq(str).all()


@pytest.mark.parametrize("job", [JOB, MOE_JOB], ids=["dense", "moe"])
def test_tables_worked_out_ahead_from_the_grid_are_the_rows_own(job):
    """The search starts its tables from the grid rows (planner.evaluate.indices.
    shapes_beside) and keeps its rows factored over them (ExpandedRows): every row reads the
    entries the tables worked out from the written-out rows give it, and shares each table
    index (shape, structure, held, states, buffers) with exactly the rows it shares it with
    there."""
    from planner.columns.codes import distinct_rows
    from planner.columns.expanded import ExpandedRows
    from planner.columns.layout import LayoutColumns
    from planner.evaluate.indices import gpu_rates, row_tables, shapes_beside

    space = SearchSpace()
    grid, cells, shape = screened_grid(job, DGX, 64, space)
    columns = expand_rows(grid, cells, shape, space)
    columns["pipeline_layer_split"] = np.full(len(columns["tp"]), "auto", dtype=object)
    ahead, codes = shapes_beside(job, H100, grid, space.recompute, "auto")
    factored = ExpandedRows({**grid, **codes}, *expand_index(cells, shape, space), "auto")
    rates = gpu_rates(job, H100)
    own = LayoutColumns.of(columns)
    own_shapes, own_structs = row_tables(job, own, *rates)
    grid_shapes, grid_structs = row_tables(job, factored, *rates, shapes_ahead=ahead)
    assert len(grid_shapes["fd"]) >= len(own_shapes["fd"]) > 1
    for key, values in own_shapes.items():
        np.testing.assert_array_equal(
            grid_shapes[key][factored.shape.codes], values[own.shape.codes], err_msg=key
        )
    for key, values in own_structs.items():
        np.testing.assert_array_equal(
            grid_structs[key][factored.structure.codes], values[own.structure.codes], err_msg=key
        )
    for name in ("shape", "structure", "held", "states", "buffers"):
        ours, theirs = getattr(factored, name).codes, getattr(own, name).codes
        assert len(distinct_rows(ours)[0]) == len(distinct_rows(theirs)[0])
        assert len(distinct_rows(ours, theirs)[0]) == len(distinct_rows(ours)[0]), name
    written = factored.block(slice(None))
    for key in (*columns, "zero_group_size", "expert_data_parallel_size"):
        mine, given = getattr(written, key), getattr(own, key)
        if hasattr(given, "strings"):
            mine, given = mine.strings(), given.strings()
        np.testing.assert_array_equal(mine, given, err_msg=key)


def test_memory_outputs_left_out_are_not_computed_and_the_rest_unchanged():
    """The screen asks the memory model for the outputs it keeps only: those come out as
    with every output asked for, and the others are absent."""
    from planner.columns.layout import LayoutColumns
    from planner.evaluate.indices import gpu_rates, row_tables
    from planner.evaluate.memory import memory_columns

    c = LayoutColumns.of(_search_rows(MOE_JOB, 300, 7))
    rates, bf16_rates, tuned = gpu_rates(MOE_JOB, H100)
    shapes, structs = row_tables(MOE_JOB, c, rates, bf16_rates, tuned)
    every = memory_columns(MOE_JOB, c, shapes, structs, tuned)
    asked = frozenset({"checkpoint_bytes_per_rank", "memory_activations_bytes"})
    some = memory_columns(MOE_JOB, c, shapes, structs, tuned, outputs=asked)
    assert set(some) == asked | {"memory_per_gpu_bytes"} and len(every) > len(some) + 3
    for key, value in some.items():
        np.testing.assert_array_equal(value, every[key], err_msg=key)
