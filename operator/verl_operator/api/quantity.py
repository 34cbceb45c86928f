"""Kubernetes resource quantities parsed exactly as the API server does, and bounded (pure).

The grammar is ``resource.Quantity``'s (k8s.io/apimachinery/pkg/api/resource)::

    <quantity>        ::= <signedNumber><suffix>
    <signedNumber>    ::= <number> | <sign><number>
    <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
    <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI>       ::= m | "" | k | M | G | T | P | E   (and n, u)
    <decimalExponent> ::= "e" <signedInteger> | "E" <signedInteger>

The value is exact (``Decimal``, never a float: ``1e400`` is not infinity and ``99999999999999999999Ei`` not a
rounded int64). The API server caps binary-SI values at 2**63-1 and rounds values below 1n up to 1n; a bounded
field here refuses such values instead, with a field error that says the range. The size of the exponent is
checked before any arithmetic, so no input can make the arithmetic slow or overflow.
"""

from __future__ import annotations

import decimal
import re
from dataclasses import dataclass
from decimal import Decimal

#: Binary-SI suffixes: powers of 2.
BINARY_SUFFIXES: dict[str, int] = {s: 10 * i for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), 1)}
#: Decimal-SI suffixes: powers of 10.
DECIMAL_SUFFIXES: dict[str, int] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
#: The API server's largest int64 (binary-SI values are capped at it).
MAX_INT64 = 2**63 - 1
#: The smallest non-zero value the API server keeps (smaller ones are rounded up to it).
NANO = Decimal("1e-9")
#: The whole quantity (sign, number, suffix); the exponent of ``e`` notation is an integer, as Go parses it.
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?:(?P<bin>[KMGTPE]i)|[eE](?P<exp>[+-]?[0-9]+)|(?P<dec>[numkMGTPE]?))$"
)
#: The longest text read (a field's schema allows 64 characters; this keeps ``int()`` of the digits cheap).
MAX_TEXT = 256
#: Decimal digits of the largest value any bound here allows (2**63 has 19); beyond, the value is "too large".
_DIGITS = 40
#: Enough precision for a 64-character number scaled by 2**60, exactly.
_CONTEXT = decimal.Context(
    prec=200, Emax=10_000, Emin=-10_000, traps=[decimal.Overflow, decimal.InvalidOperation]
)


class QuantityError(ValueError):
    """Not a Kubernetes quantity, or outside the field's range; the message reads after the field path."""


@dataclass(frozen=True)
class Bounds:
    """The range of one quantity field (``lowest`` exclusive when ``positive``), in the field's unit."""

    highest: Decimal
    unit: str
    positive: bool = True
    #: How the highest value reads in the message (``1Pi``).
    shown: str = ""


def parse_quantity(text: str) -> Decimal:
    """The exact value of the quantity ``text`` (``512Gi`` -> 549755813888, ``500m`` -> 0.5).

    Raises:
        QuantityError: ``text`` is not a quantity, or its magnitude is past 10**40 (no resource has that much)
            or, non-zero, below 1n (the API server would round it up): the value is never computed then.
    """
    match = _QUANTITY.match(text) if len(text) <= MAX_TEXT else None
    if match is None or not (match["int"] or match["frac"]):
        raise QuantityError(f"{text[:80]!r} is not a Kubernetes quantity (such as 16, 500m, 512Gi or 1e3)")
    digits = (match["int"] or "") + (match["frac"] or "")
    significant = digits.lstrip("0")
    if not significant:
        return Decimal(0)
    # value = 0.<significant> x 10**magnitude x 2**binary, first bounded by its order of magnitude.
    frac_len = len(match["frac"] or "")
    exp10 = int(match["exp"]) if match["exp"] is not None else DECIMAL_SUFFIXES.get(match["dec"] or "", 0)
    binary = BINARY_SUFFIXES[match["bin"]] if match["bin"] else 0
    magnitude = len(significant) - frac_len + exp10 + (binary * 3 + 9) // 10
    if magnitude > _DIGITS:
        raise QuantityError(f"{text[:80]} is too large")
    if magnitude < -9:
        raise QuantityError(f"{text[:80]} is below the smallest quantity, 1n")
    value = _CONTEXT.multiply(
        Decimal(int(significant)).scaleb(exp10 - frac_len, _CONTEXT), Decimal(2**binary)
    )
    return -value if match["sign"] == "-" else value


def bounded_quantity(text: str, bounds: Bounds) -> Decimal:
    """:func:`parse_quantity`, then within ``bounds``.

    Raises:
        QuantityError: not a quantity, not positive (when required), or above ``bounds.highest``.
    """
    value = parse_quantity(text)
    shown = bounds.shown or f"{bounds.highest}"
    if value < 0 or (bounds.positive and value == 0):
        raise QuantityError(f"{text[:80]} must be {'more than' if bounds.positive else 'at least'} 0")
    if value > bounds.highest:
        raise QuantityError(f"{text[:80]} is more than {shown} ({bounds.unit})")
    if value != 0 and value < NANO:
        raise QuantityError(f"{text[:80]} is below the smallest quantity, 1n")
    return value
