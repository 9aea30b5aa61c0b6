"""The receiving half of a chunked ROS 2 payload: header checks, assembly, integrity, resume.

``PayloadAssembler`` collects chunks by payload_id with size caps checked before any byte is
accepted (``check_header``), checks each chunk against the signed per-chunk SHA-256 list and
the whole payload's sha256 on completion, reports missing chunks after a timeout and accepts
the resent ones (the resend request codec is here too). The sending half is in
``chunk_sender.py``; ``transport.py`` re-exports both.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from fed_ros.core import encodings
from fed_ros.core.params import Manifest
from fed_ros.msg import TensorPayload
from fed_ros.ros.wire.chunk_sender import MAX_PAYLOAD_ID
from fed_ros.ros.wire.tensors import (
    ENCODING_NAMES,
    StateDict,
    bytes_view,
    decode_state_dict,
    size_range,
    manifest_from_msgs,
)

# Size caps (V1): a payload larger than this is rejected from its first chunk's header.
DEFAULT_MAX_TOTAL_BYTES = 256 << 20
DEFAULT_MAX_CHUNK_BYTES = 64 << 20
DEFAULT_MAX_CHUNKS = 4096
DEFAULT_MAX_MANIFEST_TENSORS = 100_000


class PayloadRejected(ValueError):
    """A chunk or payload failed a size, schema, consistency or integrity check (``code`` says
    which)."""

    def __init__(self, reason: str, code: str = "transfer") -> None:
        super().__init__(reason)
        self.code = code  # a fed_ros.core.checks.decisions reject code


class ChunkDropped(PayloadRejected):
    """One chunk does not belong to the payload being assembled (another header, or its data does
    not hash to the signed per-chunk digest). The chunk is dropped; the payload stays intact."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, "foreign_chunk")


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
    if not pid or len(pid) > MAX_PAYLOAD_ID:
        raise PayloadRejected(
            f"payload_id must be 1..{MAX_PAYLOAD_ID} characters, got {pid[:80]!r}"
        )
    total = int(msg.total_bytes)
    if total > limits.max_total_bytes:
        raise PayloadRejected(
            f"payload {pid!r}: total_bytes {total} exceeds cap {limits.max_total_bytes}", "oversize"
        )
    count, index = int(msg.chunk_count), int(msg.chunk_index)
    if not 1 <= count <= limits.max_chunks:
        raise PayloadRejected(
            f"payload {pid!r}: chunk_count {count} outside [1, {limits.max_chunks}]"
        )
    if index >= count:
        raise PayloadRejected(f"payload {pid!r}: chunk_index {index} >= chunk_count {count}")
    n = len(msg.data)
    if n > limits.max_chunk_bytes:
        raise PayloadRejected(
            f"payload {pid!r}: chunk {index} has {n} bytes > cap {limits.max_chunk_bytes}"
        )
    offset = int(msg.chunk_offset)
    if offset + n > total:
        raise PayloadRejected(
            f"payload {pid!r}: chunk {index} [{offset}, {offset + n}) beyond total_bytes {total}"
        )
    if msg.bulk_uri and (n or count != 1):
        raise PayloadRejected(
            f"payload {pid!r}: a bulk_uri control message carries no data and one chunk"
        )
    digests = len(msg.chunk_sha256)
    if digests != (0 if msg.bulk_uri else 32 * count):
        raise PayloadRejected(
            f"payload {pid!r}: chunk_sha256 has {digests} bytes, expected "
            f"{0 if msg.bulk_uri else 32 * count} (32 per chunk)"
        )
    if int(msg.encoding) not in ENCODING_NAMES:
        raise PayloadRejected(f"payload {pid!r}: unknown encoding {msg.encoding}")
    sha = msg.sha256
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise PayloadRejected(
            f"payload {pid!r}: sha256 must be 64 lower-case hex digits, got {sha[:80]!r}"
        )
    if len(msg.manifest) > limits.max_manifest_tensors:
        raise PayloadRejected(
            f"payload {pid!r}: {len(msg.manifest)} tensors > cap {limits.max_manifest_tensors}"
        )
    try:
        manifest = manifest_from_msgs(msg.manifest)
    except ValueError as exc:
        raise PayloadRejected(f"payload {pid!r}: {exc}") from exc
    lo, hi = size_range(manifest, int(msg.encoding))
    if not lo <= total <= hi:
        implied = lo if lo == hi else f"{lo}..{hi}"
        raise PayloadRejected(
            f"payload {pid!r}: manifest implies {implied} bytes, total_bytes says {total}"
        )
    # Only int8 carries scales beside the payload (one per tensor; int8_block's are inside).
    want = encodings.BY_WIRE_ID[int(msg.encoding)].scale_count(len(manifest))
    if len(msg.scales) != want:
        raise PayloadRejected(
            f"payload {pid!r}: {ENCODING_NAMES[int(msg.encoding)]} needs {want} scales, "
            f"got {len(msg.scales)}"
        )
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
    chunk_sha256: bytes = (
        b""  # 32 bytes per chunk (checked by check_header); each chunk is verified
    )
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

    def __init__(
        self,
        limits: TransferLimits | None = None,
        max_pending: int = 8,
        stall_timeout_s: float = 2.0,
        max_resume_requests: int = 5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
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
        """Whether the payload completed, failed or was discarded recently (its chunks are
        ignored)."""
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
            raise PayloadRejected(
                f"payload {pid!r} travels on the bulk channel ({msg.bulk_uri}); use fetch_bulk"
            )
        pending = self._pending.get(pid)
        if pending is None:
            manifest = check_header(msg, self.limits)  # caps before any allocation
            self._make_room(pid)
            pending = _Pending(
                header=_header_key(msg),
                manifest=manifest,
                encoding=int(msg.encoding),
                scales=np.array(msg.scales, dtype=np.float32),
                sha256=msg.sha256,
                buf=np.empty(int(msg.total_bytes), dtype=np.uint8),
                chunk_count=int(msg.chunk_count),
                last_progress=self._clock(),
                chunk_sha256=bytes(memoryview(msg.chunk_sha256)),
            )
            self._pending[pid] = pending
        else:
            # A chunk that does not belong (another header, out of bounds) is dropped; the payload
            # assembled so far stays: a keyless peer cannot destroy an honest upload (issue 13).
            if _header_key(msg) != pending.header:
                raise ChunkDropped(
                    f"payload {pid!r}: chunk {msg.chunk_index} disagrees with the first chunk's "
                    f"header (total_bytes/chunk_count/encoding/sha256/manifest/chunk list)"
                )
            n = len(msg.data)
            if (
                n > self.limits.max_chunk_bytes
                or int(msg.chunk_index) >= pending.chunk_count
                or int(msg.chunk_offset) + n > pending.buf.nbytes
            ):
                raise ChunkDropped(f"payload {pid!r}: chunk {msg.chunk_index} out of bounds")
        index, offset, n = int(msg.chunk_index), int(msg.chunk_offset), len(msg.data)
        if index in pending.ranges:
            return None  # duplicate (resend raced the original)
        expected = pending.chunk_sha256[32 * index : 32 * index + 32]
        if expected and hashlib.sha256(memoryview(bytes_view(msg.data))).digest() != expected:
            raise ChunkDropped(
                f"payload {pid!r}: chunk {index} data does not hash to its listed sha256"
            )
        for other, (o_off, o_len) in pending.ranges.items():
            if offset < o_off + o_len and o_off < offset + n:
                raise ChunkDropped(f"payload {pid!r}: chunk {index} overlaps chunk {other}")
        if n:
            pending.buf[offset : offset + n] = bytes_view(msg.data)  # the one copy on receive
        pending.ranges[index] = (offset, n)
        pending.received_bytes += n
        pending.last_progress = self._clock()
        self._pending.move_to_end(pid)
        if len(pending.ranges) < pending.chunk_count:
            return None
        self._finish(pid)
        if pending.received_bytes != pending.buf.nbytes:
            raise PayloadRejected(
                f"payload {pid!r}: chunks cover {pending.received_bytes} of "
                f"{pending.buf.nbytes} bytes"
            )
        digest = hashlib.sha256(memoryview(pending.buf)).hexdigest()
        if digest != pending.sha256:
            raise PayloadRejected(
                f"payload {pid!r}: sha256 mismatch (got {digest}, header says {pending.sha256})",
                "digest_mismatch",
            )
        return CompletePayload(
            payload_id=pid,
            manifest=pending.manifest,
            encoding=pending.encoding,
            scales=pending.scales,
            data=pending.buf,
            sha256=pending.sha256,
        )

    def _make_room(self, pid: str) -> None:
        if len(self._pending) < self.max_pending:
            return
        oldest_id, oldest = next(iter(self._pending.items()))
        if self._clock() - oldest.last_progress >= self.stall_timeout_s * (
            self.max_resume_requests + 1
        ):
            # Abandoned long ago: its memory goes to the newcomer. Not marked finished, so a
            # re-send of it (its sender was never acknowledged) starts over.
            self._pending.pop(oldest_id)
            return
        raise PayloadRejected(
            f"payload {pid!r}: {len(self._pending)} payloads already being assembled "
            f"(max_pending={self.max_pending})"
        )

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
    return (
        int(msg.total_bytes),
        int(msg.chunk_count),
        int(msg.encoding),
        msg.sha256,
        tuple((s.name, tuple(s.shape), s.dtype) for s in msg.manifest),
        bytes(memoryview(msg.scales)),
        bytes(memoryview(msg.chunk_sha256)),
    )


# ----------------------------------------------------------------- chunk-resume requests
# A receiver that misses chunks (a best-effort loss, a link outage) publishes this small JSON body
# in a std_msgs/String on the sender's resend topic; the sender answers with only those chunks.
# Both ends use it (the assembler's owner builds requests, the sender and the scripted robots
# parse them), and the parser faces any peer on the domain: a malformed or oversized request is
# refused with the text named.


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
    if (
        not isinstance(pid, str)
        or not pid
        or not isinstance(chunks, list)
        or len(chunks) > max_chunks
        or not all(isinstance(i, int) and 0 <= i < max_chunks for i in chunks)
    ):
        raise ValueError(f"malformed resend request {text[:120]!r}")
    return pid, chunks
