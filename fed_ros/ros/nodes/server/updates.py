"""The server's intake of robot updates: first-chunk checks, assembly, the decision, the
acknowledgement.

Every update payload id gets exactly one decision (the Ledger): a re-send is acknowledged again
and never applied twice; a rejection is counted once, audited and acknowledged with its code.
Cheap checks run on the first chunk (round, participant, envelope, signature), the payload's
content once in the TransferReceiver, then the RoundCoordinator takes the update. Its
collaborators are explicit (the server node builds them): the coordinator, the transfer
receiver, the audit log, the acknowledgement publisher, the signing state, the live
parameters, a clock and a logger.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fed_ros.core.checks import bounds
from fed_ros.core.rounds import faults
from fed_ros.core.checks.decisions import SCHEMA, Decision, Limits
from fed_ros.core.encodings import DELTA_WIRE_IDS
from fed_ros.core.encodings.feedback import apply_delta
from fed_ros.core.rounds.delivery import Ledger
from fed_ros.core.rounds.collect import RoundPlan, TRAIN
from fed_ros.core.checks.sender_checks import ValidationContext
from fed_ros.core.strategies.types import ClientUpdate
from fed_ros.core.checks.update_checks import UpdateEnvelope, check_update_envelope
from fed_ros.msg import UpdateAck
from fed_ros.ros.wire.chunk_sender import transfer_digest_of
from fed_ros.ros.wire.transfer_receiver import Received


class UpdateIntake:
    """Robot updates into one server node's round (its callback group: one at a time)."""

    def __init__(
        self,
        *,
        coord: Any,
        updates_in: Any,
        audit: Any,
        publish_ack: Callable[[Any], None],
        manifest: Any,
        allow_list: Any,
        replay_guard: Any,
        params: Callable[[], Any],
        now: Callable[[], float],
        now_msg: Callable[[], Any],
        log: Any,
        delta_base: Callable[[int, int], Any] = lambda round_idx, cluster_id: None,
        spills: Any = None,
    ) -> None:
        self.coord, self.updates_in, self.audit, self.publish_ack = (
            coord,
            updates_in,
            audit,
            publish_ack,
        )
        self.manifest, self.allow_list, self.replay_guard = manifest, allow_list, replay_guard
        self.params, self.now, self.now_msg, self.log = params, now, now_msg, log
        # (round, cluster) -> that cluster model as the robots decoded it (None: not sent): the
        # base a topk update's delta is added to.
        self.delta_base = delta_base
        # Accepted updates move into the open TRAIN stage's spill file (a RoundSpills), so the
        # heap does not grow with robots x parameters (fed_ros.core.rounds.spill); None: kept.
        self.spills = spills
        # The decision on every update payload id: a re-send is acknowledged again, never applied
        # twice.
        self.ledger = Ledger()
        self._envelopes: dict[str, tuple[UpdateEnvelope, dict[str, float]]] = {}
        self._replays_audited: set[str] = (
            set()
        )  # closed ids whose re-arrival was audited (once each)
        self._acked_at: dict[
            str, float
        ] = {}  # closed id -> when a re-send of it was last acknowledged
        self.completed = 0  # updates the round accepted
        self.bytes_accepted = 0  # their payload bytes, over the run (tracking)

    def validation_ctx(self, robot_id: str = "") -> ValidationContext:
        """The open round as the checks see it; ``robot_id``'s own deadline (a heartbeat may have
        extended it, fed_ros.core.rounds.liveness) decides whether its answer is late."""
        plan = self.coord.current_plan
        round_idx = plan.round_idx if plan else self.coord.round_idx
        col = self.coord.collector
        deadline = col.deadline_for(robot_id) if col is not None and plan is not None else 0.0
        stale = self.coord.stale_rounds  # buffered rounds take earlier rounds' updates
        return ValidationContext(
            # expected_manifest None: a payload's content is checked once, by the transfer receiver.
            current_round=round_idx,
            stale_rounds=stale,
            expected_manifest=None,
            base_rounds=set(range(round_idx - stale, round_idx + 1)),
            participants=set(plan.participants) if plan else set(),
            deadline_passed=bool(plan and self.now() > deadline),
            limits=Limits(
                max_update_bytes=self.params().max_update_bytes,
                max_num_samples=max(self.params().max_samples, 1) * 10,
            ),
            allow_list=self.allow_list,
            replay_guard=self.replay_guard,
        )

    def _decide(
        self,
        pid: str,
        env: UpdateEnvelope,
        decision: Decision,
        *,
        counted: bool = False,
        **extra: Any,
    ) -> None:
        """Close an update with its decision: counted once, audited, acknowledged to the robot."""
        self._envelopes.pop(pid, None)
        self.updates_in.discard(pid)
        self.ledger.decide(pid, env.round_idx, decision)
        if not decision and not counted:
            # The one place an update rejection is counted.
            self.coord.record_rejection(env.robot_id, decision.reason)
        self.audit.record(
            kind="update",
            robot_id=env.robot_id,
            round_idx=env.round_idx,
            decision=decision,
            payload_id=pid,
            **extra,
        )
        self._ack(pid, env.robot_id, env.round_idx, decision)
        if decision:
            self.log.info(
                f"update from {env.robot_id} for round {env.round_idx} accepted "
                f"({extra.get('bytes', 0)} B, {str(extra.get('sha256', ''))[:12]})"
            )
            faults.reach("update_accepted", env.round_idx)  # crash tests only (FED_ROS_CRASH_AT)
        else:
            self.log.warning(
                f"update {bounds.clip(pid, 96)} rejected ({decision.code}): {decision.reason[:300]}"
            )

    def _ack(self, pid: str, robot_id: str, round_idx: int, decision: Decision) -> None:
        msg = UpdateAck(
            robot_id=robot_id[:255],
            round=int(round_idx),
            payload_id=pid[:256],
            accepted=decision.accepted,
            code=decision.code[:32],
            reason=decision.reason[:1000],
        )
        msg.header.stamp = self.now_msg()
        self.publish_ack(msg)

    def forget_stale(self, plan: RoundPlan) -> None:
        """Free partial updates of earlier rounds (buffered rounds keep those they still take); a
        re-announced round collects its payloads afresh."""
        for pid, (env, _) in list(self._envelopes.items()):
            if env.round_idx < plan.round_idx - self.coord.stale_rounds:
                self._envelopes.pop(pid, None)
                self.updates_in.discard(pid)
        if plan.stage == TRAIN:
            if self.spills is not None:
                self.spills.open(len(plan.participants))
            # Decisions taken before this announcement do not answer it: an abandoned attempt's,
            # and the `no_round` refusals of a restarted server that got the robots' answers
            # (sent to its killed predecessor) before it re-announced the round.
            self.ledger.reopen(plan.round_idx)

    def on_update(self, msg) -> None:
        payload = msg.payload
        why = bounds.oversized(
            {
                "robot_id": (msg.robot_id, bounds.MAX_ID_CHARS),
                "payload_id": (payload.payload_id, bounds.MAX_ID_CHARS),
                "bulk_uri": (payload.bulk_uri, bounds.MAX_URI_CHARS),
                "sha256": (payload.sha256, bounds.SHA256_HEX_CHARS),
                "nonce": (msg.nonce, bounds.NONCE_BYTES),
                "signature": (msg.signature, bounds.SIGNATURE_BYTES),
                "chunk_sha256": (payload.chunk_sha256, bounds.MAX_CHUNK_DIGEST_BYTES),
                "manifest": (payload.manifest, max(4 * len(self.manifest), 1024)),
            }
        )
        if why is not None:  # before the ids are kept, logged or audited anywhere
            return self.reject_oversized("update", msg.robot_id, int(msg.round), why)
        pid, rid, round_idx = payload.payload_id, str(msg.robot_id), int(msg.round)
        known = self.ledger.decided(pid)
        if (
            known is not None
        ):  # a re-send (our acknowledgement was lost) or a replay: same answer, applied once
            self._audit_replay(pid, rid, round_idx)
            # One acknowledgement per re-send, not per chunk: on its chunk 0, or on the first chunk
            # that arrives a second after the last acknowledgement (the KEEP_LAST inbox may have
            # dropped chunk 0 of a re-send behind the later ones).
            now = time.monotonic()
            if int(payload.chunk_index) == 0 or now - self._acked_at.get(pid, -1e9) >= 1.0:
                if len(self._acked_at) >= 10_000:
                    self._acked_at.clear()  # bounded; a forgotten id is acknowledged once more
                self._acked_at[pid] = now
                self._ack(pid, rid, round_idx, known)
            return
        if not self.updates_in.busy(pid):
            env = UpdateEnvelope(
                robot_id=rid,
                round_idx=round_idx,
                base_round=int(msg.base_round),
                num_samples=int(msg.num_samples),
                manifest=list(payload.manifest),
                total_bytes=int(payload.total_bytes),
                payload_sha256=payload.sha256,
                encoding=int(payload.encoding),
                cluster_id=int(msg.cluster_id),
                nonce=bytes(msg.nonce),
                signature=bytes(msg.signature),
                transfer=transfer_digest_of(payload),
            )
            # Cheap checks on the first chunk, before any payload byte is collected (V1, V2).
            verdict = self.coord.check_update(rid, round_idx, int(msg.base_round))
            decision = (
                check_update_envelope(env, self.validation_ctx(rid))
                if verdict.accepted
                else verdict
            )
            if not decision:
                if not self._authentic(env):
                    return self._reject_unauthenticated(pid, env, decision)
                return self._decide(pid, env, decision)
            self._envelopes[pid] = (
                env,
                {"train_loss": float(msg.train_loss), "val_loss": float(msg.val_loss)},
            )
        plan = self.coord.current_plan
        retry_for_s = max(0.0, plan.deadline_s - self.now()) if plan is not None else 0.0
        result = self.updates_in.offer(payload, tag=pid, retry_for_s=retry_for_s)
        if result is not None:
            self.complete(result)

    def _authentic(self, env: UpdateEnvelope) -> bool:
        """Whether the robot it names signed this header (always True with authentication off)."""
        allow = self.allow_list
        if allow is None:
            return True
        try:
            return (
                allow.verify_update(
                    env.robot_id,
                    env.round_idx,
                    env.nonce,
                    env.payload_sha256,
                    env.signature,
                    base_round=env.base_round,
                    num_samples=env.num_samples,
                    cluster_id=env.cluster_id,
                    transfer=env.transfer,
                )
                is None
            )
        except (ValueError, TypeError):
            return False

    def _reject_unauthenticated(self, pid: str, env: UpdateEnvelope, decision: Decision) -> None:
        """A rejected update its robot did not sign: counted once and audited, but its payload id is
        not closed and no acknowledgement goes out, so a forged message cannot cancel or answer a
        real robot's upload of the same id."""
        self.coord.record_rejection(env.robot_id, decision.reason)
        self.audit.record(
            kind="update",
            robot_id=bounds.clip(env.robot_id, 64),
            round_idx=env.round_idx,
            decision=decision,
            payload_id=bounds.clip(pid, 96),
        )
        self.log.warning(
            f"unauthenticated update {bounds.clip(pid, 96)} rejected ({decision.code}): "
            f"{decision.reason[:300]}"
        )

    def audit_drops(self) -> None:
        """Chunks the receiver dropped as foreign (not of the signed upload they name): audited,
        counted."""
        for drop in self.updates_in.drops():
            env = self._envelopes.get(drop.payload_id, (None,))[0]
            rid = env.robot_id if env is not None else "?"
            self.audit.record(
                kind="update",
                robot_id=bounds.clip(rid, 64),
                round_idx=env.round_idx if env is not None else -1,
                decision=drop.decision,
                payload_id=bounds.clip(drop.payload_id, 96),
            )

    def reject_oversized(self, kind: str, robot_id: str, round_idx: int, why: str) -> None:
        """A message with a field over its bound: counted and audited under a clipped id, nothing
        kept."""
        rid = bounds.clip(robot_id, 64)
        self.coord.record_rejection(rid, why)
        self.audit.record(
            kind=kind, robot_id=rid, round_idx=round_idx, decision=Decision(False, "oversize", why)
        )
        self.log.warning(f"{kind} from {rid!r} rejected: {why}")

    def _audit_replay(self, pid: str, robot_id: str, round_idx: int) -> None:
        """A chunk of an already closed payload id (resend or replay): audited and counted once per
        id."""
        if pid in self._replays_audited:
            return
        if len(self._replays_audited) >= 10_000:
            self._replays_audited.clear()  # bounded; a later repeat is audited once more
        self._replays_audited.add(pid)
        self.audit.record(
            kind="update",
            robot_id=bounds.clip(robot_id, 64),
            round_idx=round_idx,
            decision=Decision(
                False,
                "replay",
                "payload id already closed (accepted or rejected "
                "before): re-sent or replayed chunks dropped",
            ),
            payload_id=bounds.clip(pid, 96),
        )

    def complete(self, result: Received) -> None:
        """A payload is in (assembled or fetched, checked by the receiver): offer it to the
        round."""
        pid = result.payload_id
        if pid not in self._envelopes:
            return  # its round ended while it was being fetched
        env, metrics = self._envelopes[pid]
        extra = {"sha256": result.sha256, "bytes": result.nbytes} if result.sha256 else {}
        if not result.decision:
            return self._decide(pid, env, result.decision, **extra)
        params = result.params
        if env.encoding in DELTA_WIRE_IDS:
            params, why = apply_delta(
                self.delta_base(env.round_idx, env.cluster_id), params, env.cluster_id
            )
            if why:
                return self._decide(
                    pid, env, Decision(False, SCHEMA, f"robot {env.robot_id!r}: {why}"), **extra
                )
        if self.replay_guard is not None:
            self.replay_guard.record(env.robot_id, env.round_idx, bytes(env.nonce))
        update = ClientUpdate(
            robot_id=env.robot_id,
            params=params,
            num_samples=int(env.num_samples),
            base_round=int(env.base_round),
            cluster_id=int(env.cluster_id),
            metrics=metrics,
        )
        update.round_idx = env.round_idx
        verdict = self.coord.offer_update(update)  # counts its own rejection
        if verdict.accepted and self.spills is not None:
            update.params = self.spills.hold(update.params)  # the decoded copy is freed
        self._decide(pid, env, verdict, counted=True, **extra)
        self.completed += int(verdict.accepted)
        self.bytes_accepted += int(result.nbytes) if verdict.accepted else 0
