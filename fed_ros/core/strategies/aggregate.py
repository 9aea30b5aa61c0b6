"""Stateless aggregation arithmetic over stacked (K, P) float32 updates.

Everything here works on flat vectors: a cluster average is one row of `W @ stacked`
where W (C, K) holds each cluster's normalised sample weights, so all clusters are
averaged in a single BLAS pass over the updates (the read-pass bound).
"""

from __future__ import annotations

from typing import Any

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from fed_ros.core.params import (
    Manifest,
    StateDict,
    check_manifest,
    manifest_of,
    stack_state_dicts,
    unflatten,
)


def sample_weights(
    num_samples: Sequence[float] | NDArray[Any], names: Sequence[str] | None = None
) -> NDArray[Any]:
    """n_k / sum n_j as float64; raises ValueError for negative, non-finite or all-zero counts."""
    n = np.asarray(list(num_samples), dtype=np.float64)
    if n.ndim != 1 or n.size == 0:
        raise ValueError("sample_weights: need at least one sample count")
    bad = np.flatnonzero(~np.isfinite(n) | (n < 0))
    if bad.size:
        k = int(bad[0])
        who = names[k] if names is not None else f"index {k}"
        raise ValueError(f"num_samples of {who} is {n[k]!r}; must be a finite count >= 0")
    total = n.sum()
    if total <= 0:
        raise ValueError(f"num_samples sum to {total!r}; at least one client needs samples > 0")
    weights: NDArray[Any] = n / total
    return weights


def membership_matrix(
    groups: Sequence[Sequence[int]], num_samples: Sequence[float], K: int
) -> NDArray[Any]:
    """(C, K) float32 matrix whose row s holds n_k / sum_{j in G_s} n_j on G_s's members."""
    n = np.asarray(list(num_samples), dtype=np.float64)
    if n.shape != (K,):
        raise ValueError(f"membership_matrix: {n.shape[0]} sample counts for K={K}")
    W = np.zeros((len(groups), K), dtype=np.float64)
    for s, g in enumerate(groups):
        g = list(g)
        if not g:
            raise ValueError(f"cluster {s} is empty")
        if any(i < 0 or i >= K for i in g):
            raise ValueError(f"cluster {s} has member index out of range 0..{K - 1}: {g}")
        W[s, g] = sample_weights(n[g], [f"member {i}" for i in g])
    return W.astype(np.float32)


def weighted_rows(
    stacked: NDArray[Any], W: NDArray[Any], out: NDArray[Any] | None = None
) -> NDArray[Any]:
    """W (C, K) @ stacked (K, P) -> (C, P) float32, into `out` if given.

    Row g adds W[g, k] * stacked[k] over the k with W[g, k] != 0 one after another, in float32
    and in row order. A BLAS GEMM was faster in one call, but its sum order depends on the
    kernel's blocking, on the column count and on the threads, so no other code could
    reproduce its bits; this order is the one the streamed path
    (`fed_ros.core.strategies.streamed.weighted_sums`) follows while reading each update in
    place, so both give the same bits. Column blocks keep the partial sums in cache.
    """
    if stacked.ndim != 2 or stacked.dtype != np.float32:
        raise ValueError(f"stacked must be (K, P) float32, got {stacked.shape} {stacked.dtype}")
    W = np.ascontiguousarray(W, dtype=np.float32)
    if W.ndim == 1:
        W = W[None, :]
    if W.shape[1] != stacked.shape[0]:
        raise ValueError(f"weights for {W.shape[1]} clients but {stacked.shape[0]} stacked updates")
    shape = (W.shape[0], stacked.shape[1])
    if out is not None and (
        out.shape != shape
        or out.dtype != np.float32
        or not out.flags.c_contiguous
        or not out.flags.writeable
    ):
        raise ValueError(
            f"out must be a writeable C-contiguous {shape} float32 array, got {out.shape} "
            f"{out.dtype}"
        )
    if out is None:
        out = np.empty(shape, dtype=np.float32)  # owns its memory (callers may recycle it)
    P = shape[1]
    tmp = np.empty(min(P, _ROW_BLOCK), dtype=np.float32)
    for g in range(W.shape[0]):
        ks = np.flatnonzero(W[g]).tolist()
        for a in range(0, P, _ROW_BLOCK):
            b = min(a + _ROW_BLOCK, P)
            acc = out[g, a:b]
            if not ks:
                acc[...] = 0.0
                continue
            np.multiply(stacked[ks[0], a:b], W[g, ks[0]], out=acc)
            part = tmp[: b - a]
            for k in ks[1:]:
                np.multiply(stacked[k, a:b], W[g, k], out=part)
                acc += part
    return out


_ROW_BLOCK = 1 << 18  # floats of partial sums kept in cache while every row is added


def weighted_average(stacked: NDArray[Any], weights: NDArray[Any]) -> NDArray[Any]:
    """sum_k w_k x_k over the rows of a (K, P) float32 array (weights must sum to 1)."""
    average: NDArray[Any] = weighted_rows(stacked, np.asarray(weights, dtype=np.float32)[None, :])[
        0
    ]
    return average


def all_finite(arr: NDArray[Any]) -> bool:
    """True iff no NaN/Inf, via one BLAS dot pass (NaN/Inf propagate through x.x) with an
    exact chunked re-check only when that overflows (|x| ~ 1e19, never for real models)."""
    flat = arr.reshape(-1) if arr.flags.c_contiguous else None
    with np.errstate(over="ignore", invalid="ignore"):
        if flat is not None and flat.dtype == np.float32:
            # sdot streams the array once, ~3x faster than np.sum's pairwise reduction.
            if np.isfinite(np.dot(flat, flat)):
                return True
        elif np.isfinite(np.sum(arr, dtype=np.float32)):
            return True
    flat = arr.reshape(-1)
    return all(np.isfinite(flat[a : a + (1 << 20)]).all() for a in range(0, flat.size, 1 << 20))


def first_nonfinite_row(stacked: NDArray[Any], chunk: int = 1 << 20) -> int:
    """Index of the first row holding NaN/Inf (-1 if none), scanning in chunks to bound memory."""
    for k in range(stacked.shape[0]):
        row = stacked[k]
        for a in range(0, row.shape[0], chunk):
            if not np.isfinite(row[a : a + chunk]).all():
                return k
    return -1


def fedavg(
    state_dicts: Sequence[Mapping[str, NDArray[Any]]],
    num_samples: Sequence[float],
    manifest: Manifest | None = None,
) -> StateDict:
    """FedAvg of state dicts weighted by sample counts (n_k / sum n_j).

    Non-finite inputs raise ValueError naming the update's index; the check is fused with
    the average (a NaN/Inf in any input makes the float32 result non-finite, since weights
    are finite) so the honest path reads the updates once.
    """
    if not state_dicts:
        raise ValueError("fedavg: no updates")
    manifest = manifest or manifest_of(state_dicts[0])
    for k, sd in enumerate(state_dicts):
        try:
            check_manifest(sd, manifest)
        except ValueError as exc:
            raise ValueError(f"update {k}: {exc}") from None
    w = sample_weights(num_samples)
    if len(w) != len(state_dicts):
        raise ValueError(f"fedavg: {len(w)} sample counts for {len(state_dicts)} updates")
    stacked = stack_state_dicts(state_dicts, manifest)
    out = weighted_average(stacked, w)
    if not all_finite(out):
        bad = first_nonfinite_row(stacked)
        raise ValueError(
            f"update {bad} holds NaN/Inf values" if bad >= 0 else "fedavg overflowed to Inf"
        )
    return unflatten(out, manifest)


def gram_to_cosine(G: NDArray[Any]) -> NDArray[Any]:
    """Cosine matrix from a Gram matrix; zero vectors get S_ij = 0 off the diagonal, S_ii = 1."""
    norms = np.sqrt(np.maximum(np.diag(G), 0.0))
    safe = np.where(norms > 0, norms, 1.0)
    S = G / safe[:, None] / safe[None, :]
    S[norms == 0, :] = 0.0
    S[:, norms == 0] = 0.0
    np.fill_diagonal(S, 1.0)
    cosine: NDArray[Any] = np.clip(S, -1.0, 1.0)
    return cosine


def cosine_similarity_matrix(V: NDArray[Any]) -> NDArray[Any]:
    """S_ij = v_i.v_j / (|v_i||v_j|) as float64; zero vectors get S_ij = 0 off the diagonal,
    S_ii = 1."""
    V = np.asarray(V)
    if V.ndim != 2:
        raise ValueError(f"cosine_similarity_matrix expects (K, D), got shape {V.shape}")
    V64 = V.astype(np.float64, copy=False)
    G = V64 @ V64.T
    return gram_to_cosine(G)


def similarity_chunk(K: int, chunk: int = 1 << 16) -> int:
    """Columns per block of `update_similarity`: a (K, chunk) float32 block stays <= 2 MB."""
    return max(1024, min(chunk, (1 << 19) // max(K, 1)))


def update_similarity(
    stacked: NDArray[Any], columns: NDArray[Any] | slice, origin: NDArray[Any], chunk: int = 1 << 16
) -> NDArray[Any]:
    """Cosine similarity of v_k = stacked[k, columns] - origin[columns] without materialising V.

    Each column chunk is centred in float32 (subtracting before the product avoids the
    cancellation of expanding |x - o|^2), multiplied with one sgemm and accumulated into a
    float64 (K, K) Gram matrix, so the extra memory is K x chunk floats instead of a
    K x |Omega| copy.
    """
    K = stacked.shape[0]
    chunk = similarity_chunk(K, chunk)
    cols = (
        np.arange(stacked.shape[1])[columns] if isinstance(columns, slice) else np.asarray(columns)
    )
    G = np.zeros((K, K), dtype=np.float64)
    for a in range(0, cols.size, chunk):
        idx = cols[a : a + chunk]
        if idx.size and idx[-1] - idx[0] == idx.size - 1:
            block = (
                stacked[:, idx[0] : idx[-1] + 1] - origin[idx[0] : idx[-1] + 1]
            )  # contiguous run
        else:
            block = stacked[:, idx] - origin[idx]
        G += block @ block.T
    if not np.isfinite(G).all():
        bad = (
            int(np.flatnonzero(~np.isfinite(np.diag(G)))[0])
            if not np.isfinite(np.diag(G)).all()
            else -1
        )
        raise ValueError(
            f"update {bad} holds NaN/Inf values" if bad >= 0 else "update similarity overflowed"
        )
    return gram_to_cosine(G)


def kl_diag_gaussian(
    mu_p: NDArray[Any], var_p: NDArray[Any], mu_q: NDArray[Any], var_q: NDArray[Any]
) -> float:
    """KL(N(mu_p, diag var_p) || N(mu_q, diag var_q))."""
    mu_p, var_p, mu_q, var_q = (np.asarray(a, dtype=np.float64) for a in (mu_p, var_p, mu_q, var_q))
    return float(0.5 * np.sum(np.log(var_q / var_p) + (var_p + (mu_p - mu_q) ** 2) / var_q - 1.0))


def jeffreys_diag(
    mu_i: NDArray[Any], var_i: NDArray[Any], mu_j: NDArray[Any], var_j: NDArray[Any]
) -> float:
    """Symmetric Jeffreys divergence KL(N_i||N_j) + KL(N_j||N_i) of diagonal Gaussians."""
    return kl_diag_gaussian(mu_i, var_i, mu_j, var_j) + kl_diag_gaussian(mu_j, var_j, mu_i, var_i)


def jeffreys_matrix(means: NDArray[Any], variances: NDArray[Any]) -> NDArray[Any]:
    """(K, K) Jeffreys divergences between K diagonal Gaussians given as (K, D) arrays.

    Closed form: J_ij = 1/2 sum_d [(v_i + (m_i-m_j)^2)/v_j + (v_j + (m_i-m_j)^2)/v_i] - D,
    expanded into matrix products so K=1000 clients cost a few GEMMs, not K^2 loops.
    """
    m = np.asarray(means, dtype=np.float64)
    v = np.asarray(variances, dtype=np.float64)
    if m.ndim != 2 or v.shape != m.shape:
        raise ValueError(
            f"jeffreys_matrix: means {m.shape} and variances {v.shape} must both be (K, D)"
        )
    if not (np.isfinite(m).all() and np.isfinite(v).all()):
        raise ValueError("jeffreys_matrix: descriptors hold NaN/Inf")
    if (v <= 0).any():
        k = int(np.argwhere(v <= 0)[0][0])
        raise ValueError(f"jeffreys_matrix: descriptor {k} has a variance <= 0")
    iv = 1.0 / v
    K, D = m.shape
    if K * K * D <= 20_000_000:
        # Direct broadcast: exact up to rounding (no cancellation between large terms).
        d2 = (m[:, None, :] - m[None, :, :]) ** 2
        J = (
            0.5
            * np.sum(
                (v[:, None, :] + d2) * iv[None, :, :] + (v[None, :, :] + d2) * iv[:, None, :],
                axis=2,
            )
            - D
        )
        np.fill_diagonal(J, 0.0)
        divergence: NDArray[Any] = np.maximum(J, 0.0)
        return divergence
    # sum_d (v_i + m_i^2 - 2 m_i m_j + m_j^2) / v_j, for both orders.
    a = (v + m * m) @ iv.T  # sum_d (v_i + m_i^2) / v_j
    b = m @ (m * iv).T  # sum_d m_i m_j / v_j
    cj = np.sum(m * m * iv, axis=1)  # sum_d m_j^2 / v_j, depends on j only
    term_ij = a - 2.0 * b + cj[None, :]
    J = 0.5 * (term_ij + term_ij.T) - D
    np.fill_diagonal(J, 0.0)
    divergence = np.maximum(J, 0.0)
    return divergence


def weighted_model(
    models: Mapping[int, Mapping[str, NDArray[Any]]], membership: Sequence[tuple[int, float]]
) -> dict[str, NDArray[Any]]:
    """A robot's starting model: weighted mean of its clusters' models (weights > 0), a fresh copy.

    Used by the robot node and the benchmark alike, so both start from the same floats.
    """
    entries = [(c, w) for c, w in membership if w > 0]
    if not entries:
        raise ValueError(f"membership {list(membership)} has no cluster with weight > 0")
    if len(entries) == 1:
        return {k: np.array(v, dtype=np.float32) for k, v in models[entries[0][0]].items()}
    total = sum(w for _, w in entries)
    first = models[entries[0][0]]
    out = {k: np.zeros_like(v, dtype=np.float32) for k, v in first.items()}
    for cid, weight in entries:
        for k, v in models[cid].items():
            out[k] += np.float32(weight / total) * v
    return out
