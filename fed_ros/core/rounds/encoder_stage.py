"""The fleet encoder's rounds on the server, without ROS: schedule, admission, FedAvg, commit.

Every registered robot, whatever its cluster, trains the shared visual encoder on all its
frames (``RobotClient.fit_encoder``; docs/learning.md, "The fleet's shared encoder") and sends
it back. :class:`EncoderRounds` takes each robot's update only after the checks a policy
update's content gets (the encoder's manifest: names, shapes, dtype; finite values, |x|
bounded; the sample count capped), averages the accepted ones weighted by frames across the
whole fleet (plain FedAvg, not per cluster), and commits the result to its own ModelStore
(``<state_dir>/encoder``, beside the cluster models) before anyone can be sent it. A refused
update changes nothing; a crash mid-commit falls back to the previous encoder.

Versions count committed encoders: version 0 is the server's initial encoder, encoder round
``v`` trains from version ``v`` and commits version ``v + 1``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fed_ros.core.checks.decisions import (
    ACCEPTED,
    DUPLICATE,
    FUTURE,
    NOT_PARTICIPANT,
    NUM_SAMPLES,
    STALE_ROUND,
    Decision,
    Limits,
)
from fed_ros.core.checks.payload_checks import check_tensors
from fed_ros.core.params import StateDict, manifest_of
from fed_ros.core.rounds.store import ModelStore
from fed_ros.core.strategies.aggregate import fedavg

ENCODER_DIR = "encoder"  # under the server's state_dir
_ENCODER_CLUSTER = 0  # the store keeps the one encoder as its only "cluster"
# Refusals named in a round's report: a flood of made-up robot ids only costs this many.
_MAX_REFUSALS_KEPT = 256


def encoder_due(policy_round: int, refresh_every: int) -> bool:
    """Whether encoder rounds run before policy round ``policy_round`` (round 0 always)."""
    if policy_round < 0 or refresh_every < 0:
        raise ValueError(
            f"policy_round and refresh_every must be >= 0, got {policy_round}, {refresh_every}"
        )
    return policy_round == 0 or (refresh_every > 0 and policy_round % refresh_every == 0)


@dataclass(frozen=True)
class EncoderCost:
    """What one robot's encoder round cost: frames trained on, CPU seconds, bytes each way."""

    frames: int
    cpu_s: float
    bytes_down: int  # the encoder the robot started from
    bytes_up: int  # the robot's update as sent


@dataclass(frozen=True)
class _Pending:
    params: StateDict
    num_samples: int
    cost: EncoderCost
    loss_first: float
    loss_last: float


@dataclass
class EncoderRoundReport:
    """One committed encoder round: who was averaged, who was refused (and why), the costs."""

    version: int  # the encoder this round committed
    costs: dict[str, EncoderCost]
    refused: dict[str, str] = field(default_factory=dict)  # robot -> "code: reason"
    loss_first: float = math.nan  # mean over the averaged robots
    loss_last: float = math.nan

    def scalars(self) -> dict[str, float]:
        """Per-robot means for the round report and TensorBoard (``encoder/...``)."""
        costs = list(self.costs.values())
        return {
            "robots": float(len(costs)),
            "frames": float(sum(c.frames for c in costs)),
            "cpu_s_per_robot": float(np.mean([c.cpu_s for c in costs])),
            "bytes_per_robot": float(np.mean([c.bytes_down + c.bytes_up for c in costs])),
            "loss_first": self.loss_first,
            "loss_last": self.loss_last,
        }


class EncoderRounds:
    """The server's current fleet encoder, the updates offered for it, and its commits."""

    def __init__(
        self, state_dir: str | Path, initial: Mapping[str, np.ndarray], limits: Limits
    ) -> None:
        self.store = ModelStore(Path(state_dir) / ENCODER_DIR)
        self.manifest = manifest_of(initial)
        self.limits = limits
        self._pending: dict[str, _Pending] = {}
        self._refused: dict[str, str] = {}
        snap = self.store.load_latest()
        if snap is None:
            # Version 0 committed at once: what is published is always a committed encoder.
            self.version, self.state, self.meta = 0, dict(initial), {}
            self.store.commit(0, {_ENCODER_CLUSTER: self.state}, {})
        else:
            self.version, self.state = int(snap.round_idx), snap.cluster_models[_ENCODER_CLUSTER]
            self.meta = dict(snap.meta)
            if manifest_of(self.state) != self.manifest:
                raise ValueError(
                    f"the encoder committed in {self.store.directory} (version {self.version}) "
                    "does not fit the configured encoder (objective, cameras): move it away to "
                    "start a new one"
                )

    @property
    def answered(self) -> tuple[str, ...]:
        """Robots whose update for the current version was accepted."""
        return tuple(self._pending)

    def payload_bytes(self) -> int:
        """Bytes of the encoder as float32 (what a robot downloads, and sends back)."""
        return int(sum(np.asarray(v).nbytes for v in self.state.values()))

    def offer(
        self,
        robot_id: str,
        version: int,
        params: Mapping[str, np.ndarray],
        num_samples: int,
        metrics: Mapping[str, float],
        bytes_up: int,
    ) -> Decision:
        """Admit one robot's encoder trained from ``version``; a refusal changes nothing."""
        decision = self._check(robot_id, version, params, num_samples)
        if not decision:
            return self.refuse(robot_id, decision)
        cost = EncoderCost(
            frames=int(num_samples),
            cpu_s=float(metrics.get("cpu_s", math.nan)),
            bytes_down=self.payload_bytes(),
            bytes_up=int(bytes_up),
        )
        self._pending[robot_id] = _Pending(
            dict(params),
            int(num_samples),
            cost,
            float(metrics.get("loss_first", math.nan)),
            float(metrics.get("loss_last", math.nan)),
        )
        return ACCEPTED

    def refuse(self, robot_id: str, decision: Decision) -> Decision:
        """Record a refusal (also one decided by the caller) for the round's report."""
        if robot_id in self._refused or len(self._refused) < _MAX_REFUSALS_KEPT:
            self._refused[robot_id] = f"{decision.code}: {decision.reason}"
        return decision

    def _check(
        self, robot_id: str, version: int, params: Mapping[str, np.ndarray], num_samples: int
    ) -> Decision:
        if version < self.version:
            why = (
                f"encoder update of {robot_id!r} trained from version {version}, now {self.version}"
            )
            return Decision(False, STALE_ROUND, why)
        if version > self.version:
            why = f"encoder update of {robot_id!r} names version {version}, now {self.version}"
            return Decision(False, FUTURE, why)
        if robot_id in self._pending:
            why = f"{robot_id!r} already sent its encoder for version {version}"
            return Decision(False, DUPLICATE, why)
        if (
            isinstance(num_samples, bool)
            or not isinstance(num_samples, (int, np.integer))
            or not 1 <= num_samples <= self.limits.max_num_samples
        ):
            why = f"num_samples {num_samples!r} not in [1, {self.limits.max_num_samples}]"
            return Decision(False, NUM_SAMPLES, why)
        return check_tensors(params, self.manifest, self.limits.max_abs_value)

    def commit(self, meta: Mapping[str, Any] | None = None) -> EncoderRoundReport:
        """FedAvg of the accepted updates by frames, committed as the next version with
        ``meta`` (the caller's schedule: what a restarted server needs to go on)."""
        if not self._pending:
            raise ValueError(f"encoder version {self.version}: no accepted update to average")
        robots = list(self._pending)
        pending = [self._pending[r] for r in robots]
        state = fedavg([p.params for p in pending], [p.num_samples for p in pending], self.manifest)
        # Commit point: the new encoder exists on disk before anything can publish it.
        meta = {**(meta or {}), "averaged": robots}
        self.store.commit(self.version + 1, {_ENCODER_CLUSTER: state}, {}, meta=meta)
        self.version, self.state, self.meta = self.version + 1, state, meta
        report = EncoderRoundReport(
            version=self.version,
            costs={r: p.cost for r, p in zip(robots, pending)},
            refused=dict(self._refused),
            loss_first=float(np.mean([p.loss_first for p in pending])),
            loss_last=float(np.mean([p.loss_last for p in pending])),
        )
        self._pending, self._refused = {}, {}
        return report


@dataclass(frozen=True)
class EncoderAnnouncement:
    """What the server publishes with the encoder: its version and who must train it by when."""

    version: int
    participants: tuple[str, ...]  # empty: nobody trains (the stage is over)
    deadline_s: float


class EncoderStage:
    """When the encoder rounds run (before policy round 0, then every ``refresh_every`` policy
    rounds: ``rounds_per_stage`` of them) and when each one closes.

    An encoder round closes once every participant's update is in, or at its deadline with at
    least one (with none it is announced again). The schedule lives in the commits' meta, so
    a restarted server goes on where the committed encoder left off.
    """

    def __init__(
        self, rounds: EncoderRounds, rounds_per_stage: int, refresh_every: int, timeout_s: float
    ) -> None:
        if rounds_per_stage < 1 or refresh_every < 0 or not timeout_s > 0:
            raise ValueError(
                f"rounds_per_stage >= 1, refresh_every >= 0, timeout_s > 0 needed, got "
                f"{rounds_per_stage}, {refresh_every}, {timeout_s}"
            )
        self.rounds, self.per_stage = rounds, rounds_per_stage
        self.refresh_every, self.timeout_s = refresh_every, timeout_s
        self.current: EncoderAnnouncement | None = None  # the encoder round collecting updates
        self._policy_round = -1
        self._stage_round = 0

    def _done(self) -> tuple[int, int]:
        """(policy round, encoder round within its stage) of the last committed encoder."""
        meta = self.rounds.meta
        return int(meta.get("before_round", -1)), int(meta.get("stage_round", -1))

    def holds(self, policy_round: int) -> bool:
        """Whether policy round ``policy_round`` waits for encoder rounds still to run."""
        if not encoder_due(policy_round, self.refresh_every):
            return False
        before, stage_round = self._done()
        return before < policy_round or (
            before == policy_round and stage_round < self.per_stage - 1
        )

    def start(
        self, policy_round: int, participants: tuple[str, ...], now: float
    ) -> EncoderAnnouncement:
        """The next encoder round before ``policy_round``, for every robot in ``participants``."""
        if not participants:
            raise ValueError("cannot start an encoder round with no registered robots")
        before, stage_round = self._done()
        self._policy_round = policy_round
        self._stage_round = stage_round + 1 if before == policy_round else 0
        self.current = EncoderAnnouncement(
            self.rounds.version, tuple(participants), now + self.timeout_s
        )
        return self.current

    def offer(
        self,
        robot_id: str,
        version: int,
        params: Mapping[str, np.ndarray],
        num_samples: int,
        metrics: Mapping[str, float],
        bytes_up: int,
    ) -> Decision:
        """One robot's update for the encoder round in progress (EncoderRounds.offer)."""
        if self.current is None or robot_id not in self.current.participants:
            why = f"{robot_id!r} is not asked to train encoder version {version}"
            return self.rounds.refuse(robot_id, Decision(False, NOT_PARTICIPANT, why))
        return self.rounds.offer(robot_id, version, params, num_samples, metrics, bytes_up)

    def poll(self, now: float) -> tuple[EncoderAnnouncement | None, EncoderRoundReport | None]:
        """(what to publish next or None, the committed round's report or None)."""
        ann = self.current
        if ann is None:
            return None, None
        answered = self.rounds.answered
        if len(answered) < len(ann.participants) and now < ann.deadline_s:
            return None, None
        if not answered:  # deadline, nobody answered: ask again
            self.current = EncoderAnnouncement(ann.version, ann.participants, now + self.timeout_s)
            return self.current, None
        report = self.rounds.commit(
            {"before_round": self._policy_round, "stage_round": self._stage_round}
        )
        if self._stage_round + 1 < self.per_stage:
            return self.start(self._policy_round, ann.participants, now), report
        self.current = None
        return EncoderAnnouncement(self.rounds.version, (), now), report
