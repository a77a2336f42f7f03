"""How far a profile's error holds beyond the layouts it was fitted on.

A profile's cross-validated error is measured on held-out *sources* whose layouts resemble
the training rows'; a plan may rank layouts no run came near (:mod:`planner.layout_range`).
This module measures what such an extrapolation costs on the runs themselves: split one
accelerator's rows at a degree (e.g. pp ≤ 4 against pp > 4), fit the whole profile — term
selection included — on the rows inside, and predict the rows beyond. Beside it, the same
rows' error when the fit had seen layouts like theirs and left out only their source (the
leave-one-source-out prediction of the whole procedure on every other source's rows, term
selection included). The difference is the price of
extrapolating along that axis, on the rows that exist.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel

from planner.runs.check import RowPrediction
from planner.runs.fit import fitted_terms_of, held_out_predictions, mape, predicted_tokens_of

#: The splits measured: a name, the rows inside (a predicate on a row's layout and GPU
#: count) and what lies beyond, in words.
SPLITS = {
    "tp": (lambda layout, gpus: layout["tp"] <= 4, "tp ≤ 4 → tp 8"),
    "pp": (lambda layout, gpus: layout["pp"] <= 4, "pp ≤ 4 → pp > 4"),
    "cp": (lambda layout, gpus: layout["cp"] == 1, "cp 1 → cp > 1"),
    "ep": (lambda layout, gpus: layout["ep"] <= 8, "ep ≤ 8 → ep > 8"),
    "gpus": (lambda layout, gpus: gpus <= 256, "≤ 256 GPUs → more"),
}
#: Fewest rows beyond a split, and sources inside it, for the split to be measured.
MIN_BEYOND = 5
MIN_SOURCES_INSIDE = 2


class SplitExtrapolation(BaseModel):
    """One split: the rows beyond it, predicted by a fit on the rows inside (extrapolated)
    and by the fit on every row with their source left out (interpolated)."""

    split: str
    description: str
    num_inside: int
    num_beyond: int
    sources_beyond: int
    #: MAPE of the rows beyond, the fit on the rows inside predicting them.
    extrapolated_mape: float
    #: Their MAPE held out by source from the fit on every row.
    interpolated_mape: float
    #: Median signed error of the extrapolated predictions (predicted / measured − 1).
    extrapolated_median_error: float
    fitted_terms_inside: list[str]


def extrapolation_errors(
    rows: list[RowPrediction], splits: dict | None = None
) -> list[SplitExtrapolation]:
    """Each measurable split of ``rows`` (covered ideal-model predictions of one accelerator,
    as ``llmplan fit`` takes them): see the module docstring."""
    splits = SPLITS if splits is None else splits
    families = np.array([r.source_family for r in rows])
    interpolated = held_out_predictions(rows, families)
    measured = np.array([r.measured_tokens_per_s_per_gpu for r in rows])
    found = []
    for name, (inside_of, description) in splits.items():
        inside = np.array([bool(inside_of(r.layout, r.num_gpus)) for r in rows])
        beyond = np.flatnonzero(~inside)
        kept = [rows[i] for i in np.flatnonzero(inside)]
        if len(beyond) < MIN_BEYOND or len({r.source_family for r in kept}) < MIN_SOURCES_INSIDE:
            continue
        names, values = fitted_terms_of(kept)
        predicted = predicted_tokens_of([rows[i] for i in beyond], values)
        errors = predicted / measured[beyond] - 1
        found.append(
            SplitExtrapolation(
                split=name,
                description=description,
                num_inside=len(kept),
                num_beyond=len(beyond),
                sources_beyond=len({rows[i].source_family for i in beyond}),
                extrapolated_mape=mape(predicted, measured[beyond]),
                interpolated_mape=mape(interpolated[beyond], measured[beyond]),
                extrapolated_median_error=float(np.median(errors)),
                fitted_terms_inside=names,
            )
        )
    return found
