"""The fleet server's training heartbeats: bounded, signature-checked, offered to the round.

A robot that trains slower than ``round_timeout_s`` assumes sends a TrainingProgress heartbeat
every ``heartbeat_period_s``; progress moves its own deadline, up to the fleet's cap (the rules are
:mod:`fed_ros.core.rounds.liveness`, unit-tested without ROS). Here: the field bounds, the
signature against the allow-list when the fleet signs, then the coordinator's decision. Every
refusal is audited with its reason (unknown robot, bad signature, replayed sequence, beyond the
step budget, no TRAIN stage) and extends nothing; an accepted heartbeat is logged once per robot
and round, and again when it first carries that robot past the announced deadline.
"""

from __future__ import annotations

from typing import Any

from fed_ros.core.checks import bounds
from fed_ros.core.checks.decisions import BAD_SIGNATURE, Decision, UNKNOWN_ROBOT, UNSIGNED


class HeartbeatIntake:
    """TrainingProgress messages into one server's round (its round-state callback group).

    Collaborators: the coordinator (``offer_heartbeat``, ``collector``), the allow-list (None:
    the fleet does not sign), the audit log, a logger.
    """

    def __init__(self, *, coord: Any, allow_list: Any, audit: Any, log: Any) -> None:
        self.coord, self.allow_list, self.audit, self.log = coord, allow_list, audit, log
        self.accepted = 0
        self.refused = 0
        self._noted: set[tuple[str, int, str]] = set()  # (robot, round, what) logged once

    def on_progress(self, msg) -> None:
        rid, round_idx = str(msg.robot_id), int(msg.round)
        why = bounds.oversized(
            {
                "robot_id": (msg.robot_id, bounds.MAX_ID_CHARS),
                "signature": (msg.signature, bounds.SIGNATURE_BYTES),
            }
        )
        decision = Decision(False, "oversize", why) if why else self._check_signature(msg, rid)
        if decision.accepted:
            decision = self.coord.offer_heartbeat(
                rid, round_idx, int(msg.seq), (int(msg.steps_done), int(msg.expected_steps))
            )
        if not decision.accepted:
            self.refused += 1
            self.audit.record(
                kind="heartbeat",
                robot_id=bounds.clip(rid, 64),
                round_idx=round_idx,
                decision=decision,
            )
            self.log.warning(
                f"heartbeat from {bounds.clip(rid, 64)!r} refused: {decision.reason}",
                throttle_duration_sec=5.0,
            )
            return
        self.accepted += 1
        self._note(rid, round_idx, msg)

    def _check_signature(self, msg, rid: str) -> Decision:
        if self.allow_list is None:
            return Decision(True)
        if rid not in self.allow_list:
            return Decision(
                False, UNKNOWN_ROBOT, f"unknown robot {rid!r}: no public key on the allow-list"
            )
        if not len(msg.signature):
            return Decision(False, UNSIGNED, f"robot {rid!r}: heartbeat is not signed")
        why = self.allow_list.verify_progress(
            rid,
            int(msg.round),
            int(msg.seq),
            int(msg.steps_done),
            int(msg.expected_steps),
            bytes(msg.signature),
        )
        return Decision(True) if why is None else Decision(False, BAD_SIGNATURE, why)

    def _note(self, rid: str, round_idx: int, msg) -> None:
        """Log a robot's first heartbeat of a round, and its first one past the announced
        deadline (not every heartbeat: they come every few seconds)."""
        col = self.coord.collector
        extended = col is not None and col.deadline_for(rid) > col.plan.deadline_s
        for what, due in (("first", True), ("extended", extended)):
            key = (rid, round_idx, what)
            if not due or key in self._noted:
                continue
            if len(self._noted) >= 10_000:
                self._noted.clear()  # bounded; a later repeat is logged once more
            self._noted.add(key)
            detail = (
                f"deadline extended to {col.deadline_for(rid) - col.plan.deadline_s:.1f} s "
                "past the announced one"
                if what == "extended"
                else "training heartbeats arriving"
            )
            self.log.info(
                f"round {round_idx}: {rid} at step {int(msg.steps_done)} of "
                f"{int(msg.expected_steps)}: {detail}"
            )
