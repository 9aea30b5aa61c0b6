"""The fleet server's stage inputs besides updates: client descriptors and robot metrics.

A descriptor (DESCRIBE / SCORE stages) is bounded, decoded, checked (round, participant,
signature, replay, shape) and offered to the coordinator; every outcome is audited. Robot
metrics (EVALUATE) are bounded, then offered as a success rate, or, with ``accepted`` false, as
the robot's declining the stage with its reason. Its collaborators are explicit: the
coordinator, the update intake (its validation context and oversize rejection, shared with
updates), the audit log and a logger.
"""

from __future__ import annotations

from typing import Any

from fed_ros.core.checks import bounds
from fed_ros.core.checks.decisions import Decision
from fed_ros.core.checks.descriptor_checks import validate_descriptor
from fed_ros.ros.wire.round_msgs import descriptor_from_msg


class StageInputs:
    """Descriptors and metrics into one server node's round (its round-state callback group)."""

    def __init__(self, *, coord: Any, intake: Any, audit: Any, log: Any) -> None:
        self.coord, self.intake, self.audit, self.log = coord, intake, audit, log

    def on_descriptor(self, msg) -> None:
        why = bounds.oversized(
            {
                "robot_id": (msg.robot_id, bounds.MAX_ID_CHARS),
                "nonce": (msg.nonce, bounds.NONCE_BYTES),
                "signature": (msg.signature, bounds.SIGNATURE_BYTES),
            }
        ) or bounds.oversized_items(
            "score_robot_ids", msg.score_robot_ids, 4096, bounds.MAX_ID_CHARS
        )
        if why is not None:
            return self.intake.reject_oversized("descriptor", msg.robot_id, int(msg.round), why)
        rid = str(msg.robot_id)
        try:
            desc = descriptor_from_msg(msg)
        except ValueError as exc:
            self.coord.record_rejection(rid, str(exc)[:1000])
            self.audit.record(
                kind="descriptor",
                robot_id=rid,
                round_idx=int(msg.round),
                decision=Decision(False, "bad_descriptor", str(exc)),
            )
            self.log.warning(f"descriptor from {rid!r} rejected: {str(exc)[:300]}")
            return
        decision = validate_descriptor(
            desc,
            self.intake.validation_ctx(rid),
            round_idx=int(msg.round),
            nonce=bytes(msg.nonce),
            signature=bytes(msg.signature),
            dims=int(msg.dims),
        )
        if not decision:
            self.coord.record_rejection(rid, decision.reason)
            self.audit.record(
                kind="descriptor", robot_id=rid, round_idx=int(msg.round), decision=decision
            )
            self.log.warning(f"descriptor from {rid} rejected: {decision.reason}")
            return
        decision = self.coord.offer_descriptor(desc, int(msg.round))
        self.audit.record(
            kind="descriptor", robot_id=rid, round_idx=int(msg.round), decision=decision
        )

    def on_metrics(self, msg) -> None:
        if len(msg.robot_id) > bounds.MAX_ID_CHARS or len(msg.reason) > bounds.MAX_REASON_CHARS:
            return self.intake.reject_oversized(
                "metrics",
                msg.robot_id,
                int(self.coord.round_idx),
                f"robot_id/reason over bound ({len(msg.robot_id)}/{len(msg.reason)} chars)",
            )
        if not msg.accepted:  # the robot will not answer this stage, and says why
            verdict = self.coord.offer_decline(str(msg.robot_id), str(msg.reason))
            self.log.info(
                f"{msg.robot_id} does not answer this stage: {msg.reason}"
                + ("" if verdict.accepted else f" ({verdict.reason})")
            )
            return
        verdict = self.coord.offer_metrics(
            str(msg.robot_id),
            float(msg.success_rate),
            interventions=(
                float(msg.interventions_per_episode),
                float(msg.human_seconds_per_episode),
            ),
        )
        if not verdict.accepted:
            self.log.warning(f"metrics from {msg.robot_id}: {verdict.reason}")
