"""What real steps lose between and around kernels: a fitted profile's terms, on columns.

The ideal model times every GEMM at the best-shape MAMF, attention at the FlashAttention
rate, everything else at roofline and collectives by alpha-beta. An
:class:`~hwspecs.profile.EfficiencyProfile` adds the few terms micro-benchmarks cannot
show, each its own line of the step's breakdown:

* ``compute_efficiency_bf16`` / ``compute_efficiency_fp8`` / ``compute_efficiency_fp4``
  (fraction of the ideal rate, 0.3–1 / 0.2–1 / 0.2–1): the sustained share of the ideal
  compute rate a whole model reaches (norms and glue kernels, power and clocks under load);
  FP8 and NVFP4 have their own since their scaling, casts and amax reductions cost what
  BF16's do not, and no FP4 GEMM rate is measured (the catalog's is FP8's share of peak).
* ``expert_gemm_half_width`` (elements, 0–8192): the routed experts' grouped GEMMs below
  the best shape: their size ``x`` is the geometric mean of the tokens one expert receives
  and ``moe_ffn/etp`` (:func:`expert_gemm_size`), their efficiency ``x / (x + half_width)``
  (a saturating occupancy curve: half the rate at ``x = half_width``), applied to their
  share of the model FLOPs. (The same curve on the dense GEMMs, on ``hidden/√tp``, was
  fitted to 0 on every accelerator and did not lower the leave-one-source-out error: it
  is left out.)
* ``attention_efficiency`` (fraction, 0.2–1): achieved over modelled rate of the attention
  core (scores and context products), applied to its share of the model FLOPs; long
  sequences are where it shows.
* ``kernel_overhead_s`` (s per kernel, 0–50 µs): a fixed launch and tail cost per kernel,
  times the kernels the busiest rank launches per step (a layer's operations per pass from
  :func:`planner.structure.op_counts.layer_pass_ops`, × layers per stage × micro-batches);
  none where the job replays its layers from CUDA graphs (``Job.cuda_graphs``: no host
  launches, the cost this term stands for).
* ``overlap_slowdown`` (fraction, 0–1): compute slowed while collectives overlap it
  (communication kernels take SMs and HBM bandwidth): this share of the overlapped
  communication time is added.
* ``sync_per_doubling_s`` (s, 0–50 ms): a synchronisation cost per step growing with the
  log of the ranks the step waits for (barriers, the slowest rank of a collective tree).
* ``tp_comm_overlap`` (fraction, 0–1): the share of the tensor-parallel collectives a
  stack that overlaps them (the job's ``tp_comm_overlap``, :mod:`planner.spec.stack`) hides
  behind the GEMMs they feed or follow (all-gather/GEMM and GEMM/reduce-scatter
  pipelining: TransformerEngine's userbuffers ``tp_comm_overlap``, Wang et al. 2023
  "Overlap communication with dependent computation via decomposition", torch's async TP).
  The ideal model exposes every TP collective (Megatron without overlap, Korthikanti et al.
  2022 §4), and so does a stack that does not overlap them; the hidden share leaves the step
  (a negative line) and joins the overlapped communication that ``overlap_slowdown``
  charges. It hides at most the time of the GEMMs it is pipelined with
  (:func:`hideable_tp_s`): TP collectives longer than the layer's GEMMs stay exposed.

FLOP shares come from :func:`planner.cost.flops.model_ops_per_sequence` (causal attention).
Compute-side terms scale with the pipeline's stretch (``pipeline_time / busy``) since the
bubble is made of the same stage times. Ideal values (1, 1, 0, 1, 0, 0, 0, 0) leave every
step unchanged. Each function is pure and works on numpy columns.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Term(NamedTuple):
    """A profile term: unit, physical bounds, the ideal model's value, what it is."""

    unit: str
    lower: float
    upper: float
    ideal: float
    description: str


TERMS: dict[str, Term] = {
    "compute_efficiency_bf16": Term(
        "fraction", 0.3, 1.0, 1.0, "sustained share of the ideal BF16 compute rate"
    ),
    "compute_efficiency_fp8": Term(
        "fraction", 0.2, 1.0, 1.0, "sustained share of the ideal FP8 compute rate"
    ),
    "compute_efficiency_fp4": Term(
        "fraction", 0.2, 1.0, 1.0, "sustained share of the ideal NVFP4 compute rate"
    ),
    "expert_gemm_half_width": Term(
        "elements", 0.0, 8192.0, 0.0, "routed-expert GEMM size at half rate"
    ),
    "attention_efficiency": Term(
        "fraction", 0.2, 1.0, 1.0, "achieved over modelled rate of the attention core"
    ),
    "kernel_overhead_s": Term("s/kernel", 0.0, 5e-5, 0.0, "fixed launch and tail cost per kernel"),
    "overlap_slowdown": Term(
        "fraction", 0.0, 1.0, 0.0, "share of overlapped communication time compute loses"
    ),
    "sync_per_doubling_s": Term(
        "s", 0.0, 0.05, 0.0, "synchronisation per step per doubling of the ranks waited for"
    ),
    "tp_comm_overlap": Term(
        "fraction", 0.0, 1.0, 0.0, "share of TP communication hidden behind the GEMMs"
    ),
}
TERM_NAMES = tuple(TERMS)
#: Breakdown lines the profile adds (seconds per step).
PROFILE_PARTS = ("profile_compute", "profile_kernels", "profile_overlap", "profile_sync",
                 "profile_tp_overlap")  # fmt: skip


def ideal_values() -> dict[str, float]:
    """Every term at the value that leaves the ideal model unchanged."""
    return {name: term.ideal for name, term in TERMS.items()}


def kernels_per_layer(model) -> float:
    """Operations one layer launches per micro-batch (forward, input and weight gradient),
    averaged over the model's dense and MoE layers (:func:`planner.structure.op_counts.layer_pass_ops`)."""
    from planner.structure.op_counts import layer_pass_ops

    dense = sum(layer_pass_ops(model, moe_layer=False))
    if not model.is_moe:
        return float(dense)
    moe = sum(layer_pass_ops(model, moe_layer=True))
    num_dense = model.num_dense_layers
    return float((dense * num_dense + moe * (model.num_layers - num_dense)) / model.num_layers)


def flop_shares(model, seq_len: int) -> tuple[float, float]:
    """(attention core, routed experts) shares of the model FLOPs per token (causal)."""
    from planner.cost.flops import model_ops_per_sequence

    ops = model_ops_per_sequence(model, seq_len, causal=True)
    total = sum(op.total for op in ops)
    attention = sum(op.total for op in ops if op.name in ("attention.scores", "attention.context"))
    experts = sum(op.total for op in ops if op.name == "moe.routed_experts")
    return attention / total, experts / total


def expert_gemm_size(model, seq_len: int, cp, mbs, ep, etp) -> np.ndarray:
    """Geometric mean of a routed expert's grouped-GEMM rows and width: the token copies
    one expert receives per micro-batch (``mbs·(s/cp)·k/E`` from each of the ``ep`` ranks
    of its group, balanced routing) and ``moe_ffn/etp``."""
    if not model.is_moe:
        return np.full(np.shape(ep), float(model.hidden_size))
    per_rank = mbs * (seq_len / cp) * model.num_experts_per_token / model.num_routed_experts
    return np.sqrt(per_rank * ep * model.moe_ffn_hidden_size / etp)


def profile_inputs(
    job, tp, etp, cp, pp, ep, mbs, m, num_gpus, comm_s, exposed_comm_s
) -> dict[str, np.ndarray]:
    """The columns the terms read, from a row's layout and its ideal communication times
    (``comm_s``: every axis's collective time per step; ``exposed_comm_s``: what of it the
    step waits for)."""
    model = job.model
    attention, experts = flop_shares(model, job.seq_len)
    ones = np.ones(np.shape(tp))
    launched = 0.0 if job.cuda_graphs else kernels_per_layer(model)  # graphs launch on device
    return {
        "kernels_per_step": m * np.ceil(model.num_layers / pp) * launched,
        "expert_width": expert_gemm_size(model, job.seq_len, cp, mbs, ep, etp) * ones,
        "attention_share": attention * ones,
        "expert_share": experts * ones,
        "overlapped_comm_s": np.maximum(comm_s - exposed_comm_s, 0.0),
        "num_gpus": num_gpus * 1.0,
        "fp8": np.full(np.shape(tp), job.precision.gemm_dtype == "fp8"),
        "fp4": np.full(np.shape(tp), job.precision.gemm_dtype == "fp4"),
        "stack_overlaps_tp": np.full(np.shape(tp), bool(job.tp_comm_overlap)),
    }


def _saturating(width, half_width: float):
    return width / (width + half_width)


def hideable_tp_s(columns: dict, sustained) -> np.ndarray:
    """The TP communication a stack can hide: no more than the GEMMs it is pipelined with
    run for (all-gather/GEMM and GEMM/reduce-scatter overlap splits a collective across the
    GEMM it feeds or follows; Wang et al. 2023 §3), taken as the step's busy compute outside
    the attention core and the routed experts (their FLOP shares) at the profile's
    ``sustained`` compute efficiency, per row."""
    busy = columns["compute_s"] + columns["recompute_s"]
    gemm_share = np.clip(1 - columns["attention_share"] - columns["expert_share"], 0.0, 1.0)
    return np.minimum(columns["tp_exposed_time_s"], busy * gemm_share / sustained)


def sustained_compute_efficiency(columns: dict, values: dict[str, float]) -> np.ndarray:
    """Each row's sustained compute term: its GEMM dtype's (``fp8`` and ``fp4``: the rows'
    boolean columns, the rest BF16's or FP16's)."""
    return np.where(
        columns["fp8"],
        values["compute_efficiency_fp8"],
        np.where(
            columns["fp4"], values["compute_efficiency_fp4"], values["compute_efficiency_bf16"]
        ),
    )


def profile_parts(columns: dict, values: dict[str, float]) -> dict[str, np.ndarray]:
    """Seconds each term adds to a step, per row. ``columns``: the ideal step's
    ``compute_s``, ``recompute_s``, ``pipeline_time_s``, ``exposed_comm_s``,
    ``tp_exposed_time_s`` and :func:`profile_inputs` (``stack_overlaps_tp``: 1 where the
    job's stack overlaps TP communication); ``values``: one value per term
    (missing terms: ideal)."""
    v = {**ideal_values(), **values}
    busy = columns["compute_s"] + columns["recompute_s"]
    with np.errstate(divide="ignore", invalid="ignore"):
        stretch = np.where(busy > 0, columns["pipeline_time_s"] / busy, 1.0)
    sustained = sustained_compute_efficiency(columns, v)
    attention, experts = columns["attention_share"], columns["expert_share"]
    expert = _saturating(columns["expert_width"], v["expert_gemm_half_width"])
    slowdown = (
        (1 - attention - experts) / sustained
        + experts / (sustained * expert)
        + attention / v["attention_efficiency"]
    )
    hidden_tp = (
        v["tp_comm_overlap"] * hideable_tp_s(columns, sustained) * columns["stack_overlaps_tp"]
    )
    return {
        "profile_compute": busy * (slowdown - 1) * stretch,
        "profile_kernels": columns["kernels_per_step"] * v["kernel_overhead_s"] * stretch,
        "profile_overlap": v["overlap_slowdown"] * (columns["overlapped_comm_s"] + hidden_tp),
        "profile_sync": v["sync_per_doubling_s"] * np.log2(np.maximum(columns["num_gpus"], 1)),
        "profile_tp_overlap": -hidden_tp,
    }


def profile_floor_s(columns: dict, profile) -> np.ndarray:
    """A lower bound of the seconds ``profile``'s terms add to a step, read before any
    collective is priced: :func:`profile_parts` with no communication (``columns`` as there,
    without the two communication columns). The compute, kernel and synchronisation terms
    read no communication; the overlap term only adds (``overlap_slowdown ≥ 0``); the TP
    overlap term takes at most the TP exposed time (``tp_comm_overlap ≤ 1``), which the ideal
    step holds whole. So the ideal pipeline time plus this bounds the profiled step from
    below (:func:`planner.evaluate.time.step_time_floor`)."""
    if profile is None:
        return np.zeros(np.shape(columns["pipeline_time_s"]))
    values = {name: term.value for name, term in profile.terms.items()}
    silent = np.zeros(np.shape(columns["pipeline_time_s"]))
    parts = profile_parts({**columns, "overlapped_comm_s": silent, "tp_exposed_time_s": silent},
                          values)  # fmt: skip
    return sum(parts.values())


def profiled_step_time(columns: dict, values: dict[str, float]) -> np.ndarray:
    """The step time with the profile's terms added (seconds, per row)."""
    return columns["step_time_s"] + sum(profile_parts(columns, values).values())


#: Outputs that are per-second rates of the step: divided by the step's stretch.
RATE_OUTPUTS = ("tokens_per_s_per_gpu", "model_tflops_per_gpu", "hardware_tflops_per_gpu",
                "mfu", "mfu_causal", "hfu")  # fmt: skip


def apply_profile(out: dict, inputs: dict, profile) -> dict:
    """``out`` with the profile's inputs and, under ``profile``, its terms as breakdown lines
    (``profile_*_s``), the step time lengthened and the rates scaled down by as much."""
    out = {**out, **inputs}
    if profile is None:
        return out
    values = {name: term.value for name, term in profile.terms.items()}
    parts = profile_parts(out, values)
    step = out["step_time_s"] + sum(parts.values())
    ratio = out["step_time_s"] / step
    out.update({key: out[key] * ratio for key in RATE_OUTPUTS})
    out["bubble_fraction"] = out["pipeline_bubble_s"] / step
    out["ideal_step_time_s"] = out["step_time_s"]
    out["step_time_s"] = step
    out.update({f"{name}_s": value for name, value in parts.items()})
    return out


def profile_label(profile) -> str:
    """What every output says of the profile in use: ``none (the ideal model)``, the
    accelerator (and stack) it was fitted on, or whose it borrowed and why."""
    if profile is None:
        return "none (the ideal model)"
    name = profile.accelerator + (f" ({profile.stack})" if profile.stack else "")
    if profile.borrowed_from:
        name = f"{profile.borrowed_from}'s (nearest generation: no runs of this accelerator)"
    return name


def profile_intervals(profile, value: dict, peak_flops_per_s: float | None = None) -> dict:
    """The profile's name and the intervals of one evaluated row (empty without a profile):
    step time × the fit's held-out 10th and 90th percentiles of measured / predicted step
    time, tokens/s and MFU by the inverse. ``peak_flops_per_s``: the dense peak of the
    job's GEMM dtype; no step runs faster than its hardware FLOPs at that peak (the row's
    ``hardware_tflops_per_gpu`` over the step, counted causal — the share ``mfu_causal /
    mfu`` of it, which scales the recomputed FLOPs down too and so keeps it a lower bound),
    so the fast end stops there: a band whose 10th percentile ratio is low would otherwise
    promise an MFU no chip reaches."""
    if profile is None:
        return {}
    low, high = profile.fit.step_time_ratio_p10, profile.fit.step_time_ratio_p90
    step, tokens, mfu = (float(value[k]) for k in ("step_time_s", "tokens_per_s_per_gpu", "mfu"))
    fastest = step * low
    if peak_flops_per_s:
        causal = float(value["mfu_causal"]) / mfu if mfu > 0 else 1.0
        hardware_flops = float(value["hardware_tflops_per_gpu"]) * 1e12 * step * causal
        floor = hardware_flops / peak_flops_per_s
        fastest = min(max(fastest, floor), step)
    return {
        "profile": profile_label(profile),
        "step_time_interval_s": (fastest, step * high),
        "tokens_per_s_per_gpu_interval": (tokens / high, tokens * step / fastest),
        "mfu_interval": (mfu / high, mfu * step / fastest),
    }
