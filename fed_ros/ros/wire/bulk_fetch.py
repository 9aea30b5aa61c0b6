"""The fetching side of the zmq bulk channel: ``BulkFetch`` pulls one offered payload.

A ``BulkFetch`` (DEALER) checks the size cap first, pulls chunks with a bounded window straight
into the payload buffer (``recv_into``: one copy out of zmq's frame, none in Python), hashes
them in order on a worker thread while the next ones arrive, re-requests missing chunks,
verifies sha256, and keeps what it received so a later ``run`` resumes instead of starting over.
It stands apart from the server (:mod:`fed_ros.ros.wire.bulk`, which also holds the protocol
both sides speak) because the receiver of a payload needs only this side.
"""

from __future__ import annotations

import hashlib
import queue
import struct
import threading
from collections import deque

import numpy as np
import zmq

from fed_ros.msg import TensorPayload
from fed_ros.ros.wire.bulk import (
    CHUNK_HEADER,
    DATA_FRAME,
    DEFAULT_BULK_CHUNK_BYTES,
    DEFAULT_BULK_WINDOW,
    ERR_FRAME,
    GET_FRAME,
    parse_bulk_uri,
)
from fed_ros.ros.wire.chunk_assembler import PayloadRejected, TransferLimits, check_header
from fed_ros.ros.wire.tensors import chunk_ranges


class BulkUnreachable(TimeoutError):
    """The bulk server named in a bulk_uri did not answer (host/port unreachable or offer gone)."""


class BulkFetch:
    """One payload pulled from a BulkServer.

    ``run`` again after a failure resumes the missing chunks.
    """

    def __init__(
        self,
        msg_or_uri: TensorPayload | str,
        total_bytes: int | None = None,
        sha256: str | None = None,
        *,
        limits: TransferLimits | None = None,
        chunk_bytes: int = DEFAULT_BULK_CHUNK_BYTES,
        window: int = DEFAULT_BULK_WINDOW,
    ) -> None:
        limits = limits or TransferLimits()
        if isinstance(msg_or_uri, str):
            uri = msg_or_uri
            if total_bytes is None or sha256 is None:
                raise ValueError("fetch_bulk(uri) needs total_bytes and sha256")
            if total_bytes > limits.max_total_bytes:
                raise PayloadRejected(
                    f"bulk payload {total_bytes} bytes exceeds cap {limits.max_total_bytes}",
                    "oversize",
                )
        else:
            check_header(msg_or_uri, limits)  # caps before connecting or allocating
            if not msg_or_uri.bulk_uri:
                raise ValueError(f"payload {msg_or_uri.payload_id!r} has no bulk_uri")
            uri, total_bytes, sha256 = (
                msg_or_uri.bulk_uri,
                int(msg_or_uri.total_bytes),
                msg_or_uri.sha256,
            )
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

    def run(
        self,
        *,
        idle_timeout_s: float = 2.0,
        max_retries: int = 5,
        context: zmq.Context | None = None,
    ) -> np.ndarray:
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
        hasher = threading.Thread(
            target=self._hash_in_order, args=(arrived,), name="fed_ros-bulk-sha256", daemon=True
        )
        hasher.start()
        try:
            retries = 0
            while self.missing:
                progressed = self._pull(sock, idle_timeout_s, arrived)
                if self.missing:
                    retries = 0 if progressed else retries + 1
                    if retries > max_retries:
                        what = (
                            f"{self.missing} of {len(self.ranges)} chunks missing"
                            if self.ever_answered
                            else "no answer at all (host or port unreachable from here, "
                            "or a firewall)"
                        )
                        raise BulkUnreachable(
                            f"bulk server {self.endpoint} unreachable: {what} after "
                            f"{max_retries + 1} requests of {idle_timeout_s:g} s"
                        )
        finally:
            arrived.put(None)
            hasher.join()  # everything received so far is hashed: a later run resumes from here
            sock.close(0)
        digest = self._hasher.hexdigest()
        if digest != self.sha256:
            raise PayloadRejected(
                f"bulk payload from {self.endpoint}: sha256 mismatch (got {digest}, "
                f"expected {self.sha256})",
                "digest_mismatch",
            )
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
                self._hasher.update(view[o : o + n])
                self._hashed_upto += 1
            if stop:
                return

    def _pull(
        self, sock: zmq.Socket, idle_timeout_s: float, arrived: "queue.SimpleQueue[int | None]"
    ) -> bool:
        """One pass over the missing chunks; True if any arrived."""
        queue_ = deque(i for i in range(len(self.ranges)) if i not in self.received)
        outstanding, progressed = 0, False
        while queue_ or outstanding:
            while queue_ and outstanding < self.window:
                batch = [
                    queue_.popleft() for _ in range(min(self.window - outstanding, len(queue_)))
                ]
                sock.send_multipart(
                    [
                        GET_FRAME,
                        self._token,
                        self._chunk_raw,
                        np.asarray(batch, dtype="<u4").tobytes(),
                    ]
                )
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
        if len(head) == 3 and head[1] == ERR_FRAME and not sock.getsockopt(zmq.RCVMORE):
            raise PayloadRejected(
                f"bulk server {self.endpoint} refused: {head[2].decode(errors='replace')}"
            )
        if (
            len(head) != 3
            or head[0] != self._token
            or head[1] != DATA_FRAME
            or len(head[2]) != CHUNK_HEADER.size
            or not sock.getsockopt(zmq.RCVMORE)
        ):
            raise PayloadRejected(f"malformed bulk reply from {self.endpoint}")
        index, count, off = CHUNK_HEADER.unpack(head[2])
        if count != len(self.ranges) or index >= count or self.ranges[index][0] != off:
            raise PayloadRejected(
                f"bulk chunk {index}/{count} at {off} from {self.endpoint} "
                f"does not match the expected layout of {self.buf.nbytes} bytes"
            )
        o, n = self.ranges[index]
        duplicate = index in self.received
        if duplicate or not n:
            got = len(sock.recv(copy=False))
        else:
            got = sock.recv_into(self._view[o : o + n])  # one copy, from zmq's frame into place
        if got != n or sock.getsockopt(zmq.RCVMORE):
            raise PayloadRejected(
                f"bulk chunk {index}/{count} at {off} (+{got}) from {self.endpoint} "
                f"does not match the expected layout of {self.buf.nbytes} bytes"
            )
        return None if duplicate else index


def fetch_bulk(
    msg_or_uri: TensorPayload | str,
    total_bytes: int | None = None,
    sha256: str | None = None,
    *,
    limits: TransferLimits | None = None,
    chunk_bytes: int = DEFAULT_BULK_CHUNK_BYTES,
    window: int = DEFAULT_BULK_WINDOW,
    idle_timeout_s: float = 2.0,
    max_retries: int = 5,
    context: zmq.Context | None = None,
) -> np.ndarray:
    """Fetch a payload from a BulkServer in one go (see BulkFetch); returns the verified bytes."""
    fetch = BulkFetch(
        msg_or_uri, total_bytes, sha256, limits=limits, chunk_bytes=chunk_bytes, window=window
    )
    return fetch.run(idle_timeout_s=idle_timeout_s, max_retries=max_retries, context=context)
