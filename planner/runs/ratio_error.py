"""The error of the ratio of two layouts' predicted step times, measured on published runs.

A choice between two layouts of one job reads the ratio of their predicted times, not the
times themselves: an error both share (a kernel the model times too fast on that chip, a
framework's fixed cost) cancels in the ratio. It is measured on pairs of runs that stand for
two layouts of one job: rows of one source family (one benchmark harness) on one
accelerator (a fit is per accelerator) training the same job — the same model, task
(pre-training, full fine-tuning or LoRA: a frozen base is another job), precision and
sequence length — in different configuration groups (another GPU count or layout; two
releases of one configuration are not two layouts). For a pair ``(i, j)`` the error is

    d_ij = | log(predicted_i / measured_i) − log(predicted_j / measured_j) |

(the log of the predicted over the measured ratio of their throughputs, which is the
inverse ratio of their step times), each pair weighted by the product of its rows'
``1/group size`` weights (:func:`planner.runs.fit._group_weights`). The band is
``exp(q) − 1`` with ``q`` the weighted 80th percentile of ``d``: the same coverage as the
step-time interval an estimate carries (the 10th–90th percentile of the held-out ratio),
so four pairs in five have their measured ratio within the band of the predicted one.

The profile's band reads each row's held-out prediction (the fit that left its source
out); the ideal model's band (``--profile none``) the ideal model's predictions of the
same rows, which were fitted on nothing.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel

#: Share of the pairs whose ratio error the band covers: the 10th–90th percentile of a
#: symmetric error, as the step-time interval (:class:`hwspecs.profile.ProfileFit`).
RATIO_COVERAGE = 0.8
UNIT = "fraction of the step-time ratio of two layouts"
METHOD = (
    "weighted 80th percentile of |log(predicted/measured ratio)| over pairs of rows of one "
    "source family and one job (model, task, precision, sequence length) in different "
    "configuration groups, pairs weighted 1/(group size) per row; band = exp(q) - 1"
)


class RatioError(BaseModel):
    """The band two layouts' predicted times must differ by to be told apart."""

    band: float | None
    num_pairs: int
    num_sources: int


def same_job_pairs(
    families: np.ndarray, jobs: np.ndarray, groups: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(i, j) with i < j: rows of one source family and one job in different groups."""
    i, j = np.triu_indices(len(families), 1)
    keep = (families[i] == families[j]) & (jobs[i] == jobs[j]) & (groups[i] != groups[j])
    return i[keep], j[keep]


def weighted_quantile(values: np.ndarray, weights: np.ndarray, share: float) -> float:
    """The smallest value whose cumulative weight reaches ``share`` of the total."""
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order]) / weights.sum()
    return float(values[order][min(np.searchsorted(cumulative, share), len(values) - 1)])


def ratio_error(
    predicted_tokens: np.ndarray,
    measured_tokens: np.ndarray,
    weights: np.ndarray,
    families: np.ndarray,
    jobs: np.ndarray,
    groups: np.ndarray,
) -> RatioError:
    """The band of :data:`RATIO_COVERAGE` of the same-job pairs (None without a pair)."""
    i, j = same_job_pairs(np.asarray(families), np.asarray(jobs), np.asarray(groups))
    if not len(i):
        return RatioError(band=None, num_pairs=0, num_sources=0)
    error = np.log(np.asarray(predicted_tokens) / np.asarray(measured_tokens))
    spread = np.abs(error[i] - error[j])
    q = weighted_quantile(spread, weights[i] * weights[j], RATIO_COVERAGE)
    return RatioError(
        band=float(np.expm1(q)), num_pairs=len(i), num_sources=len(set(families[i].tolist()))
    )


def ratio_error_fields(held_out, ideal, measured, weights, families, jobs, groups) -> dict:
    """What a profile stores (``[fit.ratio_error]``): the band of the held-out (profiled)
    predictions and of the ideal model's, their pairs, unit and method."""
    fitted = ratio_error(held_out, measured, weights, families, jobs, groups)
    bare = ratio_error(ideal, measured, weights, families, jobs, groups)
    if fitted.band is None:
        return {}
    return {
        "band": round(fitted.band, 4),
        "ideal_band": round(bare.band, 4),
        "num_pairs": fitted.num_pairs,
        "num_sources": fitted.num_sources,
        "coverage": RATIO_COVERAGE,
        "unit": UNIT,
        "method": METHOD,
    }


def ranking_band(accelerator: str, profile) -> tuple[float | None, str]:
    """(band, where it was measured) for a search on ``accelerator`` under ``profile`` (an
    :class:`~hwspecs.profile.EfficiencyProfile`, None for the ideal model): the profile's
    own ratio error; the ideal model's takes the ideal band measured on the runs of the
    accelerator's shipped profile (or its generation's). None when none was measured."""
    from planner.runs.profiles import profile_for

    if profile is not None:
        found = profile.fit.ratio_error
        if found is None:
            return None, f"profile {profile.accelerator} has no measured ratio error"
        name = profile.borrowed_from or profile.accelerator
        return found.band, (
            f"{name} profile's ratio error, held-out, {found.num_pairs} pairs of runs"
        )
    shipped = profile_for(accelerator)
    found = shipped.fit.ratio_error if shipped is not None else None
    if found is None or found.ideal_band is None:
        return None, f"no measured ratio error of the ideal model on {accelerator}"
    name = shipped.borrowed_from or shipped.accelerator
    return found.ideal_band, f"ideal model's ratio error on {found.num_pairs} pairs of {name} runs"
