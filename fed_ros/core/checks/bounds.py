"""Length bounds of every field a peer controls, checked before anything is stored, logged or
audited.

The .msg/.srv files declare the same bounds (``string<=256 robot_id``), but DDS does not
enforce them: measured with rclpy + Fast DDS (Kilted wheels), a publisher that bypasses the
Python setter (``msg._robot_id = "a" * 2**20``; field checks are off unless
ROS_PYTHON_CHECK_FIELDS is set) delivers a 1 MiB value into a ``string<=256`` field of the
subscriber. So every handler checks here first, and refers to the offending field by name
and length only (never echoing the oversized value).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

MAX_ID_CHARS = 256  # robot ids, payload ids, cluster/robot names
MAX_URI_CHARS = 512  # bulk_uri
MAX_REASON_CHARS = 1024  # RobotMetrics.reason, Register.reason
MAX_TASKS = 32
MAX_NAME_CHARS = 64  # task and camera names
MAX_CAMERAS = 8
NONCE_BYTES = 16
SIGNATURE_BYTES = 64
PUBLIC_KEY_BYTES = 32
SHA256_HEX_CHARS = 64
MAX_CHUNK_DIGEST_BYTES = 32 * 4096  # TensorPayload.chunk_sha256: 32 bytes x at most 4096 chunks
MAX_RESEND_REQUEST_CHARS = (
    64 * 1024
)  # a std_msgs/String resume request (JSON list of chunk indices)


def clip(text: Any, limit: int = 80) -> str:
    """``repr``-safe short form of a peer-controlled value for logs (length noted when cut)."""
    s = str(text)
    return s if len(s) <= limit else f"{s[:limit]}...(+{len(s) - limit} chars)"


def oversized(fields: Mapping[str, tuple[Any, int]]) -> str | None:
    """None if every ``name: (value, limit)`` has ``len(value) <= limit``, else a reason naming the
    first."""
    for name, (value, limit) in fields.items():
        try:
            n = len(value)
        except TypeError:
            return f"field {name} has no length ({type(value).__name__})"
        if n > limit:
            return f"field {name} has length {n} > bound {limit}"
    return None


def oversized_items(name: str, values: Iterable[Any], count: int, limit: int) -> str | None:
    """As :func:`oversized` for a sequence of strings: at most ``count`` items of at most
    ``limit``."""
    values = list(values) if not isinstance(values, (list, tuple)) else values
    if len(values) > count:
        return f"field {name} has {len(values)} items > bound {count}"
    for i, v in enumerate(values):
        if len(v) > limit:
            return f"field {name}[{i}] has length {len(v)} > bound {limit}"
    return None


class RateLimiter:
    """Token bucket: at most ``burst`` events at once, refilled at ``per_s`` events per second."""

    def __init__(self, per_s: float, burst: int) -> None:
        if per_s <= 0 or burst < 1:
            raise ValueError(f"rate limiter needs per_s > 0 and burst >= 1, got {per_s}, {burst}")
        self.per_s, self.burst = float(per_s), int(burst)
        self._tokens = float(burst)
        self._last: float | None = None
        self.refused = 0  # events refused so far (reported, never silently lost)

    def allow(self, now: float) -> bool:
        """Take one token at time ``now`` (seconds); False (and counted) when none is left."""
        if self._last is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.per_s)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.refused += 1
        return False
