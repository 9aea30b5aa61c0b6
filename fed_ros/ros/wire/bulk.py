"""The zmq bulk channel: tensor bytes pulled over TCP while the control plane stays in ROS 2.

This module holds the channel's protocol (frames, chunk header, ``bulk_uri`` format, default
chunk size and window) and its serving side. ``BulkServer`` (ROUTER, background thread) offers
a payload under a random 128-bit token; the ROS control message (signed when keys are
configured) carries ``bulk_uri`` = ``tcp://host:port/<token>``, so only a party that received
that message can fetch. The fetching side, ``BulkFetch``, is :mod:`fed_ros.ros.wire.bulk_fetch`.

Where the server binds (docs/transport.md, "Across machines"): an explicit ``bind`` argument,
else ``FED_ROS_BULK_BIND``, else the advertised host ``FED_ROS_BULK_HOST`` when it is an
address of this machine (0.0.0.0 when it is not, e.g. a NAT or DNS name), else loopback.
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import zmq

from fed_ros.ros.wire.tensors import chunk_ranges

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

# The frames of the channel's protocol, shared by the server here and the fetcher
# (bulk_fetch.py): a request is [GET_FRAME, token, chunk size, chunk indices]; each reply is
# [token, DATA_FRAME, CHUNK_HEADER, chunk bytes] or [token, ERR_FRAME, reason].
GET_FRAME = b"GET"
DATA_FRAME = b"DATA"
ERR_FRAME = b"ERR"
CHUNK_HEADER = struct.Struct("<IIQ")  # index, count, offset


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
        with socket.socket(
            socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM
        ) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


def bulk_bind_endpoint(
    bind: str | None = None, advertise_host: str | None = None, env: Mapping[str, str] | None = None
) -> str:
    """The zmq endpoint a BulkServer binds.

    In order: explicit, FED_ROS_BULK_BIND, the advertised host, or loopback.

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

    def __init__(
        self,
        bind: str | None = None,
        advertise_host: str | None = None,
        context: zmq.Context | None = None,
        ttl_s: float = 120.0,
    ) -> None:
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
        """Make ``data`` fetchable; returns its bulk_uri (with a new secret).

        ``data`` is not copied: keep it unchanged while it is offered.
        """
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
        if len(frames) != 5 or frames[1] != GET_FRAME:
            if frames:
                self._sock.send_multipart([frames[0], b"", ERR_FRAME, b"malformed request"])
            return
        ident, token, chunk_raw, idx_raw = frames[0], frames[2], frames[3], frames[4]
        with self._lock:
            offer = self._offers.get(token)
        if offer is None or len(chunk_raw) != 8 or len(idx_raw) % 4:
            self.refused += offer is None
            # The secret is checked before a single byte is served.
            self._sock.send_multipart(
                [ident, token, ERR_FRAME, b"unknown token or malformed request"]
            )
            return
        data = offer[0]
        chunk_bytes = struct.unpack("<Q", chunk_raw)[0]
        if chunk_bytes == 0:
            self._sock.send_multipart([ident, token, ERR_FRAME, b"chunk size 0"])
            return
        ranges = chunk_ranges(data.nbytes, chunk_bytes)
        self.requests_served += 1
        for index in np.frombuffer(idx_raw, dtype="<u4").tolist():
            if index >= len(ranges):
                self._sock.send_multipart(
                    [ident, token, ERR_FRAME, f"chunk {index} out of range".encode()]
                )
                return
            self._send_chunk(ident, token, data, index, ranges)

    def _send_chunk(
        self,
        ident: bytes,
        token: bytes,
        data: np.ndarray,
        index: int,
        ranges: list[tuple[int, int]],
    ) -> None:
        off, n = ranges[index]
        # copy=False: zmq sends straight from the offered array (no Python-side copy).
        self._sock.send_multipart(
            [
                ident,
                token,
                DATA_FRAME,
                CHUNK_HEADER.pack(index, len(ranges), off),
                data[off : off + n],
            ],
            copy=False,
        )

    def close(self) -> None:
        """Stop the server thread and close the socket."""
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close(0)

    def __enter__(self) -> "BulkServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
