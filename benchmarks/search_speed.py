"""Speed of the layout search: candidates screened per second, in-process and whole-process.

Three queries: the default (Llama 3 405B on 16,384 H100s of the llama3-h100-24k cluster),
DeepSeek-V3 on 2,048 H800s (its published run: seq 4,096, 15,360 sequences per step) and
Qwen3-235B-A22B on 1,024 H100s (seq 4,096, 16M tokens per step). For each:

* in-process: the search (:func:`planner.search.search`), in this process set up as the
  command line sets up its own (``cli.set_up_process``: malloc, collector), once cold
  (placements and tables built) and ``--repeat`` times warm, wall and CPU seconds and candidates per second, then
  the screen alone ``--repeat`` times (``refine_top=0``: no event simulation of the top
  rows); each as ``llmplan plan`` runs it when it writes no table (``every_output=False``:
  the table keeps what the ranking reads, and ``only_top=5``: only the rows that can reach
  its five results are timed; ``--every-row`` times every row that fits, ``--every-output``
  also keeps every output, as ``--csv``/``--html`` do);
* whole-process: ``python cli.py plan …`` run ``--repeat`` times as a child process
  (all of them first, while this process is small; modules read from cached bytecode, as
  on any machine after their first import, also where the environment sets
  ``PYTHONDONTWRITEBYTECODE``: ``--compile-each-run`` to compile them in every run)
  (interpreter, imports, search, the top rows' estimates and the printed table), median
  and best wall seconds, the median CPU seconds (user + system: what the wall would be
  on an idle core) and the peak resident memory (the child's ``ru_maxrss``).

The machine may be shared: CPU seconds show what the search itself used, medians what a
user waits. The search's blocks run on threads (``LLMPLAN_THREADS``; the count is printed,
with the load average): its CPU seconds may exceed its wall. Run from the repository root:
``python benchmarks/search_speed.py`` (this checkout's ``planner``; ``--only deepseek-v3``
for one query, ``--no-process`` to skip the child processes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout, not an install

#: name → (model, cluster, GPUs, seq_len, {batch}, the CLI flags of the same query)
QUERIES = {
    "llama3-405b": ("llama3-405b", "llama3-h100-24k", 16384, 8192,
                    {"global_batch_tokens": 16 * 2**20}, []),
    "deepseek-v3": ("deepseek-v3", "dgx-h800", 2048, 4096, {"global_batch_size": 15360},
                    ["--model", "deepseek-v3", "--cluster", "dgx-h800", "--gpus", "2048",
                     "--seq-len", "4096", "--global-batch-size", "15360"]),
    "qwen3-235b": ("qwen3-235b-a22b", "dgx-h100", 1024, 4096,
                   {"global_batch_tokens": 16 * 2**20},
                   ["--model", "qwen3-235b-a22b", "--cluster", "dgx-h100", "--gpus", "1024",
                    "--seq-len", "4096"]),
}  # fmt: skip


def in_process(name: str, repeat: int, every_output: bool = False, every_row: bool = False) -> None:
    """Cold and warm searches of one query in this process."""
    from hwspecs.catalog import load_accelerator, load_cluster
    from planner.api import build_job
    from planner.search import search

    model, cluster_name, gpus, seq_len, batch, _ = QUERIES[name]
    cluster = load_cluster(cluster_name)
    accelerator = load_accelerator(cluster.accelerator)
    job = build_job(model, seq_len, **batch)
    runs = [("cold", None)] + [(f"warm {run}", None) for run in range(1, 1 + repeat)]
    runs += [(f"screen {run}", 0) for run in range(1, 1 + repeat)]
    seconds_of: dict[str, list[tuple[float, float]]] = {"warm": [], "screen": []}
    for label, refine_top in runs:
        options = {"every_output": every_output}
        if not (every_output or every_row):  # as the plan reads them: its top 5
            options["only_top"] = 5
        if refine_top is not None:
            options["refine_top"] = refine_top
        start, cpu = time.perf_counter(), time.process_time()
        found = search(job, cluster, accelerator, gpus, **options)
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
        print(
            f"  {label}: {found.candidates_evaluated:,} candidates, {found.feasible:,} feasible "
            f"in {seconds:.2f} s (CPU {cpu_seconds:.2f} s) = "
            f"{found.candidates_evaluated / seconds:,.0f} candidates/s"
        )
        if label != "cold":
            seconds_of[label.split()[0]].append((seconds, cpu_seconds))
    total = found.candidates_evaluated
    for kind, what in (("warm", "search (top rows simulated)"), ("screen", "screen alone")):
        if seconds_of[kind]:
            median = statistics.median(wall for wall, _ in seconds_of[kind])
            cpu = statistics.median(cpu for _, cpu in seconds_of[kind])
            print(
                f"  in-process {what}: median {median:.2f} s = {total / median:,.0f} "
                f"candidates/s (CPU {cpu:.2f} s = {total / cpu:,.0f} candidates/s)"
            )


def child_environment(compiled: bool, cache: str) -> dict[str, str]:
    """The children's environment. ``compiled``: modules are read from cached bytecode, as
    Python does on any machine after a module's first import (where the environment says
    not to write bytecode — ``PYTHONDONTWRITEBYTECODE``, as some sandboxes and containers
    set it —, the children write and read it under ``cache``, and the first child, which
    writes it, is not counted); else the environment as it is."""
    env = dict(os.environ)
    if compiled and env.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
        env.setdefault("PYTHONPYCACHEPREFIX", cache)
    return env


def whole_process(name: str, repeat: int, compiled: bool = True) -> None:
    """``python cli.py plan`` of one query as a child process: wall seconds, peak RSS."""
    command = [sys.executable, str(ROOT / "cli.py"), "plan", *QUERIES[name][5]]
    walls, peaks, cpus = [], [], []
    with tempfile.TemporaryDirectory(prefix="llmplan-bytecode-") as cache:
        env = child_environment(compiled, cache)
        if compiled:  # the bytecode written (or found) before the counted runs
            subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, env=env, check=True)
        for _ in range(repeat):
            start = time.perf_counter()
            child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, env=env)
            _, status, usage = os.wait4(child.pid, 0)
            walls.append(time.perf_counter() - start)
            peaks.append(usage.ru_maxrss * 1024)  # Linux reports KiB
            cpus.append(usage.ru_utime + usage.ru_stime)
            if os.waitstatus_to_exitcode(status):
                raise SystemExit(f"{' '.join(command)} failed")
    print(
        f"  whole process ({' '.join(['cli.py plan', *QUERIES[name][5]])}): "
        f"median {statistics.median(walls):.2f} s, best {min(walls):.2f} s "
        f"(CPU median {statistics.median(cpus):.2f} s), "
        f"peak {max(peaks) / 2**30:.2f} GiB over {repeat} runs"
        + ("" if compiled else ", modules compiled from source each run")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="warm runs and processes (3)")
    parser.add_argument("--only", choices=list(QUERIES), help="one query")
    parser.add_argument("--no-process", action="store_true", help="skip the child processes")
    parser.add_argument(
        "--every-output",
        action="store_true",
        help="in-process searches keep every output (as a plan with --csv)",
    )
    parser.add_argument("--compile-each-run", action="store_true",
                        help="children read no cached bytecode where the environment says not "
                             "to write it (PYTHONDONTWRITEBYTECODE): as a first run")  # fmt: skip
    parser.add_argument("--every-row", action="store_true",
                        help="in-process searches time every row that fits (no only_top)")  # fmt: skip
    args = parser.parse_args()
    names = [args.only] if args.only else list(QUERIES)
    # Child processes first, from a parent that has imported nothing large: a child's
    # ru_maxrss starts from its parent's resident size at the fork.
    for name in [] if args.no_process else names:
        print(name)
        whole_process(name, args.repeat, not args.compile_each_run)
    from cli import set_up_process  # after the children, which set up their own
    from planner.evaluate.blocks import THREADS_VARIABLE, worker_threads

    set_up_process()
    print(f"threads: {worker_threads()} ({THREADS_VARIABLE} sets it; the children's too), "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    for name in names:
        print(name)
        in_process(name, args.repeat, args.every_output, args.every_row)


if __name__ == "__main__":
    main()
