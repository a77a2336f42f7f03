"""Measuring one rank: bytes per collective per axis, peak tensor memory, action timestamps.

Collectives are counted at the dispatcher, where every call from Python (``dist.*``),
from C++ (DDP's reducer) and from DTensor (functional collectives) passes as one
``c10d::*`` or ``_c10d_functional::*`` op with its tensors and its process group. Bytes per
call are the size of the buffer the collective works on at its call site, not a wire model:

* all_reduce, broadcast: the tensor(s);
* all_gather: the gathered output (n × the input);
* reduce_scatter: the full input (n × the output);
* all_to_all: the input this rank sends (including the block it keeps);
* send / recv: the tensor; recv bytes are reported apart (the peer counted them as sent).

Beside them, :func:`sent_bytes` converts each call into the bytes one rank sends under the
standard algorithms (nccl-tests' factors), the convention of the planner's
``bytes_per_step``.

Memory: :class:`torch.distributed._tools.mem_tracker.MemTracker` tracks every tensor
storage allocated through the dispatcher on CPU, by kind (parameter, gradient, activation,
temporary, optimizer state); on CUDA ``torch.cuda.max_memory_allocated`` is used instead.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

c10d = torch.ops.c10d
functional = torch.ops._c10d_functional


def _nbytes(tensors) -> int:
    if isinstance(tensors, torch.Tensor):
        return tensors.numel() * tensors.element_size()
    return sum(_nbytes(t) for t in tensors)


#: op overload packet -> (collective, bytes from the op's arguments, index of the group argument)
_OPS = {
    c10d.allreduce_: ("all_reduce", lambda a: _nbytes(a[0]), 1),
    c10d.allreduce_coalesced_: ("all_reduce", lambda a: _nbytes(a[0]), 1),
    c10d.broadcast_: ("broadcast", lambda a: _nbytes(a[0]), 1),
    c10d.reduce_: ("reduce", lambda a: _nbytes(a[0]), 1),
    c10d.allgather_: ("all_gather", lambda a: _nbytes(a[0]), 2),
    c10d._allgather_base_: ("all_gather", lambda a: _nbytes(a[0]), 2),
    c10d.allgather_into_tensor_coalesced_: ("all_gather", lambda a: _nbytes(a[0]), 2),
    c10d.allgather_coalesced_: ("all_gather", lambda a: _nbytes(a[0]), 2),
    c10d.reduce_scatter_: ("reduce_scatter", lambda a: _nbytes(a[1]), 2),
    c10d._reduce_scatter_base_: ("reduce_scatter", lambda a: _nbytes(a[1]), 2),
    c10d.reduce_scatter_tensor_coalesced_: ("reduce_scatter", lambda a: _nbytes(a[1]), 2),
    c10d.alltoall_base_: ("all_to_all", lambda a: _nbytes(a[1]), 2),
    c10d.alltoall_: ("all_to_all", lambda a: _nbytes(a[1]), 2),
    c10d.send: ("send", lambda a: _nbytes(a[0]), 1),
    c10d.recv_: ("recv", lambda a: _nbytes(a[0]), 1),
    c10d.recv_any_source_: ("recv", lambda a: _nbytes(a[0]), 1),
    # Functional collectives (DTensor): the group name is the last positional argument.
    functional.all_reduce: ("all_reduce", lambda a: _nbytes(a[0]), -1),
    functional.all_reduce_: ("all_reduce", lambda a: _nbytes(a[0]), -1),
    functional.all_reduce_coalesced: ("all_reduce", lambda a: _nbytes(a[0]), -1),
    functional.all_reduce_coalesced_: ("all_reduce", lambda a: _nbytes(a[0]), -1),
    functional.broadcast: ("broadcast", lambda a: _nbytes(a[0]), -1),
    functional.broadcast_: ("broadcast", lambda a: _nbytes(a[0]), -1),
    functional.all_gather_into_tensor: ("all_gather", lambda a: _nbytes(a[0]) * a[1], -1),
    functional.all_gather_into_tensor_out: ("all_gather", lambda a: _nbytes(a[0]) * a[1], -1),
    functional.all_gather_into_tensor_coalesced: (
        "all_gather",
        lambda a: _nbytes(a[0]) * a[1],
        -1,
    ),
    functional.reduce_scatter_tensor: ("reduce_scatter", lambda a: _nbytes(a[0]), -1),
    functional.reduce_scatter_tensor_out: ("reduce_scatter", lambda a: _nbytes(a[0]), -1),
    functional.reduce_scatter_tensor_coalesced: ("reduce_scatter", lambda a: _nbytes(a[0]), -1),
    functional.all_to_all_single: ("all_to_all", lambda a: _nbytes(a[0]), -1),
    functional.isend: ("send", lambda a: _nbytes(a[0]), -1),
    functional.irecv: ("recv", lambda a: _nbytes(a[0]), -1),
}


def _resolve_group(group) -> dist.ProcessGroup:
    """The ProcessGroup behind an op argument: a name (functional ops) or a boxed object."""
    if isinstance(group, str):
        return dist.distributed_c10d._resolve_process_group(group)
    if not isinstance(group, dist.ProcessGroup):
        return dist.ProcessGroup.unbox(group)  # c10d ops carry a ScriptObject
    return group


def _kept_block_bytes(func, args, group: dist.ProcessGroup) -> int:
    """Bytes of its own all_to_all input a rank keeps (the split addressed to itself)."""
    packet = func.overloadpacket
    tensor = args[1] if packet in (c10d.alltoall_base_, c10d.alltoall_) else args[0]
    if packet is c10d.alltoall_:
        return _nbytes(tensor[group.rank()])
    splits = args[4] if packet is c10d.alltoall_base_ else args[2]
    total = _nbytes(tensor)
    if not splits:
        return total // group.size()
    return total * splits[group.rank()] // max(sum(splits), 1)


def sent_bytes(collective: str, call_bytes: int, group_size: int, kept_bytes: int = 0) -> float:
    """Bytes one rank sends for one call under the standard algorithms (nccl-tests' busbw).

    Ring all-reduce ``2(n−1)/n·S``; all-gather and reduce-scatter ``(n−1)/n·S`` of the full
    buffer; all-to-all its input minus the block it keeps; send the tensor; receive 0.
    gloo's own algorithms differ (its reduce-scatter is an all-reduce plus a copy); this is
    the convention the planner's ``bytes_per_step`` uses, not a wire capture.
    """
    n = group_size
    if n <= 1 or collective in ("recv",):
        return 0.0
    if collective == "all_reduce":
        return 2 * (n - 1) / n * call_bytes
    if collective in ("all_gather", "reduce_scatter"):
        return (n - 1) / n * call_bytes
    if collective == "all_to_all":
        return float(call_bytes - kept_bytes)
    if collective in ("broadcast", "reduce"):
        return (n - 1) / n * call_bytes
    return float(call_bytes)


class CommCounter(TorchDispatchMode):
    """Counts calls and bytes of every collective, by axis and collective.

    ``axis_of_group`` maps a process group's name to its axis (``dp``, ``tp``, …); groups
    not in it are reported under their own name. ``bytes`` is the call-site buffer size
    (module docstring); ``sent_bytes`` the standard-algorithm bytes sent (:func:`sent_bytes`).
    """

    def __init__(self, axis_of_group: dict[str, str]):
        super().__init__()
        self.axis_of_group = axis_of_group
        self.calls: dict[tuple[str, str], int] = defaultdict(int)
        self.bytes: dict[tuple[str, str], int] = defaultdict(int)
        self.sent: dict[tuple[str, str], float] = defaultdict(float)
        self.group_size: dict[tuple[str, str], int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        entry = _OPS.get(func.overloadpacket)
        if entry is not None:
            collective, size, group_index = entry
            group = _resolve_group(args[group_index])
            key = (self.axis_of_group.get(group.group_name, group.group_name), collective)
            call_bytes = size(args)
            kept = _kept_block_bytes(func, args, group) if collective == "all_to_all" else 0
            self.calls[key] += 1
            self.bytes[key] += call_bytes
            self.sent[key] += sent_bytes(collective, call_bytes, group.size(), kept)
            self.group_size[key] = group.size()
        return func(*args, **kwargs)

    def table(self) -> list[dict]:
        """One row per (axis, collective): group size, calls, call-site bytes, bytes sent."""
        return [
            {
                "axis": axis,
                "collective": collective,
                "group_size": self.group_size[(axis, collective)],
                "calls": self.calls[(axis, collective)],
                "bytes": self.bytes[(axis, collective)],
                "sent_bytes": self.sent[(axis, collective)],
            }
            for axis, collective in sorted(self.calls)
        ]


@contextmanager
def track_memory(*tracked):
    """Yield a dict filled on exit with this rank's peak tensor memory and its breakdown.

    CPU: MemTracker over ``tracked`` modules/optimizers plus everything allocated inside.
    CUDA: the allocator's peak since the start of the block.
    """
    result: dict = {}
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        yield result
        torch.cuda.synchronize()
        result["peak_bytes"] = int(torch.cuda.max_memory_allocated())
        result["breakdown_bytes"] = {}
        return
    tracker = _step_mem_tracker()
    tracker.track_external(*tracked)
    del tracked  # the tracker holds weak references; do not keep these tensors alive
    with tracker:
        yield result
    snapshot = tracker.get_tracker_snapshot("peak")
    parts = next((v for device, v in snapshot.items() if device.type == "cpu"), {})
    result["peak_bytes"] = int(parts.get("Total", 0))
    result["breakdown_bytes"] = {
        str(getattr(kind, "value", kind)): int(value)
        for kind, value in parts.items()
        if kind != "Total"
    }


class _BackwardFlag:
    """Stands in for MemTracker's module tracker: only says whether autograd is running.

    The module tracker hooks every module's inputs and outputs for backward; those hooks
    fail under ``torch.autograd.grad`` with split input/weight backward (zero-bubble
    schedules) and refuse a root module called once per micro-batch. The peak and its
    breakdown by kind need neither; parameters, gradients and optimizer states are
    registered up front with ``track_external``.
    """

    parents = frozenset({"Global"})

    @property
    def is_bw(self) -> bool:
        return torch._C._current_graph_task_id() != -1

    def register_user_hooks(self, *hooks) -> None:
        pass

    def clear_user_hooks(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *args) -> None:
        pass


def _step_mem_tracker():
    """torch's MemTracker keeping only the global peak and its breakdown (see _BackwardFlag)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker._mod_tracker = _BackwardFlag()
    return tracker


class ActionRecorder:
    """Start and end of every pipeline compute action on this rank (``time.perf_counter``).

    Installed on torch's pipeline stages, it wraps ``forward_one_chunk`` (F),
    ``backward_one_chunk`` (BW when full, else B) and ``backward_weight_one_chunk`` (W).
    """

    def __init__(self):
        self.events: list[dict] = []
        self.enabled = True

    def install(self, stage) -> None:
        forward = stage.forward_one_chunk
        backward = stage.backward_one_chunk
        backward_weight = stage.backward_weight_one_chunk
        index = stage.stage_index

        def timed(kind, fn, microbatch, *args, **kwargs):
            start = time.perf_counter()
            out = fn(microbatch, *args, **kwargs)
            if self.enabled:
                self.events.append(
                    {
                        "kind": kind,
                        "microbatch": int(microbatch),
                        "stage": index,
                        "start_s": start,
                        "end_s": time.perf_counter(),
                    }
                )
            return out

        def forward_one_chunk(microbatch, *args, **kwargs):
            return timed("F", forward, microbatch, *args, **kwargs)

        def backward_one_chunk(microbatch, *args, **kwargs):
            full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
            return timed("BW" if full else "B", backward, microbatch, *args, **kwargs)

        def backward_weight_one_chunk(microbatch, *args, **kwargs):
            return timed("W", backward_weight, microbatch, *args, **kwargs)

        stage.forward_one_chunk = forward_one_chunk
        stage.backward_one_chunk = backward_one_chunk
        stage.backward_weight_one_chunk = backward_weight_one_chunk
