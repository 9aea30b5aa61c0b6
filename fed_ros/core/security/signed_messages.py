"""What the fleet signs: canonical byte strings and digests (the encoding half
of :mod:`fed_ros.core.security.auth`).

Each message starts with a domain-separation tag (a signature made for one kind of message
is never valid as another kind), then fixed-width big-endian fields: round, robot id,
a fresh nonce, the SHA-256 of what is sent (an update's payload, a descriptor's digest, a
cluster model, a transfer). Bad field values raise ValueError naming the field. The keys,
the signer and the allow-list that use them are in :mod:`fed_ros.core.security.auth` (which
re-exports this module's names).
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

NONCE_BYTES = 16
# Domain-separation tags: a signature made for one kind of message can never be
# replayed as another kind (an update signature is not a valid descriptor signature).
_TAG_UPDATE = b"fed_ros/update/v2"
_TAG_DESCRIPTOR = b"fed_ros/descriptor/v1"
_TAG_CLUSTER_MODEL = b"fed_ros/cluster_model/v2"
_TAG_TRANSFER = b"fed_ros/transfer/v1"
_TAG_CONTROL = b"fed_ros/control/v1"
_TAG_PROGRESS = b"fed_ros/progress/v1"
_MAX_ID_BYTES = 255  # robot ids are short names; longer ones are refused, not truncated


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _check_int32(value: int, what: str) -> int:
    if not _is_int(value) or not -(2**31) <= int(value) < 2**31:
        raise ValueError(f"{what} must be an int32, got {value!r}")
    return int(value)


def _check_round(round_idx: int, what: str = "round") -> int:
    if not _is_int(round_idx):
        raise ValueError(f"{what} must be an integer, got {round_idx!r}")
    if not 0 <= int(round_idx) < 2**32:
        raise ValueError(f"{what} must be in [0, 2**32), got {round_idx!r}")
    return int(round_idx)


def robot_id_bytes(robot_id: str) -> bytes:
    if not isinstance(robot_id, str) or not robot_id:
        raise ValueError(f"robot id must be a non-empty string, got {robot_id!r}")
    raw = robot_id.encode("utf-8")
    if len(raw) > _MAX_ID_BYTES:
        raise ValueError(f"robot id longer than {_MAX_ID_BYTES} bytes: {robot_id[:40]!r}...")
    return raw


def _digest_bytes(digest: str | bytes, what: str) -> bytes:
    """A SHA-256 digest given as 32 raw bytes or 64 hex characters -> 32 raw bytes."""
    if isinstance(digest, (bytes, bytearray, memoryview)):
        raw = bytes(digest)
    elif isinstance(digest, str):
        try:
            raw = bytes.fromhex(digest)
        except ValueError:
            raise ValueError(f"{what} is not hex: {digest[:80]!r}") from None
    else:
        raise ValueError(f"{what} must be hex str or bytes, got {type(digest).__name__}")
    if len(raw) != 32:
        raise ValueError(f"{what} must be 32 bytes (sha256), got {len(raw)}")
    return raw


def _nonce_bytes(nonce: bytes) -> bytes:
    if not isinstance(nonce, (bytes, bytearray, memoryview)):
        raise ValueError(f"nonce must be bytes, got {type(nonce).__name__}")
    nonce = bytes(nonce)
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"nonce must be {NONCE_BYTES} bytes, got {len(nonce)}")
    return nonce


def _blob(data: bytes | str) -> bytes:
    # Only text or a byte buffer: bytes(False), bytes(0) and bytes(n) are zero-filled byte strings,
    # so a field forged to False/0 would encode like the empty one and keep a signature valid.
    if isinstance(data, str):
        raw = data.encode("utf-8")
    else:
        try:
            raw = bytes(memoryview(data))
        except TypeError:
            raise ValueError(f"expected bytes or str, got {type(data).__name__}") from None
    return struct.pack("<Q", len(raw)) + raw


def _bytes_blob(data: bytes, what: str) -> bytes:
    """``_blob`` of a byte field (a digest): text is refused too, '' would encode like b''."""
    if isinstance(data, str):
        raise ValueError(f"{what} must be bytes, got str")
    return _blob(data)


def transfer_digest(
    *,
    payload_id: str,
    encoding: int,
    total_bytes: int,
    chunk_count: int,
    manifest: Sequence[tuple[str, Sequence[int], str]],
    scales: bytes = b"",
    chunk_sha256: bytes = b"",
    bulk_uri: str = "",
) -> bytes:
    """SHA-256 over everything a payload's header tells its receiver (what a signature must cover).

    Payload id, encoding, size, chunk count, the manifest (names, shapes, dtypes: they decide what
    the bytes mean), int8 scales, the per-chunk SHA-256 list (so every chunk is checked before it
    is kept) and the bulk channel address (so a receiver connects only where the signer said).
    """
    if not _is_int(total_bytes) or not 0 <= int(total_bytes) < 2**64:
        raise ValueError(f"total_bytes must be a uint64, got {total_bytes!r}")
    if not _is_int(chunk_count) or not 0 <= int(chunk_count) < 2**32:
        raise ValueError(f"chunk_count must be a uint32, got {chunk_count!r}")
    chunk_sha256 = bytes(chunk_sha256)
    if len(chunk_sha256) % 32:
        raise ValueError(f"chunk_sha256 must be 32 bytes per chunk, got {len(chunk_sha256)} bytes")
    h = hashlib.sha256(_TAG_TRANSFER)
    h.update(
        _blob(payload_id)
        + struct.pack("<BQI", int(encoding) & 0xFF, int(total_bytes), int(chunk_count))
    )
    h.update(struct.pack("<Q", len(manifest)))
    for name, shape, dtype in manifest:
        shape = tuple(int(d) for d in shape)
        h.update(
            _blob(str(name))
            + _blob(str(dtype))
            + struct.pack(f"<Q{len(shape)}q", len(shape), *shape)
        )
    h.update(_blob(bytes(scales)) + _blob(chunk_sha256) + _blob(bulk_uri))
    return h.digest()


def update_message(
    round_idx: int,
    robot_id: str,
    nonce: bytes,
    payload_sha256: str | bytes,
    *,
    base_round: int,
    num_samples: int,
    cluster_id: int,
    transfer: bytes = b"",
) -> bytes:
    """Canonical bytes a robot signs for a model update.

    (round, robot id, nonce, payload sha256) as the design asks, plus the header fields that
    steer aggregation (base round, sample count = aggregation weight, chosen cluster), so a
    man in the middle cannot re-weight or re-route a genuine update, plus ``transfer``: the
    ``transfer_digest`` of the payload header (payload id, manifest, chunk list, bulk address),
    so no chunk or bulk endpoint that the robot did not name can enter its upload.
    """
    rid = robot_id_bytes(robot_id)
    if not _is_int(num_samples) or not 0 <= int(num_samples) < 2**64:
        raise ValueError(f"num_samples must be a uint64, got {num_samples!r}")
    return b"".join(
        (
            _TAG_UPDATE,
            struct.pack("<IB", _check_round(round_idx), len(rid)),
            rid,
            _nonce_bytes(nonce),
            _digest_bytes(payload_sha256, "payload sha256"),
            struct.pack(
                "<IQi",
                _check_round(base_round, "base_round"),
                int(num_samples),
                _check_int32(cluster_id, "cluster id"),
            ),
            _bytes_blob(transfer, "transfer"),
        )
    )


def descriptor_message(
    round_idx: int, robot_id: str, nonce: bytes, descriptor_sha256: str | bytes
) -> bytes:
    """Canonical bytes a robot signs for a descriptor: (round, robot id, nonce, descriptor
    digest)."""
    rid = robot_id_bytes(robot_id)
    return b"".join(
        (
            _TAG_DESCRIPTOR,
            struct.pack("<IB", _check_round(round_idx), len(rid)),
            rid,
            _nonce_bytes(nonce),
            _digest_bytes(descriptor_sha256, "descriptor digest"),
        )
    )


def cluster_model_message(
    round_idx: int,
    cluster_id: int,
    payload_sha256: str | bytes,
    *,
    transfer: bytes = b"",
    members: Sequence[str] = (),
) -> bytes:
    """Canonical bytes the server signs for a published cluster model.

    (round, cluster id, sha256), the member robots (robots pick their model by membership) and
    ``transfer`` (the payload header's ``transfer_digest``: chunk list, bulk address, manifest).
    """
    return b"".join(
        (
            _TAG_CLUSTER_MODEL,
            struct.pack("<Ii", _check_round(round_idx), _check_int32(cluster_id, "cluster id")),
            _digest_bytes(payload_sha256, "payload sha256"),
            _bytes_blob(transfer, "transfer"),
            struct.pack("<Q", len(members)),
            *(_blob(str(m)) for m in members),
        )
    )


def progress_message(
    round_idx: int, robot_id: str, seq: int, steps_done: int, expected_steps: int
) -> bytes:
    """Canonical bytes a robot signs for a training-progress heartbeat.

    (round, robot id, sequence number, steps done, steps expected). The sequence number, which
    rises with every heartbeat of a round, is what makes a replay useless (the server keeps the
    last one per robot and round), so heartbeats need no nonce and add nothing to the replay
    guard's file.
    """
    rid = robot_id_bytes(robot_id)
    for what, value in (
        ("seq", seq),
        ("steps_done", steps_done),
        ("expected_steps", expected_steps),
    ):
        if not _is_int(value) or not 0 <= int(value) < 2**64:
            raise ValueError(f"{what} must be a uint64, got {value!r}")
    return b"".join(
        (
            _TAG_PROGRESS,
            struct.pack("<IB", _check_round(round_idx), len(rid)),
            rid,
            struct.pack("<QQQ", int(seq), int(steps_done), int(expected_steps)),
        )
    )


def control_message(kind: str, body: bytes) -> bytes:
    """Canonical bytes the server signs for a control message (round announcement, resend request).

    ``body`` is the message's own serialisation with its signature field empty (the ROS layer
    uses the CDR bytes, deterministic for one message type); ``kind`` separates the domains.
    """
    return _TAG_CONTROL + _blob(kind) + _blob(body)


def _f32(values: Any, what: str) -> bytes:
    if values is None:
        return struct.pack("<q", 0)
    with np.errstate(
        over="ignore", invalid="ignore"
    ):  # out-of-range values become inf, as on the wire
        arr = np.ascontiguousarray(np.asarray(values, dtype="<f4").ravel())
    # An absent vector and an empty one travel the same way (an empty float32[]): same bytes.
    # NaNs have many bit patterns; canonicalise so both ends hash the same bytes.
    if not np.all(np.isfinite(arr)):
        arr = arr.copy()
        arr[np.isnan(arr)] = np.float32("nan")
    return struct.pack("<q", arr.size) + arr.tobytes()


def descriptor_digest(
    *,
    kind: str,
    dims: int,
    mean: Any,
    variance: Any,
    num_samples: int,
    payload: bytes = b"",
    scores: Mapping[str, float] | None = None,
    residual_std: float = math.nan,
) -> bytes:
    """SHA-256 over a canonical encoding of a descriptor's content (float32, sorted scores)."""
    h = hashlib.sha256()
    kind_b = str(kind).encode("utf-8")
    h.update(struct.pack("<H", len(kind_b)) + kind_b)
    h.update(struct.pack("<QQ", int(dims) & (2**64 - 1), int(num_samples) & (2**64 - 1)))
    h.update(_f32(mean, "mean"))
    h.update(_f32(variance, "variance"))
    payload = bytes(payload or b"")
    h.update(struct.pack("<Q", len(payload)) + payload)
    items = sorted((scores or {}).items())
    h.update(struct.pack("<Q", len(items)))
    for rid, value in items:
        rb = str(rid).encode("utf-8")
        h.update(struct.pack("<H", len(rb)) + rb + _f32([value], "score"))
    h.update(_f32([residual_std], "residual_std"))
    return h.digest()


def new_nonce() -> bytes:
    """A fresh random 16-byte nonce (os.urandom)."""
    return os.urandom(NONCE_BYTES)


def sha256_hex(data: bytes | memoryview | NDArray[Any]) -> str:
    """Lower-case hex SHA-256 of a byte buffer (what TensorPayload.sha256 carries)."""
    return hashlib.sha256(data).hexdigest()
