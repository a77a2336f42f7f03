"""Time-to-train flags and output shared by `llmplan plan` and `llmplan estimate`.

``--train-tokens`` (``15T``, ``2e12``) adds wall-clock days, GPU-hours, cluster tokens/s,
energy and goodput under failures; ``--gpu-hour-cost`` (currency-free) adds the cost.
"""

from __future__ import annotations

from typing import Annotated

from commands.flags import Name, Number, option

TrainTokensFlag = Annotated[
    str | None,
    option(
        Name("a token count, e.g. 15T, 15.6T, 300B or 2e12"),
        "token budget to train, in tokens (e.g. 15T, 15.6T, 300B, 2e12): adds days, "
        "GPU-hours, energy, cost and goodput under failures",
    ),
]
GpuHourCostFlag = Annotated[
    float | None,
    option(Number(0), "price of one GPU-hour (any currency, per GPU-hour): adds the cost"),
]


def build_training(cluster: str, train_tokens: str | None, gpu_hour_cost: float | None):
    """The run's TrainingRun, or None without --train-tokens (--gpu-hour-cost needs it)."""
    from hwspecs.errors import PlanError
    from planner import api

    if train_tokens is None:
        if gpu_hour_cost is not None:
            raise PlanError("--gpu-hour-cost needs --train-tokens (e.g. 15T or 2e12)")
        return None
    return api.build_training(cluster, train_tokens, gpu_hour_cost)


def summary_line(section: dict) -> str:
    """One line: days, GPU-hours, energy, cost, goodput and its parts."""
    parts = section["goodput_breakdown"]
    energy = section["energy_kwh"]
    cost = section["cost"]
    return (
        f"time to train {section['train_tokens']:.4g} tokens: {section['wall_time_days']:.1f} "
        f"days, {section['gpu_hours'] / 1e6:.2f}M GPU-hours"
        + (f", {energy / 1e3:,.0f} MWh" if energy is not None else "")
        + (f", cost {cost:,.0f}" if cost is not None else "")
        + f", {section['cluster_tokens_per_s'] / 1e6:.2f}M tokens/s; goodput "
        f"{100 * section['goodput']:.1f}% (checkpoints {100 * parts['checkpoint_writes']:.1f}%, "
        f"lost work {100 * parts['lost_work']:.1f}%, restarts {100 * parts['restarts']:.1f}%; "
        f"checkpoint every {section['checkpoint_interval_s']:.0f} s)"
    )
