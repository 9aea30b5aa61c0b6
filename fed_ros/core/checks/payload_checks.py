"""Checks on a payload's shape and values: the announced manifest, the decoded tensors, and a
received cluster model.

``check_payload_manifest`` compares an announced manifest with the expected one exactly (names,
order, shapes, dtypes) and the size it implies; ``check_tensors`` checks decoded tensors (schema,
float32, finite, ``|x| <= max_abs_value``); ``validate_cluster_model`` is the robot's check of a
model the server sent (size cap, rollback, server signature, digest, tensors).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fed_ros.core.security.auth import verify_signature
from fed_ros.core.security.signed_messages import cluster_model_message
from fed_ros.core.checks.decisions import (
    ACCEPTED,
    BAD_SIGNATURE,
    DIGEST,
    Decision,
    Limits,
    MALFORMED,
    NON_FINITE,
    OUT_OF_RANGE,
    OVERSIZE,
    ROLLBACK,
    SCHEMA,
    SIZE_MISMATCH,
    UNSIGNED,
    _is_int,
    _reject,
    _short,
)
from fed_ros.core import encodings
from fed_ros.core.params import Manifest


def _spec_fields(spec: Any) -> tuple[str, tuple[int, ...], str]:
    """(name, shape, dtype) of a TensorSpec-like object or tuple; ValueError when malformed."""
    if isinstance(spec, (tuple, list)) and len(spec) == 3:
        name, shape, dtype = spec
    else:
        try:
            name, shape, dtype = spec.name, spec.shape, spec.dtype
        except AttributeError:
            raise ValueError(f"manifest entry {_short(spec)} has no name/shape/dtype") from None
    if not isinstance(name, str):
        raise ValueError(f"manifest entry name {_short(name)} is not a string")
    try:
        dims = tuple(shape)
    except TypeError:
        raise ValueError(f"tensor {name!r}: shape {_short(shape)} is not a sequence") from None
    if not all(_is_int(d) and d >= 0 for d in dims):
        raise ValueError(f"tensor {name!r}: shape {_short(dims)} must hold integers >= 0")
    if not isinstance(dtype, str):
        raise ValueError(f"tensor {name!r}: dtype {_short(dtype)} is not a string")
    return name, tuple(int(d) for d in dims), dtype


def compare_manifest(announced: Sequence[Any], expected: Manifest) -> str | None:
    """None if `announced` equals `expected` exactly (names, order, shapes, dtypes), else why
    not."""
    try:
        n = len(announced)
    except TypeError:
        return f"manifest {_short(announced)} is not a sequence"
    if n != len(expected):
        return f"manifest has {n} tensors, expected {len(expected)}"
    for pos, (spec, exp) in enumerate(zip(announced, expected)):
        try:
            name, shape, dtype = _spec_fields(spec)
        except ValueError as err:
            return f"manifest entry {pos}: {err}"
        if name != exp.name:
            return f"tensor {name!r} at position {pos}, expected {exp.name!r}"
        if shape != tuple(exp.shape):
            return f"tensor {name!r} has shape {shape}, expected {tuple(exp.shape)}"
        if dtype != exp.dtype:
            return f"tensor {name!r} has dtype {dtype!r}, expected {exp.dtype!r}"
    return None


def payload_size_range(
    manifest: Manifest, encoding: int = encodings.FLOAT32.wire_id
) -> tuple[int, int]:
    """(smallest, largest) payload bytes: one size for a dense encoding, a range for the delta
    encodings (topk's depends on the fraction, a deflated delta's on its values). ValueError
    naming an unknown encoding id."""
    return encodings.by_wire_id(encoding).size_range([math.prod(s.shape) for s in manifest])


def check_payload_manifest(
    announced: Sequence[Any], total_bytes: int, encoding: int, expected: Manifest
) -> Decision:
    """A payload's announced manifest equals ``expected`` exactly and implies ``total_bytes``."""
    why = compare_manifest(announced, expected)
    if why is not None:
        return _reject(SCHEMA, why)
    lo, hi = payload_size_range(expected, encoding)
    if not lo <= total_bytes <= hi:
        return _reject(
            SIZE_MISMATCH,
            f"total_bytes {total_bytes} != {lo if lo == hi else f'{lo}..{hi}'} bytes implied "
            f"by the manifest and encoding {encoding}",
        )
    return ACCEPTED


def check_tensors(params: Any, expected: Manifest, max_abs_value: float) -> Decision:
    """Decoded tensors: exact schema, float32, finite and |x| <= max_abs_value."""
    if not isinstance(params, Mapping):
        return _reject(MALFORMED, f"parameters are {type(params).__name__}, expected a mapping")
    if len(params) != len(expected):
        return _reject(SCHEMA, f"update has {len(params)} tensors, expected {len(expected)}")
    for pos, ((name, arr), exp) in enumerate(zip(params.items(), expected)):
        if name != exp.name:
            return _reject(
                SCHEMA, f"tensor {_short(name)} at position {pos}, expected {exp.name!r}"
            )
        if not isinstance(arr, np.ndarray):
            return _reject(
                SCHEMA, f"tensor {name!r} is {type(arr).__name__}, expected numpy.ndarray"
            )
        if arr.shape != tuple(exp.shape):
            return _reject(
                SCHEMA, f"tensor {name!r} has shape {arr.shape}, expected {tuple(exp.shape)}"
            )
        if str(arr.dtype) != exp.dtype:
            return _reject(SCHEMA, f"tensor {name!r} has dtype {arr.dtype}, expected {exp.dtype}")
    for name, arr in params.items():
        if not arr.size:
            continue
        # min/max propagate NaN/Inf: two streaming passes, no temporary array of the model's size.
        with np.errstate(invalid="ignore"):
            lo, hi = float(arr.min()), float(arr.max())
        if not (math.isfinite(lo) and math.isfinite(hi)):
            bad = int(arr.size - np.count_nonzero(np.isfinite(arr)))
            return _reject(NON_FINITE, f"tensor {name!r} has {bad} NaN/Inf values")
        if max(-lo, hi) > max_abs_value:
            return _reject(
                OUT_OF_RANGE,
                f"tensor {name!r} has |value| {max(-lo, hi):.3g} "
                f"> max_abs_value {max_abs_value:.3g}",
            )
    return ACCEPTED


def validate_cluster_model(
    *,
    cluster_id: int,
    round_idx: int,
    params: Mapping[str, NDArray[Any]] | None,
    expected_manifest: Manifest | None,
    total_bytes: int | None = None,
    payload_sha256: str = "",
    received_sha256: str | None = None,
    signature: bytes = b"",
    server_public_key: bytes | None = None,
    last_round: int | None = None,
    limits: Limits = Limits(),
    transfer: bytes = b"",
    members: Sequence[str] = (),
) -> Decision:
    """Robot side: check a received cluster model before loading it into the policy.

    Size cap, exact manifest (when the robot knows its policy's manifest), finite values, no
    rollback (round >= the last model version the robot loaded), server signature when a
    server key is configured (over round, cluster, sha256, ``members`` and the payload header's
    ``transfer`` digest), and received bytes == announced sha256. `params` None = header only.
    """
    try:
        if not _is_int(cluster_id) or not _is_int(round_idx) or round_idx < 0:
            return _reject(
                MALFORMED,
                f"cluster model: cluster {_short(cluster_id)} / round {_short(round_idx)} "
                f"must be integers (round >= 0)",
            )
        what = f"cluster {cluster_id} round {round_idx}"
        if total_bytes is not None:
            if not _is_int(total_bytes) or total_bytes < 0:
                return _reject(
                    MALFORMED, f"{what}: total_bytes {_short(total_bytes)} is not a size"
                )
            if total_bytes > limits.max_cluster_model_bytes:
                return _reject(
                    OVERSIZE,
                    f"{what}: {total_bytes} bytes exceed the cap {limits.max_cluster_model_bytes}",
                )
        if last_round is not None and round_idx < last_round:
            return _reject(ROLLBACK, f"{what}: older than the loaded model version {last_round}")
        if received_sha256 is not None and received_sha256 != payload_sha256:
            return _reject(
                DIGEST,
                f"{what}: received bytes hash to {_short(received_sha256, 20)}, "
                f"announced {_short(payload_sha256, 20)}",
            )
        if server_public_key is not None:
            if not signature:
                return _reject(UNSIGNED, f"{what}: not signed by the server")
            try:
                message = cluster_model_message(
                    round_idx, cluster_id, payload_sha256, transfer=transfer, members=list(members)
                )
            except ValueError as err:
                return _reject(MALFORMED, f"{what}: {err}")
            if not verify_signature(server_public_key, message, bytes(signature)):
                return _reject(BAD_SIGNATURE, f"{what}: bad server signature")
        if params is not None:
            if expected_manifest is not None:
                d = check_tensors(params, expected_manifest, limits.max_abs_value)
            else:
                if not isinstance(params, Mapping) or not all(
                    isinstance(a, np.ndarray) and a.dtype == np.float32 for a in params.values()
                ):
                    return _reject(SCHEMA, f"{what}: parameters must be float32 numpy arrays")
                d = check_tensors(
                    params,
                    tuple(_AnySpec(k, a.shape) for k, a in params.items()),
                    limits.max_abs_value,
                )
            if not d:
                return Decision(False, d.code, f"{what}: {d.reason}")
    except Exception as err:  # a malformed model must never crash the robot
        return _reject(
            MALFORMED, f"cluster model could not be validated: {type(err).__name__}: {err}"
        )
    return ACCEPTED


@dataclass(frozen=True)
class _AnySpec:
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
