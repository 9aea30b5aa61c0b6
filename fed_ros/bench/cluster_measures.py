"""How clustered a round's updates are, measured (the benchmark's per-round columns): cosine
similarity within and across the latent families, the hard cluster of each robot and which
robots share a cluster."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def cosine_matrix(m: np.ndarray) -> np.ndarray:
    """Pairwise cosine similarity of the rows of ``m`` (K x K)."""
    n = np.linalg.norm(m, axis=1, keepdims=True)
    u = m / np.maximum(n, 1e-12)
    return u @ u.T


def intra_inter(sim: np.ndarray, groups: Sequence[str]) -> tuple[float, float]:
    """Mean pairwise similarity within and across latent groups (distinct pairs)."""
    g = np.asarray(groups)
    same = g[:, None] == g[None, :]
    off = ~np.eye(len(g), dtype=bool)
    intra = sim[same & off]
    inter = sim[~same]
    return (
        float(intra.mean()) if intra.size else math.nan,
        float(inter.mean()) if inter.size else math.nan,
    )


def hard_clusters(
    assignments: dict[str, Sequence[Sequence[float]]], robot_ids: Sequence[str]
) -> list[int]:
    """Cluster of largest weight per robot (`primary_cluster`: what its update is for; -1
    without any)."""
    from fed_ros.learning.client import primary_cluster

    return [primary_cluster(mem) if (mem := assignments.get(rid)) else -1 for rid in robot_ids]


def coassignment(
    assignments: dict[str, Sequence[Sequence[float]]], robot_ids: Sequence[str]
) -> np.ndarray:
    """(K, K) 1 where two robots share a cluster with positive weight (soft memberships count)."""
    sets = [{int(c) for c, w in (assignments.get(r) or []) if w > 0} for r in robot_ids]
    return np.array([[1.0 if a & b else 0.0 for b in sets] for a in sets])
