"""Speed of the layout search: candidates screened per second, cold and warm.

Screens the default query (Llama 3 405B on 16,384 H100s of the llama3-h100-24k cluster)
twice: cold (placements and per-shape tables built) and warm (cached placements). Run:
``python benchmarks/search_speed.py``.
"""

from __future__ import annotations

import time

from hwspecs.catalog import load_accelerator, load_cluster
from planner.job import Job
from planner.model import load_model
from planner.search import search


def main() -> None:
    cluster = load_cluster("llama3-h100-24k")
    accelerator = load_accelerator(cluster.accelerator)
    job = Job(model=load_model("llama3-405b"), seq_len=8192, global_batch_tokens=16 * 2**20)
    for label in ("cold", "warm"):
        start = time.perf_counter()
        found = search(job, cluster, accelerator, 16384)
        seconds = time.perf_counter() - start
        print(
            f"{label}: {found.candidates_evaluated:,} candidates, {found.feasible:,} feasible in "
            f"{seconds:.2f} s = {found.candidates_evaluated / seconds:,.0f} candidates/s"
        )


if __name__ == "__main__":
    main()
