"""Validation before use: every update, descriptor and cluster model is checked before it touches a model.

Pure functions the server and robot nodes call directly (no rclpy here; the nodes convert
messages into the small envelopes below). Each returns a :class:`Decision` (accept, or reject
with a machine-readable ``code`` and a human ``reason`` naming the offending value); nothing
raises on hostile input. The only state touched is the optional :class:`ReplayGuard`, and only
when the input is accepted (``commit=True``), so a rejected message changes nothing.

Order of checks (cheap first, so hostile bulk is refused before it is collected or decoded):
``check_update_envelope`` needs only the header/first chunk (round, deadline, sender, size cap,
exact manifest, sample-count cap, base round, signature, replay); ``validate_update`` adds the
checks on the decoded tensors (schema again, finite values, digest of the received bytes).
:class:`AuditLog` writes one JSON line per decision and keeps per-round counters for reports.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fed_ros.core.auth import (NONCE_BYTES, AllowList, ReplayGuard, Signer, cluster_model_message,
                               descriptor_digest, verify_signature)
from fed_ros.core.params import Manifest

# TensorPayload.encoding constants (mirrors msg/TensorPayload.msg) -> bytes per value on the wire.
ENCODING_FLOAT32 = 0
ENCODING_FLOAT16 = 1
ENCODING_INT8 = 2
BYTES_PER_VALUE = {ENCODING_FLOAT32: 4, ENCODING_FLOAT16: 2, ENCODING_INT8: 1}
DESCRIPTOR_KINDS = ("gaussian", "rnd", "update", "embedding")
_MiB = 1 << 20

# Reject codes (stable strings: round reports and dashboards count them).
OK = "ok"
MALFORMED = "malformed"
LATE = "late"
FUTURE = "future_round"
NOT_PARTICIPANT = "not_participant"
OVERSIZE = "oversize"
SIZE_MISMATCH = "size_mismatch"
SCHEMA = "schema"
NON_FINITE = "non_finite"
OUT_OF_RANGE = "out_of_range"
NUM_SAMPLES = "num_samples"
STALE_BASE = "stale_base"
UNKNOWN_ROBOT = "unknown_robot"
UNSIGNED = "unsigned"
BAD_SIGNATURE = "bad_signature"
REPLAY = "replay"
DIGEST = "digest_mismatch"
DESCRIPTOR = "bad_descriptor"
ROLLBACK = "rollback"
# Round bookkeeping and transfer outcomes (the coordinator's and the transfer receiver's codes).
DUPLICATE = "duplicate"
NO_ROUND = "no_round"
STALE_ROUND = "stale_round"
UNREACHABLE = "unreachable"  # the bulk channel's sender could not be reached within the round
TRANSFER = "transfer"  # chunks inconsistent with each other or with the caps, or bytes hash wrong
FOREIGN_CHUNK = "foreign_chunk"  # a chunk not of the signed upload it names: dropped, the upload kept


@dataclass(frozen=True)
class Limits:
    """Caps applied before anything is allocated or decoded (units in the field names)."""

    max_update_bytes: int = 512 * _MiB  # encoded ModelUpdate payload
    max_cluster_model_bytes: int = 512 * _MiB  # encoded ClusterModel payload (robot side)
    max_num_samples: int = 10_000_000  # self-reported frames behind one update/descriptor
    max_descriptor_dims: int = 65_536  # length of a descriptor mean/variance
    max_descriptor_payload_bytes: int = 16 * _MiB  # e.g. an RND predictor (safetensors)
    max_scores: int = 4_096  # RND novelty scores in one descriptor
    max_abs_value: float = 1e6  # any parameter with |value| above this is rejected

    def __post_init__(self) -> None:
        for name in ("max_update_bytes", "max_cluster_model_bytes", "max_num_samples",
                     "max_descriptor_dims", "max_descriptor_payload_bytes", "max_scores"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")
        if not (isinstance(self.max_abs_value, (int, float)) and self.max_abs_value > 0):
            raise ValueError(f"Limits.max_abs_value must be > 0, got {self.max_abs_value!r}")


@dataclass(frozen=True)
class Decision:
    """Outcome of a validation: accepted, or rejected with a code and a reason."""

    accepted: bool
    code: str = OK
    reason: str = "accepted"

    def __bool__(self) -> bool:
        return self.accepted

    def raise_if_rejected(self) -> None:
        """Raise ValueError(reason) when rejected (for callers that prefer exceptions)."""
        if not self.accepted:
            raise ValueError(f"{self.code}: {self.reason}")


ACCEPTED = Decision(True)


def _reject(code: str, reason: str) -> Decision:
    return Decision(False, code, reason)


@dataclass(frozen=True)
class UpdateEnvelope:
    """What a ModelUpdate says about itself (header + first chunk), before its bytes are collected.

    ``manifest`` is the announced manifest: TensorSpec-like objects (``name``/``shape``/``dtype``
    attributes, e.g. the message's TensorSpec) or ``(name, shape, dtype)`` tuples.
    """

    robot_id: str
    round_idx: int
    base_round: int
    num_samples: int
    manifest: Sequence[Any]
    total_bytes: int
    payload_sha256: str
    encoding: int = ENCODING_FLOAT32
    cluster_id: int = -1
    nonce: bytes = b""
    signature: bytes = b""
    # auth.transfer_digest of the payload header (payload id, manifest, chunk list, bulk address);
    # the ROS layer computes it from the message, so a header the robot did not sign fails.
    transfer: bytes = b""

    def signed(self, signer: Signer) -> "UpdateEnvelope":
        """A copy carrying `signer`'s signature over every signed field (what a robot sends)."""
        return dataclasses.replace(self, signature=signer.sign_update(
            self.round_idx, self.robot_id, self.nonce, self.payload_sha256, base_round=self.base_round,
            num_samples=self.num_samples, cluster_id=self.cluster_id, transfer=self.transfer))


@dataclass
class ValidationContext:
    """The server's view of the open round; the node updates it when a round starts/ends.

    allow_list None = authentication off (signatures not required). base_rounds: the model
    versions a robot may have trained from (None: any version <= the round).
    """

    current_round: int
    expected_manifest: Manifest | None = None
    base_rounds: Collection[int] | None = None
    participants: Collection[str] | None = None
    limits: Limits = field(default_factory=Limits)
    allow_list: AllowList | None = None
    replay_guard: ReplayGuard | None = None
    deadline_passed: bool = False
    descriptor_kinds: Collection[str] | None = None
    descriptor_dims: int | None = None


# ----------------------------------------------------------------------------- helpers

def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _short(x: Any, n: int = 60) -> str:
    text = repr(x)
    return text if len(text) <= n else text[:n] + "..."


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
    """None if `announced` equals `expected` exactly (names, order, shapes, dtypes), else why not."""
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


def expected_payload_bytes(manifest: Manifest, encoding: int = ENCODING_FLOAT32) -> int:
    """Encoded size in bytes of a payload with this manifest and encoding."""
    if encoding not in BYTES_PER_VALUE:
        raise ValueError(f"unknown encoding {encoding!r}; known {sorted(BYTES_PER_VALUE)}")
    return sum(math.prod(s.shape) for s in manifest) * BYTES_PER_VALUE[encoding]


def check_payload_manifest(announced: Sequence[Any], total_bytes: int, encoding: int,
                           expected: Manifest) -> Decision:
    """A payload's announced manifest equals ``expected`` exactly and implies ``total_bytes``."""
    why = compare_manifest(announced, expected)
    if why is not None:
        return _reject(SCHEMA, why)
    size = expected_payload_bytes(expected, encoding)
    if total_bytes != size:
        return _reject(SIZE_MISMATCH, f"total_bytes {total_bytes} != {size} bytes implied by the manifest "
                                      f"and encoding {encoding}")
    return ACCEPTED


def check_tensors(params: Any, expected: Manifest, max_abs_value: float) -> Decision:
    """Decoded tensors: exact schema, float32, finite and |x| <= max_abs_value."""
    if not isinstance(params, Mapping):
        return _reject(MALFORMED, f"parameters are {type(params).__name__}, expected a mapping")
    if len(params) != len(expected):
        return _reject(SCHEMA, f"update has {len(params)} tensors, expected {len(expected)}")
    for pos, ((name, arr), exp) in enumerate(zip(params.items(), expected)):
        if name != exp.name:
            return _reject(SCHEMA, f"tensor {_short(name)} at position {pos}, expected {exp.name!r}")
        if not isinstance(arr, np.ndarray):
            return _reject(SCHEMA, f"tensor {name!r} is {type(arr).__name__}, expected numpy.ndarray")
        if arr.shape != tuple(exp.shape):
            return _reject(SCHEMA, f"tensor {name!r} has shape {arr.shape}, expected {tuple(exp.shape)}")
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
            return _reject(OUT_OF_RANGE, f"tensor {name!r} has |value| {max(-lo, hi):.3g} "
                                         f"> max_abs_value {max_abs_value:.3g}")
    return ACCEPTED


def _check_sender(robot_id: Any, round_idx: Any, ctx: ValidationContext) -> Decision:
    if not isinstance(robot_id, str) or not robot_id or len(robot_id) > 255:
        return _reject(MALFORMED, f"robot id {_short(robot_id)} must be a non-empty string <= 255 chars")
    if not _is_int(round_idx) or round_idx < 0:
        return _reject(MALFORMED, f"round {_short(round_idx)} must be an integer >= 0")
    if round_idx < ctx.current_round:
        return _reject(LATE, f"robot {robot_id!r}: round {round_idx} is over (current round {ctx.current_round})")
    if round_idx > ctx.current_round:
        return _reject(FUTURE, f"robot {robot_id!r}: round {round_idx} has not started "
                               f"(current round {ctx.current_round})")
    if ctx.deadline_passed:
        return _reject(LATE, f"robot {robot_id!r}: arrived after the deadline of round {round_idx}")
    if ctx.participants is not None and robot_id not in ctx.participants:
        return _reject(NOT_PARTICIPANT, f"robot {robot_id!r} is not a participant of round {round_idx}")
    return ACCEPTED


def _check_num_samples(robot_id: str, num_samples: Any, limits: Limits) -> Decision:
    if not _is_int(num_samples):
        return _reject(MALFORMED, f"robot {robot_id!r}: num_samples {_short(num_samples)} is not an integer")
    if num_samples < 1:
        return _reject(NUM_SAMPLES, f"robot {robot_id!r}: num_samples {num_samples} must be >= 1")
    if num_samples > limits.max_num_samples:
        return _reject(NUM_SAMPLES, f"robot {robot_id!r}: num_samples {num_samples} exceeds the cap "
                                    f"{limits.max_num_samples}")
    return ACCEPTED


def _check_auth(robot_id: str, round_idx: int, nonce: Any, signature: Any, ctx: ValidationContext,
                verify) -> Decision:
    if not isinstance(nonce, (bytes, bytearray, memoryview)) or not isinstance(
            signature, (bytes, bytearray, memoryview)):
        return _reject(MALFORMED, f"robot {robot_id!r}: nonce/signature must be bytes")
    if ctx.allow_list is not None:
        if robot_id not in ctx.allow_list:
            return _reject(UNKNOWN_ROBOT, f"unknown robot {robot_id!r}: no public key on the allow-list")
        if len(signature) == 0:
            return _reject(UNSIGNED, f"robot {robot_id!r}: message is not signed")
        why = verify()
        if why is not None:
            return _reject(BAD_SIGNATURE, why)
    if ctx.replay_guard is not None:
        if len(nonce) != NONCE_BYTES:
            return _reject(REPLAY, f"robot {robot_id!r}: nonce must be {NONCE_BYTES} bytes, got {len(nonce)}")
        why = ctx.replay_guard.check(robot_id, round_idx, bytes(nonce))
        if why is not None:
            return _reject(REPLAY, why)
    return ACCEPTED


# ----------------------------------------------------------------------------- updates (server)

def check_update_envelope(env: UpdateEnvelope, ctx: ValidationContext) -> Decision:
    """Checks on a ModelUpdate's header/first chunk, before its bytes are collected or decoded."""
    try:
        return _check_update_envelope(env, ctx)
    except Exception as err:  # hostile input must never crash a handler: reject it instead
        return _reject(MALFORMED, f"update envelope could not be checked: {type(err).__name__}: {err}")


def _check_update_envelope(env: UpdateEnvelope, ctx: ValidationContext) -> Decision:
    limits = ctx.limits
    d = _check_sender(env.robot_id, env.round_idx, ctx)
    if not d:
        return d
    rid = env.robot_id
    if not _is_int(env.total_bytes) or env.total_bytes < 0:
        return _reject(MALFORMED, f"robot {rid!r}: total_bytes {_short(env.total_bytes)} is not a size")
    if env.total_bytes > limits.max_update_bytes:
        return _reject(OVERSIZE, f"robot {rid!r}: update of {env.total_bytes} bytes exceeds the cap "
                                 f"{limits.max_update_bytes} bytes")
    if not _is_int(env.encoding) or env.encoding not in BYTES_PER_VALUE:
        return _reject(MALFORMED, f"robot {rid!r}: unknown encoding {_short(env.encoding)}")
    if ctx.expected_manifest is not None:  # None: the transfer receiver checks the payload itself
        d = check_payload_manifest(env.manifest, env.total_bytes, env.encoding, ctx.expected_manifest)
        if not d:
            return Decision(False, d.code, f"robot {rid!r}: {d.reason}")
    d = _check_num_samples(rid, env.num_samples, limits)
    if not d:
        return d
    if not _is_int(env.base_round) or env.base_round < 0:
        return _reject(MALFORMED, f"robot {rid!r}: base_round {_short(env.base_round)} is not a round")
    if env.base_round > env.round_idx:
        return _reject(STALE_BASE, f"robot {rid!r}: base_round {env.base_round} is after round {env.round_idx}")
    if ctx.base_rounds is not None and env.base_round not in ctx.base_rounds:
        return _reject(STALE_BASE, f"robot {rid!r}: trained from model version {env.base_round}, "
                                   f"expected one of {sorted(ctx.base_rounds)}")
    if not isinstance(env.payload_sha256, str) or len(env.payload_sha256) != 64:
        return _reject(MALFORMED, f"robot {rid!r}: payload sha256 {_short(env.payload_sha256)} is not 64 hex chars")
    if not _is_int(env.cluster_id) or not -1 <= env.cluster_id < 2**31:
        return _reject(MALFORMED, f"robot {rid!r}: cluster_id {_short(env.cluster_id)} must be an int >= -1")
    return _check_auth(rid, env.round_idx, env.nonce, env.signature, ctx, lambda: ctx.allow_list.verify_update(
        rid, env.round_idx, env.nonce, env.payload_sha256, env.signature, base_round=env.base_round,
        num_samples=env.num_samples, cluster_id=env.cluster_id, transfer=env.transfer))


def validate_update(env: UpdateEnvelope, params: Mapping[str, np.ndarray], ctx: ValidationContext, *,
                    received_sha256: str | None = None, commit: bool = True) -> Decision:
    """Full check of an assembled, decoded update; on accept with commit=True records its nonce.

    `received_sha256` is the digest of the bytes actually received (the assembler's); it must
    equal the signed `env.payload_sha256`.
    """
    try:
        d = _check_update_envelope(env, ctx)
        if not d:
            return d
        if received_sha256 is not None and received_sha256 != env.payload_sha256:
            return _reject(DIGEST, f"robot {env.robot_id!r}: received bytes hash to {_short(received_sha256, 20)}, "
                                   f"announced {env.payload_sha256[:16]}...")
        d = check_tensors(params, ctx.expected_manifest, ctx.limits.max_abs_value)
        if not d:
            return Decision(False, d.code, f"robot {env.robot_id!r}: {d.reason}")
    except Exception as err:  # never let hostile input crash the node
        return _reject(MALFORMED, f"update could not be validated: {type(err).__name__}: {err}")
    if commit and ctx.replay_guard is not None:
        ctx.replay_guard.record(env.robot_id, env.round_idx, bytes(env.nonce))
    return ACCEPTED


# ----------------------------------------------------------------------------- descriptors (server)

def digest_of_descriptor(desc: Any, dims: int | None = None) -> bytes:
    """SHA-256 a robot signs for a core ClientDescriptor (dims defaults to len(mean))."""
    mean = getattr(desc, "mean", None)
    if dims is None:
        dims = 0 if mean is None else int(np.size(mean))
    return descriptor_digest(kind=desc.kind, dims=dims, mean=mean, variance=getattr(desc, "variance", None),
                             num_samples=desc.num_samples, payload=getattr(desc, "payload", b"") or b"",
                             scores=getattr(desc, "scores", None) or {},
                             residual_std=float(getattr(desc, "residual_std", math.nan)))


def _vector(values: Any, what: str, rid: str, limits: Limits) -> tuple[np.ndarray | None, Decision]:
    if values is None:
        return None, ACCEPTED
    try:
        arr = np.asarray(values)
    except Exception:
        return None, _reject(DESCRIPTOR, f"robot {rid!r}: {what} is not an array")
    if arr.dtype.kind not in "fiu" or arr.ndim != 1:
        return None, _reject(DESCRIPTOR, f"robot {rid!r}: {what} must be a 1-D numeric vector, "
                                         f"got dtype {arr.dtype} shape {arr.shape}")
    if arr.size > limits.max_descriptor_dims:
        return None, _reject(OVERSIZE, f"robot {rid!r}: {what} has {arr.size} dims > cap {limits.max_descriptor_dims}")
    arr = arr.astype(np.float64)
    if not np.isfinite(arr).all():
        return None, _reject(NON_FINITE, f"robot {rid!r}: {what} has "
                                         f"{int(arr.size - np.count_nonzero(np.isfinite(arr)))} NaN/Inf values")
    return arr, ACCEPTED


def validate_descriptor(desc: Any, ctx: ValidationContext, *, round_idx: int, nonce: bytes = b"",
                        signature: bytes = b"", dims: int | None = None, commit: bool = True) -> Decision:
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


def _validate_descriptor(desc: Any, ctx: ValidationContext, round_idx: int, nonce: Any, signature: Any,
                         dims: Any) -> Decision:
    limits = ctx.limits
    rid = getattr(desc, "robot_id", None)
    d = _check_sender(rid, round_idx, ctx)
    if not d:
        return d
    kind = getattr(desc, "kind", None)
    allowed = tuple(ctx.descriptor_kinds) if ctx.descriptor_kinds is not None else DESCRIPTOR_KINDS
    if kind not in allowed:
        return _reject(DESCRIPTOR, f"robot {rid!r}: descriptor kind {_short(kind)} not in {list(allowed)}")
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
        return _reject(DESCRIPTOR, f"robot {rid!r}: mean has {mean.size} dims but variance {var.size}")
    size = 0 if mean is None else mean.size
    if dims is not None:
        if not _is_int(dims) or dims < 0:
            return _reject(MALFORMED, f"robot {rid!r}: announced dims {_short(dims)} is not a count")
        if dims != size:
            return _reject(DESCRIPTOR, f"robot {rid!r}: announced dims {dims} but mean has {size}")
    if ctx.descriptor_dims is not None and mean is not None and size != ctx.descriptor_dims:
        return _reject(DESCRIPTOR, f"robot {rid!r}: descriptor has {size} dims, expected {ctx.descriptor_dims}")
    payload = getattr(desc, "payload", b"") or b""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        return _reject(MALFORMED, f"robot {rid!r}: payload is {type(payload).__name__}, expected bytes")
    if len(payload) > limits.max_descriptor_payload_bytes:
        return _reject(OVERSIZE, f"robot {rid!r}: descriptor payload of {len(payload)} bytes exceeds the cap "
                                 f"{limits.max_descriptor_payload_bytes}")
    scores = getattr(desc, "scores", None) or {}
    if not isinstance(scores, Mapping):
        return _reject(MALFORMED, f"robot {rid!r}: scores must map robot id -> float")
    if len(scores) > limits.max_scores:
        return _reject(OVERSIZE, f"robot {rid!r}: {len(scores)} scores > cap {limits.max_scores}")
    for other, value in scores.items():
        if not isinstance(other, str) or not other:
            return _reject(DESCRIPTOR, f"robot {rid!r}: score key {_short(other)} is not a robot id")
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) \
                or not math.isfinite(float(value)) or float(value) < 0:
            return _reject(DESCRIPTOR, f"robot {rid!r}: score for {other!r} is {_short(value)}; "
                                       f"must be finite and >= 0")
    residual = getattr(desc, "residual_std", math.nan)
    if isinstance(residual, bool) or not isinstance(residual, (int, float, np.floating, np.integer)):
        return _reject(MALFORMED, f"robot {rid!r}: residual_std {_short(residual)} is not a number")
    # RND federations divide by sigma_i, so an RND descriptor needs a real one; others may omit it (NaN).
    if (kind == "rnd" or not math.isnan(float(residual))) and \
            not (math.isfinite(float(residual)) and float(residual) >= 0):
        return _reject(DESCRIPTOR, f"robot {rid!r}: residual_std {residual!r} must be finite and >= 0"
                                   + ("" if kind == "rnd" else " (or NaN)"))
    if ctx.allow_list is None and ctx.replay_guard is None:
        return ACCEPTED
    return _check_auth(rid, round_idx, nonce, signature, ctx, lambda: ctx.allow_list.verify_descriptor(
        rid, round_idx, nonce, digest_of_descriptor(desc, size if dims is None else int(dims)), signature))


# ----------------------------------------------------------------------------- cluster models (robot)

def validate_cluster_model(*, cluster_id: int, round_idx: int, params: Mapping[str, np.ndarray] | None,
                           expected_manifest: Manifest | None, total_bytes: int | None = None,
                           payload_sha256: str = "", received_sha256: str | None = None,
                           signature: bytes = b"", server_public_key: bytes | None = None,
                           last_round: int | None = None, limits: Limits = Limits(), transfer: bytes = b"",
                           members: Sequence[str] = ()) -> Decision:
    """Robot side: check a received cluster model before loading it into the policy.

    Size cap, exact manifest (when the robot knows its policy's manifest), finite values, no
    rollback (round >= the last model version the robot loaded), server signature when a
    server key is configured (over round, cluster, sha256, ``members`` and the payload header's
    ``transfer`` digest), and received bytes == announced sha256. `params` None = header only.
    """
    try:
        if not _is_int(cluster_id) or not _is_int(round_idx) or round_idx < 0:
            return _reject(MALFORMED, f"cluster model: cluster {_short(cluster_id)} / round {_short(round_idx)} "
                                      f"must be integers (round >= 0)")
        what = f"cluster {cluster_id} round {round_idx}"
        if total_bytes is not None:
            if not _is_int(total_bytes) or total_bytes < 0:
                return _reject(MALFORMED, f"{what}: total_bytes {_short(total_bytes)} is not a size")
            if total_bytes > limits.max_cluster_model_bytes:
                return _reject(OVERSIZE, f"{what}: {total_bytes} bytes exceed the cap {limits.max_cluster_model_bytes}")
        if last_round is not None and round_idx < last_round:
            return _reject(ROLLBACK, f"{what}: older than the loaded model version {last_round}")
        if received_sha256 is not None and received_sha256 != payload_sha256:
            return _reject(DIGEST, f"{what}: received bytes hash to {_short(received_sha256, 20)}, "
                                   f"announced {_short(payload_sha256, 20)}")
        if server_public_key is not None:
            if not signature:
                return _reject(UNSIGNED, f"{what}: not signed by the server")
            try:
                message = cluster_model_message(round_idx, cluster_id, payload_sha256, transfer=transfer,
                                                members=list(members))
            except ValueError as err:
                return _reject(MALFORMED, f"{what}: {err}")
            if not verify_signature(server_public_key, message, bytes(signature)):
                return _reject(BAD_SIGNATURE, f"{what}: bad server signature")
        if params is not None:
            if expected_manifest is not None:
                d = check_tensors(params, expected_manifest, limits.max_abs_value)
            else:
                if not isinstance(params, Mapping) or not all(
                        isinstance(a, np.ndarray) and a.dtype == np.float32 for a in params.values()):
                    return _reject(SCHEMA, f"{what}: parameters must be float32 numpy arrays")
                d = check_tensors(params, tuple(_AnySpec(k, a.shape) for k, a in params.items()),
                                  limits.max_abs_value)
            if not d:
                return Decision(False, d.code, f"{what}: {d.reason}")
    except Exception as err:  # a malformed model must never crash the robot
        return _reject(MALFORMED, f"cluster model could not be validated: {type(err).__name__}: {err}")
    return ACCEPTED


@dataclass(frozen=True)
class _AnySpec:
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"


# ----------------------------------------------------------------------------- audit log

@dataclass
class RoundCounters:
    """Accept/reject counts of one round, for RoundReport."""

    received: int = 0
    accepted: int = 0
    rejected: int = 0
    by_code: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)  # robot id -> last reason ("accepted" if ok)


class AuditLog:
    """One JSON line per accept/reject (append-only, flushed per line) plus per-round counters.

    Thread-safe (node callbacks may run on several executor threads). Counters are kept for the
    last `keep_rounds` rounds so memory stays bounded on a long-running server.
    """

    def __init__(self, path: str | Path | None = None, *, keep_rounds: int = 64, fsync: bool = False,
                 max_bytes: int = 8 * _MiB, backups: int = 1):
        if keep_rounds < 1:
            raise ValueError(f"keep_rounds must be >= 1, got {keep_rounds}")
        if max_bytes < 1024 or backups < 0:
            raise ValueError(f"max_bytes must be >= 1024 and backups >= 0, got {max_bytes}, {backups}")
        self.path = Path(path) if path is not None else None
        self.keep_rounds = keep_rounds
        self.fsync = fsync
        # Rotation (size cap): at most max_bytes x (1 + backups) on disk, whatever peers send.
        self.max_bytes, self.backups = int(max_bytes), int(backups)
        self._written = 0
        self._lock = threading.Lock()
        self._counters: OrderedDict[int, RoundCounters] = OrderedDict()
        self._file = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
            self._written = self._file.tell()

    def _rotate(self) -> None:
        """audit.jsonl -> audit.jsonl.1 -> ... (the oldest beyond ``backups`` is dropped)."""
        self._file.close()
        for i in range(self.backups, 0, -1):
            src = self.path if i == 1 else self.path.with_name(f"{self.path.name}.{i - 1}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{i}"))
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")
        self._written = 0

    def record(self, *, kind: str, robot_id: Any, round_idx: Any, decision: Decision, **extra: Any) -> Decision:
        """Log one decision (kind: "update", "descriptor", "cluster_model", ...); returns it."""
        entry = {"time": round(time.time(), 6), "kind": str(kind)[:40], "robot_id": str(robot_id)[:255],
                 "round": int(round_idx) if _is_int(round_idx) else str(round_idx)[:40],
                 "accepted": decision.accepted, "code": str(decision.code)[:40], "reason": decision.reason[:1000]}
        # Extra fields are peer-controlled too (payload ids, digests): truncated like the rest.
        entry.update({str(k)[:40]: (v if isinstance(v, (int, float, bool)) or v is None else str(v)[:256])
                      for k, v in list(extra.items())[:16] if k not in entry})
        line = json.dumps(entry, default=str, ensure_ascii=True)
        with self._lock:
            if _is_int(round_idx):
                c = self._counters.get(int(round_idx))
                if c is None:
                    c = self._counters[int(round_idx)] = RoundCounters()
                    while len(self._counters) > self.keep_rounds:
                        self._counters.popitem(last=False)
                c.received += 1
                c.accepted += int(decision.accepted)
                c.rejected += int(not decision.accepted)
                c.by_code[decision.code] = c.by_code.get(decision.code, 0) + 1
                key = str(robot_id)[:255]
                if key in c.reasons or len(c.reasons) < 1024:  # bounded: junk ids only bump the counts
                    c.reasons[key] = decision.reason[:1000]
            if self._file is not None:
                if self._written + len(line) + 1 > self.max_bytes:
                    self._rotate()
                self._file.write(line + "\n")
                self._written += len(line) + 1
                self._file.flush()
                if self.fsync:
                    os.fsync(self._file.fileno())
        return decision

    def counters(self, round_idx: int) -> RoundCounters:
        """Counts for one round (zeros if nothing was recorded); a copy."""
        with self._lock:
            c = self._counters.get(int(round_idx), RoundCounters())
            return RoundCounters(c.received, c.accepted, c.rejected, dict(c.by_code), dict(c.reasons))

    def close(self) -> None:
        """Close the log file."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> "AuditLog":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_audit_log(path: str | Path) -> list[dict[str, Any]]:
    """All entries of an audit log file (skips a torn last line after a crash)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
