"""Efficiency profiles as data: the few fitted terms ideal figures cannot show.

A profile belongs to one accelerator (optionally one software stack) and is fitted by
``llmplan fit`` on published runs (``hwspecs/data/profiles/<accelerator>.toml``). Each
term is a quantity a practitioner would name, with its unit and the physical range the fit
was bounded to; the fit records the training rows' ids, the cross-validated errors, the
command and the date. The terms' meaning and how they enter the step time are in
:mod:`planner.cost.profile`; this module only holds the data.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ProfileTerm(BaseModel):
    """One fitted term: its value, unit and the bounds it was fitted within."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    value: float
    unit: str
    lower: float
    upper: float

    @model_validator(mode="after")
    def _within_bounds(self) -> ProfileTerm:
        if not self.lower <= self.value <= self.upper:
            raise ValueError(f"value {self.value} outside its bounds [{self.lower}, {self.upper}]")
        return self


class RatioErrorFit(BaseModel):
    """The error of the ratio of two layouts' predicted step times (the band the search
    ranks under; :mod:`planner.runs.ratio_error`): the profile's (held-out predictions) and
    the ideal model's, on the same pairs of runs."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    band: float = Field(ge=0)
    ideal_band: float | None = Field(None, ge=0)
    num_pairs: int = Field(ge=1)
    num_sources: int = Field(ge=1)
    coverage: float = Field(0.8, gt=0, lt=1)
    unit: str = ""
    method: str = ""


class LayoutRange(BaseModel):
    """How far the training runs reached (``planner.layout_range``): each parallel degree's
    largest value over the runs' layouts, the fewest tokens of its sequence a CP rank held
    (None: no run used CP), the most GPUs, and the largest share of a step's model FLOPs
    the attention core took (None: a profile fitted before it was recorded). Outside it,
    no measured error speaks for a layout, and beyond the attention share the profile's
    attention term is extrapolated."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    tp: int = Field(ge=1)
    cp: int = Field(ge=1)
    pp: int = Field(ge=1)
    ep: int = Field(ge=1)
    cp_tokens_per_rank: int | None = Field(None, ge=1)
    num_gpus: int = Field(ge=1)
    num_runs: int = Field(ge=1)
    attention_share: float | None = Field(None, ge=0.0, le=1.0)


class ProfileFit(BaseModel):
    """How a profile was fitted and how well it predicts rows it was not fitted on (fields a
    later ``llmplan fit`` adds are kept, so an older checkout still reads a newer profile)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    command: str
    date: str
    training_ids: list[str]
    num_rows: int
    num_groups: int
    in_sample_mape: float
    #: True where every held-out error repeats the term selection inside its fold (nested
    #: cross-validation); False in a profile fitted before: its terms were selected on all
    #: rows, so its held-out errors and band are optimistic.
    held_out_selects_terms: bool = False
    kfold_mape: float | None = None
    loso_mape: float | None = None
    loso_mape_by_source: dict[str, float] = Field(default_factory=dict)
    #: Measured over predicted step time under cross-validation: the 10th and 90th
    #: percentiles of the ratio, the band an estimate carries.
    step_time_ratio_p10: float = 1.0
    step_time_ratio_p90: float = 1.0
    #: Absent from a profile fitted before it was measured: the search then ranks by time.
    ratio_error: RatioErrorFit | None = None
    #: Each fitted term's [lowest, highest] value over refits leaving one model's runs out
    #: (``planner.runs.fit.term_ranges_one_model_out``): a wide span marks a term resting on
    #: few models. Empty with one model, or in a profile fitted before it was measured.
    term_range_one_model_out: dict[str, list[float]] = Field(default_factory=dict)
    #: The layouts the training runs covered; None in a profile fitted before it was
    #: recorded (no layout is then marked outside).
    layout_range: LayoutRange | None = None


class EfficiencyProfile(BaseModel):
    """The fitted terms of one accelerator (and stack) with their provenance (extra fields a
    later ``llmplan fit`` writes are kept)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    accelerator: str
    stack: str | None = None
    terms: dict[str, ProfileTerm]
    fit: ProfileFit
    notes: str = ""
    borrowed_from: str | None = Field(
        None,
        description="set when this accelerator has no runs of its own and takes the "
        "nearest generation's profile: the accelerator it was fitted on",
    )
