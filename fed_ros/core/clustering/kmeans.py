"""k-means and the cluster-validity measures of the partitioning diagnostics (numpy only).

:func:`kmeans` (Lloyd with k-means++ seeding, best of seeded restarts) groups embeddings for
:func:`fed_ros.core.data.partition.embedding_split`; :func:`adjusted_rand_index`,
:func:`silhouette_score`, :func:`silhouette_vs_k` and :func:`kmeans_stability` are the
paper's checks of how well a clustering fits and how stable it is. :func:`encode_groups`
maps arbitrary labels (task names, cluster ids) to codes 0..G-1 for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Sequence, Any, overload

import numpy as np
from numpy.typing import NDArray


def _check_count(name: str, value: int, minimum: int = 1) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def encode_groups(groups: Sequence[object] | NDArray[Any]) -> tuple[NDArray[Any], tuple[str, ...]]:
    """Map arbitrary group labels to 0..G-1 codes; returns (codes, sorted label names)."""
    raw = list(groups.tolist() if isinstance(groups, np.ndarray) else groups)
    if not raw:
        raise ValueError("groups is empty: nothing to partition")
    labels = [str(g) for g in raw]
    if all(isinstance(g, (int, np.integer)) and not isinstance(g, bool) for g in raw):
        # Cluster ids: numeric order ("2" before "10").
        names = tuple(str(v) for v in sorted(set(int(g) for g in raw)))
    else:
        names = tuple(sorted(set(labels)))
    index = {name: i for i, name in enumerate(names)}
    return np.array([index[x] for x in labels], dtype=np.int64), names


@dataclass(frozen=True)
class KMeansResult:
    """Labels (N,), centers (k, D), inertia (sum of squared distances), iterations run."""

    labels: NDArray[Any]
    centers: NDArray[Any]
    inertia: float
    n_iter: int


def _sq_dists(x: NDArray[Any], c: NDArray[Any]) -> NDArray[Any]:
    # ||x||^2 - 2 x.c + ||c||^2, clipped at 0 against round-off.
    d = (x * x).sum(1)[:, None] - 2.0 * x @ c.T + (c * c).sum(1)[None, :]
    sq_dists: NDArray[Any] = np.maximum(d, 0.0)
    return sq_dists


def _kmeans_pp(x: NDArray[Any], k: int, rng: np.random.Generator) -> NDArray[Any]:
    """k-means++ seeding (D^2 sampling)."""
    centers = np.empty((k, x.shape[1]))
    centers[0] = x[rng.integers(len(x))]
    d2 = _sq_dists(x, centers[:1])[:, 0]
    for j in range(1, k):
        total = d2.sum()
        # All remaining points coincide with a center: any pick is as good.
        idx = rng.integers(len(x)) if total <= 0 else rng.choice(len(x), p=d2 / total)
        centers[j] = x[idx]
        d2 = np.minimum(d2, _sq_dists(x, centers[j : j + 1])[:, 0])
    return centers


def kmeans(
    x: NDArray[Any], k: int, seed: int = 0, n_init: int = 4, max_iter: int = 300, tol: float = 1e-6
) -> KMeansResult:
    """Lloyd's k-means with k-means++ seeding, best of ``n_init`` restarts (seeded)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or len(x) == 0:
        raise ValueError(f"x must be a non-empty (N, D) array, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("x contains NaN/Inf")
    _check_count("k", k)
    _check_count("n_init", n_init)
    if k > len(x):
        raise ValueError(f"k={k} exceeds the number of points {len(x)}")
    rng = np.random.default_rng(seed)
    best: KMeansResult | None = None
    scale = float(np.mean(x.var(axis=0))) or 1.0
    for _ in range(n_init):
        c = _kmeans_pp(x, k, rng)
        it = 0
        for it in range(1, max_iter + 1):
            labels = _sq_dists(x, c).argmin(1)
            new = c.copy()
            for j in range(k):
                members = labels == j
                if members.any():
                    new[j] = x[members].mean(0)
                else:
                    # Empty cluster: restart it at the point farthest from its center.
                    far = _sq_dists(x, c)[np.arange(len(x)), labels].argmax()
                    new[j] = x[far]
            shift = float(((new - c) ** 2).sum())
            c = new
            if shift <= tol * scale:
                break
        d = _sq_dists(x, c)
        labels = d.argmin(1)
        inertia = float(d[np.arange(len(x)), labels].sum())
        if best is None or inertia < best.inertia:
            best = KMeansResult(
                labels=labels.astype(np.int64), centers=c, inertia=inertia, n_iter=it
            )
    assert best is not None
    return best


# --------------------------------------------------------------------------- diagnostics


@overload
def _comb2(x: NDArray[Any]) -> NDArray[Any]: ...
@overload
def _comb2(x: int) -> float: ...
def _comb2(x: NDArray[Any] | int) -> NDArray[Any] | float:
    x = np.asarray(x, dtype=np.float64)
    pairs: NDArray[Any] | float = x * (x - 1) / 2.0
    return pairs


def adjusted_rand_index(
    labels_a: Sequence[object] | NDArray[Any], labels_b: Sequence[object] | NDArray[Any]
) -> float:
    """Adjusted Rand Index (Hubert & Arabie) between two clusterings of the same items."""
    a, _ = encode_groups(labels_a)
    b, _ = encode_groups(labels_b)
    if len(a) != len(b):
        raise ValueError(f"clusterings have different lengths: {len(a)} vs {len(b)}")
    n = len(a)
    table = np.zeros((a.max() + 1, b.max() + 1), dtype=np.int64)
    np.add.at(table, (a, b), 1)
    sum_ij = float(_comb2(table).sum())
    sum_a = float(_comb2(table.sum(1)).sum())
    sum_b = float(_comb2(table.sum(0)).sum())
    total = float(_comb2(n))
    if total == 0:
        return 1.0
    expected = sum_a * sum_b / total
    max_index = 0.5 * (sum_a + sum_b)
    if max_index == expected:
        # Both clusterings trivial (all-in-one or all singletons) in the same way: identical.
        return 1.0
    return (sum_ij - expected) / (max_index - expected)


def silhouette_score(
    x: NDArray[Any], labels: Sequence[object] | NDArray[Any], chunk: int = 2048
) -> float:
    """Mean silhouette coefficient (Euclidean); singleton clusters score 0 (Rousseeuw)."""
    x = np.asarray(x, dtype=np.float64)
    lab, _ = encode_groups(labels)
    if x.ndim != 2 or len(x) != len(lab):
        raise ValueError(f"x must be (N, D) with N = {len(lab)} labels, got shape {x.shape}")
    k = int(lab.max()) + 1
    if not 2 <= k <= len(x) - 1:
        raise ValueError(f"silhouette needs 2 <= clusters <= N-1, got {k} clusters for N={len(x)}")
    counts = np.bincount(lab, minlength=k).astype(np.float64)
    onehot = np.zeros((len(x), k))
    onehot[np.arange(len(x)), lab] = 1.0
    scores = np.empty(len(x))
    for start in range(0, len(x), chunk):
        block = x[start : start + chunk]
        dist = np.sqrt(_sq_dists(block, x))  # (b, N)
        sums = dist @ onehot  # (b, k): summed distance to each cluster
        own = lab[start : start + chunk]
        rows = np.arange(len(block))
        own_n = counts[own]
        a = np.where(own_n > 1, sums[rows, own] / np.maximum(own_n - 1, 1), 0.0)
        mean_other = sums / counts[None, :]
        mean_other[rows, own] = np.inf
        b = mean_other.min(1)
        s = (b - a) / np.maximum(np.maximum(a, b), 1e-300)
        scores[start : start + chunk] = np.where(own_n > 1, s, 0.0)
    return float(scores.mean())


def silhouette_vs_k(
    x: NDArray[Any], ks: Sequence[int], seed: int = 0, n_init: int = 4
) -> dict[int, float]:
    """Silhouette score of k-means clusterings for each k (the paper's cluster validity curve)."""
    return {
        int(k): silhouette_score(x, kmeans(x, int(k), seed=seed, n_init=n_init).labels) for k in ks
    }


def kmeans_stability(
    x: NDArray[Any], k: int, seeds: Sequence[int] = (0, 1, 2), n_init: int = 1
) -> tuple[float, float]:
    """Mean and std of pairwise ARI between k-means runs with different seeds."""
    if len(seeds) < 2:
        raise ValueError(f"stability needs at least 2 seeds, got {list(seeds)}")
    runs = [kmeans(x, k, seed=int(s), n_init=n_init).labels for s in seeds]
    aris = [adjusted_rand_index(a, b) for a, b in combinations(runs, 2)]
    return float(np.mean(aris)), float(np.std(aris))
