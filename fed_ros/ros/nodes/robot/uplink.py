"""A robot's updates to the server: sign, send, keep until acknowledged, re-send.

The robot node owns the publisher (its interface stays listed in one file); this object
owns the update's life after training: the TransferSender (chunks or a bulk offer), the
Outbox of unacknowledged updates (re-sent on the retry schedule until the server's
UpdateAck or the round's deadline), answers to chunk resend requests, and the transfer log.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

from fed_ros.core.checks.decisions import Decision
from fed_ros.core.rounds.delivery import Outbox, RetrySchedule
from fed_ros.ros.wire.round_msgs import Announcement, model_update_msg
from fed_ros.ros.wire.transfer import Outgoing, TransferSender

# Each re-send of an unacknowledged update waits its schedule's delay x [0.5, 1.5): robots whose
# updates a full server inbox dropped together come back spread out, not all at once
# (core/rounds/delivery.py RetrySchedule).
UPDATE_RESEND_JITTER = 0.5


class UpdateUplink:
    """Updates out of one robot node: ``publisher`` sends them, ``wait_for_server()`` blocks until
    the server's subscription is matched (TimeoutError when it is not)."""

    def __init__(
        self,
        publisher,
        robot_id: str,
        *,
        signer,
        transfer_channel: str,
        bulk_threshold_bytes: int,
        retry_s: float,
        log_transfer: Callable[..., None],
        log: Any,
        wait_for_server: Callable[[], None],
    ) -> None:
        self.pub, self.robot_id, self.signer, self.log = publisher, robot_id, signer, log
        self.wait_for_server = wait_for_server
        self.sender = TransferSender(transfer_channel, bulk_threshold_bytes=bulk_threshold_bytes)
        self.outbox = Outbox(
            RetrySchedule(first_s=retry_s, max_s=max(10.0, retry_s), jitter=UPDATE_RESEND_JITTER)
        )
        self._log_transfer = log_transfer
        self._matched = 0  # subscriptions our update writer matched at the last tick
        self._lost_at: float | None = (
            None  # when every match was lost (e.g. an outage beyond the DDS lease)
        )
        self.last_rejection = ""  # the server's last rejection of our update (diagnostics)

    def cached(self, round_idx: int):
        """The update already trained for ``round_idx`` (its outbox entry), or None."""
        return self.outbox.for_round(round_idx)

    def offer(
        self, payload, ann: Announcement, fields: dict[str, Any], grace_s: float = 0.0
    ) -> Outgoing:
        """Sign and send an update (new bytes, or a cached Outgoing's); keep it until
        acknowledged, or until the round's deadline, or ``grace_s`` from now if later (a robot
        whose heartbeats extended its deadline finishes after the announced one)."""
        nonce = secrets.token_bytes(16)
        pid = f"{self.robot_id}/r{ann.round_idx}/update/{nonce.hex()[:8]}"
        header = dict(
            fields,
            robot_id=self.robot_id,
            round_idx=ann.round_idx,
            base_round=ann.round_idx,
            nonce=nonce,
            signature=b"",
        )
        out = (
            self.sender.reissue(payload, pid, **header)
            if isinstance(payload, Outgoing)
            else self.sender.prepare(payload, pid, **header)
        )
        if self.signer is not None:
            out.meta["signature"] = self.signer.sign_update(
                ann.round_idx,
                self.robot_id,
                nonce,
                out.encoded.sha256,
                base_round=ann.round_idx,
                num_samples=fields["num_samples"],
                cluster_id=fields["cluster_id"],
                transfer=out.chunker.transfer_digest(),
            )  # payload id, chunk list, bulk address: all signed
        self._log_transfer(
            kind="update_ready", round=ann.round_idx, payload_id=pid, bytes=out.encoded.total_bytes
        )
        try:
            self.wait_for_server()
            self.publish(out)
            sent = True
        except TimeoutError as exc:
            # The server is unreachable (e.g. the link is down): keep the update; resend_due sends
            # it as soon as the server is matched again, until the round's deadline.
            self.log.warning(
                f"round {ann.round_idx}: {exc}; the update is kept and sent when "
                f"the server is matched again"
            )
            sent = False
        # The announcement's deadline is wall-clock time; the outbox runs on the monotonic clock.
        deadline = time.monotonic() + max(ann.deadline_s - time.time(), grace_s)
        entry = self.outbox.reopen(ann.round_idx, pid, out, deadline) or self.outbox.add(
            ann.round_idx, pid, out, deadline
        )
        if not sent:
            entry.sends, entry.next_due = 0, time.monotonic()  # due at the first tick with a match
        self.outbox.forget_before(ann.round_idx - 1)
        self._log_transfer(
            kind="update_sent" if sent else "update_queued",
            round=ann.round_idx,
            payload_id=pid,
            sha256=out.encoded.sha256,
            bytes=out.encoded.total_bytes,
            channel=out.channel,
        )
        return out

    def publish(self, out: Outgoing) -> None:
        for chunk in out.chunks():
            self.pub.publish(model_update_msg(chunk, **out.meta))

    def on_resend(self, msg) -> None:
        """The server misses chunks of one of our updates: send those again."""
        try:
            answer = self.sender.resend(msg.data)
        except ValueError:
            return  # malformed, or indices of another robot's payload of the same id (never ours)
        if answer is not None:
            out, chunks = answer
            for chunk in chunks:
                self.pub.publish(model_update_msg(chunk, **out.meta))
            self.log.info(f"resent {len(chunks)} chunk(s) of {out.payload_id}")

    def on_ack(self, msg) -> None:
        """The server's decision on our update: stop re-sending it; a rejection's reason is
        logged."""
        if msg.robot_id != self.robot_id:
            return
        decision = Decision(bool(msg.accepted), str(msg.code), str(msg.reason))
        if self.outbox.acknowledge(str(msg.payload_id), decision) is None:
            return  # not ours any more, or acknowledged before
        self._log_transfer(
            kind="update_ack",
            round=int(msg.round),
            payload_id=str(msg.payload_id),
            accepted=decision.accepted,
            code=decision.code,
            reason=decision.reason,
        )
        if decision:
            self.log.info(f"round {msg.round}: update accepted by the server")
        else:
            self.last_rejection = f"round {msg.round} ({decision.code}): {decision.reason}"[
                :300
            ]  # diagnostics
            self.log.warning(
                f"round {msg.round}: update rejected by the server ({decision.code}): "
                f"{decision.reason}"
            )

    def resend_due(self) -> None:
        """Re-send unacknowledged updates whose retry time came (only when someone can hear them).

        A server re-matched after losing it (a link outage longer than the DDS lease drops the
        match; the update sent into the dead link is gone) gets the update at once, with the
        back-off restarted (Outbox.expedite), not when the grown retry delay runs out.
        """
        matched = self.pub.get_subscription_count()
        if matched == 0 and self._matched > 0:
            self._lost_at = time.monotonic()
        elif matched > 0 and self._lost_at is not None:
            self.outbox.expedite(added_before=self._lost_at)
            self._lost_at = None
        self._matched = matched
        if matched > 0:
            for entry in self.outbox.due():
                self.log.warning(
                    f"round {entry.round_idx}: update not acknowledged; re-sending "
                    f"(send {entry.sends})"
                )
                self.publish(entry.item)

    def close(self) -> None:
        self.sender.close()
