"""The measured local runs as rows of the published-runs schema (``llmplan validate --out``).

Each layout that ran becomes one row of :class:`hwspecs.runs.RunRow`, the schema of
``train.json``: the workload's shape, the layout as it ran, FP32 precision, and what was
measured (the slowest rank's median step time, tokens/s per rank, peak memory). The row
names the calibrated cluster TOML it ran on (``hardware.cluster``) and that cluster's
accelerator, so ``llmplan runs check --runs runs.json`` predicts it on the machine's own
calibrated specs and ``llmplan fit --runs runs.json --accelerator <id>`` fits a profile for
the machine at hand. Layouts that failed or timed out are left out (nothing was measured).
"""

from __future__ import annotations

import datetime
import socket

from hwspecs.catalog import load_accelerator, load_cluster
from hwspecs.runs import RunRow
from validate.results import RunResult


def _model(spec) -> dict:
    w = spec.workload
    moe = None
    if w.is_moe:
        moe = {"experts": w.num_routed_experts, "top_k": w.num_experts_per_token,
               "expert_ffn": w.moe_ffn_hidden_size, "dense_layers": w.num_dense_layers,
               "moe_layers": w.num_layers - w.num_dense_layers}  # fmt: skip
    return {"name": w.name, "layers": w.num_layers, "hidden": w.hidden_size,
            "ffn": w.ffn_hidden_size, "heads": w.num_attention_heads,
            "kv_heads": w.num_kv_heads, "head_dim": w.head_dim, "vocab": w.vocab_size,
            "mlp": "SwiGLU", "tied_embeddings": False, "moe": moe,
            "arch_notes": "llmplan validate workload: RMSNorm, GQA with RoPE, SwiGLU"}  # fmt: skip


def _training(spec) -> dict:
    layout, w = spec.planner_layout(), spec.workload
    return {
        "task": "pretrain",
        "seq_len": w.seq_len,
        "global_batch_seqs": spec.global_batch_size,
        "global_batch_tokens": spec.global_batch_size * w.seq_len,
        "micro_batch": layout.micro_batch_size,
        "grad_accum": spec.num_microbatches,
        "tp": layout.tp,
        "pp": layout.pp,
        "cp": layout.cp,
        "dp": layout.dp,
        "ep": layout.ep,
        "vpp": layout.vpp,
        "pp_schedule": layout.schedule,
        "zero_stage": layout.zero_stage,
        "sequence_parallel": layout.sequence_parallel if layout.tp > 1 else None,
        "recompute": layout.recompute,
        "precision": "fp32",
        "framework": "torch.distributed (llmplan validate workloads)",
    }


def measured_run_row(result: RunResult, cluster: str, host: str, date: str) -> RunRow:
    """One run that measured a step, as a row of the runs schema on ``cluster`` (a TOML)."""
    spec = result.spec
    step = result.step_time_s()
    tokens = spec.global_batch_size * spec.workload.seq_len
    memory = result.memory_bytes()
    row_id = f"validate-{host}-{result.name}"
    return RunRow.model_validate(
        {
            "id": row_id,
            "source": f"llmplan validate on {host}, {date}",
            "source_ref": {"kind": "local", "config": result.name},
            "year": int(date[:4]),
            "group": row_id,
            "hardware": {
                "accelerator": load_cluster(cluster).accelerator,
                "accelerator_desc": load_accelerator(load_cluster(cluster).accelerator).name,
                "num_gpus": spec.world_size,
                "cluster": cluster,
            },
            "model": _model(spec),
            "training": _training(spec),
            "measured": {
                "step_time_s": step,
                "tokens_per_s_per_gpu": tokens / step / spec.world_size,
                "memory_gb_per_gpu": None if memory is None else memory / 1e9,
            },
            "notes": f"Measured by llmplan validate ({spec.timed_steps} timed steps, the "
            "slowest rank's median); memory is the peak tensor memory of the busiest rank.",
        }
    )


def measured_runs(results: list[RunResult], cluster: str) -> list[RunRow]:
    """The runs that measured a step, as rows (failed and timed-out layouts left out)."""
    host, date = socket.gethostname(), datetime.date.today().isoformat()
    return [
        measured_run_row(result, cluster, host, date)
        for result in results
        if result.ok and result.step_time_s()
    ]
