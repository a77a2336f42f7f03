"""Per-axis traffic per step (planner.comm.report, planner.comm.terms, planner.comm.traffic)."""

from __future__ import annotations

import numpy as np
import pytest

from hwspecs.catalog import catalog_names
from hwspecs.errors import PlanError
from planner.comm.report import ComputeTimes, axis_traffic
from planner.comm.traffic import AXES, axis_times_vectorized
from planner.pipeline.schedules import generate_schedule
from planner.spec.job import Job
from planner.spec.layout import Layout
from planner.spec.model import load_model
from planner.spec.rules import check_layout

LLAMA3_ORDER = ("tp", "cp", "pp", "dp")


def job_for(model: str, seq_len: int = 8192, tokens: int = 16 * 2**20, **kwargs) -> Job:
    return Job(model=load_model(model), seq_len=seq_len, global_batch_tokens=tokens, **kwargs)


def axis(report, name):
    return next(a for a in report.axes if a.axis == name)


LLAMA3_LAYOUT = Layout(tp=8, pp=16, dp=128, vpp=2, schedule="interleaved-1f1b", zero_stage=1)


def test_llama3_405b_tp_on_nvlink_dp_across_pods_with_exact_bytes():
    job = job_for("llama3-405b")
    report = axis_traffic(job, LLAMA3_LAYOUT, "llama3-h100-24k", LLAMA3_ORDER)
    model, m, layers = job.model, 2048 // 128, 8  # 126 layers on 32 stages: 3, 4, …, 4, 3
    tp, pp, dp = axis(report, "tp"), axis(report, "pp"), axis(report, "dp")
    activation = 8192 * model.hidden_size * 2
    assert tp.tier == "nvlink" and tp.collective.startswith("all-gather + reduce-scatter")
    norm_grads = layers * 2 * model.hidden_size * 2  # SP norm gradients, all-reduced once
    expected = layers * m * 4 * 2 * (7 / 8) * activation + 2 * (7 / 8) * norm_grads
    assert tp.bytes_per_step == pytest.approx(expected)
    assert pp.bytes_per_step == pytest.approx(2 * m * 2 * activation / 8)
    assert dp.tier == "cluster" and dp.tiers == ["pod", "cluster"]
    # A middle rank is busiest; its norm weights are whole on every TP rank.
    norms = layers * 2 * model.hidden_size
    params = (layers * model.layer_params(moe_layer=False) - norms) / 8 + norms
    assert dp.bytes_per_step == pytest.approx(2 * (127 / 128) * params * 2)
    # ZeRO-2 keeps only a gradient shard: the reduce-scatter runs every micro-batch.
    zero2 = axis(axis_traffic(job, LLAMA3_LAYOUT.model_copy(update={"zero_stage": 2}),
                              "llama3-h100-24k", LLAMA3_ORDER), "dp")  # fmt: skip
    assert zero2.bytes_per_step == pytest.approx((m + 1) * (127 / 128) * params * 2)
    assert report.model_dump()["axes"][0].keys() >= {
        "axis", "group_size", "tier", "collective", "bytes_per_step", "time_s", "exposed_time_s"
    }  # fmt: skip


def test_sequence_parallel_moves_the_same_bytes_as_all_reduce_and_recompute_adds_half():
    # Korthikanti et al. 2022 §4.2.2: RS + AG has the volume of one all-reduce.
    job = job_for("llama3-8b", tokens=8192 * 64)
    base = dict(tp=8, dp=4, pp=2)
    sp = axis(axis_traffic(job, Layout(**base), "dgx-h100"), "tp")
    ar = axis(axis_traffic(job, Layout(**base, sequence_parallel=False), "dgx-h100"), "tp")
    full = axis(axis_traffic(job, Layout(**base, recompute="full"), "dgx-h100"), "tp")

    def activations(report):
        return sum(t.bytes_per_step for t in report.terms if "activations" in t.what)

    assert ar.collective == "all-reduce"
    assert activations(sp) == pytest.approx(activations(ar))
    # 16 layers on the first rank: 4 collectives of each kind per layer (6 under full
    # recompute), plus one for the embedding.
    assert activations(full) == pytest.approx(activations(sp) * (16 * 6 + 1) / (16 * 4 + 1))


def test_zero_communication_volumes_of_the_zero_paper():
    # ZeRO §7: 2Ψ for DP, P_os and P_os+g; 3Ψ for P_os+g+p (per step, one micro-batch).
    job = job_for("llama3-8b", tokens=8192 * 8)
    psi_bytes = job.model.num_params() * 2 * (7 / 8)
    volumes = [
        axis(axis_traffic(job, Layout(dp=8, zero_stage=z), "dgx-h100"), "dp").bytes_per_step
        for z in (0, 1, 2, 3)
    ]
    assert volumes == pytest.approx([2 * psi_bytes, 2 * psi_bytes, 2 * psi_bytes, 3 * psi_bytes])


def test_gqa_shrinks_the_context_parallel_all_gather():
    job = job_for("llama3-8b", tokens=8192 * 8)
    mha = job.model_copy(update={"model": job.model.model_copy(update={"num_kv_heads": 32})})
    layout = Layout(cp=2, dp=4)
    gqa_bytes = axis(axis_traffic(job, layout, "dgx-h100"), "cp").terms[0].message_bytes
    mha_bytes = axis(axis_traffic(mha, layout, "dgx-h100"), "cp").terms[0].message_bytes
    assert gqa_bytes == 8192 * 2 * 8 * 128 * 2  # b·s·(K and V)·kv heads·head dim·bf16
    assert mha_bytes == 4 * gqa_bytes


@pytest.mark.parametrize(("schedule", "vpp", "sends"), [
    ("1f1b", 1, 2 * 8), ("interleaved-1f1b", 2, 2 * 8 * 2), ("zbv", 2, 2 * 8 * 2),
])  # fmt: skip
def test_pipeline_sends_per_micro_batch_and_chunk(schedule, vpp, sends):
    job = job_for("llama3-8b", tokens=8192 * 16)
    layout = Layout(tp=2, pp=4, dp=2, vpp=vpp, schedule=schedule)
    (term,) = axis(axis_traffic(job, layout, "dgx-h100"), "pp").terms
    assert term.count_per_step == sends
    assert term.message_bytes == 8192 * job.model.hidden_size * 2 / 2


def test_expert_all_to_all_dispatch_and_combine_forward_and_backward():
    job = job_for("mixtral-8x7b", seq_len=4096, tokens=4096 * 64)
    report = axis_traffic(job, Layout(ep=8, dp=8, zero_stage=1), "dgx-h100")
    ep = axis(report, "ep")
    m, model = 8, job.model
    expected = model.num_layers * m * 4 * (7 / 8) * 4096 * 2 * model.hidden_size * 2
    assert ep.collective == "all-to-all" and ep.bytes_per_step == pytest.approx(expected)
    assert "edp" not in [a.axis for a in report.axes]  # ep = dp·cp: no expert replicas
    dense = axis_traffic(job_for("llama3-8b", tokens=8192 * 8), Layout(dp=8), "dgx-h100")
    assert "ep" not in [a.axis for a in dense.axes]


def test_without_compute_times_everything_is_exposed():
    report = axis_traffic(job_for("llama3-405b"), LLAMA3_LAYOUT, "llama3-h100-24k", LLAMA3_ORDER)
    assert not report.compute_given
    for entry in report.axes:
        assert entry.exposed_time_s == entry.time_s
        assert {t.overlap_rule for t in entry.terms} == {"no compute times given: exposed = raw"}


def test_overlap_rules_with_compute_times():
    job = job_for("mixtral-8x7b", seq_len=4096, tokens=4096 * 64)
    compute = ComputeTimes(forward_s=1.0, backward_s=2.0)
    layout = Layout(tp=2, cp=2, pp=2, dp=4, ep=4, vpp=2, schedule="dualpipev")
    report = axis_traffic(job, layout, "dgx-h100", compute=compute)
    assert axis(report, "tp").exposed_time_s == axis(report, "tp").time_s  # TP is exposed
    cp = axis(report, "cp")  # attention waits for the gathered K and V (Llama 3 §3.3.2)
    assert cp.exposed_time_s == cp.time_s > 0
    ep = axis(report, "ep")  # DualPipe hides the paired chunks' all-to-alls, on 20 of 132 SMs
    paired = paired_share(layout, job.global_batch_size // layout.dp)
    assert 0.5 < paired < 1
    assert ep.exposed_time_s == pytest.approx(ep.time_s * (1 - paired + paired * 20 / 132))
    dp = axis(report, "dp")
    assert 0 < dp.exposed_time_s < dp.time_s  # the last bucket stays exposed
    one_f_one_b = axis_traffic(job, layout.model_copy(update={"schedule": "1f1b", "vpp": 1}),
                               "dgx-h100", compute=compute)  # fmt: skip
    assert axis(one_f_one_b, "ep").exposed_time_s == axis(one_f_one_b, "ep").time_s


def test_dualpipe_window_hides_the_ep_all_to_alls_together_not_each_on_its_own():
    """Each EP term fits the m·(F+B) window alone; together they overflow it by the excess."""
    job = job_for("mixtral-8x7b", seq_len=4096, tokens=4096 * 64)
    layout = Layout(pp=2, dp=8, ep=8, vpp=2, schedule="dualpipev")
    bare = axis(axis_traffic(job, layout, "dgx-h100"), "ep")
    largest = max(t.time_s for t in bare.terms)
    m = job.global_batch_size // layout.dp
    window = (largest + (bare.time_s - largest) / 10) / m  # F + B per micro-batch
    compute = ComputeTimes(forward_s=window / 3, backward_s=2 * window / 3)
    ep = axis(axis_traffic(job, layout, "dgx-h100", compute=compute), "ep")
    assert all(t.time_s < m * window for t in ep.terms)
    paired = paired_share(layout, m)  # the unpaired chunks' all-to-alls are exposed whole
    overlapped = ep.time_s - m * window
    assert ep.exposed_time_s == pytest.approx((1 - paired) * ep.time_s + paired * overlapped)
    columns = axis_times_vectorized(job, "dgx-h100", tp=1, pp=2, dp=8, ep=8, vpp=2,
                                    schedule="dualpipev", forward_s=window / 3,
                                    backward_s=2 * window / 3)  # fmt: skip
    assert columns["ep_exposed_time_s"] == pytest.approx(ep.exposed_time_s)


def paired_share(layout: Layout, num_microbatches: int) -> float:
    """Share of forward chunks run in an F&B pair on the rank with fewest, counted on the
    generated schedule (the reference DualPipe's steps)."""
    schedule = generate_schedule(layout.schedule, layout.pp, num_microbatches, layout.vpp)
    return min(
        sum(a.fb_pair for a in actions if a.kind == "F") / sum(a.kind == "F" for a in actions)
        for actions in schedule
    )


def random_layouts(model_name: str, count: int, seed: int):
    """Valid random layouts of ``model_name`` on at most 1,024 GPUs (MoE models: with the
    routed experts whole, etp = 1, in some of them)."""
    rng = np.random.default_rng(seed)
    job = job_for(model_name, seq_len=4096, tokens=4096 * 256)
    layouts = []
    while len(layouts) < count:
        schedule, vpp = [("1f1b", 1), ("interleaved-1f1b", 2), ("zbv", 2), ("dualpipev", 2),
                         ("gpipe", 1)][rng.integers(5)]  # fmt: skip
        layout = Layout(
            tp=int(rng.choice([1, 2, 4, 8])), cp=int(rng.choice([1, 2])),
            pp=int(rng.choice([1, 2, 4])), dp=int(rng.choice([1, 2, 4, 8, 16])),
            ep=int(rng.choice([1, 2, 4, 8])), vpp=vpp, schedule=schedule,
            micro_batch_size=int(rng.choice([1, 2])), zero_stage=int(rng.integers(4)),
            sequence_parallel=bool(rng.integers(2)),
            recompute=str(rng.choice(["none", "selective", "full"])),
        )  # fmt: skip
        if job.model.is_moe and layout.tp > 1 and rng.integers(2):
            layout = layout.model_copy(update={"etp": 1})
        try:
            check_layout(layout, job.model, job.seq_len)
            layout.resolved_num_microbatches(job.global_batch_size)
        except PlanError:
            continue
        layouts.append(layout)
    return job, layouts


@pytest.mark.parametrize(("model_name", "cluster"), [
    ("llama3-8b", "dgx-h100"), ("mixtral-8x7b", "llama3-h100-24k"), ("llama3-70b", "tpu-v6e"),
])  # fmt: skip
def test_vectorized_equals_the_explained_report_for_random_layouts(model_name, cluster):
    job, layouts = random_layouts(model_name, 25, seed=len(model_name))
    rng = np.random.default_rng(7)
    forward = rng.uniform(0.01, 0.5, len(layouts))
    backward = 2 * forward
    columns = {
        name: np.array([getattr(layout, name) for layout in layouts])
        for name in ("tp", "cp", "pp", "dp", "ep", "vpp", "micro_batch_size", "zero_stage",
                     "sequence_parallel", "recompute", "schedule")
    }  # fmt: skip
    columns["etp"] = np.array([layout.expert_tp for layout in layouts])
    out = axis_times_vectorized(job, cluster, **columns, forward_s=forward,
                                backward_s=backward)  # fmt: skip
    assert out["valid"].all()
    for row, layout in enumerate(layouts):
        compute = ComputeTimes(forward_s=forward[row], backward_s=backward[row])
        report = axis_traffic(job, layout, cluster, compute=compute)
        found = {a.axis: a for a in report.axes}
        for name in AXES:
            entry = found.get(name)
            for key in ("bytes_per_step", "time_s", "exposed_time_s"):
                expected = getattr(entry, key) if entry else 0.0
                assert out[f"{name}_{key}"][row] == pytest.approx(expected, rel=1e-9, abs=1e-12)
        assert out["total_exposed_time_s"][row] == pytest.approx(report.total_exposed_time_s)


def test_rows_that_cannot_be_placed_are_nan_not_errors():
    out = axis_times_vectorized(job_for("llama3-8b"), "dgx-h100", tp=np.array([8, 8, 4, 8]),
                                dp=np.array([4, 256, 2, 3]), ep=np.array([1, 1, 3, 1]))  # fmt: skip
    assert out["valid"].tolist() == [True, False, False, False]  # last: 2048 seqs over dp 3
    assert np.isnan(out["tp_time_s"][1:]).all() and out["tp_time_s"][0] > 0
    assert out["num_microbatches"][0] == 2048 // 4


@pytest.mark.parametrize("name", catalog_names("cluster"))
def test_comm_report_for_every_catalog_cluster(name):
    report = axis_traffic(job_for("llama3-8b", tokens=8192 * 32), Layout(tp=4, pp=2, dp=8), name)
    assert [a.axis for a in report.axes] == ["tp", "pp", "dp"]
    assert all(a.time_s > 0 and a.tier for a in report.axes)


def test_bad_layouts_are_one_line_errors():
    job = job_for("llama3-8b")
    for layout, words in [
        (Layout(tp=8, dp=256), "has 1024"),
        (Layout(tp=8, dp=4, schedule="nope"), "unknown schedule"),
        (Layout(tp=3, dp=4), "does not divide"),
    ]:
        with pytest.raises(PlanError, match=words) as error:
            axis_traffic(job, layout, "dgx-h100")
        assert "\n" not in str(error.value)


def test_v_shape_on_two_ranks_keeps_the_bottom_hop_local():
    """ZB-V on pp 2: rank 1 holds stages 1 and 2, so each rank sends one activation and one
    gradient per micro-batch; interleaved sends three from rank 0 (validated against torch)."""
    job = job_for("llama3-8b", tokens=8192 * 8)
    v = axis(axis_traffic(job, Layout(pp=2, dp=4, vpp=2, schedule="zbv"), "dgx-h100"), "pp")
    inter = axis(
        axis_traffic(job, Layout(pp=2, dp=4, vpp=2, schedule="interleaved-1f1b"), "dgx-h100"), "pp"
    )
    assert v.bytes_per_step * 3 == pytest.approx(inter.bytes_per_step * 2)


def test_balanced_split_is_placeable_like_the_layout_says():
    """61 layers on 16 stages (DeepSeek-V3) split 3/4: the vectorized form must accept it,
    and the collectives count the layers each rank really holds."""
    import numpy as np

    from planner.spec.layout import layers_per_virtual_stage
    from planner.spec.rules import layers_broken
    from planner.structure.stages import busiest_rank_layers

    layers = layers_per_virtual_stage(61, 16)
    assert not layers_broken(61, {"pp": np.asarray([16]), "vpp": np.asarray([1])}).any()
    ranks = busiest_rank_layers(
        load_model("deepseek-v3"), np.asarray(16), np.asarray(1), False, False
    )
    assert ranks["layers"].tolist() == layers.tolist()


def test_lora_data_parallel_exchanges_only_the_adapters():
    """A LoRA job's ZeRO-1 step reduce-scatters and all-gathers the adapters, not the base."""
    from planner import api
    from planner.spec.finetune import num_adapter_params

    spec = api.build_finetune(recipe="lora")
    job = Job(
        model=load_model("llama3-8b"), seq_len=2048, global_batch_tokens=2048 * 64, finetune=spec
    )
    dp = axis(axis_traffic(job, Layout(dp=8, zero_stage=1, micro_batch_size=2), "dgx-h100"), "dp")
    adapters = num_adapter_params(job.model, spec)
    assert dp.bytes_per_step == pytest.approx(2 * (7 / 8) * adapters * 4)  # fp32 adapters


def test_tp_with_sp_on_one_stage_counts_4l_plus_2_gathers_and_scatters():
    """One pipeline stage holds the embedding and the head: per micro-batch 4·L + 2
    all-gathers and as many reduce-scatters (the count measured under torch's DTensor SP)."""
    job = job_for("llama3-8b", seq_len=4096, tokens=4096 * 8)
    report = axis(axis_traffic(job, Layout(tp=2, dp=4), "dgx-h100"), "tp")
    gathers = next(t for t in report.terms if t.collective == "all-gather")
    scatters = next(t for t in report.terms if t.collective == "reduce-scatter")
    m = 2  # 8 sequences over dp 4, micro-batch 1
    assert gathers.count_per_step == scatters.count_per_step == (4 * 32 + 2) * m


def test_all_gather_context_parallel_gathers_twice_and_reduce_scatters_once_per_layer():
    """Forward and backward each gather K and V (TransformerEngine's all-gather CP keeps no
    gathered copy); full recompute adds the recomputed forward's gather."""
    job = job_for("llama3-8b", tokens=8192 * 8)
    for recompute, gathers in (("none", 2), ("full", 3)):
        layout = Layout(cp=2, dp=4, recompute=recompute)
        terms = {t.collective: t for t in axis(axis_traffic(job, layout, "dgx-h100"), "cp").terms}
        m = layout.resolved_num_microbatches(job.global_batch_size)
        assert terms["all-gather"].count_per_step == 32 * m * gathers
        assert terms["reduce-scatter"].count_per_step == 32 * m


def test_vocabulary_parallel_loss_adds_three_fp32_all_reduces_per_microbatch_on_the_head_rank():
    """max logit, sum of exponentials, target logit: one FP32 per local token each."""
    from planner.comm.terms import vocab_parallel_loss_bytes

    assert vocab_parallel_loss_bytes(2, 4096) == 2 * 4096 * 4
    job = job_for("llama3-8b", seq_len=4096, tokens=4096 * 8)
    report = axis(axis_traffic(job, Layout(tp=2, dp=4), "dgx-h100"), "tp")
    loss = next(t for t in report.terms if "cross-entropy" in t.what)
    assert loss.count_per_step == 3 * 2 and loss.message_bytes == 4096 * 4  # m 2, b 1
    # pp 4, 8 layers each: the last rank (8 layers + the head) is the busiest.
    report = axis(axis_traffic(job, Layout(tp=2, pp=4, dp=1), "dgx-h100"), "tp")
    loss = next(t for t in report.terms if "cross-entropy" in t.what)
    assert loss.count_per_step == 3 * 8  # m 8


def test_sequence_parallel_norm_gradients_include_the_final_norm_on_its_rank():
    job = job_for("llama3-8b", seq_len=4096, tokens=4096 * 8)
    report = axis(axis_traffic(job, Layout(tp=2, dp=4), "dgx-h100"), "tp")
    norms = next(t for t in report.terms if "norm" in t.what)
    assert norms.message_bytes == (2 * 32 + 1) * 4096 * 2  # 65 RMSNorm weights, bf16 grads


def test_an_accelerator_that_computes_its_collectives_exposes_every_term(tmp_path):
    """``overlaps_communication = false`` (a CPU rank whose gloo threads share its core):
    with compute times given, every term is exposed, in the report and in the columns."""
    from hwspecs.catalog import load_accelerator, load_cluster
    from planner.comm.terms import NO_OVERLAP_RULE
    from validate.local_specs import to_toml

    path = tmp_path / "synchronous.toml"
    path.write_text(
        to_toml(load_accelerator("h100-sxm").model_dump() | {"overlaps_communication": False})
    )
    cluster = load_cluster("dgx-h100").model_copy(update={"accelerator": str(path)})
    job = job_for("mixtral-8x7b", seq_len=4096, tokens=4096 * 64)
    layout = Layout(tp=2, pp=2, dp=8, ep=4, vpp=2, schedule="dualpipev", zero_stage=3)
    compute = ComputeTimes(forward_s=1.0, backward_s=2.0)
    overlapped = axis_traffic(job, layout, "dgx-h100", compute=compute)
    report = axis_traffic(job, layout, cluster, compute=compute)
    assert any(a.exposed_time_s < a.time_s for a in overlapped.axes)
    for entry in report.axes:
        assert entry.exposed_time_s == pytest.approx(entry.time_s)
        assert {t.overlap_rule for t in entry.terms} == {NO_OVERLAP_RULE}
    columns = axis_times_vectorized(
        job, cluster, tp=2, pp=2, dp=8, ep=4, vpp=2, schedule="dualpipev", zero_stage=3,
        num_microbatches=layout.resolved_num_microbatches(job.global_batch_size),
        forward_s=1.0, backward_s=2.0,
    )  # fmt: skip
    for entry in report.axes:
        assert columns[f"{entry.axis}_exposed_time_s"] == pytest.approx(entry.exposed_time_s)


def test_columns_of_rows_that_cannot_be_placed_are_invalid_not_an_error():
    job = job_for("llama3-8b", seq_len=4096, tokens=4096 * 64)
    alone = axis_times_vectorized(job, "dgx-h100", tp=np.array([8]), dp=np.array([4096]))
    mixed = axis_times_vectorized(job, "dgx-h100", tp=np.array([8, 8]), dp=np.array([4096, 2]))
    assert not alone["valid"][0] and np.isnan(alone["dp_time_s"][0])
    assert list(mixed["valid"]) == [False, True] and mixed["dp_time_s"][1] > 0


def test_pricing_some_axes_prices_them_as_pricing_all_does():
    """``axes``: the axes asked for come out bit for bit as with every axis priced (the CP
    search's probe asks for CP's only); the others are 0."""
    job = job_for("llama3-405b", seq_len=131072)
    rows = {
        "tp": np.array([8, 4, 8, 2]), "cp": np.array([16, 8, 4, 32]),
        "pp": np.array([16, 8, 1, 4]), "dp": np.array([8, 2, 4, 2]),
        "cp_algorithm": np.array(["all-gather", "ring", "ulysses", "hierarchical"]),
        "num_microbatches": 8, "forward_s": 0.1, "backward_s": 0.2,
    }  # fmt: skip
    every = axis_times_vectorized(job, "llama3-h100-24k", **rows)
    some = axis_times_vectorized(job, "llama3-h100-24k", **rows, axes=("cp",))
    assert (every["cp_exposed_time_s"] > 0).all()
    for what in ("exposed_time_s", "time_s", "bytes_per_step"):
        assert np.array_equal(some[f"cp_{what}"], every[f"cp_{what}"])
        for other in AXES:
            if other != "cp":
                assert not some[f"{other}_{what}"].any()
    assert np.array_equal(some["valid"], every["valid"])
