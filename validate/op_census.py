"""Operations a parallel form dispatches per pass, counted on torch's implementation.

:func:`census` runs one training step of a (non-pipeline) layout on its ranks under a
``TorchDispatchMode`` and counts, on rank 0, the ATen operations of the forward (loss
included), the backward (with the data-parallel wrapper's hooks and collectives) and the
optimizer step, each split into operations on plain tensors, operations on DTensors and
collectives (``c10d`` and functional). Counting the same layout with 1 and 3 layers gives
one layer's counts by difference: what :mod:`planner.op_counts` records for DTensor TP,
FSDP2, DDP, all-gather CP and EP (``tests/test_validate.py`` counts them again).
"""

from __future__ import annotations

import datetime
import os
import tempfile
from contextlib import nullcontext

from validate.spec import RunSpec

PHASES = ("forward", "backward", "optimizer")
KINDS = ("plain", "dtensor", "collective")


def census(spec: RunSpec, timeout_s: float = 120.0) -> dict[str, dict[str, int]]:
    """{phase: {kind: operations}} of one step of ``spec`` on rank 0 (after two warm-up
    steps), from a fresh process per rank."""
    import torch.multiprocessing as mp

    if spec.layout.pp > 1:
        raise ValueError(f"{spec.name}: the census counts layouts without pipeline stages")
    ctx = mp.get_context("spawn")
    reports = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="llmplan-census-") as tmp:
        context = mp.start_processes(
            _census_rank,
            args=(spec.model_dump_json(), spec.world_size, os.path.join(tmp, "init"), reports),
            nprocs=spec.world_size,
            join=False,
            start_method="spawn",
        )
        try:
            status, payload = reports.get(timeout=timeout_s)
        finally:
            context.join(timeout=timeout_s)
    if status != "ok":
        raise RuntimeError(f"census of {spec.name} failed:\n{payload}")
    return payload


def _census_rank(rank: int, spec_json: str, world_size: int, init_file: str, reports) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import traceback

    import torch
    import torch.distributed as dist

    from validate.workloads.mesh import build_groups
    from validate.workloads.train import build_trainer

    try:
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
            timeout=datetime.timedelta(seconds=120),
        )  # fmt: skip
        spec = RunSpec.model_validate_json(spec_json)
        trainer = build_trainer(spec, build_groups(spec.layout, "cpu"), torch.device("cpu"))
        for step in range(2):
            trainer.step(step)
        counter = _phase_counter()
        dist.barrier()
        with counter:
            _phased_step(trainer, counter.phase, 2)
        if rank == 0:
            reports.put(("ok", counter.counts))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        reports.put(("error", traceback.format_exc()))
        raise SystemExit(1) from None


def _phased_step(trainer, phase: list, step: int) -> None:
    """:meth:`validate.workloads.train.Trainer.step`, naming the phase as it goes."""
    from validate.workloads.model import cross_entropy

    tokens, labels = trainer.local_batch(step)
    context = nullcontext()
    if trainer.layout.tp > 1:
        from torch.distributed.tensor.parallel import loss_parallel

        context = loss_parallel()
    with context:
        phase[0] = "forward"
        loss = cross_entropy(trainer.model(tokens), labels)
        phase[0] = "backward"
        loss.backward()
    if trainer.layout.tp > 1:
        from validate.workloads.tensor_parallel import reduce_partial_gradients

        reduce_partial_gradients(trainer.model)
    for param in trainer.expert_params:
        param.grad.div_(trainer.layout.dp)
    phase[0] = "optimizer"
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=False)
    phase[0] = None


def _phase_counter():
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    class PhaseCounter(TorchDispatchMode):
        """Operations per (phase, kind) while ``phase[0]`` names a phase."""

        def __init__(self):
            super().__init__()
            self.phase: list[str | None] = [None]
            self.counts = {phase: dict.fromkeys(KINDS, 0) for phase in PHASES}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if self.phase[0] is not None:
                namespace, name = getattr(func, "namespace", ""), str(func)
                flat = [*args, *(kwargs or {}).values()]
                flat += [x for a in flat if isinstance(a, (list, tuple)) for x in a]
                if namespace == "_c10d_functional" and ("wait" in name or "_wrap_" in name):
                    kind = ""  # waits and autograd wrappers: not operations of their own
                elif namespace in ("c10d", "_c10d_functional"):
                    kind = "collective"
                elif any(isinstance(a, DTensor) for a in flat):
                    kind = "dtensor"
                else:
                    kind = "plain"
                if kind:
                    self.counts[self.phase[0]][kind] += 1
            return func(*args, **(kwargs or {}))

    return PhaseCounter()
