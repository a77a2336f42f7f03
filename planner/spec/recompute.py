"""Recomputation policies: whole-layer ones and Megatron-Core's selective modules.

A policy is ``none``, ``selective`` (the attention core, Korthikanti et al. 2022 §4.2),
``dots`` (only the projections' outputs kept, JAX's ``checkpoint_dots``) or ``full`` (only
each layer's input kept), or a set of Megatron-Core's selective modules joined by ``+``
(``layernorm+moe_act``): ``--recompute-granularity selective --recompute-modules …``
(``TransformerConfig.recompute_modules``, Megatron-Core 0.13 and later). What each module
reruns and drops is Megatron-Bridge's ``docs/training/activation-recomputation.md``
(NVIDIA-NeMo/Megatron-Bridge @067f987, "Recomputation Modules"):

* ``core_attn``: the attention core (alone, it is ``selective``);
* ``layernorm``: the input and pre-MLP norms' outputs;
* ``mla_up_proj``: MLA's expanded query and key/value projections and their rotary;
* ``moe_act``: the routed experts' activation output;
* ``mlp``: the whole dense MLP (no effect on MoE layers);
* ``shared_experts``: the shared experts' MLP.

``moe`` (the whole MoE layer, its dispatch and combine all-to-alls replayed) is not
modelled: its rerun is communication this model does not schedule.
"""

from __future__ import annotations

from hwspecs.errors import PlanError

#: Policies that are not a module set.
WHOLE_POLICIES = ("none", "selective", "dots", "full")
#: Megatron-Core's selective modules this model reruns, in the order a policy names them.
MEGATRON_MODULES = ("core_attn", "layernorm", "mla_up_proj", "moe_act", "mlp", "shared_experts")
#: Modules Megatron-Core has that this model does not, and why.
UNMODELLED_MODULES = {
    "moe": "its rerun replays the MoE layer's dispatch and combine all-to-alls, "
    "which this model does not schedule",
}


def recompute_modules(policy: str) -> frozenset[str]:
    """The Megatron-Core modules ``policy`` reruns: ``selective`` is ``core_attn``; a
    ``+``-joined set is itself; the whole-layer policies none (``full`` and ``dots`` are
    handled whole)."""
    if policy == "selective":
        return frozenset({"core_attn"})
    if policy in WHOLE_POLICIES:
        return frozenset()
    return frozenset(policy.split("+"))


def checked_recompute(text: str) -> str:
    """``text`` as a policy name: a whole policy, or a set of modules in
    :data:`MEGATRON_MODULES` order (``core_attn`` alone is ``selective``). One line naming
    the allowed values otherwise."""
    if text in WHOLE_POLICIES:
        return text
    parts = [part.strip() for part in text.split("+")]
    for part in parts:
        if part in UNMODELLED_MODULES:
            raise PlanError(f"module '{part}' is not modelled: {UNMODELLED_MODULES[part]}")
        if part not in MEGATRON_MODULES:
            raise PlanError(
                f"recompute must be one of {', '.join(WHOLE_POLICIES)} or Megatron-Core modules "
                f"joined by '+' ({', '.join(MEGATRON_MODULES)}); got '{text}'",
                allowed=[*WHOLE_POLICIES, *MEGATRON_MODULES],
                got=text,
            )
    modules = [name for name in MEGATRON_MODULES if name in parts]
    return "selective" if modules == ["core_attn"] else "+".join(modules)


def model_modules(model) -> tuple[str, ...]:
    """The selective modules that rerun something in ``model`` (a ``ModelSpec``): the
    attention core and the norms always, MLA's up-projections under MLA, the routed
    experts' activation under MoE, the dense MLP where dense layers are, the shared experts
    where there are some."""
    present = {
        "core_attn": True,
        "layernorm": True,
        "mla_up_proj": model.attention_kind == "mla",
        "moe_act": model.is_moe,
        "mlp": model.num_layers > model.num_moe_layers,
        "shared_experts": model.is_moe and model.num_shared_experts > 0,
    }
    return tuple(name for name in MEGATRON_MODULES if present[name])


def module_policies(model) -> list[str]:
    """Every non-empty set of ``model``'s selective modules (:func:`model_modules`), as
    policy names (``core_attn`` alone is ``selective``)."""
    names = model_modules(model)
    return [
        checked_recompute("+".join(n for i, n in enumerate(names) if mask >> i & 1))
        for mask in range(1, 1 << len(names))
    ]
