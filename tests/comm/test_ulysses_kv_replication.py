"""Ulysses over more ranks than a TP rank's KV heads: TransformerEngine refuses it (whole heads),
verl's Ulysses repeats the K/V heads ``max(degree // kv, 1)`` times before the all-to-all
(``repeat_kv``), which multiplies the K/V bytes it moves and holds by as much."""

from __future__ import annotations

import numpy as np
import pytest

from hwspecs.catalog import load_accelerator, load_cluster
from hwspecs.errors import PlanError
from planner import api
from planner.comm.traffic import axis_times_vectorized
from planner.cost.context_parallel import (
    cp_buffer_bytes,
    key_value_width,
    query_and_output_widths,
    ulysses_kv_repeats,
)
from planner.search import SearchSpace, search
from planner.spec.layout import CP_ALGORITHMS, Layout
from planner.spec.model import load_model
from planner.spec.rules import check_layout

DGX = load_cluster("dgx-h100")
LLAMA_8B = load_model("llama3-8b")  # 32 heads, 8 KV heads
ULYSSES = CP_ALGORITHMS.index("ulysses")


def test_the_repeat_count_is_verls():
    """verl's examples: nheads_k 4, sp 8 → 2; 8, 8 → 1; 16, 8 → 1 (here kv heads per TP rank)."""
    assert ulysses_kv_repeats(LLAMA_8B, 2, 8, True) == 2  # 4 KV heads per rank
    assert ulysses_kv_repeats(LLAMA_8B, 1, 8, True) == 1
    assert ulysses_kv_repeats(LLAMA_8B, 1, 4, True) == 1
    assert ulysses_kv_repeats(LLAMA_8B, 1, 32, True) == 4
    assert ulysses_kv_repeats(LLAMA_8B, 1, 32, False) == 1


def test_whole_heads_refuse_a_degree_beyond_the_kv_heads_and_replication_allows_it():
    layout = Layout(tp=1, cp=16, cp_algorithm="ulysses")
    with pytest.raises(PlanError, match="--ulysses-kv-heads replicate"):
        check_layout(layout, LLAMA_8B, 131072)
    check_layout(layout, LLAMA_8B, 131072, replicate_kv=True)
    # the query heads are never repeated: 64 ranks cannot share 32 heads
    with pytest.raises(PlanError, match="32 attention heads"):
        check_layout(Layout(tp=1, cp=64, cp_algorithm="ulysses"), LLAMA_8B, 131072,
                     replicate_kv=True)  # fmt: skip


def test_hierarchical_keeps_whole_heads_under_replication():
    """Megatron-Core's a2a+p2p is TransformerEngine's all-to-all: no repeat there."""
    model = load_model("llama3-405b")  # 8 KV heads: 1 per rank at tp 8
    with pytest.raises(PlanError, match="does not replicate"):
        check_layout(Layout(tp=8, cp=16, cp_algorithm="hierarchical"), model, 131072,
                     cp_inner=8, replicate_kv=True)  # fmt: skip


def test_the_all_to_all_moves_the_repeated_kv_heads():
    """Q, K, V bytes with K/V repeated r times: s/cp tokens of (q + r·kv), (cp − 1)/cp sent."""
    cp, s = 16, 32768
    jobs = {o: api.build_job("llama3-8b", s, global_batch_size=1, ulysses_kv_heads=o)
            for o in ("whole", "replicate")}  # fmt: skip
    # at cp 8 nothing is repeated: both options move the same bytes
    at8 = [axis_times_vectorized(j, DGX, tp=1, cp=8, dp=1, cp_algorithm="ulysses")
           for j in jobs.values()]  # fmt: skip
    assert float(at8[0]["cp_bytes_per_step"]) == float(at8[1]["cp_bytes_per_step"])
    out = axis_times_vectorized(jobs["replicate"], DGX, tp=1, cp=cp, dp=1, cp_algorithm="ulysses")
    q, o = (float(w) for w in query_and_output_widths(LLAMA_8B, 1))
    kv = float(key_value_width(LLAMA_8B, np.asarray(1)))
    per_pass = s / cp * (q + 2 * kv + o) * 2.0 * (cp - 1) / cp  # bf16, repeats = 16 // 8
    expected = LLAMA_8B.num_layers * 2 * per_pass  # forward and backward, one micro-batch
    assert float(out["cp_bytes_per_step"]) == pytest.approx(expected, rel=1e-12)


def test_the_buffers_hold_the_repeated_copy_and_its_head_sharded_one():
    s, cp = 131072, 16
    tokens = s / cp
    q, o = (float(w) * 2.0 for w in query_and_output_widths(LLAMA_8B, 1))
    kv = float(key_value_width(LLAMA_8B, np.asarray(1))) * 2.0
    whole = cp_buffer_bytes(LLAMA_8B, s, 1, 1, cp, ULYSSES, 2.0)
    repeated = cp_buffer_bytes(LLAMA_8B, s, 1, 1, cp, ULYSSES, 2.0, replicate_kv=True)
    assert float(whole) == pytest.approx(tokens * (q + kv + o))
    assert float(repeated) == pytest.approx(tokens * (q + o + 2 * 2 * kv))


def test_the_search_tries_ulysses_beyond_the_kv_heads_only_under_replication():
    accelerator = load_accelerator(DGX.accelerator)
    space = SearchSpace(tp=[1], cp=[16], pp=[1], micro_batch_size=[1], zero_stage=[3],
                        recompute=["full"], sequence_parallel=[True], schedule=["1f1b"],
                        cp_algorithm=["ulysses"])  # fmt: skip
    found = {}
    for option in ("whole", "replicate"):
        job = api.build_job("llama3-8b", 131072, global_batch_size=16, ulysses_kv_heads=option)
        found[option] = search(job, DGX, accelerator, 16, space, refine_top=0)
    assert found["whole"].feasible == 0 < found["replicate"].feasible
    assert any("KV heads" in reason for reason in found["whole"].rejected)
