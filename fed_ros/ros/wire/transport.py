"""Chunked ROS 2 payloads: the sending and assembling halves, size caps, integrity, resume.

- ``ChunkedSender`` turns an ``EncodedPayload`` into ``TensorPayload`` chunks (zero-copy
  views) and resends only requested ones.
- ``PayloadAssembler`` collects chunks by payload_id with size caps checked before any byte
  is accepted, verifies sha256 on completion, reports missing chunks after a timeout and
  accepts the resent ones.

The zmq bulk channel is in ``bulk.py``; the sender/receiver objects both nodes use (channel
choice, the one payload check, acknowledgement bookkeeping) are in ``transfer.py``. Which
path is the default for large payloads is decided by measurement (``fed-ros bench
transfer``; numbers quoted at ``DEFAULT_TRANSPORT``).
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fed_ros.core.params import Manifest
from fed_ros.msg import TensorPayload
from fed_ros.ros.wire.conversions import (
    ENCODING_NAMES,
    EncodedPayload,
    StateDict,
    bytes_view,
    chunk_ranges,
    decode_state_dict,
    encoded_size,
    manifest_from_msgs,
    manifest_to_msgs,
    payload_chunk,
    set_bytes_field,
)

# Chunk size of ROS 2 payload chunks. `fed-ros bench transfer --chunk-sweep`, 21.5 MB,
# x raw pyzmq, default / SHM profile: 1 MiB 0.15/0.22, 2 MiB 0.25/0.35, 4 MiB 0.30/0.37,
# 8 MiB 0.15/0.35, unchunked 0.06/0.09. 4 MiB is fastest and a lost chunk is cheap to resend.
DEFAULT_CHUNK_BYTES = 4 << 20
# Payloads at least this large go over the zmq bulk channel by default; smaller ones
# travel inside ROS messages (one round trip fewer, nothing else to open).
BULK_THRESHOLD_BYTES = 1 << 20
# Default path for large payloads, chosen by `fed-ros bench transfer` (docs/transport.md).
# 21.5 MB robot -> server, two processes, x raw pyzmq (runs at load ~3 | ~14 | ~6, 2 cores):
# ROS 2 default 4 MiB chunks 0.30 | 0.28 | 0.21, unchunked 0.06; ROS 2 + SHM profile
# 0.37 | 0.24 | 0.58 (one host only); zmq bulk with ROS control message, sha256 verified,
# 0.70 | 1.06 | 0.62: the only path at >= 0.5x in every run, and it works across hosts.
DEFAULT_TRANSPORT = "zmq"

# Size caps (V1): a payload larger than this is rejected from its first chunk's header.
DEFAULT_MAX_TOTAL_BYTES = 256 << 20
DEFAULT_MAX_CHUNK_BYTES = 64 << 20
DEFAULT_MAX_CHUNKS = 4096
DEFAULT_MAX_MANIFEST_TENSORS = 100_000
_MAX_PAYLOAD_ID = 256


class PayloadRejected(ValueError):
    """A chunk or payload failed a size, schema, consistency or integrity check (``code`` says which)."""

    def __init__(self, reason: str, code: str = "transfer") -> None:
        super().__init__(reason)
        self.code = code  # a fed_ros.core.validation reject code


class ChunkDropped(PayloadRejected):
    """One chunk does not belong to the payload being assembled (another header, or its data does
    not hash to the signed per-chunk digest). The chunk is dropped; the payload stays intact."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, "foreign_chunk")


def chunk_digests(data: np.ndarray | bytes, total_bytes: int, chunk_bytes: int) -> bytes:
    """SHA-256 of each chunk's bytes, concatenated (TensorPayload.chunk_sha256)."""
    view = memoryview(data).cast("B") if not isinstance(data, np.ndarray) else memoryview(bytes_view(data))
    return b"".join(hashlib.sha256(view[o: o + n]).digest() for o, n in chunk_ranges(total_bytes, chunk_bytes))


def transfer_digest_of(msg: TensorPayload) -> bytes:
    """auth.transfer_digest of a chunk's header: what the sender's signature must cover."""
    from fed_ros.core.auth import transfer_digest
    return transfer_digest(payload_id=msg.payload_id, encoding=int(msg.encoding), total_bytes=int(msg.total_bytes),
                           chunk_count=int(msg.chunk_count),
                           manifest=[(t.name, tuple(t.shape), t.dtype) for t in msg.manifest],
                           scales=np.asarray(msg.scales, dtype="<f4").tobytes(),
                           chunk_sha256=bytes(memoryview(msg.chunk_sha256)), bulk_uri=msg.bulk_uri)


# -------------------------------------------------------------------------- sender

class ChunkedSender:
    """Splits one encoded payload into TensorPayload chunks; resends only requested ones."""

    def __init__(self, encoded: EncodedPayload, payload_id: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 bulk_uri: str = "") -> None:
        if not payload_id or len(payload_id) > _MAX_PAYLOAD_ID:
            raise ValueError(f"payload_id must be 1..{_MAX_PAYLOAD_ID} characters, got {payload_id!r}")
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be > 0, got {chunk_bytes}")
        self.encoded = encoded
        self.payload_id = payload_id
        self.chunk_bytes = int(chunk_bytes)
        self.bulk_uri = bulk_uri
        self.chunk_count = 1 if bulk_uri else len(chunk_ranges(encoded.total_bytes, self.chunk_bytes))
        # Built once and shared by every chunk (the manifest travels in each chunk).
        self._manifest_msgs = manifest_to_msgs(encoded.manifest)
        # Per-chunk SHA-256 list, in every chunk and signed with the header: a receiver checks each
        # chunk before keeping it (a bulk payload is fetched whole and checked against sha256).
        self.chunk_sha256 = b"" if bulk_uri else chunk_digests(encoded.data, encoded.total_bytes, self.chunk_bytes)

    def chunk(self, index: int) -> TensorPayload:
        """Chunk ``index`` (zero-copy view of the payload bytes)."""
        msg = payload_chunk(self.encoded, self.payload_id, index, self.chunk_bytes,
                            bulk_uri=self.bulk_uri, manifest_msgs=self._manifest_msgs)
        if self.chunk_sha256:
            set_bytes_field(msg, "chunk_sha256", np.frombuffer(self.chunk_sha256, dtype=np.uint8))
        return msg

    def transfer_digest(self) -> bytes:
        """auth.transfer_digest of this payload's header (what the sender signs)."""
        return transfer_digest_of(self.chunk(0))

    def chunks(self) -> Iterator[TensorPayload]:
        """All chunks in order."""
        for i in range(self.chunk_count):
            yield self.chunk(i)

    def resend(self, indices: Sequence[int]) -> list[TensorPayload]:
        """The requested chunks only (a resume request); bad indices raise ValueError."""
        bad = [i for i in indices if not 0 <= int(i) < self.chunk_count]
        if bad:
            raise ValueError(f"payload {self.payload_id!r}: resend indices {bad} outside [0, {self.chunk_count})")
        return [self.chunk(int(i)) for i in sorted(set(int(i) for i in indices))]


# ------------------------------------------------------------------------ receiver

@dataclass(frozen=True)
class TransferLimits:
    """Caps checked on a chunk's header before any of its bytes are accepted."""

    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES
    max_chunks: int = DEFAULT_MAX_CHUNKS
    max_manifest_tensors: int = DEFAULT_MAX_MANIFEST_TENSORS

    def __post_init__(self) -> None:
        for name in ("max_total_bytes", "max_chunk_bytes", "max_chunks", "max_manifest_tensors"):
            if getattr(self, name) <= 0:
                raise ValueError(f"TransferLimits.{name} must be > 0, got {getattr(self, name)}")


@dataclass
class CompletePayload:
    """A fully received, sha256-verified payload."""

    payload_id: str
    manifest: Manifest
    encoding: int
    scales: np.ndarray
    data: np.ndarray  # uint8, contiguous
    sha256: str

    def state_dict(self, copy: bool = False) -> StateDict:
        """Decode into a state dict (float32 tensors are views of ``data`` unless ``copy``)."""
        return decode_state_dict(self.manifest, self.encoding, self.data, self.scales, copy=copy)


def check_header(msg: TensorPayload, limits: TransferLimits) -> Manifest:
    """Validate a chunk's header against the caps and itself; returns the parsed manifest.

    Runs before any payload byte is copied: an oversize or inconsistent payload is
    rejected from its first chunk (V1), whatever its data field holds.
    """
    pid = msg.payload_id
    if not pid or len(pid) > _MAX_PAYLOAD_ID:
        raise PayloadRejected(f"payload_id must be 1..{_MAX_PAYLOAD_ID} characters, got {pid[:80]!r}")
    total = int(msg.total_bytes)
    if total > limits.max_total_bytes:
        raise PayloadRejected(f"payload {pid!r}: total_bytes {total} exceeds cap {limits.max_total_bytes}",
                              "oversize")
    count, index = int(msg.chunk_count), int(msg.chunk_index)
    if not 1 <= count <= limits.max_chunks:
        raise PayloadRejected(f"payload {pid!r}: chunk_count {count} outside [1, {limits.max_chunks}]")
    if index >= count:
        raise PayloadRejected(f"payload {pid!r}: chunk_index {index} >= chunk_count {count}")
    n = len(msg.data)
    if n > limits.max_chunk_bytes:
        raise PayloadRejected(f"payload {pid!r}: chunk {index} has {n} bytes > cap {limits.max_chunk_bytes}")
    offset = int(msg.chunk_offset)
    if offset + n > total:
        raise PayloadRejected(f"payload {pid!r}: chunk {index} [{offset}, {offset + n}) beyond total_bytes {total}")
    if msg.bulk_uri and (n or count != 1):
        raise PayloadRejected(f"payload {pid!r}: a bulk_uri control message carries no data and one chunk")
    digests = len(msg.chunk_sha256)
    if digests != (0 if msg.bulk_uri else 32 * count):
        raise PayloadRejected(f"payload {pid!r}: chunk_sha256 has {digests} bytes, expected "
                              f"{0 if msg.bulk_uri else 32 * count} (32 per chunk)")
    if int(msg.encoding) not in ENCODING_NAMES:
        raise PayloadRejected(f"payload {pid!r}: unknown encoding {msg.encoding}")
    sha = msg.sha256
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise PayloadRejected(f"payload {pid!r}: sha256 must be 64 lower-case hex digits, got {sha[:80]!r}")
    if len(msg.manifest) > limits.max_manifest_tensors:
        raise PayloadRejected(f"payload {pid!r}: {len(msg.manifest)} tensors > cap {limits.max_manifest_tensors}")
    try:
        manifest = manifest_from_msgs(msg.manifest)
    except ValueError as exc:
        raise PayloadRejected(f"payload {pid!r}: {exc}") from exc
    expected = encoded_size(manifest, int(msg.encoding))
    if expected != total:
        raise PayloadRejected(f"payload {pid!r}: manifest implies {expected} bytes, total_bytes says {total}")
    if int(msg.encoding) == TensorPayload.ENCODING_INT8 and len(msg.scales) != len(manifest):
        raise PayloadRejected(f"payload {pid!r}: int8 needs {len(manifest)} scales, got {len(msg.scales)}")
    return manifest


@dataclass
class _Pending:
    header: tuple
    manifest: Manifest
    encoding: int
    scales: np.ndarray
    sha256: str
    buf: np.ndarray
    chunk_count: int
    chunk_sha256: bytes = b""  # 32 bytes per chunk (checked by check_header); each chunk is verified
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    received_bytes: int = 0
    last_progress: float = 0.0
    resume_requests: int = 0


class PayloadAssembler:
    """Collects TensorPayload chunks by payload_id into verified payloads, memory bounded.

    Memory: at most ``max_pending`` payloads of at most ``limits.max_total_bytes`` each.
    Duplicate chunks (resends) are ignored; chunks of recently completed or failed
    payloads are ignored too, so a late resend never starts a new assembly.
    """

    def __init__(self, limits: TransferLimits | None = None, max_pending: int = 8,
                 stall_timeout_s: float = 2.0, max_resume_requests: int = 5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        if stall_timeout_s <= 0:
            raise ValueError(f"stall_timeout_s must be > 0, got {stall_timeout_s}")
        self.limits = limits or TransferLimits()
        self.max_pending = max_pending
        self.stall_timeout_s = stall_timeout_s
        self.max_resume_requests = max_resume_requests
        self._clock = clock
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        self._finished: deque[str] = deque(maxlen=256)
        self._finished_set: set[str] = set()

    @property
    def pending_ids(self) -> list[str]:
        """Payload ids being assembled."""
        return list(self._pending)

    @property
    def pending_bytes(self) -> int:
        """Bytes held by incomplete payloads (bounded by max_pending x max_total_bytes)."""
        return sum(p.buf.nbytes for p in self._pending.values())

    def _finish(self, payload_id: str) -> None:
        self._pending.pop(payload_id, None)
        if len(self._finished) == self._finished.maxlen:
            self._finished_set.discard(self._finished[0])
        self._finished.append(payload_id)
        self._finished_set.add(payload_id)

    def discard(self, payload_id: str) -> None:
        """Drop a payload being assembled (e.g. its round ended); its chunks are then ignored."""
        self._finish(payload_id)

    def forget(self, payload_id: str) -> None:
        """Drop a payload and its finished mark: a later chunk of it starts a new assembly."""
        self._pending.pop(payload_id, None)
        self._finished_set.discard(payload_id)

    def is_finished(self, payload_id: str) -> bool:
        """Whether the payload completed, failed or was discarded recently (its chunks are ignored)."""
        return payload_id in self._finished_set

    def add(self, msg: TensorPayload) -> CompletePayload | None:
        """Accept one chunk; returns the verified payload when it completes, else None.

        Raises PayloadRejected (a ValueError) naming the problem; the chunk's bytes are
        not kept then, and a payload whose sha256 fails is dropped entirely.
        """
        pid = msg.payload_id
        if pid in self._finished_set:
            return None
        if msg.bulk_uri:
            raise PayloadRejected(f"payload {pid!r} travels on the bulk channel ({msg.bulk_uri}); use fetch_bulk")
        pending = self._pending.get(pid)
        if pending is None:
            manifest = check_header(msg, self.limits)  # caps before any allocation
            self._make_room(pid)
            pending = _Pending(header=_header_key(msg), manifest=manifest, encoding=int(msg.encoding),
                               scales=np.array(msg.scales, dtype=np.float32), sha256=msg.sha256,
                               buf=np.empty(int(msg.total_bytes), dtype=np.uint8),
                               chunk_count=int(msg.chunk_count), last_progress=self._clock(),
                               chunk_sha256=bytes(memoryview(msg.chunk_sha256)))
            self._pending[pid] = pending
        else:
            # A chunk that does not belong (another header, out of bounds) is dropped; the payload
            # assembled so far stays: a keyless peer cannot destroy an honest upload (issue 13).
            if _header_key(msg) != pending.header:
                raise ChunkDropped(f"payload {pid!r}: chunk {msg.chunk_index} disagrees with the first chunk's "
                                   f"header (total_bytes/chunk_count/encoding/sha256/manifest/chunk list)")
            n = len(msg.data)
            if n > self.limits.max_chunk_bytes or int(msg.chunk_index) >= pending.chunk_count \
                    or int(msg.chunk_offset) + n > pending.buf.nbytes:
                raise ChunkDropped(f"payload {pid!r}: chunk {msg.chunk_index} out of bounds")
        index, offset, n = int(msg.chunk_index), int(msg.chunk_offset), len(msg.data)
        if index in pending.ranges:
            return None  # duplicate (resend raced the original)
        expected = pending.chunk_sha256[32 * index: 32 * index + 32]
        if expected and hashlib.sha256(memoryview(bytes_view(msg.data))).digest() != expected:
            raise ChunkDropped(f"payload {pid!r}: chunk {index} data does not hash to its listed sha256")
        for other, (o_off, o_len) in pending.ranges.items():
            if offset < o_off + o_len and o_off < offset + n:
                raise ChunkDropped(f"payload {pid!r}: chunk {index} overlaps chunk {other}")
        if n:
            pending.buf[offset: offset + n] = bytes_view(msg.data)  # the one copy on receive
        pending.ranges[index] = (offset, n)
        pending.received_bytes += n
        pending.last_progress = self._clock()
        self._pending.move_to_end(pid)
        if len(pending.ranges) < pending.chunk_count:
            return None
        self._finish(pid)
        if pending.received_bytes != pending.buf.nbytes:
            raise PayloadRejected(f"payload {pid!r}: chunks cover {pending.received_bytes} of "
                                  f"{pending.buf.nbytes} bytes")
        digest = hashlib.sha256(memoryview(pending.buf)).hexdigest()
        if digest != pending.sha256:
            raise PayloadRejected(f"payload {pid!r}: sha256 mismatch (got {digest}, header says {pending.sha256})",
                                  "digest_mismatch")
        return CompletePayload(payload_id=pid, manifest=pending.manifest, encoding=pending.encoding,
                               scales=pending.scales, data=pending.buf, sha256=pending.sha256)

    def _make_room(self, pid: str) -> None:
        if len(self._pending) < self.max_pending:
            return
        oldest_id, oldest = next(iter(self._pending.items()))
        if self._clock() - oldest.last_progress >= self.stall_timeout_s * (self.max_resume_requests + 1):
            # Abandoned long ago: its memory goes to the newcomer. Not marked finished, so a
            # re-send of it (its sender was never acknowledged) starts over.
            self._pending.pop(oldest_id)
            return
        raise PayloadRejected(f"payload {pid!r}: {len(self._pending)} payloads already being assembled "
                              f"(max_pending={self.max_pending})")

    def missing(self, payload_id: str) -> list[int]:
        """Chunk indices not yet received for a payload being assembled ([] if unknown)."""
        pending = self._pending.get(payload_id)
        if pending is None:
            return []
        return [i for i in range(pending.chunk_count) if i not in pending.ranges]

    def stalled(self, now: float | None = None) -> dict[str, list[int]]:
        """Resume requests: payloads with no progress for stall_timeout_s -> their missing chunks.

        Each call that reports a payload counts as one resume request; after
        max_resume_requests the receiver stops asking (the link is probably down) but keeps
        the chunks it has: the sender re-sends an unacknowledged payload when the link is
        back, and only the missing chunks are then new. Memory stays bounded: ``discard``
        at the end of its round, or eviction when a newcomer needs the room.
        """
        now = self._clock() if now is None else now
        out: dict[str, list[int]] = {}
        for pid, pending in list(self._pending.items()):
            if now - pending.last_progress < self.stall_timeout_s:
                continue
            if pending.resume_requests >= self.max_resume_requests:
                continue
            pending.resume_requests += 1
            pending.last_progress = now  # wait another timeout for the resent chunks
            out[pid] = self.missing(pid)
        return out


def _header_key(msg: TensorPayload) -> tuple:
    return (int(msg.total_bytes), int(msg.chunk_count), int(msg.encoding), msg.sha256,
            tuple((s.name, tuple(s.shape), s.dtype) for s in msg.manifest), bytes(memoryview(msg.scales)),
            bytes(memoryview(msg.chunk_sha256)))


# ----------------------------------------------------------------- resume requests

def encode_resend_request(payload_id: str, indices: Sequence[int]) -> str:
    """Resume request body (JSON, carried in a std_msgs/String on the sender's resend topic)."""
    if not payload_id:
        raise ValueError("payload_id must not be empty")
    return json.dumps({"payload_id": payload_id, "chunks": sorted(int(i) for i in set(indices))})


def decode_resend_request(text: str, max_chunks: int = DEFAULT_MAX_CHUNKS) -> tuple[str, list[int]]:
    """Parse a resume request; raises ValueError on malformed input."""
    try:
        obj = json.loads(text)
        pid, chunks = obj["payload_id"], obj["chunks"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"malformed resend request {text[:120]!r}") from exc
    if not isinstance(pid, str) or not pid or not isinstance(chunks, list) or len(chunks) > max_chunks \
            or not all(isinstance(i, int) and 0 <= i < max_chunks for i in chunks):
        raise ValueError(f"malformed resend request {text[:120]!r}")
    return pid, chunks


# --------------------------------------------------------------- Fast DDS profile

FASTDDS_PROFILE_NAME = "fastdds_shm.xml"


def fastdds_profile_path(name: str = FASTDDS_PROFILE_NAME) -> Path | None:
    """A Fast DDS profile shipped with fed_ros (default: the shared-memory one), if it exists."""
    candidates = [Path(__file__).resolve().parents[3] / "config" / name]
    try:
        from ament_index_python.packages import get_package_share_directory

        candidates.append(Path(get_package_share_directory("fed_ros")) / "config" / name)
    except Exception:  # noqa: BLE001 - not installed as an ament package (dev tree / pip)
        pass
    for path in candidates:
        if path.is_file():
            return path
    return None


def apply_fastdds_profile(env: dict[str, str] | None = None, path: Path | None = None) -> Path | None:
    """Point FASTDDS_DEFAULT_PROFILES_FILE at the SHM profile, only if the file exists.

    Why the check: a profile that fails to load makes Fast DDS fall back to multicast on
    the real network interface. Must run before rclpy.init (participants read it once).
    An existing setting is kept. Returns the profile in effect, or None.
    """
    target = os.environ if env is None else env
    if target.get("FASTDDS_DEFAULT_PROFILES_FILE"):
        current = Path(target["FASTDDS_DEFAULT_PROFILES_FILE"])
        return current if current.is_file() else None
    path = path or fastdds_profile_path()
    if path is None or not Path(path).is_file():
        return None
    target["FASTDDS_DEFAULT_PROFILES_FILE"] = str(path)
    return Path(path)
