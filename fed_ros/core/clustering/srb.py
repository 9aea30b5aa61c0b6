"""Spectral Rebalancing (FedDRMan Eq. 13-14) of a cluster's averaged update.

For an eligible 2-D block Delta = U diag(sigma) V^T (reduced SVD, sigma descending):

    c* = min{ i : sum_{j<=i} sigma_j / sum_j sigma_j >= beta }     (1-based in the paper)
    sigma~_i = max(sigma_i, sigma_c*)

i.e. every singular value after c* is raised to sigma_c*, so weak directions averaged
down by the cluster mean regain energy. Only the tail changes, so the rebalanced block is
Delta + U[:, c*:] diag(sigma_c* - sigma_i) V[c*:, :] (a low-cost correction in place).
Blocks that are not eligible keep their averaged update.

On a (numerically) rank-1 block, c* = 1 and every tail direction is raised to sigma_1, so
the update's norm grows by sqrt(min(m, n)) along directions that are only noise of the
average. In the fleet benchmark's low-dim policy this hits text_encoder.0 (one constant
instruction, x5.66 every round) and gripper_encoder.0 (32x2, x1.41); the other blocks grow
by 1.00-1.5x. The eq. is applied as written; see docs/benchmark.md (same-family) for the
measured effect.
"""

from __future__ import annotations

from typing import Any

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
import scipy.linalg

from fed_ros.core.params import Manifest, offsets


@dataclass(frozen=True)
class SRBInfo:
    """What SRB did to one block: threshold index (1-based c*), sigma_c*, rank, energy change."""

    c_star: int
    sigma_c: float
    rank: int
    raised: int
    norm_before: float
    norm_after: float

    def to_json(self) -> dict[str, Any]:
        """JSON-friendly dict."""
        return {
            "c_star": self.c_star,
            "sigma_c": self.sigma_c,
            "rank": self.rank,
            "raised": self.raised,
            "norm_before": self.norm_before,
            "norm_after": self.norm_after,
        }


def threshold_index(sigma: NDArray[Any], beta: float) -> int:
    """0-based index of c*: the first i whose cumulative share of sum(sigma) reaches beta."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"SRB beta must be in [0, 1], got {beta!r}")
    s = np.asarray(sigma, dtype=np.float64)
    total = s.sum()
    if s.size == 0 or total <= 0:
        return 0
    share = np.cumsum(s) / total
    # Rounding can leave the last share at 0.9999999; beta = 1 must still select the last index.
    idx = int(np.searchsorted(share, beta - 1e-12, side="left"))
    return min(idx, s.size - 1)


def rebalanced_singular_values(sigma: NDArray[Any], beta: float) -> NDArray[Any]:
    """sigma~_i = max(sigma_i, sigma_c*)."""
    s = np.asarray(sigma, dtype=np.float64)
    if s.size == 0:
        return s.copy()
    return np.maximum(s, s[threshold_index(s, beta)])


def srb_block(
    delta: NDArray[Any], beta: float, out: NDArray[Any] | None = None
) -> tuple[NDArray[Any], SRBInfo]:
    """Rebalance one 2-D update block; writes into `out` (may be `delta` itself) when given."""
    if delta.ndim != 2:
        raise ValueError(f"SRB needs a 2-D block, got shape {delta.shape}")
    d = np.asarray(delta)
    norm_before = float(np.linalg.norm(d))
    if out is None:
        out = np.array(d, dtype=np.float32, copy=True)
    elif out is not d:
        out[...] = d
    if norm_before == 0.0 or not np.isfinite(norm_before):
        return out, SRBInfo(0, 0.0, 0, 0, norm_before, norm_before)
    U, s, Vt = scipy.linalg.svd(d, full_matrices=False, lapack_driver="gesdd", check_finite=False)
    c = threshold_index(s, beta)
    tail = s[c] - s[c + 1 :]
    raised = int(np.count_nonzero(tail > 0))
    if raised:
        # Only sigma_{c*+1..R} change: add U_tail diag(sigma_c* - sigma_i) V_tail^T in place.
        out += (U[:, c + 1 :] * tail.astype(U.dtype)) @ Vt[c + 1 :]
    rank = int(np.count_nonzero(s > s[0] * max(d.shape) * np.finfo(np.float32).eps))
    return out, SRBInfo(c + 1, float(s[c]), rank, raised, norm_before, float(np.linalg.norm(out)))


def eligible_blocks(
    manifest: Manifest,
    prefixes: Sequence[str] | None = None,
    min_dim: int = 2,
    exclude: Sequence[str] = (),
) -> list[str]:
    """Names of 2-D weight matrices SRB applies to (both dims >= min_dim, optional name
    prefixes)."""
    pre = tuple(prefixes) if prefixes else None
    exc = tuple(exclude)
    out = []
    for spec in manifest:
        if len(spec.shape) != 2 or min(spec.shape) < min_dim:
            continue
        if pre is not None and not spec.name.startswith(pre):
            continue
        if exc and spec.name.startswith(exc):
            continue
        out.append(spec.name)
    return out


def apply_srb(
    delta_flat: NDArray[Any], manifest: Manifest, beta: float, blocks: Sequence[str]
) -> dict[str, SRBInfo]:
    """Rebalance the named blocks of a flat update vector in place; returns per-block info."""
    offs = offsets(manifest)
    shapes = {s.name: s.shape for s in manifest}
    info: dict[str, SRBInfo] = {}
    for name in blocks:
        a, b = offs[name]
        view = delta_flat[a:b].reshape(shapes[name])
        _, info[name] = srb_block(view, beta, out=view)
    return info
