"""The published MoE runs whose release recipe overlapped their EP all-to-alls with another
micro-batch's compute (Megatron-Core's ``moe_a2a_overlap`` / ``overlap_moe_expert_parallel_comm``,
"combined 1F1B"), read from Megatron-Bridge's workload configs at each release's tag, and
what the label does to a row's prediction."""

from __future__ import annotations

import pytest

from hwspecs.catalog import load_runs
from planner.runs.rows import model_spec, run_job

#: Megatron-Bridge's ``docs/versions1.json`` pairs each container with its release
#: ("0.4.2 · 26.04.01"); the supplements cite that tag's commit.
TAG_COMMITS = {
    "NeMo 26.04.01 container": "c810129341a84e58f4cbed3093f70668a088c028",
}


def _labelled():
    return [row for row in load_runs("train") if row.training.ep_comm_overlap]


def test_thirty_megatron_bridge_moe_rows_ran_the_overlap():
    rows = _labelled()
    assert len(rows) == 30
    assert all(row.id.startswith("mbridge-") and row.model.moe is not None for row in rows)
    for row in rows:
        (supplement,) = [s for s in row.supplements if s.field == "training.ep_comm_overlap"]
        assert supplement.release == row.training.framework_version
        assert supplement.source_ref.repo == "NVIDIA-NeMo/Megatron-Bridge"
        assert "moe_a2a_overlap" in supplement.quote or "overlap_moe_expert" in supplement.quote
        expected = TAG_COMMITS.get(row.training.framework_version)
        assert expected is None or supplement.source_ref.commit == expected


def test_every_labelled_layout_is_one_megatron_core_allows():
    """``transformer_config.py`` asserts combined 1F1B runs interleaved with virtual stages
    or without a pipeline: a label on any other layout would misread the recipe."""
    for row in _labelled():
        t = row.training
        assert t.pp == 1 or (t.vpp or 1) > 1, row.id


def test_the_label_reaches_the_job_and_hides_ep_time():
    from planner.runs.check import predict_row

    row = next(
        r for r in load_runs("train")
        if r.id == "mbridge-26.04.01-b200-deepseekv3-pretrain-mxfp8-256g-main"
    )  # fmt: skip
    assert run_job(row, model_spec(row)).ep_comm_overlap
    unlabelled = row.model_copy(
        update={"training": row.training.model_copy(update={"ep_comm_overlap": None})}
    )
    assert not run_job(unlabelled, model_spec(unlabelled)).ep_comm_overlap
    overlapped, serial = (predict_row(r) for r in (row, unlabelled))  # the ideal model
    assert overlapped.predicted_tokens_per_s_per_gpu > 1.2 * serial.predicted_tokens_per_s_per_gpu


@pytest.mark.parametrize(
    "row_id",
    [
        "mbridge-26.04-b200-deepseekv3-pretrain-mxfp8-256g-main",  # PP16 EP8, 1F1B: no overlap
        "mbridge-26.04.01-b300-deepseekv3-pretrain-mxfp8-256g-main",  # B300_V1: set False
    ],
)
def test_rows_whose_recipe_left_it_off_are_not_labelled(row_id):
    row = next(r for r in load_runs("train") if r.id == row_id)
    assert not row.training.ep_comm_overlap
