"""One flag set: every command's options, walked through typer's own command tree, have
help, list their choices, and mean the same (same help, same default) wherever they appear."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
import typer

import cli
from commands.common import COMMAND_ORDER, app
from commands.flags import ListOf, Parser


def _commands(command=None, path=()):
    """(path, command) for every leaf command of the app."""
    command = command or typer.main.get_command(app)
    for name, sub in getattr(command, "commands", {}).items():
        if getattr(sub, "commands", None):
            yield from _commands(sub, (*path, name))
        else:
            yield (*path, name), sub


def _options():
    """(command path, option, our parser or None, command) for every option but --help."""
    for path, command in _commands():
        for param in command.params:
            if param.param_type_name != "option" or "--help" in param.opts:
                continue
            info = getattr(param.type_descriptor, "parameter_info", None)
            parser = getattr(info, "parser", None)
            yield path, param, parser if isinstance(parser, Parser) else None, command


OPTIONS = list(_options())


def _id(entry) -> str:
    path, param, *_ = entry
    return f"{' '.join(path)} {param.opts[0]}"


def _help_record(path, param) -> str:
    import click

    context = click.Context(typer.main.get_command(app), info_name="llmplan")
    record = param.get_help_record(context)
    return " ".join(record) if record else ""


@pytest.mark.parametrize("entry", OPTIONS, ids=[_id(e) for e in OPTIONS])
def test_every_option_has_help_and_lists_its_choices(entry):
    path, param, parser, _ = entry
    assert (param.help or "").strip(), "no help"
    shown = _help_record(path, param)
    assert "range" not in shown.lower(), shown  # what it takes, in words (no <int range>)
    if parser is not None and parser.choices:
        missing = [choice for choice in parser.choices if str(choice) not in shown]
        assert not missing, f"choices {missing} not in the help: {shown}"


#: Flags whose default differs on purpose, with the reason (anything else must agree).
OWN_DEFAULTS = {
    # schedule draws a pipeline with times in any unit: small defaults that print whole.
    ("schedule", "--pp"), ("schedule", "--num-microbatches"), ("schedule", "--schedule"),
    # bytes-per-param is per parameter, without a layout: ZeRO off, one DP rank, no model.
    ("bytes-per-param", "--zero-stage"), ("bytes-per-param", "--dp"),
    ("bytes-per-param", "--precision"), ("bytes-per-param", "--model"),
    # topology fills the cluster with DP unless --dp is given.
    ("topology", "--dp"),
}  # fmt: skip
#: Flags that are a different quantity in that command (a filter, not the cluster's), or a
#: different default on purpose: runs check predicts published runs with each accelerator's
#: fitted profile, plan and estimate default to the ideal model.
OWN_MEANING = {("runs", "check", "--accelerator"), ("fit", "--accelerator"),
               ("runs", "check", "--profile")}  # fmt: skip


def _meaning(command, param, parser) -> str:
    """The kind of value a flag takes: a pin of the search (default: every value), a list
    (values to sweep, world sizes to calibrate) or one value."""
    from commands.flags import PINS

    groups = getattr(command.callback, "__wrapped_groups__", {})
    pins = {f"--{flag.name.replace('_', '-')}" for group in groups.values() if group is PINS
            for flag in group.flags}  # fmt: skip
    if param.opts[0] in pins:
        return "pin"
    return "list" if isinstance(parser, ListOf) else "value"


def test_a_flag_has_one_default_everywhere():
    seen = defaultdict(dict)
    for path, param, parser, command in OPTIONS:
        name = param.opts[0]
        if (*path, name) in OWN_MEANING or (path[-1], name) in OWN_DEFAULTS:
            continue
        if name in ("--json", "--html", "--png", "--csv", "--explain", "--out"):
            continue
        default = param.default
        default = getattr(default, "value", default)
        seen[(name, _meaning(command, param, parser))][" ".join(path)] = default
    differ = {key: found for key, found in seen.items() if len(set(map(str, found.values()))) > 1}
    assert not differ, differ


def test_commands_are_listed_in_the_order_a_user_needs_them(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.split("Commands:", 1)[1].splitlines() if line.strip()]
    assert listed[:3] == ["plan", "estimate", "memory"]
    assert listed == [name for name in COMMAND_ORDER if name in listed]


def test_accelerator_is_one_node_of_it_in_every_command(capsys):
    for argv in (
        ["memory", "--accelerator", "h200-sxm", "--model", "llama3-8b", "--tp", "8", "--pp", "1",
         "--dp", "1"],
        ["estimate", "--accelerator", "h200-sxm", "--model", "llama3-8b", "--tp", "8", "--pp",
         "1", "--dp", "1"],
        ["comm", "--accelerator", "h200-sxm", "--model", "llama3-8b", "--tp", "8", "--pp", "1",
         "--dp", "1"],
        ["topology", "--accelerator", "h200-sxm", "--tp", "8", "--pp", "1"],
    ):  # fmt: skip
        assert cli.main([*argv, "--json"]) == 0, argv
        data = json.loads(capsys.readouterr().out)
        assert data.get("accelerator", "h200-sxm") == "h200-sxm"
        assert data.get("num_gpus", 8) == 8, argv
    assert cli.main(["memory", "--cluster", "dgx-h100", "--accelerator", "h100-sxm"]) == 2
    assert "not both" in capsys.readouterr().err


def test_the_same_quantity_has_the_same_json_key(capsys):
    common = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "64"]
    assert cli.main(["plan", *common, "--tp", "8", "--pp", "1", "--top", "1", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    layout = ["--tp", "8", "--pp", "1", "--dp", "8"]
    assert cli.main(["estimate", *common, *layout, "--json"]) == 0
    estimate = json.loads(capsys.readouterr().out)
    assert cli.main(["memory", "--model", "llama3-8b", "--cluster", "dgx-h100", *layout,
                     "--json"]) == 0  # fmt: skip
    memory = json.loads(capsys.readouterr().out)
    assert plan["query"]["num_gpus"] == estimate["num_gpus"] == 64
    assert estimate["memory_per_gpu_bytes"] == pytest.approx(memory["memory_per_gpu_bytes"])
    assert "total_bytes" not in memory and "gpus" not in plan["query"]


def test_memory_and_estimate_default_to_the_same_layout(capsys):
    assert cli.main(["memory", "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)
    assert cli.main(["estimate", "--json"]) == 0
    estimate = json.loads(capsys.readouterr().out)
    assert memory["layout"] == estimate["layout"]
    assert memory["memory_per_gpu_bytes"] == pytest.approx(estimate["memory_per_gpu_bytes"])


def test_choice_flags_offer_exactly_the_values_the_specs_accept():
    """The CLI's choice enums are written out (front ends import planner.api only): each must
    list exactly what the model it feeds accepts."""
    from typing import get_args

    from commands import flags
    from planner.spec import job
    from planner.spec.layout import CP_ALGORITHMS, LAYER_SPLITS

    pairs = {
        flags.AttentionKernel: get_args(job.AttentionKernel),
        flags.CrossEntropy: get_args(job.CrossEntropyKernel),
        flags.UlyssesKvHeads: get_args(job.UlyssesKvHeads),
        flags.WeightPass: get_args(job.WeightPassMemory),
        flags.CpAlgorithm: tuple(CP_ALGORITHMS),
        flags.LayerSplitName: LAYER_SPLITS,
    }
    for choice, accepted in pairs.items():
        assert [member.value for member in choice] == list(accepted), choice.__name__
