"""What the server announces: a stage of a round, and the closed-loop evaluation of its models.

A :class:`RoundPlan` is built from the server's :class:`RoundSettings` (deadline, quorum,
algorithm, evaluation episodes) and the strategy's instructions for the round (each robot's
membership and round config). The round coordinator (:mod:`fed_ros.core.rounds.coordinator`)
decides WHEN to announce what; these decide what an announcement holds, from its inputs
alone, so every field of a plan is set in one place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from fed_ros.core.rounds.collect import DONE, EVALUATE, RoundPlan, quorum_for
from fed_ros.core.rounds.config import Membership, RoundConfig
from fed_ros.core.rounds.settings import RoundSettings


def stage_plan(
    settings: RoundSettings,
    round_idx: int,
    stage: str,
    attempt: int,
    participants: Sequence[str],
    memberships: Mapping[str, Membership],
    configs: Mapping[str, RoundConfig],
    now: float,
) -> RoundPlan:
    """A DESCRIBE, SCORE or TRAIN stage: a deadline and a quorum of the participants."""
    s = settings
    return RoundPlan(
        round_idx=round_idx,
        stage=stage,
        attempt=attempt,
        deadline_s=now + s.round_timeout_s,
        algorithm=s.algorithm,
        participants=tuple(participants),
        memberships={r: memberships[r] for r in participants},
        quorum=quorum_for(len(participants), s.quorum_fraction, s.min_quorum),
        configs={r: configs[r] for r in participants if r in configs},
    )


def evaluation_plan(
    settings: RoundSettings,
    round_idx: int,
    participants: Sequence[str],
    memberships: Mapping[str, Membership],
    configs: Mapping[str, RoundConfig],
    now: float,
) -> RoundPlan:
    """EVALUATE announcement for the models of the (new) current round (no quorum)."""
    # The evaluation request travels in the round config like every other instruction.
    episodes = settings.eval_episodes
    return RoundPlan(
        round_idx=round_idx,
        stage=EVALUATE,
        attempt=0,
        deadline_s=now + settings.eval_timeout_s,
        algorithm=settings.algorithm,
        participants=tuple(participants),
        memberships={r: memberships[r] for r in participants},
        quorum=0,
        configs={r: replace(configs[r], eval_episodes=episodes) for r in participants},
    )


def done_plan(
    settings: RoundSettings,
    round_idx: int,
    robot_ids: Sequence[str],
    memberships: Mapping[str, Membership],
    now: float,
) -> RoundPlan:
    """The STAGE_DONE announcement to every registered robot (federation finished)."""
    return RoundPlan(
        round_idx=round_idx,
        stage=DONE,
        attempt=0,
        deadline_s=now,
        algorithm=settings.algorithm,
        participants=tuple(robot_ids),
        memberships={r: memberships[r] for r in robot_ids if r in memberships},
        quorum=0,
    )
