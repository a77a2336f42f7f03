"""The screen's rules worked out once per distinct combination of the columns each reads
(planner.candidates.first_rejections) against the same rules on the written-out grid
(rejection_masks): every cell's first broken rule the same, so every count and survivor."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwspecs.catalog import load_cluster
from planner.candidates import (
    SearchSpace,
    first_rejections,
    num_microbatches,
    rejection_masks,
    screening_checks,
    screening_grid,
)
from planner.spec.job import Job
from planner.spec.model import catalog_model_names, load_model
from planner.spec.rules import RULES, schedule_rules

CLUSTERS = ("dgx-h100", "dgx-h800")


def _first_of_masks(masks, count: int) -> np.ndarray:
    """Each row's index of its first rejecting mask (len(masks): none)."""
    first = np.full(count, len(masks))
    for index, (_, mask) in reversed(list(enumerate(masks))):
        first[mask] = index
    return first


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(catalog_model_names()),
    cluster=st.sampled_from(CLUSTERS),
    gpus=st.sampled_from((8, 24, 64, 96, 256)),
    seq_len=st.sampled_from((2048, 4096, 6144, 32768)),
    batch=st.sampled_from((None, 96, 512)),
    algorithms=st.sampled_from((["all-gather"], ["ring", "ulysses", "hierarchical"], None)),
    sp=st.sampled_from(([True, False], [False], [True])),
    replicate=st.booleans(),
    cross_node=st.booleans(),
)
def test_first_rejections_are_the_written_out_grids(
    name, cluster, gpus, seq_len, batch, algorithms, sp, replicate, cross_node
):
    model = load_model(name)
    sizes = {"global_batch_tokens": batch * seq_len} if batch else {}
    job = Job(model=model, seq_len=seq_len, ulysses_kv_heads="replicate" if replicate else "whole",
              **sizes)  # fmt: skip
    space = SearchSpace(sequence_parallel=sp, allow_cross_node_tp=cross_node, max_cp=16,
                        **({"cp_algorithm": algorithms} if algorithms else {}))  # fmt: skip
    on = load_cluster(cluster)
    grid = screening_grid(job, on, gpus, space)
    reasons, first = first_rejections(job, on, grid, space)
    masks = rejection_masks(job, on, grid.columns(), space)
    assert reasons == [reason for reason, _ in masks]
    np.testing.assert_array_equal(first, _first_of_masks(masks, len(grid)))


class _Only(dict):
    """Columns that let a rule read the ones it names and no other (reading, asking for
    or testing any other fails the test)."""

    def __init__(self, columns: dict, reads: tuple[str, ...]):
        super().__init__({key: value for key, value in columns.items() if key in reads})
        self.reads = reads

    def _allowed(self, key):
        assert key in self.reads, f"reads {key!r}, which it does not name"

    def __getitem__(self, key):
        self._allowed(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._allowed(key)
        return super().get(key, default)

    def __contains__(self, key):
        self._allowed(key)
        return super().__contains__(key)


@pytest.mark.parametrize("name", ["llama3-405b", "deepseek-v3", "mixtral-8x7b"])
def test_every_rule_reads_only_the_columns_it_names(name):
    """A rule's broken rows from the columns it names alone are its rows from every column:
    the search works each out on its named columns' distinct values only."""
    job = Job(model=load_model(name), seq_len=8192, global_batch_tokens=512 * 8192,
              ulysses_kv_heads="replicate")  # fmt: skip
    on = load_cluster("dgx-h100")
    space = SearchSpace(allow_cross_node_tp=True)
    grid = screening_grid(job, on, 512, space)
    columns = grid.columns()
    columns["num_microbatches"] = num_microbatches(job, columns)
    columns["replicate_kv"] = True
    rules = (*RULES, *schedule_rules())
    for rule in rules:
        whole = rule.broken(job.model, job.seq_len, columns)
        named = rule.broken(job.model, job.seq_len, _Only(columns, rule.reads))
        np.testing.assert_array_equal(named, whole, err_msg=rule.name)
    for reason, reads, broken in screening_checks(job, on, space):
        np.testing.assert_array_equal(broken(_Only(columns, reads)), broken(columns), reason)
