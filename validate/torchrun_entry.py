"""Run one validation layout under torchrun (NCCL on GPUs, any number of nodes).

Every rank writes its :class:`~validate.results.RankResult` as ``rank<N>.json`` into
``--out``; :func:`validate.run.collect_rank_files` turns the folder into a
:class:`~validate.results.RunResult` for :func:`validate.compare.compare`. Example, two
nodes of 8 GPUs::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m validate.torchrun_entry --layout pp-1f1b --out results/pp-1f1b

The layout's degrees must multiply to the world size torchrun starts.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    from validate.run import find_layouts
    from validate.worker import run_rank

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", required=True, help="a name from QUICK_LAYOUTS or FULL_LAYOUTS")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    (spec,) = find_layouts([args.layout])
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world_size != spec.world_size:
        raise SystemExit(
            f"layout {spec.name} needs {spec.world_size} ranks, torchrun started {world_size}"
        )
    import torch.distributed as dist

    try:
        result = run_rank(
            rank,
            spec.model_dump_json(),
            world_size,
            "env://",
            args.timeout_s,
            local_rank=int(os.environ.get("LOCAL_RANK", rank)),
        )
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(result.model_dump_json())
    if rank == 0:
        (args.out / "spec.json").write_text(spec.model_dump_json())


if __name__ == "__main__":
    main()
