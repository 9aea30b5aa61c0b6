"""Checks every signed message of a round passes (updates and descriptors alike).

:class:`ValidationContext` is the server's view of the open round. ``_check_sender`` (well-formed
robot id and round, the round open, before the deadline, a participant), ``_check_num_samples``
(the sample-count cap) and ``_check_auth`` (allow-listed key, signature, fresh nonce) are shared
by :mod:`fed_ros.core.checks.update_checks` and :mod:`fed_ros.core.checks.descriptor_checks`.
Nothing here changes state: the replay guard is only asked, never written.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from fed_ros.core.security.auth import AllowList
from fed_ros.core.security.replay import ReplayGuard
from fed_ros.core.security.signed_messages import NONCE_BYTES
from fed_ros.core.checks.decisions import (
    ACCEPTED,
    BAD_SIGNATURE,
    Decision,
    FUTURE,
    LATE,
    Limits,
    MALFORMED,
    NOT_PARTICIPANT,
    NUM_SAMPLES,
    REPLAY,
    UNKNOWN_ROBOT,
    UNSIGNED,
    _is_int,
    _reject,
    _short,
)
from fed_ros.core.params import Manifest


@dataclass
class ValidationContext:
    """The server's view of the open round; the node updates it when a round starts/ends.

    allow_list None = authentication off (signatures not required). base_rounds: the model
    versions a robot may have trained from (None: any version <= the round). stale_rounds:
    buffered rounds (FedBuff) also take answers to this many earlier rounds.
    """

    current_round: int
    expected_manifest: Manifest | None = None
    base_rounds: Collection[int] | None = None
    participants: Collection[str] | None = None
    limits: Limits = field(default_factory=Limits)
    allow_list: AllowList | None = None
    replay_guard: ReplayGuard | None = None
    deadline_passed: bool = False
    descriptor_kinds: Collection[str] | None = None
    descriptor_dims: int | None = None
    stale_rounds: int = 0


def _check_sender(robot_id: Any, round_idx: Any, ctx: ValidationContext) -> Decision:
    if not isinstance(robot_id, str) or not robot_id or len(robot_id) > 255:
        return _reject(
            MALFORMED, f"robot id {_short(robot_id)} must be a non-empty string <= 255 chars"
        )
    if not _is_int(round_idx) or round_idx < 0:
        return _reject(MALFORMED, f"round {_short(round_idx)} must be an integer >= 0")
    if round_idx < ctx.current_round - ctx.stale_rounds:
        return _reject(
            LATE,
            f"robot {robot_id!r}: round {round_idx} is over (current round {ctx.current_round})",
        )
    if round_idx > ctx.current_round:
        return _reject(
            FUTURE,
            f"robot {robot_id!r}: round {round_idx} has not started "
            f"(current round {ctx.current_round})",
        )
    if ctx.deadline_passed:
        return _reject(LATE, f"robot {robot_id!r}: arrived after the deadline of round {round_idx}")
    if ctx.participants is not None and robot_id not in ctx.participants:
        return _reject(
            NOT_PARTICIPANT, f"robot {robot_id!r} is not a participant of round {round_idx}"
        )
    return ACCEPTED


def _check_num_samples(robot_id: str, num_samples: Any, limits: Limits) -> Decision:
    if not _is_int(num_samples):
        return _reject(
            MALFORMED, f"robot {robot_id!r}: num_samples {_short(num_samples)} is not an integer"
        )
    if num_samples < 1:
        return _reject(NUM_SAMPLES, f"robot {robot_id!r}: num_samples {num_samples} must be >= 1")
    if num_samples > limits.max_num_samples:
        return _reject(
            NUM_SAMPLES,
            f"robot {robot_id!r}: num_samples {num_samples} exceeds the cap "
            f"{limits.max_num_samples}",
        )
    return ACCEPTED


def _check_auth(
    robot_id: str,
    round_idx: int,
    nonce: Any,
    signature: Any,
    ctx: ValidationContext,
    verify: Callable[[], str | None],
) -> Decision:
    if not isinstance(nonce, (bytes, bytearray, memoryview)) or not isinstance(
        signature, (bytes, bytearray, memoryview)
    ):
        return _reject(MALFORMED, f"robot {robot_id!r}: nonce/signature must be bytes")
    if ctx.allow_list is not None:
        if robot_id not in ctx.allow_list:
            return _reject(
                UNKNOWN_ROBOT, f"unknown robot {robot_id!r}: no public key on the allow-list"
            )
        if len(signature) == 0:
            return _reject(UNSIGNED, f"robot {robot_id!r}: message is not signed")
        why = verify()
        if why is not None:
            return _reject(BAD_SIGNATURE, why)
    if ctx.replay_guard is not None:
        if len(nonce) != NONCE_BYTES:
            return _reject(
                REPLAY, f"robot {robot_id!r}: nonce must be {NONCE_BYTES} bytes, got {len(nonce)}"
            )
        why = ctx.replay_guard.check(robot_id, round_idx, bytes(nonce))
        if why is not None:
            return _reject(REPLAY, why)
    return ACCEPTED
