"""How a published run's measurement is read: tokens/s as published, or derived from its step
time or its model TFLOP/s, the last counted as its publication's FLOP formula counts them."""

from __future__ import annotations

from hwspecs.runs import RunRow

#: Publications whose model TFLOP/s count causal attention, half the scores' FLOPs, where
#: llmplan's model FLOPs (PaLM Appendix B) count all of them: (repository, commit) → where the
#: formula says so. MaxText's ``calculate_training_tflops`` at 9bc243c counts them all.
CAUSAL_ATTENTION_FLOP_COUNTS = {
    ("AI-Hypercomputer/maxtext", "76bd53b0f44caf989c88189afadeb1062f9254f0"):
        "MaxText/train.py:83: causal_attention_tflops = noncasual_attention_flops / 2",
    ("AI-Hypercomputer/maxtext", "75a430609ff6875a8a7543e9311cc644b3a53d17"):
        "src/MaxText/maxtext_utils.py:170: causal_attention_flops = noncausal_attention_flops / 2",
}  # fmt: skip


def counts_causal_attention_flops(row: RunRow) -> bool:
    """Whether the row's published model TFLOP/s count causal attention (half the scores),
    read from its publication's FLOP formula (:data:`CAUSAL_ATTENTION_FLOP_COUNTS`)."""
    ref = row.source_ref
    return (ref.repo, ref.commit) in CAUSAL_ATTENTION_FLOP_COUNTS


def measured_tokens_per_s(row: RunRow, flops_per_token: dict) -> tuple[float | None, str | None]:
    """Measured tokens/s per GPU: published, or from the step time, or from the published
    model TFLOP/s over the model FLOPs per token as the publication counts them
    (``flops_per_token``: ``causal`` and ``full`` attention scores;
    :func:`counts_causal_attention_flops`)."""
    m, gpus = row.measured, row.hardware.num_gpus
    if m.tokens_per_s_per_gpu:
        return m.tokens_per_s_per_gpu, "tokens/s"
    if m.step_time_s:
        return row.training.global_batch_tokens / m.step_time_s / gpus, "step time"
    if m.model_tflops_per_gpu:
        counted = flops_per_token["causal" if counts_causal_attention_flops(row) else "full"]
        return m.model_tflops_per_gpu * 1e12 / counted, "model TFLOP/s"
    return None, None
