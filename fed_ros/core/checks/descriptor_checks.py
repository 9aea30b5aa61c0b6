"""Checks on a client descriptor (server side) and the digest a robot signs for one.

Finite mean/variance, variances > 0, lengths == the announced dims (and the round's), known
kind, sample-count, payload and score caps, residual std, then signature and replay as for
updates (:mod:`fed_ros.core.checks.sender_checks`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fed_ros.core.security.signed_messages import descriptor_digest
from fed_ros.core.checks.decisions import (
    ACCEPTED,
    DESCRIPTOR,
    Decision,
    Limits,
    MALFORMED,
    NON_FINITE,
    OVERSIZE,
    _is_int,
    _reject,
    _short,
)
from fed_ros.core.checks.sender_checks import (
    ValidationContext,
    _check_auth,
    _check_num_samples,
    _check_sender,
)

DESCRIPTOR_KINDS = ("gaussian", "rnd", "update", "embedding")


def digest_of_descriptor(desc: Any, dims: int | None = None) -> bytes:
    """SHA-256 a robot signs for a core ClientDescriptor (dims defaults to len(mean))."""
    mean = getattr(desc, "mean", None)
    if dims is None:
        dims = 0 if mean is None else int(np.size(mean))
    return descriptor_digest(
        kind=desc.kind,
        dims=dims,
        mean=mean,
        variance=getattr(desc, "variance", None),
        num_samples=desc.num_samples,
        payload=getattr(desc, "payload", b"") or b"",
        scores=getattr(desc, "scores", None) or {},
        residual_std=float(getattr(desc, "residual_std", math.nan)),
    )


def _vector(
    values: Any, what: str, rid: str, limits: Limits
) -> tuple[NDArray[Any] | None, Decision]:
    if values is None:
        return None, ACCEPTED
    try:
        arr = np.asarray(values)
    except Exception:
        return None, _reject(DESCRIPTOR, f"robot {rid!r}: {what} is not an array")
    if arr.dtype.kind not in "fiu" or arr.ndim != 1:
        return None, _reject(
            DESCRIPTOR,
            f"robot {rid!r}: {what} must be a 1-D numeric vector, "
            f"got dtype {arr.dtype} shape {arr.shape}",
        )
    if arr.size > limits.max_descriptor_dims:
        return None, _reject(
            OVERSIZE,
            f"robot {rid!r}: {what} has {arr.size} dims > cap {limits.max_descriptor_dims}",
        )
    arr = arr.astype(np.float64)
    if not np.isfinite(arr).all():
        return None, _reject(
            NON_FINITE,
            f"robot {rid!r}: {what} has "
            f"{int(arr.size - np.count_nonzero(np.isfinite(arr)))} NaN/Inf values",
        )
    return arr, ACCEPTED


def validate_descriptor(
    desc: Any,
    ctx: ValidationContext,
    *,
    round_idx: int,
    nonce: bytes = b"",
    signature: bytes = b"",
    dims: int | None = None,
    commit: bool = True,
) -> Decision:
    """Check a core ClientDescriptor (+ its message's round/nonce/signature/announced dims).

    Finite mean/variance, variances > 0, lengths == announced `dims` (and ctx.descriptor_dims),
    sample-count cap, payload/score caps, known kind, signature and replay as for updates.
    """
    try:
        d = _validate_descriptor(desc, ctx, round_idx, nonce, signature, dims)
    except Exception as err:  # hostile input must never crash a handler
        d = _reject(MALFORMED, f"descriptor could not be validated: {type(err).__name__}: {err}")
    if d and commit and ctx.replay_guard is not None:
        ctx.replay_guard.record(desc.robot_id, round_idx, bytes(nonce))
    return d


def _validate_descriptor(
    desc: Any, ctx: ValidationContext, round_idx: int, nonce: Any, signature: Any, dims: Any
) -> Decision:
    limits = ctx.limits
    rid = getattr(desc, "robot_id", None)
    d = _check_sender(rid, round_idx, ctx)
    if not d:
        return d
    kind = getattr(desc, "kind", None)
    allowed = tuple(ctx.descriptor_kinds) if ctx.descriptor_kinds is not None else DESCRIPTOR_KINDS
    if kind not in allowed:
        return _reject(
            DESCRIPTOR, f"robot {rid!r}: descriptor kind {_short(kind)} not in {list(allowed)}"
        )
    d = _check_num_samples(rid, getattr(desc, "num_samples", None), limits)
    if not d:
        return d
    mean, d = _vector(getattr(desc, "mean", None), "mean", rid, limits)
    if not d:
        return d
    var, d = _vector(getattr(desc, "variance", None), "variance", rid, limits)
    if not d:
        return d
    if kind == "gaussian" and (mean is None or var is None):
        return _reject(DESCRIPTOR, f"robot {rid!r}: gaussian descriptor needs mean and variance")
    if var is not None and var.size and not (var > 0).all():
        bad = float(var[np.argmin(var)])
        return _reject(DESCRIPTOR, f"robot {rid!r}: variance must be > 0, found {bad!r}")
    if mean is not None and var is not None and mean.size != var.size:
        return _reject(
            DESCRIPTOR, f"robot {rid!r}: mean has {mean.size} dims but variance {var.size}"
        )
    size = 0 if mean is None else mean.size
    if dims is not None:
        if not _is_int(dims) or dims < 0:
            return _reject(
                MALFORMED, f"robot {rid!r}: announced dims {_short(dims)} is not a count"
            )
        if dims != size:
            return _reject(DESCRIPTOR, f"robot {rid!r}: announced dims {dims} but mean has {size}")
    if ctx.descriptor_dims is not None and mean is not None and size != ctx.descriptor_dims:
        return _reject(
            DESCRIPTOR, f"robot {rid!r}: descriptor has {size} dims, expected {ctx.descriptor_dims}"
        )
    payload = getattr(desc, "payload", b"") or b""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        return _reject(
            MALFORMED, f"robot {rid!r}: payload is {type(payload).__name__}, expected bytes"
        )
    if len(payload) > limits.max_descriptor_payload_bytes:
        return _reject(
            OVERSIZE,
            f"robot {rid!r}: descriptor payload of {len(payload)} bytes exceeds the cap "
            f"{limits.max_descriptor_payload_bytes}",
        )
    scores = getattr(desc, "scores", None) or {}
    if not isinstance(scores, Mapping):
        return _reject(MALFORMED, f"robot {rid!r}: scores must map robot id -> float")
    if len(scores) > limits.max_scores:
        return _reject(OVERSIZE, f"robot {rid!r}: {len(scores)} scores > cap {limits.max_scores}")
    for other, value in scores.items():
        if not isinstance(other, str) or not other:
            return _reject(
                DESCRIPTOR, f"robot {rid!r}: score key {_short(other)} is not a robot id"
            )
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float, np.floating, np.integer))
            or not math.isfinite(float(value))
            or float(value) < 0
        ):
            return _reject(
                DESCRIPTOR,
                f"robot {rid!r}: score for {other!r} is {_short(value)}; must be finite and >= 0",
            )
    residual = getattr(desc, "residual_std", math.nan)
    if isinstance(residual, bool) or not isinstance(
        residual, (int, float, np.floating, np.integer)
    ):
        return _reject(MALFORMED, f"robot {rid!r}: residual_std {_short(residual)} is not a number")
    # RND federations divide by sigma_i, so an RND descriptor needs a real one; others may omit it
    # (NaN).
    if (kind == "rnd" or not math.isnan(float(residual))) and not (
        math.isfinite(float(residual)) and float(residual) >= 0
    ):
        return _reject(
            DESCRIPTOR,
            f"robot {rid!r}: residual_std {residual!r} must be finite and >= 0"
            + ("" if kind == "rnd" else " (or NaN)"),
        )
    if ctx.allow_list is None and ctx.replay_guard is None:
        return ACCEPTED
    return _check_auth(
        rid,
        round_idx,
        nonce,
        signature,
        ctx,
        lambda: ctx.allow_list.verify_descriptor(
            rid,
            round_idx,
            nonce,
            digest_of_descriptor(desc, size if dims is None else int(dims)),
            signature,
        ),
    )
