"""The per-shape quantities read the micro-batch and the CP degree only through mbs/cp.

:func:`planner.columns.tables.shape_table_of` works out layer times once per (tp, ep, etp,
SP, mbs/cp, cp > 1) and activation bytes once per (tp, etp, SP, mbs/cp, routed load of
ep, recompute), on one shape holding each: this holds the cost functions to those fields,
so a term that starts reading ``mbs``, ``cp`` or ``ep`` on their own fails here before it
silently shares a wrong value.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwspecs.catalog import load_accelerator
from planner.columns.tables import _activation_entries, _recompute_free
from planner.cost import activations as act
from planner.cost.compute import GpuRates
from planner.spec.job import Job
from planner.spec.measures import memory_measures
from planner.spec.model import load_model

H100 = load_accelerator("h100-sxm")
RATES = GpuRates.of(H100, "bf16")
FP8 = GpuRates.of(H100, "fp8")
DEEPSEEK = Job(
    model=load_model("deepseek-v3"),
    seq_len=4096,
    global_batch_tokens=4096 * 1024,
    memory_measures=memory_measures("deepseek-v3"),
)
MIXTRAL = Job(model=load_model("mixtral-8x7b"), seq_len=4096, global_batch_tokens=4096 * 256)


def _shape(job, tp, cp, ep, etp, sp, mbs, recompute):
    return act.ActivationShape(
        seq_len=job.seq_len, micro_batch_size=mbs, tp=tp, cp=cp, sequence_parallel=sp and tp > 1,
        flash_attention=job.flash_attention, recompute=recompute,
        element_bytes=job.precision.activation_bytes, measures=job.active_memory_measures,
        ep=ep, etp=None if etp == tp else etp,
    )  # fmt: skip


def _times(job, shape, rates, bf16_rates):
    times, moe_t, free = _recompute_free(job, rates, None, bf16_rates, shape, shape.ep, {})
    policies = ("none", "selective", "full")
    return free, [(times.dense.recompute_s(p), moe_t.recompute_s(p)) for p in policies]


@settings(max_examples=25, deadline=None)
@given(
    job=st.sampled_from([DEEPSEEK, MIXTRAL]),
    tp=st.sampled_from([1, 2, 8]),
    fold=st.booleans(),
    sp=st.booleans(),
    ratio=st.sampled_from([(1, 1), (1, 2), (2, 1), (1, 8), (3, 4)]),
    scale=st.sampled_from([2, 4]),
    ep=st.sampled_from([1, 2, 8]),
    recompute=st.sampled_from(["none", "selective", "full"]),
    fp8=st.booleans(),
)
def test_equal_token_fractions_give_equal_shape_entries(
    job, tp, fold, sp, ratio, scale, ep, recompute, fp8
):
    mbs, cp = ratio
    etp = 1 if fold else tp
    rates, bf16_rates = (FP8, RATES) if fp8 else (RATES, None)
    small = _shape(job, tp, cp, ep, etp, sp, mbs, recompute)
    big = _shape(job, tp, cp * scale, ep, etp, sp, mbs * scale, recompute)
    if cp == 1:  # cp > 1 on both sides: the dispatch cost's own branch
        small = _shape(job, tp, 2 * cp, ep, etp, sp, 2 * mbs, recompute)
    assert _times(job, small, rates, bf16_rates) == _times(job, big, rates, bf16_rates)
    assert _activation_entries(job, None, small) == _activation_entries(job, None, big)


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_activations_read_ep_only_through_the_routed_load(ep):
    model = MIXTRAL.model
    assert model.routed_load_factor(ep) == model.routed_load_factor(2)
    shapes = [_shape(MIXTRAL, 2, 1, x, 2, True, 1, "none") for x in (2, ep)]
    assert _activation_entries(MIXTRAL, None, shapes[0]) == _activation_entries(
        MIXTRAL, None, shapes[1]
    )
