"""Launch layouts as real multi-process ``torch.distributed`` runs and collect what they measure.

Each layout runs in its own group of ``world_size`` processes (``torch.multiprocessing``
spawn; gloo on CPU with one thread per rank, NCCL when CUDA is present), rendezvous through
a file store, so nothing listens on a fixed port. A layout gets ``timeout_s``; a rank that
raises is reported with its traceback, a rank that never reports is reported as hung, and
the rest of the group is killed so the next layout starts clean. Results are handed to
``on_result`` and appended to ``jsonl_path`` as each layout finishes.

The same workloads run on a GPU cluster under torchrun (one process per GPU, NCCL); see
:mod:`validate.torchrun_entry`, and :func:`collect_rank_files` for reading its output.
"""

from __future__ import annotations

import json
import os
import queue as queue_module
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from hwspecs.errors import unknown_name_error
from planner.api import Layout
from validate.results import RankFailure, RankResult, RunResult
from validate.spec import RunSpec, Workload

#: Seconds the launcher waits for the other ranks to report once one has failed.
GRACE_S = 3.0

TINY = Workload()
TINY_MOE = Workload(
    name="tiny-moe",
    num_routed_experts=4,
    num_experts_per_token=2,
    moe_ffn_hidden_size=96,
    num_dense_layers=1,
)
SMALL = Workload(
    name="small-llama",
    num_layers=8,
    hidden_size=256,
    ffn_hidden_size=768,
    num_attention_heads=8,
    num_kv_heads=4,
    vocab_size=4096,
    seq_len=256,
)

#: A vocabulary as large as a layer's working set: which of the two a full-recompute peak
#: holds at the loss turn (:func:`planner.cost.activations.layer_working_beside_logits`).
WIDE_VOCAB = Workload(
    name="wide-vocab",
    hidden_size=256,
    ffn_hidden_size=768,
    vocab_size=3072,
    seq_len=512,
)


def _spec(name: str, workload: Workload = TINY, **layout) -> RunSpec:
    return RunSpec(name=name, workload=workload, layout=Layout(**layout))


#: What ``--quick`` runs: every parallel form once on 2 ranks, one 2-D layout on 4.
QUICK_LAYOUTS: list[RunSpec] = [
    _spec("dp-fsdp2", dp=2, zero_stage=3),
    _spec("tp-sp", tp=2, sequence_parallel=True, zero_stage=0),
    _spec("pp-1f1b", pp=2, schedule="1f1b", num_microbatches=4, zero_stage=0),
    _spec("pp-zbv", pp=2, vpp=2, schedule="zbv", num_microbatches=4, zero_stage=0),
    _spec("ep", TINY_MOE, dp=2, ep=2, zero_stage=0),
    _spec("cp-allgather", cp=2, zero_stage=0),
    _spec("cp-ring", cp=2, cp_algorithm="ring", zero_stage=0),
    _spec("cp-ulysses", cp=2, cp_algorithm="ulysses", zero_stage=0),
    _spec("fsdp-tp", dp=2, tp=2, zero_stage=3, sequence_parallel=True),
]

#: The longer set: every schedule, every ZeRO stage, both 2-D layouts, a larger model.
FULL_LAYOUTS: list[RunSpec] = [
    *(
        _spec(f"dp-zero{stage}", SMALL, dp=2, zero_stage=stage, micro_batch_size=2)
        for stage in range(4)
    ),
    _spec("tp", SMALL, tp=2, sequence_parallel=False, zero_stage=0),
    _spec("tp-sp", SMALL, tp=2, sequence_parallel=True, zero_stage=0),
    *(
        _spec(f"pp-{name}", SMALL, pp=2, vpp=vpp, schedule=name, num_microbatches=4, zero_stage=0)
        for name, vpp in (
            ("gpipe", 1),
            ("1f1b", 1),
            ("interleaved-1f1b", 2),
            ("zbv", 2),
            ("dualpipev", 2),
            ("llmplan:1f1b", 1),
            ("llmplan:zb-h1", 1),
        )
    ),
    _spec("ep", TINY_MOE.model_copy(update={"seq_len": 256}), dp=2, ep=2, zero_stage=0),
    _spec("cp-allgather", SMALL, cp=2, zero_stage=0),
    _spec("cp-ring", SMALL, cp=2, cp_algorithm="ring", zero_stage=0),
    _spec("cp-ulysses", SMALL, cp=2, cp_algorithm="ulysses", zero_stage=0),
    _spec("cp-ring-4", SMALL, cp=4, cp_algorithm="ring", zero_stage=0),
    _spec("cp-hierarchical", SMALL, cp=4, cp_algorithm="hierarchical", cp_inner=2, zero_stage=0),
    _spec("fsdp-tp", SMALL, dp=2, tp=2, zero_stage=3),
    _spec("pp-dp", SMALL, pp=2, dp=2, schedule="1f1b", num_microbatches=4, zero_stage=0),
    _spec("dp-recompute", WIDE_VOCAB, dp=2, zero_stage=0, recompute="full", micro_batch_size=4),
]


def run_layouts(
    layouts: Iterable[RunSpec] | None = None,
    quick: bool = True,
    timeout_s: float = 120.0,
    on_result: Callable[[RunResult], None] | None = None,
    jsonl_path: str | Path | None = None,
) -> list[RunResult]:
    """Run each layout (default: :data:`QUICK_LAYOUTS`, or :data:`FULL_LAYOUTS` when not quick).

    A failed or hung layout is reported in its result and the next one still runs.
    """
    if layouts is None:
        layouts = QUICK_LAYOUTS if quick else FULL_LAYOUTS
    results = []
    for spec in layouts:
        result = run_layout(spec, timeout_s)
        results.append(result)
        if jsonl_path is not None:
            with open(jsonl_path, "a") as handle:
                handle.write(result.model_dump_json() + "\n")
        if on_result is not None:
            on_result(result)
    return results


def run_layout(spec: RunSpec, timeout_s: float = 120.0) -> RunResult:
    """Launch ``spec.world_size`` ranks, wait at most ``timeout_s``, always reap them."""
    import torch.multiprocessing as mp

    from validate.worker import rank_main

    start = time.perf_counter()
    ctx = mp.get_context("spawn")
    reports = ctx.Queue()
    world = spec.world_size
    with tempfile.TemporaryDirectory(prefix="llmplan-validate-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        context = mp.start_processes(
            rank_main,
            args=(spec.model_dump_json(), world, init_file, reports, timeout_s),
            nprocs=world,
            join=False,
            start_method="spawn",
        )
        results, failures = _collect(context.processes, reports, world, start + timeout_s)
        reap(context.processes)
    status = "ok"
    if failures:
        hung_only = all(f.kind == "hung" for f in failures)
        status = "timeout" if hung_only else "failed"
    return RunResult(
        name=spec.name,
        spec=spec,
        status=status,
        wall_s=time.perf_counter() - start,
        ranks=sorted(results.values(), key=lambda r: r.rank) if not failures else [],
        failures=sorted(failures, key=lambda f: f.rank),
    )


def _collect(processes, reports, world: int, deadline: float):
    """Read rank reports until all arrived, one failed (plus a grace period) or time ran out."""
    results: dict[int, RankResult] = {}
    failures: list[RankFailure] = []
    abort_at = None
    while len(results) + len(failures) < world:
        now = time.perf_counter()
        if now > deadline or (abort_at is not None and now > abort_at):
            break
        try:
            status, rank, payload = reports.get(timeout=0.1)
        except queue_module.Empty:
            for rank, process in enumerate(processes):
                reported = rank in results or any(f.rank == rank for f in failures)
                if not reported and process.exitcode not in (None, 0):
                    failures.append(
                        RankFailure(rank=rank, kind="died", message=f"exit code {process.exitcode}")
                    )
                    abort_at = abort_at or time.perf_counter() + GRACE_S
            continue
        if status == "ok":
            results[rank] = RankResult.model_validate_json(payload)
        else:
            failures.append(RankFailure(rank=rank, kind="error", message=payload.strip()))
            abort_at = abort_at or time.perf_counter() + GRACE_S
    reported = set(results) | {f.rank for f in failures}
    for rank in range(world):
        if rank not in reported:
            if abort_at is not None:
                message = "no report; killed after another rank failed"
                failures.append(RankFailure(rank=rank, kind="aborted", message=message))
            else:
                message = "no report before the time limit; killed"
                failures.append(RankFailure(rank=rank, kind="hung", message=message))
    return results, failures


def reap(processes) -> None:
    """Kill every rank still alive and wait for all of them."""
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join(timeout=10)


def load_results(path: str | Path) -> list[RunResult]:
    """Results written by :func:`run_layouts` to a JSON-lines file."""
    lines = Path(path).read_text().splitlines()
    return [RunResult.model_validate(json.loads(line)) for line in lines if line.strip()]


def find_layouts(names: Iterable[str]) -> list[RunSpec]:
    """Layouts by name from the quick and full sets (quick first); unknown names are errors."""
    known: dict[str, RunSpec] = {}
    for spec in (*FULL_LAYOUTS, *QUICK_LAYOUTS):
        known[spec.name] = spec
    found = []
    for name in names:
        if name not in known:
            raise unknown_name_error("layout", name, known)
        found.append(known[name])
    return found


def collect_rank_files(folder: str | Path) -> RunResult:
    """The RunResult of a torchrun launch from the ``rank<N>.json`` files it wrote."""
    folder = Path(folder)
    spec = RunSpec.model_validate_json((folder / "spec.json").read_text())
    ranks = [RankResult.model_validate_json(path.read_text()) for path in folder.glob("rank*.json")]
    found = {r.rank for r in ranks}
    failures = [
        RankFailure(rank=rank, kind="died", message=f"no rank{rank}.json in {folder}")
        for rank in range(spec.world_size)
        if rank not in found
    ]
    return RunResult(
        name=spec.name,
        spec=spec,
        status="failed" if failures else "ok",
        wall_s=0.0,
        ranks=sorted(ranks, key=lambda r: r.rank) if not failures else [],
        failures=failures,
    )
