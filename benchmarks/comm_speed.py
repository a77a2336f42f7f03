"""How fast the search can cost communication: rows of layouts per second.

Builds N random layouts of Llama 3 405B (tp, cp, pp, dp, vpp, micro-batch size, ZeRO
stage, sequence parallelism, recompute, schedule) that fit on the 24,576-GPU Llama 3
cluster, then times :func:`planner.comm.traffic.axis_times_vectorized` on all of them at
once: a cold call (placements and cost tables built for each distinct tp·cp·ep·pp·dp) and a
warm one (placements cached). Prints rows per second for each.

Run: ``python benchmarks/comm_speed.py [--rows 1000000] [--cluster llama3-h100-24k]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from planner.comm.traffic import axis_times_vectorized
from planner.spec.job import Job
from planner.spec.model import load_model


def random_columns(rows: int, max_gpus: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random layout columns whose tp·cp·pp·dp fits in ``max_gpus`` and divides the batch."""
    rng = np.random.default_rng(seed)
    pick = lambda values: rng.choice(np.array(values), size=rows)  # noqa: E731
    columns = {
        "tp": pick([1, 2, 4, 8]),
        "cp": pick([1, 2, 4]),
        "pp": pick([1, 2, 4, 8, 16]),
        "dp": pick([1, 2, 4, 8, 16, 32, 64, 128]),
        "micro_batch_size": pick([1, 2]),
        "zero_stage": pick([0, 1, 2, 3]),
        "sequence_parallel": pick([True, False]),
        "recompute": pick(["none", "selective", "full"]),
        "schedule": pick(["1f1b", "interleaved-1f1b", "zbv"]),
    }
    columns["vpp"] = np.where(columns["schedule"] == "1f1b", 1, 2)
    fits = columns["tp"] * columns["cp"] * columns["pp"] * columns["dp"] <= max_gpus
    columns["dp"] = np.where(fits, columns["dp"], 1)
    return columns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--cluster", default="llama3-h100-24k")
    args = parser.parse_args()
    job = Job(model=load_model("llama3-405b"), seq_len=8192, global_batch_tokens=16 * 2**20)
    columns = random_columns(args.rows, max_gpus=24_576)
    distinct = len({tuple(r) for r in np.stack([columns[a] for a in ("tp", "cp", "pp", "dp")],
                                                axis=1).tolist()})  # fmt: skip
    for label in ("cold", "warm"):
        start = time.perf_counter()
        out = axis_times_vectorized(job, args.cluster, **columns)
        seconds = time.perf_counter() - start
        print(
            f"{label}: {args.rows:,} rows ({distinct} distinct tp·cp·pp·dp) in {seconds:.2f} s "
            f"= {args.rows / seconds:,.0f} rows/s; valid {int(out['valid'].sum()):,}"
        )


if __name__ == "__main__":
    main()
