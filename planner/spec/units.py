"""The one parser for the quantities people write with units: ``16Mi``, ``1.5e7``, ``1GiB``.

Counts (tokens, sequences, parameters) take SI prefixes (``K`` = 10^3, ``M`` = 10^6, ``G`` or
``B`` = 10^9, ``T`` = 10^12) or binary ones (``Ki`` = 2^10, ``Mi`` = 2^20, ``Gi``, ``Ti``),
plain integers (``4096``, ``16,777,216``, ``16_777_216``) and scientific notation (``1.5e7``);
the result must be a whole number. Byte sizes take the same prefixes with an optional ``B``
(``512MB`` = 512·10^6, ``1GiB`` = 2^30), as nccl-tests and the IEC do. Prefixes are
case-insensitive except ``m``/``M`` are both mega (nothing here is a milli-quantity).
"""

from __future__ import annotations

import math
import re

from hwspecs.errors import PlanError

_NUMBER = r"([0-9][0-9_,]*\.?[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?)"
_QUANTITY = re.compile(rf"^\s*{_NUMBER}\s*([KMGTPB]?)(I?)(B?)\s*$", re.IGNORECASE)
_SI = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "B": 10**9, "T": 10**12, "P": 10**15}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}

#: How the flags' help describes what they accept.
COUNT_EXAMPLES = "e.g. 4096, 8K, 16Mi (2^24), 1.5e7"
BYTES_EXAMPLES = "e.g. 4096, 512MB, 1GiB, 1e9"


def _scaled(text: str, allow_byte_suffix: bool) -> float | int | None:
    match = _QUANTITY.match(str(text))
    if not match:
        return None
    number, prefix, binary, byte = match.groups()
    prefix, binary, byte = prefix.upper(), bool(binary), bool(byte)
    if byte and not allow_byte_suffix:
        return None
    if prefix == "B" and (binary or byte or allow_byte_suffix):
        # "B" alone is a byte in sizes and a billion in counts; "BB", "Bi" mean nothing
        if not allow_byte_suffix or binary or byte:
            return None
        prefix, byte = "", True
    if binary and not prefix:
        return None
    scale = _BINARY[prefix] if binary else _SI[prefix]
    digits = number.replace("_", "").replace(",", "")
    try:
        value = int(digits) if re.fullmatch(r"[0-9]+", digits) else float(digits)
    except ValueError:
        return None
    return value * scale


def parse_count(text: str | int, field: str = "value", minimum: int = 0) -> int:
    """A whole count from ``"16Mi"``, ``"8K"``, ``"1.5e7"`` or ``"4096"``; PlanError otherwise."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        scaled = _scaled(str(text), allow_byte_suffix=False)
        if scaled is None or not math.isfinite(scaled) or scaled != int(scaled):
            raise PlanError(
                f"{field} takes a whole number ≥ {minimum} ({COUNT_EXAMPLES}); got '{text}'",
                field=field,
                allowed=f"a whole number ≥ {minimum}",
                got=str(text),
            )
        value = int(scaled)
    if value < minimum:
        raise PlanError(
            f"{field} takes a whole number ≥ {minimum} ({COUNT_EXAMPLES}); got '{text}'",
            field=field,
            allowed=f"a whole number ≥ {minimum}",
            got=str(text),
        )
    return value


def parse_bytes(text: str | float | int, field: str = "bytes") -> float:
    """Bytes from ``4096``, ``1e9``, ``512MB`` (10^6) or ``1GiB`` (2^30); PlanError otherwise."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        scaled = _scaled(str(text), allow_byte_suffix=True)
        value = float(scaled) if scaled is not None else math.nan
    if not math.isfinite(value) or value < 0:
        raise PlanError(
            f"{field} takes a size in bytes ≥ 0 with an optional unit (B, KB, MB, GB, TB or "
            f"KiB, MiB, GiB, TiB; {BYTES_EXAMPLES}); got '{text}'",
            field=field,
            allowed="a size in bytes ≥ 0, e.g. 512MB or 1GiB",
            got=str(text),
        )
    return value
