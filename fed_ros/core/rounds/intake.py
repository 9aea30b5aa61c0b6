"""The coordinator's intake of answers to the open stage: updates, descriptors, metrics,
heartbeats and declines, each admitted by its rule (:mod:`fed_ros.core.rounds.answers`,
:mod:`fed_ros.core.rounds.liveness`) against the stage collector that is open now.

A base class of :class:`fed_ros.core.rounds.coordinator.RoundCoordinator`, apart from it because
these read only the open collector, the clock and the sample cap: none decides when a round
closes or what it commits.
"""

from __future__ import annotations

import math
from typing import Any

from fed_ros.core.checks.decisions import Decision
from fed_ros.core.rounds.answers import (
    admit_decline,
    admit_descriptor,
    admit_metrics,
    admit_update,
    check_update_header,
)
from fed_ros.core.rounds.collect import StageCollector
from fed_ros.core.rounds.liveness import admit_heartbeat
from fed_ros.core.rounds.settings import RoundSettings


class StageAnswerIntake:
    """Answers offered to the open stage (``collector``), at the caller's time or ``clock()``."""

    collector: StageCollector | None
    settings: RoundSettings
    clock: Any

    def check_update(
        self, robot_id: str, round_idx: int, base_round: int, now: float | None = None
    ) -> Decision:
        """Pre-check an update's header (before its bytes arrive); counts nothing.

        The caller records a rejection once (:meth:`record_rejection`), whichever check
        refused it.
        """
        now = self.clock() if now is None else now
        return check_update_header(self.collector, robot_id, round_idx, base_round, now)

    def record_rejection(self, robot_id: str, reason: str) -> None:
        """Count a rejection decided elsewhere (transport, validation) in the open stage's
        report."""
        if self.collector is not None:
            self.collector.reject(robot_id, reason)

    def offer_update(self, update: Any, now: float | None = None) -> Decision:
        """Check and record a core ClientUpdate (``answers.admit_update``)."""
        now = self.clock() if now is None else now
        return admit_update(self.collector, update, now, self.settings.max_samples)

    def offer_descriptor(
        self, descriptor: Any, round_idx: int, now: float | None = None
    ) -> Decision:
        """Check and record a core ClientDescriptor answering a DESCRIBE or SCORE stage."""
        now = self.clock() if now is None else now
        return admit_descriptor(
            self.collector, descriptor, round_idx, now, self.settings.max_samples
        )

    def offer_metrics(
        self,
        robot_id: str,
        success_rate: float,
        now: float | None = None,
        interventions: tuple[float, float] = (math.nan, math.nan),
    ) -> Decision:
        """Record a robot's closed-loop success rate (and its human interventions per episode)
        answering an EVALUATE stage."""
        now = self.clock() if now is None else now
        return admit_metrics(self.collector, robot_id, success_rate, now, interventions)

    def offer_heartbeat(
        self,
        robot_id: str,
        round_idx: int,
        seq: int,
        steps: tuple[int, int],
        now: float | None = None,
    ) -> Decision:
        """A (signature-checked) training heartbeat: ``steps`` = (done, expected); progress
        extends the robot's deadline (``liveness.admit_heartbeat``)."""
        now = self.clock() if now is None else now
        return admit_heartbeat(self.collector, robot_id, round_idx, seq, *steps, now)

    def offer_decline(self, robot_id: str, reason: str, now: float | None = None) -> Decision:
        """A participant's answer that it will not answer the open stage, with why
        (``answers.admit_decline``)."""
        now = self.clock() if now is None else now
        return admit_decline(self.collector, robot_id, reason, now)
