"""Explanations and hand-offs of a plan: why the winner wins, each term's formula, and the
winning layout as torchtitan settings or Megatron-LM arguments.

Pure functions from results to text; the CLI prints them.
"""

from __future__ import annotations

from itertools import groupby

from planner.cost.memory import usable_memory_bytes
from planner.spec.layout import (
    end_stage_work,
    layers_per_virtual_stage,
    model_layers_per_virtual_stage,
)
from planner.spec.work_balance import busiest_rank_work


def explain_plan(found, results: list[dict], accelerator, mem_headroom: float) -> list[str]:
    """Why the winner beats the runner-up, and why the big rejected groups failed."""
    lines = []
    gib = 2**30
    if len(results) >= 2:
        first, second = results[0], results[1]
        gap = second["step_time_s"] - first["step_time_s"]
        verb = "beats the runner-up by" if gap >= 0 else "ties with a faster runner-up, by"
        lines.append(  # a faster runner-up: a tie ordered by the rules (planner/rank.py)
            f"winner {verb} {abs(gap) * 1e3:,.1f} ms per step "
            f"({first['step_time_s']:.3f} s vs {second['step_time_s']:.3f} s)"
        )
        terms = sorted(
            (
                (key, second["time_breakdown_s"][key] - first["time_breakdown_s"][key])
                for key in first["time_breakdown_s"]
            ),
            key=lambda item: -abs(item[1]),
        )
        for key, delta in terms[:3]:
            if abs(delta) > 1e-6:
                lines.append(
                    f"  {key}: {first['time_breakdown_s'][key]:.3f} s vs "
                    f"{second['time_breakdown_s'][key]:.3f} s ({delta * 1e3:+,.1f} ms for the runner-up)"
                )
    for reason, count in sorted(found.rejected.items(), key=lambda item: -item[1]):
        lines.append(f"rejected {count:,}: {reason}")
    if found.smallest_memory is not None:
        small = found.smallest_memory
        usable = usable_memory_bytes(accelerator.hbm_bytes, mem_headroom) / gib
        needed = small["memory_per_gpu_bytes"] / gib
        lines.append(  # the excess too: the two can round to the same GiB
            f"smallest layout that did not fit needs {needed:.2f} GiB per GPU, "
            f"{usable:.2f} GiB available, {(needed - usable) * 1024:,.1f} MiB over "
            f"(tp {small['tp']}, cp {small['cp']}, pp {small['pp']}, "
            f"dp {small['dp']}, {small['schedule']}, recompute {small['recompute']})"
        )
    return lines


def layer_split_lines(model, result: dict) -> list[str]:
    """The winner's layers per virtual stage, and what its split gains on the busiest rank
    over ``auto``'s where they differ (:func:`planner.spec.work_balance.work_balanced_layers`)."""
    lay = result["layout"]
    pp, vpp, schedule = lay["pp"], lay["vpp"], lay["schedule"]
    if pp * vpp == 1:
        return []
    split = lay.get("pipeline_layer_split", "auto")
    layers = model_layers_per_virtual_stage(model, pp, vpp, split, schedule)
    line = f"layers per virtual stage: {_counts_text(layers)} ({split})"
    if split != "work-balanced":
        return [line]
    auto = layers_per_virtual_stage(model.num_layers, pp, vpp, "auto")
    if (layers != auto).any():
        ends = end_stage_work(model)
        line += (
            f"; auto's {_counts_text(auto)} would leave the busiest rank "
            f"{busiest_rank_work(auto, ends, pp, vpp, schedule):.2f} layers' work per "
            f"micro-batch against {busiest_rank_work(layers, ends, pp, vpp, schedule):.2f} "
            f"(the last stage's head and MTP modules count {ends[1]:.2f} layers)"
        )
    return [line]


def _counts_text(layers) -> str:
    """Layer counts with runs of equal counts as ``4×6``: "1, 4×6, 5×2, 4×6, 3"."""
    runs = ((int(count), len(list(run))) for count, run in groupby(layers))
    return ", ".join(f"{count}×{n}" if n > 1 else str(count) for count, n in runs)


def explain_estimate(result, job) -> list[str]:
    """Each term of an estimate with the formula and the numbers behind it."""
    from hwspecs.catalog import load_accelerator
    from planner.cost.flops import model_flops_per_token

    accelerator = load_accelerator(result.accelerator)
    lay, stage = result.layout, result.stage_times_s
    dtype = job.precision.gemm_dtype
    eff = accelerator.matmul_efficiency.get(dtype)
    lines = [
        f"GEMMs at {dtype}: peak {accelerator.peak_tflops(dtype)} TFLOP/s × matmul efficiency {eff} "
        f"({accelerator.source_of(f'matmul_efficiency.{dtype}')})",
        _attention_line(
            accelerator, dtype, job.flash_attention, result.attention_kernel, job.seq_len
        )
        + _window_note(accelerator, job, result.attention_kernel),
        f"HBM {accelerator.hbm_bytes_per_s / 1e12:.2f} TB/s × {accelerator.hbm_bandwidth_efficiency} for memory-bound ops",
        f"busiest rank per micro-batch: F {stage['forward'] * 1e3:.2f} ms, B {stage['input_grad'] * 1e3:.2f} ms, "
        f"W {stage['weight_grad'] * 1e3:.2f} ms, recompute {stage['recompute'] * 1e3:.2f} ms",
        f"pipeline: {lay.schedule} closed form with pp {lay.pp}, m {result.num_microbatches}, vpp {lay.vpp} → "
        f"bubble {result.time_breakdown_s['pipeline_bubble']:.3f} s ({100 * result.bubble_fraction:.1f}% of the step)",
    ]
    for axis, raw in result.comm_time_s.items():
        if raw:
            lines.append(
                f"{axis}: {result.comm_bytes_per_step[axis] / 1e9:,.2f} GB per GPU per step, raw {raw:.3f} s, "
                f"exposed {result.time_breakdown_s[axis + '_exposed']:.3f} s"
                + (_tp_overlap_note(result, job) if axis == "tp" else "")
            )
    lines += _moe_lines(result, job)
    lines += _ring_lines(result, job)
    lines.append(
        f"link contention: {result.time_breakdown_s['link_contention']:.3f} s = Σ_links Σ_b "
        f"exposed[b] · min(1, hidden traffic of the other axes on that link / compute window "
        f"m·(F+B)), or the busiest link's excess over the step ({result.busiest_link_s:.3f} s "
        f"busy per step; 0 when each link carries one axis)"
    )
    lines += profile_term_lines(job.efficiency_profile)
    if job.cuda_graphs and job.efficiency_profile is not None:
        lines.append(
            "CUDA graphs: the layers replay from graphs, so kernel_overhead_s "
            "(a host launch per kernel) is not charged"
        )
    flops = model_flops_per_token(job.model, job.seq_len, causal=False)
    count = "6N + 12·L·h·s"
    if job.model.num_sliding_window_layers:  # their scores inside the window only
        count += f", {job.model.num_sliding_window_layers} layers' in a {job.model.sliding_window}-key window"
    lines.append(
        f"MFU = {result.tokens_per_s_per_gpu:,.0f} tokens/s × {flops / 1e9:,.1f} GFLOP/token "
        f"({count}) / {accelerator.peak_tflops(result.mfu_dtype)} TFLOP/s = {100 * result.mfu:.1f}%"
    )
    return lines


#: A fitted term whose values leaving one model's runs out span more than this share of its
#: bounds is said to rest on few models.
SWING_SHARE = 0.25


def profile_term_lines(profile) -> list[str]:
    """The profile's terms away from their ideal values, each with its span over refits
    leaving one model's runs out (``[fit.term_range_one_model_out]``), flagged where it
    swings over more than :data:`SWING_SHARE` of its bounds."""
    from planner.cost.profile import TERMS

    if profile is None:
        return []
    spans = profile.fit.term_range_one_model_out
    lines = []
    for name, term in profile.terms.items():
        if name not in TERMS or term.value == TERMS[name].ideal:
            continue
        text = f"profile term {name} = {term.value:.4g} {term.unit}"
        if name in spans:
            low, high = spans[name]
            swings = high - low > SWING_SHARE * (term.upper - term.lower)
            text += f" ({low:.4g}–{high:.4g} leaving one model's runs out"
            text += (
                "; it rests on few models: read it as theirs, not the chip's)" if swings else ")"
            )
        lines.append(text)
    return lines


def _tp_overlap_note(result, job) -> str:
    """Whether the stack overlaps TP communication, and what the profile hides of it."""
    if not result.tp_comm_overlap:
        return " (the stack does not overlap TP communication: --tp-comm-overlap to say it does)"
    if result.profile is None:
        return " (the stack overlaps TP communication; the ideal model hides none of it)"
    hidden = -result.time_breakdown_s.get("profile_tp_overlap", 0.0)
    return f" (the stack overlaps TP communication: the profile hides {hidden:.3f} s of it)"


def _moe_lines(result, job) -> list[str]:
    """The routing load an MoE estimate assumed and what DualPipe's F&B overlap bought."""
    from planner.pipeline.closed_form import dualpipe_paired_share
    from planner.pipeline.schedules.registry import EP_OVERLAP_SCHEDULES

    model, lay = job.model, result.layout
    if not model.is_moe:
        return []
    routing = (
        f"capacity factor {model.moe_capacity_factor} (padded buffers)"
        if model.moe_capacity_factor is not None
        else f"dropless, busiest EP rank at {model.routed_load_factor(lay.ep):g}× the balanced load"
    )
    lines = [f"routing: {routing}; top-{model.num_experts_per_token} of {model.num_routed_experts}"]
    experts = model.num_routed_experts // lay.ep
    noun = "routed expert" if experts == 1 else "routed experts"
    if lay.expert_tp < lay.tp:
        lines.append(
            f"experts: {experts} whole {noun} per rank (etp {lay.expert_tp}): the "
            f"{lay.tp} TP ranks fold into each EP group of {lay.ep}, "
            f"{lay.ep * lay.expert_tp // lay.tp} of it carved out of dp·cp"
        )
    else:
        split = f"each split over tp {lay.tp}" if lay.tp > 1 else "whole"
        lines.append(f"experts: {experts} {noun} per rank, {split}")
    lines += _node_limit_lines(result, job)
    raw = result.comm_time_s.get("ep", 0.0)
    if lay.schedule in EP_OVERLAP_SCHEDULES and raw:
        chunks = 2 if lay.schedule == "dualpipev" else 1
        paired = float(dualpipe_paired_share(lay.pp, result.num_microbatches, chunks))
        exposed = result.time_breakdown_s["ep_exposed"]
        lines.append(
            f"{lay.schedule} overlap: {paired:.1%} of the end ranks' forward chunks run in F&B "
            f"pairs and hide their all-to-alls behind the paired compute; it hides "
            f"{raw - exposed:.3f} s of the {raw:.3f} s EP all-to-all time"
        )
    elif job.ep_comm_overlap and lay.ep > 1:
        lines.append(_combined_1f1b_line(result, job, raw))
    return lines


def _combined_1f1b_line(result, job, raw: float) -> str:
    """What Megatron-Core's combined 1F1B hid of the EP all-to-alls, or why it did not run."""
    from planner.comm.rows import ep_paired_share, runs_combined_1f1b

    lay = result.layout
    schedule, full = [lay.schedule], int(lay.recompute == "full")
    if not runs_combined_1f1b(job, schedule, lay.pp, lay.vpp, lay.ep, full).any():
        return ("--ep-comm-overlap: not run here (Megatron-Core's combined 1F1B needs "
                "interleaved PP or none, and no full recomputation)")  # fmt: skip
    m = result.num_microbatches
    paired = float(ep_paired_share(job, schedule, lay.pp, m, lay.vpp, lay.ep, full)[0])
    exposed = result.time_breakdown_s["ep_exposed"]
    return (
        f"combined 1F1B (--overlap-moe-expert-parallel-comm): {paired:.1%} of the first rank's "
        f"forward chunks run beside another micro-batch's backward and hide their "
        f"all-to-alls; it hides {raw - exposed:.3f} s of the {raw:.3f} s EP all-to-all time"
    )


def _node_limit_lines(result, job) -> list[str]:
    """How many of the EP group's nodes a token reaches under node-limited routing
    (:func:`planner.comm.collectives.nodes_reached`), where the group spans nodes."""
    from planner.comm.collectives import nodes_reached
    from planner.comm.levels import SCALE_OUT_KINDS
    from planner.comm.topology import place_groups

    model, lay = job.model, result.layout
    if model.max_nodes_per_token is None or lay.ep == 1:
        return []
    levels = place_groups(result.cluster, lay, gpus=result.num_gpus).groups["ep"].levels
    out = [level for level in levels if level.kind in SCALE_OUT_KINDS]
    if not out:
        return []
    nodes = lay.ep // out[0].members_below
    k, limit, groups = (
        model.num_experts_per_token,
        model.max_nodes_per_token,
        model.num_expert_groups,
    )
    reached = nodes_reached(k, limit, groups, nodes)
    span = -(-nodes // groups) if groups else 1
    how = f"at most {limit} nodes"
    if groups:
        where = "whole groups on each node" if span == 1 else f"each group over {span} nodes"
        how = f"{limit} of {groups} expert groups, {where}"
    return [
        f"node-limited routing ({how}): a token's {k} experts lie on at most {reached} of "
        f"the EP group's {nodes} nodes; it crosses the scale-out network once per node, "
        f"{reached} times for its {k} copies"
    ]


def _ring_lines(result, job) -> list[str]:
    """Ring attention's step: its transfer against the block attention it hides behind."""
    from planner.comm.context_parallel import ring_step_overlap

    step = ring_step_overlap(job, result.layout, result.cluster)
    if step is None:
        return []
    lines = [
        f"cp {result.layout.cp_algorithm}: a ring of {step['ring_ranks']} ranks over "
        f"{step['tier']}, {step['steps']} steps per layer and pass; each step's transfer runs "
        f"beside the block already held (exposed = max(0, transfer − block) + kernels/rescale"
        f" and the short block kernels' loss against one kernel over the sequence)"
    ]
    for name in ("forward", "backward"):
        p = step[name]
        hidden = "hidden" if p["transfer_s"] <= p["block_attention_s"] else "exposed"
        lines.append(
            f"  {name} step: {p['bytes'] / 1e6:,.2f} MB in {p['transfer_s'] * 1e3:.3f} ms vs "
            f"block attention {p['block_attention_s'] * 1e3:.3f} ms ({hidden}), kernels, "
            f"rescale and short-block loss {p['step_overhead_s'] * 1e3:.3f} ms → "
            f"{p['exposed_s'] * 1e3:.3f} ms exposed"
        )
    last = step["backward_last"]
    lines.append(
        f"  the backward's last step sends the summed dK, dV to their owner beside its own "
        f"block: {last['bytes'] / 1e6:,.2f} MB in {last['transfer_s'] * 1e3:.3f} ms, "
        f"{last['exposed_s'] * 1e3:.3f} ms exposed"
    )
    return lines


def cp_algorithm_lines(job, cluster, results: list[dict], order=None) -> list[str]:
    """The winning layout under each context-parallel algorithm the rules allow: which
    algorithm wins on it and by how much (the same estimate as the winner's, each algorithm
    in turn)."""
    from hwspecs.errors import PlanError
    from planner.estimate import estimate
    from planner.spec.layout import CP_ALGORITHMS, Layout

    if not results or results[0]["layout"]["cp"] <= 1:
        return []
    fields = dict(results[0]["layout"])
    chosen = fields["cp_algorithm"]
    times, refused = {}, {}
    inner = fields.get("cp_inner")  # the winner's inner degree, if hierarchical
    for name in CP_ALGORITHMS:
        try:
            cp_inner = inner if name == "hierarchical" else None
            layout = Layout(**{**fields, "cp_algorithm": name, "cp_inner": cp_inner})
            times[name] = estimate(job, layout, cluster, order=order).step_time_s
        except PlanError as error:
            refused[name] = str(error)
    lead = times[chosen]
    degrees = "/".join(str(fields[k]) for k in ("tp", "cp", "pp", "dp"))
    lines = [f"context-parallel algorithms on the winning layout (tp/cp/pp/dp {degrees}):"]
    for name, seconds in sorted(times.items(), key=lambda item: item[1]):
        change = "chosen" if name == chosen else f"{100 * (seconds / lead - 1):+.1f}%"
        if name != chosen and seconds == lead:
            change = f"the same as {chosen} here"
        label = f"{name} (inner {inner})" if name == "hierarchical" and inner else name
        lines.append(f"  {label}: {seconds:.3f} s ({change})")
    lines += [f"  {name}: not allowed ({why.split('; ')[0]})" for name, why in refused.items()]
    return lines


def _attention_line(
    accelerator, gemm_dtype: str, flash_attention: bool, kernel=None, seq_len=None
) -> str:
    """The attention kernels' rates an estimate used at its sequence length, with their
    source."""
    from planner.cost.attention_times import FLASH_BACKWARD_FLOPS_RATIO
    from planner.cost.compute import attention_dtype

    if not flash_attention:
        return (
            "attention (unfused): batched GEMMs over every score at the matmul rate (backward "
            "2× forward), softmax as memory traffic over the scores"
        )
    dtype = attention_dtype(gemm_dtype)
    forward, backward = accelerator.achievable_attention_flops_per_s(dtype, kernel, seq_len)
    measured = dtype == "bf16" and kernel in accelerator.attention_kernels
    lengths = accelerator.attention_seq_lens
    by_length = seq_len is not None and accelerator.attention_curve(dtype, kernel) is not None
    if by_length:
        path = f"attention_curves.{kernel if measured else accelerator.attention_default_kernel}"
    else:
        path = (
            f"attention_kernels.{kernel}" if measured else f"attention_forward_efficiency.{dtype}"
        )
    source = accelerator.source_of(path)
    where = source if source else "no attention measurement: at the matmul rate (rule 6)"
    if kernel is not None and not measured:
        where = f"no measurement of {kernel} on {accelerator.id}: the default rates; {where}"
    at = (
        f" at {seq_len:,} tokens (measured {lengths[0]:,}–{lengths[-1]:,}, "
        "log-interpolated, held beyond)"
        if by_length
        else ""
    )
    return (
        f"attention (fused, {dtype}): forward {forward / 1e12:.0f}, backward {backward / 1e12:.0f} "
        f"TFLOP/s{at} on {FLASH_BACKWARD_FLOPS_RATIO}× the forward FLOPs ({where})"
    )


def _window_note(accelerator, job, kernel) -> str:
    """Where the model's sliding-window layers run their own rates (a fused kernel, a window
    shorter than the sequence): how many, at which window, at which rates."""
    from planner.cost.compute import attention_dtype

    model = job.model
    windowed = model.num_sliding_window_layers
    if not (windowed and job.flash_attention and model.sliding_window < job.seq_len):
        return ""
    dtype = attention_dtype(job.precision.gemm_dtype)
    forward, backward = accelerator.achievable_attention_flops_per_s(
        dtype, kernel, model.sliding_window
    )
    return (
        f"; its {windowed} sliding-window layers at their {model.sliding_window:,}-key window: "
        f"forward {forward / 1e12:.0f}, backward {backward / 1e12:.0f} TFLOP/s on the pairs "
        f"inside it"
    )


def _same_unit_pair(needed: float, usable: float) -> tuple[str, str]:
    """Two sizes in GiB with enough digits that they differ when they do (75.67 vs 75.69)."""
    for digits in range(1, 5):
        a, b = f"{needed:,.{digits}f}", f"{usable:,.{digits}f}"
        if a != b or needed == usable:
            return a, b
    return f"{needed:,.4f}", f"{usable:,.4f}"


def infeasible_reasons(
    found, accelerator, mem_headroom: float, gpus: int, cluster_gpus: int
) -> tuple[str, list[str]]:
    """Why no layout fits: a headline with the dominant cause and a remedy, one reason a line.

    Memory leads when any layout passed the rules and failed only on memory (the rules
    reject some layouts of every query, e.g. dualpipe's even pp); else the rule that
    rejected the most rows does.
    """
    gib = 2**30
    reasons = [
        f"{count:,} layouts: {reason}"
        for reason, count in sorted(found.rejected.items(), key=lambda item: -item[1])
    ]
    small = found.smallest_memory
    if small is None:
        top = max(found.rejected.items(), key=lambda item: item[1], default=None)
        cause = top[0] if top else "no candidate layouts for these GPUs and pins"
        return f"no layout fits: {cause}", reasons
    usable = accelerator.hbm_bytes * (1 - mem_headroom) / gib
    needed, available = _same_unit_pair(small["memory_per_gpu_bytes"] / gib, usable)
    remedies = ["more GPUs" + (f" (--gpus up to {cluster_gpus:,})" if gpus < cluster_gpus else "")]
    if small["recompute"] != "full":
        remedies.append("--recompute full")
    if small["zero_stage"] < 3 and small["dp"] > 1:
        remedies.append("--zero-stage 3")
    remedies.append("a larger --pp")
    layout = (
        f"tp {small['tp']}, cp {small['cp']}, pp {small['pp']}, dp {small['dp']}, "
        f"{small['schedule']}, ZeRO {small['zero_stage']}, recompute {small['recompute']}"
    )
    headline = (
        f"no layout fits in memory: the smallest needs {needed} GiB per GPU, {available} "
        f"available ({100 * (1 - mem_headroom):g}% of {accelerator.hbm_bytes / gib:,.1f} GiB): "
        f"try {', '.join(remedies[:-1])} or {remedies[-1]}"
    )
    return headline, [*reasons, f"smallest layout that did not fit: {layout}"]
