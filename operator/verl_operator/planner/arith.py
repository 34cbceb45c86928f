"""Integer helpers of the rules: nearest valid values, divisors and prime factors (fast for large inputs)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable


def nearest(value: int, ok: Callable[[int], bool], limit: int = 4096) -> list[int]:
    """The nearest integers below and above ``value`` (>= 1) that satisfy ``ok``, below first.

    A linear scan, so only for small domains (parallel sizes); batch sizes use :func:`nearest_multiple` and
    :func:`nearest_divisor`, whose cost does not grow with the value.

    Args:
        value: The rejected value.
        ok: The predicate a valid value satisfies.
        limit: How far to look each way.
    """
    found: list[int] = []
    for v in range(value - 1, max(0, value - limit), -1):
        if ok(v):
            found.append(v)
            break
    for v in range(value + 1, value + limit):
        if ok(v):
            found.append(v)
            break
    return found


def nearest_multiple(value: int, unit: int, high: int | None = None) -> list[int]:
    """The multiples of ``unit`` nearest below and above ``value`` (>= ``unit``, <= ``high``), below first."""
    unit = max(1, unit)
    found = []
    below = (value - 1) // unit * unit
    if below >= unit:
        found.append(below)
    above = (value // unit + 1) * unit
    if high is None or above <= high:
        found.append(above)
    return found


def nearest_divisor(value: int, n: int) -> list[int]:
    """The divisors of ``n`` nearest below and above ``value``, below first."""
    divs = divisors(n)
    i = bisect.bisect_left(divs, value)
    found = [divs[i - 1]] if i > 0 else []
    j = bisect.bisect_right(divs, value)
    if j < len(divs):
        found.append(divs[j])
    return found


#: Small primes divided out by trial division before Pollard's rho takes over.
_SMALL_PRIMES = tuple(p for p in range(2, 1000) if all(p % q for q in range(2, math.isqrt(p) + 1)))


#: Witnesses that make Miller-Rabin exact below 3.3e24 (Sorenson and Webster), far above any bounded input.
_WITNESSES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    for p in _SMALL_PRIMES:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in _WITNESSES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _rho(n: int) -> int:
    """A non-trivial factor of the odd composite ``n`` (Pollard's rho with Floyd's cycle finding; deterministic seeds)."""
    for c in range(1, n):
        x = y = 2
        d = 1
        while d == 1:
            x = (x * x + c) % n
            y = (y * y + c) % n
            y = (y * y + c) % n
            d = math.gcd(abs(x - y), n)
        if d != n:
            return d
    raise ArithmeticError(f"no factor found for {n}")  # pragma: no cover - unreachable for composites


def prime_factors(n: int) -> dict[int, int]:
    """The prime factorisation of ``n >= 1`` as ``{prime: exponent}``.

    Algorithm:
        Trial division by the primes below 1000, then Pollard's rho on what remains; the cost grows with the
        fourth root of the largest prime factor, not with ``n``, so a large prime costs milliseconds, not the
        ``sqrt(n)`` steps of trial division. Example: ``prime_factors(360) == {2: 3, 3: 2, 5: 1}``.
    """
    out: dict[int, int] = {}
    for p in _SMALL_PRIMES:
        if p * p > n:
            break
        while n % p == 0:
            out[p] = out.get(p, 0) + 1
            n //= p
    stack = [n] if n > 1 else []
    while stack:
        m = stack.pop()
        if _is_prime(m):
            out[m] = out.get(m, 0) + 1
        else:
            d = _rho(m)
            stack += [d, m // d]
    return dict(sorted(out.items()))


def divisors(n: int) -> list[int]:
    """All positive divisors of ``n``, ascending (none for ``n < 1``); built from :func:`prime_factors`."""
    if n < 1:
        return []
    divs = [1]
    for p, e in prime_factors(n).items():
        divs = [d * p**k for d in divs for k in range(e + 1)]
    return sorted(divs)


def or_text(values: Iterable[int]) -> str:
    return " or ".join(str(v) for v in values)
