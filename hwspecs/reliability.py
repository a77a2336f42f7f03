"""Failure rates and the checkpoint/restart and facility defaults: one sourced TOML file
(``hwspecs/data/reliability.toml``)."""

from __future__ import annotations

from pydantic import Field, model_validator

from hwspecs.schema import SourcedSpec, SpecModel


class InterruptionCount(SpecModel):
    """Job interruptions observed over a training run: a rate per GPU-hour.

    ``count`` interruptions in ``days`` on ``num_gpus`` accelerators; the rate is
    ``count / (num_gpus · days · 24)``, an interruption rate per GPU-hour that a job of N
    GPUs multiplies by N (every GPU on the critical path of a synchronous job).
    """

    count: int = Field(ge=0)
    num_gpus: int = Field(ge=1)
    days: float = Field(gt=0)
    by_cause: dict[str, int] = Field(
        default_factory=dict, description="interruptions per root cause, as published"
    )

    def per_gpu_hour(self) -> float:
        """Interruptions per GPU-hour."""
        return self.count / (self.num_gpus * self.days * 24.0)


class Reliability(SourcedSpec):
    """Failure rates and the checkpoint/restart and facility defaults (one TOML file).

    ``interruptions`` maps an accelerator id (or ``default``) to a published count;
    an accelerator without its own entry takes ``default_interruptions`` and every output
    using it says so.
    """

    interruptions: dict[str, InterruptionCount] = Field(min_length=1)
    default_interruptions: str = Field(description="key of interruptions used when unsourced")
    storage_bytes_per_s_per_gpu: float = Field(gt=0)
    restart_time_s: float = Field(gt=0)
    power_usage_effectiveness: float = Field(ge=1.0)
    notes: str = ""

    @model_validator(mode="after")
    def _default_exists(self) -> Reliability:
        if self.default_interruptions not in self.interruptions:
            raise ValueError(
                f"default_interruptions '{self.default_interruptions}' is not a key of "
                "interruptions"
            )
        return self
