"""Model transfer: chunked ROS 2 payloads with integrity checks and resume, and a zmq bulk
channel for the tensor bytes while the control plane stays in ROS 2 messages.

Two paths, both tested (test/test_ros_transport.py, test/test_interfaces_roundtrip.py):

- ROS chunks: ``ChunkedSender`` turns an ``EncodedPayload`` into ``TensorPayload`` chunks
  (zero-copy views); ``PayloadAssembler`` collects them by payload_id with size caps
  checked before any byte is accepted, verifies sha256 on completion, reports missing
  chunks after a timeout and accepts the resent ones.
- zmq bulk: ``BulkServer`` (ROUTER) offers a payload under a random token; the ROS
  message carries manifest, size, sha256 and ``bulk_uri`` (one control message, no data);
  ``fetch_bulk`` (DEALER) checks the size cap, pulls the chunks with a bounded window
  (frames sent with copy=False), hashes them while the rest arrive, re-requests missing
  chunks, and verifies sha256.

Which path is the default for large payloads is decided by measurement
(``fed-ros bench transfer``; numbers quoted at ``DEFAULT_TRANSPORT``).
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import struct
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq

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
)

# Chunk size of ROS 2 payload chunks. `fed-ros bench transfer --chunk-sweep`, 21.5 MB,
# x raw pyzmq, default / SHM profile: 1 MiB 0.15/0.22, 2 MiB 0.25/0.35, 4 MiB 0.30/0.37,
# 8 MiB 0.15/0.35, unchunked 0.06/0.09. 4 MiB is fastest and a lost chunk is cheap to resend.
DEFAULT_CHUNK_BYTES = 4 << 20
# Chunk size on the zmq bulk channel (frames are sent with copy=False; the receiver
# hashes chunk i while chunk i+1 is on the wire). sha256 (12 ms for 21.5 MB here) costs
# more than the loopback transfer itself (~7 ms), so overlap is what matters. Measured,
# 21.5 MB fetched from another process, median of 8 (ms), 2-core machine under load:
# 1 MiB 15.5 | 2 MiB 16.3 | 4 MiB 19.8 | 8 MiB 20.5 | one frame 24.9; no hashing 6.8.
DEFAULT_BULK_CHUNK_BYTES = 1 << 20
# Chunks requested at once on the bulk channel (flow control; bounds sender queue memory
# to window x chunk size per fetcher).
DEFAULT_BULK_WINDOW = 16
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
    """A chunk or payload failed a size, schema, consistency or integrity check."""


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

    def chunk(self, index: int) -> TensorPayload:
        """Chunk ``index`` (zero-copy view of the payload bytes)."""
        return payload_chunk(self.encoded, self.payload_id, index, self.chunk_bytes,
                             bulk_uri=self.bulk_uri, manifest_msgs=self._manifest_msgs)

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
        raise PayloadRejected(f"payload {pid!r}: total_bytes {total} exceeds cap {limits.max_total_bytes}")
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
                               chunk_count=int(msg.chunk_count), last_progress=self._clock())
            self._pending[pid] = pending
        else:
            if _header_key(msg) != pending.header:
                raise PayloadRejected(f"payload {pid!r}: chunk {msg.chunk_index} disagrees with the first chunk's "
                                      f"header (total_bytes/chunk_count/encoding/sha256/manifest)")
            n = len(msg.data)
            if n > self.limits.max_chunk_bytes or int(msg.chunk_index) >= pending.chunk_count \
                    or int(msg.chunk_offset) + n > pending.buf.nbytes:
                raise PayloadRejected(f"payload {pid!r}: chunk {msg.chunk_index} out of bounds")
        index, offset, n = int(msg.chunk_index), int(msg.chunk_offset), len(msg.data)
        if index in pending.ranges:
            return None  # duplicate (resend raced the original)
        for other, (o_off, o_len) in pending.ranges.items():
            if offset < o_off + o_len and o_off < offset + n:
                raise PayloadRejected(f"payload {pid!r}: chunk {index} overlaps chunk {other}")
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
            raise PayloadRejected(f"payload {pid!r}: sha256 mismatch (got {digest}, header says {pending.sha256})")
        return CompletePayload(payload_id=pid, manifest=pending.manifest, encoding=pending.encoding,
                               scales=pending.scales, data=pending.buf, sha256=pending.sha256)

    def _make_room(self, pid: str) -> None:
        if len(self._pending) < self.max_pending:
            return
        oldest_id, oldest = next(iter(self._pending.items()))
        if self._clock() - oldest.last_progress >= self.stall_timeout_s * (self.max_resume_requests + 1):
            self._finish(oldest_id)  # abandoned long ago: its memory goes to the newcomer
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
        max_resume_requests the payload is given up (dropped, memory freed).
        """
        now = self._clock() if now is None else now
        out: dict[str, list[int]] = {}
        for pid, pending in list(self._pending.items()):
            if now - pending.last_progress < self.stall_timeout_s:
                continue
            if pending.resume_requests >= self.max_resume_requests:
                self._finish(pid)
                continue
            pending.resume_requests += 1
            pending.last_progress = now  # wait another timeout for the resent chunks
            out[pid] = self.missing(pid)
        return out


def _header_key(msg: TensorPayload) -> tuple:
    return (int(msg.total_bytes), int(msg.chunk_count), int(msg.encoding), msg.sha256,
            tuple((s.name, tuple(s.shape), s.dtype) for s in msg.manifest), bytes(memoryview(msg.scales)))


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


# ------------------------------------------------------------------ zmq bulk channel

_GET = b"GET"
_DATA = b"DATA"
_ERR = b"ERR"
_CHUNK_HDR = struct.Struct("<IIQ")  # index, count, offset


def parse_bulk_uri(uri: str) -> tuple[str, bytes]:
    """'tcp://host:port/<token>' -> (zmq endpoint, token)."""
    if not uri.startswith("tcp://") or uri.count("/") != 3:
        raise ValueError(f"bulk_uri must look like tcp://host:port/<token>, got {uri!r}")
    endpoint, token = uri.rsplit("/", 1)
    if not token:
        raise ValueError(f"bulk_uri has no token: {uri!r}")
    return endpoint, token.encode()


class BulkServer:
    """Serves offered payloads to fetchers over a zmq ROUTER socket (background thread).

    A payload is reachable only with its random token, which travels in the ROS control
    message; offers expire after ``ttl_s`` so memory stays bounded.
    """

    def __init__(self, bind: str | None = None, advertise_host: str | None = None,
                 context: zmq.Context | None = None, ttl_s: float = 120.0) -> None:
        # Loopback unless told otherwise: FED_ROS_BULK_BIND (e.g. tcp://0.0.0.0:5555) and
        # FED_ROS_BULK_HOST (the address other machines use) open it to a fleet network.
        bind = bind or os.environ.get("FED_ROS_BULK_BIND", "tcp://127.0.0.1:*")
        advertise_host = advertise_host or os.environ.get("FED_ROS_BULK_HOST") or None
        self._ctx = context or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        # Unknown peers raise instead of silently dropping; bounded queue per peer.
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.setsockopt(zmq.SNDHWM, 4 * DEFAULT_BULK_WINDOW)
        # A fetcher that stops reading must not block the serving thread for everyone else:
        # after this many ms the send fails, the request is dropped and the fetcher resumes.
        self._sock.setsockopt(zmq.SNDTIMEO, 5000)
        self._sock.bind(bind)
        endpoint = self._sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        host, port = endpoint.rsplit(":", 1)
        host = advertise_host or (host.split("//", 1)[1] if "0.0.0.0" not in host else socket.gethostname())
        self.endpoint = f"tcp://{host}:{port}"
        self.ttl_s = ttl_s
        self._offers: dict[bytes, tuple[np.ndarray, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.requests_served = 0
        self._thread = threading.Thread(target=self._serve, name="fed_ros-bulk", daemon=True)
        self._thread.start()

    def offer(self, data: np.ndarray | bytes) -> str:
        """Make ``data`` fetchable (not copied: keep it unchanged); returns its bulk_uri."""
        arr = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
        if arr.dtype != np.uint8 or arr.ndim != 1 or not arr.flags.c_contiguous:
            raise ValueError("bulk payload must be a contiguous 1-D uint8 array or bytes")
        token = secrets.token_hex(16).encode()
        with self._lock:
            self._expire()
            self._offers[token] = (arr, time.monotonic() + self.ttl_s)
        return f"{self.endpoint}/{token.decode()}"

    def withdraw(self, uri_or_token: str) -> None:
        """Stop serving an offer."""
        token = uri_or_token.rsplit("/", 1)[-1].encode()
        with self._lock:
            self._offers.pop(token, None)

    def _expire(self) -> None:
        now = time.monotonic()
        for token in [t for t, (_, exp) in self._offers.items() if exp < now]:
            del self._offers[token]

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                continue
            except zmq.ZMQError:
                break
            try:
                self._handle(frames)
            except zmq.ZMQError:
                continue  # peer vanished mid-reply; it will re-request

    def _handle(self, frames: list[bytes]) -> None:
        if len(frames) != 5 or frames[1] != _GET:
            if frames:
                self._sock.send_multipart([frames[0], b"", _ERR, b"malformed request"])
            return
        ident, _, token, chunk_raw, idx_raw = frames[0], frames[1], frames[2], frames[3], frames[4]
        with self._lock:
            offer = self._offers.get(token)
        if offer is None or len(chunk_raw) != 8 or len(idx_raw) % 4:
            self._sock.send_multipart([ident, token, _ERR, b"unknown token or malformed request"])
            return
        data = offer[0]
        chunk_bytes = struct.unpack("<Q", chunk_raw)[0]
        if chunk_bytes == 0:
            self._sock.send_multipart([ident, token, _ERR, b"chunk size 0"])
            return
        ranges = chunk_ranges(data.nbytes, chunk_bytes)
        self.requests_served += 1
        for index in np.frombuffer(idx_raw, dtype="<u4").tolist():
            if index >= len(ranges):
                self._sock.send_multipart([ident, token, _ERR, f"chunk {index} out of range".encode()])
                return
            self._send_chunk(ident, token, data, index, ranges)

    def _send_chunk(self, ident: bytes, token: bytes, data: np.ndarray, index: int,
                    ranges: list[tuple[int, int]]) -> None:
        off, n = ranges[index]
        # copy=False: zmq sends straight from the offered array (no Python-side copy).
        self._sock.send_multipart([ident, token, _DATA, _CHUNK_HDR.pack(index, len(ranges), off),
                                   data[off: off + n]], copy=False)

    def close(self) -> None:
        """Stop the server thread and close the socket."""
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close(0)

    def __enter__(self) -> "BulkServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def fetch_bulk(msg_or_uri: TensorPayload | str, total_bytes: int | None = None, sha256: str | None = None, *,
               limits: TransferLimits | None = None, chunk_bytes: int = DEFAULT_BULK_CHUNK_BYTES,
               window: int = DEFAULT_BULK_WINDOW, idle_timeout_s: float = 2.0, max_retries: int = 5,
               context: zmq.Context | None = None) -> np.ndarray:
    """Fetch a payload from a BulkServer: caps first, windowed chunks, resume, sha256 check.

    Given a TensorPayload control message, its header is validated (``check_header``)
    before connecting. Returns the payload bytes (uint8 array).
    """
    limits = limits or TransferLimits()
    if isinstance(msg_or_uri, str):
        uri = msg_or_uri
        if total_bytes is None or sha256 is None:
            raise ValueError("fetch_bulk(uri) needs total_bytes and sha256")
        if total_bytes > limits.max_total_bytes:
            raise PayloadRejected(f"bulk payload {total_bytes} bytes exceeds cap {limits.max_total_bytes}")
    else:
        check_header(msg_or_uri, limits)
        if not msg_or_uri.bulk_uri:
            raise ValueError(f"payload {msg_or_uri.payload_id!r} has no bulk_uri")
        uri, total_bytes, sha256 = msg_or_uri.bulk_uri, int(msg_or_uri.total_bytes), msg_or_uri.sha256
    if chunk_bytes <= 0 or chunk_bytes > limits.max_chunk_bytes or window < 1:
        raise ValueError(f"invalid chunk_bytes={chunk_bytes} / window={window}")
    endpoint, token = parse_bulk_uri(uri)
    ranges = chunk_ranges(total_bytes, chunk_bytes)
    buf = np.empty(total_bytes, dtype=np.uint8)
    received: set[int] = set()
    hasher = hashlib.sha256()
    hashed_upto = 0  # chunks hashed in order while the rest are on the wire
    ctx = context or zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 4 * window)
    sock.connect(endpoint)
    chunk_raw = struct.pack("<Q", chunk_bytes)
    try:
        retries = 0
        while len(received) < len(ranges):
            todo = [i for i in range(len(ranges)) if i not in received]
            queue = deque(todo)
            outstanding = 0
            while queue or outstanding:
                while queue and outstanding < window:
                    batch = [queue.popleft() for _ in range(min(window - outstanding, len(queue)))]
                    sock.send_multipart([_GET, token, chunk_raw, np.asarray(batch, dtype="<u4").tobytes()])
                    outstanding += len(batch)
                if not sock.poll(int(idle_timeout_s * 1000)):
                    break  # stalled: re-request what is missing
                frames = sock.recv_multipart(copy=False)
                if len(frames) >= 3 and frames[1].bytes == _ERR:
                    raise PayloadRejected(f"bulk server refused {uri}: {frames[2].bytes.decode(errors='replace')}")
                if len(frames) != 4 or frames[1].bytes != _DATA or len(frames[2].bytes) != _CHUNK_HDR.size:
                    raise PayloadRejected(f"malformed bulk reply from {endpoint}")
                index, count, off = _CHUNK_HDR.unpack(frames[2].bytes)
                data = frames[3].buffer
                if count != len(ranges) or index >= count or ranges[index] != (off, len(data)):
                    raise PayloadRejected(f"bulk chunk {index}/{count} at {off} (+{len(data)}) does not match "
                                          f"the expected layout of {total_bytes} bytes")
                outstanding -= 1
                if index in received:
                    continue
                buf[off: off + len(data)] = np.frombuffer(data, dtype=np.uint8)
                received.add(index)
                # Hash in index order as soon as possible; later chunks are on the wire meanwhile.
                while hashed_upto in received:
                    o, n = ranges[hashed_upto]
                    hasher.update(memoryview(buf)[o: o + n])
                    hashed_upto += 1
            if len(received) < len(ranges):
                retries += 1
                if retries > max_retries:
                    raise TimeoutError(f"bulk fetch {uri}: {len(ranges) - len(received)} chunks missing after "
                                       f"{max_retries} resume attempts")
    finally:
        sock.close(0)
    digest = hasher.hexdigest()
    if digest != sha256:
        raise PayloadRejected(f"bulk payload {uri}: sha256 mismatch (got {digest}, expected {sha256})")
    return buf


# --------------------------------------------------------------- Fast DDS profile

FASTDDS_PROFILE_NAME = "fastdds_shm.xml"


def fastdds_profile_path() -> Path | None:
    """The Fast DDS shared-memory profile shipped with fed_ros, if it exists."""
    candidates = [Path(__file__).resolve().parents[3] / "config" / FASTDDS_PROFILE_NAME]
    try:
        from ament_index_python.packages import get_package_share_directory

        candidates.append(Path(get_package_share_directory("fed_ros")) / "config" / FASTDDS_PROFILE_NAME)
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
