"""The sending half of a chunked ROS 2 payload: ``ChunkedSender`` and the size/path defaults.

``ChunkedSender`` turns an ``EncodedPayload`` into ``TensorPayload`` chunks (zero-copy views),
each carrying the per-chunk SHA-256 list, and resends only requested ones. The receiving half
is in ``chunk_assembler.py``; ``transport.py`` re-exports both.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence

import numpy as np

from fed_ros.msg import TensorPayload
from fed_ros.ros.wire.tensors import (
    EncodedPayload,
    bytes_view,
    chunk_ranges,
    manifest_to_msgs,
    payload_chunk,
    set_bytes_field,
)

# Chunk size of ROS 2 payload chunks. `fed-ros bench transfer --chunk-sweep`, 21.5 MB,
# x raw pyzmq, default / SHM profile: 1 MiB 0.15/0.22, 2 MiB 0.25/0.35, 4 MiB 0.30/0.37,
# 8 MiB 0.15/0.35, unchunked 0.06/0.09. 4 MiB is fastest and a lost chunk is cheap to resend.
DEFAULT_CHUNK_BYTES = 4 << 20
# Default path for large payloads, chosen by `fed-ros bench transfer` (docs/transport.md).
# 21.5 MB robot -> server, two processes, x raw pyzmq (runs at load ~3 | ~14 | ~6, 2 cores):
# ROS 2 default 4 MiB chunks 0.30 | 0.28 | 0.21, unchunked 0.06; ROS 2 + SHM profile
# 0.37 | 0.24 | 0.58 (one host only); zmq bulk with ROS control message, sha256 verified,
# 0.70 | 1.06 | 0.62: the only path at >= 0.5x in every run, and it works across hosts.
DEFAULT_TRANSPORT = "zmq"
# Longest payload id (characters) a sender makes and a receiver accepts.
MAX_PAYLOAD_ID = 256


def chunk_digests(data: np.ndarray | bytes, total_bytes: int, chunk_bytes: int) -> bytes:
    """SHA-256 of each chunk's bytes, concatenated (TensorPayload.chunk_sha256)."""
    view = (
        memoryview(data).cast("B")
        if not isinstance(data, np.ndarray)
        else memoryview(bytes_view(data))
    )
    return b"".join(
        hashlib.sha256(view[o : o + n]).digest() for o, n in chunk_ranges(total_bytes, chunk_bytes)
    )


def transfer_digest_of(msg: TensorPayload) -> bytes:
    """signed_messages.transfer_digest of a chunk's header: what the sender's signature must
    cover."""
    from fed_ros.core.security.signed_messages import transfer_digest

    return transfer_digest(
        payload_id=msg.payload_id,
        encoding=int(msg.encoding),
        total_bytes=int(msg.total_bytes),
        chunk_count=int(msg.chunk_count),
        manifest=[(t.name, tuple(t.shape), t.dtype) for t in msg.manifest],
        scales=np.asarray(msg.scales, dtype="<f4").tobytes(),
        chunk_sha256=bytes(memoryview(msg.chunk_sha256)),
        bulk_uri=msg.bulk_uri,
    )


class ChunkedSender:
    """Splits one encoded payload into TensorPayload chunks; resends only requested ones."""

    def __init__(
        self,
        encoded: EncodedPayload,
        payload_id: str,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        bulk_uri: str = "",
    ) -> None:
        if not payload_id or len(payload_id) > MAX_PAYLOAD_ID:
            raise ValueError(
                f"payload_id must be 1..{MAX_PAYLOAD_ID} characters, got {payload_id!r}"
            )
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be > 0, got {chunk_bytes}")
        self.encoded = encoded
        self.payload_id = payload_id
        self.chunk_bytes = int(chunk_bytes)
        self.bulk_uri = bulk_uri
        self.chunk_count = (
            1 if bulk_uri else len(chunk_ranges(encoded.total_bytes, self.chunk_bytes))
        )
        # Built once and shared by every chunk (the manifest travels in each chunk).
        self._manifest_msgs = manifest_to_msgs(encoded.manifest)
        # Per-chunk SHA-256 list, in every chunk and signed with the header: a receiver checks each
        # chunk before keeping it (a bulk payload is fetched whole and checked against sha256).
        self.chunk_sha256 = (
            b"" if bulk_uri else chunk_digests(encoded.data, encoded.total_bytes, self.chunk_bytes)
        )

    def chunk(self, index: int) -> TensorPayload:
        """Chunk ``index`` (zero-copy view of the payload bytes)."""
        msg = payload_chunk(
            self.encoded,
            self.payload_id,
            index,
            self.chunk_bytes,
            bulk_uri=self.bulk_uri,
            manifest_msgs=self._manifest_msgs,
        )
        if self.chunk_sha256:
            set_bytes_field(msg, "chunk_sha256", np.frombuffer(self.chunk_sha256, dtype=np.uint8))
        return msg

    def transfer_digest(self) -> bytes:
        """signed_messages.transfer_digest of this payload's header (what the sender signs)."""
        return transfer_digest_of(self.chunk(0))

    def chunks(self) -> Iterator[TensorPayload]:
        """All chunks in order."""
        for i in range(self.chunk_count):
            yield self.chunk(i)

    def resend(self, indices: Sequence[int]) -> list[TensorPayload]:
        """The requested chunks only (a resume request); bad indices raise ValueError."""
        bad = [i for i in indices if not 0 <= int(i) < self.chunk_count]
        if bad:
            raise ValueError(
                f"payload {self.payload_id!r}: resend indices {bad} outside [0, {self.chunk_count})"
            )
        return [self.chunk(int(i)) for i in sorted(set(int(i) for i in indices))]
