"""Rank under the model's own error: layouts within the band of the best are ties, and ties
are ordered by a stated practitioner preference.

The band is the measured error of the ratio of two layouts' predicted step times
(:mod:`planner.runs.ratio_error`, stored in the profile: ``[fit.ratio_error]``). A row is
**equivalent to the best** when its step time (the event simulator's where it was run,
else the closed form) is at most ``(1 + band)`` times the fastest row's. Equivalent rows
come first, ordered by these rules, in this order (each key: lower is preferred); rows
all rules tie keep their order by time, and rows outside the band follow in time order:

0. inside the layouts the profile was measured on: how many axes a row leaves the
   training runs' range on (:mod:`planner.layout_range`: a deeper pipeline, a higher TP,
   CP or EP degree, fewer tokens per CP rank than any run's). The band was measured on
   layouts like the runs'; beyond them no measured error speaks for a prediction, so of two
   layouts the model cannot tell apart, the one like the runs is preferred.
1. fewer axes above 1: the count of tp, cp, pp, dp, ep above 1.
2. TP within the scale-up domain before CP or PP: with cp·pp > 1, log2(T / tp), where T is
   the scale-up domain or the largest TP any feasible row has, whichever is smaller; plus
   log2(tp / domain) for TP beyond the domain.
3. PP only as deep as memory needs: log2(pp / pp_min), pp_min the shallowest pp that fits
   among the feasible rows with the row's tp, cp, ep, etp, ZeRO stage, recompute and SP.
4. CP only when the sequence needs it: log2(cp / cp_min), cp_min the smallest cp that fits
   among the feasible rows with the row's tp, pp, ep, etp, ZeRO stage, recompute and SP
   (memory); a CP that buys attention time beyond the band is outside the tie already.
5. more memory headroom: whole GiB free below the usable memory, more first.
6. the simpler schedule: its micro-batch rules + one for more than one chunk per rank + one
   for a split backward (B and W) + parameter copies beyond one.

A preference never overrides a difference larger than the band: two equivalent rows both
lie within ``(1 + band)`` of the best, so of each other. With band 0 (or ``--rank time``)
the order is the time order. Everything is numpy over the result rows (a group minimum over
distinct tuples), no loop per row.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel

from hwspecs.profile import LayoutRange
from planner.columns.codes import Labels, distinct_rows
from planner.layout_range import attention_beyond, count_outside, describe, outside_reasons
from planner.pipeline.schedules import SCHEDULES

GIB = 2**30
RANK_MODES = ("robust", "time")
#: The preference rules, in the order they are read (see the module docstring).
RULES = (
    "inside the layouts the profile was measured on",
    "fewer axes above 1",
    "TP within the scale-up domain before CP or PP",
    "PP only as deep as memory needs",
    "CP only when the sequence needs it",
    "more memory headroom",
    "the simpler schedule",
)
#: ``preference`` of a row no rule placed: the fastest (the best by time and chosen),
#: ordered by time among ties, outside the band, or every row under ``--rank time``.
FASTEST, BY_TIME, OUTSIDE, TIME_RANK = "fastest", "time", "outside the band", "time rank"
PREFERENCES = (*RULES, FASTEST, BY_TIME, OUTSIDE, TIME_RANK)
MEMORY_MEASURES = ("etp", "zero_stage", "recompute", "sequence_parallel")


class RankSettings(BaseModel):
    """How the search ranks: ``robust`` (ties within the band, then the rules) or ``time``;
    the band (None: no measured ratio error, ranked by time) and where it was measured."""

    mode: Literal["robust", "time"] = "robust"
    band: float | None = None
    band_source: str = ""
    #: The layouts the band was measured on (rule 0) and the job's sequence length (tokens
    #: per CP rank); None: no range recorded, no row outside it.
    layout_range: LayoutRange | None = None
    seq_len: int | None = None
    #: The job's attention FLOP share (:func:`planner.cost.profile.flop_shares`), said
    #: where it is beyond the runs'; None: not said.
    attention_share: float | None = None


def schedule_complexity(name: str, vpp) -> np.ndarray:
    """Rule 6's count for a schedule (numpy over vpp): its micro-batch rules, one for more
    than one chunk per rank, one for a split backward, parameter copies beyond one."""
    spec = SCHEDULES[name]
    chunks = 1 if spec.bidirectional else (2 if spec.v_shape else np.asarray(vpp))
    return (
        len(spec.microbatch_rules)
        + (np.asarray(chunks) > 1)
        + int(spec.splits_backward)
        + (spec.parameter_copies - 1)
    )


def _shallowest(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Per row: the smallest of ``values`` among the rows of its group."""
    least = np.full(int(group.max(initial=-1)) + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(least, group, values)
    return least[group]


#: The columns whose shared values make rules 3 and 4's groups (with cp, or with pp).
SHARED_BY_GROUPS = ("tp", "ep", *MEMORY_MEASURES)


def over_every_row(columns, distinct=None) -> tuple[np.ndarray, np.ndarray, int]:
    """What the rules read over every row, not just the ones they place: per row the least
    pp and the least cp among the rows sharing every other degree and memory measure (one
    group per distinct tuple of them, :func:`planner.columns.codes.distinct_rows`; rules 3
    and 4), and the largest tp (rule 2's reference). ``columns``: see
    :func:`preference_keys`. ``distinct``: a function giving each row's code of its tuple
    of the columns named (equal codes exactly where the tuples are equal; small
    non-negative integers), when the caller has a faster way than the columns (None: found
    from them)."""
    get = columns if callable(columns) else columns.__getitem__
    tp_max = int(np.asarray(get("tp")).max(initial=1))
    if distinct is None:  # the rows sharing tp, ep and the memory measures, then cp or pp
        shared = np.asarray(get("tp"))
        for key in SHARED_BY_GROUPS[1:]:  # one column at a time: two alive at most
            _, shared = distinct_rows(shared, get(key))

        def distinct(keys):
            return distinct_rows(shared, get(keys[-1]))[1]

    # Each column read when it is needed (the search's rows: 10^6 each).
    least_pp = _shallowest(np.asarray(get("pp")), distinct((*SHARED_BY_GROUPS, "cp")))
    least_cp = _shallowest(np.asarray(get("cp")), distinct((*SHARED_BY_GROUPS, "pp")))
    return least_pp, least_cp, tp_max


def preference_keys(
    columns, scale_up_domain: int, usable_bytes: float, rows: np.ndarray | None = None,
    every_row: tuple | None = None, settings: RankSettings | None = None,
) -> np.ndarray:  # fmt: skip
    """Rows × rules: each rule's key per row (lower preferred), in :data:`RULES` order; with
    ``rows`` (indices), those rows' only.

    ``columns``: a dict of :data:`RANK_INPUTS`, or a function giving one by name (each is
    then asked for when it is read and released after: a few are alive at once).
    ``every_row``: :func:`over_every_row` of the same columns, when the caller has it (the
    keys of some rows still read every row: the same keys, ``rows`` or not). ``settings``:
    the profile's layout range for rule 0 (None: every row inside)."""
    get = columns if callable(columns) else columns.__getitem__
    least_pp, least_cp, tp_max = every_row or over_every_row(get)
    at = slice(None) if rows is None else rows
    tp, cp, pp, ep = (np.asarray(get(k))[at] for k in ("tp", "cp", "pp", "ep"))
    keys = np.empty((len(tp), len(RULES)))  # filled in place: no stacked copy
    settings = settings or RankSettings()
    degrees = {"tp": tp, "cp": cp, "pp": pp, "ep": ep}
    keys[:, 0] = count_outside(degrees, settings.layout_range, settings.seq_len)
    axes = (tp > 1).astype(int) + (cp > 1) + (pp > 1) + (ep > 1)
    axes += np.asarray(get("dp"))[at] > 1
    keys[:, 1] = axes
    reference = min(scale_up_domain, tp_max)
    tp_short = np.where(cp * pp > 1, np.log2(np.maximum(reference / tp, 1)), 0.0)
    keys[:, 2] = tp_short + np.log2(np.maximum(tp / scale_up_domain, 1))
    keys[:, 3] = np.log2(pp / least_pp[at])
    keys[:, 4] = np.log2(cp / least_cp[at])
    memory = np.asarray(get("memory_per_gpu_bytes"))[at]
    keys[:, 5] = -np.floor((usable_bytes - memory) / GIB)
    schedule = Labels.of(get("schedule"))[at]
    vpp = np.asarray(get("vpp"))[at]
    simple = np.zeros(len(keys))
    for code, name in enumerate(schedule.values):  # one pass per schedule name
        held = schedule.codes == code
        simple[held] = schedule_complexity(name, vpp[held])
    keys[:, 6] = simple
    return keys


def equivalent_to_best(step_time_s: np.ndarray, band: float) -> np.ndarray:
    """Rows whose step time is within ``(1 + band)`` of the fastest row's."""
    step_time_s = np.asarray(step_time_s, dtype=float)
    if not len(step_time_s):
        return np.zeros(0, dtype=bool)
    return step_time_s <= np.nanmin(step_time_s) * (1 + band)


def robust_order(step_time_s: np.ndarray, keys, band: float, time_rank) -> np.ndarray:
    """Row order: equivalent rows by the rules, then step time, then ``time_rank``; the
    others after them by ``time_rank`` (their place in the time ranking). ``keys``: the
    rows' :func:`preference_keys`, or a function giving them for the rows (indices) asked."""
    equivalent = equivalent_to_best(step_time_s, band)
    inside = np.flatnonzero(equivalent)
    keys_of = keys if callable(keys) else keys.__getitem__
    columns = [time_rank[inside], step_time_s[inside], *keys_of(inside).T[::-1]]
    inside = inside[np.lexsort(columns)]
    outside = np.flatnonzero(~equivalent)
    return np.concatenate([inside, outside[np.argsort(time_rank[outside], kind="stable")]])


def placing_rules(keys: np.ndarray, equivalent: np.ndarray, fastest: int) -> np.ndarray:
    """Index into :data:`PREFERENCES` per ranked row (``keys`` and ``equivalent`` in rank
    order): the first rule on which the row differs from the row ranked above it, all keys
    equal: ordered by time; the winner: the rule that put it above the fastest row (at
    ``fastest``), or the fastest itself; rows outside the band: outside."""
    above = np.vstack([keys[:1], keys[:-1]])
    differs = keys != above
    first = np.where(differs.any(axis=1), differs.argmax(axis=1), PREFERENCES.index(BY_TIME))
    if len(first):
        first[0] = PREFERENCES.index(winner_rule(keys, 0, fastest))
    return np.where(equivalent, first, PREFERENCES.index(OUTSIDE))


def winner_rule(keys: np.ndarray, winner: int, fastest: int) -> str:
    """The rule by which ``winner`` was ranked above ``fastest`` (or ``fastest``)."""
    if winner == fastest:
        return FASTEST
    differs = np.flatnonzero(keys[winner] != keys[fastest])
    return RULES[differs[0]] if len(differs) else BY_TIME


SIMULATED = ("pipeline_time_simulated_s", "step_time_simulated_s")


def simulate_rows(
    job, accelerator, simulated: dict, rows, records, layout_of_row, memo=None
) -> None:
    """Re-time ``rows`` (positions) not yet simulated with the event simulator
    (:func:`planner.refine.refine`, ``memo`` kept over the calls), in place: the two
    :data:`SIMULATED` columns of ``simulated`` (NaN for rows never simulated);
    ``records(rows)`` gives those rows as dicts."""
    from planner.refine import refine

    rows = [int(r) for r in rows if np.isnan(simulated["step_time_simulated_s"][r])]
    found = records(rows)
    layouts = [layout_of_row(record) for record in found]
    refined = refine(job, accelerator, layouts, found, memo)
    for row, result in zip(rows, refined, strict=True):
        for key in SIMULATED:
            simulated[key][row] = result[key]


def effective_step_time(columns: dict) -> np.ndarray:
    """Each row's step time for ranking: simulated where it was, else the closed form."""
    simulated = columns["step_time_simulated_s"]
    return np.where(np.isnan(simulated), columns["step_time_s"], simulated)


#: The columns the ranking reads over every row (:func:`rank_order`'s ``column``).
RANK_INPUTS = ("tp", "cp", "pp", "dp", "ep", "vpp", "schedule", "memory_per_gpu_bytes",
               "step_time_s", *MEMORY_MEASURES)  # fmt: skip


def rank_order(
    job, accelerator, column, records, time_order: np.ndarray, top: int, objective: str,
    settings: RankSettings | None, scale_up_domain: int, usable_bytes: float, layout_of_row,
    every_row=None,
) -> tuple[np.ndarray, dict]:  # fmt: skip
    """The rows' order as ``settings`` says, and the columns the ranking adds, in that order.

    The rows are the search's feasible rows in any fixed order; ``column(key)`` is one of
    :data:`RANK_INPUTS` over them, ``records(rows)`` those rows (positions) as dicts, and
    ``time_order`` their order by the objective. The first ``top`` rows of it are
    simulated and, under the step-time objective, re-ordered by their simulated time: that
    is the time ranking (``rank_by_time``). Robust (step-time objective, a measured band):
    rows are ordered by :func:`robust_order` on the effective step time; the new first
    ``top`` rows not yet simulated are simulated and the order decided again. Adds the
    :data:`SIMULATED` columns, ``rank_by_time``, ``equivalent_to_best``, ``preference`` (labels
    of :data:`PREFERENCES`) and ``rank``; the caller takes every column once, in the returned
    order. ``every_row``: a function giving :func:`over_every_row` of every feasible row at
    these rows (when they are not all of them; called only by the robust ranking); None:
    of these rows."""
    settings = settings or RankSettings(mode="time")
    count = len(time_order)
    time_order = time_order.copy()
    simulated = {key: np.full(count, np.nan) for key in SIMULATED}
    head = min(top, count)
    memo: dict = {}  # the event simulator's, over both calls
    simulate_rows(job, accelerator, simulated, time_order[:head], records, layout_of_row, memo)
    if objective == "step_time":  # only the simulated head moves
        moved = np.argsort(simulated["step_time_simulated_s"][time_order[:head]], kind="stable")
        time_order[:head] = time_order[:head][moved]
    rank_by_time = np.empty(count, dtype=np.int64)
    rank_by_time[time_order] = np.arange(1, count + 1)
    band = settings.band if settings.band is not None else 0.0
    robust = settings.mode == "robust" and settings.band is not None and objective == "step_time"
    step_time_s = column("step_time_s")
    if not robust or not count:
        order = time_order
        time_s = effective_step_time({"step_time_s": step_time_s, **simulated})[order]
        added = {key: value[order] for key, value in simulated.items()}
        return order, {
            **added,
            "rank_by_time": rank_by_time[order],
            "equivalent_to_best": equivalent_to_best(time_s, band),
            "preference": Labels(np.full(count, PREFERENCES.index(TIME_RANK)), PREFERENCES),
            "rank": rank_by_time[order].copy(),
        }
    # Once; the keys are built for the band's rows only.
    every_row = over_every_row(column) if every_row is None else every_row()

    def keys_of(rows: np.ndarray) -> np.ndarray:
        return preference_keys(column, scale_up_domain, usable_bytes, rows, every_row, settings)

    order = robust_order(
        effective_step_time({"step_time_s": step_time_s, **simulated}), keys_of, band,
        rank_by_time,
    )  # fmt: skip
    simulate_rows(job, accelerator, simulated, order[:top], records, layout_of_row, memo)
    time_s = effective_step_time({"step_time_s": step_time_s, **simulated})
    order = robust_order(time_s, keys_of, band, rank_by_time)
    equivalent = equivalent_to_best(time_s[order], band)
    fastest = int(np.argmin(time_s[order]))
    # The rows in the band come first (robust_order) and only their keys place them.
    inside = int(equivalent.sum())
    codes = np.full(count, PREFERENCES.index(OUTSIDE))
    codes[:inside] = placing_rules(keys_of(order[:inside]), equivalent[:inside], fastest)
    return order, {
        **{key: value[order] for key, value in simulated.items()},
        "rank_by_time": rank_by_time[order],
        "equivalent_to_best": equivalent,
        "preference": Labels(codes, PREFERENCES),
        "rank": np.arange(1, count + 1),
    }


def layout_name(row) -> str:
    """``TP8 CP1 PP16 DP128`` (and ``EP64``) with the schedule, for the explanation."""
    degrees = " ".join(f"{axis.upper()}{int(row[axis])}" for axis in ("tp", "cp", "pp", "dp"))
    return degrees + (f" EP{int(row['ep'])}" if int(row["ep"]) > 1 else "") + f" {row['schedule']}"


def explain_ranking(columns: dict, settings: RankSettings, objective: str) -> list[str]:
    """How the plan was ranked: the layouts within the band, the rule that chose the winner
    and what the fastest layout would gain by the model. ``columns``: the ranked rows
    (:attr:`planner.search.SearchResult.columns`, best first)."""
    if not columns or not len(columns["rank"]):
        return []
    within = int(columns["equivalent_to_best"].sum())
    if settings.band is None:
        return [f"ranked by predicted step time: {settings.band_source}"]
    band = f"{settings.band:.1%} ratio error ({settings.band_source})"
    if settings.mode == "time":
        return [f"ranked by predicted step time (--rank time); {within:,} layouts are within "
                f"the model's {band} of the fastest",
                *measured_range_lines(columns, settings, within)]  # fmt: skip
    if objective != "step_time":
        return [f"--rank robust orders the step-time objective; ranked by {objective}"]
    time_s = effective_step_time(columns)
    fastest_row = int(np.argmin(time_s))
    winner, fastest = (
        {key: columns[key][row] for key in ("tp", "cp", "pp", "dp", "ep", "schedule")}
        for row in (0, fastest_row)
    )
    rule = str(columns["preference"][0])
    head = f"{within:,} layouts within the model's {band} of the fastest; "
    measured = measured_range_lines(columns, settings, within)
    if rule == FASTEST:
        return [head + f"chose the fastest, {layout_name(winner)} (no rule needed)", *measured]
    times = time_s[[0, fastest_row]].astype(float)
    gain = times[0] / times[1] - 1
    return [
        head + f"chose {layout_name(winner)} (rule: {rule}); the fastest by the model, "
        f"{layout_name(fastest)}, is {gain:.1%} faster ({times[1]:.3f} s vs {times[0]:.3f} s), "
        f"inside the band",
        *measured,
    ]


def measured_range_lines(columns: dict, settings: RankSettings, within: int) -> list[str]:
    """Where the ranked layouts stand against the runs the band was measured on: the range,
    how many of the layouts within the band lie inside it, the axes the winner leaves, and
    a plan on more GPUs than any run (every layout extrapolated in scale)."""
    found = settings.layout_range
    if found is None:
        return []
    degrees = {axis: columns[axis][:within] for axis in ("tp", "cp", "pp", "ep")}
    inside = int((count_outside(degrees, found, settings.seq_len) == 0).sum())
    lines = [
        f"the band was measured on runs with {describe(found)}: {inside:,} of the {within:,} "
        "layouts within it lie inside them"
    ]
    winner = {axis: columns[axis][0] for axis in ("tp", "cp", "pp", "ep")}
    reasons = outside_reasons(winner, found, settings.seq_len)
    if reasons:
        lines.append(f"the winner lies outside them ({'; '.join(reasons)}): no measured error "
                     "speaks for it")  # fmt: skip
    gpus = int(np.prod([columns[axis][0] for axis in ("tp", "cp", "pp", "dp")]))
    if gpus > found.num_gpus:
        lines.append(f"{gpus:,} GPUs are more than any run's ({found.num_gpus:,}): every "
                     "layout's synchronisation and collectives are extrapolated in scale")  # fmt: skip
    share = settings.attention_share
    if attention_beyond(found, share) is not None:
        lines.append(f"attention is {share:.0%} of the model FLOPs, more than in any run "
                     f"({found.attention_share:.0%}): every layout's attention time rests on "
                     "the profile's attention term extrapolated")  # fmt: skip
    return lines
