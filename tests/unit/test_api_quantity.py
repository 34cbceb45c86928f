"""Kubernetes quantities parsed exactly (Decimal, the resource.Quantity grammar) and bounded (pure)."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from verl_operator.api.quantity import MAX_INT64, Bounds, QuantityError, bounded_quantity, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        pytest.param("16", Decimal(16), id="integer"),
        pytest.param("500m", Decimal("0.5"), id="milli"),
        pytest.param("1.5", Decimal("1.5"), id="fraction"),
        pytest.param(".5", Decimal("0.5"), id="leading-dot"),
        pytest.param("5.", Decimal(5), id="trailing-dot"),
        pytest.param("512Gi", Decimal(512 * 2**30), id="gibi"),
        pytest.param("1.5Gi", Decimal(3 * 2**29), id="fractional-gibi"),
        pytest.param("8Ei", Decimal(2**63), id="8Ei-exact-not-capped"),
        pytest.param("128G", Decimal(128 * 10**9), id="giga"),
        pytest.param("1e3", Decimal(1000), id="exponent"),
        pytest.param("1E+3", Decimal(1000), id="signed-exponent"),
        pytest.param("25e-1", Decimal("2.5"), id="negative-exponent"),
        pytest.param("1n", Decimal("1e-9"), id="nano"),
        pytest.param("0", Decimal(0), id="zero"),
        pytest.param("0e99999999999", Decimal(0), id="zero-with-a-huge-exponent"),
        pytest.param("-5Gi", Decimal(-5 * 2**30), id="negative"),
        # The API server caps this at 2**63-1; the exact value lets a bound refuse it instead.
        pytest.param("99999999999999999999Ei", Decimal(99999999999999999999 * 2**60), id="past-int64-binary"),
        pytest.param(
            "123456789012345678901234567890", Decimal("123456789012345678901234567890"), id="30-digits"
        ),
    ],
)
def test_parse_quantity_is_exact(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("1e400", "1e400 is too large", id="1e400"),
        pytest.param("1e99999999999999999999", "is too large", id="huge-exponent"),
        pytest.param("1e-400", "below the smallest quantity", id="tiny"),
        pytest.param("lots", "is not a Kubernetes quantity", id="a-word"),
        pytest.param("", "is not a Kubernetes quantity", id="empty"),
        pytest.param(".", "is not a Kubernetes quantity", id="a-dot"),
        pytest.param("1e1.5", "is not a Kubernetes quantity", id="fractional-exponent"),
        pytest.param("1Ki5", "is not a Kubernetes quantity", id="trailing-digits"),
        pytest.param("1 Gi", "is not a Kubernetes quantity", id="a-space"),
        pytest.param("1" * 300, "is not a Kubernetes quantity", id="300-characters"),
    ],
)
def test_parse_quantity_refuses(text: str, message: str) -> None:
    with pytest.raises(QuantityError, match=message):
        parse_quantity(text)


MEMORY = Bounds(Decimal(2**50), "bytes", shown="1Pi")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("1Pi", None, id="the-bound"),
        pytest.param("500m", None, id="half-a-byte"),
        pytest.param("1025Ti", "1025Ti is more than 1Pi (bytes)", id="past-the-bound"),
        pytest.param("10e399", "is too large", id="10e399"),
        pytest.param("0", "0 must be more than 0", id="zero"),
        pytest.param("-1", "must be more than 0", id="negative"),
        pytest.param("0.1n", "below the smallest quantity, 1n", id="below-1n"),
        pytest.param(str(MAX_INT64 + 1), "is more than 1Pi", id="past-int64"),
        pytest.param("99999999999999999999Ei", "is more than 1Pi", id="past-int64-binary"),
    ],
)
def test_bounded_quantity(text: str, message: str | None) -> None:
    if message is None:
        assert bounded_quantity(text, MEMORY) == parse_quantity(text)
        return
    with pytest.raises(QuantityError, match=re.escape(message)):
        bounded_quantity(text, MEMORY)
