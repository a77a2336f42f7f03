"""How much of each collective the step waits for: the overlap rule of every term
(:data:`planner.comm.terms.RULES`) as exposed seconds, given the compute each rule hides
behind — DP gradient reduce-scatters behind the backward, parameter gathers behind the
forward, pipeline sends outside the steady state (Narayanan et al. 2021, arXiv 2104.04473),
and the EP all-to-alls of paired forward and backward chunks behind each other's compute
with the SMs they take: DualPipe's F&B pairs (DeepSeek-V3, arXiv 2412.19437 §3.2) and
Megatron-Core's combined 1F1B (``overlap_moe_expert_parallel_comm``)."""

from __future__ import annotations

import numpy as np

#: SMs DeepSeek-V3's all-to-all kernels occupy while they overlap compute: "only 20 SMs are
#: sufficient to fully utilize the bandwidths of IB and NVLink" (arXiv 2412.19437 §3.2.2);
#: Megatron-Core's DeepEP dispatcher took the same by default ("historical default 20",
#: ``moe_deepep_num_sms``, NVIDIA/Megatron-LM @d98e8a6 ``transformer_config.py``).
EP_OVERLAP_COMM_SMS = 20


def ep_overlap_sm_share(compute_units: int | None) -> float:
    """Share of the GPU's SMs the overlapped EP all-to-all takes from compute (0 without SMs)."""
    return EP_OVERLAP_COMM_SMS / compute_units if compute_units else 0.0


def shared_exposure(raw, pooled, window, sm_share=0.0, paired=1.0):
    """This term's share of the pooled collectives' exposed time.

    A window (DualPipe's m·(F+B) for the EP all-to-alls) hides the collectives that share
    it together, not each term on its own, so the exposure is shared out in proportion to
    each term's raw time. While the collectives run, compute keeps only ``1 − sm_share`` of
    the SMs (:data:`EP_OVERLAP_COMM_SMS`): a step of compute C and collectives T takes
    ``max(T, C + sm_share·T)``, so the exposed time is ``max(sm_share·T, T − window)``.
    Only the chunks that run in an F&B pair overlap (``paired``, the share of them:
    :func:`planner.pipeline.closed_form.dualpipe_paired_share`); the all-to-alls of the
    chunks that run alone wait for their own compute and are exposed whole:
    ``(1 − paired)·T + paired·max(sm_share·T, T − window)``.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        overlapped = np.maximum(sm_share * pooled, pooled - window)
        exposed = (1.0 - paired) * pooled + paired * overlapped
        return np.where(pooled > 0, raw * exposed / pooled, 0.0)


def exposed_time(
    rule, raw, one, bucket, m, pp, chunks, compute, tp_overlap=False, ep_paired=0.0,
    pooled=None, sm_share=0.0,
):  # fmt: skip
    """Exposed seconds of a term under its overlap rule.

    ``raw``: count × ``one`` (one collective); ``bucket``: time of the first/last bucket;
    ``compute``: (forward, backward) seconds per micro-batch, or None (then the
    term is fully exposed); ``ep_paired``: the share of chunks whose EP all-to-alls run
    beside another micro-batch's compute (:func:`planner.comm.rows.ep_paired_share`; 0:
    none); ``pooled``: the raw seconds of every term sharing this term's window (the EP
    all-to-alls share the m·(F+B) of the paired steps), default ``raw``; ``sm_share``: the
    SMs the overlapped EP collectives take from compute (:func:`ep_overlap_sm_share`).
    Works on numpy arrays.
    """
    if compute is None:
        return raw
    forward, backward = compute
    busy = m * (forward + backward)
    if rule == "exposed":
        return np.where(tp_overlap, np.maximum(0.0, raw - busy), raw)
    if rule in ("cp_exposed", "cp_a2a", "cp_ring"):  # ring steps: the caller's
        return raw  # planner.comm.context_parallel.ring_exposed_time, behind their blocks
    if rule == "pp_steady":
        critical = 2 * np.maximum(pp * chunks - 1, 0) * one
        return np.minimum(raw, critical + np.maximum(0.0, raw - busy))
    if rule == "ep":
        pooled = raw if pooled is None else pooled
        overlapped = shared_exposure(raw, pooled, busy, sm_share, ep_paired)
        return np.where(np.asarray(ep_paired) > 0, overlapped, raw)
    window = {"dp_grad": backward, "dp_param": forward, "fsdp_gather": busy,
              "fsdp_grad": m * backward}[rule]  # fmt: skip
    return np.minimum(raw, np.maximum(bucket, raw - window))


def exposed_floor(
    rule, raw, one, bucket, m, pp, chunks, tp_overlap=False, ep_paired=0.0, sm_share=0.0
):  # fmt: skip
    """A lower bound of :func:`exposed_time` whatever the compute it hides behind (any
    forward and backward ≥ 0, any pooled window), from what a term's collectives alone
    give: a DP or FSDP term exposes at least its first or last bucket (or all of it, if
    shorter); the pipeline's sends at least the fill and drain's ``2·(pp·chunks − 1)``
    sends; overlapped EP all-to-alls at least the chunks that run alone and the SM share of
    the paired ones; a TP term that overlaps nothing all of it, one that overlaps 0; the
    rules that read no compute (CP's) all of it."""
    if rule == "exposed":
        return np.where(tp_overlap, 0.0, raw)
    if rule == "pp_steady":
        return np.minimum(raw, 2 * np.maximum(pp * chunks - 1, 0) * one)
    if rule == "ep":
        return raw * ((1.0 - ep_paired) + ep_paired * sm_share)
    if rule in ("dp_grad", "dp_param", "fsdp_gather", "fsdp_grad"):
        return np.minimum(raw, bucket)
    return raw
