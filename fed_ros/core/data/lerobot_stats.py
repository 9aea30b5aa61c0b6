"""LeRobot's feature statistics, as lerobot 0.4.4 computes them (`datasets/compute_stats.py`).

A LeRobotDataset carries per-episode statistics (``stats/<feature>/<stat>`` columns of
``meta/episodes``) and their aggregate (``meta/stats.json``). lerobot's pre-processors normalise
with them (ACT: mean/std for state, action and cameras); a dataset without them is passed through
un-normalised, silently, and lerobot's merge refuses it. Each statistic is min, max, mean, std,
count and the quantiles q01, q10, q50, q90, q99, per entry of the feature (cameras: per channel,
shape (3, 1, 1), in [0, 1]). Quantiles come from a 5,000-bin histogram between min and max, as
lerobot's ``RunningQuantileStats`` estimates them; episodes are merged by
count-weighted mean and variance (``aggregate_stats``), quantiles by count-weighted mean.

One deliberate difference: lerobot squares camera pixels in uint8 (``batch**2`` wraps at 256), so
its camera std is wrong; here pixels are squared in float64.
"""

from __future__ import annotations

from typing import Any

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
QUANTILE_KEYS = tuple(f"q{int(q * 100):02d}" for q in QUANTILES)
QUANTILE_BINS = 5000
STAT_KEYS = ("min", "max", "mean", "std", "count", *QUANTILE_KEYS)

Stats = dict[str, NDArray[Any]]


def _quantile(hist: NDArray[Any], edges: NDArray[Any], target: float) -> float:
    """One quantile from a histogram, interpolated inside its bin (lerobot's estimate)."""
    cumsum = np.cumsum(hist)
    idx = int(np.searchsorted(cumsum, target))
    if idx == 0:
        return float(edges[0])
    if idx >= len(cumsum):
        return float(edges[-1])
    before = cumsum[idx - 1]
    in_bin = cumsum[idx] - before
    if in_bin == 0:
        return float(edges[idx])
    return float(edges[idx] + (target - before) / in_bin * (edges[idx + 1] - edges[idx]))


def vector_stats(values: NDArray[Any]) -> Stats:
    """Statistics of (N,) or (N, D) values per entry; (N,) gives shape-(1,) statistics."""
    values = np.asarray(values)
    if values.ndim not in (1, 2) or len(values) == 0:
        raise ValueError(f"statistics need (N,) or (N, D) values with N > 0, got {values.shape}")
    batch = values.reshape(len(values), -1)
    count = np.array([len(values)])
    if len(batch) < 2:
        # lerobot: too few samples for a histogram, every quantile is the mean
        mean = np.mean(batch, axis=0)
        out = {"min": batch.min(0), "max": batch.max(0), "mean": mean, "std": np.std(batch, 0)}
        out.update({"count": count, **{q: mean.copy() for q in QUANTILE_KEYS}})
        return out
    lo, hi = batch.min(0), batch.max(0)
    mean = np.mean(batch, axis=0)
    # float64 squares: integer features would wrap, float32 ones lose digits
    variance = np.mean(batch.astype(np.float64) ** 2, axis=0) - mean.astype(np.float64) ** 2
    out = {
        "min": lo,
        "max": hi,
        "mean": mean,
        "std": np.sqrt(np.maximum(0.0, variance)).astype(mean.dtype),
    }
    out["count"] = count
    quantiles: list[list[float]] = [[] for _ in QUANTILES]
    for column in range(batch.shape[1]):
        edges = np.linspace(float(lo[column]) - 1e-10, float(hi[column]) + 1e-10, QUANTILE_BINS + 1)
        hist, _ = np.histogram(batch[:, column], bins=edges)
        for i, q in enumerate(QUANTILES):
            quantiles[i].append(_quantile(hist, edges, q * len(batch)))
    out.update({key: np.asarray(v) for key, v in zip(QUANTILE_KEYS, quantiles)})
    return out


def sample_indices(length: int) -> list[int]:
    """The frames lerobot samples from an episode's camera: all below 100, then ~length**0.75."""
    least = min(100, length)
    count = max(least, min(int(length**0.75), 10_000))
    indices: list[int] = np.round(np.linspace(0, length - 1, count)).astype(int).tolist()
    return indices


def image_stats(frames: NDArray[Any]) -> Stats:
    """Per-channel statistics of (N, H, W, C) uint8 frames, in [0, 1], each of shape (C, 1, 1)."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.dtype != np.uint8:
        raise ValueError(f"camera statistics need (N, H, W, C) uint8 frames, got {frames.shape}")
    sampled = frames[sample_indices(len(frames))]
    height, width = sampled.shape[1:3]
    if max(height, width) >= 300:  # lerobot downsamples large frames to about 150 px
        step = int(max(height, width) / 150)
        sampled = sampled[:, ::step, ::step]
    pixels = sampled.reshape(-1, sampled.shape[-1])
    stats = vector_stats(pixels)
    out = {k: (v / 255.0).reshape(-1, 1, 1) for k, v in stats.items() if k != "count"}
    out["count"] = np.array([len(sampled)])
    return {k: out[k] for k in STAT_KEYS}


def aggregate_stats(per_episode: Sequence[Mapping[str, Stats]]) -> dict[str, Stats]:
    """The dataset's statistics from its episodes': count-weighted mean, pooled variance."""
    if not per_episode:
        raise ValueError("no episode statistics to aggregate")
    out: dict[str, Stats] = {}
    for feature in per_episode[0]:
        parts = [s[feature] for s in per_episode]
        means = np.stack([p["mean"] for p in parts])
        counts = np.stack([p["count"] for p in parts])
        total = counts.sum(axis=0)
        weights = counts.reshape(counts.shape + (1,) * (means.ndim - counts.ndim))
        mean = (means * weights).sum(axis=0) / total
        variance = ((np.stack([p["std"] for p in parts]) ** 2 + (means - mean) ** 2) * weights).sum(
            axis=0
        ) / total
        merged = {
            "min": np.min(np.stack([p["min"] for p in parts]), axis=0),
            "max": np.max(np.stack([p["max"] for p in parts]), axis=0),
            "mean": mean,
            "std": np.sqrt(variance),
            "count": total,
        }
        for key in QUANTILE_KEYS:
            merged[key] = (np.stack([p[key] for p in parts]) * weights).sum(axis=0) / total
        out[feature] = merged
    return out


def stats_columns(per_episode: Sequence[Mapping[str, Stats]]) -> dict[str, list[Any]]:
    """``meta/episodes``' ``stats/<feature>/<stat>`` columns: one list per column, a row each."""
    columns: dict[str, list[Any]] = {}
    for stats in per_episode:
        for feature, values in stats.items():
            for key in STAT_KEYS:
                columns.setdefault(f"stats/{feature}/{key}", []).append(values[key].tolist())
    return columns


def stats_json(stats: Mapping[str, Stats]) -> dict[str, dict[str, list[Any]]]:
    """``meta/stats.json``'s content: the aggregate as nested lists."""
    return {f: {k: np.asarray(v).tolist() for k, v in s.items()} for f, s in stats.items()}
