"""Flags declared once: the job, the cluster, one layout and the search pins.

A command names the groups it takes and receives each as one :class:`Values` argument::

    @app.command()
    @uses(job=JOB, cluster=CLUSTER, layout=LAYOUT.defaults(tp=8, pp=16, dp=128))
    def estimate(job: Values, cluster: Values, layout: Values, as_json: JsonFlag = False): ...

:func:`uses` puts the groups' options into the command's signature (typer reads it), so a
flag added to a group here appears, parsed and checked the same way, in every command
that takes the group. Every value flag parses with one of the parsers below, whose error
says what the flag takes (``--tp takes a whole number ≥ 1 …; got '0'``); numbers accept
the units of :mod:`planner.spec.units` (``16Mi``, ``8K``, ``1.5e7``).
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Annotated, Any, ClassVar

import typer

from hwspecs.errors import PlanError, bound_text, closest_match_hint, one_of
from planner.api import (
    COUNT_EXAMPLES,
    MEGATRON_MODULES,
    UNMODELLED_MODULES,
    WHOLE_POLICIES,
    checked_recompute,
    parse_count,
)

# ----- parsers: each knows what it allows, for help and for errors ----------------------


class Parser:
    """A flag's value parser; raises PlanError ``"takes <allowed>; got '<value>'"``."""

    allowed: str = "a value"
    choices: list[str] | None = None

    def __call__(self, text):
        if not isinstance(text, str):  # a default, already a value
            return text
        if text.startswith("--") and text[2:3].isalpha():  # the next option, not a value
            raise PlanError(
                f"needs a value ({self.allowed}); got the option '{text}'",
                allowed=self.choices or self.allowed,
            )
        return self.parse(text.strip())

    def parse(self, text: str):
        raise NotImplementedError

    def fail(self, text: str):
        hint = closest_match_hint(text, self.choices) if self.choices else ""
        raise PlanError(
            f"takes {self.allowed}; got '{text}'{hint}",
            allowed=self.choices or self.allowed,
            got=text,
        )


class Count(Parser):
    """A whole number ≥ ``minimum`` (≤ ``maximum``), with units: 8K, 16Mi, 1.5e7."""

    def __init__(self, minimum: int = 1, maximum: int | None = None, examples: str = ""):
        self.minimum, self.maximum = minimum, maximum
        upper = f" and ≤ {maximum:,}" if maximum is not None else ""
        self.allowed = f"a whole number ≥ {minimum}{upper}" + (f" ({examples})" if examples else "")

    def parse(self, text: str) -> int:
        try:
            value = parse_count(text, minimum=self.minimum)
        except PlanError:
            self.fail(text)
        if self.maximum is not None and value > self.maximum:
            self.fail(text)
        return value


class IntIn(Parser):
    """One of a few integers (ZeRO stage 0–3)."""

    def __init__(self, low: int, high: int):
        self.values = list(range(low, high + 1))
        self.allowed = one_of(self.values)

    def parse(self, text: str) -> int:
        if text.lstrip("-").isdigit() and int(text) in self.values:
            return int(text)
        self.fail(text)


class Number(Parser):
    """A finite real number within bounds."""

    def __init__(self, low=None, high=None, low_open=False, high_open=False):
        self.bounds = (low, high, low_open, high_open)
        self.allowed = bound_text("float", low, high, low_open, high_open)

    def parse(self, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            self.fail(text)
        low, high, low_open, high_open = self.bounds
        if (
            not math.isfinite(value)
            or (low is not None and (value < low or (low_open and value == low)))
            or (high is not None and (value > high or (high_open and value == high)))
        ):
            self.fail(text)
        return value


class Choice(Parser):
    """One name of an enum (``--optimizer adamw``)."""

    def __init__(self, enum: type[Enum]):
        self.enum = enum
        self.choices = [member.value for member in enum]
        self.allowed = one_of(self.choices)

    def __call__(self, text):
        if isinstance(text, self.enum):
            return text
        return super().__call__(text)

    def parse(self, text: str):
        for member in self.enum:
            if member.value == text:
                return member
        self.fail(text)


class ListOf(Parser):
    """Comma-separated values of one parser (a search pin: ``--tp 4,8``)."""

    def __init__(self, item: Parser):
        self.item = item

    @property
    def allowed(self):
        return self.item.allowed

    @property
    def choices(self):
        return self.item.choices

    def __call__(self, text):
        if text is None or isinstance(text, list):
            return text
        return super().__call__(str(text))

    def parse(self, text: str) -> list:
        parts = [part.strip() for part in text.split(",") if part.strip()]
        if not parts:
            self.fail(text)
        try:
            return [self.item.parse(part) for part in parts]
        except PlanError:
            self.fail(text)


class Name(Parser):
    """A name checked later against a catalog or registry (models, clusters, schedules)."""

    def __init__(self, allowed: str):
        self.allowed = allowed

    def parse(self, text: str) -> str:
        if not text:
            self.fail(text)
        return text


class OutputPath(Parser):
    """A file to write: checked while the flags are parsed, before any work runs."""

    allowed = "a file path in an existing, writable directory"

    def parse(self, text: str) -> str:
        from commands.outputs import check_writable

        check_writable(text, "")
        return text


class PngPath(OutputPath):
    """A PNG file to write: a writable path ending in .png (plotly picks the format by it)."""

    allowed = "a file path ending in .png in an existing, writable directory"

    def parse(self, text: str) -> str:
        if not text.lower().endswith(".png"):
            self.fail(text)
        return super().parse(text)


def png_output(help: str = "write the page as PNG (needs kaleido and a Chrome/Chromium)"):
    """A PNG output option: checked writable and ending in .png while the flags are parsed."""
    return Annotated[str | None, option(PngPath(), help)]


def output(help: str):
    """An output-file option, checked writable while the flags are parsed."""
    return Annotated[str | None, option(OutputPath(), help)]


def option(
    parser: Parser,
    help: str,
    *decls: str,
    show_allowed: bool = False,
):
    """A typer option parsed by ``parser``; ``show_allowed`` appends what it takes to the help."""
    listed = isinstance(parser, Choice) or (  # the metavar lists the choices already
        isinstance(parser, ListOf) and isinstance(parser.item, Choice)
    )
    text = f"{help} ({parser.allowed})" if show_allowed and not listed else help
    return typer.Option(*decls, parser=parser, help=text, metavar=_metavar(parser))


def _metavar(parser: Parser) -> str:
    if isinstance(parser, Choice):
        return "[" + "|".join(parser.choices) + "]"
    if isinstance(parser, ListOf):
        return _metavar(parser.item).strip("[]") + ",..."
    kinds = {Count: "N", IntIn: "N", Number: "X", OutputPath: "PATH", PngPath: "PATH"}
    return kinds.get(type(parser), "TEXT")


# ----- shared enums ---------------------------------------------------------------------


class Precision(str, Enum):
    bf16_mixed = "bf16-mixed"
    fp16_mixed = "fp16-mixed"
    fp32 = "fp32"
    bf16 = "bf16"
    fp8_mixed = "fp8-mixed"
    fp4_mixed = "fp4-mixed"


class MeasureSet(str, Enum):
    none = "none"
    deepseek_v3 = "deepseek-v3"
    te_fp8 = "te-fp8"


class WeightPass(str, Enum):
    inputs = "inputs"
    graph = "graph"


class UlyssesKvHeads(str, Enum):
    whole = "whole"
    replicate = "replicate"


class AttentionKernel(str, Enum):  # planner.spec.job.AttentionKernel
    flash_attention_1 = "flash-attention-1"
    flash_attention_2 = "flash-attention-2"
    cudnn = "cudnn"
    flash_attention_3 = "flash-attention-3"


class CrossEntropy(str, Enum):  # planner.spec.job.CrossEntropyKernel
    unfused = "unfused"
    fused = "fused"


class Optimizer(str, Enum):
    adamw = "adamw"
    sgd_momentum = "sgd-momentum"
    sgd = "sgd"
    lion = "lion"
    adafactor = "adafactor"
    muon = "muon"


class GradDtype(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class MasterDtype(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"
    none = "none"


class RecomputePolicy(Parser):
    """A recomputation policy: none, selective, dots, full, or Megatron-Core's selective
    modules joined by ``+`` (``layernorm+moe_act``; :mod:`planner.spec.recompute`)."""

    choices: ClassVar[list[str]] = [*WHOLE_POLICIES, *MEGATRON_MODULES]
    allowed = (
        f"one of {', '.join(WHOLE_POLICIES)}, or Megatron-Core modules joined by '+' "
        f"({', '.join(MEGATRON_MODULES)})"
    )

    def parse(self, text: str) -> str:
        try:
            return checked_recompute(text)
        except PlanError:
            if any(part.strip() in UNMODELLED_MODULES for part in text.split("+")):
                raise  # its own reason: why the module is not modelled
            self.fail(text)


class CpAlgorithm(str, Enum):  # planner.spec.layout.CP_ALGORITHMS
    all_gather = "all-gather"
    ring = "ring"
    ulysses = "ulysses"
    hierarchical = "hierarchical"


class LayerSplitName(str, Enum):  # planner.spec.layout.LayerSplit
    auto = "auto"
    even = "even"
    first_last_fewer = "first-last-fewer"
    balanced = "balanced"
    work_balanced = "work-balanced"


SPLIT_HELP = (
    "layers per pipeline stage: even; first-last-fewer (one fewer on the first and last, "
    "Llama 3); balanced (stages differ by at most one); work-balanced (the first and last "
    "stage's layers set so the busiest rank, head and MTP counted, does the least); auto "
    "(even, else first-last-fewer, else balanced); or each virtual stage's layers in "
    "Megatron-Core's --pipeline-model-parallel-layout notation, e.g. 'Et*4|(t*4|)*14tmL' "
    "(E embedding, t layer, m MTP module, L loss, '|' between stages)"
)


class LayerSplitParam(Parser):
    """A named layer split, or a layout in Megatron-Core's notation
    (:func:`planner.spec.layout.checked_layer_split`)."""

    choices: ClassVar[list[str]] = [member.value for member in LayerSplitName]
    allowed = f"{one_of(choices)}, or a layout in Megatron-Core's notation (e.g. Et*4|(t*4|)*14tmL)"

    def parse(self, text: str):
        for member in LayerSplitName:
            if member.value == text:
                return member
        from planner.api import checked_layer_split  # numpy and pydantic: on use only

        try:
            return checked_layer_split(text)
        except PlanError:
            self.fail(text)


class Recipe(str, Enum):
    full = "full"
    lora = "lora"
    qlora = "qlora"
    dora = "dora"
    vera = "vera"


class DropoutPosition(str, Enum):  # planner.spec.finetune.FinetuneSpec.lora_dropout_position
    pre = "pre"
    post = "post"


class AdapterDtype(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class Objective(str, Enum):
    step_time = "step_time"
    memory = "memory"
    mfu = "mfu"
    time_to_train = "time_to_train"


class ObjectiveName(Choice):
    """An objective, ``-`` and ``_`` alike (``time-to-train`` is ``time_to_train``)."""

    def __init__(self):
        super().__init__(Objective)

    def parse(self, text: str):
        return super().parse(text.replace("-", "_"))


OBJECTIVE_HELP = (
    "what ranks the layouts: step_time (s), memory (bytes per GPU), mfu, or time_to_train "
    "(expected wall time of --train-tokens, failures included)"
)


class Trainer(str, Enum):
    torchtitan = "torchtitan"
    megatron = "megatron"


class CatalogKind(str, Enum):
    model = "model"
    accelerator = "accelerator"
    cluster = "cluster"
    link = "link"


def _schedule_names() -> list[str]:
    from planner.api import SCHEDULES

    return list(SCHEDULES)


class ScheduleName(Parser):
    """A pipeline schedule of the registry (checked when parsed)."""

    @property
    def choices(self):  # the registry, read when first needed (keeps --help fast)
        return _schedule_names()

    @property
    def allowed(self):
        return one_of(self.choices)

    def parse(self, text: str) -> str:
        if text in self.choices:
            return text
        self.fail(text)


# ----- groups of flags ------------------------------------------------------------------


@dataclass(frozen=True)
class Flag:
    """One option: its parameter name, annotation (with the typer Option) and default."""

    name: str
    annotation: Any
    default: Any = None


@dataclass(frozen=True)
class FlagGroup:
    """Options a command takes together; ``defaults`` and ``only`` derive a variant."""

    flags: tuple[Flag, ...]
    overrides: dict = field(default_factory=dict)
    #: Turns the parsed values into what the command reads (``--accelerator`` into a cluster).
    finish: Any = None

    def defaults(self, **values) -> FlagGroup:
        unknown = set(values) - {flag.name for flag in self.flags}
        if unknown:
            raise KeyError(f"no such flags in the group: {sorted(unknown)}")
        return replace(self, overrides={**self.overrides, **values})

    def only(self, *names: str) -> FlagGroup:
        return replace(self, flags=tuple(flag for flag in self.flags if flag.name in names))

    def parameters(self) -> list[inspect.Parameter]:
        return [
            inspect.Parameter(
                flag.name,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=flag.annotation,
                default=self.overrides.get(flag.name, flag.default),
            )
            for flag in self.flags
        ]


class Values(dict):
    """A group's parsed values, readable as attributes (``job.seq_len``)."""

    __getattr__ = dict.__getitem__


def uses(**groups: FlagGroup):
    """Give the decorated command each group's options; it receives them as ``Values``."""

    def decorate(command):
        signature = inspect.signature(command, eval_str=True)
        parameters = []
        for parameter in signature.parameters.values():
            if parameter.name in groups:
                parameters.extend(groups[parameter.name].parameters())
            else:
                parameters.append(parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY))

        @functools.wraps(command)
        def run(**values):
            for name, group in groups.items():
                values[name] = Values({flag.name: values.pop(flag.name) for flag in group.flags})
                if group.finish is not None:
                    values[name] = group.finish(values[name])
            return command(**values)

        run.__signature__ = signature.replace(parameters=parameters)
        run.__annotations__ = {p.name: p.annotation for p in parameters}
        run.__wrapped_groups__ = groups
        del run.__wrapped__  # typer must read the new signature, not the command's
        return run

    return decorate


def _flag(name: str, parser: Parser, help: str, default=None, annotation=Any, **kw) -> Flag:
    return Flag(name, Annotated[annotation, option(parser, help, **kw)], default)


def _switch(name: str, decls: str, help: str, default=None) -> Flag:
    return Flag(name, Annotated[bool | None, typer.Option(decls, help=help)], default)


POSITIVE = Count(1, examples=COUNT_EXAMPLES)
DEGREE = Count(1)

JOB = FlagGroup(
    (
        _flag("model", Name("a catalog model, a model TOML or a HF config.json"),
              "catalog model, model TOML or HF config.json", "llama3-405b"),
        _flag("seq_len", POSITIVE, "sequence length in tokens", 8192),
        _flag("global_batch_tokens", POSITIVE,
              "tokens per step (16Mi = 16,777,216; default 16Mi where a command needs one)"),
        _flag("global_batch_size", POSITIVE, "sequences per step (instead of tokens)"),
        _flag("precision", Choice(Precision),
              "precision recipe (default: the model's training recipe, else bf16-mixed)",
              show_allowed=True),
        _flag("memory_measures", Choice(MeasureSet),
              "activation-memory measures (default: the model's training recipe, else none)",
              show_allowed=True),
        _flag("weight_pass_memory", Choice(WeightPass),
              "what zero-bubble schedules keep from B to W: the weight GEMMs' inputs and output "
              "gradients (inputs: zero-bubble paper, Megatron) or the whole graph (graph: "
              "torchtitan)", WeightPass.inputs, show_allowed=True),
        _flag("ulysses_kv_heads", Choice(UlyssesKvHeads),
              "Ulysses CP over more ranks than a TP rank's KV heads: refused (whole: "
              "TransformerEngine, Megatron-Core) or the K/V heads repeated up to the degree "
              "(replicate: verl)", UlyssesKvHeads.whole, show_allowed=True),
        _switch("tp_comm_overlap", "--tp-comm-overlap/--no-tp-comm-overlap",
                "the stack overlaps TP collectives with the GEMMs (TransformerEngine "
                "userbuffers, torch async TP, XLA's async collective fusion; the "
                "profile's learned share is hidden); default: the --stack's (megatron "
                "on, jax on a TPU, the others off; no --stack: on)"),
        _switch("ep_comm_overlap", "--ep-comm-overlap/--no-ep-comm-overlap",
                "MoE: Megatron-Core's combined 1F1B (--overlap-moe-expert-parallel-comm): in "
                "interleaved 1F1B or without PP, one micro-batch's forward runs beside "
                "another's backward and hides its EP all-to-alls (DualPipe always does); "
                "default off", False),
        _switch("cuda_graphs", "--cuda-graphs/--no-cuda-graphs",
                "the layers replay from CUDA graphs, whole (Megatron-Core's --cuda-graph-impl "
                "full_iteration, or per-layer graphs): no per-kernel launch cost; default off",
                False),
        _flag("moe_imbalance", Number(1.0),
              "MoE, dropless routing: routed tokens on the busiest EP rank over the balanced "
              "share (default: the model's, 1.0)"),
        _flag("moe_capacity_factor", Number(0.01),
              "MoE: capacity-based routing at this capacity factor (padded buffers computed and "
              "exchanged; default: dropless)"),
        _flag("optimizer", Choice(Optimizer), "optimizer", Optimizer.adamw, show_allowed=True),
        _flag("grad_dtype", Choice(GradDtype), "gradient dtype (default: the recipe's)",
              show_allowed=True),
        _switch("flash_attention", "--flash-attention/--no-flash-attention",
                "attention without the score matrix in memory (default on)", True),
        _flag("attention_kernel", Choice(AttentionKernel),
              "the stack's fused attention kernel, timed at the accelerator's rates for it "
              "(measured, or derived from a measured one; default: the accelerator's "
              "attention rates)", show_allowed=True),
        _flag("cross_entropy", Choice(CrossEntropy),
              "the loss kernel: unfused (FP32 probabilities kept) or fused (FlashAttention's "
              "CrossEntropyLoss: logits and their gradient only)", CrossEntropy.unfused,
              show_allowed=True),
        _flag("recipe", Choice(Recipe), "training recipe: full, or adapters on a frozen base",
              Recipe.full, show_allowed=True),
        _flag("lora_rank", POSITIVE, "adapter rank r (default 8; QLoRA used 64)"),
        _flag("lora_alpha", Number(0, low_open=True), "adapter scale alpha (no cost effect)"),
        _flag("lora_targets", Name("attention, mlp, all or module names"),
              "attention, mlp, all (default) or module names, e.g. q_proj,v_proj"),
        _flag("lora_dropout", Number(0, 1, high_open=True),
              "adapter dropout (stores a mask, and before the adapter an input copy too)"),
        _flag("lora_dropout_position", Choice(DropoutPosition),
              "where adapter dropout applies: pre (the adapter's input, PEFT's; default) or "
              "post (its output, NeMo AutoModel's)", show_allowed=True),
        _flag("adapter_dtype", Choice(AdapterDtype),
              "adapter weight dtype (default fp32; bf16 for qlora)", show_allowed=True),
        _switch("double_quant", "--double-quant/--no-double-quant",
                "qlora: quantize the NF4 constants (default on)"),
    )
)  # fmt: skip

#: The cluster every command defaults to (Meta's Llama 3 cluster, planner.api.DEFAULT_PLAN).
DEFAULT_CLUSTER = "llama3-h100-24k"


def resolved_cluster(values: Values) -> Values:
    """``--accelerator X`` as the cluster ``node:X`` (one scale-up domain of X); neither
    flag: :data:`DEFAULT_CLUSTER`. Both: an error (they name the same thing)."""
    accelerator = values.pop("accelerator", None)
    if accelerator is not None and values.get("cluster") is not None:
        raise PlanError(
            "give --cluster or --accelerator (one node of it), not both",
            field="accelerator",
            allowed="--cluster NAME or --accelerator NAME",
        )
    if accelerator is not None:
        from hwspecs.catalog import one_node_name

        values["cluster"] = one_node_name(accelerator)
    elif values.get("cluster") is None:
        values["cluster"] = DEFAULT_CLUSTER
    return values


CLUSTER = FlagGroup(
    (
        _flag("cluster", Name("a catalog cluster or a cluster TOML"),
              f"catalog cluster or cluster TOML path (default {DEFAULT_CLUSTER})"),
        _flag("accelerator", Name("a catalog accelerator or an accelerator TOML"),
              "instead of --cluster: one node of this accelerator, its scale-up domain "
              "(8 GPUs on NVLink for h100-sxm)"),
        _flag("gpus", POSITIVE, "GPUs to use, the cluster's first N (default: the layout's)"),
        _flag("order", Name("axis names tp, cp, ep, pp, dp separated by commas"),
              "mesh order, innermost axis first, e.g. tp,cp,ep,pp,dp (default: the cluster's)"),
    ),
    finish=resolved_cluster,
)  # fmt: skip

LAYOUT = FlagGroup(
    (
        _flag("tp", DEGREE, "tensor-parallel degree", 1),
        _flag("cp", DEGREE, "context-parallel degree", 1),
        _flag("cp_algorithm", Choice(CpAlgorithm),
              "how CP exchanges K and V: all-gather (Llama 3), ring (ring attention), ulysses "
              "(all-to-all), hierarchical (Ulysses inside the scale-up domain, ring across)",
              CpAlgorithm.all_gather, show_allowed=True),
        _flag("cp_inner", DEGREE,
              "hierarchical CP's inner (Ulysses) degree, a ring over cp/cp_inner outside; "
              "divides cp (default: the CP ranks of one scale-up domain)"),
        _flag("pp", DEGREE, "pipeline-parallel degree", 1),
        _flag("dp", DEGREE, "data-parallel degree", 1),
        _flag("ep", DEGREE, "expert-parallel degree (MoE)", 1),
        _flag("etp", DEGREE,
              "expert tensor parallel: the routed experts' TP degree, 1 or tp (default tp); with "
              "1 the TP ranks fold into the EP group (Megatron-Core --expert-tensor-parallel-size)"),
        _flag("vpp", DEGREE, "chunks per rank (default: the schedule's)"),
        _flag("micro_batch_size", POSITIVE, "sequences per micro-batch", 1),
        _flag("num_microbatches", POSITIVE, "micro-batches per step (default: from the "
              "global batch, else pp)"),
        _flag("schedule", ScheduleName(), "pipeline schedule", "1f1b", show_allowed=True),
        _flag("zero_stage", IntIn(0, 3), "ZeRO stage", 1, show_allowed=True),
        _flag("recompute", RecomputePolicy(),
              "activation recomputation (default: full for qlora, as QLoRA, else none); "
              "Megatron-Core modules joined by '+', e.g. layernorm+moe_act",
              show_allowed=True),
        _switch("sequence_parallel", "--sequence-parallel/--no-sequence-parallel",
                "shard norms and dropout over TP (default on)", True),
        _flag("pipeline_layer_split", LayerSplitParam(), SPLIT_HELP, LayerSplitName.auto,
              show_allowed=True),
    )
)  # fmt: skip

#: The layout every command that takes one defaults to: Llama 3 405B's (Table 4: TP 8,
#: PP 16, DP 128 on 16,384 GPUs), as ``plan``'s default query.
DEFAULT_LAYOUT = LAYOUT.defaults(tp=8, pp=16, dp=128)

PIN_HELP = "pin, e.g. 4,8 (default: every value that fits)"

PINS = FlagGroup(
    (
        *(_flag(axis, ListOf(DEGREE), PIN_HELP) for axis in ("tp", "cp", "pp", "dp", "ep")),
        _flag("etp", ListOf(DEGREE), "pin the routed experts' TP degree: 1 or tp (e.g. 1)"),
        _flag("vpp", ListOf(DEGREE), PIN_HELP),
        _flag("micro_batch_size", ListOf(POSITIVE), "pin (default 1,2,4,8)"),
        _flag("schedule", ListOf(ScheduleName()), "pin, e.g. 1f1b,interleaved-1f1b",
              show_allowed=True),
        _flag("zero_stage", ListOf(IntIn(0, 3)), "pin, e.g. 1 (0, 1, 2 or 3)"),
        _flag("recompute", ListOf(RecomputePolicy()),
              "pin, e.g. none,layernorm+moe_act,full (default: none, selective, full; dots "
              "keeps only the projections' outputs, JAX's checkpoint_dots)",
              show_allowed=True),
        _flag("cp_algorithm", ListOf(Choice(CpAlgorithm)),
              "pin: all-gather, ring, ulysses, hierarchical (default: every one where cp > 1)"),
        _flag("cp_inner", ListOf(DEGREE),
              "search hierarchical CP's inner degrees, e.g. 2,4 (default: the CP ranks of "
              "one NVLink domain)"),
        _switch("sequence_parallel", "--sequence-parallel/--no-sequence-parallel", "pin"),
        _switch("allow_cross_node_tp", "--allow-cross-node-tp/--no-cross-node-tp",
                "let TP groups span nodes", False),
        _flag("pipeline_layer_split", LayerSplitParam(),
              "how every candidate splits its layers over its stages (default work-balanced); "
              "the choices as for estimate's --pipeline-layer-split",
              show_allowed=True),
    )
)  # fmt: skip


class MfuDtype(str, Enum):  # the dtypes an accelerator lists a peak for (hwspecs.schema)
    fp32 = "fp32"
    tf32 = "tf32"
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"
    fp4 = "fp4"


MFU_DTYPE = _flag("mfu_dtype", Choice(MfuDtype), "dtype whose peak MFU is measured against",
                  MfuDtype.bf16)  # fmt: skip
#: One "fits" for every command that says it (planner.cost.memory.usable_memory_bytes).
MEM_HEADROOM = _flag("mem_headroom", Number(0, 1, high_open=True),
                     "fraction of HBM kept free: a layout fits in HBM × (1 − headroom)",
                     0.05)  # fmt: skip


class RankMode(str, Enum):  # planner.rank.RANK_MODES
    robust = "robust"
    time = "time"


#: How plan orders its rows (planner/rank.py): robust treats layouts within the model's
#: measured ratio error of the fastest as ties, ordered by the preference rules.
RANK = _flag("rank", Choice(RankMode),
             "robust: layouts within the model's measured ratio error of the fastest are "
             "ties, ordered by the preference rules (planner/rank.py); time: by predicted "
             "step time alone", RankMode.robust)  # fmt: skip

# ----- from flags to the library's models ------------------------------------------------


def value(option):
    """An enum flag's value (``Optimizer.adamw`` → ``"adamw"``); other values unchanged."""
    if isinstance(option, list):
        return [value(item) for item in option]
    return option.value if isinstance(option, Enum) else option


def build_finetune(job: Values):
    """The FinetuneSpec the job flags ask for (None for full training)."""
    from planner import api

    return api.build_finetune(
        value(job.recipe),
        lora_rank=job.lora_rank,
        lora_alpha=job.lora_alpha,
        lora_targets=job.lora_targets,
        lora_dropout=job.lora_dropout,
        lora_dropout_position=value(job.lora_dropout_position),
        adapter_dtype=value(job.adapter_dtype),
        double_quant=job.double_quant,
    )


def build_job(job: Values, default_batch: bool = True):
    """The Job of the job flags; ``default_batch``: 16Mi tokens when no batch is given."""
    from planner import api

    tokens = job.global_batch_tokens
    if default_batch and tokens is None and job.global_batch_size is None:
        tokens = api.DEFAULT_PLAN["global_batch_tokens"]
    return api.build_job(
        job.model,
        job.seq_len,
        global_batch_tokens=tokens,
        global_batch_size=job.global_batch_size,
        precision=value(job.precision),
        optimizer=value(job.optimizer),
        grad_dtype=value(job.grad_dtype),
        flash_attention=job.flash_attention,
        finetune=build_finetune(job),
        memory_measures=value(job.memory_measures),
        weight_pass_memory=value(job.weight_pass_memory),
        ulysses_kv_heads=value(job.ulysses_kv_heads),
        tp_comm_overlap=job.tp_comm_overlap,
        ep_comm_overlap=bool(job.ep_comm_overlap),
        cuda_graphs=bool(job.cuda_graphs),
        attention_kernel=value(job.attention_kernel),
        cross_entropy=value(job.cross_entropy),
        moe_imbalance=job.moe_imbalance,
        moe_capacity_factor=job.moe_capacity_factor,
    )


def build_layout(layout: Values, job: Values | None = None):
    """The Layout of the layout flags (recompute defaults to full under qlora, else none)."""
    from planner import api

    fields = {key: value(item) for key, item in layout.items()}
    if fields.get("recompute") is None:
        qlora = job is not None and value(job.recipe) == "qlora"
        fields["recompute"] = "full" if qlora else "none"
    return api.build_layout(**fields)


def pinned(pins: Values) -> dict:
    """The search pins the user gave, as ``planner.api.build_search_space`` takes them."""
    return {key: value(item) for key, item in pins.items() if item is not None}


def parser_of(command, name: str) -> Parser | None:
    """The parser of a command's parameter (for what a missing option allows)."""
    try:
        parameter = inspect.signature(command, eval_str=True).parameters[name]
    except (KeyError, TypeError, ValueError, NameError):
        return None
    for extra in getattr(parameter.annotation, "__metadata__", ()):
        parser = getattr(extra, "parser", None)
        if isinstance(parser, Parser):
            return parser
    return None
