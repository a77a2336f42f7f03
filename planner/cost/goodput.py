"""Time to train a token budget under failures: checkpoints, lost work, restarts, energy.

A synchronous job of N GPUs stops whenever any of them does, so job interruptions arrive
as a Poisson process of rate ``N · λ`` with ``λ`` interruptions per GPU-hour (Llama 3
paper §3.3.4, Table 5: 466 interruptions in 54 days on 16,384 H100s). The job writes a
checkpoint every ``τ`` seconds of useful work; a write takes ``δ`` seconds (every rank
writes its share of the model states at once, sharing the storage bandwidth: Llama 3
§3.3.1); an interruption loses the work since the last checkpoint and costs a restart of
``R`` seconds. Daly 2006 (FGCS 22(3), §3's complete model) gives the expected wall time of ``T_s``
seconds of work under that model,

    T_w = M · e^{R/M} · (e^{(τ+δ)/M} − 1) · T_s / τ,      M = 1 / (N λ),

and the interval that minimises it: Young 1974's first-order ``τ = sqrt(2 δ M)`` and
Daly's higher-order ``τ = sqrt(2 δ M) · [1 + sqrt(δ/2M)/3 + (δ/2M)/9] − δ`` for
``δ < 2M`` (else ``τ = M``). Goodput is ``T_s / T_w``. Every function takes numpy
columns (or floats), so the search ranks many layouts with the same code that reports one.
"""

from __future__ import annotations

import math
import re

import numpy as np
from pydantic import BaseModel

from hwspecs.errors import PlanError

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0
#: Suffixes of a token count: thousand, million, billion (B or G), trillion, quadrillion.
TOKEN_SUFFIXES = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}
GOODPUT_PARTS = ("useful", "checkpoint_writes", "lost_work", "restarts")


def parse_token_count(text: str | float | int) -> float:
    """A token count from ``15T``, ``15.6T``, ``2e12``, ``300B`` or ``1_000_000``."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = re.fullmatch(r"\s*([0-9][0-9_,]*\.?[0-9]*(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]?)\s*",
                             str(text))  # fmt: skip
        suffix = match.group(2).upper() if match else None
        if match is None or suffix not in TOKEN_SUFFIXES:
            raise PlanError(
                f"--train-tokens: cannot read '{text}'; give a number like 15T, 15.6T, 300B "
                f"or 2e12 (suffixes {', '.join(s for s in TOKEN_SUFFIXES if s)})"
            )
        value = float(match.group(1).replace("_", "").replace(",", "")) * TOKEN_SUFFIXES[suffix]
    if not math.isfinite(value) or value <= 0:
        raise PlanError(f"--train-tokens must be a positive number of tokens, got '{text}'")
    return value


def mean_time_between_interruptions_s(interruptions_per_gpu_hour: float, num_gpus) -> np.ndarray:
    """M = 1 / (N λ) in seconds: any of the job's N GPUs stops the synchronous job."""
    rate_per_s = np.asarray(num_gpus, dtype=float) * interruptions_per_gpu_hour / SECONDS_PER_HOUR
    with np.errstate(divide="ignore"):
        return np.where(rate_per_s > 0, 1.0 / np.maximum(rate_per_s, 1e-300), np.inf)


def checkpoint_write_time_s(checkpoint_bytes_per_rank, num_gpus, storage_bytes_per_s: float):
    """δ: every rank writes its share at once over the storage's aggregate bandwidth, so the
    rank with the largest share decides: ``max_rank bytes · N / bandwidth`` (Llama 3 §3.3.1:
    checkpoint writes saturate the storage fabric in bursts)."""
    return np.asarray(checkpoint_bytes_per_rank, dtype=float) * num_gpus / storage_bytes_per_s


def young_interval_s(checkpoint_s, mtbf_s):
    """Young 1974 (CACM 17(9)): the first-order optimum compute time between checkpoints,
    ``sqrt(2 · δ · M)``."""
    return np.sqrt(2.0 * np.asarray(checkpoint_s, dtype=float) * mtbf_s)


def daly_interval_s(checkpoint_s, mtbf_s):
    """Daly 2006 (FGCS 22(3), §4, the higher-order perturbation solution):
    ``sqrt(2δM)·[1 + sqrt(δ/2M)/3 + (δ/2M)/9] − δ`` for ``δ < 2M``, else ``M``. A free
    checkpoint (δ = 0) gives 0: save every step."""
    delta = np.asarray(checkpoint_s, dtype=float)
    mtbf = np.asarray(mtbf_s, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(np.isfinite(mtbf), delta / (2.0 * mtbf), 0.0)
        series = np.sqrt(2.0 * delta * mtbf) * (1 + np.sqrt(ratio) / 3 + ratio / 9) - delta
    return np.where(ratio < 1.0, series, mtbf)


def segment_wall_time_s(interval_s, checkpoint_s, restart_s, mtbf_s):
    """Expected wall time of one compute interval and its checkpoint write, restarts and
    lost work included: ``M · e^{R/M} · (e^{(τ+δ)/M} − 1)`` (Daly 2006's complete model, per
    segment);
    ``τ + δ`` without interruptions (M infinite)."""
    work = np.asarray(interval_s, dtype=float) + checkpoint_s
    mtbf = np.asarray(mtbf_s, dtype=float)
    finite = np.isfinite(mtbf)
    m = np.where(finite, mtbf, 1.0)
    with np.errstate(over="ignore", invalid="ignore"):
        failing = m * np.exp(restart_s / m) * np.expm1(work / m)
    return np.where(finite, failing, work)


def goodput_parts(interval_s, checkpoint_s, restart_s, mtbf_s) -> dict[str, np.ndarray]:
    """Fractions of wall time per part of Daly's model, summing to 1.

    Per segment of ``L = τ + δ``: attempts fail ``e^{L/M} − 1`` times on average; each failed
    attempt loses its partial run (``(e^{L/M} − 1)·M − L`` in all: lost work, partial
    checkpoint writes included) and is followed by a restart that may itself be interrupted
    (``M (e^{R/M} − 1)`` each); the successful attempt is ``τ`` useful and ``δ`` writing.
    """
    tau = np.asarray(interval_s, dtype=float)
    delta = np.asarray(checkpoint_s, dtype=float)
    total = segment_wall_time_s(tau, delta, restart_s, mtbf_s)
    mtbf = np.asarray(mtbf_s, dtype=float)
    finite = np.isfinite(mtbf)
    m = np.where(finite, mtbf, 1.0)
    failures = np.where(finite, np.expm1((tau + delta) / m), 0.0)
    restarts = np.where(finite, failures * m * np.expm1(restart_s / m), 0.0)
    lost = np.where(finite, failures * m - (tau + delta), 0.0)
    return {
        "useful": tau / total,
        "checkpoint_writes": delta / total,
        "lost_work": np.maximum(lost, 0.0) / total,
        "restarts": restarts / total,
    }


class TrainingRun(BaseModel):
    """What a time-to-train estimate needs beyond the step: budget and reliability figures.

    Built by :func:`planner.api.build_training` from the catalog (each figure with its
    source; ``notes`` lists the defaults in use)."""

    train_tokens: float
    gpu_hour_cost: float | None = None
    interruptions_per_gpu_hour: float
    storage_bytes_per_s: float
    restart_time_s: float
    power_usage_effectiveness: float
    tdp_w: float | None = None
    sources: dict[str, str] = {}
    notes: list[str] = []


def time_to_train_columns(
    step_time_s,
    checkpoint_bytes_per_rank,
    num_gpus,
    global_batch_tokens,
    run: TrainingRun,
) -> dict[str, np.ndarray]:
    """Every time-to-train quantity per row: steps, useful and wall time, goodput and parts.

    The checkpoint interval is Daly's optimum rounded to a whole number of steps (a job
    saves between steps), at least one step. ``global_batch_tokens``: tokens per step (a
    number or a column)."""
    step = np.asarray(step_time_s, dtype=float)
    num_steps = np.ceil(run.train_tokens / np.asarray(global_batch_tokens, dtype=float))
    useful = num_steps * step
    mtbf = mean_time_between_interruptions_s(run.interruptions_per_gpu_hour, num_gpus)
    delta = checkpoint_write_time_s(checkpoint_bytes_per_rank, num_gpus, run.storage_bytes_per_s)
    optimum = daly_interval_s(delta, mtbf)
    with np.errstate(invalid="ignore"):
        steps_between = np.clip(np.round(optimum / step), 1, np.maximum(num_steps, 1))
    interval = steps_between * step
    segment = segment_wall_time_s(interval, delta, run.restart_time_s, mtbf)
    wall = segment * useful / interval
    parts = goodput_parts(interval, delta, run.restart_time_s, mtbf)
    return {
        "num_steps": np.broadcast_to(num_steps, np.shape(step)),
        "useful_time_s": useful,
        "wall_time_s": wall,
        "goodput": useful / wall,
        "mtbf_s": np.broadcast_to(mtbf, np.shape(step)),
        "checkpoint_write_s": delta,
        "young_interval_s": young_interval_s(delta, mtbf),
        "daly_interval_s": optimum,
        "checkpoint_interval_s": interval,
        "checkpoint_interval_steps": steps_between,
        **{f"goodput_{name}": value for name, value in parts.items()},
    }


class TimeToTrain(BaseModel):
    """Time, GPU-hours, energy and cost of a token budget, with goodput and its parts."""

    train_tokens: float
    num_steps: int
    cluster_tokens_per_s: float
    useful_time_s: float
    wall_time_s: float
    wall_time_days: float
    gpu_hours: float
    energy_kwh: float | None
    cost: float | None
    goodput: float
    goodput_breakdown: dict[str, float]
    checkpoint_bytes_per_rank: float
    checkpoint_write_s: float
    checkpoint_interval_s: float
    checkpoint_interval_steps: int
    young_interval_s: float
    mean_time_between_interruptions_s: float
    expected_interruptions: float
    interruptions_per_gpu_hour: float
    restart_time_s: float
    storage_bytes_per_s: float
    power_usage_effectiveness: float
    tdp_w: float | None
    sources: dict[str, str]
    notes: list[str]


def time_to_train(
    step_time_s: float,
    checkpoint_bytes_per_rank: float,
    num_gpus: int,
    global_batch_tokens: float,
    run: TrainingRun,
) -> TimeToTrain:
    """One layout's time to train (the 1-row view of :func:`time_to_train_columns`).

    Energy: ``TDP · N · wall time · PUE`` (an upper bound on the GPUs' draw, hosts and
    network outside the PUE not counted); None where the catalog has no TDP."""
    row = {
        key: float(np.asarray(value).reshape(-1)[0])
        for key, value in time_to_train_columns(
            [step_time_s], [checkpoint_bytes_per_rank], num_gpus, global_batch_tokens, run
        ).items()
    }
    wall = row["wall_time_s"]
    gpu_hours = wall * num_gpus / SECONDS_PER_HOUR
    energy = (
        run.tdp_w * num_gpus * wall / SECONDS_PER_HOUR * run.power_usage_effectiveness / 1e3
        if run.tdp_w
        else None
    )
    notes = list(run.notes)
    if energy is None:
        notes.append("energy: the accelerator has no TDP in the catalog")
    return TimeToTrain(
        train_tokens=run.train_tokens,
        num_steps=int(row["num_steps"]),
        cluster_tokens_per_s=global_batch_tokens / step_time_s,
        useful_time_s=row["useful_time_s"],
        wall_time_s=wall,
        wall_time_days=wall / SECONDS_PER_DAY,
        gpu_hours=gpu_hours,
        energy_kwh=energy,
        cost=gpu_hours * run.gpu_hour_cost if run.gpu_hour_cost is not None else None,
        goodput=row["goodput"],
        goodput_breakdown={name: row[f"goodput_{name}"] for name in GOODPUT_PARTS},
        checkpoint_bytes_per_rank=checkpoint_bytes_per_rank,
        checkpoint_write_s=row["checkpoint_write_s"],
        checkpoint_interval_s=row["checkpoint_interval_s"],
        checkpoint_interval_steps=int(row["checkpoint_interval_steps"]),
        young_interval_s=row["young_interval_s"],
        mean_time_between_interruptions_s=row["mtbf_s"],
        expected_interruptions=wall / row["mtbf_s"],
        interruptions_per_gpu_hour=run.interruptions_per_gpu_hour,
        restart_time_s=run.restart_time_s,
        storage_bytes_per_s=run.storage_bytes_per_s,
        power_usage_effectiveness=run.power_usage_effectiveness,
        tdp_w=run.tdp_w,
        sources=run.sources,
        notes=notes,
    )


def explain_time_to_train(section: TimeToTrain) -> list[str]:
    """``--explain`` lines: each time-to-train term with its formula, numbers and source."""
    s = section
    parts = s.goodput_breakdown
    lines = [
        f"time to train {s.train_tokens:.4g} tokens: {s.num_steps:,} steps × step = "
        f"{s.useful_time_s / SECONDS_PER_DAY:.2f} days of useful work at "
        f"{s.cluster_tokens_per_s:,.0f} tokens/s on the cluster",
        f"interruptions: λ = {s.interruptions_per_gpu_hour:.3g} per GPU-hour; "
        f"M = 1/(N·λ) = {s.mean_time_between_interruptions_s / SECONDS_PER_HOUR:.2f} h",
        f"checkpoint: {s.checkpoint_bytes_per_rank / 1e9:.3f} GB per rank (weights, master "
        f"weights, optimizer states; replicas split over the data-parallel group and "
        f"DualPipe's copies) × N / "
        f"{s.storage_bytes_per_s / 1e12:.3g} TB/s storage = δ {s.checkpoint_write_s:.2f} s",
        f"interval: Young sqrt(2δM) = {s.young_interval_s:.0f} s; Daly 2006 higher order, "
        f"rounded to whole steps: τ = {s.checkpoint_interval_s:.0f} s "
        f"({s.checkpoint_interval_steps} steps)",
        f"restart R = {s.restart_time_s:.0f} s",
        f"wall time = M·e^(R/M)·(e^((τ+δ)/M) − 1)·T_s/τ (Daly 2006) = "
        f"{s.wall_time_days:.2f} days, "
        f"~{s.expected_interruptions:,.0f} interruptions expected",
        f"goodput {100 * s.goodput:.1f}%: checkpoint writes "
        f"{100 * parts['checkpoint_writes']:.2f}%, "
        f"lost work {100 * parts['lost_work']:.2f}%, restarts {100 * parts['restarts']:.2f}% "
        f"of wall time",
        f"GPU-hours = wall × N = {s.gpu_hours:,.0f}"
        + (f"; cost = GPU-hours × {s.cost / s.gpu_hours:g} = {s.cost:,.0f}" if s.cost else ""),
    ]
    if s.energy_kwh is not None:
        lines.append(
            f"energy = TDP {s.tdp_w:.0f} W × N × wall × PUE {s.power_usage_effectiveness} = "
            f"{s.energy_kwh / 1e3:,.0f} MWh (GPU TDP as an upper bound)"
        )
    lines += [f"source of {name}: {text}" for name, text in s.sources.items()]
    lines += [f"note: {note}" for note in s.notes]
    return lines
