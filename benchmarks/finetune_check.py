"""Two claims checked with llmplan's numbers: "QLoRA fine-tunes a 70B-scale model on one 48 GB
GPU" and "Muon is about 2× as compute-efficient as AdamW".

1. QLoRA (Dettmers et al. 2023) with r = 64 on all linear layers, alpha 16, dropout 0.05
   (the paper's 33B/65B setting), NF4 base with double quantization, BF16 adapters, paged
   32-bit AdamW, gradient checkpointing (full recomputation), micro-batch 1, one GPU, for
   llama3-70b and a LLaMA-1 65B-shaped model (the size the paper used), at sequence
   512, 1024 and 2048: memory per GPU by part, whether it fits in 48 GB — taken as 48e9
   bytes, the nominal capacity of the 48 GB class (RTX A6000, A40, L40S), which is not in
   the hardware catalog — and the longest sequence that still fits. The paged optimizer
   states can move to CPU RAM when the GPU runs short, so the verdict is also given
   without them.
2. One optimizer step of llama3-8b on 8 H100s (h100-sxm from the catalog: HBM bandwidth ×
   its efficiency for the element-wise update, BF16 peak × matmul efficiency for Newton–
   Schulz; dgx-h100's NVLink all-gather bus bandwidth for Muon's extra traffic), ZeRO-1
   over the 8: AdamW vs Muon with both distribution schemes (planner.cost.optimizers).

Run: ``python benchmarks/finetune_check.py`` (a few seconds).
"""

from __future__ import annotations

from hwspecs.catalog import load_accelerator
from planner.comm.collectives import collective_time
from planner.cost.flops import model_flops_per_token
from planner.cost.optimizers import muon_matrix_shapes, optimizer_step_cost, optimizer_step_time
from planner.memory_report import memory_report
from planner.spec.finetune import FinetuneSpec, num_adapter_params
from planner.spec.job import Job
from planner.spec.layout import Layout
from planner.spec.model import ModelSpec, load_model
from planner.spec.precision import PrecisionSpec

#: The nominal "48 GB" of the 48 GB GPU class, in bytes (not a catalog accelerator).
CAPACITY_BYTES = 48e9
SEQ_LENS = (512, 1024, 2048)
GB = 1e9

#: LLaMA-1 65B (Touvron et al. 2023, Table 2: 80 layers, dimension 8192, 64 heads; FFN
#: 22016 and vocabulary 32000 from the released params.json / HF config).
LLAMA1_65B = ModelSpec(
    name="llama1-65b",
    num_layers=80,
    hidden_size=8192,
    ffn_hidden_size=22016,
    num_attention_heads=64,
    vocab_size=32000,
    tied_embeddings=False,
    sources={"shape": "LLaMA paper (arXiv 2302.13971) Table 2; HF huggyllama/llama-65b"},
)
#: The QLoRA paper's setting for 33B/65B (and qlora.py's defaults): r 64 on all linear layers,
#: alpha 16, dropout 0.05.
QLORA = FinetuneSpec(
    recipe="qlora", lora_rank=64, lora_alpha=16, lora_targets="all", lora_dropout=0.05
)
#: The single-GPU QLoRA layout: micro-batch 1, gradient checkpointing, no sharding.
ONE_GPU = Layout(micro_batch_size=1, num_microbatches=1, zero_stage=0, recompute="full")


def qlora_report(model: ModelSpec, seq_len: int):
    return memory_report(Job(model=model, seq_len=seq_len, finetune=QLORA), ONE_GPU)


def longest_fitting_seq(model: ModelSpec, resident: bool) -> int:
    """Largest multiple of 64 tokens whose peak fits (0 if even 64 does not)."""

    def fits(seq_len: int) -> bool:
        report = qlora_report(model, seq_len)
        paged = 0.0 if resident else report.recipe_breakdown_bytes["adapter_optimizer_states"]
        return report.total_bytes - paged <= CAPACITY_BYTES

    low, high = 0, 1024  # in units of 64 tokens: up to 65,536
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(64 * mid) else (low, mid - 1)
    return 64 * low


def print_qlora(model: ModelSpec) -> None:
    print(
        f"\n{model.name}: {model.num_params() / 1e9:.1f}B parameters, QLoRA r {QLORA.lora_rank} "
        f"on all linear layers ({num_adapter_params(model, QLORA) / 1e6:,.0f}M trainable), "
        "micro-batch 1, full recompute — GB (1e9 bytes) per GPU"
    )
    reports = {seq: qlora_report(model, seq) for seq in SEQ_LENS}
    parts = list(reports[SEQ_LENS[0]].recipe_breakdown_bytes)
    print(f"{'part':<28}" + "".join(f"{f'seq {seq}':>12}" for seq in SEQ_LENS))
    for part in parts:
        values = [reports[seq].recipe_breakdown_bytes[part] / GB for seq in SEQ_LENS]
        print(f"{part:<28}" + "".join(f"{value:>12.2f}" for value in values))
    print(f"{'total':<28}" + "".join(f"{reports[s].total_bytes / GB:>12.2f}" for s in SEQ_LENS))
    for seq, report in reports.items():
        paged = report.recipe_breakdown_bytes["adapter_optimizer_states"]
        resident = "fits" if report.total_bytes <= CAPACITY_BYTES else "does NOT fit"
        spilled = "fits" if report.total_bytes - paged <= CAPACITY_BYTES else "does NOT fit"
        print(
            f"  seq {seq}: {report.total_bytes / GB:.2f} GB {resident} in 48 GB with the optimizer "
            f"states on the GPU; {(report.total_bytes - paged) / GB:.2f} GB {spilled} with the "
            f"paged states ({paged / GB:.2f} GB) moved to CPU RAM"
        )
    for resident in (True, False):
        longest = longest_fitting_seq(model, resident)
        where = "states on the GPU" if resident else "paged states in CPU RAM"
        verdict = (
            f"fits up to {longest:,} tokens and stops fitting at {longest + 64:,}"
            if longest
            else "does not fit at any sequence length"
        )
        print(f"  verdict ({where}): {verdict}")


def print_optimizer_step() -> None:
    model = load_model("llama3-8b")
    h100 = load_accelerator("h100-sxm")
    hbm = h100.hbm_bytes_per_s * h100.hbm_bandwidth_efficiency
    matmul = h100.achievable_matmul_flops_per_s("bf16")
    shapes = muon_matrix_shapes(model)
    matrix_bytes = 2.0 * sum(rows * cols * count for rows, cols, count in shapes)
    link = collective_time("all-gather", matrix_bytes, 8, "dgx-h100")
    print(
        f"\nllama3-8b optimizer step on 8 H100 (ZeRO-1 over 8): HBM {hbm / 1e12:.2f} TB/s "
        f"achievable, BF16 {matmul / 1e12:.0f} TFLOP/s achievable, all-gather bus "
        f"{link.busbw_bytes_per_s / 1e9:.0f} GB/s ({link.algorithm}, {', '.join(link.tiers)})"
    )
    print(
        f"{'optimizer':<16}{'update GB':>10}{'update ms':>10}{'NS TFLOP':>10}{'NS ms':>9}"
        f"{'comm GB':>9}{'comm ms':>9}{'total ms':>10}"
    )
    tokens_per_gpu = 2**20 / 8  # an illustrative 1M-token step: 128 sequences of 8,192
    compute_s = model_flops_per_token(model, 8192) * tokens_per_gpu / matmul
    totals = {}
    for optimizer, scheme in (("adamw", "gather"), ("muon", "gather"), ("muon", "owner")):
        cost = optimizer_step_cost(
            PrecisionSpec(optimizer=optimizer),
            model.num_params(),
            shapes,
            dp=8,
            zero_stage=1,
            muon_scheme=scheme,
        )
        time = optimizer_step_time(cost, hbm, matmul, link.busbw_bytes_per_s)
        label = optimizer if optimizer == "adamw" else f"muon ({scheme})"
        totals[label] = time.total_s
        print(
            f"{label:<16}{cost.bytes_moved / GB:>10.2f}{time.elementwise_s * 1e3:>10.1f}"
            f"{cost.newton_schulz_flops / 1e12:>10.1f}{time.newton_schulz_s * 1e3:>9.1f}"
            f"{cost.extra_comm_bytes / GB:>9.2f}{time.extra_comm_s * 1e3:>9.1f}"
            f"{time.total_s * 1e3:>10.1f}"
        )
    share = ", ".join(f"{label} {100 * s / compute_s:.1f}%" for label, s in totals.items())
    print(
        f"against forward + backward of an illustrative 2^20-token step (128 × 8,192 tokens, "
        f"{compute_s:.2f} s per GPU at the same matmul rate) the optimizer step adds: {share}"
    )
    print(
        "\nWhat '2x compute-efficient' can and cannot mean. The claim (Jordan et al. 2024 on"
        " speedruns; Liu et al. 2025, Moonlight: '~2x computational efficiency compared to"
        " AdamW with compute optimal training') is about sample efficiency: Muon reaches a"
        " given loss with fewer training tokens, hence fewer steps. A cost model sees only the"
        " cost of one step. By that measure Muon is *dearer* than AdamW — the"
        " Newton-Schulz GEMMs, and under ZeRO either every rank orthogonalizing every matrix"
        " (gather) or the matrices travelling to their owners (owner) — the percentages above;"
        " its optimizer memory is smaller (one buffer instead of two). How many tokens either"
        " optimizer needs to reach a loss is an empirical property of optimizer, model, data"
        " and tuning, measured by training runs, not by FLOPs and bytes, and llmplan cannot see"
        " it. So '2x' can mean: about half the tokens (and steps) to the same loss in the"
        " reported runs, each step costing the overhead printed above. It cannot mean that a"
        " step runs twice as fast, and this model neither confirms nor refutes it."
    )


def main() -> None:
    print(
        f"QLoRA on one GPU against {CAPACITY_BYTES / GB:.0f} GB = 48e9 bytes "
        "(nominal capacity of the 48 GB class: RTX A6000, A40, L40S)"
    )
    for model in (LLAMA1_65B, load_model("llama3-70b")):
        print_qlora(model)
    print_optimizer_step()


if __name__ == "__main__":
    main()
