"""The server's round state machine, without ROS (nav2_simple_commander style).

The server node only converts messages and publishes; everything that decides something
lives here and is unit-tested in-process: the registration roster, announcements with a
deadline and a quorum, accepting or rejecting each update with a reason (not a
participant, stale or future round, stale base model, late, duplicate, bad manifest,
non-finite values), dropping stragglers, abandoning a round below quorum (models
unchanged), running the strategy, committing to the model store BEFORE anything is
published, and resuming from the last committed round.

Times are plain float seconds from the caller's clock (the node passes ROS time), so the
tests drive the machine with a fake clock. The state lives here; the rules it applies are
beside it: ``settings`` (RoundSettings), ``answers`` (each answer's admission),
``announcements`` (what a plan holds), ``report`` (the outcome), ``roster``, ``collect``.
"""

from __future__ import annotations

import time
from pathlib import Path
from collections.abc import Callable
from typing import Any, Mapping, Sequence

import numpy as np

from fed_ros.core.checks.decisions import Decision
from fed_ros.core.rounds.announcements import done_plan, evaluation_plan, stage_plan
from fed_ros.core.rounds.answers import (
    CarriedAnswers,
    drop_updates_without_descriptor,
    keep_descriptors,
    record_success_rates,
)
from fed_ros.core.rounds.buffered import RoundBuffer
from fed_ros.core.rounds.collect import (
    DESCRIBE,
    EVALUATE,
    RoundPlan,
    SCORE,
    StageCollector,
    StageDecision,
    TRAIN,
)
from fed_ros.core.rounds.config import Membership, RoundConfig
from fed_ros.core.rounds.liveness import LivenessSettings, attach_ledger
from fed_ros.core.rounds.intake import StageAnswerIntake
from fed_ros.core.rounds.report import RoundOutcome, completed_outcome, round_outcome
from fed_ros.core.rounds.roster import Roster
from fed_ros.core.rounds.settings import RoundSettings
from fed_ros.core.rounds.strategy_like import StrategyLike


# ------------------------------------------------------------------- coordinator


class RoundCoordinator(StageAnswerIntake):
    """Runs rounds of one strategy over a roster, committing each round to a model store.

    The node calls :meth:`start_round`, feeds :meth:`offer_update` /
    :meth:`offer_descriptor`, and calls :meth:`poll` periodically; ``poll`` returns the
    next announcement and, when a round closes, its outcome. A completed round is
    committed to the store inside ``poll``, before the caller can publish anything.
    """

    def __init__(
        self,
        strategy: StrategyLike,
        store: Any,
        settings: RoundSettings,
        initial_model: Mapping[str, np.ndarray],
        roster: Roster | None = None,
        clock=time.time,
        roster_file: str | Path | None = None,
        liveness: LivenessSettings | None = None,
    ) -> None:
        self.strategy = strategy
        self.store = store
        self.settings = settings
        self.initial_model = dict(initial_model)
        # `is None`, not `or`: a Roster with no robot yet has len 0 and is falsy, and an
        # allow-list roster replaced by an open one accepted any robot id (issue 13).
        self.roster = roster if roster is not None else Roster(max_samples=settings.max_samples)
        self.clock = clock
        self.liveness = liveness or LivenessSettings()  # heartbeats extend TRAIN deadlines
        # Robots register once, at start-up. Until the first commit carries the roster, it is
        # kept in this file, so a server killed before committing round 0 still knows them
        # after a restart (otherwise the restarted server waited for registrations forever).
        self.roster_file = Path(roster_file) if roster_file is not None else None
        self.round_idx = 0
        self.attempt = 0
        self.cluster_models: dict[int, dict[str, np.ndarray]] = {}
        self.memberships: dict[str, Membership] = {}
        self.configs: dict[str, RoundConfig] = {}
        self.collector: StageCollector | None = None
        self.stages: list[str] = []
        self.descriptors: dict[str, Any] = {}
        self.finished = False
        self.failed_reason = ""
        # Managed operation (the server's rounds gate): while ``paused`` no new round or
        # re-attempt is announced (the one in progress finishes and commits; ``held`` then says
        # a round waits, and poll announces it once resumed, with a fresh deadline);
        # ``end_requested`` ends the federation (STAGE_DONE) after the round in progress.
        self.paused = False
        self.end_requested = False
        self.held = False
        # A stage that must run before a round is announced (the fleet encoder's rounds): while
        # it returns True for the next round, that round is held like a paused one.
        self.hold_before: Callable[[int], bool] = lambda round_idx: False
        self.pending_outcome: RoundOutcome | None = None  # held while its models are evaluated
        self.carried = CarriedAnswers()  # answers of this round's earlier attempts
        # Buffered rounds (FedBuff): the models stale updates trained from, and the updates of
        # clusters whose buffer was not yet full when another cluster's closed the round.
        self.buffer = RoundBuffer(settings.buffer)
        if self.buffer.enabled and not getattr(strategy, "supports_buffered", True):
            raise ValueError(
                f"buffered rounds (buffer_size {settings.buffer.buffer_size}) do not work with "
                f"strategy {strategy.name!r}: {getattr(strategy, 'buffered_refusal', '')}; use "
                "synchronous rounds (buffer_size 0) or local, fedavg, fedprox, feddrman"
            )
        self._initialized = False
        self._manifest = [(k, tuple(v.shape), str(v.dtype)) for k, v in self.initial_model.items()]

    # ----------------------------------------------------------- start / resume
    def resume(self) -> bool:
        """Load the last committed round from the store; True when there was one."""
        snap = self.store.load_latest()
        if snap is None:
            if self.roster_file is not None and self.roster_file.is_file():
                self.roster.load_file(self.roster_file)
            return False
        self.strategy.load_state(snap.strategy_arrays, snap.strategy_meta)
        self.cluster_models = {int(c): dict(m) for c, m in snap.cluster_models.items()}
        self.roster.load_json(snap.meta.get("roster", []))
        self.memberships = {r: list(m) for r, m in snap.assignments.items()}
        self.round_idx = int(snap.round_idx) + 1
        self.finished = self.round_idx >= self.settings.rounds
        self._initialized = True
        return True

    def offer_update(self, update: Any, now: float | None = None) -> Decision:
        """Check and record a core ClientUpdate; an accepted one is shown to the strategy at once
        (`Strategy.observe`: FedDRMan computes CUA's Gram row while the round waits for the
        rest)."""
        decision = super().offer_update(update, now)
        # Not in a buffered round: its aggregation sees one cluster's buffer, and nothing it
        # would use is computed ahead (FedDRMan's Gram rows would be work and memory for none).
        if decision and self.collector is not None and not self.collector.plan.buffer_targets:
            self.strategy.observe(self.collector.plan.round_idx, update)
        return decision

    def register(self, robot_id: str, **capabilities: Any) -> Decision:
        """Register a robot (Roster.register) and keep the roster on disk when it changed."""
        verdict = self.roster.register(robot_id, **capabilities)
        if verdict.accepted and self.roster_file is not None:
            self.roster.save_file(self.roster_file)
        return verdict

    def _ensure_initialized(self, robot_ids: Sequence[str]) -> None:
        if not self._initialized:
            self.strategy.initialize(self.initial_model, list(robot_ids))
            self._initialized = True

    def start_round(self, now: float | None = None) -> RoundPlan:
        """Announce the current round (first stage) to every registered robot."""
        now = self.clock() if now is None else now
        if self.finished or self.end_requested:
            self.finished = True
            return self.done_plan(now)
        participants = self.roster.ids
        if not participants:
            raise ValueError("cannot start a round with no registered robots")
        self._ensure_initialized(participants)
        self._configure(participants)
        missing = [r for r in participants if r not in self.memberships]
        if missing:
            raise ValueError(f"strategy {self.strategy.name!r} gave no membership for {missing}")
        self._fill_cluster_models()
        self.buffer.record(self.round_idx, self.cluster_models, self.memberships, self.configs)
        kinds = set(self.strategy.needs_descriptors(self.round_idx))
        self.stages = ([DESCRIBE] if kinds else []) + ([SCORE] if "rnd" in kinds else []) + [TRAIN]
        if not self.buffer.enabled:
            # Buffered rounds keep the latest descriptor of each robot: a buffered update may
            # come from a robot that did not answer this round's DESCRIBE.
            self.descriptors = {}
        self.attempt += 1
        return self._announce(self.stages[0], participants, now)

    def _next_round(self, now: float) -> RoundPlan | None:
        """After a round closed or was abandoned (or before the first): its announcement, or
        STAGE_DONE when finished or ended, or nothing while paused (``held``)."""
        waits = self.paused or self.hold_before(self.round_idx)
        self.held = waits and not (self.finished or self.end_requested)
        return None if self.held else self.start_round(now)

    def _configure(self, participants: Sequence[str]) -> None:
        """The strategy's instructions for this round: memberships and round configs."""
        instructions = self.strategy.configure_round(self.round_idx, participants)
        self.memberships = {
            r: [(int(c), float(w)) for c, w in i.membership] for r, i in instructions.items()
        }
        self.configs = {r: i.config for r, i in instructions.items()}

    def _fill_cluster_models(self) -> None:
        """The strategy's current cluster models (what robots download for this round)."""
        models = self.strategy.cluster_models()
        needed = {c for m in self.memberships.values() for c, _ in m}
        missing = sorted(needed - set(models))
        if missing:
            raise ValueError(
                f"strategy {self.strategy.name!r} names clusters {missing} it has no model for"
            )
        self.cluster_models = {int(c): dict(m) for c, m in models.items()}

    def _announce(self, stage: str, participants: Sequence[str], now: float) -> RoundPlan:
        plan = stage_plan(
            self.settings,
            self.round_idx,
            stage,
            self.attempt,
            participants,
            self.memberships,
            self.configs,
            now,
        )
        carried = self.carried.for_plan(plan)
        if self.buffer.buffers(self.round_idx) and stage == TRAIN:
            plan, carried = self.buffer.train_plan(plan, len(self.cluster_models), carried)
        self.collector = StageCollector(plan, carried)
        attach_ledger(self.collector, self.liveness)
        return plan

    @property
    def stale_rounds(self) -> int:
        """Earlier rounds whose updates a buffered round still takes (0: synchronous rounds)."""
        return self.buffer.window(len(self.cluster_models))

    def done_plan(self, now: float) -> RoundPlan:
        """The STAGE_DONE announcement (federation finished; robots keep their models)."""
        return done_plan(self.settings, self.round_idx, self.roster.ids, self.memberships, now)

    @property
    def current_plan(self) -> RoundPlan | None:
        """The announcement currently collecting answers."""
        return self.collector.plan if self.collector else None

    # --------------------------------------------------------------------- poll
    def poll(self, now: float | None = None) -> tuple[RoundPlan | None, RoundOutcome | None]:
        """Advance the machine: (next announcement or None, closed round's outcome or None)."""
        now = self.clock() if now is None else now
        col = self.collector
        if col is None:
            return (self._next_round(now) if self.held else None), None
        decision = col.decision(now)
        if decision.kind == "wait":
            return None, None
        stage = col.plan.stage
        if stage == EVALUATE:
            return self._close_evaluation(col, now)
        if decision.kind == "abandon":
            return self._abandon(col, decision, now)
        # proceed
        if stage in (DESCRIBE, SCORE):
            self.carried.keep(col)
            keep_descriptors(self.descriptors, col.answers, decision.answered)
            nxt = self.stages[self.stages.index(stage) + 1]
            return self._announce(nxt, decision.answered, now), None
        return self._aggregate(col, decision, now)

    def _abandon(
        self, col: StageCollector, decision: StageDecision, now: float
    ) -> tuple[RoundPlan | None, RoundOutcome]:
        outcome = round_outcome(col, completed=False, status=f"abandoned: {decision.reason}")
        if col.plan.stage != EVALUATE:
            self.carried.keep(col)
        self.collector = None
        if self.attempt >= self.settings.max_attempts:
            self.failed_reason = (
                f"round {self.round_idx} abandoned {self.attempt} times: {decision.reason}"
            )
            # Robots are told the federation is over (STAGE_DONE) before the server gives up,
            # instead of waiting for a server that is gone.
            return self.done_plan(now), outcome
        return self._next_round(now), outcome

    def _abandon_after(
        self, col: StageCollector, decision: StageDecision, answered: list, why: str, now: float
    ) -> tuple[RoundPlan | None, RoundOutcome]:
        """Abandon a TRAIN stage that proceeded but cannot be aggregated (``why``)."""
        abandon = StageDecision("abandon", tuple(answered), decision.stragglers, why)
        return self._abandon(col, abandon, now)

    def _close_evaluation(
        self, col: StageCollector, now: float
    ) -> tuple[RoundPlan | None, RoundOutcome | None]:
        """Evaluation answered (or timed out): fill success rates into the held outcome, move on."""
        outcome, self.pending_outcome = self.pending_outcome, None
        self.collector = None
        if outcome is not None:
            record_success_rates(outcome, col.answers)
        return self._next_round(now), outcome

    def _evaluation_plan(self, now: float) -> RoundPlan:
        """EVALUATE announcement for the models of the (new) current round."""
        participants = self.roster.ids
        self._configure(participants)
        plan = evaluation_plan(
            self.settings, self.round_idx, participants, self.memberships, self.configs, now
        )
        self.collector = StageCollector(plan)
        return plan

    def _aggregate(
        self, col: StageCollector, decision: StageDecision, now: float
    ) -> tuple[RoundPlan | None, RoundOutcome]:
        answered = list(decision.answered)
        if self.strategy.needs_descriptors(self.round_idx):
            answered = drop_updates_without_descriptor(col, answered, self.descriptors)
            if len(answered) < col.plan.quorum:
                why = "below quorum after dropping robots without descriptors"
                return self._abandon_after(col, decision, answered, why, now)
        updates = [col.answers[r] for r in answered]
        buffer_diag: dict[str, float] = {}
        buffered = bool(col.plan.buffer_targets)  # (the first rounds of a buffered fleet are not)
        if buffered:
            waiting = {r: col.answers[r] for r in decision.stragglers if r in col.answers}
            updates, buffer_diag = self.buffer.take(
                self.round_idx, updates, waiting, self.cluster_models
            )
            answered = [u.robot_id for u in updates]
            if not updates:
                return self._abandon_after(col, decision, [], "every update too stale", now)
        descriptors = {r: d for r, d in self.descriptors.items() if r in answered}
        t0 = time.perf_counter()
        try:
            aggregate = (
                self.strategy.aggregate_buffer if buffered else self.strategy.aggregate_round
            )
            result = aggregate(self.round_idx, updates, descriptors)
        except ValueError as exc:
            # The strategy refused these inputs: the round is abandoned, models stay unchanged.
            return self._abandon_after(col, decision, answered, f"aggregation refused: {exc}", now)
        seconds = time.perf_counter() - t0
        # Commit point of the round: nothing about round r+1 is visible before this returns.
        self.store.commit(
            self.round_idx,
            result.cluster_models,
            result.assignments,
            self.strategy.state(),
            {
                "roster": self.roster.to_json(),
                "algorithm": self.settings.algorithm,
                "accepted": answered,
                "stragglers": list(decision.stragglers),
            },
        )
        old = self.cluster_models
        self.cluster_models = {int(c): dict(m) for c, m in result.cluster_models.items()}
        if self.buffer.enabled:
            self.buffer.committed(old, self.cluster_models)
        self.memberships = {r: list(m) for r, m in result.assignments.items()}
        outcome = completed_outcome(
            col, decision.reason, result, seconds, updates, self.initial_model, old
        )
        outcome.diagnostics.update(buffer_diag)
        self.collector = None
        self.round_idx += 1
        self.attempt = 0
        self.finished = self.round_idx >= self.settings.rounds
        every = self.settings.evaluate_every
        if every and (self.round_idx % every == 0 or self.finished):
            self.pending_outcome = outcome
            return self._evaluation_plan(now), None
        return self._next_round(now), outcome
