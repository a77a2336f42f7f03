"""Layer splits written in Megatron-Core's layout notation (``--pipeline-model-parallel-
layout``), against Megatron-Core's own examples and Megatron-Bridge's DeepSeek-V3 layouts,
and costed as the named split with the same layers."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cli
from hwspecs.errors import PlanError
from planner.spec.layout import Layout, layers_per_virtual_stage, model_layers_per_virtual_stage
from planner.spec.model import load_model
from planner.spec.pipeline_layout import layout_layers, layout_stages


def test_megatron_core_example_unrolls_as_its_docstring_says():
    """``PipelineParallelLayerLayout.parse_str_to_list``'s example: "Ettt|(tt|)*29,m|L" is
    [E,t,t,t] + [t,t]×29 + [m], [L]; commas are cosmetic."""
    assert layout_stages("Ettt|(tt|)*29,m|L") == ["Ettt", *["tt"] * 29, "m", "L"]
    assert layout_stages("Et*3|(tt|)*29,m|L") == layout_stages("Ettt|(tt|)*29m|L")


def test_megatron_bridge_deepseek_v3_layouts_as_its_layout_map_writes_them():
    """Megatron-Bridge's ``set_deepseek_v3_pipeline_model_parallel_layout`` (r0.3.0):
    (16, 1): [E + 4 decoders] + [4 decoders]×14 + [1 decoder + mtp + loss]; (8, 1):
    [E + 8] + [8]×6 + [5 + mtp + loss]; its H100 base config's "Et|(tt|)*30mL" on 32."""
    assert list(layout_layers("Et*4|(t*4|)*14tmL", 61, 16, 1)) == [4] * 15 + [1]
    assert list(layout_layers("Et*8|(t*8|)*6t*5mL", 61, 8, 1)) == [8] * 7 + [5]
    assert list(layout_layers("Et|(tt|)*30mL", 61, 32, 1)) == [1] + [2] * 30 + [0]


@pytest.mark.parametrize(
    ("text", "stages", "mtp", "says"),
    [
        ("Et*4|(t*4|)*14tmL", 8, 1, "has 16 stages, not pp·vpp = 8"),
        ("Et*4|(t*4|)*14ttmL", 16, 1, "places 62 layers, not the model's 61"),
        ("Et*4|(t*4|)*14tL", 16, 1, "places 0 MTP modules, not the model's 1"),
        ("Et*3|(tt|)*29,m|L", 32, 1, "any MTP module (m) on the last"),
        ("t*4|E(t*4|)*14tmL", 16, 1, "the embedding (E) once on the first stage"),
        ("Et*4|(t*4|)*14tm", 16, 1, "the loss (L) once"),
        ("Et*4|(t*4|)*14tmL|", 16, 1, "has 17 stages"),
        ("Ex*4|L", 2, 0, "not in Megatron-Core's notation"),
        ("E(t*99999|)*99999L", 2, 0, "unrolls to more than 1,000,000 entries"),
        ("E" + "(t|)*999999" * 3 + "L", 2, 0, "unrolls to more than 1,000,000 entries"),
    ],
)
def test_a_layout_the_model_cannot_run_says_why(text, stages, mtp, says):
    with pytest.raises(PlanError, match=None) as error:
        layout_layers(text, 61, stages, mtp)
    assert says in str(error.value)


def test_a_written_layout_is_costed_as_the_named_split_with_the_same_layers():
    """Llama 3 405B's first-last-fewer split on 16 stages (7, 8×14, 7) written out is the
    same layout: the same layers per stage, the same step time, memory and MFU."""
    from planner.api import build_job, estimate

    model = load_model("llama3-405b")
    written = "Et*7|(t*8|)*14t*7L"
    assert (
        layers_per_virtual_stage(126, 16, 1, written)
        == layers_per_virtual_stage(126, 16, 1, "first-last-fewer")
    ).all()
    assert (model_layers_per_virtual_stage(model, 16, 1, written) == [7] + [8] * 14 + [7]).all()
    job = build_job(model="llama3-405b", seq_len=8192, global_batch_tokens=16 * 2**20)
    results = []
    for split in ("first-last-fewer", written):
        layout = Layout(tp=8, pp=16, dp=128, pipeline_layer_split=split)
        results.append(estimate(job, layout, cluster="llama3-h100-24k", gpus=16384))
    named, layout_text = results
    for key in ("step_time_s", "memory_per_gpu_bytes", "mfu"):
        assert getattr(layout_text, key) == pytest.approx(getattr(named, key), rel=1e-9), key


def test_deepseek_v3_with_megatron_bridge_layout_unloads_the_stage_with_the_head():
    """DeepSeek-V3 on pp 4 × vpp 4 (Megatron-Bridge's GB200 layout): one layer beside the
    head and MTP module on the last stage, not ``auto``'s three, and so a shorter step."""
    from planner.api import build_job, estimate

    job = build_job(model="deepseek-v3", seq_len=4096, global_batch_size=4096)
    steps = {}
    for split in ("auto", "Et*4|(t*4|)*14tmL"):
        layout = Layout(
            tp=1, pp=4, vpp=4, dp=64, ep=64, schedule="interleaved-1f1b",
            pipeline_layer_split=split,
        )  # fmt: skip
        steps[split] = estimate(job, layout, cluster="gb200-nvl72", gpus=256).step_time_s
    assert steps["Et*4|(t*4|)*14tmL"] < steps["auto"]


def test_estimate_refuses_a_layout_of_other_stages_in_one_line(capsys):
    """Bad input: exit 2, one line naming the field, a JSON error object with --json."""
    args = ["estimate", "--model", "deepseek-v3", "--gpus", "256", "--tp", "1", "--pp", "4",
            "--ep", "64", "--dp", "64", "--pipeline-layer-split", "Et*4|(t*4|)*14tmL"]  # fmt: skip
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: pipeline layout 'Et*4|(t*4|)*14tmL' has 16 stages, not pp·vpp = 4"]
    assert cli.main([*args, "--json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["field"] == "--pipeline-layer-split"
    assert cli.main([*args[:-1], "Et*x|L"]) == 2
    assert "or a layout in Megatron-Core's notation" in capsys.readouterr().err


def test_plan_with_a_named_split_rejects_the_pipelines_it_cannot_split():
    """A split that some searched pipelines cannot take (``even`` on 80 layers over 32
    stages; a layout written for 16 stages) rejects those rows with the layers' reason and
    ranks the others."""
    from hwspecs.catalog import load_accelerator, load_cluster
    from planner.api import build_job
    from planner.candidates import SearchSpace
    from planner.search import search

    job = build_job(model="llama3-70b", seq_len=8192, global_batch_tokens=2**20)
    cluster = load_cluster("llama3-h100-24k")
    accelerator = load_accelerator(cluster.accelerator)
    for split in ("even", "Et*4|(t*5|)*14t*6L"):
        space = SearchSpace(tp=[1], pp=[16, 32], vpp=[1], pipeline_layer_split=split)
        found = search(job, cluster, accelerator, 128, space, mem_headroom=0.0)
        assert found.rejected.get("layers do not split over pp·vpp stages", 0) > 0, split
        assert found.feasible > 0, split
        assert {row["pp"] for row in found.top_rows(min(found.feasible, 20))} == {16}, split


@settings(max_examples=200, deadline=None)
@given(
    layers=st.lists(st.integers(0, 9), min_size=2, max_size=40).filter(lambda x: sum(x) > 0),
    mtp=st.integers(0, 2),
)
def test_the_layout_emit_writes_for_megatron_reads_back_as_its_layers(layers, mtp):
    """``--emit megatron``'s ``--pipeline-model-parallel-layout`` (runs of equal stages as
    ``(t*8|)*14,``) parses back to the split it was written from."""
    from planner.handoff import _megatron_layout

    text = _megatron_layout(layers, mtp)
    assert list(layout_layers(text, sum(layers), len(layers), mtp)) == layers
