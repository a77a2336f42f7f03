"""The layouts a profile was measured on: how far its training runs reached along each
parallel axis, and which of a search's layouts lie beyond them.

A profile's cross-validated error (its interval and the ranking's band) was measured on its
training runs, so it speaks for layouts like theirs. A layout beyond them — a deeper
pipeline, a higher TP, EP or CP degree, or CP ranks holding fewer tokens than any run's —
has a prediction nothing measured has checked: the model's physics extrapolated. So has a
job whose attention core takes a larger share of the model FLOPs than in any run (a longer
sequence, a narrower model): the profile's attention term was fitted where attention was
a smaller part of the step. The range is stored in the profile (``[fit.layout_range]``,
:class:`hwspecs.profile.LayoutRange`), found from the degrees the fit's rows ran
(:func:`layout_range_of`); the search reads it per row (:func:`axes_outside`) for its
first preference rule (:mod:`planner.rank`) and each result names the axes it leaves
(:func:`outside_reasons`). Numpy over rows.
"""

from __future__ import annotations

import numpy as np

from hwspecs.profile import LayoutRange

#: Each axis checked, in the order reasons are given.
AXES = ("tp", "cp", "pp", "ep", "cp_tokens")


def layout_range_of(
    layouts: list[dict | None],
    seq_lens: list[int | None],
    num_gpus: list[int],
    attention_shares: list[float | None] | None = None,
) -> LayoutRange | None:
    """The range of the runs a profile was fitted on: each degree's largest value over the
    runs' layouts (as the fit timed them: published degrees pinned), the fewest tokens a CP
    rank held (sequence / cp, over runs with cp > 1; None without CP), the most GPUs and
    the largest of ``attention_shares`` (each run's attention FLOP share,
    :func:`planner.cost.profile.flop_shares`; None where not given). Runs without a layout
    or a sequence length are left out (None: no run has both)."""
    known = [i for i, (lay, s) in enumerate(zip(layouts, seq_lens, strict=True)) if lay and s]
    if not known:
        return None
    layouts, seq_lens = [layouts[i] for i in known], [seq_lens[i] for i in known]
    num_gpus = [num_gpus[i] for i in known]
    shares = [attention_shares[i] for i in known] if attention_shares is not None else []
    shares = [share for share in shares if share is not None]
    degrees = {axis: max(int(layout[axis]) for layout in layouts) for axis in AXES[:4]}
    per_rank = [
        s / int(lay["cp"]) for lay, s in zip(layouts, seq_lens, strict=True) if lay["cp"] > 1
    ]
    return LayoutRange(
        **degrees,
        cp_tokens_per_rank=int(min(per_rank)) if per_rank else None,
        num_gpus=max(num_gpus),
        num_runs=len(layouts),
        attention_share=round(max(shares), 4) if shares else None,
    )


def measured_layout_range(profile, accelerator: str) -> LayoutRange | None:
    """The layouts an estimate's error was measured on: ``profile``'s runs, or for the ideal
    model (``profile`` None) the runs of the accelerator's shipped profile, on which its
    ranking band was measured (:func:`planner.runs.ratio_error.ranking_band`); None where
    neither records a range."""
    if profile is None:
        from planner.runs.profiles import profile_for

        profile = profile_for(accelerator)
    return profile.fit.layout_range if profile is not None else None


def axes_outside(
    columns, layout_range: LayoutRange | None, seq_len: int | None
) -> dict[str, np.ndarray]:
    """Per axis of :data:`AXES`, the rows beyond ``layout_range`` (``columns``: tp, cp, pp,
    ep by name, or a function giving them; no range: none outside). ``cp_tokens``: CP
    ranks hold fewer of the ``seq_len`` tokens than any run's did (the runs' own cp > 1;
    not checked without a sequence length)."""
    get = columns if callable(columns) else columns.__getitem__
    tp, cp, pp, ep = (np.asarray(get(axis)) for axis in AXES[:4])
    if layout_range is None:
        return {axis: np.zeros(len(tp), dtype=bool) for axis in AXES}
    least = layout_range.cp_tokens_per_rank
    if least is None or seq_len is None:
        least, seq_len = 0, 1
    return {
        "tp": tp > layout_range.tp,
        "cp": cp > layout_range.cp,
        "pp": pp > layout_range.pp,
        "ep": ep > layout_range.ep,
        "cp_tokens": (cp > 1) & (seq_len / cp < least),
    }


def count_outside(columns, layout_range: LayoutRange | None, seq_len: int | None) -> np.ndarray:
    """Per row, how many axes of :data:`AXES` it leaves the runs' range on (0: inside)."""
    return sum(axes_outside(columns, layout_range, seq_len).values()).astype(int)


def outside_reasons(
    layout: dict, layout_range: LayoutRange | None, seq_len: int | None,
    num_gpus: int | None = None, attention_share: float | None = None,
) -> list[str]:  # fmt: skip
    """The axes one layout (tp, cp, pp, ep) leaves the runs' range on, each as a phrase:
    ``pp 64 > 16``, ``cp 16: 512 tokens per rank < 4,096``; with ``num_gpus``, also a scale
    beyond every run's (``16,384 GPUs > 6,144``), and with ``attention_share`` (the job's
    attention FLOP share) a larger share than any run's (``attention 41% of FLOPs > 21%``):
    every layout of the job shares these two, so the ranking's rule 0 does not read them."""
    layout = {axis: int(layout.get(axis) or 1) for axis in AXES[:4]}  # ep unset: 1
    found = axes_outside({axis: [layout[axis]] for axis in AXES[:4]}, layout_range, seq_len)
    reasons = []
    for axis in AXES[:4]:
        if found[axis][0]:
            reasons.append(f"{axis} {layout[axis]} > {getattr(layout_range, axis)}")
    if found["cp_tokens"][0]:
        per_rank = seq_len / layout["cp"]
        reasons.append(
            f"cp {layout['cp']}: {per_rank:,.0f} tokens per rank < "
            f"{layout_range.cp_tokens_per_rank:,}"
        )
    if layout_range is not None and num_gpus is not None and num_gpus > layout_range.num_gpus:
        reasons.append(f"{num_gpus:,} GPUs > {layout_range.num_gpus:,}")
    if (reason := attention_beyond(layout_range, attention_share)) is not None:
        reasons.append(reason)
    return reasons


def attention_beyond(layout_range: LayoutRange | None, attention_share: float | None) -> str | None:
    """``attention 41% of FLOPs > 21%`` where a job's attention FLOP share is larger than
    any of the runs' (shown to the percent: a share that rounds to the runs' is inside);
    None inside, or where either is unknown."""
    if layout_range is None or layout_range.attention_share is None or attention_share is None:
        return None
    if round(100 * attention_share) <= round(100 * layout_range.attention_share):
        return None
    return f"attention {attention_share:.0%} of FLOPs > {layout_range.attention_share:.0%}"


def describe(layout_range: LayoutRange | dict) -> str:
    """``tp ≤ 8, cp ≤ 32 (≥ 4,096 tokens per CP rank), pp ≤ 16, ep ≤ 64, ≤ 6,144 GPUs,
    attention ≤ 95% of FLOPs``."""
    layout_range = LayoutRange.model_validate(layout_range)
    cp = f"cp ≤ {layout_range.cp}"
    if layout_range.cp_tokens_per_rank is not None:
        cp += f" (≥ {layout_range.cp_tokens_per_rank:,} tokens per CP rank)"
    attention = (
        f", attention ≤ {layout_range.attention_share:.0%} of FLOPs"
        if layout_range.attention_share is not None
        else ""
    )
    return (
        f"tp ≤ {layout_range.tp}, {cp}, pp ≤ {layout_range.pp}, ep ≤ {layout_range.ep}, "
        f"≤ {layout_range.num_gpus:,} GPUs{attention}"
    )
