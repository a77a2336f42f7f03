"""Published MoE runs whose benchmark replaced the learned router with a fixed gate: NeMo
AutoModel's ``FakeBalancedGate`` sends token t to the k consecutive experts kt … kt+k−1
mod E ("Fake balanced gate is enabled to simulate ideal expert routing", its performance
summary), so under the contiguous expert placement a token's copies reach the nodes of one
block of k experts, not the up to k (DeepSeek-V3: 4) nodes of the learned router."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from hwspecs.catalog import load_runs
from planner.comm.collectives import nodes_reached
from planner.comm.terms import ep_routing
from planner.runs.rows import model_spec

AUTOMODEL_DEEPSEEK = {
    "automodel-h100-deepseek-v3-671b-pretrain-256g",
    "automodel-h100-deepseek-v3-671b-pretrain-1024g",
}


def _gate_nodes(experts: int, top_k: int, ep: int, gpus_per_node: int) -> int:
    """The most nodes one token's experts lie on under AutoModel's gate, counted token by
    token: ``indices = arange(n_tokens * k).view(-1, k) % E`` (``FakeBalancedGate.forward``,
    noise 0), experts placed contiguously, E/ep to a rank, ``gpus_per_node`` ranks to a
    node; one period of E/k tokens covers every assignment."""
    tokens = experts // top_k
    indices = np.arange(tokens * top_k).reshape(tokens, top_k) % experts
    nodes = indices // (experts // ep) // gpus_per_node
    return max(len(np.unique(row)) for row in nodes)


def _row_with(experts: int, top_k: int):
    row = next(r for r in load_runs("train") if r.id in AUTOMODEL_DEEPSEEK)
    moe = row.model.moe.model_copy(update={"experts": experts, "top_k": top_k})
    return row.model_copy(update={"model": row.model.model_copy(update={"moe": moe})})


@given(
    log_experts=st.integers(3, 9),
    log_top_k=st.integers(0, 4),
    log_ep=st.integers(0, 9),
    log_gpus_per_node=st.integers(0, 3),
)
def test_consecutive_routing_reaches_the_nodes_the_gate_sends_each_token_to(
    log_experts, log_top_k, log_ep, log_gpus_per_node
):
    experts, top_k = 2**log_experts, 2 ** min(log_top_k, log_experts - 1)
    ep, gpus_per_node = 2 ** min(log_ep, log_experts), 2**log_gpus_per_node
    routing = ep_routing(model_spec(_row_with(experts, top_k)))
    assert routing == (top_k, 1, experts // top_k)  # one of E/k groups of k experts
    nodes = max(1, ep // gpus_per_node)
    expected = _gate_nodes(experts, top_k, ep, gpus_per_node)
    assert nodes_reached(*routing, nodes) == expected


def test_automodels_deepseek_rows_ran_the_consecutive_gate_and_reach_one_node():
    """Both DeepSeek-V3 rows of AutoModel's summary carry the gate from a supplement at the
    row's own commit; over EP 64 on 8-GPU nodes their tokens reach 1 node, where the
    learned router's node-limited routing (M = 4, the report's §2.1.2) reaches 4."""
    rows = [r for r in load_runs("train") if r.id in AUTOMODEL_DEEPSEEK]
    assert len(rows) == 2
    for row in rows:
        (supplement,) = [s for s in row.supplements if s.field == "training.expert_routing"]
        assert supplement.source_ref.commit == row.source_ref.commit
        assert "FakeBalancedGate" in supplement.quote
        assert row.training.expert_routing == "consecutive" and row.training.ep == 64
        assert nodes_reached(*ep_routing(model_spec(row)), nodes=8) == 1
        learned = row.model_copy(
            update={"training": row.training.model_copy(update={"expert_routing": None})}
        )
        assert nodes_reached(*ep_routing(model_spec(learned)), nodes=8) == 4


def test_no_other_row_states_a_fixed_gate():
    routed = {r.id for r in load_runs("train") if r.training.expert_routing is not None}
    assert routed == AUTOMODEL_DEEPSEEK
