"""Fit an efficiency profile to measured runs, and say how well it predicts unseen ones.

The rows are first predicted with the ideal model (:func:`planner.runs.check.predict_row`
without a profile), which fixes each row's layout and its ideal breakdown; the profile's
terms (:mod:`planner.cost.profile`) then lengthen each step in closed form, so the fit
works on those columns. The loss is robust least squares (``scipy.optimize.least_squares``,
soft-L1) on log throughput, each row weighted by 1/size of its configuration group (one
configuration measured under several software releases counts once). Terms are bounded to
their physical ranges; terms no row can inform (FP8 efficiency without FP8 rows) stay ideal.

Cross-validation splits by source family (a publisher's harness), never by row: k-fold
over families and leave-one-source-out, both reported per family. Each fold repeats the
whole procedure on the rows it keeps, term selection included (nested cross-validation,
Varma and Simon 2006, "Bias in error estimation when using cross-validation for model
selection"): selecting the terms on every row and then holding rows out would judge the
selection on rows that chose it. The held-out ratios of measured to predicted step time
give the interval an estimate carries (10th–90th percentile) and the ratio error the search
ranks under.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel

from planner.cost.profile import TERMS, profiled_step_time
from planner.layout_range import layout_range_of
from planner.runs.check import FEATURE_COLUMNS, RowPrediction
from planner.runs.ratio_error import ratio_error_fields

#: Interior start of each term (the ideal values sit on their bounds).
START = {
    "compute_efficiency_bf16": 0.8,
    "compute_efficiency_fp8": 0.7,
    "compute_efficiency_fp4": 0.7,
    "expert_gemm_half_width": 256.0,
    "attention_efficiency": 0.8,
    "kernel_overhead_s": 2e-6,
    "overlap_slowdown": 0.1,
    "sync_per_doubling_s": 1e-3,
    "tp_comm_overlap": 0.3,
}
#: The most terms one profile fits (per accelerator and stack): the selection stops there.
MAX_FITTED_TERMS = 8
#: Soft-L1 scale on log throughput: residuals beyond ~15% count linearly, not squared.
ROBUST_SCALE = 0.15
NUM_FOLDS = 5


class FitResult(BaseModel):
    """Fitted values, the rows used, and in-sample and cross-validated errors."""

    accelerator: str
    stack: str | None
    values: dict[str, float]
    fitted_terms: list[str]
    #: The terms the rows could inform (:func:`informed_terms`); those of them not fitted
    #: did not lower the held-out error (:func:`terms_that_earn_their_place`).
    informed_terms: list[str] = []
    training_ids: list[str]
    num_rows: int
    num_groups: int
    in_sample_mape: float
    kfold_mape: float | None
    loso_mape: float | None
    loso_mape_by_source: dict[str, float]
    in_sample_mape_by_source: dict[str, float]
    step_time_ratio_p10: float
    step_time_ratio_p90: float
    ideal_mape: float
    #: The error of two layouts' time ratio (:mod:`planner.runs.ratio_error`); {} without pairs.
    ratio_error: dict = {}
    #: Each fitted term's [lowest, highest] value over refits leaving one model's rows out
    #: (:func:`term_ranges_one_model_out`); {} with one model.
    term_range_one_model_out: dict[str, list[float]] = {}
    #: How far the rows' layouts reached (:func:`planner.layout_range.layout_range_of`).
    layout_range: dict = {}


def _columns(rows: list[RowPrediction]) -> dict[str, np.ndarray]:
    cols = {key: np.array([r.features[key] for r in rows]) for key in FEATURE_COLUMNS}
    cols["fp8"] = cols["fp8"].astype(bool)
    cols["fp4"] = cols["fp4"].astype(bool)
    cols["ideal_tokens"] = np.array([r.predicted_tokens_per_s_per_gpu for r in rows])
    cols["measured_tokens"] = np.array([r.measured_tokens_per_s_per_gpu for r in rows])
    cols["model"] = np.array([r.model for r in rows])
    cols["family"] = np.array([r.source_family for r in rows])
    cols["group"] = np.array([r.group for r in rows])
    return cols


def _take(cols: dict, index: np.ndarray) -> dict:
    return {key: value[index] for key, value in cols.items()}


def predicted_tokens(cols: dict, values: dict[str, float]) -> np.ndarray:
    """Tokens/s per GPU per row under the profile ``values`` (throughput scales with 1/step)."""
    return cols["ideal_tokens"] * cols["step_time_s"] / profiled_step_time(cols, values)


#: Where the rows cover several models, a GEMM dtype's sustained-compute term needs rows of
#: at least this many of them in that dtype: one model's rows cannot tell the chip's
#: sustained rate from that model's own losses, which the term would lend the others.
MIN_MODELS_PER_DTYPE = 2


def informed_terms(cols: dict) -> list[str]:
    """Terms the rows can inform: FP8 efficiency only with FP8 rows, FP4's with FP4 rows,
    BF16's with BF16 rows, of :data:`MIN_MODELS_PER_DTYPE` models or more where the rows
    cover several (a user's runs of one model fit it for that model)."""
    names = list(TERMS)
    models = set(cols["model"])
    fp8, fp4 = cols["fp8"], cols["fp4"]
    for term, rows in (("compute_efficiency_fp8", fp8), ("compute_efficiency_fp4", fp4),
                       ("compute_efficiency_bf16", ~(fp8 | fp4))):  # fmt: skip
        in_dtype = set(cols["model"][rows])
        if not in_dtype or len(in_dtype) < MIN_MODELS_PER_DTYPE <= len(models):
            names.remove(term)
    if not cols["expert_share"].any():
        names.remove("expert_gemm_half_width")
    if not (cols["tp_exposed_time_s"] * cols["stack_overlaps_tp"]).any():
        names.remove("tp_comm_overlap")  # no row's stack overlaps a TP collective
    return names


def fit_values(cols: dict, weights: np.ndarray, names: list[str]) -> dict[str, float]:
    """Least-squares values of ``names`` (bounded, robust) on log throughput."""
    from scipy.optimize import least_squares

    lower = np.array([TERMS[n].lower for n in names])
    upper = np.array([TERMS[n].upper for n in names])
    span = upper - lower
    start = (np.array([START[n] for n in names]) - lower) / span
    root = np.sqrt(weights)
    measured = np.log(cols["measured_tokens"])

    def values_of(z: np.ndarray) -> dict[str, float]:
        z = np.clip(z, 0.0, 1.0)
        z = np.where(z < 1e-9, 0.0, np.where(z > 1 - 1e-9, 1.0, z))  # on a bound: the bound
        return {n: float(lo + zi * s) for n, lo, zi, s in zip(names, lower, z, span, strict=True)}

    def residuals(z: np.ndarray) -> np.ndarray:
        return root * (np.log(predicted_tokens(cols, values_of(z))) - measured)

    found = least_squares(residuals, start, bounds=(0.0, 1.0), loss="soft_l1", f_scale=ROBUST_SCALE)
    return {n: float(f"{value:.4g}") for n, value in values_of(found.x).items()}


def _group_weights(groups: np.ndarray) -> np.ndarray:
    _, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    return 1.0 / counts[inverse]


def mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Mean absolute percentage error of ``predicted`` against ``measured``."""
    return float(np.mean(np.abs(predicted / measured - 1)))


def predicted_tokens_of(rows: list[RowPrediction], values: dict[str, float]) -> np.ndarray:
    """Tokens/s per GPU of ``rows`` (ideal-model predictions) under the profile ``values``."""
    return predicted_tokens(_columns(rows), values)


def held_out_predictions(
    rows: list[RowPrediction], by, names: list[str] | None = None
) -> np.ndarray:
    """Each row's prediction from a fit on the rows of every other value of ``by`` (sources:
    leave-one-source-out), weighted as :func:`fit_profile` weights them: of ``names``, or,
    by default, of the terms :func:`select_terms` keeps on those other rows (the whole
    procedure held out, selection included)."""
    weights = _group_weights(np.array([r.group for r in rows]))
    by = np.asarray(by)
    folds = [np.array([value]) for value in sorted(set(by))]
    return _held_out(_columns(rows), weights, names, by, folds)


def _held_out(cols, weights, names, families, folds: list[np.ndarray]) -> np.ndarray:
    """Each row's prediction from a fit on the folds it is not in: of ``names``, or where
    ``names`` is None of the terms :func:`select_terms` keeps on those folds' rows (nested
    cross-validation: the selection never sees the rows it is judged on)."""
    held = np.full(len(families), np.nan)
    for fold in folds:
        test = np.isin(families, fold)
        if test.all() or not test.any():
            continue
        train = ~test
        kept_cols = _take(cols, train)
        kept = select_terms(kept_cols, weights[train]) if names is None else names
        values = fit_values(kept_cols, weights[train], kept)
        held[test] = predicted_tokens(_take(cols, test), values)
    return held


#: A term stays only if leaving it out raises the leave-one-source-out MAPE by more than this.
MIN_CV_GAIN = 0.002


def _loso_mape(cols, weights, names, families) -> float:
    folds = [np.array([f]) for f in sorted(set(families))]
    return mape(_held_out(cols, weights, names, families, folds), cols["measured_tokens"])


def terms_that_earn_their_place(cols, weights, names: list[str], families) -> list[str]:
    """The terms kept, under leave-one-out CV over ``families`` (sources; the configuration
    groups where one source is all there is). Backward elimination drops, one at a time, the
    term whose absence lowers the held-out MAPE most, while some absence lowers it (or raises
    it by less than :data:`MIN_CV_GAIN`); a greedy walk can stop at a local minimum, so
    forward selection is run too (from the best single term, add the one whose presence
    lowers the held-out MAPE most while it lowers it by more than :data:`MIN_CV_GAIN`), and
    the set with the lower held-out MAPE is kept (the smaller one on a tie); neither walk
    keeps more than :data:`MAX_FITTED_TERMS`. The errors :func:`fit_profile` reports repeat
    this selection inside each of their folds (:func:`_held_out`), so they are not measured
    on the folds that chose the terms."""
    if len(names) <= 1:
        return list(names)
    score = {}

    def held_out(kept: list[str]) -> float:
        key = tuple(sorted(kept))
        if key not in score:
            score[key] = _loso_mape(cols, weights, list(kept), families)
        return score[key]

    backward = list(names)
    best = held_out(backward)
    while len(backward) > 1:
        trials = {n: held_out([k for k in backward if k != n]) for n in backward}
        name = min(trials, key=trials.get)
        if trials[name] > best + MIN_CV_GAIN and len(backward) <= MAX_FITTED_TERMS:
            break
        backward.remove(name)
        best = min(best, trials[name])
    singles = {n: held_out([n]) for n in names}
    forward = [min(singles, key=singles.get)]
    best = singles[forward[0]]
    while len(forward) < min(len(names), MAX_FITTED_TERMS):
        trials = {n: held_out([*forward, n]) for n in names if n not in forward}
        name = min(trials, key=trials.get)
        if trials[name] >= best - MIN_CV_GAIN:
            break
        forward.append(name)
        best = trials[name]
    chosen = min((backward, forward), key=lambda kept: (held_out(kept), len(kept)))
    return [n for n in names if n in chosen]


def term_ranges_one_model_out(cols: dict, weights: np.ndarray, names: list[str]) -> dict:
    """Each of ``names``' [lowest, highest] fitted value over refits that leave one model's
    rows out (in each refit, only the terms the remaining rows still inform). A term that
    swings across its range when one model leaves rests on that model: read it as a proxy
    for what that model's runs lose, not as the chip's own figure."""
    models = sorted(set(cols["model"]))
    if len(models) < 2:
        return {}
    seen: dict[str, list[float]] = {name: [] for name in names}
    for model in models:
        keep = cols["model"] != model
        rest = _take(cols, keep)
        informed = [name for name in names if name in informed_terms(rest)]
        if informed:
            for name, value in fit_values(rest, weights[keep], informed).items():
                seen[name].append(value)
    return {name: [min(values), max(values)] for name, values in seen.items() if values}


def select_terms(cols: dict, weights: np.ndarray) -> list[str]:
    """The terms a fit on ``cols`` keeps: those its rows inform (:func:`informed_terms`)
    that earn their place on held-out sources (:func:`terms_that_earn_their_place`); with
    one source, on held-out configuration groups."""
    names = informed_terms(cols)
    families = cols["family"] if len(set(cols["family"])) > 1 else cols["group"]
    if len(set(families)) > 1:
        names = terms_that_earn_their_place(cols, weights, names, families)
    return names


def fitted_terms_of(rows: list[RowPrediction]) -> tuple[list[str], dict[str, float]]:
    """The terms :func:`fit_profile` keeps on ``rows`` and every term's value (the others
    ideal), without its error estimates."""
    cols = _columns(rows)
    weights = _group_weights(cols["group"])
    names = select_terms(cols, weights)
    return names, {**{n: TERMS[n].ideal for n in TERMS}, **fit_values(cols, weights, names)}


def fit_profile(rows: list[RowPrediction], accelerator: str, stack: str | None) -> FitResult:
    """Fit the profile terms to ``rows`` (covered ideal-model predictions of one accelerator)."""
    cols = _columns(rows)
    weights = _group_weights(cols["group"])
    families, groups = cols["family"], cols["group"]
    informed = informed_terms(cols)
    names = select_terms(cols, weights)
    values = fit_values(cols, weights, names)
    predicted = predicted_tokens(cols, values)
    measured = cols["measured_tokens"]
    unique = sorted(set(families))
    by_family = {f: mape(predicted[families == f], measured[families == f]) for f in unique}
    loso = kfold = None
    loso_by: dict[str, float] = {}
    rng = np.random.default_rng(0)
    # Held out: the whole procedure, term selection included, refitted without each fold.
    if len(unique) > 1:
        held = _held_out(cols, weights, None, families, [np.array([f]) for f in unique])
        loso = mape(held, measured)
        loso_by = {f: mape(held[families == f], measured[families == f]) for f in unique}
        folds = np.array_split(rng.permutation(unique), min(NUM_FOLDS, len(unique)))
        kfold = mape(_held_out(cols, weights, None, families, folds), measured)
    else:  # one source: k-fold over configuration groups (never over rows)
        folds = np.array_split(rng.permutation(sorted(set(groups))), NUM_FOLDS)
        held = _held_out(cols, weights, None, groups, folds)
        kfold = mape(held, measured)
    ratio = held / measured  # held-out: measured over predicted step time
    jobs = np.array([r.job for r in rows])
    ratio_fields = ratio_error_fields(
        held, cols["ideal_tokens"], measured, weights, families, jobs, groups
    )
    return FitResult(
        accelerator=accelerator,
        stack=stack,
        values={**{n: TERMS[n].ideal for n in TERMS}, **values},
        fitted_terms=names,
        informed_terms=informed,
        training_ids=[r.id for r in rows],
        num_rows=len(rows),
        num_groups=len({r.group for r in rows}),
        in_sample_mape=mape(predicted, measured),
        kfold_mape=kfold,
        loso_mape=loso,
        loso_mape_by_source=loso_by,
        in_sample_mape_by_source=by_family,
        step_time_ratio_p10=float(np.percentile(ratio, 10)),
        step_time_ratio_p90=float(np.percentile(ratio, 90)),
        ideal_mape=mape(cols["ideal_tokens"], measured),
        ratio_error=ratio_fields,
        term_range_one_model_out=term_ranges_one_model_out(cols, weights, names),
        layout_range=_layout_range(rows),
    )


def _layout_range(rows: list[RowPrediction]) -> dict:
    """The rows' layout range as the profile stores it ({} when no row has a layout)."""
    found = layout_range_of(
        [r.layout for r in rows],
        [r.seq_len for r in rows],
        [r.num_gpus for r in rows],
        [(r.features or {}).get("attention_share") for r in rows],
    )
    return found.model_dump() if found is not None else {}


def profile_toml(result: FitResult, command: str, date: str) -> str:
    """The fitted profile as TOML (``hwspecs/data/profiles/<accelerator>.toml``)."""

    def line(key: str, value) -> str:
        if isinstance(value, str):
            return f"{key} = {value!r}".replace("'", '"')
        return f"{key} = {value!r}"

    out = [
        f"# Efficiency profile of {result.accelerator}, fitted by `{command}` on {date}.",
        "# Terms: planner/cost/profile.py. Ideal model: --profile none.",
        line("accelerator", result.accelerator),
    ]
    if result.stack:
        out.append(line("stack", result.stack))
    uninformed = [n for n in TERMS if n not in result.informed_terms]
    dropped = [n for n in result.informed_terms if n not in result.fitted_terms]
    notes = [f"{', '.join(names)} ({why})" for names, why in (
        (uninformed, "no row informs them"),
        (dropped, "fitted, they did not lower the held-out error"),
    ) if names]  # fmt: skip
    note = "terms left at their ideal values: " + "; ".join(notes)
    out.append(line("notes", note if notes else "every term fitted"))
    out.append("")
    for name in result.fitted_terms:  # the rest sit at their ideal values (the notes say why)
        term = TERMS[name]
        out += [f"[terms.{name}]", line("value", float(result.values[name])),
                line("unit", term.unit), line("lower", term.lower), line("upper", term.upper),
                ""]  # fmt: skip
    out += ["[fit]", line("command", command), line("date", date),
            line("num_rows", result.num_rows), line("num_groups", result.num_groups),
            line("in_sample_mape", round(result.in_sample_mape, 4))]  # fmt: skip
    out.append("held_out_selects_terms = true")  # nested: see fit_profile
    if result.kfold_mape is not None:
        out.append(line("kfold_mape", round(result.kfold_mape, 4)))
    if result.loso_mape is not None:
        out.append(line("loso_mape", round(result.loso_mape, 4)))
    out += [line("step_time_ratio_p10", round(result.step_time_ratio_p10, 4)),
            line("step_time_ratio_p90", round(result.step_time_ratio_p90, 4)),
            "training_ids = ["]  # fmt: skip
    out += [f'  "{row_id}",' for row_id in result.training_ids]
    out += ["]", "", "[fit.loso_mape_by_source]"]
    out += [f'"{k}" = {round(v, 4)}' for k, v in result.loso_mape_by_source.items()]
    if result.ratio_error:  # the band the search ranks under (planner/runs/ratio_error.py)
        out += ["", "[fit.ratio_error]"]
        out += [line(key, value) for key, value in result.ratio_error.items()]
    if result.layout_range:  # the layouts the error speaks for (planner/layout_range.py)
        out += ["", "[fit.layout_range]"]
        out += [line(key, value) for key, value in result.layout_range.items() if value is not None]
    if result.term_range_one_model_out:
        out += ["", "[fit.term_range_one_model_out]"]
        out += [line(name, [float(f"{v:.4g}") for v in span])
                for name, span in result.term_range_one_model_out.items()]  # fmt: skip
    return "\n".join(out) + "\n"
