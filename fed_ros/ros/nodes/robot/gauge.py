"""The robot node's ``/diagnostics`` reading: round state, model age, training throughput.

Reads the collaborators the node hands it (never the node): the model cache, the announcement
follower, the round driver, the learning gate and the start-up worker.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from fed_ros.core import diagnostics as D


def _interventions(tally: Any) -> tuple[float, float]:
    """(takeovers, human seconds) per episode of the last evaluation; NaN before any."""
    if tally is None or not tally.episodes:
        return math.nan, math.nan
    return tally.per_episode, tally.human_seconds_per_episode


class RobotGauge:
    """Robot counters -> Status (model age measured from when a newer model was first seen)."""

    def __init__(
        self,
        name: str,
        robot_id: str,
        *,
        transfer: Any,
        follower: Any,
        rounds: Any,
        gate: Any,
        registered: threading.Event,
        failed: Callable[[], str],
        arm_lock: Any,
        worker: Any,
        demos: Any,
    ) -> None:
        self.name, self.robot_id = name, robot_id
        self.transfer, self.follower, self.rounds, self.gate = transfer, follower, rounds, gate
        self.registered, self.failed = registered, failed
        self.arm_lock, self.worker, self.demos = arm_lock, worker, demos
        self._newest = -1
        self._seen_at: float | None = None

    def __call__(self) -> D.Status:
        models = self.transfer.models
        with models.lock:
            newest = max((v[0] for v in models.entries.values()), default=-1)
        if newest > self._newest:
            self._newest, self._seen_at = newest, time.monotonic()
        ann = self.follower.latest
        steps, seconds = self.rounds.last_train
        busy = (
            "driving the arm"
            if self.arm_lock.locked()
            else ("working" if self.worker.jobs.unfinished_tasks else "")
        )
        return D.robot_status(
            self.name,
            self.robot_id,
            D.RobotReading(
                learning_enabled=self.gate.enabled,
                registered=self.registered.is_set(),
                failed=self.failed(),
                round_idx=None if ann is None else ann.round_idx,
                stage="" if ann is None else ann.stage,
                model_age_s=None if self._seen_at is None else time.monotonic() - self._seen_at,
                last_rejection=self.transfer.uplink.last_rejection,
                transfer_errors=int(self.transfer.models_in.dropped_chunks),
                refused_control=sum(self.transfer.downlink.refused_control.values()),
                train_steps=steps,
                train_seconds=seconds,
                busy=busy,
                waiting_for_demos=self.demos.waiting,
                interventions=_interventions(self.rounds.last_interventions),
                intervention_segments=int(self.rounds.segments_recorded),
            ),
        )
