"""Operations a parallel form dispatches per pass, counted on torch's implementation.

:func:`census` runs one training step of a (non-pipeline) layout on its ranks under a
``TorchDispatchMode`` and counts, on rank 0, the ATen operations of the forward (loss
included), the backward (with the data-parallel wrapper's hooks and collectives) and the
optimizer step, each split into operations on plain tensors, operations on DTensors and
collectives (``c10d`` and functional). Counting the same layout with 1 and 3 layers gives
one layer's counts by difference: what :mod:`planner.structure.op_counts` records for DTensor TP,
FSDP2, DDP, all-gather CP and EP (``tests/validate/test_validate.py`` counts them again).
:func:`labelled_counter` is the one counter, also used by :mod:`validate.host_costs`.
"""

from __future__ import annotations

import datetime
import os
import tempfile
import time
from contextlib import nullcontext

from validate.run import reap
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
            # The ranks end once rank 0 has reported; one stuck in a gloo wait whose peer has
            # gone would hold the caller (a test run) for ever: kill what is left.
            deadline = time.monotonic() + timeout_s
            for process in context.processes:
                process.join(timeout=max(0.0, deadline - time.monotonic()))
            reap(context.processes)
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
        counter = labelled_counter()
        dist.barrier()
        with counter:
            _phased_step(trainer, counter.label, 2)
        if rank == 0:
            counts = {phase: counter.counts.get(phase, dict.fromkeys(KINDS, 0)) for phase in PHASES}
            reports.put(("ok", counts))
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


def operation_kind(func, args, kwargs) -> str | None:
    """``plain``, ``dtensor`` (an operand is a DTensor) or ``collective`` (``c10d`` or
    functional); None for a functional collective's wait or autograd wrapper, which are
    not operations of their own."""
    from torch.distributed.tensor import DTensor

    namespace, name = getattr(func, "namespace", ""), str(func)
    if namespace == "_c10d_functional" and ("wait" in name or "_wrap_" in name):
        return None
    if namespace in ("c10d", "_c10d_functional"):
        return "collective"
    flat = [*args, *(kwargs or {}).values()]
    flat += [x for a in flat if isinstance(a, (list, tuple)) for x in a]
    return "dtensor" if any(isinstance(a, DTensor) for a in flat) else "plain"


def labelled_counter():
    """A ``TorchDispatchMode`` counting operations by :func:`operation_kind` under the
    label ``counter.label[0]`` names (nothing while it is None): ``counter.counts[label]``
    is ``{kind: operations}``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class LabelledCounter(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.label: list = [None]
            self.counts: dict = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            label = self.label[0]
            if label is not None:
                kind = operation_kind(func, args, kwargs)
                if kind is not None:
                    per_kind = self.counts.setdefault(label, dict.fromkeys(KINDS, 0))
                    per_kind[kind] += 1
            return func(*args, **(kwargs or {}))

    return LabelledCounter()
