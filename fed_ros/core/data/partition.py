"""Non-IID partitioning of a demonstration pool across robots, with diagnostics.

Implements the heterogeneity emulation of the embedding non-IID paper
(papers/embedding_noniid_*.txt): every item of a pool carries a *group* (a task or
variation label for task-based splits, a k-means cluster of penultimate-layer embeddings
for embedding-based splits); robot n draws its group mixture q_n ~ Dir(alpha * p_hat) where
p_hat are the pool's group proportions, and receives items accordingly. Small alpha gives
each robot few groups; alpha -> inf gives every robot the pool's mixture (IID).

Also: quantity skew (robot dataset sizes ~ Dir(beta)), clustered environment (feature)
skew plans (robots grouped onto simulator variations), and per-robot composition tables and
manifests. k-means and the paper's other diagnostics (Adjusted Rand Index, silhouette vs k,
stability across k-means seeds) are in :mod:`fed_ros.core.clustering.kmeans`.
numpy/scipy only (core layer: no torch).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Sequence, Any

import numpy as np
from numpy.typing import NDArray

from fed_ros.core.clustering.kmeans import KMeansResult, encode_groups, kmeans

__all__ = [
    "Partition",
    "dirichlet_proportions",
    "quantity_skew_sizes",
    "dirichlet_split",
    "task_split",
    "embedding_split",
    "quantity_skew_split",
    "environment_plan",
    "composition_table",
]


def _check_positive(name: str, value: float) -> None:
    if not (
        isinstance(value, (int, float, np.floating, np.integer))
        and math.isfinite(value)
        and value > 0
    ):
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")


def _check_count(name: str, value: int, minimum: int = 1) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class Partition:
    """Disjoint assignment of pool items to robots.

    ``indices[n]`` are pool item indices of robot n (sorted); ``groups[i]`` the group code
    of item i; ``group_names[g]`` its label; ``proportions[n]`` the drawn mixture q_n
    (rows sum to 1; for non-Dirichlet splits the realised mixture).
    """

    indices: tuple[NDArray[Any], ...]
    groups: NDArray[Any]
    group_names: tuple[str, ...]
    proportions: NDArray[Any]
    alpha: float = math.inf
    seed: int = 0
    kind: str = "task"

    @property
    def num_robots(self) -> int:
        """Number of robots (partitions)."""
        return len(self.indices)

    def counts(self) -> NDArray[Any]:
        """(robots, groups) item counts."""
        out = np.zeros((self.num_robots, len(self.group_names)), dtype=np.int64)
        for n, idx in enumerate(self.indices):
            np.add.at(out[n], self.groups[idx], 1)
        return out

    def sizes(self) -> NDArray[Any]:
        """Items per robot."""
        return np.array([len(i) for i in self.indices], dtype=np.int64)

    def robot_of(self) -> NDArray[Any]:
        """Robot index of every pool item (-1 if unassigned)."""
        out = np.full(len(self.groups), -1, dtype=np.int64)
        for n, idx in enumerate(self.indices):
            out[idx] = n
        return out

    def to_json(self) -> dict[str, Any]:
        """JSON-able description (used for per-robot manifests)."""
        return {
            "kind": self.kind,
            "alpha": None if math.isinf(self.alpha) else self.alpha,
            "seed": self.seed,
            "group_names": list(self.group_names),
            "indices": [i.tolist() for i in self.indices],
            "proportions": self.proportions.round(6).tolist(),
            "counts": self.counts().tolist(),
        }


# --------------------------------------------------------------------------- sampling


def dirichlet_proportions(
    alpha: float, prior: NDArray[Any], num_robots: int, rng: np.random.Generator
) -> NDArray[Any]:
    """Draw q_n ~ Dir(alpha * prior) for each robot; returns (num_robots, G), rows sum to 1.

    ``alpha = inf`` returns the prior itself (the IID limit). Very small concentrations
    underflow numpy's gamma sampler to all-zero rows; such rows fall back to a one-hot on
    a group drawn from the prior, which is the distribution's alpha -> 0 limit.
    """
    prior = np.asarray(prior, dtype=np.float64)
    if (
        prior.ndim != 1
        or prior.size == 0
        or np.any(prior < 0)
        or not np.isfinite(prior).all()
        or prior.sum() <= 0
    ):
        raise ValueError(
            f"prior must be a non-negative 1-D vector with positive sum, got {prior!r}"
        )
    _check_count("num_robots", num_robots)
    prior = prior / prior.sum()
    if math.isinf(alpha):
        return np.tile(prior, (num_robots, 1))
    _check_positive("alpha", alpha)
    support = prior > 0
    q = np.zeros((num_robots, prior.size))
    # Gamma draws (not rng.dirichlet) so that a zero prior entry simply never gets mass.
    draws = rng.gamma(alpha * prior[support], size=(num_robots, int(support.sum())))
    sums = draws.sum(axis=1, keepdims=True)
    for n in range(num_robots):
        if sums[n, 0] > 0 and np.isfinite(sums[n, 0]):
            q[n, support] = draws[n] / sums[n, 0]
        else:
            q[n, rng.choice(prior.size, p=prior)] = 1.0
    return q


def quantity_skew_sizes(
    total: int, num_robots: int, beta: float, seed: int = 0, min_size: int = 1
) -> NDArray[Any]:
    """Robot dataset sizes with sum ``total`` drawn as total * Dir(beta) (inf: equal sizes)."""
    _check_count("num_robots", num_robots)
    _check_count("min_size", min_size, 0)
    _check_count("total", total, num_robots * min_size)
    rng = np.random.default_rng(seed)
    if math.isinf(beta):
        share = np.full(num_robots, 1.0 / num_robots)
    else:
        _check_positive("beta", beta)
        share = dirichlet_proportions(beta, np.full(num_robots, 1.0), 1, rng)[0]
    free = total - num_robots * min_size
    sizes = _round_preserving_sum(share * free) + min_size
    return sizes.astype(np.int64)


def _round_preserving_sum(x: NDArray[Any]) -> NDArray[Any]:
    """Largest-remainder rounding: integers that sum to round(sum(x))."""
    floor: NDArray[Any] = np.floor(x).astype(np.int64)
    short = int(round(float(x.sum()))) - int(floor.sum())
    if short > 0:
        order = np.argsort(-(x - floor), kind="stable")
        floor[order[:short]] += 1
    return floor


def dirichlet_split(
    groups: Sequence[object] | NDArray[Any],
    num_robots: int,
    alpha: float,
    seed: int = 0,
    sizes: Sequence[int] | None = None,
    kind: str = "task",
) -> Partition:
    """Split pool items across robots with per-robot group mixtures q_n ~ Dir(alpha * p_hat).

    Each robot n gets ``sizes[n]`` items (default: the pool divided evenly; all items are
    assigned). Robot n's per-group quota is sizes[n] * q_n rounded (largest remainder), so
    the realised mixture follows q_n without extra multinomial noise; when a group runs
    out, the unmet part of the quota is re-spread over the groups that still have items in
    proportion to q_n (the usual way label-Dirichlet splits resolve exhaustion). Robots
    are disjoint; which items of a group a robot gets is a seeded random draw.
    """
    codes, names = encode_groups(groups)
    _check_count("num_robots", num_robots)
    n_items = len(codes)
    if num_robots > n_items:
        raise ValueError(f"num_robots={num_robots} exceeds the pool size {n_items}")
    if sizes is None:
        sizes_arr = np.full(num_robots, n_items // num_robots, dtype=np.int64)
        sizes_arr[: n_items % num_robots] += 1
    else:
        sizes_arr = np.asarray(list(sizes), dtype=np.int64)
        if sizes_arr.shape != (num_robots,) or np.any(sizes_arr < 0) or sizes_arr.sum() > n_items:
            raise ValueError(
                f"sizes must be {num_robots} non-negative counts summing to <= {n_items}, got "
                f"{list(sizes)}"
            )
    rng = np.random.default_rng(seed)
    n_groups = len(names)
    available = np.bincount(codes, minlength=n_groups)
    p_hat = available / n_items
    q = dirichlet_proportions(alpha, p_hat, num_robots, rng)
    alloc = _allocate(q, sizes_arr, available, rng)
    taken: list[list[int]] = [[] for _ in range(num_robots)]
    for g in range(n_groups):
        items = rng.permutation(np.flatnonzero(codes == g))
        start = 0
        for n in range(num_robots):
            taken[n].extend(items[start : start + alloc[n, g]].tolist())
            start += alloc[n, g]
    indices = tuple(np.sort(np.array(t, dtype=np.int64)) for t in taken)
    return Partition(
        indices=indices,
        groups=codes,
        group_names=names,
        proportions=q,
        alpha=float(alpha),
        seed=int(seed),
        kind=kind,
    )


def _allocate(
    q: NDArray[Any], sizes: NDArray[Any], available: NDArray[Any], rng: np.random.Generator
) -> NDArray[Any]:
    """(robots, groups) integer counts following q row-wise, within group availability."""
    remaining = available.astype(np.int64).copy()
    need = sizes.astype(np.int64).copy()
    alloc = np.zeros(q.shape, dtype=np.int64)
    while need.sum() > 0:
        w = q * (remaining > 0)[None, :]
        empty = w.sum(1) <= 0
        # Rows with no mass left on a non-empty group take from what remains.
        w[empty] = remaining.astype(np.float64)
        want = np.stack(
            [_round_preserving_sum(need[n] * w[n] / w[n].sum()) for n in range(len(need))]
        )
        for g in np.flatnonzero(want.sum(0) > remaining):
            # Over-subscribed group: every robot's claim shrinks by the same factor, so no
            # robot is favoured; the unmet part is re-spread in the next pass.
            want[:, g] = _round_preserving_sum(want[:, g] * remaining[g] / want[:, g].sum())
        if want.sum() == 0:
            # Rounding left nothing to take: give one item to a random needy robot.
            n = int(rng.choice(np.flatnonzero(need > 0)))
            g = int(np.argmax(w[n] * (remaining > 0) + (remaining > 0) * 1e-12))
            want[n, g] = 1
        alloc += want
        remaining -= want.sum(0)
        need -= want.sum(1)
    return alloc


def task_split(
    tasks: Sequence[str],
    num_robots: int,
    alpha: float,
    seed: int = 0,
    sizes: Sequence[int] | None = None,
) -> Partition:
    """Task/label-based Dirichlet split: groups are the items' task (or variation) labels."""
    return dirichlet_split(tasks, num_robots, alpha, seed=seed, sizes=sizes, kind="task")


def embedding_split(
    embeddings: NDArray[Any],
    num_robots: int,
    alpha: float,
    k: int = 16,
    seed: int = 0,
    sizes: Sequence[int] | None = None,
    n_init: int = 4,
) -> tuple[Partition, "KMeansResult"]:
    """Embedding-based split: k-means over (N, D) embeddings, then Dir(alpha * p_hat) over
    clusters."""
    km = kmeans(embeddings, k, seed=seed, n_init=n_init)
    part = dirichlet_split(km.labels, num_robots, alpha, seed=seed, sizes=sizes, kind="embedding")
    # Group names from encode_groups are the sorted cluster ids as strings; keep them.
    return part, km


def quantity_skew_split(
    n_items: int, num_robots: int, beta: float, seed: int = 0, min_size: int = 1
) -> Partition:
    """IID content with skewed robot dataset sizes (sizes ~ n_items * Dir(beta))."""
    sizes = quantity_skew_sizes(n_items, num_robots, beta, seed=seed, min_size=min_size)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n_items)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    indices = tuple(np.sort(perm[bounds[n] : bounds[n + 1]]) for n in range(num_robots))
    groups = np.zeros(n_items, dtype=np.int64)
    props = np.ones((num_robots, 1))
    return Partition(
        indices=indices,
        groups=groups,
        group_names=("all",),
        proportions=props,
        alpha=math.inf,
        seed=int(seed),
        kind="quantity",
    )


def environment_plan(
    num_robots: int, variations: Sequence[str], seed: int = 0, shuffle: bool = False
) -> list[str]:
    """Clustered feature skew: assign robots to simulator variations in balanced latent groups.

    Robot n gets ``variations[n % len(variations)]`` (or a seeded permutation of that when
    ``shuffle``), so the latent groups are known for ARI checks of clustering methods.
    """
    _check_count("num_robots", num_robots)
    if not variations:
        raise ValueError("variations is empty")
    if len(set(variations)) != len(variations):
        raise ValueError(f"variations contain duplicates: {list(variations)}")
    plan = [str(variations[n % len(variations)]) for n in range(num_robots)]
    if shuffle:
        plan = [plan[i] for i in np.random.default_rng(seed).permutation(num_robots)]
    return plan


def composition_table(
    partition: Partition, robot_ids: Sequence[str] | None = None, fractions: bool = False
) -> str:
    """Markdown table: one row per robot, one column per group, plus the total."""
    counts = partition.counts()
    ids = list(robot_ids) if robot_ids is not None else [f"robot_{n}" for n in range(len(counts))]
    if len(ids) != len(counts):
        raise ValueError(f"robot_ids has {len(ids)} names for {len(counts)} robots")
    head = "| robot | " + " | ".join(partition.group_names) + " | total |"
    sep = "|" + "---|" * (len(partition.group_names) + 2)
    rows = [head, sep]
    for rid, row in zip(ids, counts):
        total = int(row.sum())
        if fractions:
            cells = [f"{v / total:.2f}" if total else "-" for v in row]
        else:
            cells = [str(int(v)) for v in row]
        rows.append(f"| {rid} | " + " | ".join(cells) + f" | {total} |")
    return "\n".join(rows)


def partition_manifest(partition: Partition, robot_index: int, items: Sequence[str]) -> str:
    """JSON manifest for one robot: its items (e.g. episode file names) and group counts."""
    if not 0 <= robot_index < partition.num_robots:
        raise ValueError(f"robot_index {robot_index} out of range 0..{partition.num_robots - 1}")
    if len(items) != len(partition.groups):
        raise ValueError(f"items has {len(items)} entries for a pool of {len(partition.groups)}")
    idx = partition.indices[robot_index]
    counts = partition.counts()[robot_index]
    return json.dumps(
        {
            "robot_index": robot_index,
            "kind": partition.kind,
            "alpha": None if math.isinf(partition.alpha) else partition.alpha,
            "seed": partition.seed,
            "items": [items[i] for i in idx],
            "groups": {name: int(c) for name, c in zip(partition.group_names, counts)},
            "proportions": dict(
                zip(partition.group_names, partition.proportions[robot_index].round(6).tolist())
            ),
        },
        indent=2,
    )
