"""The exposure floor (:func:`planner.comm.exposure.exposed_floor`) is below what every rule
exposes whatever the compute it hides behind, and the rows' floor
(:func:`planner.comm.traffic.exposed_floor_vectorized`) below their exposed communication."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.api import build_job
from planner.comm.exposure import exposed_floor, exposed_time
from planner.comm.terms import RULES
from planner.comm.traffic import AXES, axis_times_vectorized, exposed_floor_vectorized

#: Times of a step's terms: 0, or a picosecond to 10 s (the rules take ratios of products of
#: two times, which underflow to 0 below about 1e-154 s: no step's term is that short).
seconds = st.one_of(st.just(0.0), st.floats(1e-12, 10.0))


@settings(max_examples=300, deadline=None)
@given(
    rule=st.sampled_from([rule for rule in RULES if rule != "cp_ring"]),  # ring: the caller's
    one=seconds,
    count=st.integers(0, 64),
    bucket_share=st.floats(0.0, 1.0),
    pooled_extra=seconds,
    m=st.integers(1, 512),
    pp=st.integers(1, 64),
    chunks=st.sampled_from([1, 2, 4]),
    forward=seconds,
    backward=seconds,
    tp_overlap=st.booleans(),
    ep_overlap=st.booleans(),
    sm_share=st.floats(0.0, 0.5),
)
def test_no_compute_hides_more_than_the_floor_allows(
    rule, one, count, bucket_share, pooled_extra, m, pp, chunks, forward, backward, tp_overlap,
    ep_overlap, sm_share,
):  # fmt: skip
    raw = count * one
    bucket = bucket_share * one
    floor = exposed_floor(rule, raw, one, bucket, m, pp, chunks, tp_overlap, ep_overlap, sm_share)
    exposed = exposed_time(
        rule, raw, one, bucket, m, pp, chunks, (forward, backward), tp_overlap, ep_overlap,
        raw + pooled_extra, sm_share,
    )  # fmt: skip
    assert 0.0 <= floor <= exposed * (1 + 1e-12) + 1e-300
    assert floor <= exposed_time(rule, raw, one, bucket, m, pp, chunks, None)  # nothing hidden


def test_the_rows_floor_is_below_their_exposed_communication_and_not_empty():
    """DeepSeek-V3-like rows on H800s: EP with and without DualPipe, PP, DP, ZeRO stages."""
    job = build_job("deepseek-v3", 4096, global_batch_size=15360)
    grid = np.array(
        [
            (tp, pp, dp, ep, zero, schedule)
            for tp in (1, 2)
            for pp in (8, 16)
            for dp in (16, 32)
            for ep in (8, 32, 64)
            for zero in (1, 3)
            for schedule in ("1f1b", "dualpipe", "dualpipev", "zbv")
            if ep <= dp
        ],
        dtype=object,
    )
    tp, pp, dp, ep, zero = (grid[:, k].astype(np.int64) for k in range(5))
    schedule = grid[:, 5].astype(str)
    rows = {
        "tp": tp, "pp": pp, "dp": dp, "ep": ep, "zero_stage": zero, "schedule": schedule,
        "micro_batch_size": 1, "recompute": "selective",
    }  # fmt: skip
    floor = exposed_floor_vectorized(job, "dgx-h800", **rows)
    rng = np.random.default_rng(0)
    for _ in range(3):  # any compute times
        forward, backward = rng.uniform(0.0, 0.05, (2, len(tp)))
        comm = axis_times_vectorized(job, "dgx-h800", **rows, forward_s=forward,
                                     backward_s=backward)  # fmt: skip
        exposed = sum(comm[f"{axis}_exposed_time_s"] for axis in AXES)
        placed = comm["valid"]
        assert placed.any()
        assert np.array_equal(np.isnan(floor), ~placed)
        assert np.all(floor[placed] <= exposed[placed] * (1 + 1e-12))
    assert np.median(floor[placed] / exposed[placed]) > 0.1  # a floor that bounds something
