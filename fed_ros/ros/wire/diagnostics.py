"""``/diagnostics`` (diagnostic_msgs/DiagnosticArray) for the fleet's nodes, about 1 Hz.

The statuses are built by the pure helpers of :mod:`fed_ros.core.diagnostics`; this module
only reads each node's counters (``*_snapshot``) and publishes. A node adds one line::

    attach(self, "robot")   # or "server", "adapter"

``/diagnostics`` is absolute (what rqt_robot_monitor and Foxglove read, via the aggregator
or directly); status names are ``fed_ros/<node namespace>/<role>`` so robots do not collide.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

from fed_ros.core import diagnostics as D

TOPIC = "/diagnostics"
PERIOD_S = 1.0


def to_msg(statuses: list[D.Status], stamp) -> Any:
    """Statuses -> DiagnosticArray."""
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

    array = DiagnosticArray()
    array.header.stamp = stamp
    for s in statuses:
        array.status.append(
            DiagnosticStatus(
                level=bytes([s.level]),
                name=s.name,
                message=s.message[:1000],
                hardware_id=s.hardware_id,
                values=[KeyValue(key=k, value=v[:1000]) for k, v in s.values.items()],
            )
        )
    return array


def _name(node, role: str) -> str:
    ns = node.get_namespace().strip("/")
    return f"fed_ros/{ns}/{role}" if ns else f"fed_ros/{role}"


def _interventions(tally) -> tuple[float, float]:
    """(takeovers, human seconds) per episode of the last evaluation; NaN before any."""
    if tally is None or not tally.episodes:
        return math.nan, math.nan
    return tally.per_episode, tally.human_seconds_per_episode


class _RobotGauge:
    """Robot node counters -> Status (model age measured from when a newer model was first seen)."""

    def __init__(self, node) -> None:
        self.node = node
        self._newest = -1
        self._seen_at: float | None = None

    def __call__(self) -> D.Status:
        n = self.node
        with n.transfer.models.lock:
            newest = max((v[0] for v in n.transfer.models.entries.values()), default=-1)
        if newest > self._newest:
            self._newest, self._seen_at = newest, time.monotonic()
        ann = n.follower.latest
        rounds = getattr(n, "rounds", None)
        steps, seconds = getattr(rounds, "last_train", (0, 0.0))
        busy = (
            "driving the arm"
            if n.arm_lock.locked()
            else ("working" if n.worker.jobs.unfinished_tasks else "")
        )
        return D.robot_status(
            _name(n, "robot"),
            n.robot_id,
            learning_enabled=n.gate.enabled,
            registered=n.registered.is_set(),
            failed=n.failed,
            round_idx=None if ann is None else ann.round_idx,
            stage="" if ann is None else ann.stage,
            model_age_s=None if self._seen_at is None else time.monotonic() - self._seen_at,
            last_rejection=n.uplink.last_rejection,
            transfer_errors=int(n.transfer.models_in.dropped_chunks),
            refused_control=sum(n.downlink.refused_control.values()),
            train_steps=steps,
            train_seconds=seconds,
            busy=busy,
            waiting_for_demos=n.demos.waiting,
            interventions=_interventions(getattr(rounds, "last_interventions", None)),
            intervention_segments=int(getattr(rounds, "segments_recorded", 0)),
        )


class _ServerGauge:
    """Server counters -> Status; rejections summed over the run's stage collectors."""

    def __init__(self, node) -> None:
        self.node = node
        self._collector = None
        self._closed_rejected = 0
        self._last_rejection = ""

    def __call__(self) -> D.Status:
        n = self.node
        col = n.coord.collector
        if col is not self._collector:
            if self._collector is not None:
                self._closed_rejected += self._collector.rejected
            self._collector = col
        if col is not None and col.rejections:
            rid, reason = col.rejections[-1]
            self._last_rejection = f"{rid}: {reason}"[:300]
        plan = n.coord.current_plan
        p = n.params
        expected = len(p.robots_expected) if p.robots_expected else int(p.min_robots)
        held = bool(
            n.coord.held and n.coord.paused
        )  # a round closed, the next waits for the resume
        return D.server_status(
            _name(n, "server"),
            round_idx=int(n.coord.round_idx),
            stage=plan.stage if plan else ("paused" if held else "waiting"),
            robots_registered=len(n.coord.roster),
            robots_expected=expected,
            accepted=int(n.intake.completed),
            rejected=self._closed_rejected + (col.rejected if col is not None else 0),
            last_rejection=self._last_rejection,
            done=bool(n.coord.finished),
            rounds_enabled=not n.coord.paused,
            held=held,
            ending=bool(n.coord.end_requested),
            resend_refused=int(n.models.resend_refused),
        )


class _AdapterGauge:
    """Arm adapter safety counters -> Status (a watchdog trip in the last period is WARN)."""

    def __init__(self, node) -> None:
        self.node = node
        self._window = D.TripWindow()

    def __call__(self) -> D.Status:
        n = self.node
        with n.lock:
            c, trips = n.safety.counters, n.safety.watchdog.trips
            values = dict(
                clipped_values=c.clipped_values,
                clipped_commands=c.clipped_commands,
                workspace_limited=c.workspace_limited,
                rejected=c.rejected,
                held_ticks=c.held_ticks,
                hold=n.safety.hold_requested,
                episode=n.episode.number,
                step=n.episode.step,
                done=n.episode.done,
                human_control=n.episode.control.human_active(time.monotonic()),
                interventions=n.episode.control.interventions,
                dropped_for_human=n.episode.control.dropped,
            )
            # An episode running without policy commands: the watchdog holds the arm now.
            values["watchdog_holding"] = bool(
                not n.episode.done
                and n.episode.number > 0
                and not n.safety.hold_requested
                and n.safety.watchdog.silent(time.monotonic())
            )
            trips = n.safety.watchdog.trips
        return D.adapter_status(
            _name(n, "arm_adapter"),
            n.profile.name,
            watchdog_trips=trips,
            recent_trips=self._window.grew("trips", trips),
            missing=n.missing(),
            lockstep=n.lockstep,
            **values,
        )


_GAUGES: dict[str, Callable[[Any], Callable[[], D.Status]]] = {
    "robot": _RobotGauge,
    "server": _ServerGauge,
    "adapter": _AdapterGauge,
}


def attach(node, role: str, period_s: float = PERIOD_S, callback_group=None):
    """Publish ``role``'s status on /diagnostics every ``period_s``; returns the timer."""
    from diagnostic_msgs.msg import DiagnosticArray

    gauge = _GAUGES[role](node)
    pub = node.create_publisher(
        DiagnosticArray, TOPIC, 10
    )  # as diagnostic_updater: reliable, depth 10

    def publish() -> None:
        try:
            status = gauge()
        except Exception as exc:  # noqa: BLE001 - a broken gauge must say so, not kill the node
            status = D.Status(
                _name(node, role), D.ERROR, f"diagnostics failed: {type(exc).__name__}: {exc}"
            )
        pub.publish(to_msg([status], node.get_clock().now().to_msg()))

    return node.create_timer(period_s, publish, callback_group=callback_group)
