"""Byzantine-robust aggregation rules over stacked (K, P) float32 updates, usable in any cluster.

Rules: ``mean`` (weighted FedAvg), ``median`` (coordinate-wise), ``trimmed_mean``
(coordinate-wise, ``trim`` fraction cut at each end), ``clip`` (each client's offset from a
``reference`` model clipped to L2 norm ``clip_norm`` before the weighted mean, so one
client moves the result by at most w_k * clip_norm), ``multi_krum`` (Blanchard et al.:
keep the ``m`` updates with the lowest Krum scores, needs n >= 2f + 3).
Median and trimmed mean are unweighted (order statistics); the others use the weights.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from collections.abc import Callable, Sequence
from typing import Any

from fed_ros.core.strategies.aggregate import weighted_average

RULES = ("mean", "median", "trimmed_mean", "clip", "multi_krum")
# Multi-Krum's Gram matrix is summed over column blocks of this many floats, the same blocks
# on the stacked and the streamed paths (fed_ros.core.strategies.streamed.BLOCK).
KRUM_BLOCK = 1 << 15
_RULE_KWARGS = {
    "mean": set(),
    "median": set(),
    "trimmed_mean": {"trim"},
    "clip": {"clip_norm", "reference"},
    "multi_krum": {"f", "m"},
}


def check_rule_kwargs(rule: str, kw: dict[str, Any]) -> None:
    """Raise ValueError for an unknown rule or a setting the rule does not take."""
    if rule not in RULES:
        raise ValueError(f"unknown robust rule {rule!r}; choose from {RULES}")
    unknown = set(kw) - _RULE_KWARGS[rule]
    if unknown:
        raise ValueError(f"rule {rule!r} does not take {sorted(unknown)}")


def _check_inputs(
    stacked: NDArray[Any], weights: NDArray[Any]
) -> tuple[NDArray[Any], NDArray[Any]]:
    stacked = np.asarray(stacked)
    if stacked.ndim != 2 or stacked.shape[0] == 0:
        raise ValueError(f"stacked updates must be (K, P) with K >= 1, got shape {stacked.shape}")
    if stacked.dtype != np.float32:
        stacked = stacked.astype(np.float32)
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.shape[0] != stacked.shape[0]:
        raise ValueError(f"{w.shape[0]} weights for {stacked.shape[0]} updates")
    if not np.isfinite(w).all() or (w < 0).any():
        raise ValueError(f"weights must be finite and >= 0, got {w.tolist()}")
    if w.sum() <= 0:
        raise ValueError("weights sum to 0")
    if not np.isfinite(stacked).all():
        bad = int(np.argwhere(~np.isfinite(stacked).all(axis=1))[0][0])
        raise ValueError(f"update {bad} holds NaN/Inf values")
    return stacked, w / w.sum()


def coordinate_median(stacked: NDArray[Any]) -> NDArray[Any]:
    """Coordinate-wise median of the rows.

    The middle pair of an even count is averaged in float64: np.median's float32 mean of
    two finite values beyond +-1.7e38 overflowed to +-Inf.
    """
    K = stacked.shape[0]
    mid = K // 2
    if K % 2:
        median: NDArray[Any] = np.partition(stacked, mid, axis=0)[mid].astype(np.float32)
        return median
    part = np.partition(stacked, (mid - 1, mid), axis=0)
    median = ((part[mid - 1].astype(np.float64) + part[mid]) / 2.0).astype(np.float32)
    return median


def trimmed_mean(stacked: NDArray[Any], trim: float = 0.1) -> NDArray[Any]:
    """Coordinate-wise mean after dropping floor(trim*K) smallest and largest values."""
    if not 0.0 <= trim < 0.5:
        raise ValueError(f"trim must be in [0, 0.5), got {trim!r}")
    K = stacked.shape[0]
    cut = int(np.floor(trim * K))
    if cut == 0:
        mean: NDArray[Any] = stacked.mean(axis=0, dtype=np.float64).astype(np.float32)
        return mean
    srt = np.sort(stacked, axis=0)
    mean = srt[cut : K - cut].mean(axis=0, dtype=np.float64).astype(np.float32)
    return mean


def norm_clip_mean(
    stacked: NDArray[Any],
    weights: NDArray[Any],
    clip_norm: float | None = None,
    reference: NDArray[Any] | None = None,
) -> tuple[NDArray[Any], NDArray[Any]]:
    """Weighted mean of reference + clip(x_k - reference, clip_norm); returns (result, scales).

    Without `clip_norm` the median update norm is used (adaptive clipping).
    """
    ref = (
        np.zeros(stacked.shape[1], dtype=np.float32)
        if reference is None
        else np.asarray(reference, np.float32)
    )
    if ref.shape != (stacked.shape[1],):
        raise ValueError(f"reference has shape {ref.shape}, expected ({stacked.shape[1]},)")
    diffs = stacked - ref[None, :]
    norms = np.linalg.norm(diffs.astype(np.float64), axis=1)
    if clip_norm is None:
        clip_norm = float(np.median(norms))
    if not np.isfinite(clip_norm) or clip_norm < 0:
        raise ValueError(f"clip_norm must be finite and >= 0, got {clip_norm!r}")
    scales = np.minimum(1.0, clip_norm / np.maximum(norms, 1e-30))
    out = ref + weighted_average(diffs, weights * scales)
    return out.astype(np.float32), scales


def gram_by_blocks(
    read: Callable[[int, int, Any], NDArray[Any]], n: int, ranges: Sequence[tuple[int, int, Any]]
) -> NDArray[Any]:
    """(n, n) float64 Gram matrix of n rows, accumulated over column blocks.

    ``read(a, b, extra)`` returns the (n, b - a) float32 columns [a, b) of every row; the
    stacked and the streamed paths read the same blocks, so their Gram matrices are equal to
    the bit and only one (n, block) float64 copy is alive at a time.
    """
    G = np.zeros((n, n), dtype=np.float64)
    for a, b, extra in ranges:
        block = read(a, b, extra).astype(np.float64)
        G += block @ block.T
    return G


def column_ranges(P: int, block: int | None = None) -> list[tuple[int, int, None]]:
    """Column blocks [a, b) of a flat vector of P floats (``KRUM_BLOCK`` wide)."""
    block = KRUM_BLOCK if block is None else block
    return [(a, min(a + block, P), None) for a in range(0, P, block)]


def krum_scores(stacked: NDArray[Any], f: int) -> NDArray[Any]:
    """Krum score of each update: sum of squared distances to its n - f - 2 nearest others."""
    G = gram_by_blocks(
        lambda a, b, _: stacked[:, a:b], stacked.shape[0], column_ranges(stacked.shape[1])
    )
    return scores_from_gram(G, f)


def scores_from_gram(G: NDArray[Any], f: int) -> NDArray[Any]:
    """Krum scores from the Gram matrix: |x_i - x_j|^2 = G_ii + G_jj - 2 G_ij."""
    n = G.shape[0]
    sq = np.diag(G).copy()
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * G, 0.0)
    np.fill_diagonal(d2, np.inf)
    k = n - f - 2
    scores: NDArray[Any] = np.sort(d2, axis=1)[:, :k].sum(axis=1)
    return scores


def krum_choice(
    G: NDArray[Any],
    weights: NDArray[Any],
    f: int,
    m: int | None,
    bytes_of: Callable[[int], bytes],
) -> tuple[list[int], NDArray[Any]]:
    """The m lowest-score updates (sorted indices) and their renormalised weights."""
    n = G.shape[0]
    if f < 0:
        raise ValueError(f"multi_krum: f must be >= 0, got {f}")
    if n < 2 * f + 3:
        raise ValueError(f"multi_krum needs n >= 2f+3 updates: n={n}, f={f} (need >= {2 * f + 3})")
    m = n - f if m is None else int(m)
    if not 1 <= m <= n:
        raise ValueError(f"multi_krum: m must be in 1..{n}, got {m}")
    scores = scores_from_gram(G, f)
    # Ties in score are broken by the update's bytes, not its position, so the choice (and
    # the aggregate) does not depend on the order in which updates arrived (property B2).
    # Bytes are read only for tied updates: holding every update's bytes would copy K models.
    order = sorted(range(n), key=lambda i: float(scores[i]))
    i = 0
    while i < n:
        j = i
        while j + 1 < n and float(scores[order[j + 1]]) == float(scores[order[i]]):
            j += 1
        if j > i:
            order[i : j + 1] = sorted(order[i : j + 1], key=bytes_of)
        i = j + 1
    chosen = sorted(order[:m])
    w = np.asarray(weights, dtype=np.float64)[chosen]
    if w.sum() <= 0:
        w = np.ones(len(chosen))
    return chosen, w / w.sum()


def multi_krum(
    stacked: NDArray[Any], weights: NDArray[Any], f: int, m: int | None = None
) -> tuple[NDArray[Any], list[int]]:
    """Multi-Krum: weighted mean of the m lowest-score updates; refuses n < 2f + 3."""
    n = stacked.shape[0]
    if f < 0:
        raise ValueError(f"multi_krum: f must be >= 0, got {f}")
    if n < 2 * f + 3:
        raise ValueError(f"multi_krum needs n >= 2f+3 updates: n={n}, f={f} (need >= {2 * f + 3})")
    G = gram_by_blocks(lambda a, b, _: stacked[:, a:b], n, column_ranges(stacked.shape[1]))
    chosen, w = krum_choice(G, weights, f, m, lambda i: stacked[i].tobytes())
    return weighted_average(stacked[chosen], w), chosen


def aggregate_robust(
    stacked: NDArray[Any], weights: NDArray[Any], rule: str = "mean", **kw: Any
) -> NDArray[Any]:
    """Aggregate K updates with a robust rule; returns the (P,) float32 result.

    Keyword settings: trimmed_mean `trim`; clip `clip_norm`, `reference`; multi_krum `f`, `m`.
    """
    check_rule_kwargs(rule, kw)
    stacked, w = _check_inputs(stacked, weights)
    if rule == "mean":
        return weighted_average(stacked, w)
    if rule == "median":
        return coordinate_median(stacked)
    if rule == "trimmed_mean":
        return trimmed_mean(stacked, float(kw.get("trim", 0.1)))
    if rule == "clip":
        return norm_clip_mean(stacked, w, kw.get("clip_norm"), kw.get("reference"))[0]
    return multi_krum(stacked, w, int(kw.get("f", 1)), kw.get("m"))[0]
