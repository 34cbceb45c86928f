"""verl-launcher: runs inside the Ray pods, starts Ray and runs verl with the operator's plan."""

from __future__ import annotations

__version__ = "0.1.0"
