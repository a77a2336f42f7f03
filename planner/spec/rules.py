"""The rules a layout must keep, in one table: a reason, a vectorized predicate, a message.

Each :class:`Rule` reads numpy columns of layouts (one row each; a single layout is a
1-row column), the ones it names, and says where it is broken. :func:`check_layout` raises the first broken
rule's message for one layout; the search (:mod:`planner.search`) counts the rows each rule
rejects, in this order, under the rule's ``reason``. The schedules' own constraints on
(pp, num_microbatches) come from the schedule registry
(:attr:`planner.pipeline.schedules.registry.ScheduleSpec.microbatch_rules`).

Sources: TP splits attention heads, KV heads (replicated beyond their count) and the MLP's
hidden size (Shoeybi et al. 2019 §3); load-balanced context parallelism splits the sequence
into 2·cp chunks (Llama 3 §3.3.2); sequence parallelism splits each CP shard over TP
(Korthikanti et al. 2022 §4.2.2); expert parallelism is carved out of dp·cp and, with whole
experts (etp 1), folds the TP ranks into the EP group (Megatron-Core's MoE parallel folding,
:func:`planner.spec.layout.check_expert_tp`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hwspecs.errors import PlanError
from planner.columns.codes import Labels
from planner.spec.layout import (
    CP_ALGORITHMS,
    Layout,
    check_expert_tp,
    layers_per_virtual_stage,
)
from planner.spec.model import ModelSpec

#: Columns the rules read: tp, cp, pp, dp, ep, etp (resolved: tp where experts split like the
#: MLP), vpp, sequence_parallel, schedule (strings or Labels) and, where a schedule rule is
#: checked, num_microbatches; ``split`` the pipeline layer split (one value or a column).
Columns = dict[str, np.ndarray]


@dataclass(frozen=True)
class Rule:
    """One rule: ``broken(model, seq_len, columns)`` is True on the rows that break it;
    ``message(model, seq_len, row)`` the one-line error for one layout (``row``: plain
    values of the columns); ``reason`` how the search counts its rejections."""

    name: str
    reason: Callable[[ModelSpec], str]
    broken: Callable[[ModelSpec, int | None, Columns], np.ndarray]
    message: Callable[[ModelSpec, int | None, dict], str]
    #: The columns ``broken`` reads (it reads no other): the search works it out once per
    #: distinct combination of their values (:func:`planner.candidates.first_rejections`).
    reads: tuple[str, ...]


def _fold(c: Columns) -> np.ndarray:
    """TP ranks folded into each EP group (tp/etp; at least 1, where the etp rule fails)."""
    return np.maximum(c["tp"] // np.maximum(c["etp"], 1), 1)


def layers_broken(layers: int, c: Columns, num_mtp_modules: int | None = None) -> np.ndarray:
    """Rows whose ``layers`` cannot split over pp·vpp stages (the auto split, and the
    work-balanced one, which is legal wherever auto is: evenly, one fewer on the first and
    last stage, or balanced; another named split, or a written layout, which must also place
    the model's ``num_mtp_modules``, is checked per distinct value)."""
    stages = c["pp"] * c["vpp"]
    split = c.get("split", "auto")
    if isinstance(split, str) and split in ("auto", "work-balanced"):  # legal where auto is
        return (stages > layers) & ((layers + 2) % stages != 0)
    splits = np.broadcast_to(np.asarray(split, dtype=object), stages.shape)
    bad = np.zeros(stages.shape, dtype=bool)
    if isinstance(split, str):  # one split: per distinct (pp, vpp)
        pairs = np.unique(np.stack(np.broadcast_arrays(c["pp"], c["vpp"])).reshape(2, -1), axis=1)
        keys = {(int(p), int(v), split) for p, v in pairs.T}
    else:
        keys = {(int(p), int(v), s) for p, v, s in zip(c["pp"], c["vpp"], splits, strict=True)}
    for p, v, name in keys:
        try:
            layers_per_virtual_stage(layers, p, v, name, num_mtp_modules=num_mtp_modules)
        except PlanError:
            bad |= (c["pp"] == p) & (c["vpp"] == v) & (splits == name)
    return bad


def _layers_message(model: ModelSpec, row: dict) -> str:
    split = row.get("split", "auto")
    try:
        layers_per_virtual_stage(
            model.num_layers, row["pp"], row["vpp"], split, num_mtp_modules=model.num_mtp_modules
        )
    except PlanError as error:
        return str(error)
    return ""


def _expert_message(row: dict) -> str:
    try:
        check_expert_tp(row["tp"], row["ep"], row["dp"] * row["cp"], row["etp"])
    except PlanError as error:
        return str(error)
    return ""


def _expert_axis(row: dict) -> str:
    return f"ep {row['ep']}" if row["ep"] > 1 else f"etp {row['etp']}"


def _ffn_message(model: ModelSpec, row: dict) -> str:
    tp = row["tp"]
    if model.ffn_hidden_size % tp:
        return f"tp {tp} does not divide ffn_hidden_size {model.ffn_hidden_size}"
    return f"tp {tp} does not divide moe_ffn_hidden_size {model.moe_ffn_hidden_size}"


def _algorithm(c: Columns) -> np.ndarray:
    """Each row's CP algorithm code (planner.spec.layout.CP_ALGORITHMS; 0, all-gather, where
    the columns leave it out)."""
    if "cp_algorithm" not in c:
        return np.zeros(np.shape(c["cp"]), dtype=np.int64)
    column = c["cp_algorithm"]
    labels = Labels.of(column)
    lookup = np.array([CP_ALGORITHMS.index(str(v)) for v in labels.values], dtype=np.int64)
    return lookup[labels.codes].reshape(np.shape(c["cp"]))


def _cp_chunks(c: Columns) -> np.ndarray:
    """Chunks the sequence is split into: 2·cp for the load-balanced (zig-zag) forms —
    all-gather (Llama 3 §3.3.2), ring (Brandon et al. 2023; TransformerEngine), hierarchical
    (Megatron-Core) — and cp for Ulysses, which splits it plainly (Jacobs et al. 2023)."""
    return np.where(_algorithm(c) == CP_ALGORITHMS.index("ulysses"), 1, 2) * c["cp"]


def _cp_sequence_message(s, r: dict) -> str:
    name = r.get("cp_algorithm", "all-gather")
    if name == "ulysses":
        return f"seq_len {s} is not divisible by cp {r['cp']} (Ulysses splits the sequence over cp)"
    return (
        f"seq_len {s} is not divisible by 2·cp = {2 * r['cp']} "
        f"(load-balanced context parallelism ({name}) splits the sequence into 2·cp chunks)"
    )


def _ulysses_degree(c: Columns) -> np.ndarray:
    """Ranks an all-to-all re-shards heads over: cp (Ulysses), the inner degree
    (hierarchical; ``cp_inner`` where the columns give it, else none checked), else 1."""
    algorithm = _algorithm(c)
    inner = np.asarray(c.get("cp_inner", 1))
    return np.where(algorithm == CP_ALGORITHMS.index("ulysses"), c["cp"],
                    np.where(algorithm == CP_ALGORITHMS.index("hierarchical"), inner, 1))  # fmt: skip


def _heads_per_rank(m: ModelSpec, tp) -> tuple[np.ndarray, np.ndarray]:
    """(attention heads, KV heads) per TP rank (KV replicated beyond their count; MLA: one
    K and V per attention head after the up-projection)."""
    tp = np.asarray(tp)
    heads = m.num_attention_heads // np.maximum(tp, 1)
    if m.attention_kind == "mla":
        return heads, heads
    return heads, np.maximum(m.num_kv_heads // np.maximum(tp, 1), 1)


def _replicated_kv(c: Columns) -> np.ndarray:
    """Rows whose K/V heads Ulysses may repeat up to its degree: pure Ulysses under the job's
    ``ulysses_kv_heads = "replicate"`` (columns key ``replicate_kv``; verl's Ulysses), never
    hierarchical (Megatron-Core's a2a+p2p runs TransformerEngine's whole-head all-to-all)."""
    replicate = np.asarray(c.get("replicate_kv", False), dtype=bool)
    return replicate & (_algorithm(c) == CP_ALGORITHMS.index("ulysses"))


def _ulysses_heads_broken(m: ModelSpec, c: Columns) -> np.ndarray:
    """Ulysses re-shards whole heads: TransformerEngine's all-to-all CP asserts that the
    degree divides the Q and the K/V heads of a rank (no KV-head replication); where the
    K/V heads are repeated by ``degree // kv`` first (verl), a degree that is a multiple of
    them also works (:func:`planner.cost.context_parallel.ulysses_kv_repeats`)."""
    degree = _ulysses_degree(c)
    heads, kv = _heads_per_rank(m, c["tp"])
    kv_ok = (kv % degree == 0) | (_replicated_kv(c) & (degree % kv == 0))
    return (degree > 1) & ((heads % degree != 0) | ~kv_ok)


def _ulysses_heads_message(m: ModelSpec, r: dict) -> str:
    heads, kv = (int(x) for x in _heads_per_rank(m, r["tp"]))
    degree = int(_ulysses_degree({k: np.asarray([v]) for k, v in r.items()})[0])
    if bool(_replicated_kv({k: np.asarray([v]) for k, v in r.items()})[0]):
        return (
            f"cp_algorithm ulysses: its all-to-all over {degree} ranks must divide the {heads} "
            f"attention heads per TP rank (tp {r['tp']}) and divide or be a multiple of its "
            f"{kv} KV heads (repeated up to the degree): use a smaller cp or tp, or "
            f"cp_algorithm ring"
        )
    fixes = (
        "a smaller cp_inner or tp, or cp_algorithm ring"
        if r.get("cp_algorithm") == "hierarchical"
        else "a smaller cp or tp, cp_algorithm ring, or --ulysses-kv-heads replicate (Ulysses "
        "that repeats them, as verl's does)"
    )
    return (
        f"cp_algorithm {r.get('cp_algorithm')}: its all-to-all over {degree} ranks must divide "
        f"the {heads} attention heads and {kv} KV heads per TP rank (tp {r['tp']}); "
        f"TransformerEngine re-shards whole heads and does not replicate KV heads: use {fixes}"
    )


RULES: tuple[Rule, ...] = (
    Rule(
        "heads",
        lambda m: f"tp does not divide the {m.num_attention_heads} attention heads",
        lambda m, s, c: m.num_attention_heads % c["tp"] != 0,
        lambda m, s, r: f"tp {r['tp']} does not divide num_attention_heads {m.num_attention_heads}",
        ("tp",),
    ),
    Rule(
        "kv_heads",
        lambda m: f"tp and the {m.num_kv_heads} KV heads do not divide one another",
        lambda m, s, c: (
            (m.attention_kind != "mla")
            & (c["tp"] % m.num_kv_heads != 0)
            & (m.num_kv_heads % c["tp"] != 0)
        ),
        lambda m, s, r: (
            f"tp {r['tp']} and num_kv_heads {m.num_kv_heads} must divide one another "
            f"(KV heads are split, or replicated when tp > kv heads)"
        ),
        ("tp",),
    ),
    Rule(
        "ffn",
        lambda m: "tp does not divide the FFN size",
        lambda m, s, c: (
            (m.ffn_hidden_size % c["tp"] != 0) | ((m.moe_ffn_hidden_size or c["tp"]) % c["tp"] != 0)
        ),
        lambda m, s, r: _ffn_message(m, r),
        ("tp",),
    ),
    Rule(
        "layers",
        lambda m: "layers do not split over pp·vpp stages",
        lambda m, s, c: layers_broken(m.num_layers, c, m.num_mtp_modules),
        lambda m, s, r: _layers_message(m, r),
        ("pp", "vpp", "split"),
    ),
    Rule(
        "dense_experts",
        lambda m: "ep or etp on a dense model",
        lambda m, s, c: (not m.is_moe) & ((c["ep"] > 1) | (c["etp"] != c["tp"])),
        lambda m, s, r: f"{_expert_axis(r)} needs a mixture-of-experts model; {m.name} is dense",
        ("tp", "ep", "etp"),
    ),
    Rule(
        "etp",
        lambda m: "etp is neither 1 nor tp",
        lambda m, s, c: (c["etp"] != 1) & (c["etp"] != c["tp"]),
        lambda m, s, r: _expert_message(r),
        ("tp", "etp"),
    ),
    Rule(
        "ep_fold",
        lambda m: "ep is not a multiple of tp/etp (etp 1 folds TP into EP)",
        lambda m, s, c: c["ep"] % _fold(c) != 0,
        lambda m, s, r: _expert_message(r),
        ("tp", "ep", "etp"),
    ),
    Rule(
        "ep_carved",
        lambda m: "ep does not divide dp·cp or the experts",
        lambda m, s, c: (c["dp"] * c["cp"]) % np.maximum(c["ep"] // _fold(c), 1) != 0,
        lambda m, s, r: _expert_message(r),
        ("tp", "cp", "dp", "ep", "etp"),
    ),
    Rule(
        "ep_experts",
        lambda m: "ep does not divide dp·cp or the experts",
        lambda m, s, c: (m.num_routed_experts or 1) % c["ep"] != 0,
        lambda m, s, r: f"ep {r['ep']} does not divide num_routed_experts {m.num_routed_experts}",
        ("ep",),
    ),
    Rule(
        "cp_sequence",
        lambda m: "sequence not divisible by 2·cp (load-balanced CP) or by cp (Ulysses)",
        lambda m, s, c: (s is not None) & (c["cp"] > 1) & ((s or 1) % _cp_chunks(c) != 0),
        lambda m, s, r: _cp_sequence_message(s, r),
        ("cp", "cp_algorithm"),
    ),
    Rule(
        "cp_heads",
        lambda m: "Ulysses degree does not divide the attention or KV heads per TP rank",
        lambda m, s, c: _ulysses_heads_broken(m, c),
        lambda m, s, r: _ulysses_heads_message(m, r),
        ("tp", "cp", "cp_algorithm", "cp_inner", "replicate_kv"),
    ),
    Rule(
        "sp_sequence",
        lambda m: "sequence/cp not divisible by tp under sequence parallelism",
        lambda m, s, c: (
            (s is not None)
            & c["sequence_parallel"]
            & (c["tp"] > 1)
            & (((s or 1) // c["cp"]) % c["tp"] != 0)
        ),
        lambda m, s, r: (
            f"sequence parallelism needs seq_len/cp = {s // r['cp']} divisible by tp {r['tp']}"
        ),
        ("tp", "cp", "sequence_parallel"),
    ),
)


#: The rules that decide whether a row's EP group can be formed.
EXPERT_GROUP_RULES = tuple(rule for rule in RULES if rule.name in ("etp", "ep_fold", "ep_carved"))


def expert_split_ok(tp, cp, dp, ep, etp) -> np.ndarray:
    """Rows (numpy columns) whose EP group can be formed: :data:`EXPERT_GROUP_RULES` kept."""
    columns = {"tp": tp, "cp": cp, "dp": dp, "ep": ep, "etp": etp}
    broken = np.zeros(np.broadcast(tp, cp, dp, ep, etp).shape, dtype=bool)
    for rule in EXPERT_GROUP_RULES:
        broken |= rule.broken(None, None, columns)
    return ~broken


def schedule_rules() -> tuple[Rule, ...]:
    """The registry's (pp, num_microbatches) rules as layout rules, one per schedule rule."""
    from planner.pipeline.schedules.registry import SCHEDULES

    def runs(name: str, c: Columns) -> np.ndarray:
        return Labels.of(c["schedule"]).isin((name,))

    return tuple(
        Rule(
            f"{name}:{index}",
            lambda m, rule=rule: rule.reason,
            lambda m, s, c, name=name, rule=rule: (
                runs(name, c) & rule.broken(c["pp"], c["num_microbatches"])
            ),
            lambda m, s, r, rule=rule: rule.message(r["pp"], r["num_microbatches"]),
            ("schedule", "pp", "num_microbatches"),
        )
        for name, spec in SCHEDULES.items()
        for index, rule in enumerate(spec.microbatch_rules)
    )


def layout_columns_for_rules(
    layout: Layout, num_microbatches: int | None = None, cp_inner: int | None = None,
    replicate_kv: bool = False,
) -> Columns:  # fmt: skip
    """One layout as the 1-row columns the rules read (``etp`` resolved; ``cp_inner``:
    hierarchical CP's inner degree where the placement is known; ``replicate_kv``: the job's
    Ulysses repeats K/V heads, ``Job.ulysses_kv_heads``)."""
    columns = {
        "tp": layout.tp, "cp": layout.cp, "pp": layout.pp, "dp": layout.dp, "ep": layout.ep,
        "etp": layout.expert_tp, "vpp": layout.vpp,
        "sequence_parallel": layout.sequence_parallel, "schedule": layout.schedule,
        "cp_algorithm": layout.cp_algorithm,
    }  # fmt: skip
    if cp_inner is not None:
        columns["cp_inner"] = cp_inner
    if replicate_kv:
        columns["replicate_kv"] = True
    if num_microbatches is not None:
        columns["num_microbatches"] = num_microbatches
    out = {key: np.array([value]) for key, value in columns.items()}
    out["split"] = layout.pipeline_layer_split
    return out


def first_broken(
    rules, model: ModelSpec, seq_len: int | None, columns: Columns
) -> tuple[Rule, np.ndarray] | None:
    """The first rule any row breaks and the rows that break it (None: every row keeps all)."""
    for rule in rules:
        broken = np.asarray(rule.broken(model, seq_len, columns), dtype=bool)
        if broken.any():
            return rule, broken
    return None


def check_layout(
    layout: Layout, model: ModelSpec, seq_len: int | None = None, num_microbatches=None,
    cp_inner: int | None = None, replicate_kv: bool = False,
) -> None:  # fmt: skip
    """Check one layout against every rule (the schedule's too, with ``num_microbatches``;
    hierarchical CP's heads with ``cp_inner``, its inner degree on the cluster; Ulysses'
    K/V heads repeated under ``replicate_kv``); raise the first broken rule's one-line
    message as a :class:`PlanError`."""
    columns = layout_columns_for_rules(layout, num_microbatches, cp_inner, replicate_kv)
    rules = RULES + (schedule_rules() if num_microbatches is not None else ())
    found = first_broken(rules, model, seq_len, columns)
    if found is not None:
        row = {key: value.item() if isinstance(value, np.ndarray) else value
               for key, value in columns.items()}  # fmt: skip
        raise PlanError(found[0].message(model, seq_len, row))
