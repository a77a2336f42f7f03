"""The schedules by name, with the facts the rest of the planner needs about each.

Conventions shared by every schedule here:

* ``pp`` is the number of pipeline **ranks** (devices), as torch.distributed.pipelining's
  ``pp_degree`` and ``Layout.pp``. Every schedule uses all ``pp`` ranks.
* ``vpp`` is the number of chunks (virtual stages) each rank holds for one direction, so a
  chunk takes ``1/vpp`` of the rank's per-micro-batch time and activations. Stages:
  ``pp·vpp`` (DualPipe: ``pp`` per direction).
* Legal ``vpp``: ``gpipe``, ``1f1b``, ``zb-h1``, ``zb-h2``, ``dualpipe``: 1; ``zbv``,
  ``dualpipev``: exactly 2 (a V over ``2·pp`` stages); ``interleaved-1f1b``: any ``vpp ≥ 2``.
* ``parameter_copies``: model-weight copies per rank relative to holding ``1/pp`` of the
  layers once; 2 only for bidirectional DualPipe. (The DualPipe README's "2×" for DualPipeV
  compares ``PP/2`` devices against 1F1B's ``PP``; on the same ``pp`` ranks it is 1×.)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hwspecs.errors import PlanError, closest_match_hint
from planner.pipeline.schedules.actions import Schedule, require
from planner.pipeline.schedules.dualpipe import dualpipe, dualpipev
from planner.pipeline.schedules.gpipe import gpipe
from planner.pipeline.schedules.interleaved import interleaved_1f1b
from planner.pipeline.schedules.one_f_one_b import one_f_one_b
from planner.pipeline.schedules.zbv import zbv
from planner.pipeline.schedules.zero_bubble import zb_h1, zb_h2


@dataclass(frozen=True, slots=True)
class MicrobatchRule:
    """A constraint a schedule puts on (pp, num_microbatches): ``broken`` on numpy columns
    (True where the rule fails), ``message`` the one-line error for one layout, ``reason``
    how the search counts the rows it rejects."""

    reason: str
    broken: Callable[[np.ndarray, np.ndarray], np.ndarray]
    message: Callable[[int, int], str]


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A schedule's generator and its fixed properties."""

    name: str
    generate: Callable[..., Schedule]
    description: str
    #: The only legal vpp, or None when any vpp ≥ ``min_vpp`` is legal.
    fixed_vpp: int | None
    min_vpp: int
    default_vpp: int
    splits_backward: bool
    parameter_copies: int = 1
    #: Both directions at once (DualPipe): every rank holds stages r and pp − 1 − r.
    bidirectional: bool = False
    #: Two chunks per rank in a V (ZB-V, DualPipeV): rank r holds stages r and 2·pp − 1 − r.
    v_shape: bool = False
    #: One micro-batch's EP all-to-all overlaps another's compute in F&B pairs (DeepSeek-V3
    #: §3.2.1; deepseek-ai/DualPipe).
    overlaps_ep: bool = False
    #: What the generator needs of (pp, num_microbatches), beyond the vpp rule.
    microbatch_rules: tuple[MicrobatchRule, ...] = ()

    def broken_microbatches(self, pp, num_microbatches) -> np.ndarray:
        """Rows (numpy columns) that break one of :attr:`microbatch_rules`."""
        p, m = np.broadcast_arrays(np.asarray(pp), np.asarray(num_microbatches))
        bad = np.zeros(p.shape, dtype=bool)
        for rule in self.microbatch_rules:
            bad |= rule.broken(p, m)
        return bad

    def check_microbatches(self, pp: int, num_microbatches: int) -> None:
        """Raise the first broken rule's one-line error."""
        for rule in self.microbatch_rules:
            if rule.broken(np.asarray(pp), np.asarray(num_microbatches)):
                raise PlanError(rule.message(pp, num_microbatches))

    def allows_vpp(self, vpp: int) -> bool:
        return vpp == self.fixed_vpp if self.fixed_vpp is not None else vpp >= self.min_vpp

    def vpp_rule(self) -> str:
        if self.fixed_vpp is not None:
            return f"vpp = {self.fixed_vpp}"
        return f"vpp ≥ {self.min_vpp}"

    def resolve_vpp(self, vpp: int | None) -> int:
        """The schedule's default when ``vpp`` is None; otherwise ``vpp`` once checked."""
        if vpp is None:
            return self.default_vpp
        require(self.allows_vpp(vpp), f"{self.name} needs {self.vpp_rule()}, got vpp={vpp}")
        return vpp

    def options(self) -> tuple[str, ...]:
        """Keyword options of the generator beyond ``(pp, num_microbatches, vpp)``."""
        return tuple(list(inspect.signature(self.generate).parameters)[3:])

    def num_ranks(self, pp: int) -> int:
        """Devices the schedule runs on: always ``pp`` (see the module docstring)."""
        return pp

    def chunks_per_rank(self, vpp: int | None = None) -> int:
        """Parts one rank's per-micro-batch work splits into (DualPipe's chunks are whole)."""
        return 1 if self.bidirectional else self.resolve_vpp(vpp)

    def num_stages(self, pp: int, vpp: int) -> int:
        """Stages along one micro-batch's path (DualPipe: per direction)."""
        return pp * vpp


def _spec(name, generate, description, vpp, splits_backward, **extra) -> ScheduleSpec:
    """``vpp``: the fixed chunk count, or a ``(min, default)`` pair when it is free."""
    fixed, (least, default) = (vpp, (vpp, vpp)) if isinstance(vpp, int) else (None, vpp)
    return ScheduleSpec(
        name, generate, description, fixed, least, default, splits_backward, **extra
    )


#: Llama 3's interleaved schedule without a group size N (N = pp): m a multiple of pp.
INTERLEAVED_RULES = (
    MicrobatchRule(
        "interleaved-1f1b needs micro-batches a multiple of pp",
        lambda pp, m: (m % pp != 0) | (m < pp),
        lambda pp, m: (
            f"interleaved-1f1b needs num_microbatches to be a multiple of pp (got {m} and "
            f"pp={pp}), or a microbatch_group_size N with pp ≤ N ≤ num_microbatches"
        ),
    ),
)
#: DualPipe (deepseek-ai/DualPipe ``DualPipe.step``): the ranks pair up in both directions
#: and each direction takes half the micro-batches, at least pp each.
DUALPIPE_RULES = (
    MicrobatchRule(
        "dualpipe needs an even pp and an even number ≥ 2·pp of micro-batches",
        lambda pp, m: (pp % 2 != 0) | (m % 2 != 0) | (m < 2 * pp),
        lambda pp, m: (
            f"dualpipe needs an even pp and an even num_microbatches ≥ 2·pp, got {pp}, {m}"
        ),
    ),
)
#: DualPipeV (the same repository's ``DualPipeV.step``): at least 2·pp micro-batches.
DUALPIPEV_RULES = (
    MicrobatchRule(
        "dualpipev needs ≥ 2·pp micro-batches",
        lambda pp, m: m < 2 * pp,
        lambda pp, m: f"dualpipev needs num_microbatches ≥ 2·pp = {2 * pp}, got {m}",
    ),
)

SCHEDULES: dict[str, ScheduleSpec] = {
    spec.name: spec
    for spec in (
        _spec("gpipe", gpipe, "all forwards, then all backwards", 1, False),
        _spec("1f1b", one_f_one_b, "one forward, one backward (PipeDream-Flush)", 1, False),
        _spec(
            "interleaved-1f1b",
            interleaved_1f1b,
            "Megatron's interleaved 1F1B over vpp chunks (Llama 3's N: microbatch_group_size)",
            (2, 2),
            False,
            microbatch_rules=INTERLEAVED_RULES,
        ),
        _spec("zb-h1", zb_h1, "zero-bubble H1: 1F1B memory, W fills the tail", 1, True),
        _spec("zb-h2", zb_h2, "zero-bubble H2: 2p−1 in flight, W reordered", 1, True),
        _spec("zbv", zbv, "zero-bubble V: two chunks per rank in a V", 2, True, v_shape=True),
        _spec(
            "dualpipe",
            dualpipe,
            "DeepSeek's DualPipe: both directions, overlapped F&B pairs",
            1,
            True,
            parameter_copies=2,
            bidirectional=True,
            overlaps_ep=True,
            microbatch_rules=DUALPIPE_RULES,
        ),
        _spec(
            "dualpipev",
            dualpipev,
            "DualPipe cut into a V (torch's DualPipeV)",
            2,
            True,
            v_shape=True,
            overlaps_ep=True,
            microbatch_rules=DUALPIPEV_RULES,
        ),
    )
}
#: Schedules by the facts the cost model reads.
V_SHAPE_SCHEDULES = frozenset(name for name, spec in SCHEDULES.items() if spec.v_shape)
BIDIRECTIONAL_SCHEDULES = frozenset(name for name, spec in SCHEDULES.items() if spec.bidirectional)
EP_OVERLAP_SCHEDULES = tuple(name for name, spec in SCHEDULES.items() if spec.overlaps_ep)


def get_schedule(name: str) -> ScheduleSpec:
    """The spec of schedule ``name``; a one-line :class:`PlanError` for an unknown name."""
    spec = SCHEDULES.get(name)
    if spec is None:
        raise PlanError(
            f"unknown schedule '{name}'{closest_match_hint(name, SCHEDULES)}; "
            f"choose one of: {', '.join(SCHEDULES)}"
        )
    return spec


def generate_schedule(
    name: str, pp: int, num_microbatches: int, vpp: int | None = None, **options: int
) -> Schedule:
    """Per-rank action lists of schedule ``name``; ``vpp=None`` takes the schedule's default.

    ``options`` go to the generator: ``microbatch_group_size`` (Llama 3's N) for
    ``interleaved-1f1b``.
    """
    spec = get_schedule(name)
    resolved = spec.resolve_vpp(vpp)
    unknown = sorted(set(options) - set(spec.options()))
    require(
        not unknown,
        f"{name} does not take option(s) {', '.join(unknown)}; it takes: "
        f"{', '.join(spec.options()) or 'none'}",
    )
    return spec.generate(pp, num_microbatches, resolved, **options)
