"""Chunked ROS 2 payloads: the sending and assembling halves, size caps, integrity, resume.

- ``ChunkedSender`` (``chunk_sender.py``) turns an ``EncodedPayload`` into ``TensorPayload``
  chunks (zero-copy views) and resends only requested ones.
- ``PayloadAssembler`` (``chunk_assembler.py``) collects chunks by payload_id with size caps
  checked before any byte is accepted, verifies sha256 on completion, reports missing chunks
  after a timeout and accepts the resent ones.
- ``apply_fastdds_profile`` (``fastdds_profile.py``) opts a process into the shared-memory profile.

This module re-exports those names for the many callers that use several of them. The zmq bulk
channel is in ``bulk.py``; the sender/receiver objects both nodes use (channel choice, the one
payload check, acknowledgement bookkeeping) are in ``transfer.py``. Which path is the default
for large payloads is decided by measurement (``fed-ros bench transfer``; numbers quoted at
``DEFAULT_TRANSPORT``).
"""
from __future__ import annotations

from fed_ros.ros.wire.chunk_assembler import (DEFAULT_MAX_CHUNK_BYTES, DEFAULT_MAX_CHUNKS, DEFAULT_MAX_MANIFEST_TENSORS,
                                              DEFAULT_MAX_TOTAL_BYTES, ChunkDropped, CompletePayload, PayloadAssembler,
                                              PayloadRejected, TransferLimits, check_header, decode_resend_request,
                                              encode_resend_request)
from fed_ros.ros.wire.chunk_sender import (BULK_THRESHOLD_BYTES, ChunkedSender, DEFAULT_CHUNK_BYTES,
                                           DEFAULT_TRANSPORT, MAX_PAYLOAD_ID, chunk_digests,
                                           transfer_digest_of)
from fed_ros.ros.wire.fastdds_profile import FASTDDS_PROFILE_NAME, apply_fastdds_profile, fastdds_profile_path

__all__ = [
    "BULK_THRESHOLD_BYTES", "DEFAULT_CHUNK_BYTES", "DEFAULT_MAX_CHUNKS", "DEFAULT_MAX_CHUNK_BYTES",
    "DEFAULT_MAX_MANIFEST_TENSORS", "DEFAULT_MAX_TOTAL_BYTES", "DEFAULT_TRANSPORT", "FASTDDS_PROFILE_NAME",
    "MAX_PAYLOAD_ID", "ChunkDropped", "ChunkedSender", "CompletePayload", "PayloadAssembler", "PayloadRejected",
    "TransferLimits", "apply_fastdds_profile", "check_header", "chunk_digests", "decode_resend_request",
    "encode_resend_request", "fastdds_profile_path", "transfer_digest_of",
]
