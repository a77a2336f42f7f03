"""Context-parallel algorithms: all-gather (Llama 3 §3.3.2), ring attention (Liu et al. 2023),
Ulysses all-to-all (Jacobs et al. 2023) and the hierarchical a2a+p2p form (Megatron-Core)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from hwspecs.catalog import load_accelerator, load_cluster
from hwspecs.errors import PlanError
from planner import api
from planner.comm.context_parallel import cp_inner_degree, ring_step_overlap
from planner.comm.traffic import axis_times_vectorized
from planner.cost.context_parallel import cp_buffer_bytes, kv_block_bytes, ulysses_bytes
from planner.search import CP_DOMINATED, SearchSpace, search
from planner.spec.layout import CP_ALGORITHMS, Layout
from planner.spec.model import load_model
from planner.spec.rules import check_layout

DGX = load_cluster("dgx-h100")
LLAMA_8B = load_model("llama3-8b")


def _cp(job, algorithm, **degrees):
    out = axis_times_vectorized(job, DGX, cp_algorithm=algorithm, **degrees)
    return {key: float(np.asarray(out[f"cp_{key}"]).ravel()[0])
            for key in ("bytes_per_step", "time_s", "exposed_time_s")}  # fmt: skip


@pytest.mark.parametrize("cp", [2, 4, 8])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_ring_sends_the_bytes_of_the_all_gather_form(cp, recompute):
    """cp − 1 blocks of s/cp tokens per pass is (cp − 1)/cp of the sequence's K and V, what a
    ring all-gather sends (nccl-tests' factor): forward, and the backward's K/V with their
    gradients, as the all-gather form's second gather and its reduce-scatter."""
    job = api.build_job("llama3-8b", 32768, global_batch_size=8)
    degrees = dict(tp=1, cp=cp, dp=8 // cp, recompute=recompute)
    ring, gathered = _cp(job, "ring", **degrees), _cp(job, "all-gather", **degrees)
    assert ring["bytes_per_step"] == pytest.approx(gathered["bytes_per_step"], rel=1e-12)


def test_ulysses_sends_its_tokens_of_every_head_but_its_own_share():
    """Each all-to-all sends (cp − 1)/cp of the rank's s/cp tokens of Q, K, V (one message)
    and of the output, once each way per layer and pass (nccl-tests' all-to-all S)."""
    job = api.build_job("llama3-8b", 32768, global_batch_size=8)
    cp = 4
    out = _cp(job, "ulysses", tp=1, cp=cp, dp=2)
    qkv, o = ulysses_bytes(LLAMA_8B, 32768, 1, 1, cp, 2.0)
    m = 8 // 2  # sequences per data-parallel rank, one per micro-batch
    expected = LLAMA_8B.num_layers * m * 2 * (qkv + o) * (cp - 1) / cp
    assert out["bytes_per_step"] == pytest.approx(float(expected), rel=1e-12)
    heads, kv, d = LLAMA_8B.num_attention_heads, LLAMA_8B.num_kv_heads, LLAMA_8B.head_dim
    assert float(qkv) == 32768 / cp * (heads + 2 * kv) * d * 2.0


@pytest.mark.parametrize(
    ("tp", "cp", "order", "inner"),
    [(2, 8, "tp,cp,ep,pp,dp", 4), (8, 4, "tp,cp,ep,pp,dp", 1), (1, 4, "tp,cp,ep,pp,dp", 4),
     (2, 8, "cp,tp,ep,pp,dp", 8), (1, 16, "tp,cp,ep,pp,dp", 8)],
)  # fmt: skip
def test_hierarchical_inner_degree_is_the_cp_ranks_of_one_scale_up_domain(tp, cp, order, inner):
    sizes = {"tp": tp, "cp": cp, "pp": 1, "dp": 1, "ep": 1}
    assert cp_inner_degree(sizes, order.split(","), DGX.scale_up_domain_size) == inner


def test_hierarchical_with_one_rank_per_domain_is_the_ring_and_with_one_domain_ulysses():
    job = api.build_job("llama3-8b", 32768, global_batch_size=16)
    one_per_node = dict(tp=8, cp=2, dp=1, forward_s=0.05, backward_s=0.1)  # inner 1
    assert _cp(job, "hierarchical", **one_per_node) == _cp(job, "ring", **one_per_node)
    one_node = dict(tp=1, cp=8, dp=1, forward_s=0.05, backward_s=0.1)  # inner 8 = cp
    assert _cp(job, "hierarchical", **one_node) == _cp(job, "ulysses", **one_node)


def test_ring_hides_its_transfer_at_long_sequences_and_exposes_it_at_short_ones():
    """A step's transfer grows with s/cp, its block attention with (s/cp)²: long sequences
    hide the transfer, short ones expose it (Liu et al. 2023 §3, the minimal block size)."""
    layout = Layout(tp=8, cp=2, dp=1, cp_algorithm="ring")  # the ring crosses InfiniBand
    long, short = (ring_step_overlap(api.build_job("llama3-8b", s, global_batch_size=1),
                                     layout, DGX) for s in (131072, 2048))  # fmt: skip
    for name in ("forward", "backward"):
        assert long[name]["transfer_s"] < long[name]["block_attention_s"]
        assert long[name]["exposed_s"] == pytest.approx(long[name]["step_overhead_s"])
        assert short[name]["transfer_s"] > short[name]["block_attention_s"]
        assert short[name]["exposed_s"] > short[name]["step_overhead_s"]


def test_exposed_ring_time_is_what_each_step_outlasts_its_block_by():
    job = api.build_job("llama3-8b", 2048, global_batch_size=1)
    layout = Layout(tp=8, cp=2, dp=1, cp_algorithm="ring")
    step = ring_step_overlap(job, layout, DGX)
    out = _cp(job, "ring", tp=8, cp=2, dp=1, forward_s=1.0, backward_s=2.0)
    passes = LLAMA_8B.num_layers  # one micro-batch; at cp 2 one step per pass, and the
    # backward's first block, then its last step's dK, dV beside the own block (TE's
    # reversed order): the same window, no kernels of its own
    last = step["backward_last"]
    assert last["block_attention_s"] == step["backward_first"]["block_attention_s"] > 0
    assert last["exposed_s"] == max(0.0, last["transfer_s"] - last["block_attention_s"])
    expected = passes * sum(step[name]["exposed_s"]
                            for name in ("forward", "backward_first", "backward_last"))  # fmt: skip
    assert out["exposed_time_s"] == pytest.approx(expected, rel=1e-9)


def test_ring_keeps_fewer_kv_bytes_than_the_all_gather_beyond_two_ranks():
    codes = np.array([CP_ALGORITHMS.index(a) for a in CP_ALGORITHMS])
    for cp in (4, 8, 16):
        buffers = cp_buffer_bytes(LLAMA_8B, 131072, 1, 1, np.full(4, cp), codes, 2.0)
        block = float(kv_block_bytes(LLAMA_8B, 131072, 1, 1, cp, 2.0))
        assert buffers[0] == 2 * cp * block  # whole K, V and their gradients
        assert buffers[1] == 4 * block < buffers[0]  # two blocks in flight, and their grads


def test_ulysses_needs_the_heads_per_tp_rank_divisible_by_its_degree():
    model = load_model("llama3-405b")  # 128 heads, 8 KV heads
    check_layout(Layout(tp=1, cp=8, cp_algorithm="ulysses"), model, 131072)
    with pytest.raises(PlanError, match="1 KV heads per TP rank") as error:
        check_layout(Layout(tp=8, cp=2, cp_algorithm="ulysses"), model, 131072)
    assert "cp_algorithm ring" in str(error.value)
    check_layout(Layout(tp=8, cp=16, cp_algorithm="ring"), model, 131072)


def test_ulysses_splits_the_sequence_into_cp_chunks_the_ring_into_two_per_rank():
    model = load_model("llama3-8b")
    check_layout(Layout(cp=4, cp_algorithm="ulysses"), model, 4100)
    with pytest.raises(PlanError, match="2·cp = 8"):
        check_layout(Layout(cp=4, cp_algorithm="ring"), model, 4100)


def test_the_search_tries_every_algorithm_where_cp_exceeds_one_and_honours_a_pin():
    job = api.build_job("llama3-8b", 65536, global_batch_size=16)
    accelerator = load_accelerator(DGX.accelerator)
    space = dict(micro_batch_size=[1], zero_stage=[1], recompute=["none"],
                 sequence_parallel=[True], schedule=["1f1b"], pp=[1])  # fmt: skip
    found = search(job, DGX, accelerator, 16, SearchSpace(**space), refine_top=0).table
    assert set(found.loc[found["cp"] == 1, "cp_algorithm"]) == {"all-gather"}
    assert set(found.loc[found["cp"] > 1, "cp_algorithm"]) == set(CP_ALGORITHMS)
    pinned = search(job, DGX, accelerator, 16, SearchSpace(**space, cp_algorithm=["ring"]),
                    refine_top=0).table  # fmt: skip
    assert set(pinned["cp_algorithm"]) == {"ring"}


def test_the_cli_rejects_an_unknown_cp_algorithm_in_one_line():
    from cli import app

    result = CliRunner().invoke(app, ["estimate", "--cp", "2", "--cp-algorithm", "stripes"])
    assert result.exit_code == 2
    assert "--cp-algorithm" in result.output and "ring" in result.output
    assert "Traceback" not in result.output


def test_comm_lists_the_collectives_of_the_chosen_algorithm():
    from cli import app

    runner = CliRunner()
    args = ["comm", "--model", "llama3-8b", "--seq-len", "32768", "--cluster", "dgx-h100",
            "--tp", "1", "--cp", "8", "--pp", "1", "--dp", "1", "--json"]  # fmt: skip
    found = {}
    for algorithm in ("all-gather", "ring", "ulysses"):
        result = runner.invoke(app, [*args, "--cp-algorithm", algorithm])
        assert result.exit_code == 0, result.output
        (cp,) = (a for a in json.loads(result.output)["axes"] if a["axis"] == "cp")
        found[algorithm] = {term["collective"] for term in cp["terms"]}
    assert found == {"all-gather": {"all-gather", "reduce-scatter"}, "ring": {"p2p"},
                     "ulysses": {"all-to-all"}}  # fmt: skip


@pytest.mark.parametrize("seq_len", [4096, 131072])
def test_pruning_beaten_cp_algorithms_keeps_the_best_of_every_algorithm_searched_alone(seq_len):
    """The search drops an algorithm another beats on the same layout (planner.cp_search);
    its winner is the best of the searches that pin each algorithm in turn."""
    job = api.build_job("llama3-8b", seq_len, global_batch_size=16)
    accelerator = load_accelerator(DGX.accelerator)
    space = dict(micro_batch_size=[1, 2], zero_stage=[1], recompute=["none", "full"],
                 schedule=["1f1b"])  # fmt: skip
    found = search(job, DGX, accelerator, 16, SearchSpace(**space), refine_top=0)
    each = [
        search(job, DGX, accelerator, 16, SearchSpace(**space, cp_algorithm=[name]),
               refine_top=0).table["step_time_s"].min()
        for name in CP_ALGORITHMS
    ]  # fmt: skip
    assert found.table["step_time_s"].min() == pytest.approx(min(each), rel=1e-12)
    assert found.rejected.get(CP_DOMINATED, 0) > 0  # counted under its reason


def test_plan_says_how_much_each_algorithm_would_cost_the_winning_layout():
    job = api.build_job("llama3-8b", 131072, global_batch_tokens=16 * 131072)
    space = api.build_search_space(micro_batch_size=[1], zero_stage=[1], recompute=["none"],
                                   schedule=["1f1b"], pp=[1])  # fmt: skip
    result, _ = api.plan(job, "dgx-h100", 16, space, refine_top=0)
    winner = result.results[0]
    assert winner["layout"]["cp"] > 1
    start = next(i for i, line in enumerate(result.explanation)
                 if line.startswith("context-parallel algorithms on the winning layout"))  # fmt: skip
    lines = result.explanation[start + 1 : start + 1 + len(CP_ALGORITHMS)]
    layout = winner["layout"]
    label = layout["cp_algorithm"]
    if label == "hierarchical":  # the line names its inner group
        label += f" (inner {layout['cp_inner']})"
    assert f"  {label}: {winner['step_time_s']:.3f} s (chosen)" in lines
    others = [line for line in lines if "chosen" not in line and "not allowed" not in line]
    assert all("+" in line or "the same as" in line for line in others)
