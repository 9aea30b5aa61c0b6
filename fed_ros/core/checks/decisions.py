"""What a check returns: :class:`Decision` (accept, or reject with a stable code and a reason), the
reject codes, and the :class:`Limits` every check applies.

The checks themselves live in :mod:`fed_ros.core.checks.sender_checks` (who, when, signature,
replay), :mod:`fed_ros.core.checks.payload_checks` (manifest, tensors, cluster models),
:mod:`fed_ros.core.checks.update_checks` and :mod:`fed_ros.core.checks.descriptor_checks`;
and :mod:`fed_ros.core.checks.audit_log` records them. ``_reject``, ``_is_int`` and ``_short`` are
shared by those modules only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

_MiB = 1 << 20

# Reject codes (stable strings: round reports and dashboards count them).
OK = "ok"
MALFORMED = "malformed"
LATE = "late"
FUTURE = "future_round"
NOT_PARTICIPANT = "not_participant"
OVERSIZE = "oversize"
SIZE_MISMATCH = "size_mismatch"
SCHEMA = "schema"
NON_FINITE = "non_finite"
OUT_OF_RANGE = "out_of_range"
NUM_SAMPLES = "num_samples"
STALE_BASE = "stale_base"
UNKNOWN_ROBOT = "unknown_robot"
UNSIGNED = "unsigned"
BAD_SIGNATURE = "bad_signature"
REPLAY = "replay"
DIGEST = "digest_mismatch"
DESCRIPTOR = "bad_descriptor"
ROLLBACK = "rollback"
# Round bookkeeping and transfer outcomes (the coordinator's and the transfer receiver's codes).
DUPLICATE = "duplicate"
NO_ROUND = "no_round"
STALE_ROUND = "stale_round"
UNREACHABLE = "unreachable"  # the bulk channel's sender could not be reached within the round
TRANSFER = "transfer"  # chunks inconsistent with each other or with the caps, or bytes hash wrong
FOREIGN_CHUNK = (
    "foreign_chunk"  # a chunk not of the signed upload it names: dropped, the upload kept
)
REGISTER = "register"  # a registration refused (bounds, identity, allow-list, fleet size)


@dataclass(frozen=True)
class Limits:
    """Caps applied before anything is allocated or decoded (units in the field names)."""

    max_update_bytes: int = 512 * _MiB  # encoded ModelUpdate payload
    max_cluster_model_bytes: int = 512 * _MiB  # encoded ClusterModel payload (robot side)
    max_num_samples: int = 10_000_000  # self-reported frames behind one update/descriptor
    max_descriptor_dims: int = 65_536  # length of a descriptor mean/variance
    max_descriptor_payload_bytes: int = 16 * _MiB  # e.g. an RND predictor (safetensors)
    max_scores: int = 4_096  # RND novelty scores in one descriptor
    max_abs_value: float = 1e6  # any parameter with |value| above this is rejected

    def __post_init__(self) -> None:
        for name in (
            "max_update_bytes",
            "max_cluster_model_bytes",
            "max_num_samples",
            "max_descriptor_dims",
            "max_descriptor_payload_bytes",
            "max_scores",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")
        if not (isinstance(self.max_abs_value, (int, float)) and self.max_abs_value > 0):
            raise ValueError(f"Limits.max_abs_value must be > 0, got {self.max_abs_value!r}")


@dataclass(frozen=True)
class Decision:
    """Outcome of a validation: accepted, or rejected with a code and a reason."""

    accepted: bool
    code: str = OK
    reason: str = "accepted"

    def __bool__(self) -> bool:
        return self.accepted

    def raise_if_rejected(self) -> None:
        """Raise ValueError(reason) when rejected (for callers that prefer exceptions)."""
        if not self.accepted:
            raise ValueError(f"{self.code}: {self.reason}")


ACCEPTED = Decision(True)


def _reject(code: str, reason: str) -> Decision:
    return Decision(False, code, reason)


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _short(x: Any, n: int = 60) -> str:
    text = repr(x)
    return text if len(text) <= n else text[:n] + "..."
