"""Liveness beyond deadlines: training-progress heartbeats extend a slow robot's deadline.

A robot whose onboard computer is slower than the fleet's ``round_timeout_s`` assumes (a Jetson
beside workstations) used to be dropped as a straggler, whatever progress it made. While it
trains it now sends a small signed heartbeat (steps done, steps expected). Each one that shows
progress moves that robot's own deadline to ``heartbeat time + heartbeat_timeout_s``, never past
``announced deadline + max_extension_s`` (the per-fleet cap). When heartbeats stop (the robot
died, or its link stayed down longer than ``heartbeat_timeout_s``) the extension runs out and
the robot is dropped as before. A link outage shorter than ``heartbeat_timeout_s`` costs nothing:
the next heartbeat after it extends again.

Pure: times are the caller's clock (the server's receipt time, never the robot's claim). The
signature is checked by the caller (:mod:`fed_ros.core.checks` style: the allow-list); what is
decided here is whether a heartbeat is admissible and what it extends:

- only from a participant of the open TRAIN stage of its round, answering nothing yet;
- with a sequence number above the last one of that robot in this round (a replay, or a
  reordered old heartbeat, extends nothing);
- with ``steps_done <= expected_steps <= max_steps`` (the round config's ``local_steps`` when it
  sets one, else the fleet's ``heartbeat_step_budget``): a robot claiming more work than its budget
  is refused;
- it extends only when it is the robot's first accepted heartbeat of the round (training has
  started: the robot sends one at step 0, after its model arrived and its data loaded, so a slow
  start is not a straggler) or its ``steps_done`` rose above the last accepted one (the last
  step done included: the update is on its way). A robot whose steps stand still (hung in a
  step, stuck at step 0, or repeating "done") gets no further extension: it is dropped
  ``heartbeat_timeout_s`` after the heartbeat that last showed progress, however many it sends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fed_ros.core.checks.decisions import (
    ACCEPTED,
    Decision,
    LATE,
    MALFORMED,
    NOT_PARTICIPANT,
    REPLAY,
    _is_int,
    _reject,
)

BUDGET = "step_budget"  # reject code: progress claimed beyond the round's step budget
NO_STAGE = "no_train_stage"  # reject code: no TRAIN stage of that round is open


@dataclass(frozen=True)
class LivenessSettings:
    """The fleet's heartbeat rules (server parameters).

    heartbeat_timeout_s: silence after a heartbeat before its extension runs out (robots send
        one every ``heartbeat_period_s``, 5 s by default: 4 periods tolerate a link outage of
        2 periods wherever it falls between two heartbeats).
    max_extension_s: the cap: no robot's deadline moves past announced deadline + this
        (0 = heartbeats extend nothing: every robot keeps the announced deadline).
    heartbeat_step_budget: the step budget when the round config sets no ``local_steps``.
    """

    heartbeat_timeout_s: float = 20.0
    max_extension_s: float = 600.0
    heartbeat_step_budget: int = 1_000_000

    def __post_init__(self) -> None:
        if not self.heartbeat_timeout_s > 0:
            raise ValueError(f"heartbeat_timeout_s must be > 0, got {self.heartbeat_timeout_s}")
        if not self.max_extension_s >= 0:
            raise ValueError(f"max_extension_s must be >= 0, got {self.max_extension_s}")
        if not _is_int(self.heartbeat_step_budget) or self.heartbeat_step_budget < 1:
            raise ValueError(
                f"heartbeat_step_budget must be an int >= 1, got {self.heartbeat_step_budget!r}"
            )


@dataclass
class _RobotProgress:
    seq: int
    steps_done: int
    expected_steps: int
    deadline_s: float  # this robot's extended deadline


@dataclass
class ProgressLedger:
    """The heartbeats of one announced TRAIN stage: each robot's last progress and deadline."""

    round_idx: int
    announced_deadline_s: float
    participants: frozenset[str]
    step_budgets: dict[str, int]  # robot -> the most steps its round config allows
    settings: LivenessSettings = field(default_factory=LivenessSettings)
    robots: dict[str, _RobotProgress] = field(default_factory=dict)

    def deadline_for(self, robot_id: str) -> float:
        """The robot's deadline: the announced one, or later while its heartbeats show progress."""
        p = self.robots.get(robot_id)
        return self.announced_deadline_s if p is None else p.deadline_s

    @property
    def cap_s(self) -> float:
        """No deadline of this stage moves past this."""
        return self.announced_deadline_s + self.settings.max_extension_s

    def offer(
        self,
        robot_id: str,
        round_idx: int,
        seq: int,
        steps_done: int,
        expected_steps: int,
        now: float,
        answered: bool = False,
    ) -> Decision:
        """Admit one (signature-checked) heartbeat at time ``now``; extend on progress."""
        if not isinstance(robot_id, str) or not robot_id:
            return _reject(MALFORMED, f"heartbeat robot id {robot_id!r} must be a non-empty string")
        for what, value in (
            ("round", round_idx),
            ("seq", seq),
            ("steps_done", steps_done),
            ("expected_steps", expected_steps),
        ):
            if not _is_int(value) or value < 0:
                return _reject(
                    MALFORMED, f"heartbeat from {robot_id!r}: {what} {value!r} is not an int >= 0"
                )
        if round_idx != self.round_idx:
            return _reject(
                NO_STAGE,
                f"heartbeat from {robot_id!r} for round {round_idx}: the open TRAIN stage is "
                f"round {self.round_idx}",
            )
        if robot_id not in self.participants:
            return _reject(
                NOT_PARTICIPANT,
                f"heartbeat from {robot_id!r}: not a participant of round {round_idx}",
            )
        budget = self.step_budgets.get(robot_id, self.settings.heartbeat_step_budget)
        if expected_steps > budget or steps_done > expected_steps:
            return _reject(
                BUDGET,
                f"heartbeat from {robot_id!r}: {steps_done} of {expected_steps} steps claimed, "
                f"the round's step budget is {budget}",
            )
        last = self.robots.get(robot_id)
        if last is not None and seq <= last.seq:
            return _reject(
                REPLAY,
                f"heartbeat from {robot_id!r}: sequence {seq} is not above the last one "
                f"({last.seq}) of round {round_idx}",
            )
        deadline = self.deadline_for(robot_id)
        if now > deadline:
            return _reject(
                LATE,
                f"heartbeat from {robot_id!r}: {now - deadline:.1f} s after its deadline "
                f"of round {round_idx} (dropped)",
            )
        # The first heartbeat says training started; after it only rising steps count, so
        # repeating one step (0, or the last with the update "on its way") holds nothing open.
        progressed = last is None or steps_done > last.steps_done
        if progressed and not answered:
            deadline = max(deadline, min(now + self.settings.heartbeat_timeout_s, self.cap_s))
        self.robots[robot_id] = _RobotProgress(seq, steps_done, expected_steps, deadline)
        return ACCEPTED

    def progress(self, robot_id: str) -> tuple[int, int] | None:
        """(steps done, steps expected) of the robot's last accepted heartbeat, if any."""
        p = self.robots.get(robot_id)
        return None if p is None else (p.steps_done, p.expected_steps)


def attach_ledger(collector, settings: LivenessSettings) -> None:
    """Give a freshly announced TRAIN stage's collector its heartbeat ledger (others get none)."""
    plan = collector.plan
    if plan.stage != "train":
        return
    budgets = {
        r: (c.local_steps if c.local_steps is not None else settings.heartbeat_step_budget)
        for r, c in plan.configs.items()
    }
    collector.ledger = ProgressLedger(
        round_idx=plan.round_idx,
        announced_deadline_s=plan.deadline_s,
        participants=frozenset(plan.participants),
        step_budgets=budgets,
        settings=settings,
    )


def admit_heartbeat(
    collector,
    robot_id: str,
    round_idx: int,
    seq: int,
    steps_done: int,
    expected_steps: int,
    now: float,
) -> Decision:
    """A heartbeat offered to the open stage: refused unless a TRAIN stage of its round is open."""
    ledger = None if collector is None else collector.ledger
    if ledger is None:
        stage = collector.plan.stage if collector is not None else "none"
        return _reject(
            NO_STAGE, f"heartbeat from {robot_id!r}: no TRAIN stage is open (stage {stage})"
        )
    answered = robot_id in collector.answers and robot_id not in collector.carried
    return ledger.offer(robot_id, round_idx, seq, steps_done, expected_steps, now, answered)
