"""Closed forms against the event simulator, and the published forms where they are exact.

Grid: pp 1–6 with every legal micro-batch count up to 3·pp + 2, plus pp 8 at 16 and 24
micro-batches; vpp 2–4 for interleaved 1F1B; F/B/W triples from balanced to lopsided;
F&B overlap 0, ½, 1 for the DualPipes.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hwspecs.errors import PlanError
from planner.pipeline import closed_form as cf
from planner.pipeline.schedules import SCHEDULES, generate_schedule
from planner.pipeline.simulate import simulate

#: (f, b, w) per rank per micro-batch: balanced, the paper's B > F > W, and lopsided ones.
TIMES = np.array(
    [
        (1.0, 1.0, 1.0),
        (1.0, 1.3, 0.9),
        (0.6, 2.0, 0.4),
        (2.0, 0.7, 1.5),
        (0.3, 0.5, 2.5),
        (1.5, 1.5, 0.2),
    ]
)
OVERLAPS = (0.0, 0.5, 1.0)


def legal_cases(name: str, max_pp: int = 8):
    spec = SCHEDULES[name]
    vpps = (2, 3, 4) if spec.fixed_vpp is None else (spec.fixed_vpp,)
    for pp, vpp in itertools.product(range(1, max_pp + 1), vpps):
        for m in range(1, 3 * pp + 3):
            try:
                generate_schedule(name, pp, m, vpp)
            except PlanError:
                continue
            yield pp, m, vpp


def simulated(name: str, pp: int, m: int, vpp: int, f, b, w, comm=0.0, overlap=0.0):
    chunks = cf.chunks_per_rank(name, vpp)
    schedule = generate_schedule(name, pp, m, vpp)
    return simulate(schedule, f / chunks, b / chunks, w / chunks, comm, overlap, 1.0 / chunks)


def exact_range(name: str, pp: int, m: int) -> bool:
    """Where the closed form is exact (module table of ``closed_form``)."""
    if name in ("zb-h2", "zbv"):
        return m >= 2 * pp - 1
    return True


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_closed_form_step_time_equals_simulator_without_comm(name):
    overlaps = OVERLAPS if SCHEDULES[name].bidirectional or name == "dualpipev" else (0.0,)
    checked = 0
    deep = [(8, 16, SCHEDULES[name].fixed_vpp or 2), (8, 24, SCHEDULES[name].fixed_vpp or 4)]
    for pp, m, vpp in [*legal_cases(name, max_pp=6), *deep]:
        if not exact_range(name, pp, m):
            continue
        for overlap in overlaps:
            f, b, w = TIMES.T
            closed = cf.step_time(name, pp, m, vpp, f, b, w, 0.0, overlap)  # vectorized
            busy = cf.busy_time(name, pp, m, vpp, f, b, w, overlap)
            for i, (fi, bi, wi) in enumerate(TIMES):
                sim = simulated(name, pp, m, vpp, fi, bi, wi, 0.0, overlap)
                assert closed[i] == pytest.approx(sim.step_time), (pp, m, vpp, fi, bi, wi, overlap)
                assert busy[i] == pytest.approx(max(sim.busy_time))
                checked += 1
    assert checked > 20


@pytest.mark.parametrize("name", ["zb-h2", "zbv"])
def test_few_microbatches_are_bounded_by_the_full_schedule(name):
    """ZB-H2 and ZB-V with m < 2p−1 drop actions from the 2p−1 schedule; never slower."""
    for pp, m, vpp in legal_cases(name, max_pp=6):
        if exact_range(name, pp, m):
            continue
        for fi, bi, wi in TIMES:
            sim = simulated(name, pp, m, vpp, fi, bi, wi)
            assert sim.step_time <= cf.step_time(name, pp, m, vpp, fi, bi, wi) + 1e-9


def test_gpipe_and_interleaved_count_every_hop_exactly():
    for name in ("gpipe", "interleaved-1f1b"):
        for pp, m, vpp in legal_cases(name, max_pp=5):
            sim = simulated(name, pp, m, vpp, 1.0, 1.2, 0.8, comm=0.05)
            assert cf.step_time(name, pp, m, vpp, 1.0, 1.2, 0.8, 0.05) == pytest.approx(
                sim.step_time
            )


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_with_comm_the_closed_form_never_exceeds_the_simulator(name):
    """Hops that steady states expose (1F1B, DualPipe's F&B chain) only the simulator sees."""
    for pp, m, vpp in legal_cases(name, max_pp=5):
        if not exact_range(name, pp, m):
            continue
        for (fi, bi, wi), comm in itertools.product(TIMES[:4], (0.01, 0.3)):
            sim = simulated(name, pp, m, vpp, fi, bi, wi, comm, 0.5)
            assert cf.step_time(name, pp, m, vpp, fi, bi, wi, comm, 0.5) <= sim.step_time + 1e-9


def test_1f1b_and_gpipe_bubble_is_p_minus_1_passes():
    """Megatron / zero-bubble paper: (p−1)(F+B+W), i.e. (p−1)/m of the ideal time."""
    for name, pp, m in itertools.product(("gpipe", "1f1b"), (2, 4, 7), (1, 5, 16)):
        for fi, bi, wi in TIMES:
            sim = simulated(name, pp, m, 1, fi, bi, wi)
            assert sim.bubble_time == pytest.approx((pp - 1) * (fi + bi + wi))
            assert sim.bubble_ratio == pytest.approx((pp - 1) / m)


def test_interleaved_bubble_shrinks_by_v():
    """Narayanan et al. SC'21: (p−1)(F+B+W)/v, a (p−1)/(v·m) ratio."""
    for pp, v, rounds in itertools.product((2, 3, 4), (2, 3, 4), (1, 2, 3)):
        m = pp * rounds
        sim = simulated("interleaved-1f1b", pp, m, v, 1.0, 1.3, 0.9)
        assert sim.bubble_time == pytest.approx((pp - 1) * 3.2 / v)
        assert sim.bubble_ratio == pytest.approx((pp - 1) / (v * m))


def test_zb_h1_bubble_is_p_minus_1_times_f_plus_b_minus_w():
    """Qi et al. Table: (p−1)(F+B−W), exact when W ≤ min(F, B) and m ≥ p."""
    for pp, m in itertools.product((2, 3, 4, 6), (6, 8, 13)):
        for fi, bi, wi in ((1.0, 1.0, 1.0), (1.0, 1.3, 0.9), (2.0, 1.5, 0.5)):
            sim = simulated("zb-h1", pp, m, 1, fi, bi, wi)
            assert sim.bubble_time == pytest.approx((pp - 1) * (fi + bi - wi))


def test_zb_h2_bubble_per_rank_span_is_p_minus_1_times_f_plus_b_minus_2w():
    """Qi et al.: (p−1)(F+B−2W), zero at F=B=W, measured per rank's own span (the
    post-validated optimizer lets ranks start the next step skewed); exact when
    W ≤ F, 2W ≤ F+B and m ≥ 2p−1. The makespan adds the parallelogram's (p−1)F."""
    for pp, m in itertools.product((2, 3, 4, 6), (11, 16)):
        for fi, bi, wi in ((1.0, 1.0, 1.0), (1.0, 1.3, 0.9), (2.0, 1.5, 0.5)):
            sim = simulated("zb-h2", pp, m, 1, fi, bi, wi)
            assert sim.pipelined_bubble_time == pytest.approx((pp - 1) * (fi + bi - 2 * wi))
            assert sim.bubble_time == pytest.approx((pp - 1) * max(fi, fi + bi - 2 * wi))


def test_zb_h2_issue_case_paper_zero_per_rank_span_and_one_rule_for_the_step():
    """Issue 17's case, pp 4, m 8, F = B = W = 1: the paper's (p−1)(F+B−2W) = 0 is the
    simulator's bubble per rank span; the synchronous step (what llmplan's step times use)
    adds the parallelogram's (p−1)F = 3, in the closed form and the simulator alike."""
    pp, m = 4, 8
    sim = simulated("zb-h2", pp, m, 1, 1.0, 1.0, 1.0)
    assert sim.pipelined_bubble_time == pytest.approx((pp - 1) * (1 + 1 - 2 * 1))
    assert sim.pipelined_bubble_time == pytest.approx(0.0)
    closed = float(cf.step_time("zb-h2", pp, m, 1, 1.0, 1.0, 1.0, 0.0, 0.0))
    busy = float(cf.busy_time("zb-h2", pp, m, 1, 1.0, 1.0, 1.0, 0.0))
    assert closed - busy == pytest.approx(sim.bubble_time) == pytest.approx((pp - 1) * 1.0)


def test_zbv_has_no_bubble_per_rank_span_at_equal_times():
    """Qi et al. §6: ZB-V is bubble-free at T_F = T_B = T_W once m ≥ 2p−1."""
    for pp in (2, 3, 4, 6):
        for m in (2 * pp - 1, 3 * pp):
            sim = simulated("zbv", pp, m, 2, 1.0, 1.0, 1.0)
            assert sim.pipelined_bubble_time == pytest.approx(0.0)


@pytest.mark.parametrize("name", ["dualpipe", "dualpipev"])
def test_dualpipe_readme_bubble_where_it_is_exact(name):
    """README: (S/2−1)(F&B + B − 3W) in chunk times with B the full backward and S the
    stage count (S = pp for DualPipe, 2·pp for DualPipeV). The simulator agrees when the
    chunk's forward equals its input gradient, B_input ≥ W, and either the pair is not
    overlapped or S/2 = 2; elsewhere the exact form is ``closed_form._dualpipe_step``."""
    for pp in (2, 4, 6, 8):
        stages = pp if name == "dualpipe" else 2 * pp
        half = stages // 2
        for m, (fb, w), overlap in itertools.product(
            (2 * pp, 2 * pp + 6), ((1.0, 0.5), (1.4, 1.4)), OVERLAPS
        ):
            if overlap and half != 2:
                continue
            sim = simulated(name, pp, m, None, fb, fb, w, 0.0, overlap)
            chunks = cf.chunks_per_rank(name, None)
            F, B, W = fb / chunks, fb / chunks, w / chunks
            full = B + W
            pair = F + full - overlap * min(F, full)
            assert sim.bubble_time == pytest.approx((half - 1) * (pair + full - 3 * W)), (
                pp,
                m,
                overlap,
            )


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_peak_activations_match_the_simulator(name):
    for pp, m, vpp in legal_cases(name, max_pp=6):
        sim = simulated(name, pp, m, vpp, 1.0, 1.3, 0.9)
        closed = cf.peak_activation_microbatches(name, pp, m, vpp)
        assert closed.shape == (pp,)
        if name == "zbv" and m < 2 * pp - 1:
            assert (closed >= np.asarray(sim.peak_activations) - 1e-9).all()  # documented bound
        else:
            assert closed == pytest.approx(sim.peak_activations), (pp, m, vpp)


def test_peak_activations_follow_the_published_counts():
    assert cf.peak_activation_microbatches("gpipe", 4, 8).tolist() == [8, 8, 8, 8]
    assert cf.peak_activation_microbatches("1f1b", 4, 8).tolist() == [4, 3, 2, 1]
    assert cf.peak_activation_microbatches("zb-h2", 4, 8).tolist() == [7, 5, 3, 1]
    # Megatron: rank 0 holds p·(1 + (p−1)/(p·v)) = p + (p−1)/v.
    assert cf.peak_activation_microbatches("interleaved-1f1b", 4, 8, 2)[0] == 4 + 3 / 2
    assert cf.peak_activation_microbatches("dualpipe", 8, 16).tolist() == [9] * 8
    assert cf.peak_activation_microbatches("zbv", 4, 8).tolist() == [4] * 4


@pytest.mark.parametrize("name", ["dualpipe", "dualpipev"])
def test_dualpipe_paired_share_counts_the_generated_pairs(name):
    """The share of a rank's forward chunks run in an F&B pair, on the rank with fewest,
    equals the count on the generated schedule (the reference DualPipe's eight steps)."""
    chunks = 2 if name == "dualpipev" else 1
    for pp in (2, 4, 6, 8, 16):
        for m in range(2 * pp, 6 * pp + 1, 2):
            schedule = generate_schedule(name, pp, m, chunks)
            counted = min(
                sum(a.fb_pair for a in acts if a.kind == "F") / sum(a.kind == "F" for a in acts)
                for acts in schedule
            )
            assert cf.dualpipe_paired_share(pp, m, chunks) == pytest.approx(counted), (pp, m)
    shares = cf.dualpipe_paired_share(np.array([4, 8]), np.array([8, 64]), chunks)
    assert shares.shape == (2,) and np.all((shares > 0) & (shares < 1))


def test_parameter_copies():
    assert {name: cf.parameter_copies(name) for name in SCHEDULES} == {
        name: 2 if name == "dualpipe" else 1 for name in SCHEDULES
    }


def test_closed_forms_take_arrays_of_candidates():
    f = np.linspace(0.5, 2.0, 50)
    out = cf.bubble_time("zb-h1", 8, 32, None, f, 1.2, 0.7)
    assert out.shape == (50,)
    assert (out >= 0).all()


def test_closed_forms_check_the_schedule_rules():
    with pytest.raises(PlanError, match="multiple of pp"):
        cf.step_time("interleaved-1f1b", 4, 10, 2)
    with pytest.raises(PlanError, match="vpp = 2"):
        cf.peak_activation_microbatches("dualpipev", 4, 8, 3)


@pytest.mark.parametrize("name", ["zb-h1", "zb-h2", "zbv", "dualpipev", "1f1b", "interleaved-1f1b"])
@pytest.mark.parametrize("weight_ratio", [0.0, 0.5, 0.94, 1.0, 1.9, 3.0])
def test_activations_with_weight_pending_microbatches_match_the_simulator(name, weight_ratio):
    """a·M_B + b·M_W at its peak (zero-bubble paper's M_W; ratio M_W/M_B): exact from
    2p − 1 micro-batches, an upper bound below."""
    for pp, m, vpp in legal_cases(name, max_pp=6):
        sim = simulated(name, pp, m, vpp, 1.0, 1.0, 1.0)
        simulated_peak = np.asarray(sim.peak_activation_units(weight_ratio))
        closed = cf.peak_activation_units(name, pp, m, vpp, np.arange(pp), weight_ratio)
        if m >= 2 * pp - 1:
            assert closed == pytest.approx(simulated_peak), (pp, m, vpp)
        else:
            assert (closed >= simulated_peak - 1e-9).all(), (pp, m, vpp)


def test_combined_1f1b_pairs_the_steps_after_megatrons_warm_up():
    """Megatron-Core's interleaved schedule warms up 2·(pp − 1) + (vpp − 1)·pp chunks on rank
    0, one more with overlap_moe_expert_parallel_comm (schedules.py); the rest run as F&B
    pairs. Without PP only the first forward and the last backward run alone; with PP and
    no virtual stages Megatron-Core refuses the overlap (runs_combined_1f1b)."""
    from planner import api
    from planner.comm.rows import ep_paired_share
    from planner.pipeline.closed_form import combined_1f1b_paired_share

    assert combined_1f1b_paired_share(4, 8, 2) == pytest.approx(1 - 11 / 16)
    assert combined_1f1b_paired_share(1, 8, 1) == pytest.approx(7 / 8)
    assert combined_1f1b_paired_share(16, 16, 2) == 0.0  # all warm-up: no pair
    job = api.build_job("deepseek-v3", 4096, global_batch_size=64, ep_comm_overlap=True)
    schedules = ["interleaved-1f1b", "1f1b", "1f1b", "interleaved-1f1b", "dualpipe"]
    pp, chunks, full = np.array([4, 1, 4, 4, 4]), np.array([2, 1, 1, 2, 1]), np.zeros(5, int)
    shares = ep_paired_share(job, schedules, pp, np.full(5, 8), chunks, np.full(5, 8), full)
    # refused for 1F1B with PP; full recomputation refuses it too; DualPipe pairs regardless
    assert shares[:3] == pytest.approx([5 / 16, 7 / 8, 0.0])
    full[3] = 1
    assert ep_paired_share(job, schedules, pp, np.full(5, 8), chunks, np.full(5, 8), full)[3] == 0
    assert shares[4] > 0
    shares = combined_1f1b_paired_share(np.array([1, 4]), np.array([8, 8]), np.array([1, 2]))
    assert shares == pytest.approx([7 / 8, 5 / 16])
