"""Optimizer step cost: bytes moved and FLOPs per step, and Muon's orthogonalization.

An optimizer step is element-wise and memory-bound for AdamW, SGD with momentum, Lion and
Adafactor: one fused pass reads each parameter's gradient, its FP32 master (or the weight
itself when there is none) and its states, and writes the master, the states and the
16-bit working copy. Its time is those bytes over the achievable HBM bandwidth.

Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks";
github.com/KellerJordan/Muon ``muon.py``) keeps one momentum buffer for each 2-D hidden
matrix and replaces the update by an approximately orthogonal matrix from a quintic
Newton–Schulz iteration run in BF16 on the smaller side ``m ≤ n`` (the code transposes a
tall matrix first)::

    A = X @ X.T              # (m × n)(n × m): 2·m·m·n FLOPs
    B = b * A + c * A @ A    # (m × m)(m × m): 2·m·m·m FLOPs
    X = a * X + B @ X        # (m × m)(m × n): 2·m·m·n FLOPs

with (a, b, c) = (3.4445, −4.7750, 2.0315) and 5 iterations by default: ``4·m²·n + 2·m³``
GEMM FLOPs per iteration (the element-wise terms, ``3m² + 2mn``, are left out as in
:mod:`planner.cost.flops`). Embeddings, the LM head and the 1-D norm and bias vectors use AdamW.

Under ZeRO-1/2/3 or FSDP each rank holds a slice of every matrix's gradient and states, but
the orthogonalization needs whole matrices. Two schemes:

* ``gather`` (the "Distributed Muon" of Liu et al. 2025, "Muon is Scalable for LLM
  Training", as Moonlight trains with ZeRO-1): every rank
  all-gathers the momentum-updated gradient of every matrix, orthogonalizes all of them,
  and keeps its own slice: each GPU receives ``(dp−1)/dp`` of the matrices' bytes and runs
  every Newton–Schulz iteration of the model.
* ``owner``: each matrix is orthogonalized by one rank — its slices gathered to the owner,
  the result scattered back: ``2·(dp−1)/dp²`` of the matrices' bytes per GPU and a ``1/dp``
  share of the Newton–Schulz work (assuming the matrices balance across ranks; nanochat's
  ``DistMuon`` assigns whole matrices to ranks this way). Without
  ZeRO (whole gradients on every rank) this is Keller Jordan's distributed ``Muon``: each
  rank orthogonalizes its share and the updates are all-gathered, ``(dp−1)/dp`` of the bytes.

These bytes are reported apart so that a step-time model can show them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from hwspecs.errors import PlanError
from planner.spec.model import ModelSpec
from planner.spec.precision import DTYPE_BYTES, OPTIMIZER_STATES_PER_MATRIX_PARAM, PrecisionSpec
from planner.structure.linears import layer_kinds_count, layer_linears

OPTIMIZERS: tuple[str, ...] = ("adamw", "sgd-momentum", "lion", "adafactor", "muon", "sgd")
MuonScheme = Literal["gather", "owner"]

#: Default Newton–Schulz iterations (Keller Jordan's ``muon.py``: ``ns_steps=5``).
NEWTON_SCHULZ_ITERATIONS = 5

#: Element-wise FLOPs per parameter of one update, counted from PyTorch's single-tensor
#: implementations (a sqrt or a division counts 1):
#: AdamW: decay 1, m lerp 3, v mul + addcmul 4, denominator sqrt/div/add 3, addcdiv 3.
#: SGD-momentum: weight decay 2, buffer mul + add 2, update 2. SGD: decay 2, update 2.
#: Lion (Chen et al. 2023, Alg. 2): interpolation 3 + sign 1, decay 1, update 2, m lerp 3.
#: Adafactor (Shazeer & Stern 2018, Alg. 4, no momentum): g² + ε 2, row and column sums 2,
#: v̂ = R·C/ΣR 2, g/√v̂ 2, RMS 2 and clip 1, update 2.
#: Muon (its AdamW-free part): momentum lerp 3, Nesterov lerp 3, decay 1, update 2.
ELEMENTWISE_FLOPS_PER_PARAM: dict[str, int] = {
    "adamw": 14,
    "sgd-momentum": 6,
    "sgd": 4,
    "lion": 10,
    "adafactor": 13,
    "muon": 9,
}


def newton_schulz_flops(rows: int, cols: int, iterations: int = NEWTON_SCHULZ_ITERATIONS) -> float:
    """GEMM FLOPs to orthogonalize one ``rows × cols`` matrix: ``iterations·(4m²n + 2m³)``,
    m = min(rows, cols), n = max (see the module docstring for the three GEMMs)."""
    m, n = min(rows, cols), max(rows, cols)
    return iterations * (4.0 * m * m * n + 2.0 * m**3)


def newton_schulz_bytes(
    rows: int, cols: int, iterations: int = NEWTON_SCHULZ_ITERATIONS, element_bytes: float = 2.0
) -> float:
    """Compulsory HBM traffic of the iteration in BF16: per iteration read X, A, B, X and
    write A, B, X — ``3mn + 4m²`` elements (the normalization adds one read and write)."""
    m, n = min(rows, cols), max(rows, cols)
    return element_bytes * (iterations * (3.0 * m * n + 4.0 * m * m) + 2.0 * m * n)


def muon_matrix_shapes(model: ModelSpec) -> list[tuple[int, int, int]]:
    """(rows, cols, count) of every 2-D hidden matrix Muon updates: each linear module of
    every layer (routed experts and the router included); not the embedding or LM head."""
    shapes: dict[tuple[int, int], int] = {}
    for moe_layer, layers in layer_kinds_count(model).items():
        for linear in layer_linears(model, moe_layer):
            key = (linear.out_features, linear.in_features)
            shapes[key] = shapes.get(key, 0) + layers * linear.count
    return [(rows, cols, count) for (rows, cols), count in shapes.items()]


def update_bytes_per_param(
    precision: PrecisionSpec, state_tensors: float | None = None
) -> tuple[float, float]:
    """(read, written) bytes per parameter of one fused update.

    Read: gradient, master weight (or the weight when there is no master), states.
    Written: master (or weight), states, and the 16-bit working copy when a master exists.
    """
    states = (
        OPTIMIZER_STATES_PER_MATRIX_PARAM[precision.optimizer]
        if state_tensors is None
        else state_tensors
    )
    state_bytes = states * DTYPE_BYTES[precision.state_dtype]
    has_master = precision.master_weight_dtype != "none"
    updated = DTYPE_BYTES[precision.master_weight_dtype if has_master else precision.weight_dtype]
    read = DTYPE_BYTES[precision.gradient_dtype] + updated + state_bytes
    written = updated + state_bytes + (DTYPE_BYTES[precision.weight_dtype] if has_master else 0)
    return read, written


def muon_distribution(dp: int, zero_stage: int, scheme: MuonScheme) -> tuple[float, float]:
    """(extra bytes received per GPU per matrix byte, share of Newton–Schulz work per GPU)."""
    if scheme not in ("gather", "owner"):
        raise PlanError(f"muon scheme must be gather or owner, got '{scheme}'")
    if dp == 1:
        return 0.0, 1.0
    if zero_stage == 0:  # whole gradients everywhere: gather needs nothing
        return (0.0, 1.0) if scheme == "gather" else ((dp - 1) / dp, 1.0 / dp)
    if scheme == "gather":
        return (dp - 1) / dp, 1.0
    return 2.0 * (dp - 1) / dp**2, 1.0 / dp


class OptimizerStepCost(BaseModel):
    """One optimizer step on one GPU: what it moves, computes and communicates."""

    model_config = ConfigDict(frozen=True)

    optimizer: str
    params_per_gpu: float
    muon_params_per_gpu: float
    bytes_read: float
    bytes_written: float
    elementwise_flops: float
    newton_schulz_flops: float
    newton_schulz_bytes: float
    muon_scheme: str | None
    #: Muon under ZeRO/FSDP (or owner-computes): bytes each GPU receives, reported apart.
    extra_comm_bytes: float

    @property
    def bytes_moved(self) -> float:
        return self.bytes_read + self.bytes_written


def optimizer_step_cost(
    precision: PrecisionSpec,
    num_params: float,
    matrix_shapes: Sequence[tuple[int, int, int]] = (),
    dp: int = 1,
    zero_stage: int = 0,
    ns_iterations: int = NEWTON_SCHULZ_ITERATIONS,
    muon_scheme: MuonScheme = "gather",
    gather_element_bytes: float = 2.0,
) -> OptimizerStepCost:
    """The step of ``precision.optimizer`` over ``num_params`` on one of ``dp`` ranks.

    Under ZeRO ≥ 1 each rank updates its 1/dp slice; without, every rank updates all.
    ``matrix_shapes`` (rows, cols, count) are Muon's matrices (:func:`muon_matrix_shapes`);
    the other parameters take AdamW. ``gather_element_bytes``: the dtype the matrices travel
    in (BF16 by default, the dtype Newton–Schulz runs in).
    """
    optimizer = precision.optimizer
    if dp < 1 or ns_iterations < 1:
        raise PlanError(f"dp and ns_iterations must be ≥ 1, got {dp} and {ns_iterations}")
    share = 1.0 / dp if zero_stage >= 1 else 1.0
    matrices = math.fsum(r * c * n for r, c, n in matrix_shapes) if optimizer == "muon" else 0.0
    if matrices > num_params:
        raise PlanError(f"Muon matrices hold {matrices:,.0f} > num_params {num_params:,.0f}")
    adamw = precision.model_copy(update={"optimizer": "adamw"})
    muon_read, muon_written = update_bytes_per_param(precision)
    rest_read, rest_written = update_bytes_per_param(adamw if optimizer == "muon" else precision)
    rest = num_params - matrices
    rest_flops = ELEMENTWISE_FLOPS_PER_PARAM["adamw" if optimizer == "muon" else optimizer]
    ns_flops = ns_bytes = comm = 0.0
    scheme = None
    if optimizer == "muon":
        scheme = muon_scheme
        comm_factor, ns_share = muon_distribution(dp, zero_stage, muon_scheme)
        ns_flops = ns_share * math.fsum(
            n * newton_schulz_flops(r, c, ns_iterations) for r, c, n in matrix_shapes
        )
        ns_bytes = ns_share * math.fsum(
            n * newton_schulz_bytes(r, c, ns_iterations) for r, c, n in matrix_shapes
        )
        comm = comm_factor * matrices * gather_element_bytes
    return OptimizerStepCost(
        optimizer=optimizer,
        params_per_gpu=num_params * share,
        muon_params_per_gpu=matrices * share,
        bytes_read=share * (matrices * muon_read + rest * rest_read),
        bytes_written=share * (matrices * muon_written + rest * rest_written),
        elementwise_flops=share
        * (matrices * ELEMENTWISE_FLOPS_PER_PARAM["muon"] + rest * rest_flops),
        newton_schulz_flops=ns_flops,
        newton_schulz_bytes=ns_bytes,
        muon_scheme=scheme,
        extra_comm_bytes=comm,
    )


class OptimizerStepTime(BaseModel):
    """Seconds of one optimizer step on one GPU, by part (each exposed: the step waits)."""

    model_config = ConfigDict(frozen=True)

    elementwise_s: float
    newton_schulz_s: float
    extra_comm_s: float

    @property
    def total_s(self) -> float:
        return self.elementwise_s + self.newton_schulz_s + self.extra_comm_s


def optimizer_step_time(
    cost: OptimizerStepCost,
    hbm_bytes_per_s: float,
    matmul_flops_per_s: float,
    comm_bytes_per_s: float,
) -> OptimizerStepTime:
    """Roofline times: the element-wise update by its bytes (its few FLOPs per byte sit far
    below any GPU's ridge point), Newton–Schulz by max(FLOPs, bytes), the extra Muon
    traffic by its bytes over the achievable bus bandwidth. Rates are achievable ones
    (peak × efficiency), given by the caller."""
    return OptimizerStepTime(
        elementwise_s=cost.bytes_moved / hbm_bytes_per_s,
        newton_schulz_s=max(
            cost.newton_schulz_flops / matmul_flops_per_s,
            cost.newton_schulz_bytes / hbm_bytes_per_s,
        ),
        extra_comm_s=cost.extra_comm_bytes / comm_bytes_per_s if cost.extra_comm_bytes else 0.0,
    )
