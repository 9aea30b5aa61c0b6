"""The chunk-resume request: which chunks of a payload a receiver asks its sender for again.

A receiver that misses chunks (a best-effort loss, a link outage) publishes this small JSON body
in a std_msgs/String on the sender's resend topic; the sender answers with only those chunks.
It stands apart from the assembler because both ends use it (the assembler's owner builds
requests, the sender and the scripted robots parse them), and its parser faces any peer on the
domain: a malformed or oversized request is refused with the text named.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from fed_ros.ros.wire.chunk_assembler import DEFAULT_MAX_CHUNKS


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
