"""One training step of a :class:`~validate.spec.RunSpec` on this rank, in its parallel form.

:func:`build_trainer` composes the forms: tensor (+ sequence) parallelism, context
parallelism (all-gather attention), expert parallelism, pipeline stages and schedules, and data
parallelism / ZeRO around them (FSDP2 over TP makes the FSDP × TP layout; DDP under each
pipeline stage makes PP × DP). Every rank builds the same full model from the same seed
first, so a parallel step computes what the serial model computes on the same batch
(:func:`reference_loss`).

The loss is the mean token cross-entropy over the global batch: each data-parallel (and
context-parallel) rank takes the mean over its tokens and the gradient reduction
averages; pipeline schedules divide by the number of micro-batches.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn

from validate.instrument import ActionRecorder
from validate.spec import RunSpec
from validate.workloads import pipeline as pp_forms
from validate.workloads.data_parallel import adamw, wrap_data_parallel
from validate.workloads.mesh import Groups
from validate.workloads.model import build_model, cross_entropy, synthetic_batch


class Trainer:
    """Runs steps; exposes what the measurements need (modules, optimizer, pipeline order)."""

    def __init__(self, spec: RunSpec, groups: Groups, device: torch.device):
        self.spec, self.groups, self.device = spec, groups, device
        self.layout = spec.layout
        self.expert_params: list[nn.Parameter] = []
        self.recorder: ActionRecorder | None = None
        self.schedule = None
        self.holds_first = self.holds_last = True
        if self.layout.pp > 1:
            self._build_pipeline()
        else:
            self._build_whole_model()

    # ----- construction -----------------------------------------------------------------

    def _build_whole_model(self) -> None:
        spec, groups, layout = self.spec, self.groups, self.layout
        model = build_model(spec.workload).to(self.device)
        model.recompute_layers = layout.recompute == "full"
        if layout.tp > 1:
            from validate.workloads.tensor_parallel import apply_tensor_parallel

            apply_tensor_parallel(model, groups.submesh("tp"), layout.sequence_parallel)
        if layout.cp > 1:
            from validate.workloads.context_parallel import local_positions

            positions = local_positions(
                spec.workload.seq_len, layout.cp, groups.coordinate("cp")
            ).to(self.device)
            model.positions = positions
            # One core (and one causal mask) shared by every layer.
            cp_group = groups.group("cp")
            if layout.cp_algorithm == "hierarchical":
                cp_group = (groups.group("cp_inner"), groups.group("cp_outer"))
            core = attention_core(layout.cp_algorithm)(cp_group, positions, spec.workload.seq_len)
            for layer in model.layers.values():
                layer.attention.core = core
        if layout.ep > 1:
            from validate.workloads.moe import shard_experts

            self.expert_params = shard_experts(model, groups.group("ep"))
        mesh = None
        if layout.zero_stage >= 2 and layout.dp > 1:
            mesh = groups.submesh("dp")
        group = groups.group("dp") if layout.dp * layout.cp > 1 else None
        self.model, self.optimizer = wrap_data_parallel(
            model, layout.zero_stage, group, mesh, self.expert_params
        )
        self.modules = [self.model]

    def _build_pipeline(self) -> None:
        spec, groups, layout = self.spec, self.groups, self.layout
        pp_rank = groups.coordinate("pp")
        indices = pp_forms.local_stage_indices(layout, pp_rank)
        num_stages = layout.pp * layout.vpp
        self.holds_first, self.holds_last = 0 in indices, num_stages - 1 in indices
        modules = {}
        for index in indices:
            module = pp_forms.build_stage_module(spec.workload, layout, index).to(self.device)
            if layout.dp > 1:
                module, _ = wrap_data_parallel(module, 0, groups.group("dp"))
            modules[index] = module
        self.modules = list(modules.values())
        params = [p for module in self.modules for p in module.parameters()]
        self.optimizer = adamw(params)
        stages = pp_forms.make_stages(modules, layout, groups.group("pp"), self.device)
        self.schedule = pp_forms.make_schedule(stages, layout, spec.num_microbatches, cross_entropy)
        self.recorder = ActionRecorder()
        for stage in stages:
            self.recorder.install(stage)
        self.stages = stages

    # ----- one step -----------------------------------------------------------------------

    def local_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's tokens and labels: its data-parallel rows and context-parallel columns."""
        spec, layout = self.spec, self.layout
        tokens, labels = synthetic_batch(spec.workload, spec.global_batch_size, step)
        rows = layout.micro_batch_size * spec.num_microbatches
        first = self.groups.coordinate("dp") * rows
        tokens, labels = tokens[first : first + rows], labels[first : first + rows]
        if layout.cp > 1:
            from validate.workloads.context_parallel import local_positions

            cols = local_positions(spec.workload.seq_len, layout.cp, self.groups.coordinate("cp"))
            tokens, labels = tokens[:, cols], labels[:, cols]
        return tokens.to(self.device), labels.to(self.device)

    def step(self, step: int) -> float | None:
        """One optimizer step; returns this rank's loss (None on a pipeline rank without it)."""
        tokens, labels = self.local_batch(step)
        if self.schedule is not None:
            losses: list = []
            args = (tokens,) if self.holds_first else ()
            kwargs = {"target": labels, "losses": losses} if self.holds_last else {}
            # A training step needs the losses, not the logits of every micro-batch.
            self.schedule.step(*args, return_outputs=False, **kwargs)
            loss = torch.stack(losses).mean().item() if losses else None
        else:
            loss_context = nullcontext()
            if self.layout.tp > 1:
                from torch.distributed.tensor.parallel import loss_parallel

                loss_context = loss_parallel()
            with loss_context:
                value = cross_entropy(self.model(tokens), labels)
                value.backward()
            if hasattr(value, "to_local"):
                value = value.to_local()
            loss = value.item()
            if self.layout.tp > 1:
                from validate.workloads.tensor_parallel import reduce_partial_gradients

                reduce_partial_gradients(self.model)
            for param in self.expert_params:
                # Experts see every data-parallel rank's tokens; average like DDP does.
                param.grad.div_(self.layout.dp)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)
        return loss

    def tracked_objects(self) -> list:
        """Modules and optimizer (states) for the memory tracker."""
        optimizer = getattr(self.optimizer, "optim", self.optimizer)
        return [*self.modules, optimizer]


def build_trainer(spec: RunSpec, groups: Groups, device: torch.device) -> Trainer:
    return Trainer(spec, groups, device)


def reference_losses(spec: RunSpec) -> tuple[float, float]:
    """Losses of the serial model on the first two steps' global batches, one step apart.

    Every layout must reproduce both: the first checks the forward pass, the second (after
    one AdamW step) the gradients.
    """
    model = build_model(spec.workload)
    optimizer = adamw(model.parameters())
    tokens, labels = synthetic_batch(spec.workload, spec.global_batch_size, 0)
    loss = cross_entropy(model(tokens), labels)
    loss.backward()
    optimizer.step()
    tokens, labels = synthetic_batch(spec.workload, spec.global_batch_size, 1)
    with torch.no_grad():
        return loss.item(), cross_entropy(model(tokens), labels).item()


def attention_core(cp_algorithm: str):
    """The CP attention of ``cp_algorithm`` (hierarchical: over the layout's inner groups
    and outer rings, :mod:`validate.workloads.hierarchical_attention`)."""
    if cp_algorithm == "ring":
        from validate.workloads.ring_attention import ring_attention

        return ring_attention
    if cp_algorithm == "ulysses":
        from validate.workloads.ulysses_attention import ulysses_attention

        return ulysses_attention
    if cp_algorithm == "hierarchical":
        from validate.workloads.hierarchical_attention import hierarchical_attention

        return hierarchical_attention
    if cp_algorithm == "all-gather":
        from validate.workloads.context_parallel import all_gather_attention

        return all_gather_attention
    from hwspecs.errors import PlanError

    raise PlanError(f"cp_algorithm '{cp_algorithm}' has no CPU workload; choose all-gather, "
                    f"ring, ulysses or hierarchical")  # fmt: skip
