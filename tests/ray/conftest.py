"""Fixtures of the Ray tier (helpers in launcher_cluster.py)."""

from __future__ import annotations

from launcher_cluster import ray_env

__all__ = ["ray_env"]
