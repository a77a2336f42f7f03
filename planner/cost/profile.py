"""What real steps lose between and around kernels: a fitted profile's terms, on columns.

The ideal model times every GEMM at the best-shape MAMF, everything else at roofline and
collectives by alpha-beta. An :class:`~hwspecs.profile.EfficiencyProfile` adds the few
terms micro-benchmarks cannot show, each its own line of the step's breakdown:

* ``compute_efficiency_bf16`` / ``compute_efficiency_fp8`` (fraction of the ideal rate,
  0.3–1 / 0.2–1): the sustained share of the ideal compute time a whole model reaches
  (shapes between the best and the worst, norms and glue kernels, power and clocks under
  load); FP8 has its own since its scaling, casts and amax reductions cost what BF16's do not.
* ``thin_gemm_half_width`` (elements, 0–8192): GEMMs whose split width ``hidden/tp`` is
  small run below MAMF; efficiency falls as ``x / (x + half_width)`` with ``x = hidden/tp``
  (a saturating occupancy curve: at ``x = half_width`` half the rate is reached).
* ``kernel_overhead_s`` (s per kernel, 0–50 µs): a fixed launch and tail cost per kernel,
  times the kernels the busiest rank launches per step (a layer's operations per pass from
  :func:`planner.op_counts.layer_pass_ops`, × layers per stage × micro-batches).
* ``overlap_slowdown`` (fraction, 0–1): compute slowed while collectives overlap it
  (communication kernels take SMs and HBM bandwidth): this share of the overlapped
  communication time is added.
* ``collective_efficiency`` (fraction, 0.2–1): achieved over modelled bandwidth of the
  exposed collectives at scale (congestion, stragglers, algorithm switch points).
* ``sync_per_doubling_s`` (s, 0–50 ms): a synchronisation cost per step growing with the
  log of the ranks the step waits for (barriers, the slowest rank of a collective tree).

Compute-side terms scale with the pipeline's stretch (``pipeline_time / busy``) since the
bubble is made of the same stage times. Ideal values (1, 1, 0, 0, 0, 1, 0) leave every
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
    "thin_gemm_half_width": Term(
        "elements", 0.0, 8192.0, 0.0, "hidden/tp at which GEMMs reach half their rate"
    ),
    "kernel_overhead_s": Term("s/kernel", 0.0, 5e-5, 0.0, "fixed launch and tail cost per kernel"),
    "overlap_slowdown": Term(
        "fraction", 0.0, 1.0, 0.0, "share of overlapped communication time compute loses"
    ),
    "collective_efficiency": Term(
        "fraction", 0.2, 1.0, 1.0, "achieved over modelled bandwidth of exposed collectives"
    ),
    "sync_per_doubling_s": Term(
        "s", 0.0, 0.05, 0.0, "synchronisation per step per doubling of the ranks waited for"
    ),
}
TERM_NAMES = tuple(TERMS)
#: Breakdown lines the profile adds (seconds per step).
PROFILE_PARTS = ("profile_compute", "profile_kernels", "profile_overlap", "profile_collectives",
                 "profile_sync")  # fmt: skip


def ideal_values() -> dict[str, float]:
    """Every term at the value that leaves the ideal model unchanged."""
    return {name: term.ideal for name, term in TERMS.items()}


def kernels_per_layer(model) -> float:
    """Operations one layer launches per micro-batch (forward, input and weight gradient),
    averaged over the model's dense and MoE layers (:func:`planner.op_counts.layer_pass_ops`)."""
    from planner.op_counts import layer_pass_ops

    dense = sum(layer_pass_ops(model, moe_layer=False))
    if not model.is_moe:
        return float(dense)
    moe = sum(layer_pass_ops(model, moe_layer=True))
    num_dense = model.num_dense_layers
    return float((dense * num_dense + moe * (model.num_layers - num_dense)) / model.num_layers)


def profile_inputs(job, tp, pp, m, num_gpus, comm_s, exposed_comm_s) -> dict[str, np.ndarray]:
    """The columns the terms read, from a row's layout and its ideal communication times
    (``comm_s``: every axis's collective time per step; ``exposed_comm_s``: what of it the
    step waits for)."""
    model = job.model
    layers_per_rank = np.ceil(model.num_layers / pp)
    return {
        "kernels_per_step": m * layers_per_rank * kernels_per_layer(model),
        "hidden_per_tp": model.hidden_size / tp,
        "overlapped_comm_s": np.maximum(comm_s - exposed_comm_s, 0.0),
        "num_gpus": num_gpus * 1.0,
        "fp8": np.full(np.shape(tp), job.precision.gemm_dtype == "fp8"),
    }


def profile_parts(columns: dict, values: dict[str, float]) -> dict[str, np.ndarray]:
    """Seconds each term adds to a step, per row. ``columns``: the ideal step's
    ``compute_s``, ``recompute_s``, ``pipeline_time_s``, ``exposed_comm_s`` and
    :func:`profile_inputs`; ``values``: one value per term (missing terms: ideal)."""
    v = {**ideal_values(), **values}
    busy = columns["compute_s"] + columns["recompute_s"]
    with np.errstate(divide="ignore", invalid="ignore"):
        stretch = np.where(busy > 0, columns["pipeline_time_s"] / busy, 1.0)
    width = columns["hidden_per_tp"]
    shape_efficiency = width / (width + v["thin_gemm_half_width"])
    sustained = np.where(columns["fp8"], v["compute_efficiency_fp8"], v["compute_efficiency_bf16"])
    efficiency = sustained * shape_efficiency
    return {
        "profile_compute": busy * (1 / efficiency - 1) * stretch,
        "profile_kernels": columns["kernels_per_step"] * v["kernel_overhead_s"] * stretch,
        "profile_overlap": v["overlap_slowdown"] * columns["overlapped_comm_s"],
        "profile_collectives": columns["exposed_comm_s"] * (1 / v["collective_efficiency"] - 1),
        "profile_sync": v["sync_per_doubling_s"] * np.log2(np.maximum(columns["num_gpus"], 1)),
    }


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
