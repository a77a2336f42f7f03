"""Published training runs vs llmplan's prediction: the Llama 3 405B plans (Table 4).

For each published row this runs the full layout search on the same cluster, GPU count,
sequence length and batch, then prints: the published TP/CP/PP/DP and MFU; where the best
row with the published degrees ranks in the search and the MFU llmplan predicts for it;
and the search's own winner. Nothing here is fitted to the published figures; the gap
between published and predicted MFU is reported as it comes out.

Run: ``python benchmarks/published_runs.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import time

from hwspecs.catalog import load_accelerator, load_cluster
from planner.job import Job
from planner.model import load_model
from planner.search import search

# Llama 3 paper (arXiv 2407.21783) Table 4: GPUs, TP, CP, PP, DP, sequence, BF16 MFU.
LLAMA3_TABLE4 = [
    (8192, 8, 1, 16, 64, 8192, 0.43),
    (16384, 8, 1, 16, 128, 8192, 0.41),
    (16384, 8, 16, 16, 8, 131072, 0.38),
]
BATCH_TOKENS = 16 * 2**20  # "16M" tokens per batch in every row


def main() -> None:
    cluster = load_cluster("llama3-h100-24k")
    accelerator = load_accelerator(cluster.accelerator)
    model = load_model("llama3-405b")
    header = (
        f"{'GPUs':>6} {'seq':>7} {'published tp/cp/pp/dp':>22} {'pub MFU':>8} {'rank':>6} "
        f"{'pred MFU':>9} {'causal':>7} {'best schedule for it':>24} {'search winner tp/cp/pp/dp':>26} {'win MFU':>8} {'s':>5}"
    )
    print(header)
    for gpus, tp, cp, pp, dp, seq, published in LLAMA3_TABLE4:
        job = Job(model=model, seq_len=seq, global_batch_tokens=BATCH_TOKENS)
        start = time.perf_counter()
        found = search(job, cluster, accelerator, gpus)
        seconds = time.perf_counter() - start
        table = found.table
        degrees = table[["tp", "cp", "pp", "dp"]].astype(int).apply(tuple, axis=1)
        distinct = list(dict.fromkeys(degrees))  # degree tuples in rank order
        match = table[degrees == (tp, cp, pp, dp)]
        winner = table.iloc[0]
        if match.empty:
            rank, mfu, causal, schedule = "-", float("nan"), float("nan"), "infeasible"
        else:
            best = match.iloc[0]
            rank = str(distinct.index((tp, cp, pp, dp)) + 1)
            mfu, causal = best["mfu"], best["mfu_causal"]
            schedule = f"{best['schedule']} v{best['vpp']} mbs{best['micro_batch_size']}"
        print(
            f"{gpus:>6} {seq:>7} {f'{tp}/{cp}/{pp}/{dp}':>22} {published:>8.0%} {rank:>6} {mfu:>9.1%} {causal:>7.1%} "
            f"{schedule:>24} {f'{winner.tp}/{winner.cp}/{winner.pp}/{winner.dp}':>26} {winner.mfu:>8.1%} "
            f"{seconds:>5.1f}"
        )
    print(
        "rank: position of the published degrees among distinct tp/cp/pp/dp combinations, by step time"
    )


if __name__ == "__main__":
    main()
