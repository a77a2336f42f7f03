"""What each spawned rank runs: set up, warm up, time, measure, report.

Order of steps on every rank:

1. ``warmup_steps`` steps (the first also gives the loss checked against the serial model;
   lazy initialisation, DDP's bucket rebuild and pipeline shape inference happen here);
2. ``timed_steps`` steps, each after a barrier, timed with ``perf_counter``; the last one
   also records the pipeline F/B/W timestamps;
3. one measured step under the collective counter and the memory tracker (their Python
   dispatch slows it down, so it is not timed).

The rank puts ``("ok", rank, RankResult)`` or ``("error", rank, traceback)`` on the queue.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import time
import traceback
import warnings


def rank_main(rank: int, spec_json: str, world_size: int, init_file: str, queue, timeout_s: float):
    """Entry point of one spawned rank (``torch.multiprocessing`` passes ``rank`` first)."""
    try:
        result = run_rank(rank, spec_json, world_size, f"file://{init_file}", timeout_s)
        queue.put(("ok", rank, result.model_dump_json()))
    except BaseException:  # report everything, including KeyboardInterrupt
        queue.put(("error", rank, traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            with contextlib.suppress(Exception):  # a peer may already be gone
                dist.destroy_process_group()


def run_rank(
    rank: int,
    spec_json: str,
    world_size: int,
    init_method: str,
    timeout_s: float,
    local_rank: int | None = None,
):
    """Set up this rank, run the steps of the module docstring, return its RankResult."""
    if init_method.startswith("file://"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one host: loopback
    import torch
    import torch.distributed as dist

    from validate.instrument import CommCounter, track_memory
    from validate.results import CommRow, PipelineEvent, RankResult
    from validate.spec import RunSpec
    from validate.workloads.mesh import build_groups
    from validate.workloads.train import build_trainer, reference_losses

    spec = RunSpec.model_validate_json(spec_json)
    torch.set_num_threads(1)
    if torch.cuda.is_available():
        local = rank if local_rank is None else local_rank
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=2 * timeout_s),
    )
    groups = build_groups(spec.layout, device.type)
    reference = (None, None)
    if spec.check_reference_loss and rank == 0:
        reference = reference_losses(spec)
    trainer = build_trainer(spec, groups, device)

    if spec.inject_failure and rank == spec.failure_rank:
        if spec.inject_failure == "raise":
            raise RuntimeError(f"injected failure on rank {rank}")
        time.sleep(10 * timeout_s)

    losses = [trainer.step(step) for step in range(spec.warmup_steps)]
    step_times = []
    for i in range(spec.timed_steps):
        step = spec.warmup_steps + i
        if trainer.recorder is not None:
            trainer.recorder.events.clear()
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        trainer.step(step)
        if device.type == "cuda":
            torch.cuda.synchronize()
        step_times.append(time.perf_counter() - start)
    events = list(trainer.recorder.events) if trainer.recorder is not None else []

    dist.barrier()
    if trainer.recorder is not None:
        trainer.recorder.enabled = False
    # Tensors alive before the measured step that the tracker cannot reach through the
    # modules and the optimizer (pipeline receive buffers, RoPE tables) count as "Other".
    gc.collect()
    with warnings.catch_warnings():  # isinstance() touches deprecated module attributes
        warnings.simplefilter("ignore")
        alive = [
            obj
            for obj in gc.get_objects()
            if isinstance(obj, torch.Tensor) and obj.device.type == device.type
        ]
    memory_context = track_memory(*alive, *trainer.tracked_objects())
    del alive
    counter = CommCounter(groups.axis_of_group)
    with counter, memory_context as memory:
        trainer.step(spec.warmup_steps + spec.timed_steps)

    result = RankResult(
        rank=rank,
        step_times_s=step_times,
        peak_memory_bytes=memory["peak_bytes"],
        memory_breakdown_bytes=memory["breakdown_bytes"],
        comm=[CommRow(**row) for row in counter.table()],
        losses=losses[:2],
        reference_losses=list(reference) if reference[0] is not None else None,
        pipeline_events=[PipelineEvent(**e) for e in events],
    )
    if trainer.schedule is not None:
        from validate.workloads import pipeline as pp_forms

        pp_rank = groups.coordinate("pp")
        order = [(e.kind, e.microbatch, e.stage) for e in result.pipeline_events]
        result.executed_order = order
        result.torch_order = pp_forms.torch_compute_order(trainer.schedule, pp_rank)
        result.planner_order = pp_forms.planner_compute_order(
            spec.planner_layout(), spec.num_microbatches, pp_rank
        )
    dist.barrier()
    return result
