"""Hierarchical CP's inner degree (Megatron-Core --hierarchical-context-parallel-sizes):
a layout field, searched over the divisors of cp, the same number on both paths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from hwspecs.catalog import load_accelerator, load_cluster
from planner import api
from planner.cp_inner import proper_divisors, with_cp_inner
from planner.estimate import estimate
from planner.search import SearchSpace, layout_of_row, search
from planner.spec.layout import Layout

DGX = load_cluster("dgx-h100")  # 8 GPUs per NVLink domain
JOB = api.build_job("llama3-8b", 32768, global_batch_size=16)  # 32 heads, 8 KV heads
SPACE = dict(tp=[1], cp=[8], pp=[1], micro_batch_size=[1], zero_stage=[1], recompute=["none"],
             sequence_parallel=[True], schedule=["1f1b"], cp_algorithm=["hierarchical"])  # fmt: skip


def test_the_inner_degree_divides_cp_and_belongs_to_hierarchical_cp():
    assert Layout(cp=8, cp_algorithm="hierarchical", cp_inner=4).cp_inner == 4
    with pytest.raises(ValidationError, match="does not divide cp 8"):
        Layout(cp=8, cp_algorithm="hierarchical", cp_inner=3)
    with pytest.raises(ValidationError, match="inner degree of cp_algorithm hierarchical"):
        Layout(cp=8, cp_algorithm="ring", cp_inner=2)


def _step(layout: Layout) -> float:
    return estimate(JOB, layout, DGX).step_time_s


def test_a_one_level_hierarchy_is_the_ring_or_ulysses():
    """k = 1: a ring over all cp ranks; k = cp: one all-to-all over all of them."""
    degrees = dict(tp=1, cp=8, dp=2)
    hierarchical = {k: _step(Layout(**degrees, cp_algorithm="hierarchical", cp_inner=k))
                    for k in (1, 8)}  # fmt: skip
    assert hierarchical[1] == _step(Layout(**degrees, cp_algorithm="ring"))
    assert hierarchical[8] == _step(Layout(**degrees, cp_algorithm="ulysses"))


def test_unset_is_the_cp_ranks_of_one_scale_up_domain():
    degrees = dict(tp=2, cp=8, dp=1)  # 4 CP ranks per 8-GPU domain
    unset = Layout(**degrees, cp_algorithm="hierarchical")
    assert _step(unset) == _step(Layout(**degrees, cp_algorithm="hierarchical", cp_inner=4))
    assert _step(unset) != _step(Layout(**degrees, cp_algorithm="hierarchical", cp_inner=2))


def test_hierarchical_rows_repeat_once_per_proper_divisor_or_pin():
    assert proper_divisors(16) == [2, 4, 8] and proper_divisors(2) == []
    cp = np.array([8, 8, 2])
    algorithm = np.array([1, 3, 3])
    degrees, kept, inner = with_cp_inner((np.ones(3), cp), algorithm, algorithm == 3,
                                         np.array([1, 8, 2]))  # fmt: skip
    assert degrees[1].tolist() == [8, 8, 8, 2] and inner.tolist() == [1, 2, 4, 2]
    assert kept.tolist() == [1, 3, 3, 3]
    _, _, pinned = with_cp_inner((np.ones(3), cp), algorithm, algorithm == 3,
                                 np.array([1, 8, 2]), pins=[4])  # fmt: skip
    assert pinned.tolist() == [1, 4]  # cp 2 has no inner 4: dropped


def test_the_search_times_each_inner_degree_as_the_single_layout_estimate_does():
    accelerator = load_accelerator(DGX.accelerator)
    space = SearchSpace(**SPACE, cp_inner=[2, 4])  # 8's proper divisors (8 KV heads: both)
    table = search(JOB, DGX, accelerator, 16, space, refine_top=0).table
    assert set(table["cp_inner"]) == {2, 4}
    for _, row in table.iterrows():
        layout = layout_of_row(row.to_dict(), is_moe=False)
        assert layout.cp_inner == row["cp_inner"]
        assert float(row["step_time_s"]) == pytest.approx(_step(layout), rel=1e-9)
    pinned = search(JOB, DGX, accelerator, 16, SearchSpace(**SPACE, cp_inner=[4]), refine_top=0)
    assert set(pinned.table["cp_inner"]) == {4}


def test_unpinned_the_search_takes_the_cp_ranks_of_one_scale_up_domain():
    """tp 2, cp 8 on 8-GPU domains: 4 CP ranks per domain, the search's only inner degree."""
    accelerator = load_accelerator(DGX.accelerator)
    space = SearchSpace(**{**SPACE, "tp": [2]})
    table = search(JOB, DGX, accelerator, 16, space, refine_top=0).table
    assert len(table) and set(table["cp_inner"]) == {4}


def test_the_cli_takes_and_reports_the_inner_degree():
    from cli import app

    args = ["estimate", "--model", "llama3-8b", "--seq-len", "32768", "--global-batch-size",
            "16", "--cluster", "dgx-h100", "--tp", "1", "--cp", "8", "--dp", "2", "--pp", "1",
            "--cp-algorithm", "hierarchical", "--cp-inner", "2", "--json"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["layout"]["cp_inner"] == 2
    bad = subprocess.run([sys.executable, "cli.py", *args[:-2], "3"], capture_output=True,
                         text=True, cwd=Path(__file__).parents[2])  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.strip() == "error: cp_inner 3 does not divide cp 8"


def test_megatron_settings_name_the_comm_type_and_the_hierarchy(capsys):
    """Megatron-Core: --cp-comm-type a2a+p2p with --hierarchical-context-parallel-sizes
    [inner, cp/inner] (both flags in tests/data/trainer_flags.json)."""
    import cli

    code = cli.main(["plan", "--model", "llama3-8b", "--seq-len", "32768", "--global-batch-size",
                     "16", "--cluster", "dgx-h100", "--gpus", "16", "--tp", "1", "--cp", "8",
                     "--pp", "1", "--cp-algorithm", "hierarchical", "--cp-inner", "4",
                     "--emit", "megatron"])  # fmt: skip
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0
    assert "--cp-comm-type a2a+p2p" in out
    assert "--hierarchical-context-parallel-sizes 4 2" in out
