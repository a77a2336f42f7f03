"""Fused attention kernels' rates by sequence length: one accelerator's measured curves.

A fused attention kernel (FlashAttention, cuDNN's SDPA) runs each block of queries through
a loop over the keys it sees; the shorter that loop, the more of the kernel is its prologue,
epilogue and the causal mask's partial tiles, so the rate climbs with the sequence length
and levels off (Shah et al. 2024, FlashAttention-3, arXiv 2407.08608, Figs. 5-6: on H100,
FlashAttention-3's causal forward runs 292 TFLOP/s at 512 tokens and 602 at 8K; NVIDIA's
cudnn-frontend SDPA training benchmark, ``benchmark/sdpa_benchmark_training``: on GB200,
cuDNN's runs 408 TFLOP/s at 512 tokens and 1,584 at 8K). The FlashAttention-3 benchmark holds
the tokens per call fixed (batch × length = 16K), cudnn-frontend's the batch (1), so there
the shortest lengths also run fewer tiles.

An accelerator records them as ``attention_curves[kernel] = [forward, backward]``, fractions
of the dense BF16 peak at each of ``attention_seq_lens``; ``attention_default_kernel`` names
the kernel whose rates ``attention_forward_efficiency`` / ``attention_backward_efficiency``
record (a job that names no kernel follows its curve). Between two measured lengths a rate
is interpolated in log2(length); below the shortest and above the longest it holds the end
value.
"""

from __future__ import annotations

import bisect
import math

#: Two recorded rates count as the same measurement within this (four-decimal fractions).
SAME_FRACTION = 5e-4


def log_length_interpolation(seq_len: float, seq_lens, values) -> float:
    """``values`` (one per ascending ``seq_lens``) at ``seq_len``: linear in log2(length)
    between the two measured lengths around it, the end value outside them."""
    if seq_len <= seq_lens[0]:
        return float(values[0])
    if seq_len >= seq_lens[-1]:
        return float(values[-1])
    high = bisect.bisect_left(seq_lens, seq_len)  # seq_lens[high - 1] < seq_len <= seq_lens[high]
    low = high - 1
    share = math.log2(seq_len / seq_lens[low]) / math.log2(seq_lens[high] / seq_lens[low])
    return float(values[low] + share * (values[high] - values[low]))


def curve_at(curve, seq_len: float) -> tuple[float, float]:
    """(forward, backward) of a curve ``(lengths, forward values, backward values)`` at
    ``seq_len`` (:func:`log_length_interpolation`)."""
    lengths, forward, backward = curve
    return (
        log_length_interpolation(seq_len, lengths, forward),
        log_length_interpolation(seq_len, lengths, backward),
    )


def _fractions(values, count: int) -> bool:
    """``count`` fractions in (0, 1]."""
    return len(values) == count and all(0 < v <= 1 for v in values)


def curve_errors(
    seq_lens: list[int], curves: dict, default_kernel: str | None, points: dict
) -> list[str]:
    """What is wrong with an accelerator's curves: lengths not ascending, a curve not
    [forward, backward] with a fraction in (0, 1] per length, a default kernel without one,
    or a kernel's single recorded rate (``points``: kernel, or None for the default rates,
    → [forward, backward]) that is not one of its curve's measured pairs."""
    if not curves and default_kernel is None:
        return []
    if len(seq_lens) < 2 or seq_lens != sorted(set(seq_lens)) or seq_lens[0] < 1:
        return [f"attention_seq_lens must hold two or more ascending lengths, got {seq_lens}"]
    errors = [
        f"attention_curves.{name} must be [forward, backward], {len(seq_lens)} fractions in "
        "(0, 1] each"
        for name, curve in curves.items()
        if len(curve) != 2 or not all(_fractions(values, len(seq_lens)) for values in curve)
    ]
    if default_kernel not in curves:
        errors.append(
            f"attention_default_kernel '{default_kernel}' has no curve; choose one of: "
            f"{', '.join(curves)}"
        )
    if errors:
        return errors
    for kernel, point in points.items():
        forward, backward = curves.get(kernel or default_kernel, ([], []))
        pairs = list(zip(forward, backward, strict=True))
        if pairs and not any(
            abs(f - point[0]) <= SAME_FRACTION and abs(b - point[1]) <= SAME_FRACTION
            for f, b in pairs
        ):
            name = f"attention_kernels.{kernel}" if kernel else "the default attention rates"
            errors.append(f"{name} {point} is not a point of its attention curve")
    return errors
