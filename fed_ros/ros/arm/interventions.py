"""A human's takeovers during a policy rollout, seen from the robot node (issue 24, item 5).

The arm adapter decides who drives (:class:`fed_ros.core.arm.interventions.ControlArbiter`) and
says so in every EpisodeStatus (``human_control``, and the episode's ``interventions`` and
``human_seconds`` so far). While a human drives, the robot's policy does not act (the adapter
would drop its commands anyway); :class:`HandoverWatch` follows the flag through one episode and
calls its hooks at each change. :class:`InterventionRecorder` is the robot node's hooks: each
human segment is recorded as a corrective demonstration (``source=intervention``, labelled a
success: the human's actions are the correction) into the robot's demonstrations, so the next
round's training holds it (human-gated DAgger, as in Fleet-DAgger / physical-IFL).

The hooks run in the policy's thread, which acts again only when ``handback`` returns: the
segment ends at the hand-back's observation (the recorder keeps nothing stamped from it on)
and is closed and converted in a worker thread, so the policy resumes at once.
"""

from __future__ import annotations

import threading
from typing import Any

from fed_ros.core.arm.interventions import INTERVENTION_SOURCE
from fed_ros.ros.arm import topics as at

# A takeover shorter than this (a bumped deadman) is no demonstration: its recording is dropped.
MIN_SEGMENT_STEPS = 3


class HandoverWatch:
    """``update(status)``: whether the human drives now; calls ``hooks.takeover(status)`` /
    ``hooks.handback(status)`` when that changes, and ``end(status)`` hands back at the end."""

    def __init__(self, hooks: Any = None) -> None:
        self.hooks, self.human = hooks, False

    def update(self, status: Any) -> bool:
        human = bool(getattr(status, "human_control", False))
        if human != self.human:
            self.human = human
            if self.hooks is not None:
                (self.hooks.takeover if human else self.hooks.handback)(status)
        return human

    def end(self, status: Any) -> None:
        """The episode ended (the human may still hold the deadman): close an open segment."""
        if self.human:
            self.human = False
            if self.hooks is not None:
                self.hooks.handback(status)


class InterventionRecorder:
    """Records each human segment through the robot's ``recorder`` (fed_ros.ros.arm.recorder).

    An operator's own recording (the Record service) is never touched: a takeover while one is
    open records nothing. ``recorded`` counts the segments kept, ``dropped`` the short ones."""

    def __init__(
        self, recorder: Any, variation: str, log: Any, min_steps: int = MIN_SEGMENT_STEPS
    ) -> None:
        self.recorder, self.variation, self.log, self.min_steps = (
            recorder,
            variation,
            log,
            min_steps,
        )
        self.recorded = self.dropped = 0
        self._first_step: int | None = None  # the segment's first step while it is recorded
        self._saving: threading.Thread | None = None  # the last segment being saved

    def takeover(self, status: Any) -> None:
        self.wait()  # the last segment closed first (the policy does not act meanwhile)
        try:
            self.recorder.start(
                status.task, status.instruction, self.variation, source=INTERVENTION_SOURCE
            )
        except (RuntimeError, ValueError) as exc:  # e.g. an operator's recording is open
            self.log.warning(f"human took over at step {status.step}; not recorded: {exc}")
            return
        self._first_step = int(status.step)
        self.log.info(f"human took over at step {status.step} of episode {status.episode}")

    def handback(self, status: Any) -> None:
        if self._first_step is None:
            return
        steps, self._first_step = int(status.step) - self._first_step, None
        if steps < self.min_steps:
            self.recorder.discard()
            self.dropped += 1
            self.log.info(f"human segment of {steps} step(s) dropped (< {self.min_steps})")
            return
        # The segment ends here, before the policy's first command can be recorded in it.
        # Closing and converting it takes a while (seconds on a loaded machine, with cameras):
        # a worker does that, the policy drives again now.
        end_ns = at.stamp_to_ns(status.header.stamp)
        self.recorder.end_at(end_ns)
        self.log.info(f"human handed back at step {status.step}: the policy drives again")
        self._saving = threading.Thread(
            target=self._save, args=(int(status.step), end_ns), name="intervention-save"
        )
        self._saving.start()

    def wait(self, timeout: float | None = None) -> None:
        """Until the last segment is saved (call before reading ``recorded`` or training)."""
        if self._saving is not None:
            self._saving.join(timeout)

    def _save(self, step: int, end_ns: int) -> None:
        try:
            result = self.recorder.stop(True, end_stamp_ns=end_ns)
        except Exception as exc:  # noqa: BLE001 - a bad segment costs itself, never the rollout
            self.log.warning(f"human segment not recorded: {type(exc).__name__}: {exc}")
            return
        self.recorded += 1
        self.log.info(
            f"human segment up to step {step}: {result.num_steps} step(s) recorded as a "
            f"corrective demonstration ({result.path.name}), trained from the next round"
        )
