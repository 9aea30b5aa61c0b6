"""Checks on a model update (server side): :class:`UpdateEnvelope` and its two stages.

``check_update_envelope`` needs only the header/first chunk (round, deadline, sender, size cap,
exact manifest, sample-count cap, base round, signature, replay), so hostile bulk is refused
before it is collected or decoded; ``validate_update`` adds the checks on the decoded tensors
(schema again, finite values, digest of the received bytes) and, on accept, records the nonce.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from numpy.typing import NDArray

from fed_ros.core.security.auth import Signer
from fed_ros.core.checks.decisions import (
    ACCEPTED,
    DIGEST,
    Decision,
    MALFORMED,
    OVERSIZE,
    STALE_BASE,
    _is_int,
    _reject,
    _short,
)
from fed_ros.core import encodings
from fed_ros.core.checks.payload_checks import check_payload_manifest, check_tensors
from fed_ros.core.checks.sender_checks import (
    ValidationContext,
    _check_auth,
    _check_num_samples,
    _check_sender,
)


@dataclass(frozen=True)
class UpdateEnvelope:
    """What a ModelUpdate says about itself (header + first chunk), before its bytes are collected.

    ``manifest`` is the announced manifest: TensorSpec-like objects (``name``/``shape``/``dtype``
    attributes, e.g. the message's TensorSpec) or ``(name, shape, dtype)`` tuples.
    """

    robot_id: str
    round_idx: int
    base_round: int
    num_samples: int
    manifest: Sequence[Any]
    total_bytes: int
    payload_sha256: str
    encoding: int = encodings.FLOAT32.wire_id
    cluster_id: int = -1
    nonce: bytes = b""
    signature: bytes = b""
    # signed_messages.transfer_digest of the payload header (payload id, manifest, chunk list, bulk
    # address); the ROS layer computes it from the message, so a header the robot did not sign
    # fails.
    transfer: bytes = b""

    def signed(self, signer: Signer) -> "UpdateEnvelope":
        """A copy carrying `signer`'s signature over every signed field (what a robot sends)."""
        return dataclasses.replace(
            self,
            signature=signer.sign_update(
                self.round_idx,
                self.robot_id,
                self.nonce,
                self.payload_sha256,
                base_round=self.base_round,
                num_samples=self.num_samples,
                cluster_id=self.cluster_id,
                transfer=self.transfer,
            ),
        )


def check_update_envelope(env: UpdateEnvelope, ctx: ValidationContext) -> Decision:
    """Checks on a ModelUpdate's header/first chunk, before its bytes are collected or decoded."""
    try:
        return _check_update_envelope(env, ctx)
    except Exception as err:  # hostile input must never crash a handler: reject it instead
        return _reject(
            MALFORMED, f"update envelope could not be checked: {type(err).__name__}: {err}"
        )


def _check_update_envelope(env: UpdateEnvelope, ctx: ValidationContext) -> Decision:
    limits = ctx.limits
    d = _check_sender(env.robot_id, env.round_idx, ctx)
    if not d:
        return d
    rid = env.robot_id
    if not _is_int(env.total_bytes) or env.total_bytes < 0:
        return _reject(
            MALFORMED, f"robot {rid!r}: total_bytes {_short(env.total_bytes)} is not a size"
        )
    if env.total_bytes > limits.max_update_bytes:
        return _reject(
            OVERSIZE,
            f"robot {rid!r}: update of {env.total_bytes} bytes exceeds the cap "
            f"{limits.max_update_bytes} bytes",
        )
    if not _is_int(env.encoding) or env.encoding not in encodings.BY_WIRE_ID:
        return _reject(MALFORMED, f"robot {rid!r}: unknown encoding {_short(env.encoding)}")
    if ctx.expected_manifest is not None:  # None: the transfer receiver checks the payload itself
        d = check_payload_manifest(
            env.manifest, env.total_bytes, env.encoding, ctx.expected_manifest
        )
        if not d:
            return Decision(False, d.code, f"robot {rid!r}: {d.reason}")
    d = _check_num_samples(rid, env.num_samples, limits)
    if not d:
        return d
    if not _is_int(env.base_round) or env.base_round < 0:
        return _reject(
            MALFORMED, f"robot {rid!r}: base_round {_short(env.base_round)} is not a round"
        )
    if env.base_round > env.round_idx:
        return _reject(
            STALE_BASE, f"robot {rid!r}: base_round {env.base_round} is after round {env.round_idx}"
        )
    if ctx.base_rounds is not None and env.base_round not in ctx.base_rounds:
        return _reject(
            STALE_BASE,
            f"robot {rid!r}: trained from model version {env.base_round}, "
            f"expected one of {sorted(ctx.base_rounds)}",
        )
    if not isinstance(env.payload_sha256, str) or len(env.payload_sha256) != 64:
        return _reject(
            MALFORMED,
            f"robot {rid!r}: payload sha256 {_short(env.payload_sha256)} is not 64 hex chars",
        )
    if not _is_int(env.cluster_id) or not -1 <= env.cluster_id < 2**31:
        return _reject(
            MALFORMED, f"robot {rid!r}: cluster_id {_short(env.cluster_id)} must be an int >= -1"
        )
    return _check_auth(
        rid,
        env.round_idx,
        env.nonce,
        env.signature,
        ctx,
        lambda: ctx.allow_list.verify_update(
            rid,
            env.round_idx,
            env.nonce,
            env.payload_sha256,
            env.signature,
            base_round=env.base_round,
            num_samples=env.num_samples,
            cluster_id=env.cluster_id,
            transfer=env.transfer,
        ),
    )


def validate_update(
    env: UpdateEnvelope,
    params: Mapping[str, NDArray[Any]],
    ctx: ValidationContext,
    *,
    received_sha256: str | None = None,
    commit: bool = True,
) -> Decision:
    """Full check of an assembled, decoded update; on accept with commit=True records its nonce.

    `received_sha256` is the digest of the bytes actually received (the assembler's); it must
    equal the signed `env.payload_sha256`.
    """
    try:
        d = _check_update_envelope(env, ctx)
        if not d:
            return d
        if received_sha256 is not None and received_sha256 != env.payload_sha256:
            return _reject(
                DIGEST,
                f"robot {env.robot_id!r}: received bytes hash to {_short(received_sha256, 20)}, "
                f"announced {env.payload_sha256[:16]}...",
            )
        d = check_tensors(params, ctx.expected_manifest, ctx.limits.max_abs_value)
        if not d:
            return Decision(False, d.code, f"robot {env.robot_id!r}: {d.reason}")
    except Exception as err:  # never let hostile input crash the node
        return _reject(MALFORMED, f"update could not be validated: {type(err).__name__}: {err}")
    if commit and ctx.replay_guard is not None:
        ctx.replay_guard.record(env.robot_id, env.round_idx, bytes(env.nonce))
    return ACCEPTED
