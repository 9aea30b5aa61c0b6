"""The fleet server's registration desk: a Register request becomes a roster entry or a refusal.

Bounds first (DDS does not enforce the .srv bounds), then, with ``require_signatures``, the
proof of possession of the allow-listed key, then the coordinator's own verdict (allow list,
capabilities). The response carries the current round and the robot's cluster memberships; a
refusal is audited and logged with its reason. Its collaborators are explicit: the
coordinator, the registration guard (None: no proof required), the audit log and a logger.
"""

from __future__ import annotations

from typing import Any

from fed_ros.core.checks import bounds
from fed_ros.core.checks.decisions import ACCEPTED, Decision, REGISTER


class RegistrationDesk:
    """Answers the server's ``register`` service (in the round-state callback group)."""

    def __init__(self, *, coord: Any, registration_guard: Any, audit: Any, log: Any) -> None:
        self.coord, self.registration_guard, self.audit, self.log = (
            coord,
            registration_guard,
            audit,
            log,
        )

    def on_register(self, request, response):
        verdict = self.check(request)
        if verdict.accepted:
            verdict = self.coord.register(
                request.robot_id,
                tasks=list(request.tasks),
                num_samples=int(request.num_samples),
                has_gpu=bool(request.has_gpu),
                public_key=bytes(request.public_key),
                action_dim=int(request.action_dim) if request.action_dim else None,
            )
        rid = bounds.clip(request.robot_id, 64)
        response.accepted = verdict.accepted
        response.reason = verdict.reason[: bounds.MAX_REASON_CHARS]
        response.current_round = int(self.coord.round_idx)
        membership = self.coord.memberships.get(request.robot_id, []) if verdict.accepted else []
        response.cluster_ids = [int(c) for c, _ in membership]
        response.weights = [float(w) for _, w in membership]
        # One severity per call site: rclpy raises "Logger severity cannot be changed between
        # calls" when one line logs at two severities (a rejected Register killed the server).
        if verdict.accepted:
            self.log.info(f"register {rid!r}: accepted ({len(self.coord.roster)} robots)")
        else:
            self.audit.record(
                kind="register", robot_id=rid, round_idx=int(self.coord.round_idx), decision=verdict
            )
            self.log.warning(f"register {rid!r} refused: {verdict.reason[:300]}")
        return response

    def check(self, request) -> Decision:
        """Bounds first (DDS does not enforce the .srv bounds), then the proof of key possession."""
        why = (
            bounds.oversized(
                {
                    "robot_id": (request.robot_id, bounds.MAX_ID_CHARS),
                    "public_key": (request.public_key, bounds.PUBLIC_KEY_BYTES),
                    "nonce": (request.nonce, bounds.NONCE_BYTES),
                    "signature": (request.signature, bounds.SIGNATURE_BYTES),
                }
            )
            or bounds.oversized_items(
                "tasks", request.tasks, bounds.MAX_TASKS, bounds.MAX_NAME_CHARS
            )
            or bounds.oversized_items(
                "cameras", request.cameras, bounds.MAX_CAMERAS, bounds.MAX_NAME_CHARS
            )
        )
        if why is not None:
            return Decision(False, REGISTER, f"register request refused: {why}")
        if self.registration_guard is None:
            return ACCEPTED
        from fed_ros.core.security.registration import RegistrationClaim

        claim = RegistrationClaim(
            robot_id=request.robot_id,
            public_key=bytes(request.public_key),
            tasks=tuple(request.tasks),
            cameras=tuple(request.cameras),
            action_dim=int(request.action_dim),
            has_gpu=bool(request.has_gpu),
            num_samples=int(request.num_samples),
        )
        why = self.registration_guard.check(
            claim, int(request.timestamp_ns), bytes(request.nonce), bytes(request.signature)
        )
        return ACCEPTED if why is None else Decision(False, REGISTER, why)

    @staticmethod
    def register_failed(args: tuple, exc: BaseException):
        """Service fallback: a Register whose handling raised is refused with the reason."""
        response = args[1]
        response.accepted = False
        response.reason = f"server error ({type(exc).__name__}); registration not recorded"
        return response
