"""Pipeline parallelism with ``torch.distributed.pipelining``: stages and schedules.

Layers are split over virtual stages as the planner splits them
(:func:`planner.spec.layout.layers_per_virtual_stage`) and placed on ranks as torch places them
(:func:`planner.spec.layout.virtual_stage_ranks`: interleaved ``c·pp + r``, V-shape ``r`` and
``2·pp − 1 − r``). The first stage holds the embedding, the last the final norm and the
output head.

``schedule`` is the planner's name of one of torch's schedules; ``llmplan:<name>`` instead
loads the planner's own action list for ``<name>`` into torch's pipeline runtime
(``_PipelineScheduleRuntime``), which adds the sends and receives and runs exactly those
actions in that order.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    FULL_BACKWARD,
    OVERLAP_F_B,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleZBVZeroBubble,
    _Action,
    _PipelineScheduleRuntime,
)

from planner.api import Layout, model_layers_per_virtual_stage, virtual_stage_ranks
from validate.spec import Workload
from validate.workloads.model import build_model

SCHEDULE_CLASSES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved-1f1b": ScheduleInterleaved1F1B,
    "zbv": ScheduleZBVZeroBubble,
    "dualpipev": ScheduleDualPipeV,
}
SINGLE_STAGE_SCHEDULES = ("gpipe", "1f1b")

#: torch computation type -> the planner's action kind (planner.pipeline.schedules.actions)
TORCH_TO_PLANNER_KIND = {
    FORWARD: "F",
    BACKWARD_INPUT: "B",
    BACKWARD_WEIGHT: "W",
    FULL_BACKWARD: "BW",
}
PLANNER_TO_TORCH_KIND = {kind: torch_kind for torch_kind, kind in TORCH_TO_PLANNER_KIND.items()}


def schedule_name(layout: Layout) -> str:
    return layout.schedule.removeprefix("llmplan:")


def local_stage_indices(layout: Layout, pp_rank: int) -> list[int]:
    """Virtual stages this pipeline rank holds, in stage order."""
    ranks = virtual_stage_ranks(schedule_name(layout), layout.pp, layout.vpp)
    return [stage for stage, rank in enumerate(ranks) if rank == pp_rank]


def build_stage_module(workload: Workload, layout: Layout, stage_index: int) -> nn.Module:
    """The model restricted to one virtual stage's layers (and ends)."""
    layers = model_layers_per_virtual_stage(
        workload.model_spec(), layout.pp, layout.vpp, layout.pipeline_layer_split,
        schedule_name(layout),
    )  # fmt: skip
    start, end = int(layers[:stage_index].sum()), int(layers[: stage_index + 1].sum())
    model = build_model(workload)
    for index in list(model.layers.keys()):
        if not start <= int(index) < end:
            del model.layers[index]
    if stage_index != 0:
        model.tok_embeddings = None
    if stage_index != len(layers) - 1:
        model.norm = None
        model.output = None
    return model


def make_stages(modules: dict[int, nn.Module], layout: Layout, group: dist.ProcessGroup, device):
    num_stages = layout.pp * layout.vpp
    return [
        PipelineStage(module, index, num_stages, device, group=group)
        for index, module in modules.items()
    ]


def make_schedule(stages, layout: Layout, num_microbatches: int, loss_fn):
    """torch's schedule for ``layout.schedule``, or the planner's actions in torch's runtime."""
    name = schedule_name(layout)
    if layout.schedule.startswith("llmplan:"):
        schedule = _PipelineScheduleRuntime(stages, num_microbatches, loss_fn=loss_fn)
        actions = planner_actions(name, layout, num_microbatches)
        schedule.pipeline_order = actions
        schedule._prepare_schedule_with_comms(actions)
        return schedule
    cls = SCHEDULE_CLASSES[name]
    if name in SINGLE_STAGE_SCHEDULES:
        (stage,) = stages
        return cls(stage, num_microbatches, loss_fn=loss_fn)
    return cls(stages, num_microbatches, loss_fn=loss_fn)


def planner_actions(name: str, layout: Layout, num_microbatches: int) -> dict[int, list[_Action]]:
    """The planner's schedule as torch actions; DualPipe's F&B pairs become OVERLAP_F_B."""
    from planner.api import generate_schedule

    schedule = generate_schedule(name, layout.pp, num_microbatches, layout.vpp)
    result = {}
    for rank, ops in enumerate(schedule):
        actions, i = [], 0
        while i < len(ops):
            op = ops[i]
            action = _Action(op.stage_index, PLANNER_TO_TORCH_KIND[op.kind], op.microbatch)
            if op.fb_pair and i + 1 < len(ops) and ops[i + 1].fb_pair:
                nxt = ops[i + 1]
                partner = _Action(nxt.stage_index, PLANNER_TO_TORCH_KIND[nxt.kind], nxt.microbatch)
                actions.append(_Action(-1, OVERLAP_F_B, None, (action, partner)))
                i += 2
                continue
            actions.append(action)
            i += 1
        result[rank] = actions
    return result


def torch_compute_order(schedule, pp_rank: int) -> list[tuple[str, int, int]]:
    """(kind, micro-batch, stage) of each compute action torch's schedule lists for a rank."""
    order = []
    for action in schedule.pipeline_order.get(pp_rank, []) or []:
        if action is None:
            continue
        subs = action.sub_actions if action.computation_type == OVERLAP_F_B else (action,)
        for sub in subs:
            kind = TORCH_TO_PLANNER_KIND.get(sub.computation_type)
            if kind is not None:
                order.append((kind, sub.microbatch_index, sub.stage_index))
    return order


def planner_compute_order(layout: Layout, num_microbatches: int, pp_rank: int):
    """(kind, micro-batch, stage) of the planner's schedule for a rank, or None if it has none."""
    try:
        from planner.api import generate_schedule
    except ImportError:
        return None
    ops = generate_schedule(schedule_name(layout), layout.pp, num_microbatches, layout.vpp)
    return [(op.kind, op.microbatch, op.stage_index) for op in ops[pp_rank]]
