"""RND federations: novelty matrix -> eps-sigma compatibility -> connected components.

Robot i evaluates every peer's RND predictor j on its own data: s_ij (its novelty matrix
row). Its self-novelty s_ii and sigma_i (std of its own residuals) must be measured on
episodes its own predictor was not trained on (`fed_ros.learning.rnd_descriptor.fit_rnd`),
so that s_ii is comparable with a peer's s_ij; on training frames an overfitted predictor
makes every peer look novel. j is compatible with i iff

    s_ij <= s_ii + eps * sigma_i.

The relation is directed; we symmetrise it with `mode="mutual"` (default: i ~ j only if
both directions hold, so one robot with a very noisy predictor cannot pull two unrelated
groups together) or `mode="either"` (i ~ j if one direction holds), then federations are
the connected components of the undirected graph: no preset count. A missing score
(a robot that could not evaluate a peer) counts as incompatible.
"""

from __future__ import annotations

from typing import Any

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

SYMMETRISE_MODES = ("mutual", "either")


def novelty_matrix(
    robot_ids: Sequence[str], scores: Mapping[str, Mapping[str, float]]
) -> NDArray[Any]:
    """(K, K) matrix N[i, j] = s_ij (row = evaluating robot i); NaN where a score is missing."""
    K = len(robot_ids)
    pos = {r: k for k, r in enumerate(robot_ids)}
    N = np.full((K, K), np.nan)
    for i, rid in enumerate(robot_ids):
        row = scores.get(rid)
        if row is None:
            raise ValueError(f"no novelty scores from robot {rid!r}")
        for peer, s in row.items():
            s = float(s)
            if not np.isfinite(s) or s < 0:
                raise ValueError(
                    f"novelty score s[{rid!r}][{peer!r}] = {s!r} must be finite and >= 0"
                )
            if peer in pos:
                N[i, pos[peer]] = s
        if np.isnan(N[i, i]):
            raise ValueError(f"robot {rid!r} did not report its self-novelty s_ii")
    return N


def compatibility(N: NDArray[Any], sigma: NDArray[Any], eps: float) -> NDArray[Any]:
    """Directed relation C[i, j] = s_ij <= s_ii + eps * sigma_i (missing scores -> False)."""
    N = np.asarray(N, dtype=np.float64)
    sigma = np.asarray(sigma, dtype=np.float64)
    if N.ndim != 2 or N.shape[0] != N.shape[1]:
        raise ValueError(f"novelty matrix must be square, got shape {N.shape}")
    if sigma.shape != (N.shape[0],):
        raise ValueError(f"sigma has shape {sigma.shape}, expected ({N.shape[0]},)")
    if not np.isfinite(sigma).all() or (sigma < 0).any():
        k = int(np.flatnonzero(~np.isfinite(sigma) | (sigma < 0))[0])
        raise ValueError(f"sigma_{k} = {sigma[k]!r} must be finite and >= 0")
    if not np.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be finite and >= 0, got {eps!r}")
    diag = np.diag(N)
    if np.isnan(diag).any():
        raise ValueError(
            f"self-novelty s_ii missing for index {int(np.flatnonzero(np.isnan(diag))[0])}"
        )
    with np.errstate(invalid="ignore"):
        C: NDArray[Any] = N <= (diag + eps * sigma)[:, None]
    C &= ~np.isnan(N)
    np.fill_diagonal(C, True)
    return C


def symmetrise(C: NDArray[Any], mode: str = "mutual") -> NDArray[Any]:
    """Undirected adjacency: C & C.T (mutual) or C | C.T (either)."""
    if mode not in SYMMETRISE_MODES:
        raise ValueError(f"symmetrise mode {mode!r} not in {SYMMETRISE_MODES}")
    C = np.asarray(C, dtype=bool)
    adjacency: NDArray[Any] = (C & C.T) if mode == "mutual" else (C | C.T)
    return adjacency


def federations(adjacency: NDArray[Any]) -> list[list[int]]:
    """Connected components of an undirected adjacency, ordered by their smallest member."""
    adj = np.asarray(adjacency, dtype=bool)
    n, labels = connected_components(csr_matrix(adj), directed=False)
    groups: dict[int, list[int]] = {}
    for i, lab in enumerate(labels):
        groups.setdefault(int(lab), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def rnd_federations(
    robot_ids: Sequence[str],
    scores: Mapping[str, Mapping[str, float]],
    sigma: Mapping[str, float],
    eps: float,
    mode: str = "mutual",
) -> tuple[list[list[str]], NDArray[Any]]:
    """Federations (lists of robot ids) and the novelty matrix, from the robots' reports."""
    N = novelty_matrix(robot_ids, scores)
    sig = np.array([float(sigma[r]) for r in robot_ids])
    groups = federations(symmetrise(compatibility(N, sig, eps), mode))
    return [[robot_ids[i] for i in g] for g in groups], N
