"""`plan --emit`: the settings name only flags and fields the trainers have (names extracted
from their source at a recorded commit, tests/data/trainer_flags.json), describe the whole
layout (layers per stage included), and never a schedule the trainer lacks."""

import json
import re
from pathlib import Path

import pytest

from tests.cli_runner import run

TRAINER_NAMES = json.loads((Path(__file__).parents[1] / "data" / "trainer_flags.json").read_text())
MEGATRON_FLAGS = set(TRAINER_NAMES["megatron"]["flags"])
TORCHTITAN_FIELDS = set(TRAINER_NAMES["torchtitan"]["fields"])
LLAMA_PINS = ("--tp", "2", "--cp", "16", "--pp", "16", "--micro-batch-size", "1")


def megatron_args(text: str) -> dict[str, str | None]:
    tokens = re.findall(r'"[^"]*"|\S+', text.replace("\\\n", " "))
    args: dict[str, str | None] = {}
    for token in tokens:
        if token.startswith("--"):
            args[token] = None
            last = token
        else:
            args[last] = token.strip('"')
    return args


def expand_layout(layout: str) -> list[str]:
    """Megatron-LM's --pipeline-model-parallel-layout grammar (its help text): stages split by
    '|', '(X)*n' and 'x*n' repeat, commas are cosmetic."""
    text = layout.replace(",", "")
    while "(" in text:
        text = re.sub(r"\(([^()]*)\)\*(\d+)", lambda m: m[1] * int(m[2]), text)
    text = re.sub(r"([EtLm])\*(\d+)", lambda m: m[1] * int(m[2]), text)
    return text.split("|")


def test_megatron_interleaved_names_every_layer_and_only_real_flags(capsys):
    code, out, err = run(
        capsys, "plan", *LLAMA_PINS, "--schedule", "interleaved-1f1b", "--vpp", "8",
        "--emit", "megatron",
    )  # fmt: skip
    assert code == 0, err
    args = megatron_args(out)  # stdout is the settings alone
    assert set(args) <= MEGATRON_FLAGS, set(args) - MEGATRON_FLAGS
    assert args["--num-layers"] == "126" and args["--pipeline-model-parallel-size"] == "16"
    stages = expand_layout(args["--pipeline-model-parallel-layout"])
    assert len(stages) == 16 * 8
    assert sum(stage.count("t") for stage in stages) == 126
    assert stages[0].startswith("E") and stages[-1].endswith("L")
    assert "#" in err or "tp/cp/pp/dp" in err  # the table went to stderr


def test_megatron_uneven_one_chunk_split_uses_first_and_last_stage_flags(capsys):
    code, out, err = run(capsys, "plan", *LLAMA_PINS, "--schedule", "1f1b", "--emit", "megatron")
    assert code == 0, err
    args = megatron_args(out)
    assert set(args) <= MEGATRON_FLAGS
    # Llama 3 405B: 126 layers on 16 stages, one fewer on the first and last (7, 8, …, 8, 7).
    assert args["--decoder-first-pipeline-num-layers"] == "7"
    assert args["--decoder-last-pipeline-num-layers"] == "7"


def test_megatron_mtp_model_names_its_module_and_unloads_the_last_stage(capsys):
    """DeepSeek-V3 (one MTP module, §2.2): --mtp-num-layers and an 'm' on the last stage,
    which holds the head and the module and so fewer layers than the middle stages (the
    search's work-balanced split)."""
    code, out, err = run(
        capsys, "plan", "--model", "deepseek-v3", "--cluster", "dgx-h800", "--gpus", "2048",
        "--seq-len", "4096", "--global-batch-size", "15360", "--tp", "1", "--pp", "16",
        "--ep", "64", "--schedule", "1f1b", "--emit", "megatron",
    )  # fmt: skip
    assert code == 0, err
    args = megatron_args(out)
    assert set(args) <= MEGATRON_FLAGS, set(args) - MEGATRON_FLAGS
    assert args["--mtp-num-layers"] == "1"
    stages = expand_layout(args["--pipeline-model-parallel-layout"])
    assert len(stages) == 16 and sum(stage.count("t") for stage in stages) == 61
    assert stages[-1].endswith("mL") and stages[-1].count("m") == 1
    assert stages[-1].count("t") < min(stage.count("t") for stage in stages[1:-1])


def test_emit_keeps_the_search_to_the_trainers_schedules(capsys):
    code, out, err = run(capsys, "plan", *LLAMA_PINS, "--emit", "megatron", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert {entry["layout"]["schedule"] for entry in result["results"]} <= {
        "1f1b",
        "interleaved-1f1b",
    }
    assert result["emitted"]["trainer"] == "megatron"
    assert "--num-layers 126" in result["emitted"]["text"]


def test_emit_with_only_unsupported_schedules_pinned_is_a_clear_error(capsys):
    code, _, err = run(capsys, "plan", *LLAMA_PINS, "--schedule", "zbv", "--emit", "megatron")
    assert code == 2
    assert "Megatron-LM runs none of the pinned schedules (zbv)" in err and err.count("\n") == 1


def test_torchtitan_overrides_are_fields_of_its_config(capsys):
    code, out, err = run(capsys, "plan", *LLAMA_PINS, "--emit", "torchtitan")
    assert code == 0, err
    flags = re.findall(r"--(\S+)", out)
    fields = {re.sub(r"\.no-", ".", flag.split(" ")[0]) for flag in flags}
    assert fields <= TORCHTITAN_FIELDS, fields - TORCHTITAN_FIELDS
    schedule = re.search(r"--parallelism.pipeline_parallel_schedule (\S+)", out)[1]
    assert schedule in {"GPipe", "1F1B", "Interleaved1F1B", "ZBVZeroBubble", "DualPipeV"}
    assert "--parallelism.pipeline_parallel_degree 16" in out


def test_moe_torchtitan_plan_keeps_experts_untensor_parallel(capsys):
    code, out, err = run(
        capsys, "plan", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64",
        "--seq-len", "4096", "--global-batch-size", "256", "--tp", "2", "--pp", "1",
        "--emit", "torchtitan", "--json",
    )  # fmt: skip
    assert code == 0, err
    result = json.loads(out)
    assert {entry["layout"]["etp"] for entry in result["results"]} == {1}
    assert "--parallelism.expert_parallel_degree" in result["emitted"]["text"]


def test_emit_out_writes_the_file_and_keeps_the_table_on_stdout(capsys, tmp_path):
    path = tmp_path / "megatron.args"
    code, out, err = run(capsys, "plan", *LLAMA_PINS, "--emit", "megatron", "--emit-out", str(path))
    assert code == 0, err
    assert path.read_text().startswith("--num-layers 126")
    assert "step s" in out and f"wrote {path}" in " ".join(out.split())


@pytest.mark.parametrize("trainer", ["megatron", "torchtitan"])
def test_expert_tp_is_named(trainer):
    from planner import api
    from planner.spec.layout import Layout

    entry = {"layout": Layout(tp=2, dp=8, ep=8, etp=1, num_microbatches=8).model_dump()}
    job = api.build_job("mixtral-8x7b", 4096, global_batch_size=64)
    text = api.emit_settings(entry, trainer, job).text
    expected = {
        "megatron": "--expert-tensor-parallel-size 1",
        "torchtitan": "--parallelism.expert_parallel_degree 8",
    }
    assert expected[trainer] in text


def test_megatron_settings_name_the_nvfp4_recipe(capsys):
    """An NVFP4 plan's Megatron-LM settings turn on TransformerEngine's NVFP4 recipe with the
    flags Megatron-LM has (--fp4-format e2m1, --fp4-recipe nvfp4)."""
    pins = ("--model", "llama3-70b", "--cluster", "gb200-nvl72", "--gpus", "64",
            "--tp", "2", "--pp", "4", "--global-batch-size", "64")  # fmt: skip
    code, out, err = run(capsys, "plan", *pins, "--precision", "fp4-mixed", "--emit", "megatron")
    assert code == 0, err
    args = megatron_args(out)
    assert set(args) <= MEGATRON_FLAGS
    assert args["--fp4-format"] == "e2m1" and args["--fp4-recipe"] == "nvfp4"
    assert "--bf16" in args and "--fp8-format" not in args


def test_torchtitan_settings_say_the_low_precision_gemms_are_not_set(capsys):
    """torchtitan's fields carry no GEMM dtype: an FP8 or NVFP4 plan says so in its notes."""
    from planner import api
    from planner.spec.layout import Layout

    entry = {"layout": Layout(tp=1, dp=8, num_microbatches=1).model_dump()}
    for precision, named in (("fp8-mixed", "FP8"), ("fp4-mixed", "FP4"), ("bf16-mixed", None)):
        job = api.build_job("llama3-8b", 4096, global_batch_size=64, precision=precision)
        notes = " ".join(api.emit_settings(entry, "torchtitan", job).notes)
        assert (f"timed {named} GEMMs" in notes) if named else ("GEMMs" not in notes)


def test_megatron_settings_carry_the_tp_overlap_the_plan_assumed(capsys):
    pins = ("--tp", "8", "--cp", "1", "--pp", "16", "--micro-batch-size", "1",
            "--sequence-parallel", "--schedule", "1f1b")  # fmt: skip
    code, out, err = run(capsys, "plan", *pins, "--stack", "megatron", "--emit", "megatron")
    assert code == 0, err
    args = megatron_args(out)
    assert set(args) <= MEGATRON_FLAGS
    assert "--tp-comm-overlap" in args and "--sequence-parallel" in args
    code, out, err = run(capsys, "plan", *pins, "--no-tp-comm-overlap", "--emit", "megatron")
    assert code == 0, err
    assert "--tp-comm-overlap" not in megatron_args(out)


def test_megatron_says_it_has_no_dots_recomputation(capsys):
    pins = ("--tp", "8", "--cp", "1", "--pp", "16", "--micro-batch-size", "1",
            "--schedule", "1f1b", "--recompute", "dots")  # fmt: skip
    code, out, err = run(capsys, "plan", *pins, "--emit", "megatron")
    assert code == 0, err
    assert "--recompute-granularity" not in megatron_args(out)
    text = " ".join(err.split())  # notes go to stderr, wrapped at the console's width
    assert "note (megatron): recompute dots" in text and "has no Megatron-LM setting" in text


def test_megatron_names_the_selective_modules_it_reruns(capsys):
    """Megatron-Core's ``--recompute-modules`` takes the module labels after
    ``--recompute-granularity selective`` (Megatron-Bridge docs/training/
    activation-recomputation.md, "Recomputation Modules")."""
    pins = ("--tp", "8", "--cp", "1", "--pp", "16", "--micro-batch-size", "1",
            "--schedule", "1f1b", "--recompute", "mlp+layernorm")  # fmt: skip
    code, out, err = run(capsys, "plan", *pins, "--emit", "megatron")
    assert code == 0, err
    assert set(megatron_args(out)) <= MEGATRON_FLAGS
    text = " ".join(out.replace("\\\n", " ").split())
    assert "--recompute-granularity selective --recompute-modules layernorm mlp" in text


def test_megatron_names_the_ep_overlap_only_where_the_layout_was_timed_with_it(capsys):
    """--ep-comm-overlap is Megatron-Core's combined 1F1B (--overlap-moe-expert-parallel-comm,
    a real flag at the recorded commit): emitted for interleaved PP, not for plain 1F1B with
    PP, which Megatron-Core refuses it (and the model times without it)."""
    dsv3 = ("--model", "deepseek-v3", "--cluster", "dgx-h800", "--gpus", "2048", "--seq-len",
            "4096", "--global-batch-size", "16384", "--tp", "1", "--pp", "16", "--ep", "64",
            "--recompute", "none", "--ep-comm-overlap", "--emit", "megatron")  # fmt: skip
    code, out, err = run(capsys, "plan", *dsv3, "--schedule", "interleaved-1f1b", "--vpp", "2")
    assert code == 0, err
    args = megatron_args(out)
    assert "--overlap-moe-expert-parallel-comm" in args and set(args) <= MEGATRON_FLAGS
    code, out, err = run(capsys, "plan", *dsv3, "--schedule", "1f1b")
    assert code == 0, err
    assert "--overlap-moe-expert-parallel-comm" not in megatron_args(out)


def test_megatron_names_cuda_graphs_only_where_the_plan_assumed_them(capsys):
    """--cuda-graphs is Megatron-Core's one graph per iteration: ``--cuda-graph-impl
    full_iteration`` (TransformerConfig.cuda_graph_impl's Literal at the recorded commit:
    none, local, transformer_engine, full_iteration)."""
    pins = ("--tp", "8", "--cp", "1", "--pp", "16", "--micro-batch-size", "1",
            "--schedule", "1f1b", "--emit", "megatron")  # fmt: skip
    code, out, err = run(capsys, "plan", *pins, "--cuda-graphs")
    assert code == 0, err
    args = megatron_args(out)
    assert args.get("--cuda-graph-impl") == "full_iteration" and set(args) <= MEGATRON_FLAGS
    code, out, err = run(capsys, "plan", *pins)
    assert code == 0, err
    assert "--cuda-graph-impl" not in megatron_args(out)
