"""Compatible Update Aggregation (FedDRMan Eq. 10-12): partition K clients into exactly C groups.

Objective of a partition {G_s} of the cosine-similarity matrix S:

    J = (1/C) sum_s mean_intra(G_s) - binom(C,2)^-1 sum_{s<s'} mean_inter(G_s, G_s')

with means over distinct pairs i != j. A singleton group has no distinct pair; its intra
mean is defined as `singleton_intra`, default 0.0 (the cosine of orthogonal updates: a
robot alone has no partner to agree with, so it earns no intra credit). With 1.0 (= S_ii)
every isolated robot would score as a perfectly coherent cluster and CUA would split off
mildly noisy robots instead of the real groups; 1.0 stays available as a setting. For
C = 1 the inter term is empty (0).

Solvers: `cua_exact` enumerates every partition into exactly C non-empty groups
(restricted-growth strings, Stirling number S(K, C) of them) and scores them in vectorised
batches; `cua_scalable` starts from average-linkage and spectral partitions (plus random
restarts) and applies best-improvement single-client moves, each scored for all K x C
candidates at once from the (C, C) block sums with a rank-2 incremental update.
"""

from __future__ import annotations

from typing import Any

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.cluster.vq import kmeans2
from scipy.sparse.linalg import eigsh
from scipy.spatial.distance import squareform

# Above this many robots the spectral start finds its C eigenvectors by Lanczos (`eigsh`) instead
# of a full eigendecomposition; below it the full one is as fast and needs no iteration.
LANCZOS_MIN_K = 64


@dataclass
class CUAResult:
    """Chosen partition: labels[k] in 0..C-1, its objective, and which solver produced it."""

    labels: NDArray[Any]
    objective: float
    method: str

    def groups(self) -> list[list[int]]:
        """Member indices of each group, groups ordered by their smallest member."""
        C = int(self.labels.max()) + 1 if self.labels.size else 0
        gs = [np.flatnonzero(self.labels == s).tolist() for s in range(C)]
        return sorted((g for g in gs if g), key=lambda g: g[0])


def stirling2(n: int, k: int) -> int:
    """Stirling number of the second kind: partitions of n items into exactly k non-empty blocks."""
    if n < 0 or k < 0:
        raise ValueError(f"stirling2 needs n, k >= 0, got {n}, {k}")
    row = [1] + [0] * k  # S(0, j)
    for i in range(1, n + 1):
        new = [0] * (k + 1)
        for j in range(1, min(i, k) + 1):
            new[j] = j * row[j] + row[j - 1]
        row = new
    return row[k]


def _check_similarity(S: NDArray[Any], C: int) -> NDArray[Any]:
    S = np.asarray(S, dtype=np.float64)
    if S.ndim != 2 or S.shape[0] != S.shape[1]:
        raise ValueError(f"similarity matrix must be square, got shape {S.shape}")
    if not np.isfinite(S).all():
        raise ValueError("similarity matrix holds NaN/Inf")
    K = S.shape[0]
    if not isinstance(C, (int, np.integer)) or C < 1:
        raise ValueError(f"num_clusters C must be an int >= 1, got {C!r}")
    if K < C:
        raise ValueError(f"cannot split K={K} clients into C={C} non-empty groups (K < C)")
    S = 0.5 * (S + S.T)
    return S


_TRIU: dict[int, tuple[NDArray[Any], NDArray[Any]]] = {}


def _triu(C: int) -> tuple[NDArray[Any], NDArray[Any]]:
    if C not in _TRIU:
        _TRIU[C] = np.triu_indices(C, 1)
    return _TRIU[C]


def _objective_from_blocks(
    A: NDArray[Any], n: NDArray[Any], singleton_intra: float
) -> NDArray[Any]:
    """J for a batch: A (B, C, C) ordered-pair sums of S with zero diagonal, n (B, C) group
    sizes."""
    C = A.shape[-1]
    diag = np.diagonal(A, axis1=-2, axis2=-1)
    pairs = n * (n - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        intra = np.where(n >= 2, diag / np.where(pairs > 0, pairs, 1), singleton_intra)
    score: NDArray[Any] = intra.mean(axis=-1)
    if C >= 2:
        iu = _triu(C)
        denom = (n[..., :, None] * n[..., None, :])[..., iu[0], iu[1]]
        inter = A[..., iu[0], iu[1]] / np.where(denom > 0, denom, 1)
        inter = np.where(denom > 0, inter, 0.0)
        score = score - inter.sum(axis=-1) / math.comb(C, 2)
    return score


def _blocks(S0: NDArray[Any], labels: NDArray[Any], C: int) -> tuple[NDArray[Any], NDArray[Any]]:
    """Block sums A (.., C, C) and sizes n (.., C) for labels (.., K)."""
    Z = (labels[..., :, None] == np.arange(C)).astype(np.float64)
    A = np.swapaxes(Z, -1, -2) @ (S0 @ Z)
    return A, Z.sum(axis=-2)


def cua_objective(
    S: NDArray[Any], labels: NDArray[Any], C: int | None = None, singleton_intra: float = 0.0
) -> float:
    """Objective J of one partition given as labels (K,) with values 0..C-1 (all groups
    non-empty)."""
    labels = np.asarray(labels, dtype=np.int64)
    C = int(labels.max()) + 1 if C is None else int(C)
    S = _check_similarity(S, C)
    if labels.shape != (S.shape[0],) or labels.min() < 0 or labels.max() >= C:
        raise ValueError(
            f"labels must be (K,)={S.shape[0]} values in 0..{C - 1}, got {labels.tolist()}"
        )
    counts = np.bincount(labels, minlength=C)
    if (counts == 0).any():
        raise ValueError(f"group {int(np.flatnonzero(counts == 0)[0])} of the partition is empty")
    S0 = S.copy()
    np.fill_diagonal(S0, 0.0)
    A, n = _blocks(S0, labels, C)
    return float(_objective_from_blocks(A[None], n[None], singleton_intra)[0])


def enumerate_partitions(K: int, C: int) -> NDArray[Any]:
    """All partitions of K items into exactly C non-empty groups as canonical labels (S(K,C), K)
    int8."""
    if K < C or C < 1:
        raise ValueError(f"cannot enumerate partitions of K={K} into C={C} groups")
    # Restricted growth strings: label_0 = 0, label_i <= max(label_<i) + 1, built level by level.
    lab = np.zeros((1, 1), dtype=np.int8)
    mx = np.zeros(1, dtype=np.int8)
    for i in range(1, K):
        remaining = K - i - 1  # positions after this one
        children_l, children_m, parents = [], [], []
        for v in range(C):
            # v may be any used label (<= mx) or the next new label (mx + 1).
            ok = v <= mx + 1
            new_mx = np.maximum(mx, v)
            ok &= (C - 1 - new_mx) <= remaining  # enough positions left to open the missing groups
            idx = np.flatnonzero(ok)
            parents.append(idx)
            children_l.append(np.full(idx.size, v, dtype=np.int8))
            children_m.append(new_mx[idx].astype(np.int8))
        parents_a = np.concatenate(parents)
        lab = np.concatenate([lab[parents_a], np.concatenate(children_l)[:, None]], axis=1)
        mx = np.concatenate(children_m)
    if K == 1:
        return lab if C == 1 else np.zeros((0, 1), dtype=np.int8)
    partitions: NDArray[Any] = lab[mx == C - 1]
    return partitions


def cua_exact(
    S: NDArray[Any],
    C: int,
    singleton_intra: float = 0.0,
    max_partitions: int = 3_000_000,
    batch: int = 50_000,
) -> CUAResult:
    """Best partition by exhaustive enumeration (refuses more than `max_partitions` candidates)."""
    S = _check_similarity(S, C)
    K = S.shape[0]
    count = stirling2(K, C)
    if count > max_partitions:
        raise ValueError(
            f"exact CUA over S({K},{C}) = {count} partitions exceeds "
            f"max_partitions={max_partitions}"
        )
    parts = enumerate_partitions(K, C)
    S0 = S.copy()
    np.fill_diagonal(S0, 0.0)
    best_val, best_lab = -np.inf, None
    for a in range(0, parts.shape[0], batch):
        lab = parts[a : a + batch].astype(np.int64)
        A, n = _blocks(S0, lab, C)
        vals = _objective_from_blocks(A, n, singleton_intra)
        j = int(np.argmax(vals))
        # Strict > keeps the first optimum in enumeration order (colexicographic: the last
        # client's label varies slowest): deterministic ties.
        if vals[j] > best_val + 1e-12:
            best_val, best_lab = float(vals[j]), lab[j].copy()
    return CUAResult(best_lab, best_val, "exact")


def _repair(labels: NDArray[Any], S0: NDArray[Any], C: int) -> NDArray[Any]:
    """Make all C groups non-empty by moving the least-attached members of large groups."""
    labels = labels.copy()
    for s in range(C):
        if (labels == s).any():
            continue
        counts = np.bincount(labels, minlength=C)
        big = np.flatnonzero(counts >= 2)
        cand = np.flatnonzero(np.isin(labels, big))
        # Attachment of each candidate to its own group (mean similarity to the other members).
        att = np.array(
            [S0[i, labels == labels[i]].sum() / max(counts[labels[i]] - 1, 1) for i in cand]
        )
        labels[cand[int(np.argmin(att))]] = s
    return labels


def _local_search(
    S0: NDArray[Any], labels: NDArray[Any], C: int, singleton_intra: float, max_moves: int
) -> tuple[NDArray[Any], float]:
    """Best-improvement single-client moves; each step scores all K x C moves from block sums."""
    labels = labels.astype(np.int64).copy()
    Z = (labels[:, None] == np.arange(C)).astype(np.float64)
    R = S0 @ Z  # R[i, c] = sum_{j in c} S_ij (S_ii = 0)
    A = Z.T @ R  # (C, C) block sums
    n = Z.sum(axis=0)
    cur = float(_objective_from_blocks(A[None], n[None], singleton_intra)[0])
    eye = np.eye(C)
    for _ in range(max_moves):
        es = eye[labels]  # (K, C) one-hot of current group
        d = eye[None, :, :] - es[:, None, :]  # (K, T, C): +1 at target t, -1 at s
        # Moving i from s to t: A' = A + d r^T + r d^T (rank-2), n' = n + d; all K x C moves at
        # once.
        Ri = R[:, None, :]
        A_new = A + d[..., :, None] * Ri[..., None, :] + Ri[..., :, None] * d[..., None, :]
        vals = _objective_from_blocks(A_new, n + d, singleton_intra)  # (K, T)
        valid = (labels[:, None] != np.arange(C)[None, :]) & (n[labels] > 1)[
            :, None
        ]  # never empty a group
        vals = np.where(valid, vals, -np.inf)
        flat = int(np.argmax(vals))
        i, t = divmod(flat, C)
        val = float(vals[i, t])
        if not val - cur > 1e-12:
            break
        s = labels[i]
        r = R[i].copy()
        d = eye[t] - eye[s]
        A = A + np.outer(d, r) + np.outer(r, d)
        n = n + d
        R[:, s] -= S0[:, i]
        R[:, t] += S0[:, i]
        labels[i] = t
        cur = float(val)
    return labels, cur


def _batch_refine(S0: NDArray[Any], labels: NDArray[Any], C: int, iters: int = 20) -> NDArray[Any]:
    """k-means-like passes: every client to the group it is most similar to on average."""
    labels = labels.copy()
    for _ in range(iters):
        Z = (labels[:, None] == np.arange(C)).astype(np.float64)
        R = S0 @ Z
        n = Z.sum(axis=0)[None, :] - Z  # group size excluding the client itself
        mean = np.where(n > 0, R / np.maximum(n, 1), -np.inf)
        new = _repair(np.argmax(mean, axis=1).astype(np.int64), S0, C)
        if np.array_equal(new, labels):
            break
        labels = new
    return labels


def _peel_start(S0: NDArray[Any], C: int, singleton_intra: float) -> NDArray[Any]:
    """Greedy start: one big group, then C-1 times split off the client that best improves J.

    Each split scores all K candidates at once with the rank-2 block-sum update.
    """
    K = S0.shape[0]
    labels = np.zeros(K, dtype=np.int64)
    for s in range(1, C):
        G = s + 1
        eye = np.eye(G)
        Z = (labels[:, None] == np.arange(G)).astype(np.float64)
        R = S0 @ Z
        A = Z.T @ R
        n = Z.sum(axis=0)
        d = eye[s][None, :] - eye[labels]  # move i from its group to new group s
        A_new = A[None] + d[:, :, None] * R[:, None, :] + R[:, :, None] * d[:, None, :]
        vals = _objective_from_blocks(A_new, n[None] + d, singleton_intra)
        vals = np.where(n[labels] > 1, vals, -np.inf)
        labels[int(np.argmax(vals))] = s
    return labels


def _spectral_start(S: NDArray[Any], C: int, seed: int) -> NDArray[Any]:
    """Labels from k-means on the top-C eigenvectors of the normalised affinity (S+1)/2."""
    W = (S + 1.0) / 2.0
    np.fill_diagonal(W, 0.0)
    deg = W.sum(axis=1)
    dinv = 1.0 / np.sqrt(np.maximum(deg, 1e-12))
    L = dinv[:, None] * W * dinv[None, :]
    K = L.shape[0]
    if K > LANCZOS_MIN_K:
        # Only the top C eigenvectors are used: Lanczos finds them in a few K^2 products (0.15 s
        # of a full eigh at K = 1000 became ~0.01 s); the start vector is fixed, so it is
        # deterministic.
        _, X = eigsh(L, k=C, which="LA", v0=np.full(K, 1.0 / np.sqrt(K)), tol=0.0)
    else:
        vals, vecs = np.linalg.eigh(L)
        X = vecs[:, -C:]
    X = X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)
    _, lab = kmeans2(X, C, seed=seed, minit="++")
    labels: NDArray[Any] = lab.astype(np.int64)
    return labels


def _agglomerative_start(S: NDArray[Any], C: int) -> NDArray[Any]:
    """Average-linkage clustering on the cosine distance 1 - S, cut into C groups."""
    D = np.clip(1.0 - S, 0.0, 2.0)
    np.fill_diagonal(D, 0.0)
    Z = linkage(squareform(D, checks=False), method="average")
    labels: NDArray[Any] = (fcluster(Z, t=C, criterion="maxclust") - 1).astype(np.int64)
    return labels


def cua_scalable(
    S: NDArray[Any],
    C: int,
    singleton_intra: float = 0.0,
    seed: int = 0,
    restarts: int = 3,
    max_moves: int | None = None,
) -> CUAResult:
    """Heuristic CUA for large K: agglomerative + spectral + random starts, then local moves."""
    S = _check_similarity(S, C)
    K = S.shape[0]
    S0 = S.copy()
    np.fill_diagonal(S0, 0.0)
    if C == 1:
        lab = np.zeros(K, dtype=np.int64)
        return CUAResult(lab, cua_objective(S, lab, 1, singleton_intra), "scalable")
    rng = np.random.default_rng(seed)
    starts = [_agglomerative_start(S, C), _peel_start(S0, C, singleton_intra)]
    try:
        starts.append(_spectral_start(S, C, seed))
    except (np.linalg.LinAlgError, ValueError):
        pass
    # Small instances are cheap: many random restarts close the gap to the exact optimum.
    n_random = min(restarts, 1) if K > 256 else (restarts if K > 64 else max(restarts, 40))
    randoms = [
        _batch_refine(S0, _repair(rng.integers(0, C, size=K), S0, C), C) for _ in range(n_random)
    ]
    starts += randoms
    max_moves = max_moves if max_moves is not None else 4 * K + 50
    best_val, best_lab = -np.inf, None
    for lab in starts:
        lab = _repair(np.asarray(lab, dtype=np.int64) % C, S0, C)
        lab, val = _local_search(S0, lab, C, singleton_intra, max_moves)
        if val > best_val + 1e-12:
            best_val, best_lab = val, lab
    # Iterated local search: kick a few clients of the incumbent and re-optimise.
    kicks = 60 if K <= 64 else 2
    for _ in range(kicks):
        lab = best_lab.copy()
        m = int(rng.integers(1, max(2, K // 4) + 1)) if K <= 64 else max(1, K // 10)
        idx = rng.choice(K, size=m, replace=False)
        lab[idx] = rng.integers(0, C, size=m)
        lab, val = _local_search(S0, _repair(lab, S0, C), C, singleton_intra, max_moves)
        if val > best_val + 1e-12:
            best_val, best_lab = val, lab
    return CUAResult(_canonical(best_lab), best_val, "scalable")


def _canonical(labels: NDArray[Any]) -> NDArray[Any]:
    """Relabel groups in order of first appearance (restricted growth form)."""
    mapping: dict[int, int] = {}
    out = np.empty_like(labels)
    for i, v in enumerate(labels.tolist()):
        if v not in mapping:
            mapping[v] = len(mapping)
        out[i] = mapping[v]
    return out


def cua_partition(
    S: NDArray[Any],
    C: int,
    method: str = "auto",
    singleton_intra: float = 0.0,
    seed: int = 0,
    exact_max_k: int = 12,
    exact_max_partitions: int = 3_000_000,
) -> CUAResult:
    """Partition by `method` in {auto, exact, scalable}; auto = exact when K <= exact_max_k and
    feasible."""
    if method not in ("auto", "exact", "scalable"):
        raise ValueError(f"CUA method {method!r} not in ('auto', 'exact', 'scalable')")
    S = _check_similarity(S, C)
    K = S.shape[0]
    if method == "exact" or (
        method == "auto" and K <= exact_max_k and stirling2(K, C) <= exact_max_partitions
    ):
        return cua_exact(S, C, singleton_intra, max_partitions=exact_max_partitions)
    return cua_scalable(S, C, singleton_intra, seed=seed)
