"""The zmq bulk channel: tensor bytes pulled over TCP while the control plane stays in ROS 2.

``BulkServer`` (ROUTER, background thread) offers a payload under a random 128-bit token;
the ROS control message (signed when keys are configured) carries ``bulk_uri`` =
``tcp://host:port/<token>``, so only a party that received that message can fetch. A
``BulkFetch`` (DEALER) checks the size cap first, pulls chunks with a bounded window straight
into the payload buffer (``recv_into``: one copy out of zmq's frame, none in Python), hashes
them in order on a worker thread while the next ones arrive, re-requests missing chunks,
verifies sha256, and keeps what it received so a later ``run`` resumes instead of starting over.

Where the server binds (docs/transport.md, "Across machines"): an explicit ``bind`` argument,
else ``FED_ROS_BULK_BIND``, else the advertised host ``FED_ROS_BULK_HOST`` when it is an
address of this machine (0.0.0.0 when it is not, e.g. a NAT or DNS name), else loopback.
"""
from __future__ import annotations

import hashlib
import os
import queue
import secrets
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np
import zmq

from fed_ros.msg import TensorPayload
from fed_ros.ros.wire.tensors import chunk_ranges
from fed_ros.ros.wire.chunk_assembler import PayloadRejected, TransferLimits, check_header

# Chunk size on the zmq bulk channel (frames are sent with copy=False; the receiver
# hashes chunk i on its hashing thread while chunk i+1 is received). sha256 (13.5 ms for
# 21.5 MB here) costs more than the loopback transfer itself (~10 ms), so overlap is what
# matters. Measured, 21.5 MB fetched from another process, median of 8 (ms), 2-core machine
# under load: 1 MiB 15.5 | 2 MiB 16.3 | 4 MiB 19.8 | 8 MiB 20.5 | one frame 24.9; no hashing
# 6.8. With the hashing thread (load ~4): 1 MiB 28.9 | 2 MiB 31.9 | 4 MiB 40.2 ms.
DEFAULT_BULK_CHUNK_BYTES = 1 << 20
# Chunks requested at once on the bulk channel (flow control; bounds sender queue memory
# to window x chunk size per fetcher).
DEFAULT_BULK_WINDOW = 16

_GET = b"GET"
_DATA = b"DATA"
_ERR = b"ERR"
_CHUNK_HDR = struct.Struct("<IIQ")  # index, count, offset


class BulkUnreachable(TimeoutError):
    """The bulk server named in a bulk_uri did not answer (host/port unreachable or offer gone)."""


def parse_bulk_uri(uri: str) -> tuple[str, bytes]:
    """'tcp://host:port/<token>' -> (zmq endpoint, token)."""
    if not uri.startswith("tcp://") or uri.count("/") != 3:
        raise ValueError(f"bulk_uri must look like tcp://host:port/<token>, got {uri!r}")
    endpoint, token = uri.rsplit("/", 1)
    if not token:
        raise ValueError(f"bulk_uri has no token: {uri!r}")
    return endpoint, token.encode()


def _is_local_address(ip: str) -> bool:
    try:
        with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


def bulk_bind_endpoint(bind: str | None = None, advertise_host: str | None = None,
                       env: Mapping[str, str] | None = None) -> str:
    """The zmq endpoint a BulkServer binds: explicit, FED_ROS_BULK_BIND, the advertised host, or loopback.

    With only ``FED_ROS_BULK_HOST`` set (what docs/fleet.md tells a fleet to set) the server
    must be reachable at that host: bind its address when it is one of this machine's,
    else every interface (the advertised name is then a NAT/DNS name for this machine).
    """
    env = os.environ if env is None else env
    if bind:
        return bind
    if env.get("FED_ROS_BULK_BIND"):
        return env["FED_ROS_BULK_BIND"]
    host = advertise_host or env.get("FED_ROS_BULK_HOST")
    if not host:
        return "tcp://127.0.0.1:*"
    try:
        ip = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]
    except OSError:
        return "tcp://0.0.0.0:*"
    if _is_local_address(ip):
        return f"tcp://[{ip}]:*" if ":" in ip else f"tcp://{ip}:*"
    return "tcp://0.0.0.0:*"


class BulkServer:
    """Serves offered payloads to fetchers over a zmq ROUTER socket (background thread).

    A payload is reachable only with its per-offer random token, which travels only in the
    (signed) ROS control message; offers expire after ``ttl_s`` so memory stays bounded.
    """

    def __init__(self, bind: str | None = None, advertise_host: str | None = None,
                 context: zmq.Context | None = None, ttl_s: float = 120.0) -> None:
        advertise_host = advertise_host or os.environ.get("FED_ROS_BULK_HOST") or None
        bind = bulk_bind_endpoint(bind, advertise_host)
        self._ctx = context or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        if bind.startswith("tcp://["):
            self._sock.setsockopt(zmq.IPV6, 1)
        # Unknown peers raise instead of silently dropping; bounded queue per peer.
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.setsockopt(zmq.SNDHWM, 4 * DEFAULT_BULK_WINDOW)
        # A fetcher that stops reading must not block the serving thread for everyone else:
        # after this many ms the send fails, the request is dropped and the fetcher resumes.
        self._sock.setsockopt(zmq.SNDTIMEO, 5000)
        try:
            self._sock.bind(bind)
        except zmq.ZMQError as exc:
            self._sock.close(0)
            raise ValueError(f"bulk server cannot bind {bind!r}: {exc}") from exc
        self.bind_endpoint = self._sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        host, port = self.bind_endpoint.rsplit(":", 1)
        local = host.split("//", 1)[1]
        if not advertise_host:
            advertise_host = socket.gethostname() if local in ("0.0.0.0", "[::]") else local
        self.endpoint = f"tcp://{advertise_host}:{port}"
        self.ttl_s = ttl_s
        self._offers: dict[bytes, tuple[np.ndarray, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.requests_served = 0
        self.refused = 0  # requests with an unknown token (wrong party, or an expired offer)
        self._thread = threading.Thread(target=self._serve, name="fed_ros-bulk", daemon=True)
        self._thread.start()

    def offer(self, data: np.ndarray | bytes) -> str:
        """Make ``data`` fetchable (not copied: keep it unchanged); returns its bulk_uri (with a new secret)."""
        arr = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
        if arr.dtype != np.uint8 or arr.ndim != 1 or not arr.flags.c_contiguous:
            raise ValueError("bulk payload must be a contiguous 1-D uint8 array or bytes")
        token = secrets.token_hex(16).encode()  # 128 random bits per transfer
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
        ident, token, chunk_raw, idx_raw = frames[0], frames[2], frames[3], frames[4]
        with self._lock:
            offer = self._offers.get(token)
        if offer is None or len(chunk_raw) != 8 or len(idx_raw) % 4:
            self.refused += offer is None
            # The secret is checked before a single byte is served.
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


class BulkFetch:
    """One payload pulled from a BulkServer; ``run`` again after a failure resumes the missing chunks."""

    def __init__(self, msg_or_uri: TensorPayload | str, total_bytes: int | None = None, sha256: str | None = None,
                 *, limits: TransferLimits | None = None, chunk_bytes: int = DEFAULT_BULK_CHUNK_BYTES,
                 window: int = DEFAULT_BULK_WINDOW) -> None:
        limits = limits or TransferLimits()
        if isinstance(msg_or_uri, str):
            uri = msg_or_uri
            if total_bytes is None or sha256 is None:
                raise ValueError("fetch_bulk(uri) needs total_bytes and sha256")
            if total_bytes > limits.max_total_bytes:
                raise PayloadRejected(f"bulk payload {total_bytes} bytes exceeds cap {limits.max_total_bytes}",
                                      "oversize")
        else:
            check_header(msg_or_uri, limits)  # caps before connecting or allocating
            if not msg_or_uri.bulk_uri:
                raise ValueError(f"payload {msg_or_uri.payload_id!r} has no bulk_uri")
            uri, total_bytes, sha256 = msg_or_uri.bulk_uri, int(msg_or_uri.total_bytes), msg_or_uri.sha256
        if chunk_bytes <= 0 or chunk_bytes > limits.max_chunk_bytes or window < 1:
            raise ValueError(f"invalid chunk_bytes={chunk_bytes} / window={window}")
        self.uri = uri
        self.endpoint, self._token = parse_bulk_uri(uri)
        self.sha256 = sha256
        self.window = window
        self._chunk_raw = struct.pack("<Q", chunk_bytes)
        self.ranges = chunk_ranges(total_bytes, chunk_bytes)
        self.buf = np.empty(total_bytes, dtype=np.uint8)
        self._view = memoryview(self.buf)
        self.received: set[int] = set()
        self._hasher = hashlib.sha256()
        self._hashed_upto = 0  # chunks hashed in order while the rest are on the wire
        self.ever_answered = False

    @property
    def missing(self) -> int:
        """Chunks not received yet."""
        return len(self.ranges) - len(self.received)

    def run(self, *, idle_timeout_s: float = 2.0, max_retries: int = 5,
            context: zmq.Context | None = None) -> np.ndarray:
        """Pull the missing chunks; returns the verified bytes.

        Raises BulkUnreachable naming the endpoint when it does not answer (this object keeps
        what arrived: call ``run`` again to resume), PayloadRejected on a refusal or bad bytes.
        """
        ctx = context or zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 4 * self.window)
        sock.connect(self.endpoint)
        # sha256 runs on its own thread (hashlib releases the GIL on large buffers) in chunk
        # order while this thread receives the next chunks straight into the buffer.
        arrived: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        hasher = threading.Thread(target=self._hash_in_order, args=(arrived,), name="fed_ros-bulk-sha256",
                                  daemon=True)
        hasher.start()
        try:
            retries = 0
            while self.missing:
                progressed = self._pull(sock, idle_timeout_s, arrived)
                if self.missing:
                    retries = 0 if progressed else retries + 1
                    if retries > max_retries:
                        what = (f"{self.missing} of {len(self.ranges)} chunks missing" if self.ever_answered
                                else "no answer at all (host or port unreachable from here, or a firewall)")
                        raise BulkUnreachable(f"bulk server {self.endpoint} unreachable: {what} after "
                                              f"{max_retries + 1} requests of {idle_timeout_s:g} s")
        finally:
            arrived.put(None)
            hasher.join()  # everything received so far is hashed: a later run resumes from here
            sock.close(0)
        digest = self._hasher.hexdigest()
        if digest != self.sha256:
            raise PayloadRejected(f"bulk payload from {self.endpoint}: sha256 mismatch (got {digest}, "
                                  f"expected {self.sha256})", "digest_mismatch")
        return self.buf

    def _hash_in_order(self, arrived: "queue.SimpleQueue[int | None]") -> None:
        """Worker thread: hash chunks in index order as they complete (None: finish and return)."""
        view = memoryview(self.buf)
        while True:
            stop = arrived.get() is None
            # A chunk's index enters ``received`` only after all its bytes are in the buffer,
            # and a received chunk's bytes are never written again.
            while self._hashed_upto in self.received:
                o, n = self.ranges[self._hashed_upto]
                self._hasher.update(view[o: o + n])
                self._hashed_upto += 1
            if stop:
                return

    def _pull(self, sock: zmq.Socket, idle_timeout_s: float, arrived: "queue.SimpleQueue[int | None]") -> bool:
        """One pass over the missing chunks; True if any arrived."""
        queue_ = deque(i for i in range(len(self.ranges)) if i not in self.received)
        outstanding, progressed = 0, False
        while queue_ or outstanding:
            while queue_ and outstanding < self.window:
                batch = [queue_.popleft() for _ in range(min(self.window - outstanding, len(queue_)))]
                sock.send_multipart([_GET, self._token, self._chunk_raw, np.asarray(batch, dtype="<u4").tobytes()])
                outstanding += len(batch)
            if not sock.poll(int(idle_timeout_s * 1000)):
                return progressed  # stalled: the caller re-requests what is missing
            index = self._recv_chunk(sock)
            outstanding -= 1
            if index is not None:
                self.received.add(index)
                arrived.put(index)
                progressed = True
        return progressed

    def _recv_chunk(self, sock: zmq.Socket) -> int | None:
        """Receive one reply: its data goes straight into the buffer (no intermediate copy).

        Returns the chunk index, or None for a duplicate (dropped without touching the buffer:
        its bytes may already be hashed). Raises PayloadRejected on a refusal or a bad reply.
        """
        head = [sock.recv()]  # token, kind, chunk header (small frames)
        while len(head) < 3 and sock.getsockopt(zmq.RCVMORE):
            head.append(sock.recv())
        self.ever_answered = True
        if len(head) == 3 and head[1] == _ERR and not sock.getsockopt(zmq.RCVMORE):
            raise PayloadRejected(f"bulk server {self.endpoint} refused: {head[2].decode(errors='replace')}")
        if (len(head) != 3 or head[0] != self._token or head[1] != _DATA or len(head[2]) != _CHUNK_HDR.size
                or not sock.getsockopt(zmq.RCVMORE)):
            raise PayloadRejected(f"malformed bulk reply from {self.endpoint}")
        index, count, off = _CHUNK_HDR.unpack(head[2])
        if count != len(self.ranges) or index >= count or self.ranges[index][0] != off:
            raise PayloadRejected(f"bulk chunk {index}/{count} at {off} from {self.endpoint} "
                                  f"does not match the expected layout of {self.buf.nbytes} bytes")
        o, n = self.ranges[index]
        duplicate = index in self.received
        if duplicate or not n:
            got = len(sock.recv(copy=False))
        else:
            got = sock.recv_into(self._view[o: o + n])  # one copy, from zmq's frame into place
        if got != n or sock.getsockopt(zmq.RCVMORE):
            raise PayloadRejected(f"bulk chunk {index}/{count} at {off} (+{got}) from {self.endpoint} "
                                  f"does not match the expected layout of {self.buf.nbytes} bytes")
        return None if duplicate else index


def fetch_bulk(msg_or_uri: TensorPayload | str, total_bytes: int | None = None, sha256: str | None = None, *,
               limits: TransferLimits | None = None, chunk_bytes: int = DEFAULT_BULK_CHUNK_BYTES,
               window: int = DEFAULT_BULK_WINDOW, idle_timeout_s: float = 2.0, max_retries: int = 5,
               context: zmq.Context | None = None) -> np.ndarray:
    """Fetch a payload from a BulkServer in one go (see BulkFetch); returns the verified bytes."""
    fetch = BulkFetch(msg_or_uri, total_bytes, sha256, limits=limits, chunk_bytes=chunk_bytes, window=window)
    return fetch.run(idle_timeout_s=idle_timeout_s, max_retries=max_retries, context=context)
