"""Health of the fleet's nodes as diagnostic statuses, built from plain counters (ROS-free).

The nodes publish these as ``diagnostic_msgs/DiagnosticArray`` on ``/diagnostics`` (about
1 Hz, :mod:`fed_ros.ros.wire.diagnostics`), so rqt_robot_monitor and Foxglove show fleet
health. Levels follow diagnostic_msgs/DiagnosticStatus: OK 0, WARN 1, ERROR 2, STALE 3.
Each builder returns one :class:`Status`: a level, a one-line message that says why
(the first reason that is not OK), and key/value pairs (strings, as the message carries).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

OK, WARN, ERROR, STALE = 0, 1, 2, 3


@dataclass(frozen=True)
class Status:
    """One DiagnosticStatus, ROS-free."""

    name: str  # e.g. "fed_ros/robot_0/arm_adapter"
    level: int
    message: str
    hardware_id: str = ""
    values: dict[str, str] = field(default_factory=dict)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return str(value)


def _status(
    name: str,
    hardware_id: str,
    problems: list[tuple[int, str]],
    ok_message: str,
    values: dict[str, object],
) -> Status:
    level = max((lvl for lvl, _ in problems), default=OK)
    message = "; ".join(text for lvl, text in problems if lvl == level) if problems else ok_message
    return Status(name, level, message, hardware_id, {k: _fmt(v) for k, v in values.items()})


class TripWindow:
    """Counts that grew since the previous report (a trip in the last period is a WARN)."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def grew(self, key: str, total: int) -> int:
        """How much ``total`` grew since the last call with ``key`` (0 at the first call)."""
        before = self._last.get(key, total)
        self._last[key] = total
        return max(0, total - before)


@dataclass(frozen=True)
class AdapterReading:
    """One reading of an arm adapter's safety counters and episode state."""

    watchdog_trips: int
    recent_trips: int
    clipped_values: int
    clipped_commands: int
    workspace_limited: int
    rejected: int
    held_ticks: int
    hold: bool
    missing: list[str]
    episode: int
    step: int
    done: bool
    lockstep: bool = False
    watchdog_holding: bool = False
    human_control: bool = False
    interventions: int = 0
    dropped_for_human: int = 0


def adapter_status(name: str, profile: str, reading: AdapterReading) -> Status:
    """Arm adapter: WARN while held, while the watchdog holds an active episode or after a
    trip in the last period, or while arm topics are missing; the safety counters as values."""
    r = reading
    problems: list[tuple[int, str]] = []
    if r.hold:
        problems.append((WARN, "hold set: arm stopped"))
    if r.recent_trips or r.watchdog_holding:
        problems.append(
            (WARN, f"watchdog tripped ({r.watchdog_trips} so far): no policy command in time")
        )
    if r.missing:
        problems.append((WARN, f"missing {len(r.missing)} arm topic(s): " + "; ".join(r.missing)))
    return _status(
        name,
        profile,
        problems,
        "ok, a human drives (teleop)" if r.human_control else "ok",
        {
            "profile": profile,
            "hold": r.hold,
            "watchdog_trips": r.watchdog_trips,
            "clipped_values": r.clipped_values,
            "clipped_commands": r.clipped_commands,
            "workspace_limited": r.workspace_limited,
            "rejected_commands": r.rejected,
            "held_ticks": r.held_ticks,
            "missing_topics": len(r.missing),
            "episode": r.episode,
            "step": r.step,
            "episode_done": r.done,
            "lockstep": r.lockstep,
            "watchdog_holding": r.watchdog_holding,
            "human_control": r.human_control,
            "episode_interventions": r.interventions,
            "policy_commands_dropped_for_human": r.dropped_for_human,
        },
    )


@dataclass(frozen=True)
class RobotReading:
    """One reading of a robot node's round state, model age and training throughput."""

    learning_enabled: bool
    registered: bool
    failed: str
    round_idx: int | None
    stage: str
    model_age_s: float | None
    last_rejection: str
    transfer_errors: int
    refused_control: int
    train_steps: int
    train_seconds: float
    busy: str
    waiting_for_demos: str = ""
    interventions: tuple[float, float] = (math.nan, math.nan)
    intervention_segments: int = 0


def robot_status(name: str, robot_id: str, reading: RobotReading) -> Status:
    """Robot node: ERROR after a failed start-up, WARN while learning is gated off, while it waits
    for demonstrations or the server rejected our last update; round state, model age and
    training throughput; the last evaluation's human interventions (takeovers and human seconds
    per episode, NaN before any) and the segments recorded as corrective demonstrations."""
    r = reading
    problems: list[tuple[int, str]] = []
    if r.failed:
        problems.append((ERROR, r.failed))
    if r.waiting_for_demos:
        problems.append((WARN, r.waiting_for_demos))
    if not r.learning_enabled:
        problems.append(
            (WARN, "learning disabled (gate off): not training, collecting or evaluating")
        )
    if r.last_rejection:
        problems.append((WARN, f"last update rejected: {r.last_rejection}"))
    throughput = r.train_steps / r.train_seconds if r.train_seconds > 0 else math.nan
    where = (
        f"round {r.round_idx} {r.stage}" if r.round_idx is not None else "no round announced yet"
    )
    return _status(
        name,
        robot_id,
        problems,
        f"{where}, {r.busy or 'idle'}",
        {
            "learning_enabled": r.learning_enabled,
            "registered": r.registered,
            "round": "" if r.round_idx is None else r.round_idx,
            "stage": r.stage,
            "busy": r.busy or "idle",
            "last_model_age_s": math.nan if r.model_age_s is None else r.model_age_s,
            "last_rejection": r.last_rejection,
            "transfer_errors": r.transfer_errors,
            "refused_control_messages": r.refused_control,
            "last_train_steps": r.train_steps,
            "train_steps_per_s": throughput,
            "waiting_for_demonstrations": r.waiting_for_demos,
            "interventions_per_episode": r.interventions[0],
            "human_seconds_per_episode": r.interventions[1],
            "intervention_segments_recorded": r.intervention_segments,
        },
    )


@dataclass(frozen=True)
class ServerReading:
    """One reading of the server's round, roster and update counters."""

    round_idx: int
    stage: str
    robots_registered: int
    robots_expected: int
    accepted: int
    rejected: int
    last_rejection: str
    done: bool
    rounds_enabled: bool = True
    held: bool = False
    ending: bool = False
    resend_refused: int = 0


def server_status(name: str, reading: ServerReading) -> Status:
    """Server: WARN while fewer robots than expected are registered, while rounds are paused
    (``rounds_enabled`` false; ``held``: a round waits for the resume) or the federation is
    ending (``~/end_fleet``); round, stage and update counts."""
    r = reading
    problems: list[tuple[int, str]] = []
    if r.robots_registered < r.robots_expected:
        problems.append((WARN, f"{r.robots_registered}/{r.robots_expected} robots registered"))
    if r.ending and not r.done:
        problems.append((WARN, "ending: the federation ends after the current round (end_fleet)"))
    elif not r.rounds_enabled and not r.done:
        problems.append(
            (
                WARN,
                f"rounds paused (rounds_enabled false): round {r.round_idx} waits for a resume"
                if r.held
                else "rounds paused (rounds_enabled false): the current round finishes, no new one",
            )
        )
    return _status(
        name,
        "fed_ros_server",
        problems,
        "federation finished" if r.done else f"round {r.round_idx} {r.stage}",
        {
            "round": r.round_idx,
            "stage": r.stage,
            "robots_registered": r.robots_registered,
            "robots_expected": r.robots_expected,
            "updates_accepted": r.accepted,
            "updates_rejected": r.rejected,
            "last_rejection": r.last_rejection,
            "done": r.done,
            "rounds_enabled": r.rounds_enabled,
            "ending": r.ending,
            "model_resend_refused": r.resend_refused,
        },
    )
