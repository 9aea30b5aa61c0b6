"""Robots' answers to the open stage: which are admitted, and what a closed stage's answers become.

The round coordinator (:mod:`fed_ros.core.rounds.coordinator`) owns the round; these decide
about one answer at a time, given only the open stage's :class:`StageCollector` (None when no
stage is open): a model update (TRAIN; a positive sample count, capped at ``max_samples``), a
descriptor (DESCRIBE or SCORE), closed-loop metrics (EVALUATE; a success rate in [0, 1]) and
a decline. Each returns the :class:`Decision` the node audits; a refusal by the stage is
counted in the stage's report, an answer to no open stage is not. Then what a stage's answers
become: descriptors kept for the training stage, updates dropped when their descriptor is
missing, success rates filled into the held report, and the answers of a round's earlier
attempts carried into its re-announcement (:class:`CarriedAnswers`).

They stand apart from the coordinator because none of them reads or changes the round's
state (strategy, store, roster, memberships): they are the per-answer rules, pure functions
of an answer and a stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Iterable, Mapping
from typing import Any

from fed_ros.core.checks.decisions import (
    ACCEPTED,
    DESCRIPTOR,
    Decision,
    NO_ROUND,
    NUM_SAMPLES,
    OUT_OF_RANGE,
)
from fed_ros.core.rounds.collect import (
    DESCRIBE,
    EVALUATE,
    RoundPlan,
    SCORE,
    StageCollector,
    TRAIN,
)
from fed_ros.core.rounds.report import RoundOutcome


def check_update_header(
    col: StageCollector | None, robot_id: str, round_idx: int, base_round: int, now: float
) -> Decision:
    """Pre-check an update's header (before its bytes arrive); counts nothing."""
    if col is None or col.plan.stage != TRAIN:
        stage = col.plan.stage if col else "none"
        return Decision(
            False,
            reason=(
                f"no training round is open (stage {stage}); update from {robot_id!r} rejected"
            ),
            code=NO_ROUND,
        )
    return col.check(robot_id, round_idx, now, base_round=base_round)


def admit_update(col: StageCollector | None, update: Any, now: float, max_samples: int) -> Decision:
    """Check and record a core ClientUpdate (robot_id, params, num_samples, base_round, ...).

    ``update.round_idx`` (attribute added by the node) names the round it answers.
    """
    rid = str(update.robot_id)
    if col is None or col.plan.stage != TRAIN:
        stage = col.plan.stage if col else "none"
        return Decision(
            False,
            reason=f"no training round is open (stage {stage}); update from {rid!r} rejected",
            code=NO_ROUND,
        )
    # Tensors (manifest, finite values) were checked once by the transfer receiver.
    verdict = col.check(
        rid,
        int(getattr(update, "round_idx", col.plan.round_idx)),
        now,
        base_round=int(update.base_round),
    )
    if verdict.accepted and int(update.num_samples) <= 0:
        verdict = Decision(
            False,
            reason=f"update from {rid!r} claims {update.num_samples} samples",
            code=NUM_SAMPLES,
        )
    if not verdict.accepted:
        return col.reject(rid, verdict.reason, verdict.code)
    if update.num_samples > max_samples:
        update.num_samples = max_samples  # self-reported counts are capped (V5)
    col.accept(rid, update)
    return ACCEPTED


def admit_descriptor(
    col: StageCollector | None, descriptor: Any, round_idx: int, now: float, max_samples: int
) -> Decision:
    """Check and record a core ClientDescriptor answering a DESCRIBE or SCORE stage."""
    rid = str(descriptor.robot_id)
    if col is None or col.plan.stage not in (DESCRIBE, SCORE):
        stage = col.plan.stage if col else "none"
        return Decision(
            False,
            reason=(
                f"no descriptor stage is open (stage {stage}); descriptor from {rid!r} rejected"
            ),
            code=NO_ROUND,
        )
    verdict = col.check(rid, int(round_idx), now)
    if not verdict.accepted:
        # The code travels with the reason: the node audits descriptor verdicts by code.
        return col.reject(rid, verdict.reason, verdict.code)
    if descriptor.num_samples > max_samples:
        descriptor.num_samples = max_samples
    col.accept(rid, descriptor)
    return ACCEPTED


@dataclass(frozen=True)
class Evaluation:
    """A robot's answer to an EVALUATE stage: its closed-loop success rate, and how often a human
    took over during those episodes (per episode; NaN: not reported)."""

    success_rate: float
    interventions_per_episode: float = math.nan
    human_seconds_per_episode: float = math.nan


def admit_metrics(
    col: StageCollector | None,
    robot_id: str,
    success_rate: float,
    now: float,
    interventions: tuple[float, float] = (math.nan, math.nan),
) -> Decision:
    """Record a robot's closed-loop success rate answering an EVALUATE stage, with its
    ``interventions`` (takeovers, human seconds) per episode: NaN (not reported) or >= 0."""
    if col is None or col.plan.stage != EVALUATE:
        stage = col.plan.stage if col else "none"
        return Decision(
            False,
            reason=(
                f"no evaluation stage is open (stage {stage}); metrics from {robot_id!r} rejected"
            ),
            code=NO_ROUND,
        )
    verdict = col.check(robot_id, col.plan.round_idx, now)
    if verdict.accepted and not (math.isfinite(success_rate) and 0.0 <= success_rate <= 1.0):
        verdict = Decision(
            False,
            reason=f"success rate {success_rate!r} from {robot_id!r} is not in [0, 1]",
            code=OUT_OF_RANGE,
        )
    per_episode, seconds = (float(v) for v in interventions)
    if verdict.accepted and not all(math.isnan(v) or 0.0 <= v < math.inf for v in interventions):
        verdict = Decision(
            False,
            reason=(
                f"interventions {per_episode!r}/episode, {seconds!r} s/episode from {robot_id!r} "
                "must be >= 0 (or NaN: not reported)"
            ),
            code=OUT_OF_RANGE,
        )
    if not verdict.accepted:
        return col.reject(robot_id, verdict.reason, verdict.code)
    col.accept(robot_id, Evaluation(float(success_rate), per_episode, seconds))
    return ACCEPTED


def admit_decline(col: StageCollector | None, robot_id: str, reason: str, now: float) -> Decision:
    """A participant's answer that it will not answer the open stage, with why.

    Only the reason is kept: the robot stays unanswered and the quorum rules decide, as for
    any absent robot.
    """
    if col is None:
        return Decision(
            False, reason=f"no stage is open; decline from {robot_id!r} ignored", code=NO_ROUND
        )
    verdict = col.check(robot_id, col.plan.round_idx, now)
    if verdict.accepted:
        col.decline(robot_id, reason)
    return verdict


# ----------------------------------------------------------- a closed stage's answers


def keep_descriptors(
    descriptors: dict[str, Any], answers: Mapping[str, Any], answered: Iterable[str]
) -> None:
    """Keep the answered robots' descriptors for the training stage, in ``descriptors``."""
    for rid in answered:
        prev = descriptors.get(rid)
        desc = answers[rid]
        if prev is not None and not getattr(desc, "payload", b"") and getattr(prev, "payload", b""):
            desc.payload = prev.payload  # the SCORE answer keeps the DESCRIBE predictor
        descriptors[rid] = desc


def drop_updates_without_descriptor(
    col: StageCollector, answered: list[str], descriptors: Mapping[str, Any]
) -> list[str]:
    """The answered robots that can be clustered; the others' updates are rejected and dropped.

    A robot whose descriptor did not arrive cannot be clustered this round.
    """
    answered = list(answered)
    for rid in [r for r in answered if r not in descriptors]:
        answered.remove(rid)
        col.reject(rid, f"update from {rid!r} dropped: no descriptor this round", DESCRIPTOR)
        del col.answers[rid]
    return answered


def record_success_rates(outcome: RoundOutcome, answers: Mapping[str, Evaluation]) -> None:
    """Fill an EVALUATE stage's success rates and interventions into the report of the round
    it evaluated."""
    for robot in outcome.robots:
        if robot.robot_id in answers:
            answer = answers[robot.robot_id]
            robot.success_rate = float(answer.success_rate)
            robot.interventions_per_episode = float(answer.interventions_per_episode)
            robot.human_seconds_per_episode = float(answer.human_seconds_per_episode)


class CarriedAnswers:
    """A round's valid answers from its earlier attempts, per stage.

    When a round is abandoned and announced again, a robot that already answered a stage
    need not answer it again: its answer counts in the re-announcement (if it still takes
    part). Answers of an earlier round are forgotten.
    """

    def __init__(self) -> None:
        self.round_idx = -1
        self.by_stage: dict[str, dict[str, Any]] = {}  # stage -> robot id -> answer

    def keep(self, col: StageCollector) -> None:
        """Remember a stage's valid answers for a re-announcement of the same round."""
        if self.round_idx != col.plan.round_idx:
            self.by_stage, self.round_idx = {}, col.plan.round_idx
        self.by_stage[col.plan.stage] = dict(col.answers)

    def for_plan(self, plan: RoundPlan) -> dict[str, Any]:
        """The kept answers to the announced stage of the same round, from its participants."""
        if self.round_idx != plan.round_idx:
            return {}
        stage = self.by_stage.get(plan.stage, {})
        return {r: a for r, a in stage.items() if r in plan.participants}
