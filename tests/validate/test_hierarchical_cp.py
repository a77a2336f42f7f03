"""Hierarchical CP on gloo (Megatron-Core's a2a+p2p): Ulysses over the inner CP ranks, ring
attention over the rings of them — its groups, its spec, and a 4-rank run (2 × 2) whose
losses are the serial model's and whose CP bytes are the planner's, byte for byte."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from planner.spec.layout import Layout
from validate.run import SMALL, run_layout
from validate.spec import RunSpec
from validate.workloads.hierarchical_attention import inner_and_outer_ranks

F32 = 4  # the workloads train in FP32


def test_inner_groups_are_consecutive_cp_ranks_and_rings_every_kth():
    inner, outer = inner_and_outer_ranks([0, 2, 4, 6, 8, 10, 12, 14], 2)
    assert inner == [[0, 2], [4, 6], [8, 10], [12, 14]]
    assert outer == [[0, 4, 8, 12], [2, 6, 10, 14]]


def test_one_machine_needs_the_inner_degree_given():
    with pytest.raises(ValueError, match="needs its inner degree"):
        RunSpec(name="h", workload=SMALL, layout=Layout(cp=4, cp_algorithm="hierarchical"))


@pytest.mark.slow
def test_two_by_two_reproduces_the_serial_losses_and_the_planners_cp_bytes():
    """Per layer: the inner all-to-alls send half (k = 2) of a rank's s/cp tokens of Q, K, V
    and of the output, forward and backward; the outer ring of 2 sends the K/V block once
    forward and twice backward (block, then the dK, dV) — FP32."""
    layout = Layout(cp=4, cp_algorithm="hierarchical", cp_inner=2, zero_stage=0)
    spec = RunSpec(name="cp-hierarchical", workload=SMALL, layout=layout)
    result = run_layout(spec, 300)
    assert result.ok, result.error
    assert max(result.loss_errors()) < 1e-5
    w = SMALL
    tokens, d = w.seq_len // 4, w.hidden_size // w.num_attention_heads
    q = o = w.num_attention_heads * d * tokens * F32
    kv = 2 * w.num_kv_heads * d * tokens * F32
    per_layer = 2 * (q + kv + o) / 2 + 3 * kv
    assert result.comm_bytes_per_axis()["cp"] == w.num_layers * per_layer
