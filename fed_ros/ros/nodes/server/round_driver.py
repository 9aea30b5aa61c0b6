"""The fleet server's round driver: the 10 Hz tick that moves the federation on.

Each tick finishes assembled updates, waits for the robots before round 0, polls the
:class:`fed_ros.core.rounds.coordinator.RoundCoordinator` (all decisions live there) and
publishes what a closed or opened stage produced, in the commit order: models (when they
changed) -> round report -> next announcement. It also sends the update resend requests and
decides the exit code (1: the coordinator gave up, 0: finished with ``exit_when_done``,
3: the tick itself failed, e.g. the store; a restart resumes). Its collaborators are explicit:
the coordinator, the transfer receiver, the update intake, the cluster model publisher,
publish callables for the report, announcement and update resend topics, the server's keys,
the pause gate's ``after_round``, the live parameters, a clock for stamps and a logger.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from std_msgs.msg import String

from fed_ros.core.rounds.collect import DONE, RoundPlan
from fed_ros.core.rounds.report import RoundOutcome
from fed_ros.core.rounds.round_scalars import outcome_scalars
from fed_ros.learning.tracking import open_tracker_or_warn
from fed_ros.core.rounds.roster import ready_to_start
from fed_ros.ros import shutdown
from fed_ros.ros.wire.round_msgs import Announcement, announcement_to_msg, round_report_to_msg
from fed_ros.ros.wire.signed import sign_json, sign_msg


class RoundDriver:
    """Drives one server's rounds from its timer (the round-state callback group)."""

    def __init__(
        self,
        *,
        coord: Any,
        updates_in: Any,
        intake: Any,
        models: Any,
        publish_report: Callable[[Any], None],
        publish_announcement: Callable[[Any], None],
        publish_resend: Callable[[Any], None],
        keys: Any,
        after_round: Callable[[RoundPlan | None], None],
        params: Callable[[], Any],
        resumed: bool,
        now_msg: Callable[[], Any],
        log: Any,
        encoder: Any = None,
    ) -> None:
        self.coord, self.updates_in, self.intake, self.models = coord, updates_in, intake, models
        self.publish_report = publish_report
        self.publish_announcement = publish_announcement
        self.publish_resend = publish_resend
        self.keys, self.after_round, self.params = keys, after_round, params
        self.resumed, self.now_msg, self.log = resumed, now_msg, log
        self.encoder = encoder  # the fleet encoder's stage (ServerEncoder), or None when off
        p = params()
        # Each round's outcome as scalars (TensorBoard by default when installed), in the run's
        # tb tree beside the robots' (state_dir is <run_dir>/server in a fleet).
        self.tracker = open_tracker_or_warn(
            p.tracking,
            p.tracking_dir or Path(p.state_dir).parent / "tb" / "server",
            "server",
            log.warning,
        )
        self._bytes_tracked = 0  # accepted update bytes already charged to an earlier round
        self.started = False  # round 0 was let go (the robots it waits for registered)
        self.start_time = time.monotonic()
        self.exit_code: int | None = None

    def ready_to_start(self) -> bool:
        p = self.params()
        return (
            self.coord.end_requested
            or ready_to_start(  # end_fleet before round 0: STAGE_DONE now
                registered=self.coord.roster.ids,
                expected=p.robots_expected,
                min_robots=p.min_robots,
                resumed=self.resumed,
                waited_s=time.monotonic() - self.start_time,
                registration_timeout_s=p.registration_timeout_s,
            )
        )

    def tick(self) -> None:
        if self.exit_code is not None or shutdown.requested():
            return  # stopping: robots vanish on purpose, their unfinished uploads are no fault
        try:
            for result in self.updates_in.completed():
                self.intake.complete(result)
            self.intake.audit_drops()
            if not self.started:
                if not self.ready_to_start():
                    return
                self.started = self.coord.held = True  # poll announces the round (not while paused)
            if self.encoder is not None:
                # Before poll: a policy round it holds is announced after the encoder it needs.
                self.encoder.tick()
            plan, outcome = self.coord.poll()
            if plan is not None or outcome is not None:
                self.publish_plan(plan, outcome)
            for request in self.updates_in.resend_requests():
                self.publish_resend(
                    String(data=sign_json(request, "update_resend", self.keys.signer))
                )
            if self.coord.failed_reason:
                self.log.error(f"giving up: {self.coord.failed_reason}")
                self.exit_code = 1
            elif (
                self.coord.finished
                and self.coord.collector is None
                and self.params().exit_when_done
            ):
                self.exit_code = 0
        except Exception as exc:  # noqa: BLE001 - e.g. the store failed: stop, restart resumes
            import traceback

            self.log.fatal(f"server failed: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            self.exit_code = 3

    def track(self, outcome: RoundOutcome) -> None:
        """The closed round's scalars to the tracker (never fails the round)."""
        update_bytes = self.intake.bytes_accepted - self._bytes_tracked
        self._bytes_tracked = self.intake.bytes_accepted
        try:
            self.tracker.scalars(outcome_scalars(outcome, update_bytes), outcome.round_idx)
            self.tracker.flush()
        except Exception as exc:  # noqa: BLE001 - a full disk must not stop the fleet
            self.log.warning(f"tracking round {outcome.round_idx} failed: {exc}")

    def publish_plan(self, plan: RoundPlan | None, outcome: RoundOutcome | None) -> None:
        """Models (when they changed), then the report, then the announcement."""
        if self.coord.round_idx != self.models.published_round:
            self.models.publish_models()
        if outcome is not None:
            if self.encoder is not None:
                outcome.diagnostics.update(self.encoder.take_diagnostics())
            self.publish_report(round_report_to_msg(outcome, self.now_msg()))
            self.log.info(
                f"round {outcome.round_idx}: {outcome.status} ({outcome.updates_accepted}/"
                f"{len(outcome.robots)} updates; model resend {self.models.resend_refused} "
                "refused)"
            )  # exact, unthrottled
            buffered = outcome.diagnostics
            if "buffered/updates" in buffered:
                self.log.info(
                    f"round {outcome.round_idx}: buffered aggregation of "
                    f"{buffered['buffered/updates']:.0f} update(s), "
                    f"{buffered['buffered/stale_updates']:.0f} stale (staleness up to "
                    f"{buffered['buffered/max_staleness']:.0f}, weight down to "
                    f"{buffered['buffered/min_weight']:.2f}), "
                    f"{buffered['buffered/waiting']:.0f} waiting"
                )
            self.after_round(plan)  # logs a round held back by the pause
            self.track(outcome)
        if plan is not None:
            ann = Announcement(
                round_idx=plan.round_idx,
                stage=plan.stage,
                deadline_s=plan.deadline_s,
                algorithm=plan.algorithm,
                participants=plan.participants,
                memberships=plan.memberships,
                quorum=plan.quorum,
                configs=plan.configs,
                encoder_version=self.encoder.version if self.encoder is not None else 0,
            )
            self.intake.forget_stale(plan)
            msg = announcement_to_msg(ann)
            msg.header.stamp = self.now_msg()
            # Signed: robots refuse a fake server's.
            self.publish_announcement(sign_msg(msg, "round", self.keys.signer))
            if self.keys.replay_guard is not None:
                # (buffered rounds still take updates of the last stale_rounds rounds)
                self.keys.replay_guard.advance(plan.round_idx - self.coord.stale_rounds)
            self.log.info(
                f"announced round {plan.round_idx} stage {plan.stage} to "
                f"{len(plan.participants)} robots (quorum {plan.quorum})"
            )
            if plan.stage == DONE:
                self.log.info("federation finished: robots keep their cluster models")
