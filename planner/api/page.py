"""What a plan page marks and shows on hover, computed here so the plot only draws.

:func:`plan_page_marks` finds the layouts a page marks besides the winner: the published
layouts of the same model at the same scale (rows of a runs file — the shipped catalog, or a
user's or the shared reference's file — with the model's architecture, the query's GPU
count and sequence length) and a layout the user names (``--mark tp=8,pp=16``). Each is
placed on the best-ranked feasible row with its parallel degrees (a published row gives
degrees, not every setting), or reported as not feasible. :func:`plan_page_rows` adds to
the drawn rows their step-time interval (the profile's cross-validated band, as the
estimate carries it).
"""

from __future__ import annotations

from pydantic import BaseModel

from hwspecs.errors import PlanError

#: The degrees a mark matches on (ep only where the model has experts).
MARK_AXES = ("tp", "cp", "pp", "dp", "ep")


class PageMark(BaseModel):
    """One layout a plan page marks: its degrees, where it came from, the row drawn for it."""

    label: str
    kind: str  # "published" or "named"
    degrees: dict[str, int]
    source: str = ""
    #: Index into the plan's table of the best-ranked feasible row with these degrees.
    row: int | None = None
    note: str = ""


def parse_mark(text: str) -> dict[str, int]:
    """``tp=8,pp=16,dp=128`` as degrees (unnamed axes: any value)."""
    degrees = {}
    for part in (piece.strip() for piece in text.split(",") if piece.strip()):
        axis, _, size = part.partition("=")
        axis = axis.strip()
        if axis not in MARK_AXES or not size.strip().isdigit() or int(size) < 1:
            raise PlanError(
                f"--mark takes axis=degree pairs of {', '.join(MARK_AXES)}, e.g. tp=8,pp=16; "
                f"got '{part}'",
                field="mark",
                allowed="axis=degree pairs, e.g. tp=8,pp=16,dp=128",
                got=text,
            )
        degrees[axis] = int(size)
    if not degrees:
        raise PlanError("--mark takes axis=degree pairs, e.g. tp=8,pp=16", field="mark", got=text)
    return degrees


def _same_architecture(run_model, model) -> bool:
    """A run's model is the query's: the same layers, width, heads and vocabulary."""
    return (run_model.layers, run_model.hidden, run_model.heads, run_model.vocab) == (
        model.num_layers,
        model.hidden_size,
        model.num_attention_heads,
        model.vocab_size,
    )


def published_layouts(job, num_gpus: int, runs: list[str]) -> list[PageMark]:
    """The layouts of the runs in ``runs`` (catalog names or files) that trained ``job``'s
    model at ``num_gpus`` GPUs and its sequence length, one mark per distinct layout."""
    from hwspecs.catalog import load_runs

    marks: dict[tuple, PageMark] = {}
    for name in runs:
        for row in load_runs(name):
            t = row.training
            if not (
                _same_architecture(row.model, job.model)
                and row.hardware.num_gpus == num_gpus
                and t.seq_len == job.seq_len
                and t.dp is not None
            ):
                continue
            degrees = {"tp": t.tp, "cp": t.cp, "pp": t.pp, "dp": t.dp}
            if job.model.is_moe:
                degrees["ep"] = t.ep or 1
            key = tuple(degrees.values())
            if key not in marks:
                marks[key] = PageMark(
                    label=f"published: {row.id}", kind="published", degrees=degrees,
                    source=f"{row.source} ({row.id})",
                )  # fmt: skip
    return list(marks.values())


def plan_page_marks(table, job, result, runs: list[str] | None = None, named=None):
    """The marks of a plan page (:class:`PageMark`), each on its best feasible row.

    ``runs``: runs files or catalogs whose published layouts are marked (default: the
    shipped catalog, ``train``); ``named``: degrees the user asked to mark (``--mark``)."""
    import numpy as np

    num_gpus = result.query["num_gpus"]
    marks = published_layouts(job, num_gpus, list(runs) if runs else ["train"])
    if named:
        label = "named: " + " ".join(f"{axis} {size}" for axis, size in named.items())
        marks.append(PageMark(label=label, kind="named", degrees=dict(named)))
    for mark in marks:
        matches = np.ones(len(table), dtype=bool)
        for axis, size in mark.degrees.items():
            matches &= table[axis].to_numpy() == size
        found = np.flatnonzero(matches)  # the table is ranked: the first is the best
        if len(found):
            mark.row = int(found[0])
            mark.note = f"best of {len(found):,} feasible rows with these degrees"
        else:
            mark.note = "no feasible row with these degrees (does not fit or breaks a rule)"
    return marks


def plan_page_rows(table, rows, result):
    """The drawn ``rows`` of the plan's table, with ``step_time_low_s`` and
    ``step_time_high_s``: the profile's band (the winner's, as ratios of its step time;
    :func:`planner.cost.profile.profile_intervals`), equal to the step without a profile."""
    drawn = table.iloc[rows].copy()
    step = drawn["step_time_s"].to_numpy()
    low, high = 1.0, 1.0
    winner = result.results[0] if result.results else None
    if winner is not None and winner.get("step_time_interval_s"):
        interval = winner["step_time_interval_s"]
        low, high = interval[0] / winner["step_time_s"], interval[1] / winner["step_time_s"]
    drawn["step_time_low_s"] = step * low
    drawn["step_time_high_s"] = step * high
    return drawn
