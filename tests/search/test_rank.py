"""Ranking under the model's error (planner/rank.py, planner/runs/ratio_error.py): the
invariants, each preference rule on a constructed result set, the band's measurement,
the JSON fields and the --rank flag."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwspecs.catalog import load_profile, profile_names
from hwspecs.profile import LayoutRange
from planner.layout_range import describe, layout_range_of, outside_reasons
from planner.rank import (
    BY_TIME,
    FASTEST,
    OUTSIDE,
    PREFERENCES,
    RULES,
    RankSettings,
    equivalent_to_best,
    placing_rules,
    preference_keys,
    robust_order,
    schedule_complexity,
)
from planner.runs.ratio_error import ratio_error, weighted_quantile
from tests.cli_runner import run

GIB = 2**30
USABLE = 76 * GIB

# ----- invariants over random result sets --------------------------------------------------

times = st.lists(
    st.floats(1.0, 2.0, allow_nan=False, allow_infinity=False), min_size=1, max_size=40
)


def random_keys(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 3, size=(n, len(RULES))).astype(float)


@settings(max_examples=200, deadline=None)
@given(times, st.floats(0.0, 0.5), st.integers(0, 2**16))
def test_a_preference_never_overrides_a_difference_larger_than_the_band(time_s, band, seed):
    time_s = np.array(time_s)
    time_rank = np.argsort(np.argsort(time_s, kind="stable"))
    order = robust_order(time_s, random_keys(len(time_s), seed), band, time_rank)
    ranked = time_s[order]
    for above in range(len(ranked)):  # every row ranked above a faster one is within the band
        assert np.all(ranked[above] <= ranked[above:] * (1 + band) * (1 + 1e-12))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1.0, 2.0), min_size=1, max_size=40, unique=True), st.integers(0, 99))
def test_with_band_zero_the_robust_rank_is_the_time_rank(time_s, seed):
    time_s = np.array(time_s)
    time_rank = np.argsort(np.argsort(time_s, kind="stable"))
    order = robust_order(time_s, random_keys(len(time_s), seed), 0.0, time_rank)
    assert np.array_equal(order, np.argsort(time_s, kind="stable"))


@settings(max_examples=200, deadline=None)
@given(times, st.floats(0.0, 0.5), st.floats(0.0, 0.5))
def test_equivalence_is_monotone_in_the_band(time_s, first, second):
    small, large = sorted((first, second))
    assert np.all(equivalent_to_best(time_s, small) <= equivalent_to_best(time_s, large))


@settings(max_examples=100, deadline=None)
@given(times, st.floats(0.0, 0.5), st.integers(0, 2**16))
def test_equivalent_rows_come_first_and_the_rest_in_time_order(time_s, band, seed):
    time_s = np.array(time_s)
    time_rank = np.argsort(np.argsort(time_s, kind="stable"))
    order = robust_order(time_s, random_keys(len(time_s), seed), band, time_rank)
    inside = equivalent_to_best(time_s, band)[order]
    assert not np.any(~inside[:-1] & inside[1:])  # no tie below a row outside the band
    assert np.all(np.diff(time_s[order][~inside]) >= 0)


# ----- each rule on a constructed result set ---------------------------------------------


def rows(*overrides, **shared) -> dict:
    """Result rows (a columns dict) of a dense model: TP8 PP16 DP64 1F1B unless overridden."""
    base = {"tp": 8, "cp": 1, "pp": 16, "dp": 64, "ep": 1, "etp": 8, "vpp": 1,
            "schedule": "1f1b", "zero_stage": 1, "recompute": "none",
            "sequence_parallel": True, "memory_per_gpu_bytes": 60 * GIB, **shared}  # fmt: skip
    table = [{**base, **row} for row in overrides]
    return {key: np.array([row[key] for row in table]) for key in base}


def ranked(columns: dict, time_s: list[float], band: float = 0.1):
    """(order, the rule placing each ranked row) for ``columns`` at ``time_s``."""
    time_s = np.array(time_s)
    keys = preference_keys(columns, 8, USABLE)
    order = robust_order(time_s, keys, band, np.argsort(np.argsort(time_s, kind="stable")))
    codes = placing_rules(keys[order], equivalent_to_best(time_s[order], band),
                          int(np.argmin(time_s[order])))  # fmt: skip
    return order.tolist(), [PREFERENCES[c] for c in codes]


H100_RUNS = LayoutRange(tp=8, cp=32, pp=16, ep=64, cp_tokens_per_rank=4096, num_gpus=6144,
                        num_runs=258)  # fmt: skip


def test_rule_0_prefers_a_tie_inside_the_measured_layouts():
    # 16,384 GPUs at 8K: TP1 CP16 PP64 (3 axes) against TP8 CP2 PP8 (4 axes), equal by time.
    columns = rows({"tp": 1, "cp": 16, "pp": 64, "dp": 16}, {"tp": 8, "cp": 2, "pp": 8, "dp": 128})
    settings = RankSettings(layout_range=H100_RUNS, seq_len=8192)
    keys = preference_keys(columns, 8, USABLE, settings=settings)
    assert keys[:, 0].tolist() == [2, 0]  # pp 64 > 16; 512 tokens per CP rank < 4,096
    time_s = np.array([1.00, 1.05])
    order = robust_order(time_s, keys, 0.1, np.argsort(time_s))
    assert order.tolist() == [1, 0]
    assert placing_rules(keys[order], np.array([True, True]), 1)[0] == 0
    # Without a range (a profile fitted before it was recorded) rule 1 decides: 3 axes first.
    assert (
        robust_order(time_s, preference_keys(columns, 8, USABLE), 0.1, np.argsort(time_s))[0] == 0
    )
    # Never across the band: 30% faster outside the runs stays first.
    assert robust_order(np.array([1.0, 1.3]), keys, 0.1, np.arange(2))[0] == 0


def test_the_measured_range_is_the_runs_largest_degrees_and_fewest_tokens_per_cp_rank():
    layouts = [{"tp": 8, "cp": 2, "pp": 8, "ep": 1}, {"tp": 4, "cp": 4, "pp": 16, "ep": 8},
               {"tp": 1, "cp": 1, "pp": 1, "ep": 64}, None]  # fmt: skip
    found = layout_range_of(layouts, [8192, 131072, 4096, 2048], [512, 64, 128, 9999])
    assert (found.tp, found.cp, found.pp, found.ep) == (8, 4, 16, 64)
    assert found.cp_tokens_per_rank == 4096 and found.num_gpus == 512 and found.num_runs == 3
    assert layout_range_of([None], [8192], [8]) is None
    reasons = outside_reasons({"tp": 1, "cp": 16, "pp": 64, "ep": 1}, H100_RUNS, 8192)
    assert reasons == ["pp 64 > 16", "cp 16: 512 tokens per rank < 4,096"]
    assert outside_reasons({"tp": 8, "cp": 16, "pp": 16, "ep": 1}, H100_RUNS, 131072) == []
    assert outside_reasons({"tp": 8, "cp": 16, "pp": 16, "ep": 1}, None, 8192) == []
    assert outside_reasons({"tp": 8, "cp": 1, "pp": 16, "ep": 1}, H100_RUNS, 8192, 16384) == [
        "16,384 GPUs > 6,144"
    ]  # fmt: skip


def test_the_measured_range_records_the_largest_attention_share_and_names_a_larger_one():
    layouts = [{"tp": 8, "cp": 1, "pp": 8, "ep": 1}, {"tp": 4, "cp": 2, "pp": 1, "ep": 1}, None]
    found = layout_range_of(layouts, [4096, 16384, 131072], [64, 8, 8], [0.12, 0.33, 0.9])
    assert found.attention_share == 0.33  # the third run has no layout: left out
    assert layout_range_of(layouts, [4096, 16384, 131072], [64, 8, 8]).attention_share is None
    runs = found.model_copy(update={"attention_share": 0.21})
    layout = {"tp": 8, "cp": 1, "pp": 8, "ep": 1}
    assert outside_reasons(layout, runs, 4096, 64, 0.41) == ["attention 41% of FLOPs > 21%"]
    assert outside_reasons(layout, runs, 4096, 64, 0.2149) == []  # rounds to the runs' share
    assert outside_reasons(layout, runs, 4096, 64, None) == []  # unknown: nothing said
    assert outside_reasons(layout, H100_RUNS, 4096, 64, 0.99) == []  # a range without it
    assert describe(runs).endswith("≤ 64 GPUs, attention ≤ 21% of FLOPs")


def test_every_shipped_profile_records_the_range_of_its_training_rows():
    from hwspecs.catalog import load_runs
    from planner.cost.profile import flop_shares
    from planner.runs.rows import model_spec

    runs = {row.id: row for row in load_runs("train")}
    for name in profile_names():
        found = load_profile(name).fit
        assert found.layout_range is not None, name
        trained = [runs[i].training for i in found.training_ids]
        published = [t.pp for t in trained if t.pp is not None]
        assert max(published, default=1) <= found.layout_range.pp, name
        assert found.layout_range.num_runs == len(found.training_ids), name
        # The largest attention FLOP share, from each row's own model and sequence.
        shares = [flop_shares(model_spec(runs[i]), runs[i].training.seq_len)[0]
                  for i in found.training_ids]  # fmt: skip
        assert found.layout_range.attention_share == pytest.approx(max(shares), abs=1e-4), name


def test_rule_1_fewer_axes_above_one():
    columns = rows({"tp": 2, "cp": 8, "pp": 32, "dp": 32}, {"tp": 8, "pp": 16, "dp": 128})
    order, why = ranked(columns, [1.00, 1.05])
    assert order == [1, 0] and why[0] == RULES[1]


def test_rule_2_tp_within_the_scale_up_domain_before_cp_or_pp():
    columns = rows({"tp": 2, "pp": 64, "dp": 128}, {"tp": 8, "pp": 16, "dp": 128})
    order, why = ranked(columns, [1.00, 1.05])
    assert order == [1, 0] and why[0] == RULES[2]


def test_rule_2_reads_only_rows_with_cp_or_pp():
    columns = rows({"tp": 1, "pp": 1, "dp": 16384}, {"tp": 8, "pp": 1, "dp": 2048})
    order, why = ranked(columns, [1.00, 1.05])
    assert order == [0, 1] and why[0] == FASTEST  # no CP or PP: TP is not owed first


def test_rule_3_pp_only_as_deep_as_memory_needs():
    # The same tp, cp and memory measures fit at pp 8: pp 16 is deeper than memory needs.
    columns = rows({"pp": 16, "dp": 128}, {"pp": 8, "dp": 256}, {"pp": 32, "dp": 64})
    order, why = ranked(columns, [1.00, 1.05, 0.99])
    assert order[0] == 1 and why[0] == RULES[3]


def test_rule_4_cp_only_when_the_sequence_needs_it():
    # cp 2 fits with these degrees: cp 8 splits the sequence further than memory needs.
    columns = rows({"cp": 8, "dp": 16}, {"cp": 2, "dp": 64})
    order, why = ranked(columns, [1.00, 1.05])
    assert order == [1, 0] and why[0] == RULES[4]


def test_cp_is_an_axis_first():
    columns = rows({"cp": 2, "dp": 64}, {"cp": 1, "dp": 128})
    order, why = ranked(columns, [1.00, 1.05])
    assert order == [1, 0] and why[0] == RULES[1]


def test_rule_4_keeps_the_cp_memory_needs():
    # Nothing fits below cp 2 with these degrees: cp 2 is what the sequence needs.
    columns = rows({"cp": 2, "dp": 64}, {"cp": 4, "dp": 32})
    order, why = ranked(columns, [1.05, 1.00])
    assert order == [0, 1] and why[0] == RULES[4]


def test_rule_5_more_memory_headroom():
    columns = rows({"memory_per_gpu_bytes": 70 * GIB, "zero_stage": 1},
                   {"memory_per_gpu_bytes": 50 * GIB, "zero_stage": 1})  # fmt: skip
    order, why = ranked(columns, [1.00, 1.05])
    assert order == [1, 0] and why[0] == RULES[5]


def test_rule_5_reads_whole_gib_then_rule_6_the_simpler_schedule():
    columns = rows({"schedule": "zbv", "vpp": 2, "memory_per_gpu_bytes": 60.2 * GIB},
                   {"schedule": "1f1b", "memory_per_gpu_bytes": 60.4 * GIB})  # fmt: skip
    order, why = ranked(columns, [1.00, 1.05])
    assert order == [1, 0] and why[0] == RULES[6]


def test_schedule_complexity_counts_rules_chunks_split_backward_and_copies():
    assert schedule_complexity("1f1b", 1) == 0 and schedule_complexity("gpipe", 1) == 0
    assert schedule_complexity("zb-h1", 1) == 1  # B and W split
    assert schedule_complexity("interleaved-1f1b", 4) == 2  # m a multiple of pp, chunks
    assert schedule_complexity("dualpipe", 1) == 3  # micro-batch rule, split, two copies


def test_rows_outside_the_band_are_never_placed_by_a_rule():
    columns = rows({"tp": 2, "cp": 8, "pp": 32, "dp": 32}, {"tp": 8, "pp": 16, "dp": 128})
    order, why = ranked(columns, [1.00, 1.30], band=0.1)
    assert order == [0, 1] and why == [FASTEST, OUTSIDE]


def test_rows_every_rule_ties_are_ordered_by_time():
    columns = rows({}, {})
    order, why = ranked(columns, [1.05, 1.00])
    assert order == [1, 0] and why == [FASTEST, BY_TIME]


def test_the_keys_of_some_rows_are_those_rows_keys_of_all():
    # Rules 3 and 4 read the least pp (cp) over every row sharing the others, asked or not.
    columns = rows({"pp": 8, "dp": 128}, {"pp": 16, "dp": 64}, {"cp": 2, "pp": 8, "dp": 64},
                   {"tp": 4, "pp": 32, "dp": 64, "schedule": "zbv", "vpp": 2},
                   {"cp": 4, "pp": 4, "dp": 64, "memory_per_gpu_bytes": 70 * GIB})  # fmt: skip
    every = preference_keys(columns, 8, USABLE)
    assert every[1, 3] == 1.0 and every[3, 3] == 0.0  # pp 16 against pp 8 on the same rest
    for chosen in ([1], [4, 0], [3, 1, 2]):
        some = preference_keys(columns.__getitem__, 8, USABLE, np.array(chosen))
        np.testing.assert_array_equal(some, every[chosen])


# ----- the band: the ratio error of same-job pairs ------------------------------------------


def test_ratio_error_reads_pairs_of_one_source_and_job_in_different_groups():
    measured = np.ones(5)
    predicted = np.array([1.0, 1.1, 1.0, 2.0, 1.0])  # row 3: another source; row 4: same group
    families = np.array(["a", "a", "a", "b", "a"])
    jobs = np.array(["j", "j", "k", "j", "j"])
    groups = np.array(["g0", "g1", "g2", "g3", "g0"])
    found = ratio_error(predicted, measured, np.ones(5), families, jobs, groups)
    # pairs (0, 1) and (1, 4): both |log 1.1 − log 1| ; (0, 4) share a group, 2 another job
    assert found.num_pairs == 2 and found.num_sources == 1
    assert found.band == pytest.approx(0.1)


def test_ratio_error_cancels_an_error_both_layouts_share():
    measured = np.array([100.0, 200.0, 300.0])
    found = ratio_error(1.3 * measured, measured, np.ones(3), np.array(["a"] * 3),
                        np.array(["j"] * 3), np.array(["x", "y", "z"]))  # fmt: skip
    assert found.band == pytest.approx(0.0, abs=1e-12)


def test_weighted_quantile_is_the_smallest_value_reaching_the_share():
    assert weighted_quantile(np.array([3.0, 1.0, 2.0]), np.array([1.0, 1.0, 1.0]), 0.5) == 2.0
    assert weighted_quantile(np.array([1.0, 2.0]), np.array([9.0, 1.0]), 0.8) == 1.0


def test_every_shipped_profile_carries_its_measured_ratio_error():
    """Every profile whose runs hold two layouts of one job (one source, one model, task,
    precision and sequence length, two configuration groups) stores their ratio error; one
    whose runs hold none stores none, and its plans rank by time and say so."""
    import numpy as np

    from hwspecs.catalog import load_runs
    from planner.runs.check import job_key, source_family
    from planner.runs.ratio_error import same_job_pairs

    runs = {row.id: row for row in load_runs("train")}
    for name in profile_names():
        fit = load_profile(name).fit
        rows = [runs[i] for i in fit.training_ids]
        pairs, _ = same_job_pairs(
            np.array([source_family(r) for r in rows]),
            np.array([job_key(r) for r in rows]),
            np.array([r.group_key for r in rows]),
        )
        found = fit.ratio_error
        if not len(pairs):
            assert found is None, name
            continue
        assert found is not None and found.num_pairs == len(pairs), name
        assert found.band >= 0 and found.ideal_band is not None, name


# ----- the plan's JSON and the --rank flag ------------------------------------------------

SMALL = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "64", "--top", "5"]


def test_plan_json_carries_the_rank_fields(capsys):
    code, out, _ = run(capsys, *SMALL, "--profile", "shipped", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["query"]["rank"] == "robust" and data["query"]["ratio_error_band"] > 0
    for entry in data["results"]:
        low, high = entry["step_time_interval_s"]
        assert low < entry["step_time_s"] < high
        assert entry["preference"] in PREFERENCES
        assert isinstance(entry["equivalent_to_best"], bool)
        assert entry["rank_by_time"] >= 1
    assert data["results"][0]["equivalent_to_best"]
    assert any("within the model's" in line for line in data["explanation"])


def test_plan_and_estimate_name_the_axes_beyond_the_measured_layouts(capsys):
    # Llama 3 8B on 64 H100s: the shipped profile's runs reach pp 16, so pp 32 is beyond.
    code, out, _ = run(capsys, *SMALL, "--pp", "32", "--profile", "shipped", "--json")
    assert code == 0
    data = json.loads(out)
    measured = load_profile("h100-sxm").fit.layout_range
    assert data["query"]["measured_layout_range"] == measured.model_dump()
    assert all(e["outside_measured_layouts"] == ["pp 32 > 16"] for e in data["results"])
    assert any("lie inside them" in line for line in data["explanation"])
    assert any("the winner lies outside them (pp 32 > 16)" in line for line in data["explanation"])
    layout = ["--tp", "1", "--cp", "2", "--pp", "32", "--dp", "1", "--seq-len", "4096"]
    code, out, _ = run(capsys, "estimate", "--model", "llama3-8b", "--cluster", "dgx-h100",
                       *layout, "--global-batch-size", "64", "--json")  # fmt: skip
    assert code == 0
    assert json.loads(out)["outside_measured_layouts"] == [
        "pp 32 > 16", "cp 2: 2,048 tokens per rank < 4,096"
    ]  # fmt: skip
    code, out, _ = run(capsys, "estimate", "--model", "llama3-8b", "--cluster", "dgx-h100",
                       *layout, "--global-batch-size", "64")  # fmt: skip
    assert code == 0 and "beyond the profile's runs: pp 32 > 16" in " ".join(out.split())


def test_a_job_with_more_attention_than_the_profiles_runs_says_so(capsys):
    # GB200's runs reach 4-8K tokens (attention at most ~21% of the FLOPs); Llama 3 8B at
    # 64K tokens spends most of its FLOPs in attention: the attention term is extrapolated.
    measured = load_profile("gb200").fit.layout_range
    assert measured.attention_share < 0.3
    job = ["--model", "llama3-8b", "--cluster", "gb200-nvl72", "--tp", "1", "--pp", "1",
           "--dp", "8", "--global-batch-size", "64"]  # fmt: skip
    code, out, _ = run(capsys, "estimate", *job, "--cp", "8", "--seq-len", "65536", "--json")
    assert code == 0
    reasons = json.loads(out)["outside_measured_layouts"]
    assert reasons[-1].startswith("attention ") and reasons[-1].endswith(
        f"of FLOPs > {measured.attention_share:.0%}"
    )
    code, out, _ = run(capsys, "estimate", *job, "--cp", "1", "--seq-len", "4096", "--json")
    assert code == 0
    assert not any(r.startswith("attention") for r in json.loads(out)["outside_measured_layouts"])
    plan = ["plan", "--model", "llama3-8b", "--cluster", "gb200-nvl72", "--gpus", "64",
            "--seq-len", "65536", "--top", "3", "--explain", "--json"]  # fmt: skip
    code, out, _ = run(capsys, *plan)
    assert code == 0
    data = json.loads(out)
    assert any("more than in any run" in line for line in data["explanation"])


def test_rank_time_is_the_time_ranking(capsys):
    code, out, _ = run(capsys, *SMALL, "--profile", "none", "--rank", "time", "--json")
    assert code == 0
    data = json.loads(out)
    assert [e["rank_by_time"] for e in data["results"]] == [e["rank"] for e in data["results"]]
    assert {e["preference"] for e in data["results"]} == {"time rank"}


def test_profile_none_still_ranks_under_a_measured_band(capsys):
    code, out, _ = run(capsys, *SMALL, "--profile", "none", "--json")
    assert code == 0
    query = json.loads(out)["query"]
    ideal = load_profile("h100-sxm").fit.ratio_error.ideal_band
    assert query["ratio_error_band"] == pytest.approx(ideal)
    assert "ideal model" in query["ratio_error_source"]


def test_csv_carries_both_ranks(capsys, tmp_path):
    path = tmp_path / "plan.csv"
    code, _, _ = run(capsys, *SMALL, "--csv", str(path))
    assert code == 0
    header = path.read_text().splitlines()[0].split(",")
    assert {"rank", "rank_by_time", "equivalent_to_best", "preference"} <= set(header)


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_an_unknown_rank_is_one_line_exit_2(capsys, as_json):
    code, out, err = run(capsys, "plan", "--rank", "fastest", *(["--json"] if as_json else []))
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert "--rank" in err and "robust" in err and "time" in err
    if as_json:
        assert json.loads(out)["error"]["field"] == "--rank"
