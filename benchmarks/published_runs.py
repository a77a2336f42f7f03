"""Published training runs vs llmplan's prediction: Llama 3 405B (Table 4) and DeepSeek-V3.

For each published row this runs the full layout search on the same cluster, GPU count,
sequence length and batch, then prints: the published TP/CP/PP/DP and MFU; where the best
row with the published degrees ranks in the search and the MFU llmplan predicts for it;
and the search's own winner. Nothing here is fitted to the published figures; the gap
between published and predicted MFU is reported as it comes out.

The DeepSeek-V3 table estimates its published layout (2,048 H800s, PP 16 DualPipe, EP 64,
ZeRO-1 DP 128, no TP, 4K sequences, 15,360 per batch) with the model's own training recipe
(FP8 GEMMs and the report's memory measures) and prints memory per GPU, causal MFU and
tokens/s per GPU next to the published ones.

Run: ``python benchmarks/published_runs.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an install

from hwspecs.catalog import load_accelerator, load_cluster
from planner import api
from planner.search import search
from planner.spec.job import Job
from planner.spec.model import load_model

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


# DeepSeek-V3: layout from the report (arXiv 2412.19437 §3.1-§3.2); causal MFU 38.94% from
# arXiv 2505.09343 Table 4 (43.73% non-causal); tokens/s/GPU derived from "180K H800 GPU
# hours per trillion tokens" (1e12 / (180e3 · 3600) ≈ 1,543); memory: fits in 80 GB.
DEEPSEEK_V3 = {
    "layout": {"tp": 1, "pp": 16, "ep": 64, "dp": 128, "schedule": "dualpipe", "zero_stage": 1},
    "seq_len": 4096,
    "global_batch_size": 15360,
    "mfu_causal": 0.3894,
    "tokens_per_s_per_gpu": 1e12 / (180e3 * 3600),
    "capacity_gb": 80,
}


def deepseek_v3() -> None:
    """Published vs predicted for DeepSeek-V3's training layout."""
    run = DEEPSEEK_V3
    job = api.build_job("deepseek-v3", run["seq_len"], global_batch_size=run["global_batch_size"])
    layout = api.build_layout(**run["layout"])
    result = api.estimate(job, layout, "dgx-h800", 2048)
    print(f"{'DeepSeek-V3':<12} {'memory/GPU':>16} {'MFU causal':>11} {'tokens/s/GPU':>13}")
    fits = f"< {run['capacity_gb']} GB"
    print(
        f"{'published':<12} {fits:>16} {run['mfu_causal']:>11.1%} "
        f"{run['tokens_per_s_per_gpu']:>13,.0f}"
    )
    memory = f"{result.memory_per_gpu_bytes / 1e9:.1f} GB" + (" fits" if result.fits else " NO")
    print(
        f"{'predicted':<12} {memory:>16} {result.mfu_causal:>11.1%} "
        f"{result.tokens_per_s_per_gpu:>13,.0f}"
    )
    points = (result.mfu_causal - run["mfu_causal"]) * 100
    speed = result.tokens_per_s_per_gpu / run["tokens_per_s_per_gpu"] - 1
    print(
        f"gap: {points:+.1f} MFU points (target ±5), tokens/s {speed:+.0%} (target ±20%); "
        f"step {result.step_time_s:.2f} s, of which EP exposed "
        f"{result.time_breakdown_s['ep_exposed']:.2f} s, bubble "
        f"{result.time_breakdown_s['pipeline_bubble']:.2f} s"
    )


if __name__ == "__main__":
    main()
    print()
    deepseek_v3()
