"""Speed of the layout search: candidates screened per second, cold and warm.

Screens the default query (Llama 3 405B on 16,384 H100s of the llama3-h100-24k cluster)
once cold (placements and per-shape tables built) and then ``--repeat`` times warm (cached
placements), printing wall and CPU seconds of each and the warm best and median (the
machine may be shared: CPU seconds show what the search itself used). Run from the
repository root: ``python benchmarks/search_speed.py`` (this checkout's ``planner``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an install

from hwspecs.catalog import load_accelerator, load_cluster
from planner.search import search
from planner.spec.job import Job
from planner.spec.model import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="warm runs (default 5)")
    args = parser.parse_args()
    cluster = load_cluster("llama3-h100-24k")
    accelerator = load_accelerator(cluster.accelerator)
    job = Job(model=load_model("llama3-405b"), seq_len=8192, global_batch_tokens=16 * 2**20)
    warm = []
    for run in range(1 + args.repeat):
        start, cpu = time.perf_counter(), time.process_time()
        found = search(job, cluster, accelerator, 16384)
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
        label = "cold" if run == 0 else f"warm {run}"
        print(
            f"{label}: {found.candidates_evaluated:,} candidates, {found.feasible:,} feasible in "
            f"{seconds:.2f} s (CPU {cpu_seconds:.2f} s) = "
            f"{found.candidates_evaluated / seconds:,.0f} candidates/s"
        )
        if run:
            warm.append(seconds)
    if warm:
        best, median = min(warm), statistics.median(warm)
        total = found.candidates_evaluated
        print(
            f"warm best {best:.2f} s = {total / best:,.0f} candidates/s; "
            f"median {median:.2f} s = {total / median:,.0f} candidates/s"
        )


if __name__ == "__main__":
    main()
