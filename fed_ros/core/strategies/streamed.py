"""Aggregation that reads each update's columns where they lie, never stacking K models.

The stacked path (``stack_updates=True``, `prepared_round.prepare_round(stack=True)`) copies
the K updates of a round into one (K, P) array, so the server's peak memory is K + a few
model sizes. Here every rule walks the
flat parameter vector in column blocks of at most ``BLOCK`` floats and reads each update's
slice of a block from its own state dict (a decoded model, or rows of the server's spill
file, `fed_ros.core.rounds.spill`), so the extra memory is C x P for the results plus one
(K, BLOCK) block.

Results are bit-identical to the stacked path: a weighted mean adds w_k * x_k row after row
in robot-id order in float32 (`aggregate.weighted_rows` does the same over whole rows;
elementwise the operations are the same, so the column blocking cannot change a bit); the
coordinate-wise rules are column-separable; clip's norms are taken over whole rows as there;
Multi-Krum's and CUA's Gram matrices are accumulated over the same column blocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fed_ros.core.params import Manifest, num_params, offsets
from fed_ros.core.strategies.aggregate import gram_to_cosine, similarity_chunk
from fed_ros.core.strategies.robust import (
    KRUM_BLOCK,
    check_rule_kwargs,
    coordinate_median,
    gram_by_blocks,
    krum_choice,
    trimmed_mean,
)

# Floats per column block of the robust rules: a (K, BLOCK) float32 block is 128 KB per robot.
BLOCK = KRUM_BLOCK
# Floats per block of a weighted sum: one cluster's partial sums (1 MB) stay in cache while
# every member's piece is added. Measured at K = 200 x 1M (2026-12-07, 2 busy cores): 4K
# floats 596 ms, 32K 412 ms, 256K 203 ms (a GEMV over the same floats: 151 ms).
SUM_BLOCK = 1 << 18


Segments = list[tuple[str, int, int, int]]  # (tensor, start in tensor, stop, start in block)


def block_segments(manifest: Manifest, a: int, b: int) -> Segments:
    """The tensor pieces that make up flat columns [a, b): (name, lo, hi, position in block)."""
    out: Segments = []
    for name, (start, stop) in offsets(manifest).items():
        lo, hi = max(a, start), min(b, stop)
        if lo < hi:
            out.append((name, lo - start, hi - start, lo - a))
    return out


def blocks(manifest: Manifest, block: int | None = None) -> list[tuple[int, int, Segments]]:
    """Column blocks [a, b) of the flat vector (``BLOCK`` wide) with their tensor segments."""
    block = BLOCK if block is None else block
    P = num_params(manifest)
    return [
        (a, min(a + block, P), block_segments(manifest, a, min(a + block, P)))
        for a in range(0, P, block)
    ]


def read_block(
    sds: Sequence[Mapping[str, NDArray[Any]]], segments: Segments, width: int, out: NDArray[Any]
) -> NDArray[Any]:
    """Copy the given columns of every state dict into rows of ``out`` ((K, >= width))."""
    view = out[: len(sds), :width]
    for i, sd in enumerate(sds):
        for name, lo, hi, pos in segments:
            view[i, pos : pos + hi - lo] = sd[name].reshape(-1)[lo:hi]
    return view


def first_nonfinite(sds: Sequence[Mapping[str, NDArray[Any]]]) -> int:
    """Index of the first state dict holding NaN/Inf (-1 if none)."""
    for k, sd in enumerate(sds):
        for arr in sd.values():
            flat = arr.reshape(-1)
            with np.errstate(over="ignore", invalid="ignore"):
                if np.isfinite(np.dot(flat, flat)):
                    continue
            if not np.isfinite(flat).all():
                return k
    return -1


def weighted_sums(
    sds: Sequence[Mapping[str, NDArray[Any]]],
    W: NDArray[Any],
    manifest: Manifest,
    out: NDArray[Any] | None = None,
) -> NDArray[Any]:
    """(G, P) float32: row g = sum_k W[g, k] x_k over k with W[g, k] != 0, added in order.

    Each update is read in place tensor piece by tensor piece; the partial sums of a piece stay
    in cache while every member's piece is added, so the K updates are read once.
    """
    W = np.asarray(W, dtype=np.float32)
    if W.ndim != 2 or W.shape[1] != len(sds):
        raise ValueError(f"weights of shape {W.shape} for {len(sds)} updates")
    shape = (W.shape[0], num_params(manifest))
    if out is None:
        out = np.empty(shape, dtype=np.float32)
    elif out.shape != shape or out.dtype != np.float32:
        raise ValueError(f"out must be a {shape} float32 array, got {out.shape} {out.dtype}")
    members = [np.flatnonzero(W[g]).tolist() for g in range(W.shape[0])]
    tmp = np.empty(min(SUM_BLOCK, shape[1]), dtype=np.float32)
    for _a, _b, segments in blocks(manifest, SUM_BLOCK):
        for name, lo, hi, _pos in segments:
            start = offsets_cache(manifest)[name] + lo
            for g, ks in enumerate(members):
                acc = out[g, start : start + hi - lo]
                if not ks:
                    acc[...] = 0.0
                    continue
                np.multiply(sds[ks[0]][name].reshape(-1)[lo:hi], W[g, ks[0]], out=acc)
                part = tmp[: hi - lo]
                for k in ks[1:]:
                    np.multiply(sds[k][name].reshape(-1)[lo:hi], W[g, k], out=part)
                    acc += part
    return out


_OFFSETS: dict[Manifest, dict[str, int]] = {}


def offsets_cache(manifest: Manifest) -> dict[str, int]:
    """Flat start of each tensor (memoised: the manifest is the same every round)."""
    got = _OFFSETS.get(manifest)
    if got is None:
        if len(_OFFSETS) > 16:
            _OFFSETS.clear()
        got = _OFFSETS[manifest] = {n: a for n, (a, _) in offsets(manifest).items()}
    return got


def omega_similarity(
    sds: Sequence[Mapping[str, NDArray[Any]]],
    manifest: Manifest,
    names: Sequence[str],
    origin: Mapping[str, NDArray[Any]],
) -> NDArray[Any]:
    """`aggregate.update_similarity` of the tensors ``names`` (manifest order), read in place.

    The Omega columns are taken in the same (K, chunk) blocks as the stacked path takes them
    from its (K, P) array, so the Gram matrix (and S) is equal to the bit, and no K x |Omega|
    copy is made: the extra memory is one block.
    """
    sub = tuple(spec for spec in manifest if spec.name in set(names))
    K = len(sds)
    chunk = similarity_chunk(K)
    buf = np.empty((K, min(chunk, num_params(sub))), dtype=np.float32)
    o = np.empty(chunk, dtype=np.float32)
    G = np.zeros((K, K), dtype=np.float64)
    for a, b, segments in blocks(sub, chunk):
        view = read_block(sds, segments, b - a, buf)
        read_block([origin], segments, b - a, o[None, :])
        block = view - o[: b - a]
        G += block @ block.T
    if not np.isfinite(G).all():
        bad = first_nonfinite(sds)
        raise ValueError(
            f"update {bad} holds NaN/Inf values" if bad >= 0 else "update similarity overflowed"
        )
    return gram_to_cosine(G)


def robust_average(
    sds: Sequence[Mapping[str, NDArray[Any]]],
    weights: NDArray[Any],
    manifest: Manifest,
    rule: str,
    **kw: Any,
) -> NDArray[Any]:
    """`robust.aggregate_robust` of the given updates, read block by block (weights normalised
    as there); the caller has checked that every update is finite."""
    check_rule_kwargs(rule, kw)
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.shape[0] != len(sds) or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights must be {len(sds)} finite values >= 0, got {w.tolist()}")
    w = w / w.sum()
    P = num_params(manifest)
    if rule == "mean":
        average: NDArray[Any] = weighted_sums(sds, w[None, :], manifest)[0]
        return average
    if rule in ("median", "trimmed_mean"):
        out = np.empty(P, dtype=np.float32)
        buf = np.empty((len(sds), min(BLOCK, P)), dtype=np.float32)
        trim = float(kw.get("trim", 0.1))
        for a, b, segments in blocks(manifest):
            block = read_block(sds, segments, b - a, buf)
            out[a:b] = coordinate_median(block) if rule == "median" else trimmed_mean(block, trim)
        return out
    if rule == "clip":
        return _clip_mean(sds, w, manifest, kw.get("clip_norm"), kw.get("reference"))
    buf = np.empty((len(sds), min(BLOCK, P)), dtype=np.float32)
    G = gram_by_blocks(
        lambda a, b, segs: read_block(sds, segs, b - a, buf), len(sds), blocks(manifest)
    )
    chosen, cw = krum_choice(G, w, int(kw.get("f", 1)), kw.get("m"), lambda i: _bytes(sds[i]))
    average = weighted_sums([sds[i] for i in chosen], cw[None, :], manifest)[0]
    return average


def _bytes(sd: Mapping[str, NDArray[Any]]) -> bytes:
    return b"".join(np.ascontiguousarray(v).tobytes() for v in sd.values())


def _clip_mean(
    sds: Sequence[Mapping[str, NDArray[Any]]],
    w: NDArray[Any],
    manifest: Manifest,
    clip_norm: float | None,
    reference: NDArray[Any] | None,
) -> NDArray[Any]:
    """`robust.norm_clip_mean` reading one update at a time (norms over whole rows, as there)."""
    P = num_params(manifest)
    ref = np.zeros(P, np.float32) if reference is None else np.asarray(reference, np.float32)
    if ref.shape != (P,):
        raise ValueError(f"reference has shape {ref.shape}, expected ({P},)")
    row = np.empty(P, dtype=np.float32)
    norms = np.empty(len(sds))
    pos = offsets_cache(manifest)
    for k, sd in enumerate(sds):
        for name, arr in sd.items():
            a = pos[name]
            np.subtract(arr.reshape(-1), ref[a : a + arr.size], out=row[a : a + arr.size])
        # The same reduction as the stacked path's norm over axis 1 of a (K, P) float64 array.
        norms[k] = np.linalg.norm(row.astype(np.float64)[None, :], axis=1)[0]
    if clip_norm is None:
        clip_norm = float(np.median(norms))
    if not np.isfinite(clip_norm) or clip_norm < 0:
        raise ValueError(f"clip_norm must be finite and >= 0, got {clip_norm!r}")
    scales = np.minimum(1.0, clip_norm / np.maximum(norms, 1e-30))
    cw = np.asarray(w * scales, dtype=np.float32)
    out = np.empty(P, dtype=np.float32)
    tmp = np.empty(min(BLOCK, P), dtype=np.float32)
    for a, b, segments in blocks(manifest):
        acc = out[a:b]
        for k, sd in enumerate(sds):
            part = tmp[: b - a]
            for name, lo, hi, p in segments:
                np.subtract(
                    sd[name].reshape(-1)[lo:hi],
                    ref[a + p : a + p + hi - lo],
                    out=part[p : p + hi - lo],
                )
            if k == 0:
                np.multiply(part, cw[0], out=acc)
            else:
                part *= cw[k]
                acc += part
        acc += ref[a:b]
    return out
