"""Authenticated registration: proof that a registering robot holds its allow-listed key.

Design (timestamp + nonce, no extra round trip): the robot signs, with its private key,
the canonical bytes of everything its Register request claims (robot id, public key,
tasks, cameras, action dim, GPU flag, sample count) plus the time it sent the request
(``timestamp_ns``, Unix nanoseconds) and a fresh 16-byte nonce. The server accepts the
request only if

1. the robot id is on the allow-list and the presented key is the listed one,
2. the signature verifies under the listed key (not the presented one),
3. the timestamp is within ``window_s`` of the server's clock (robot and server clocks
   must agree to that: NTP/chrony on a fleet), and
4. the nonce was not used before inside the window.

So a recorded request cannot be replayed after ``window_s`` (freshness) nor inside it
(nonce), and whoever knows only a robot's public key can neither register it nor change
its capabilities. Nonces are remembered only for requests that passed the signature
check, so unknown senders cannot grow this state; it is capped at ``max_nonces`` (the
oldest are evicted and the freshness floor rises past them, so an evicted nonce can
never be replayed).
"""

from __future__ import annotations

import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fed_ros.core.security.auth import AllowList, Signer, verify_signature
from fed_ros.core.security.signed_messages import NONCE_BYTES, new_nonce

_TAG_REGISTER = b"fed_ros/register/v1"
MAX_TASKS = 32  # Register.srv bounds (string<=64[<=32], string<=64[<=8])
MAX_CAMERAS = 8
MAX_NAME_CHARS = 64
MAX_ID_CHARS = 256


def _text(value: str, what: str, limit: int) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    raw = value.encode("utf-8")
    if len(raw) > limit:
        raise ValueError(f"{what} longer than {limit} bytes: {value[:40]!r}...")
    return struct.pack("<H", len(raw)) + raw


def _texts(values: Sequence[str], what: str, count: int, limit: int) -> bytes:
    values = list(values)
    if len(values) > count:
        raise ValueError(f"{what}: {len(values)} entries > cap {count}")
    return struct.pack("<H", len(values)) + b"".join(_text(v, what, limit) for v in values)


@dataclass(frozen=True)
class RegistrationClaim:
    """Everything a Register request claims about the robot (what the signature covers)."""

    robot_id: str
    public_key: bytes
    tasks: tuple[str, ...] = ()
    cameras: tuple[str, ...] = ()
    action_dim: int = 0
    has_gpu: bool = False
    num_samples: int = 0

    def message(self, timestamp_ns: int, nonce: bytes) -> bytes:
        """Canonical bytes a robot signs for this claim at ``timestamp_ns`` with ``nonce``."""
        if not isinstance(timestamp_ns, int) or not 0 <= timestamp_ns < 2**63:
            raise ValueError(f"timestamp_ns must be an int in [0, 2**63), got {timestamp_ns!r}")
        if not isinstance(nonce, (bytes, bytearray)) or len(nonce) != NONCE_BYTES:
            raise ValueError(
                f"nonce must be {NONCE_BYTES} bytes, got "
                f"{len(nonce) if isinstance(nonce, (bytes, bytearray)) else type(nonce).__name__}"
            )
        if not 0 <= int(self.action_dim) < 2**32 or not 0 <= int(self.num_samples) < 2**64:
            raise ValueError(
                f"action_dim {self.action_dim} / num_samples {self.num_samples} out of range"
            )
        return b"".join(
            (
                _TAG_REGISTER,
                _text(self.robot_id, "robot id", MAX_ID_CHARS),
                struct.pack("<H", len(self.public_key)),
                bytes(self.public_key),
                _texts(self.tasks, "tasks", MAX_TASKS, MAX_NAME_CHARS),
                _texts(self.cameras, "cameras", MAX_CAMERAS, MAX_NAME_CHARS),
                struct.pack(
                    "<I?Qq",
                    int(self.action_dim),
                    bool(self.has_gpu),
                    int(self.num_samples),
                    int(timestamp_ns),
                ),
                bytes(nonce),
            )
        )


@dataclass(frozen=True)
class RegistrationProof:
    """What a robot adds to its Register request: time, nonce, signature."""

    timestamp_ns: int
    nonce: bytes
    signature: bytes


def sign_registration(
    signer: Signer,
    claim: RegistrationClaim,
    timestamp_ns: int | None = None,
    nonce: bytes | None = None,
) -> RegistrationProof:
    """The robot side: sign ``claim`` now with a fresh nonce."""
    ts = time.time_ns() if timestamp_ns is None else int(timestamp_ns)
    nonce = new_nonce() if nonce is None else bytes(nonce)
    return RegistrationProof(ts, nonce, signer.sign(claim.message(ts, nonce)))


class RegistrationGuard:
    """The server side: verifies a registration proof against the allow-list (pure, bounded)."""

    def __init__(
        self,
        allow_list: AllowList,
        window_s: float = 60.0,
        max_nonces: int = 10_000,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        if max_nonces < 1:
            raise ValueError(f"max_nonces must be >= 1, got {max_nonces}")
        self.allow_list = allow_list
        self.window_ns = int(window_s * 1e9)
        self.max_nonces = int(max_nonces)
        self.clock_ns = clock_ns
        self._floor_ns = 0  # requests stamped before this are refused (raised by evictions)
        self._nonces: OrderedDict[bytes, int] = OrderedDict()  # nonce -> timestamp, oldest first

    def check(
        self, claim: RegistrationClaim, timestamp_ns: int, nonce: bytes, signature: bytes
    ) -> str | None:
        """None if the proof is valid (its nonce is then spent), else the reason it is refused."""
        rid = claim.robot_id
        listed = self.allow_list.public_key(rid) if isinstance(rid, str) else None
        if listed is None:
            return f"robot {rid[:64]!r} is not on the allow-list"
        if not self.allow_list.key_matches(rid, claim.public_key):
            return f"public key of {rid!r} does not match the allow-list"
        if len(signature) == 0:
            return f"registration of {rid!r} is not signed (the server requires signatures)"
        try:
            message = claim.message(int(timestamp_ns), bytes(nonce))
        except ValueError as err:
            return f"registration of {rid!r} is malformed: {err}"
        if not verify_signature(listed, message, bytes(signature)):
            return f"registration of {rid!r}: bad signature (not made with the allow-listed key)"
        now = self.clock_ns()
        skew = (int(timestamp_ns) - now) / 1e9
        if abs(int(timestamp_ns) - now) > self.window_ns:
            return (
                f"registration of {rid!r} is stamped {skew:+.1f} s from the server clock "
                f"(window +-{self.window_ns / 1e9:.0f} s): replayed, or clocks out of sync"
            )
        self._forget(now)
        if int(timestamp_ns) < self._floor_ns:
            return f"registration of {rid!r} is older than the replay window floor"
        key = bytes(nonce)
        if key in self._nonces:
            return f"registration of {rid!r}: nonce {key.hex()} already used (replay)"
        self._nonces[key] = int(timestamp_ns)
        while len(self._nonces) > self.max_nonces:
            _, evicted = self._nonces.popitem(last=False)
            self._floor_ns = max(self._floor_ns, evicted + 1)
        return None

    def _forget(self, now_ns: int) -> None:
        """Drop nonces whose timestamps are outside the window: freshness refuses them anyway."""
        cutoff = now_ns - self.window_ns
        for nonce in [n for n, ts in self._nonces.items() if ts < cutoff]:
            del self._nonces[nonce]

    def __len__(self) -> int:
        return len(self._nonces)
