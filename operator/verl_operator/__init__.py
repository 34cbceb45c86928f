"""verl-operator: topology-aware Kubernetes operator for verl jobs."""

from __future__ import annotations

__version__ = "0.1.0"
