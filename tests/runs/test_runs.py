"""Published runs: the catalog's schema, `runs check` on a quick sample, and `fit`.

The fit is checked on rows the model itself generates (known terms in, the same terms
out); profiles are checked never to have been fitted on the test targets.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from pydantic import ValidationError

import cli
from hwspecs.catalog import DATA_DIR, load_accelerator, load_profile, load_runs, profile_names
from hwspecs.errors import PlanError
from hwspecs.runs import RunRow
from planner.cost.profile import TERMS, ideal_values, profile_parts, profiled_step_time
from planner.runs.check import RowPrediction, predict_row
from planner.runs.fit import fit_profile, fit_values, predicted_tokens
from planner.runs.rows import (
    Uncovered,
    model_spec,
    precision_recipe,
    ran_recompute_modules,
    run_job,
    search_space,
)

#: The shared reference rows beside the checkout or a folder above it (CI lays them beside
#: it): the test targets are read from there, never shipped.
REFERENCE = next(
    (up / "shared" / "reference" / "runs" for up in DATA_DIR.parents[1].parents
     if (up / "shared" / "reference" / "runs").is_dir()),
    DATA_DIR.parents[1].parent / "shared" / "reference" / "runs",
)  # fmt: skip


def _targets():
    path = REFERENCE / "targets.json"
    if not path.exists():
        pytest.skip("shared reference runs not on this machine")
    return load_runs(str(path))


def _plain_train_row():
    """A dense, non-MLA training row (no nested groups left empty)."""
    return next(r for r in load_runs("train") if r.model.moe is None and r.model.mla is None)


def test_catalog_rows_round_trip_through_the_schema():
    for row in load_runs("train"):
        again = RunRow.model_validate(json.loads(row.model_dump_json()))
        assert again == row


def test_schema_rejects_unknown_keys():
    data = load_runs("train")[0].model_dump(mode="json")
    data["training"]["tp_size"] = 8
    with pytest.raises(ValidationError, match="extra"):
        RunRow.model_validate(data)


def test_reference_file_loads_unchanged():
    """The shared reference rows (no model.mla or hardware.cluster keys) load as they are."""
    reference = REFERENCE / "train.json"
    if not reference.exists():
        pytest.skip("shared reference runs not on this machine")
    assert len(load_runs(str(reference))) == 614


def test_csv_runs_load_like_json(tmp_path):
    row = _plain_train_row().model_dump(mode="json")
    flat = {}

    def walk(prefix, value):
        if isinstance(value, dict) and prefix not in ("measured.other",):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else key, inner)
        elif isinstance(value, list):
            flat[prefix] = ";".join(value)
        else:
            flat[prefix] = "" if value is None else str(value)

    walk("", row)
    del flat["measured.other"], flat["model.moe"], flat["model.mla"]
    path = tmp_path / "mine.csv"
    path.write_text(",".join(flat) + "\n" + ",".join(f'"{v}"' for v in flat.values()) + "\n")
    loaded = load_runs(str(path))[0]
    expected = _plain_train_row()
    assert loaded.training.tp == expected.training.tp
    assert loaded.hardware.num_gpus == expected.hardware.num_gpus
    assert loaded.measured.tokens_per_s_per_gpu == expected.measured.tokens_per_s_per_gpu


def test_no_target_is_shipped_or_in_any_profile_training_rows():
    targets = {row.id for row in _targets()}
    assert len(targets) == 4
    assert not targets & {row.id for row in load_runs("train")}
    assert profile_names(), "profiles ship"
    for name in profile_names():
        assert not targets & set(load_profile(name).fit.training_ids), name


def test_profiles_have_at_most_8_bounded_terms_with_units():
    for name in profile_names():
        profile = load_profile(name)
        assert len(profile.terms) <= 8
        for term_name, term in profile.terms.items():
            assert term.lower <= term.value <= term.upper, (name, term_name)
            assert (term.unit, term.lower, term.upper) == TERMS[term_name][:3]


def test_ideal_values_leave_the_step_unchanged():
    cols = _synthetic_columns(np.random.default_rng(1), 20)
    assert np.allclose(profiled_step_time(cols, ideal_values()), cols["step_time_s"])
    assert all(np.allclose(part, 0) for part in profile_parts(cols, ideal_values()).values())


def _synthetic_columns(rng, n: int) -> dict:
    compute = rng.uniform(0.5, 20, n)
    return {
        "step_time_s": compute * rng.uniform(1.05, 1.6, n),
        "pipeline_time_s": compute * rng.uniform(1.0, 1.3, n),
        "compute_s": compute,
        "recompute_s": compute * rng.choice([0, 0.3], n),
        "exposed_comm_s": compute * rng.uniform(0, 0.2, n),
        "tp_exposed_time_s": compute * rng.choice([0, 0.05, 0.15], n),
        "overlapped_comm_s": compute * rng.uniform(0, 0.5, n),
        "kernels_per_step": rng.uniform(1e4, 5e5, n),
        "expert_width": rng.choice([512.0, 768, 2048, 8192], n),
        "attention_share": rng.uniform(0.02, 0.6, n),
        "expert_share": rng.choice([0, 0, 0.4], n),
        "num_gpus": 2.0 ** rng.integers(3, 13, n),
        "fp8": rng.random(n) < 0.5,
        "fp4": np.zeros(n, bool),
        "stack_overlaps_tp": rng.random(n) < 0.7,
    }


KNOWN = {
    "compute_efficiency_bf16": 0.8,
    "compute_efficiency_fp8": 0.65,
    "expert_gemm_half_width": 900.0,
    "attention_efficiency": 0.5,
    "kernel_overhead_s": 4e-6,
    "overlap_slowdown": 0.25,
    "sync_per_doubling_s": 0.004,
    "tp_comm_overlap": 0.6,
}


def test_tp_comm_overlap_hides_its_share_and_charges_the_overlap_slowdown():
    cols = _synthetic_columns(np.random.default_rng(3), 30)
    values = {**ideal_values(), "tp_comm_overlap": 0.6, "overlap_slowdown": 0.25}
    parts = profile_parts(cols, values)
    overlaps = cols["stack_overlaps_tp"]
    busy = cols["compute_s"] + cols["recompute_s"]
    gemms = busy * np.clip(1 - cols["attention_share"] - cols["expert_share"], 0, 1)
    hideable = np.minimum(cols["tp_exposed_time_s"], gemms)
    hidden = np.where(overlaps, 0.6 * hideable, 0.0)
    assert np.allclose(parts["profile_tp_overlap"], -hidden)
    assert np.allclose(parts["profile_overlap"], 0.25 * (cols["overlapped_comm_s"] + hidden))
    # The step never loses more than the TP time the ideal model exposed, and a stack that
    # does not overlap TP keeps all of it.
    step = profiled_step_time(cols, {**ideal_values(), "tp_comm_overlap": 1.0})
    expected = cols["step_time_s"] - np.where(overlaps, hideable, 0.0)
    assert np.allclose(step, expected)


def test_tp_overlap_hides_no_more_than_the_gemms_it_is_pipelined_with():
    """A TP collective split across the GEMM it feeds runs no faster than that GEMM: TP
    time beyond the dense GEMMs' (at the profile's sustained rate) stays exposed."""
    cols = {key: np.asarray(value) for key, value in _synthetic_columns(
        np.random.default_rng(5), 1).items()}  # fmt: skip
    cols |= {"compute_s": np.array([10.0]), "recompute_s": np.array([0.0]),
             "attention_share": np.array([0.2]), "expert_share": np.array([0.0]),
             "stack_overlaps_tp": np.array([True]), "fp8": np.array([False])}  # fmt: skip
    values = {**ideal_values(), "tp_comm_overlap": 1.0, "compute_efficiency_bf16": 0.8}
    for tp_s, hidden in ((5.0, 5.0), (30.0, 10.0)):  # GEMMs: 10 s · 0.8 share / 0.8 = 10 s
        cols["tp_exposed_time_s"] = np.array([tp_s])
        assert profile_parts(cols, values)["profile_tp_overlap"][0] == pytest.approx(-hidden)


def test_tp_overlap_follows_the_stack_unless_the_job_says():
    """Megatron-Core's performance recipes overlap TP (NeMo's MegatronCommOverlapCallback);
    Megatron-LM's --tp-comm-overlap and the other stacks' are off unless asked for; a
    published run is credited with overlap only where its framework ran it."""
    from planner.api import build_job, with_profile
    from planner.runs.profiles import STACKS
    from planner.spec.stack import STACKS_OVERLAPPING_TP, framework_overlaps_tp

    assert set(STACKS) >= STACKS_OVERLAPPING_TP
    job = build_job("llama3-8b", 4096, global_batch_tokens=2**20)
    assert job.tp_comm_overlap is None
    for stack in (None, "megatron"):  # a plan with no stack named assumes a tuned one
        assert with_profile(job, "h100-sxm", "none", stack).tp_comm_overlap is True
    for stack in ("pytorch-fsdp", "jax", "deepspeed"):
        assert with_profile(job, "h100-sxm", "none", stack).tp_comm_overlap is False
    # XLA's asynchronous collective fusion, which MaxText's TPU configurations turn on.
    assert with_profile(job, "tpu-v5p", "none", "jax").tp_comm_overlap is True
    assert with_profile(job, "tpu-v5p", "none", "pytorch-fsdp").tp_comm_overlap is False
    said = build_job("llama3-8b", 4096, global_batch_tokens=2**20, tp_comm_overlap=False)
    assert with_profile(said, "h100-sxm", "auto", "megatron").tp_comm_overlap is False
    assert framework_overlaps_tp("NeMo (Megatron-Core)")
    assert framework_overlaps_tp("Megatron-Bridge (Megatron-Core)")
    for framework in ("Megatron-LM", "Megatron-DeepSpeed", "Meta internal (PyTorch)", None):
        assert not framework_overlaps_tp(framework)
    assert framework_overlaps_tp("MaxText (JAX/XLA)", "tpu")
    assert not framework_overlaps_tp("MaxText (JAX/XLA)", "gpu")


def test_megatron_runs_cudnn_attention_where_the_accelerator_measures_it():
    """TransformerEngine prefers cuDNN's FusedAttention on Hopper+: a Megatron stack (or a
    Megatron-Core run) is timed at cuDNN's measured rates where the accelerator has them, else
    at the default rates; a kernel the job names is kept; other stacks keep the default."""
    from planner.api import build_job, with_profile
    from planner.runs.kernels import attention_kernel
    from planner.spec.stack import stack_attention_kernel

    job = build_job("llama3-8b", 4096, global_batch_tokens=2**20)
    assert with_profile(job, "h100-sxm", "none", "megatron").attention_kernel == "cudnn"
    assert with_profile(job, "a100-sxm-80gb", "none", "megatron").attention_kernel is None
    for stack in (None, "pytorch-fsdp", "jax", "deepspeed"):
        assert with_profile(job, "h100-sxm", "none", stack).attention_kernel is None
    named = build_job(
        "llama3-8b", 4096, global_batch_tokens=2**20, attention_kernel="flash-attention-3"
    )
    assert (
        with_profile(named, "h100-sxm", "none", "megatron").attention_kernel == "flash-attention-3"
    )
    assert stack_attention_kernel("megatron", {"cudnn": (0.5, 0.5)}) == "cudnn"
    assert stack_attention_kernel("megatron", {}) is None
    rows = load_runs("train")
    core = [r for r in rows if "megatron-core" in (r.training.framework or "").lower()]
    for accelerator in ("h100-sxm", "b200", "gb200", "gb300", "b300"):  # cudnn-frontend's curves
        assert {attention_kernel(r) for r in core if r.hardware.accelerator == accelerator} == {
            "cudnn"
        }, accelerator


def test_estimate_hides_tp_only_where_the_stack_overlaps_it():
    from planner.api import build_job, build_layout, estimate

    job = build_job("llama3-70b", 4096, global_batch_tokens=2**21)
    layout = build_layout(tp=8, pp=1, dp=8, cp=1, micro_batch_size=1)
    off = estimate(job, layout, "dgx-h100", 64, profile="auto", stack="pytorch-fsdp")
    on = estimate(job, layout, "dgx-h100", 64, profile="auto", stack="megatron")
    assert not off.tp_comm_overlap and on.tp_comm_overlap
    assert (
        "profile_tp_overlap" not in off.time_breakdown_s
        or not off.time_breakdown_s["profile_tp_overlap"]
    )
    assert on.time_breakdown_s["profile_tp_overlap"] < 0


def test_fit_recovers_the_terms_of_rows_the_model_generated():
    rng = np.random.default_rng(0)
    cols = _synthetic_columns(rng, 300)
    cols["ideal_tokens"] = rng.uniform(500, 20000, 300)
    cols["measured_tokens"] = predicted_tokens(cols, KNOWN)
    found = fit_values(cols, np.ones(300), list(KNOWN))
    for name, value in KNOWN.items():
        assert found[name] == pytest.approx(value, rel=0.05), name


def test_cross_validation_of_noise_free_rows_is_near_zero():
    rng = np.random.default_rng(2)
    cols = _synthetic_columns(rng, 120)
    ideal = rng.uniform(500, 20000, 120)
    measured = predicted_tokens({**cols, "ideal_tokens": ideal}, KNOWN)
    rows = [
        RowPrediction(
            id=f"row{i}",
            source="s",
            source_family=f"family{i % 4}",
            group=f"g{i}",
            model=f"model{i % 6}",
            accelerator="h100-sxm",
            precision="bf16",
            stack="megatron",
            num_gpus=8,
            covered=True,
            predicted_tokens_per_s_per_gpu=ideal[i],
            measured_tokens_per_s_per_gpu=measured[i],
            features={k: float(v[i]) for k, v in cols.items()},
        )
        for i in range(120)
    ]
    result = fit_profile(rows, "h100-sxm", None)
    assert result.in_sample_mape < 0.005
    assert result.loso_mape < 0.01 and result.kfold_mape < 0.01
    assert 0.99 < result.step_time_ratio_p10 <= result.step_time_ratio_p90 < 1.01


def test_held_out_errors_repeat_the_term_selection_without_the_held_out_rows(monkeypatch):
    """Nested cross-validation (Varma and Simon 2006): the terms are selected once on every
    row for the profile, and again inside every fold on that fold's training rows only, so no
    held-out error is measured on rows that chose the terms. (Selecting once on every row and
    then holding rows out gave H100 9.7% leave-one-source-out; the nested figure is 12.6%.)"""
    import planner.runs.fit as fit

    seen: list[frozenset] = []
    select = fit.select_terms

    def recording(cols, weights):
        seen.append(frozenset(cols["family"]))
        return select(cols, weights)

    monkeypatch.setattr(fit, "select_terms", recording)

    def noisy(cols, ideal):
        noise = np.random.default_rng(5).lognormal(0, 0.05, len(ideal))
        return predicted_tokens({**cols, "ideal_tokens": ideal}, KNOWN) * noise

    result = fit.fit_profile(_synthetic_rows(noisy, n=60), "h100-sxm", None)
    every = frozenset(f"family{i}" for i in range(4))
    assert seen[0] == every and seen.count(every) == 1  # the profile's own selection
    for family in every:  # leave-one-source-out and the k-fold of 4 families, one each
        assert seen.count(every - {family}) == 2
    assert len(seen) == 1 + 4 + 4
    assert result.loso_mape is not None and result.loso_mape < 0.1
    text = fit.profile_toml(result, "llmplan fit", "2026-12-05")
    assert "held_out_selects_terms = true" in text


def test_one_models_rows_do_not_inform_a_dtypes_sustained_compute():
    """B200's BF16 rows were all GPT-OSS-120B: a BF16 efficiency fitted on them (0.42) is
    that model's, not the chip's. A dtype's term needs rows of two models or more."""
    from planner.runs.fit import MIN_MODELS_PER_DTYPE, informed_terms

    cols = _synthetic_columns(np.random.default_rng(4), 40)
    fp8 = cols["fp8"]
    cols["model"] = np.where(fp8, np.array([f"m{i % 3}" for i in range(40)]), "gpt-oss-120b")
    names = informed_terms(cols)
    assert MIN_MODELS_PER_DTYPE == 2
    assert "compute_efficiency_fp8" in names and "compute_efficiency_bf16" not in names
    cols["model"] = np.array([f"m{i % 3}" for i in range(40)])
    assert {"compute_efficiency_fp8", "compute_efficiency_bf16"} <= set(informed_terms(cols))
    # A user's runs of one model (llmplan validate --out) fit it for that model.
    cols["model"] = np.array(["mine"] * 40)
    assert {"compute_efficiency_fp8", "compute_efficiency_bf16"} <= set(informed_terms(cols))


def test_predict_row_pins_the_published_layout():
    row = next(r for r in load_runs("train") if r.id.startswith("korthikanti22-22b"))
    prediction = predict_row(row)
    assert prediction.covered
    t = row.training
    assert (prediction.layout["tp"], prediction.layout["pp"]) == (t.tp, t.pp)
    assert prediction.layout["micro_batch_size"] == t.micro_batch


@pytest.mark.parametrize(
    ("row_id", "causal"), [("maxtext-v5p-32b-64chips-x1", True), ("maxtext-v5e-16b-x1", False)]
)
def test_published_tflops_are_read_as_the_publication_counts_them(row_id, causal):
    """MaxText's TFLOP/s count causal attention at the v5p rows' commit (train.py:
    ``causal_attention_tflops = noncasual_attention_flops / 2``) and all the scores at the
    2023 v5e rows' (``attention_tflops = 12 * ...``): the measured tokens/s divide by the
    same count, so the MFU llmplan reads back in that count is the published one."""
    row = next(r for r in load_runs("train") if r.id == row_id)
    prediction = predict_row(row)
    share = prediction.predicted_mfu_causal / prediction.predicted_mfu if causal else 1.0
    assert prediction.measured_mfu * share == pytest.approx(row.measured.mfu, rel=0.005)


def test_uncovered_rows_say_why():
    row = next(r for r in load_runs("train") if r.id == "maxtext-v5e-64b-x1")
    prediction = predict_row(row)
    assert not prediction.covered and prediction.reason == "no layout fits in memory"
    # By how much: the least memory a placeable layout needs, beside the capacity (XLA's
    # 15.75 GiB on TPU v5e, no runtime overhead on top).
    assert prediction.memory_capacity_gib == 15.75
    assert prediction.predicted_memory_gib > prediction.memory_capacity_gib
    with pytest.raises(Uncovered, match="FP4 training other than NVFP4 is not modelled"):
        precision_recipe("MXFP4")


def test_runs_check_quick_sample_json(capsys):
    reference = REFERENCE / "targets.json"
    if not reference.exists():
        pytest.skip("shared reference runs not on this machine")
    argv = ["runs", "check", "--runs", str(reference), "--accelerator", "h100-sxm",
            "--cluster", "llama3-h100-24k", "--profile", "none", "--json"]  # fmt: skip
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert result["num_rows"] == 3 and result["num_covered"] == 3  # Llama 3 Table 4
    assert result["overall"]["n"] == 3
    row = result["rows"][0]
    assert row["predicted_mfu"] > 0 and row["measured_tokens_per_s_per_gpu"] > 0
    # 8,192 and 16,384 GPUs: beyond the 6,144 of the H100 runs the profile was fitted on.
    assert all(r["outside_measured_layouts"][-1].endswith("GPUs > 6,144") for r in result["rows"])


def test_a_profiles_training_rows_lie_inside_its_measured_layouts():
    profile = load_profile("gb300")
    rows = {row.id: row for row in load_runs("train")}
    for row_id in profile.fit.training_ids[::6]:  # a sample: CI checks it quickly
        found = predict_row(rows[row_id], profile)
        assert found.covered and found.outside_measured_layouts == [], row_id


def test_shipped_profile_slows_the_ideal_model():
    row = next(r for r in load_runs("train") if r.hardware.accelerator == "h100-sxm")
    ideal = predict_row(row)
    profiled = predict_row(row, load_profile("h100-sxm"))
    assert profiled.predicted_tokens_per_s_per_gpu < ideal.predicted_tokens_per_s_per_gpu


def test_estimate_carries_the_profile_interval(capsys):
    code = cli.main(["estimate", "--profile", "shipped", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    low, high = result["step_time_interval_s"]
    assert low <= result["step_time_s"] <= high
    low, high = result["mfu_interval"]
    assert low <= result["mfu"] <= high
    assert "profile_compute" in result["time_breakdown_s"]


def test_explain_names_the_profile_terms_and_those_resting_on_few_models(capsys):
    """--explain lists the profile's fitted terms with their span leaving one model's runs
    out, and flags a term that swings over more than a quarter of its bounds: TPU v5e's
    attention efficiency (0.2 with its 16B model, 0.88 without)."""
    args = ["estimate", "--model", "llama3-8b", "--cluster", "tpu-v5e", "--gpus", "256",
            "--seq-len", "4096", "--global-batch-tokens", "4Mi", "--tp", "1", "--pp", "1",
            "--dp", "256", "--zero-stage", "3", "--micro-batch-size", "1", "--recompute",
            "full", "--explain"]  # fmt: skip
    assert cli.main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "profile term attention_efficiency = 0.2 fraction" in out
    assert "rests on few models" in out
    assert cli.main([*args, "--profile", "none"]) == 0
    assert "profile term" not in capsys.readouterr().out


def test_the_fast_end_of_the_interval_stops_at_the_dense_peak():
    """No step runs faster than its causal hardware FLOPs at the GEMM dtype's dense peak:
    A100 80GB's held-out 10th percentile (about 0.58 of the step) would otherwise put a
    small Llama's fast end above that."""
    from hwspecs.catalog import load_accelerator
    from planner.api import build_job, build_layout, estimate

    job = build_job("llama3-8b", 4096, global_batch_size=256)
    layout = build_layout(tp=1, pp=1, dp=64, micro_batch_size=4, zero_stage=1)
    result = estimate(job, layout, "dgx-a100", profile="shipped")
    peak = load_accelerator("a100-sxm-80gb").peak_flops_per_s("bf16")
    causal = result.mfu_causal / result.mfu
    floor = result.hardware_tflops_per_gpu * 1e12 * result.step_time_s * causal / peak
    low, high = result.step_time_interval_s
    ratio = load_profile("a100-sxm-80gb").fit.step_time_ratio_p10
    assert floor > ratio * result.step_time_s  # the cap binds here
    assert low == pytest.approx(floor) and high > result.step_time_s
    assert result.mfu_interval[1] == pytest.approx(result.mfu * result.step_time_s / floor)
    assert result.tokens_per_s_per_gpu_interval[1] == pytest.approx(
        result.tokens_per_s_per_gpu * result.step_time_s / floor
    )


def test_h800_borrows_h100_profile_and_says_so():
    from planner.runs.profiles import profile_for

    profile = profile_for("h800-sxm")
    assert profile.borrowed_from == "h100-sxm"


def test_unknown_runs_file_is_one_line_error(capsys):
    code = cli.main(["runs", "check", "--runs", "no-such-file.json"])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "no-such-file.json" in err


def test_fit_refuses_too_few_rows():
    from planner import api

    with pytest.raises(PlanError, match="needs"):
        api.fit(["train"], "h100-sxm", stack="no-such-stack")


def _estimate_json(capsys, *flags):
    code = cli.main(["estimate", *flags, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_estimate_defaults_to_the_accelerators_profile_and_says_so(capsys):
    default = _estimate_json(capsys)
    assert default["profile"] == "h100-sxm"
    assert default["step_time_interval_s"] is not None
    ideal = _estimate_json(capsys, "--profile", "none")
    assert ideal["profile"] is None and ideal["step_time_interval_s"] is None
    assert default["step_time_s"] > ideal["step_time_s"]  # the profile only adds time


def test_stack_chooses_the_stacks_profile(capsys):
    megatron = _estimate_json(capsys, "--stack", "megatron")
    assert megatron["profile"] == "h100-sxm (megatron)"
    # An accelerator with no profile of that stack takes its all-stack one.
    deepspeed = _estimate_json(capsys, "--stack", "deepspeed")
    assert deepspeed["profile"] == "h100-sxm"


def test_unknown_stack_is_one_line_error(capsys):
    code = cli.main(["estimate", "--stack", "tensorflow"])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "megatron" in err


def test_plan_prints_the_profile_it_used(capsys):
    argv = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "64", "--top", "1"]
    assert cli.main(argv) == 0
    out, _ = capsys.readouterr()
    assert "profile: h100-sxm;" in out
    assert cli.main([*argv, "--profile", "none"]) == 0
    out, _ = capsys.readouterr()
    assert "profile: none (the ideal model)" in out


def test_profile_loader_keeps_fields_a_later_fit_adds(tmp_path):
    text = (DATA_DIR / "profiles" / "b200.toml").read_text()
    text = text.replace("[fit]\n", "[fit]\nratio_error_p90 = 0.05\n")
    path = tmp_path / "newer.toml"
    path.write_text(text)
    assert load_profile(str(path)).fit.ratio_error_p90 == 0.05


def test_a_run_that_fills_no_whole_nvl72_rack_is_spread_evenly():
    """256 GPUs on NVL72 racks: 4 racks of 64 (16 of 18 trays each), so a 64-rank expert
    group stays inside one NVLink domain; 576 GPUs fill 8 racks and stay as they are."""
    from hwspecs.catalog import load_cluster
    from planner.runs.placement import spread_over_domains

    cluster = load_cluster("gb200-nvl72")
    spread = spread_over_domains(cluster, 256)
    assert [t.group_size for t in spread.tiers] == [64, 512]
    assert spread.scale_up_domain_size == 64
    assert spread_over_domains(cluster, 576) == cluster
    assert spread_over_domains(cluster, 64) == cluster  # inside one rack already
    assert spread_over_domains(load_cluster("dgx-h100"), 256) == load_cluster("dgx-h100")


def test_runs_check_page_is_offline_and_names_every_row(tmp_path, capsys):
    path = tmp_path / "runs.html"
    argv = ["runs", "check", "--accelerator", "a100-sxm-80gb", "--limit", "4", "--html", str(path)]
    assert cli.main(argv) == 0
    assert f"wrote {path}" in capsys.readouterr().out
    text = path.read_text()
    assert re.search(r"<script[^>]+src=", text) is None  # plotly.js inlined, nothing fetched
    ids = [r.id for r in load_runs("train") if r.hardware.accelerator == "a100-sxm-80gb"][:4]
    assert all(row_id in text for row_id in ids)
    assert "predicted = measured" in text and "MAPE per source" in text
    from tests.plots.test_pages import BROWSER, _render_offline

    if BROWSER is None:
        pytest.skip("no Chromium: .ci/run installs Debian's")
    dom, console = _render_offline(path, tmp_path)
    assert 'class="main-svg"' in dom and len(re.findall(r'class="trace ', dom)) >= 2
    assert console == []


def test_auto_says_when_no_profile_ships_for_the_accelerator(capsys):
    argv = ["estimate", "--cluster", "mi300x", "--model", "llama3-8b", "--tp", "8", "--pp", "1",
            "--dp", "1", "--gpus", "8"]  # fmt: skip
    assert cli.main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "profile: none (no profile ships for mi300x or its generation: the ideal model)" in out


def test_term_selection_escapes_the_local_minimum_of_backward_elimination(monkeypatch):
    """Held-out MAPE by kept set: dropping any one of a, b, c from all three raises it (the
    greedy elimination stops there, at 30%), while a alone is at 22%: forward selection
    finds it and the better of the two sets is kept."""
    import planner.runs.fit as fit

    held_out = {("a", "b", "c"): 0.30, ("a", "b"): 0.32, ("a", "c"): 0.32, ("b", "c"): 0.32,
                ("a",): 0.22, ("b",): 0.50, ("c",): 0.50}  # fmt: skip
    monkeypatch.setattr(fit, "_loso_mape", lambda cols, w, kept, f: held_out[tuple(sorted(kept))])
    assert fit.terms_that_earn_their_place({}, None, ["a", "b", "c"], None) == ["a"]
    held_out[("a", "b", "c")] = 0.20  # the full set best: elimination keeps it
    assert fit.terms_that_earn_their_place({}, None, ["a", "b", "c"], None) == ["a", "b", "c"]


def test_node_limited_routing_as_the_rows_state_it():
    """DeepSeek-V3's rows say "node-limited routing (<=4 nodes)" (its report §2.1.2): the
    row's model prices its EP all-to-all as the catalog's deepseek-v3 does."""
    from hwspecs.runs import node_limit
    from planner.runs.rows import model_spec
    from planner.spec.model import load_model

    assert node_limit("node-limited routing (<=4 nodes); aux-loss-free balancing") == 4
    assert node_limit(None) is None and node_limit("aux-loss-free balancing") is None
    rows = [row for row in load_runs() if row.model.moe is not None]
    limited = [row for row in rows if row.model.moe.max_nodes_per_token]
    assert limited and all("DeepSeek-V3" in row.model.name for row in limited)
    catalog = load_model("deepseek-v3").max_nodes_per_token
    learned = [row for row in limited if row.training.expert_routing is None]
    assert learned and all(model_spec(row).max_nodes_per_token == catalog for row in learned)


def test_a_profile_says_why_each_term_stayed_ideal():
    """Uninformed terms and informed ones the cross-validation dropped are told apart."""
    from planner.runs.fit import FitResult, profile_toml

    names = list(TERMS)
    result = FitResult(
        accelerator="h100-sxm", stack=None, values=ideal_values(), fitted_terms=names[:2],
        informed_terms=names[:4], training_ids=["a"], num_rows=1, num_groups=1,
        in_sample_mape=0.1, kfold_mape=None, loso_mape=None, loso_mape_by_source={},
        in_sample_mape_by_source={}, step_time_ratio_p10=1.0, step_time_ratio_p90=1.0,
        ideal_mape=0.2,
    )  # fmt: skip
    note = next(line for line in profile_toml(result, "fit", "d").splitlines() if "notes" in line)
    assert f"{', '.join(names[4:])} (no row informs them)" in note
    assert f"{', '.join(names[2:4])} (fitted, they did not lower the held-out error)" in note
    for name in profile_names():  # a term a shipped note names was left at its ideal value
        profile = load_profile(name)
        for term in (t for t in TERMS if re.search(rf"\b{t}\b", profile.notes)):
            if term in profile.terms:  # profiles list the terms they fit, and may list others
                assert profile.terms[term].value == TERMS[term][3], (name, term)


@pytest.mark.parametrize(
    ("text", "gated"),
    [("SwiGLU", True), ("SwiGLU (clamped)", True), ("GeGLU (gated)", True), ("GELU", False),
     ("squared-ReLU", False), ("ReLU", False), ("ReLU (non-gated)", False), ("ungated GELU", False)],
)  # fmt: skip
def test_mlp_text_names_gated_or_not(text, gated):
    """Every MLP text the catalog's rows use (and "ungated"): "non-gated" is not gated."""
    from planner.runs.rows import mlp_is_gated

    assert mlp_is_gated(text) is gated


def test_catalog_mlp_texts_are_all_classified():
    """A new MLP text in the catalog must be added to the cases above."""
    known = {"SwiGLU", "SwiGLU (clamped)", "GeGLU (gated)", "GELU", "squared-ReLU", "ReLU",
             "ReLU (non-gated)"}  # fmt: skip
    assert {row.model.mlp for row in load_runs("train")} <= known


def test_maxtext_22b_has_22b_parameters():
    """MaxText's 22B (README's TPU v4 table; two-matrix ReLU MLP) as its row's model: 22B
    parameters within 3% (as a gated MLP it would be 29B)."""
    from planner.runs.rows import model_spec

    row = next(r for r in load_runs("train") if r.id == "maxtext-v4-22b-x1")
    assert model_spec(row).num_params() == pytest.approx(22e9, rel=0.03)


def test_llm_foundry_rows_run_the_fused_loss_and_fit():
    """llm-foundry's MPT computes its loss with FlashAttention's fused CrossEntropyLoss: the
    MPT-350m rows at micro-batch 18 on A100 40GB, which ran, fit (the unfused loss's FP32
    probabilities, 7.4 GB at 36,864 tokens × 50,368 vocab, would not leave room)."""
    from planner.runs.kernels import cross_entropy_kernel

    rows = [r for r in load_runs("train") if r.id.startswith("llmfoundry-a10040gb-mpt350m-s2048")]
    assert {cross_entropy_kernel(row) for row in rows} == {"fused"}
    big = next(row for row in rows if row.training.micro_batch == 18)
    prediction = predict_row(big)
    assert prediction.covered, prediction.reason
    assert prediction.predicted_memory_gib < 40


def test_maxtext_per_device_batch_counts_every_chip():
    """MaxText's per_device_batch_size (the rows' micro-batch) counts the TP chips too: the
    global batch is it times the chips times the accumulation steps (MaxText's pyconfig), so
    a replica's micro-batch is the global batch over dp · accumulation steps."""
    from planner.runs.rows import replica_micro_batch

    rows = [r for r in load_runs("train") if "maxtext" in (r.training.framework or "").lower()]
    tensor_parallel = [r for r in rows if r.training.tp > 1]
    assert tensor_parallel
    for row in rows:
        t = row.training
        dp = row.hardware.num_gpus // (t.tp * t.pp * t.cp)
        assert t.micro_batch * row.hardware.num_gpus * (t.grad_accum or 1) == t.global_batch_seqs
        assert replica_micro_batch(row, dp) == t.micro_batch * t.tp * t.pp * t.cp
    other = _plain_train_row()
    dp = other.hardware.num_gpus // (other.training.tp * other.training.pp * other.training.cp)
    assert replica_micro_batch(other, dp) == other.training.micro_batch


def test_tpu_pods_over_dcn_grow_and_a_single_pod_does_not():
    """A run larger than the reference cluster of TPU v5e pods joined by DCN is predicted on
    more pods over DCN; a single v4 pod (its one tier is its torus) does not grow."""
    from planner.runs.placement import run_cluster

    big = next(r for r in load_runs("train") if r.id == "maxtext-v5e-16b-x32")
    cluster = run_cluster(big)
    assert cluster.num_gpus >= 8192 and cluster.tiers[0].link == "tpu-ici-v5e"
    assert {tier.link for tier in cluster.tiers[1:]} == {"dcn"}
    assert predict_row(big).covered
    palm = next(r for r in load_runs("train") if r.id == "palm-540b-6144xtpuv4")
    assert predict_row(palm).reason == "run larger than the catalog's TPU pod"


def test_fit_help_counts_the_profile_terms():
    """The fit command's summary says how many of the terms a profile fits at most."""
    import commands.runs
    from planner.runs.fit import MAX_FITTED_TERMS

    summary = " ".join(commands.runs.fit.__doc__.split())
    assert f"at most {MAX_FITTED_TERMS} of {len(TERMS)} bounded terms" in summary


def test_a_row_labelled_with_mtp_trains_its_modules():
    """Megatron-Bridge labels DeepSeek-V3's configurations "(w/ MTP)" and "(w/o MTP)"; the
    architecture note states the depth (1): only the labelled row's model has the module."""
    from planner.runs.rows import model_spec, mtp_modules

    rows = [r for r in load_runs("train") if "DeepSeek-V3" in r.model.name]
    labelled = [r for r in rows if "w/ MTP" in (r.notes or "")]
    assert labelled and all(mtp_modules(r) == 1 for r in labelled)
    assert all(model_spec(r).num_mtp_modules == 1 for r in labelled)
    without = [r for r in rows if "w/o MTP" in (r.notes or "")]
    assert without and all(mtp_modules(r) == 0 for r in without)


def test_published_flops_per_token_count_the_mtp_module_each_deepseek_row_trained():
    """Megatron's model FLOP counter counts the MTP module (DeepSeek-V3 §2.2: a 2h → h
    projection, one more layer and the shared head's second pass). Every DeepSeek-V3 row
    that prints model TFLOP/s beside tokens/s prints, within 1%, the causal training FLOPs
    per token of the model with the MTP modules the row trained (the "w/ MTP" label, or the
    launch script's ``mtp_num_layers`` a supplement quotes), and more than 3% from the other.
    The rows without a module are Megatron-Bridge 25.11's "w/o MTP" and NeMo AutoModel's."""
    from planner.cost.flops import layer_ops, lm_head_op, model_flops_per_token, sum_ops
    from planner.runs.rows import model_spec, mtp_modules

    rows = [r for r in load_runs("train") if "DeepSeek-V3" in r.model.name]
    printed = [
        r for r in rows if r.measured.model_tflops_per_gpu and r.measured.tokens_per_s_per_gpu
    ]
    assert len(printed) == len(rows) == 32
    for row in printed:
        model, seq = model_spec(row), row.training.seq_len
        layer = sum_ops(layer_ops(model, seq, 1.0, moe_layer=True, causal=True)).total / seq
        module = 6 * 2 * model.hidden_size**2 + layer + lm_head_op(model, seq).total / seq
        main = model_flops_per_token(model, seq, causal=True)
        published = row.measured.model_tflops_per_gpu * 1e12 / row.measured.tokens_per_s_per_gpu
        counted = main + mtp_modules(row) * module
        assert published / counted == pytest.approx(1.0, abs=0.01), row.id
        other = main + (1 - mtp_modules(row)) * module
        assert abs(published / other - 1) > 0.03, row.id
    trained = sum(mtp_modules(r) for r in rows)
    assert trained == 27 and {r.source_ref.repo for r in rows if not mtp_modules(r)} == {
        "NVIDIA-NeMo/Megatron-Bridge",
        "NVIDIA-NeMo/Automodel",
    }


def test_a_row_that_states_its_pipeline_layout_is_predicted_on_it():
    """Rows whose launch scripts write their layers stage by stage (Megatron-Bridge's
    DeepSeek-V3 and Kimi-K2 ``pipeline_model_parallel_layout``, NeMo's first and last
    stage's layers) are searched on that layout alone: its stages are the row's pp·vpp, its
    layers the model's, its MTP modules the row's, and its last stage holds fewer layers than
    its second (the head's stage unloaded); two of them are predicted and covered."""
    from planner.runs.rows import model_spec, search_space
    from planner.spec.layout import model_layers_per_virtual_stage

    rows = [r for r in load_runs("train") if r.training.pp_layout]
    assert len(rows) == 28
    for row in rows:
        model = model_spec(row)
        assert search_space(row, model).pipeline_layer_split == row.training.pp_layout
        stages = model_layers_per_virtual_stage(
            model, row.training.pp, row.training.vpp or 1, row.training.pp_layout
        )
        assert stages.sum() == model.num_layers and stages[-1] < stages[1], row.id
    for row in rows[:2]:
        assert predict_row(row).covered, row.id


def test_runs_check_says_how_far_a_run_that_does_not_fit_is_off(tmp_path, capsys, monkeypatch):
    """The rows no layout fits are listed with the least memory a layout needs and the HBM
    there is, in the table (80 columns) and the CSV."""
    monkeypatch.setenv("COLUMNS", "80")
    path = tmp_path / "v5e.csv"
    assert cli.main(["runs", "check", "--accelerator", "tpu-v5e", "--csv", str(path)]) == 0
    out = capsys.readouterr().out
    assert "no layout fits: the least memory a layout needs" in out
    line = next(text for text in out.splitlines() if "maxtext-v5e-64b-x1" in text)
    assert "15.75" in line and max(len(text) for text in out.splitlines()) <= 80
    import csv

    rows = {row["id"]: row for row in csv.DictReader(path.open())}
    short = rows["maxtext-v5e-64b-x1"]
    assert float(short["predicted_memory_gib"]) > float(short["memory_capacity_gib"]) == 15.75
    assert rows["maxtext-v5e-16b-x1"]["memory_capacity_gib"] == ""  # covered: no shortfall


@pytest.mark.parametrize(
    ("row_id", "policy"),
    [
        ("dgxc-2505-gb200-deepseek-v3-bf16-128g", "selective"),  # RM='core_attn'
        ("dgxc-2505-h100-deepseek-v3-bf16-1024g", "mla_up_proj"),
    ],
)
def test_published_recompute_modules_are_pinned(row_id, policy):
    """A row whose launch script names Megatron-Core's ``--recompute_modules`` (dgxc-benchmarking
    25.05's DeepSeek-V3 ``launch.sh``, a supplement) runs that policy, not a searched one."""
    from planner.runs.rows import model_spec, search_space

    row = next(r for r in load_runs("train") if r.id == row_id)
    assert search_space(row, model_spec(row)).recompute == [policy]


def test_megatron_bridge_rows_reduce_gradients_in_bf16():
    """Megatron-Bridge's performance recipes set ``grad_reduce_in_fp32 = False`` at every
    release the catalog holds (a supplement per release and config file): the gradient
    buffer is BF16 there, also under FP8 and NVFP4, whose recipes default to FP32 gradients.
    Rows of other stacks keep their recipe's default."""
    from planner.runs.rows import model_spec, run_job

    bridge = [r for r in load_runs("train") if "bridge" in (r.training.framework or "").lower()]
    assert bridge and all(r.training.grad_dtype == "bf16" for r in bridge)
    fp8 = next(r for r in bridge if "fp8" in r.training.precision.lower())
    assert run_job(fp8, model_spec(fp8)).precision.gradient_dtype == "bf16"
    other = next(r for r in load_runs("train") if r.id == "korthikanti22-175b-selective-sp")
    assert other.training.grad_dtype is None


def test_nemo_performance_scripts_reduce_fp8_gradients_in_bf16_but_deepseek_v3s_in_fp32():
    """NeMo 2.0's performance scripts (NeMo 2.2-2.4 and the commits dgxc-benchmarking 25.04
    and 25.05 pin) set ``grad_reduce_in_fp32 = False`` under FP8; dgxc 25.05's DeepSeek-V3
    runs BF16 on a recipe that reduces in FP32 (``recipes/deepseek.py``: its DDP config and
    ``bf16_mixed()``), unchanged by the script outside FP8. The FP8 recipe's default FP32
    gradients and bf16-mixed's BF16 are what these rows would otherwise take."""
    from planner.runs.rows import model_spec, run_job

    rows = {r.id: r for r in load_runs("train")}
    fp8 = [r for i, r in rows.items() if i.startswith(("nemodocs-25", "dgxc-2505"))
           and "fp8" in r.training.precision.lower()]  # fmt: skip
    assert len(fp8) == 29 and all(r.training.grad_dtype == "bf16" for r in fp8)
    llama = rows["dgxc-2504-h100-llama3.1-405b-fp8-1024g"]
    assert run_job(llama, model_spec(llama)).precision.gradient_dtype == "bf16"
    deepseek = rows["dgxc-2505-gb200-deepseek-v3-bf16-256g"]
    assert run_job(deepseek, model_spec(deepseek)).precision.gradient_dtype == "fp32"
    yaml = rows["dgxc-2504-h100-gpt3-175b-fp8-512g"]  # NeMo 1's YAML: grad_sync_dtype bf16
    assert run_job(yaml, model_spec(yaml)).precision.gradient_dtype == "bf16"


def test_nemo_1_yaml_workloads_of_dgxc_reduce_gradients_in_bf16():
    """dgxc-benchmarking's NeMo 1 YAML workloads set ``grad_sync_dtype: bf16``: 24.11.1's
    (Llama 3.1 405B, GPT-3 175B, Nemotron-4 15B and 340B) and 25.04's GPT-3 with Apex's
    distributed Adam, whose gradient buffer is allocated in that dtype, and 25.04's Grok-1
    with Megatron-Core's distributed optimizer, which NeMo 2.1 then builds with
    ``grad_reduce_in_fp32=False``: their FP8 rows too, which the FP8 recipe would otherwise
    give FP32 gradients."""
    from planner.runs.rows import model_spec, run_job

    rows = [r for r in load_runs("train") if r.id.startswith("dgxc-2411")]
    nemo = [r for r in rows if "NeMo" in (r.training.framework or "")]
    assert len(nemo) == 35 and all(r.training.grad_dtype == "bf16" for r in nemo)
    assert all(r.training.grad_dtype is None for r in rows if r not in nemo)  # JAX: not read
    yaml_2504 = [r for r in load_runs("train") if r.id.startswith(("dgxc-2504-h100-grok1",
                 "dgxc-2504-h100-gpt3"))]  # fmt: skip
    assert len(yaml_2504) == 22 and all(r.training.grad_dtype == "bf16" for r in yaml_2504)
    fp8 = [r for r in nemo + yaml_2504 if "fp8" in r.training.precision.lower()]
    assert len(fp8) == 27
    assert all(run_job(r, model_spec(r)).precision.gradient_dtype == "bf16" for r in fp8)


def test_maxtexts_minimal_remat_is_the_dots_policy():
    """MaxText's ``remat_policy=minimal`` saves the projections' outputs only
    (``checkpoint_dots_with_no_batch_dims`` at the rows' commit), not Megatron's selective
    recomputation, which keeps every other tensor too."""
    from planner.runs.rows import model_spec, search_space

    row = next(r for r in load_runs("train") if r.id == "maxtext-v5p-32b-64chips-x1")
    assert search_space(row, model_spec(row)).recompute == ["dots"]
    prediction = predict_row(row)
    assert prediction.covered and prediction.layout["recompute"] == "dots"
    assert prediction.predicted_memory_gib <= 95.0


def _catalog_build():
    """``scripts/build_runs_catalog.py`` as a module (scripts/ is no package)."""
    import importlib.util

    path = DATA_DIR.parents[1] / "scripts" / "build_runs_catalog.py"
    spec = importlib.util.spec_from_file_location("build_runs_catalog", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_launch_scripts_setting_fills_only_what_the_table_left_empty():
    """dgxc-benchmarking v25.04's Nemotron-4 340B table prints VP as NA; its launch.sh at
    the same commit sets VP=12 and passes -vp. The catalog row carries the value with the
    file it came from, and runs interleaved; a published value is never overwritten, and a
    file of another commit is refused."""
    build = _catalog_build()
    supplements = [entry for entry in json.loads(build.SUPPLEMENTS.read_text())
                   if entry["field"] == "training.vpp"]  # fmt: skip
    rows = {row.id: row for row in load_runs()}
    filled = [rows[i] for entry in supplements for i in entry["ids"]]
    assert len(filled) == 6
    for row in filled:
        (supplement,) = [s for s in row.supplements if s.field == "training.vpp"]
        assert row.training.vpp == supplement.value == 12
        assert supplement.source_ref.commit == row.source_ref.commit
        assert supplement.source_ref.path == "nemotron/launch.sh"
        assert "launch.sh" in row.notes
    prediction = predict_row(filled[0])
    assert prediction.layout["schedule"] == "interleaved-1f1b" and prediction.layout["vpp"] == 12
    vpp_filled = {row.id for row in rows.values()
                  if any(s.field == "training.vpp" for s in row.supplements)}  # fmt: skip
    assert vpp_filled == {row.id for row in filled}
    raw = json.loads(filled[0].model_dump_json())
    raw["training"]["vpp"], raw["supplements"] = None, []
    assert build.supplemented(raw, supplements)["training"]["vpp"] == 12
    raw["training"]["vpp"] = 4
    with pytest.raises(SystemExit, match="published; not overwritten"):
        build.supplemented(raw, supplements)
    raw["training"]["vpp"], raw["source_ref"]["commit"] = None, "0" * 40
    with pytest.raises(SystemExit, match="another commit"):
        build.supplemented(raw, supplements)


def test_megatron_runs_before_flash_attention_time_it_unfused():
    """Megatron-LM gained FlashAttention in 2023 (NVIDIA/Megatron-LM#267); BigScience's
    Megatron-DeepSpeed never merged it: their 2022 rows (Korthikanti et al., MT-NLG, BLOOM)
    run unfused attention, every later and every other row a fused kernel."""
    from planner.runs.kernels import ran_flash_attention

    rows = load_runs()
    unfused = {row.id for row in rows if not ran_flash_attention(row)}
    assert {row.id for row in rows if row.id.startswith("korthikanti22-")} <= unfused
    assert {"bloom-176b-384xa100", "mtnlg-530b-280nodes"} <= unfused
    assert len(unfused) == 12
    later = [row for row in rows if row.id.startswith("nemotron4-340b-report")]
    assert later and all(ran_flash_attention(row) for row in later)  # Megatron-LM, 2024
    korthikanti = next(row for row in rows if row.id == "korthikanti22-22b-selective-sp")
    job = run_job(korthikanti, model_spec(korthikanti))
    assert job.flash_attention is False


def test_megatron_core_fp8_rows_keep_te_fp8_inputs_and_run_their_recipes_without_recompute():
    """Megatron-Core's FP8 layers are TransformerEngine's, which keep FP8 inputs for the
    weight gradient. Megatron-Bridge's GB200 recipe for Llama 3.1 405B on 256 GPUs sets no
    recomputation (``perf_recipes/llama/gb200/llama31.py``: TP4 PP16 VP8, no
    ``recompute_*``); with TE's caches the published layout fits without it, as it ran."""
    rows = {row.id: row for row in load_runs()}
    row = rows["mbridge-26.02-gb200-llama3-1-405b-pretrain-mxfp8-256g-main"]
    assert run_job(row, model_spec(row)).active_memory_measures.te_fp8_linear_inputs
    assert predict_row(row).layout["recompute"] == "none"
    fsdp = next(r for r in rows.values() if "llm-foundry" in (r.training.framework or "").lower())
    assert not run_job(fsdp, model_spec(fsdp)).memory_measures.any


def test_megatron_bridge_rows_keep_no_expert_outputs_and_older_nemo_rows_do():
    """Megatron-Bridge's first release in the catalog (NeMo 25.09 container) requires
    megatron-core 0.14 (its ``pyproject.toml`` at bf71eba), which applies the routing
    probabilities inside the experts; the NeMo 25.04 rows of dgxc-benchmarking 25.05 are
    taken to predate it."""
    rows = {row.id: row for row in load_runs()}
    bridge = rows["mbridge-26.04-gb200-gpt-oss-120b-pretrain-bf16-64g-main"]
    assert run_job(bridge, model_spec(bridge)).active_memory_measures.probs_in_expert_activation
    nemo = rows["dgxc-2505-gb200-deepseek-v3-bf16-128g"]
    assert not run_job(nemo, model_spec(nemo)).memory_measures.probs_in_expert_activation


def test_megatron_bridge_rows_search_the_selective_modules_their_recipes_choose_from():
    """Megatron-Bridge's recipes pick ``recompute_modules`` per model and system
    (``perf_recipes/deepseek/gb300/deepseek_v3.py`` at 26.04: ``mla_up_proj``); an
    unpublished recompute setting is searched over every set of the model's modules, so
    DeepSeek-V3 on GB300 at 26.04's layout, which does not fit without a module, does not
    fall back to full recomputation. Rows of older NeMo containers keep the whole-layer
    policies."""
    rows = {row.id: row for row in load_runs()}
    row = rows["mbridge-26.04-gb300-deepseekv3-pretrain-mxfp8-256g-main"]
    assert ran_recompute_modules(row)
    searched = search_space(row, model_spec(row)).recompute
    assert len(searched) == 2 + 63 and searched[0] == "none" and searched[-1] == "full"
    found = predict_row(row)
    assert found.layout["recompute"] not in ("none", "full", "selective")
    assert found.predicted_memory_gib <= load_accelerator("gb300").hbm_bytes / 2**30
    nemo = next(r for r in rows.values() if r.id.startswith("nemo2407-"))
    assert not ran_recompute_modules(nemo)
    assert search_space(nemo, model_spec(nemo)).recompute == ["none", "selective", "full"]


def test_leaving_one_model_out_shows_a_term_resting_on_one_model():
    """A term only one model's rows can move spans more when that model leaves than a term
    every model informs alike; the span is written into the profile and read back."""
    import tomllib

    from planner.runs.fit import term_ranges_one_model_out

    rng = np.random.default_rng(6)
    cols = _synthetic_columns(rng, 120)
    cols["fp8"] = np.zeros(120, bool)
    cols["model"] = np.array([f"m{i % 4}" for i in range(120)])
    cols["ideal_tokens"] = rng.uniform(500, 20000, 120)
    lone = cols["model"] == "m0"
    values = {**ideal_values(), "compute_efficiency_bf16": 0.8}
    measured = predicted_tokens(cols, values)
    cols["measured_tokens"] = np.where(lone, measured * 0.6, measured)  # m0 runs slower
    spans = term_ranges_one_model_out(cols, np.ones(120), ["compute_efficiency_bf16"])
    low, high = spans["compute_efficiency_bf16"]
    assert high - low > 0.1  # with m0 the fit drops; without it, it finds 0.8
    assert high == pytest.approx(0.8, rel=0.02)
    one_model = {**cols, "model": np.array(["m0"] * 120)}
    assert term_ranges_one_model_out(one_model, np.ones(120), ["compute_efficiency_bf16"]) == {}
    shipped = tomllib.loads((DATA_DIR / "profiles" / "h100-sxm.toml").read_text())
    profile = load_profile("h100-sxm")
    assert profile.fit.term_range_one_model_out == shipped["fit"].get(
        "term_range_one_model_out", {}
    )


def test_nvfp4_rows_are_predicted_with_fp4_gemms_and_their_own_sustained_term():
    """NVIDIA's NVFP4 runs (Megatron-Bridge, GB200 / GB300) are covered at FP4 GEMMs; the
    GB300 profile fits compute_efficiency_fp4 on them (two models' rows, one source: k-fold
    over configuration groups) and ships only the terms it fitted."""
    rows = [r for r in load_runs("train") if "nvfp4" in r.training.precision.lower()]
    assert len(rows) == 17
    row = next(r for r in rows if r.hardware.accelerator == "gb300")
    assert run_job(row, model_spec(row)).precision.recipe == "fp4-mixed"
    prediction = predict_row(row)
    assert prediction.covered and prediction.precision == "fp4"
    assert prediction.features["fp4"] == 1.0 and prediction.features["fp8"] == 0.0
    profile = load_profile("gb300")
    assert 0.2 <= profile.terms["compute_efficiency_fp4"].value < 1.0
    assert {r.id for r in rows if r.hardware.accelerator == "gb300"} <= set(
        profile.fit.training_ids
    )


def test_an_inferred_zero_stage_that_cannot_fit_is_sharded_further():
    """Llama 3 70B at TP1 PP1 on GB300 (Megatron-Bridge 26.02.01, NVFP4): the row's ZeRO-1
    is the source's inference, and 70B's FP32 main gradients alone (282 GB) exceed the
    GPU; the run ran, so the stages above are searched. A published stage is never moved."""
    from planner.runs.rows import sharded_further

    rows = {r.id: r for r in load_runs("train")}
    row = rows["mbridge-26.02.01-gb300-llama3-70b-pretrain-nvfp4-64g-main"]
    assert "training.zero_stage" in row.inferred_fields
    space = search_space(row, model_spec(row))
    assert space.zero_stage == [1]
    assert sharded_further(row, space).zero_stage == [2, 3]
    prediction = predict_row(row)
    assert prediction.covered and prediction.layout["zero_stage"] == 3
    published = next(r for r in rows.values() if r.training.zero_stage == "distributed optimizer")
    assert "training.zero_stage" not in published.inferred_fields
    space = search_space(published, model_spec(published))
    assert space.zero_stage == [1] and sharded_further(published, space) is None


def test_gpt_oss_rows_attend_over_their_sliding_window_on_every_other_layer():
    """The rows' architecture note: "alternating full / 128-token sliding-window attention"."""
    row = next(r for r in load_runs("train") if r.model.name == "gpt-oss-120b")
    model = model_spec(row)
    assert (model.sliding_window, model.num_sliding_window_layers) == (128, 18)
    llama = next(r for r in load_runs("train") if r.model.name.startswith("Llama 3"))
    assert model_spec(llama).num_sliding_window_layers == 0


def _synthetic_rows(measured_of, n: int = 120, seed: int = 3) -> list[RowPrediction]:
    """Covered rows of synthetic features, four source families, layouts that vary in pp and
    GPUs; measured tokens/s from ``measured_of(columns, ideal)``."""
    rng = np.random.default_rng(seed)
    cols = _synthetic_columns(rng, n)
    ideal = rng.uniform(500, 20000, n)
    measured = measured_of(cols, ideal)
    pp = rng.choice([1, 2, 4, 8, 16], n)
    return [
        RowPrediction(
            id=f"row{i}", source="s", source_family=f"family{i % 4}", group=f"g{i}",
            model=f"model{i % 6}", accelerator="h100-sxm", precision="bf16", stack="megatron",
            num_gpus=int(cols["num_gpus"][i]), seq_len=4096, covered=True,
            layout={"tp": 1, "cp": 1, "pp": int(pp[i]), "ep": 1},
            predicted_tokens_per_s_per_gpu=ideal[i], measured_tokens_per_s_per_gpu=measured[i],
            features={k: float(v[i]) for k, v in cols.items()},
        )
        for i in range(n)
    ]  # fmt: skip


def test_a_right_model_extrapolates_beyond_the_layouts_it_was_fitted_on():
    from planner.runs.extrapolation import extrapolation_errors

    def exact(cols, ideal):
        return predicted_tokens({**cols, "ideal_tokens": ideal}, KNOWN)

    found = {e.split: e for e in extrapolation_errors(_synthetic_rows(exact))}
    assert {"pp", "gpus"} <= set(found) and "tp" not in found  # every row has tp 1
    for split in ("pp", "gpus"):
        assert found[split].num_inside + found[split].num_beyond == 120
        assert found[split].extrapolated_mape < 0.01 and found[split].interpolated_mape < 0.01


def test_an_effect_only_beyond_the_range_shows_as_extrapolation_error():
    from planner.runs.extrapolation import extrapolation_errors

    rows = _synthetic_rows(lambda cols, ideal: predicted_tokens({**cols, "ideal_tokens": ideal},
                                                               KNOWN))  # fmt: skip
    slow = [r.layout["pp"] > 4 for r in rows]  # a loss the features do not carry, past pp 4
    rows = [r.model_copy(update={"measured_tokens_per_s_per_gpu":
                                 r.measured_tokens_per_s_per_gpu * (0.7 if s else 1.0)})
            for r, s in zip(rows, slow, strict=True)]  # fmt: skip
    found = {e.split: e for e in extrapolation_errors(rows)}
    assert found["pp"].extrapolated_median_error > 0.3  # the inside fit never saw the loss
