"""One announced stage of a round and the answers to it (pure, no ROS).

:class:`RoundPlan` is one announcement (participants, memberships, per-robot round configs,
deadline, quorum); :class:`StageCollector` checks each answer against it (not a participant,
stale or future round, stale base model, late, duplicate), records acceptances and
rejections with their reasons, and decides at time ``now`` whether to wait, proceed (every
participant answered, or a quorum by the deadline, stragglers dropped) or abandon.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from fed_ros.core.checks.decisions import (
    ACCEPTED,
    DUPLICATE,
    Decision,
    FUTURE,
    LATE,
    NOT_PARTICIPANT,
    STALE_BASE,
    STALE_ROUND,
)
from fed_ros.core.rounds.config import Membership, RoundConfig

# Stage names match fed_ros.ros.wire.conversions.STAGES (RoundAnnouncement.STAGE_*).
TRAIN, DESCRIBE, SCORE, EVALUATE, DONE = "train", "describe", "score", "evaluate", "done"
STAGES = (TRAIN, DESCRIBE, SCORE, EVALUATE, DONE)


def quorum_for(participants: int, fraction: float, minimum: int) -> int:
    """Updates needed to aggregate: ceil(fraction * participants), at least ``minimum``, at most
    all."""
    if participants < 0:
        raise ValueError(f"participants must be >= 0, got {participants}")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"quorum fraction must be in (0, 1], got {fraction}")
    if minimum < 1:
        raise ValueError(f"minimum quorum must be >= 1, got {minimum}")
    return min(participants, max(minimum, math.ceil(fraction * participants - 1e-9)))


def ready_clusters(answers: Mapping[str, Any], targets: Mapping[int, int]) -> list[int]:
    """Clusters whose buffered updates (``answers``: robot -> update with ``cluster_id``) reached
    their target; an update for a cluster without a target counts toward a target of 1."""
    counts: dict[int, int] = {}
    for update in answers.values():
        cid = int(getattr(update, "cluster_id", -1))
        counts[cid] = counts.get(cid, 0) + 1
    return sorted(c for c, n in counts.items() if n >= max(1, int(targets.get(c, 1))))


@dataclass(frozen=True)
class RoundPlan:
    """One announcement: what the node publishes as a RoundAnnouncement."""

    round_idx: int
    stage: str
    attempt: int
    deadline_s: float
    algorithm: str
    participants: tuple[str, ...]
    memberships: dict[str, Membership]
    quorum: int
    configs: dict[str, RoundConfig] = field(default_factory=dict)  # what each robot must obey
    # Buffered (asynchronous) TRAIN stages: updates each cluster needs before it is aggregated
    # (empty: a synchronous stage), and how many rounds old an update may be.
    buffer_targets: dict[int, int] = field(default_factory=dict)
    max_staleness: int = 0


@dataclass(frozen=True)
class StageDecision:
    """What a stage's collection decided at time ``now`` (wait, proceed or abandon the stage)."""

    kind: str  # "wait" | "proceed" | "abandon"
    answered: tuple[str, ...] = ()
    stragglers: tuple[str, ...] = ()
    reason: str = ""


class StageCollector:
    """Collects the answers (updates or descriptors) to one announcement."""

    def __init__(self, plan: RoundPlan, carried: Mapping[str, Any] | None = None) -> None:
        self.plan = plan
        # Answers to an abandoned attempt of the same round and stage stay valid (same model
        # version): they count toward this attempt until the robot answers afresh.
        self.answers: dict[str, Any] = dict(carried or {})
        self.carried: set[str] = set(self.answers)
        self.rejections: list[tuple[str, str]] = []  # participants only: the report's reasons
        self.rejected = (
            0  # every rejection, whoever sent it (unknown senders leave only this count)
        )
        # Participants that said why they will not answer (e.g. a new arm still waiting for its
        # demonstrations): shown in the report, not counted as rejections, no answer either.
        self.declined: dict[str, str] = {}
        # TRAIN stages: robots whose heartbeats show progress have later deadlines of their own
        # (fed_ros.core.rounds.liveness); None = every robot has the announced deadline.
        self.ledger: Any = None

    def deadline_for(self, robot_id: str) -> float:
        """The robot's deadline: the announced one, or its heartbeat extension."""
        if self.ledger is None:
            return self.plan.deadline_s
        return max(self.plan.deadline_s, self.ledger.deadline_for(robot_id))

    def check(
        self, robot_id: str, round_idx: int, now: float, base_round: int | None = None
    ) -> Decision:
        """Whether an answer from ``robot_id`` for ``round_idx`` may be accepted now."""
        plan = self.plan
        if robot_id not in plan.participants:
            return Decision(
                False,
                reason=f"robot {robot_id!r} is not a participant of round {plan.round_idx}",
                code=NOT_PARTICIPANT,
            )
        buffered_stale = (
            base_round is not None
            and plan.max_staleness > 0
            and plan.round_idx - plan.max_staleness <= round_idx < plan.round_idx
        )
        if round_idx < plan.round_idx and not buffered_stale:
            return Decision(
                False,
                reason=f"stale: answer for round {round_idx}, current round is {plan.round_idx}",
                code=STALE_ROUND,
            )
        if round_idx > plan.round_idx:
            return Decision(
                False,
                reason=f"future round {round_idx}, current round is {plan.round_idx}",
                code=FUTURE,
            )
        if base_round is not None and base_round != round_idx:
            return Decision(
                False,
                reason=f"stale base: trained from model version {base_round}, "
                f"round {round_idx} starts from version {round_idx}",
                code=STALE_BASE,
            )
        deadline = self.deadline_for(robot_id)
        if now > deadline:
            return Decision(
                False,
                reason=f"late: arrived {now - deadline:.1f} s after the deadline "
                f"of round {plan.round_idx}",
                code=LATE,
            )
        held = self.answers.get(robot_id)
        newer = held is not None and round_idx > int(getattr(held, "round_idx", round_idx))
        if robot_id in self.answers and robot_id not in self.carried and not newer:
            # (A buffered robot's update of a later round replaces its older one still waiting.)
            return Decision(
                False,
                reason=f"duplicate answer from {robot_id!r} for round {plan.round_idx} "
                f"({plan.stage})",
                code=DUPLICATE,
            )
        return ACCEPTED

    def accept(self, robot_id: str, answer: Any) -> None:
        """Record an answer that passed :meth:`check` (and any content validation)."""
        self.answers[robot_id] = answer
        self.carried.discard(robot_id)

    def decline(self, robot_id: str, reason: str) -> None:
        """Record a participant's reason for not answering this stage (the first one counts)."""
        self.declined.setdefault(robot_id, reason)

    def reject(self, robot_id: str, reason: str, code: str = "") -> Decision:
        """Record a rejection (counted in the round report)."""
        self.rejected += 1
        # Bounded: the first reason per participant is what the report shows; junk ids from
        # unknown senders and repeats leave only the count.
        if robot_id in self.plan.participants and all(r != robot_id for r, _ in self.rejections):
            self.rejections.append((robot_id, reason))
        return Decision(False, code, reason)

    def decision(self, now: float) -> StageDecision:
        """Proceed when everyone answered, or at the deadline with a quorum; else abandon/wait.
        A buffered TRAIN stage proceeds as soon as one cluster's buffer is full
        (:meth:`buffered_decision`)."""
        plan = self.plan
        if plan.buffer_targets and plan.stage == TRAIN:
            return self.buffered_decision(now)
        answered = tuple(r for r in plan.participants if r in self.answers)
        missing = tuple(r for r in plan.participants if r not in self.answers)
        if not missing:
            return StageDecision("proceed", answered)
        if now <= plan.deadline_s or any(now <= self.deadline_for(r) for r in missing):
            # A straggler whose heartbeats still show progress keeps the stage open (up to the
            # fleet's cap, see fed_ros.core.rounds.liveness).
            return StageDecision("wait", answered, missing)
        if len(answered) >= plan.quorum:
            return StageDecision(
                "proceed",
                answered,
                missing,
                f"deadline passed: {len(missing)} straggler(s) dropped: {', '.join(missing)}",
            )
        return StageDecision(
            "abandon",
            answered,
            missing,
            f"below quorum: {len(answered)} of {plan.quorum} required answers by the deadline",
        )

    def buffered_decision(self, now: float) -> StageDecision:
        """Proceed with the robots of every cluster whose buffer holds its target (the others'
        updates wait for a later round); at the deadline, with whatever is buffered; abandon a
        stage that got nothing."""
        plan = self.plan
        answered = tuple(r for r in self.answers)
        ready = ready_clusters(self.answers, plan.buffer_targets)
        if ready:
            chosen = tuple(r for r in answered if int(self.answers[r].cluster_id) in ready)
            waiting = tuple(r for r in answered if r not in chosen)
            return StageDecision(
                "proceed",
                chosen,
                waiting,
                f"buffer full: cluster(s) {', '.join(map(str, ready))}",
            )
        if now <= plan.deadline_s:
            return StageDecision("wait", answered)
        if answered:
            return StageDecision(
                "proceed", answered, (), f"deadline passed: {len(answered)} buffered update(s)"
            )
        return StageDecision("abandon", (), (), "no update buffered by the deadline")
