"""The server's round state machine, without ROS (nav2_simple_commander style).

The server node only converts messages and publishes; everything that decides something
lives here and is unit-tested in-process: the registration roster, announcements with a
deadline and a quorum, accepting or rejecting each update with a reason (not a
participant, stale or future round, stale base model, late, duplicate, bad manifest,
non-finite values), dropping stragglers, abandoning a round below quorum (models
unchanged), running the strategy, committing to the model store BEFORE anything is
published, and resuming from the last committed round.

Times are plain float seconds from the caller's clock (the node passes ROS time), so the
tests drive the machine with a fake clock.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field, replace
from typing import Any, Collection, Mapping, Protocol, Sequence

import numpy as np

from fed_ros.core.round_config import RobotInstruction, RoundConfig
from fed_ros.core.validation import (DUPLICATE, FUTURE, LATE, NO_ROUND, NOT_PARTICIPANT, NUM_SAMPLES,
                                     STALE_BASE, STALE_ROUND)

# Stage names match fed_ros.ros.wire.conversions.STAGES (RoundAnnouncement.STAGE_*).
TRAIN, DESCRIBE, SCORE, EVALUATE, DONE = "train", "describe", "score", "evaluate", "done"
STAGES = (TRAIN, DESCRIBE, SCORE, EVALUATE, DONE)

_ID_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")

Membership = list[tuple[int, float]]


def quorum_for(participants: int, fraction: float, minimum: int) -> int:
    """Updates needed to aggregate: ceil(fraction * participants), at least ``minimum``, at most all."""
    if participants < 0:
        raise ValueError(f"participants must be >= 0, got {participants}")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"quorum fraction must be in (0, 1], got {fraction}")
    if minimum < 1:
        raise ValueError(f"minimum quorum must be >= 1, got {minimum}")
    return min(participants, max(minimum, math.ceil(fraction * participants - 1e-9)))


def ready_to_start(*, registered: Collection[str], expected: Collection[str], min_robots: int,
                   waited_s: float, registration_timeout_s: float, resumed: bool = False) -> bool:
    """Whether the server may announce its first round, given who has registered so far.

    A resumed server carries on as soon as its committed roster holds anyone (robots
    re-register as they come back). Otherwise it waits for every ``expected`` robot, or,
    without an expected list, for ``min_robots``; once more than ``registration_timeout_s``
    have passed it starts with whoever registered if that is at least ``min_robots``.
    """
    count = len(registered)
    if resumed and count:
        return True
    if expected:
        if all(r in registered for r in expected):
            return True
    elif count >= min_robots:
        return True
    return waited_s > registration_timeout_s and count >= min_robots


@dataclass(frozen=True)
class Verdict:
    """Whether an input was accepted, and why not."""

    accepted: bool
    reason: str = ""
    code: str = ""  # machine-readable reject code (fed_ros.core.validation's constants)


ACCEPT = Verdict(True, "")


# ---------------------------------------------------------------------------- roster

@dataclass
class RobotEntry:
    """What the server knows about a registered robot."""

    robot_id: str
    tasks: tuple[str, ...] = ()
    num_samples: int = 0
    has_gpu: bool = False
    public_key: bytes = b""
    registrations: int = 1

    def to_json(self) -> dict[str, Any]:
        """JSON form for the store's round meta."""
        return {"robot_id": self.robot_id, "tasks": list(self.tasks), "num_samples": self.num_samples,
                "has_gpu": self.has_gpu, "public_key": self.public_key.hex()}

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> "RobotEntry":
        """Inverse of :meth:`to_json`."""
        return RobotEntry(robot_id=str(obj["robot_id"]), tasks=tuple(obj.get("tasks", ())),
                          num_samples=int(obj.get("num_samples", 0)), has_gpu=bool(obj.get("has_gpu", False)),
                          public_key=bytes.fromhex(str(obj.get("public_key", ""))))


class Roster:
    """Registered robots. A robot may re-register (after a restart) with the same key."""

    def __init__(self, action_dim: int = 4, max_robots: int = 10_000,
                 allowed_keys: Mapping[str, bytes] | None = None, max_samples: int = 1_000_000) -> None:
        self.action_dim = action_dim
        self.max_robots = max_robots
        self.allowed_keys = dict(allowed_keys) if allowed_keys is not None else None
        self.max_samples = max_samples
        self._robots: dict[str, RobotEntry] = {}

    def register(self, robot_id: str, tasks: Sequence[str] = (), num_samples: int = 0,
                 has_gpu: bool = False, public_key: bytes = b"", action_dim: int | None = None) -> Verdict:
        """Add or refresh a robot; rejects bad ids, action spaces and keys with a reason."""
        if not isinstance(robot_id, str) or not _ID_RE.match(robot_id):
            return Verdict(False, f"bad robot id {robot_id!r} (must match {_ID_RE.pattern})")
        if action_dim is not None and action_dim != self.action_dim:
            return Verdict(False, f"action_dim {action_dim} != fleet action_dim {self.action_dim}")
        if num_samples < 0:
            return Verdict(False, f"negative num_samples {num_samples}")
        key = bytes(public_key)
        if self.allowed_keys is not None:
            allowed = self.allowed_keys.get(robot_id)
            if allowed is None:
                return Verdict(False, f"robot {robot_id!r} is not on the allow-list")
            if key != allowed:
                return Verdict(False, f"public key of {robot_id!r} does not match the allow-list")
        entry = self._robots.get(robot_id)
        if entry is None:
            if len(self._robots) >= self.max_robots:
                return Verdict(False, f"fleet is full ({self.max_robots} robots)")
            self._robots[robot_id] = RobotEntry(robot_id, tuple(tasks), min(num_samples, self.max_samples),
                                                bool(has_gpu), key)
            return ACCEPT
        if entry.public_key and key != entry.public_key:
            # Without an allow-list the first key a robot used is pinned (trust on first use).
            return Verdict(False, f"robot {robot_id!r} re-registered with a different public key")
        entry.tasks, entry.num_samples, entry.has_gpu = tuple(tasks), min(num_samples, self.max_samples), bool(has_gpu)
        entry.public_key = entry.public_key or key
        entry.registrations += 1
        return ACCEPT

    def __contains__(self, robot_id: object) -> bool:
        return robot_id in self._robots

    def __len__(self) -> int:
        return len(self._robots)

    def get(self, robot_id: str) -> RobotEntry | None:
        """The entry of a robot, or None."""
        return self._robots.get(robot_id)

    @property
    def ids(self) -> list[str]:
        """Registered robot ids, sorted (deterministic participant order)."""
        return sorted(self._robots)

    def to_json(self) -> list[dict[str, Any]]:
        """JSON form (persisted with every committed round)."""
        return [self._robots[r].to_json() for r in self.ids]

    def load_json(self, entries: Sequence[Mapping[str, Any]]) -> None:
        """Restore robots persisted by :meth:`to_json` (after a server restart)."""
        for obj in entries:
            entry = RobotEntry.from_json(obj)
            entry.registrations = 0  # known from the store; not yet seen by this process
            self._robots[entry.robot_id] = entry


# ----------------------------------------------------------------------- one stage

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


@dataclass(frozen=True)
class Decision:
    """What a stage's collection decided at time ``now``."""

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
        self.rejected = 0  # every rejection, whoever sent it (unknown senders leave only this count)

    def check(self, robot_id: str, round_idx: int, now: float, base_round: int | None = None) -> Verdict:
        """Whether an answer from ``robot_id`` for ``round_idx`` may be accepted now."""
        plan = self.plan
        if robot_id not in plan.participants:
            return Verdict(False, f"robot {robot_id!r} is not a participant of round {plan.round_idx}",
                           NOT_PARTICIPANT)
        if round_idx < plan.round_idx:
            return Verdict(False, f"stale: answer for round {round_idx}, current round is {plan.round_idx}",
                           STALE_ROUND)
        if round_idx > plan.round_idx:
            return Verdict(False, f"future round {round_idx}, current round is {plan.round_idx}", FUTURE)
        if base_round is not None and base_round != plan.round_idx:
            return Verdict(False, f"stale base: trained from model version {base_round}, "
                                  f"round {plan.round_idx} starts from version {plan.round_idx}", STALE_BASE)
        if now > plan.deadline_s:
            return Verdict(False, f"late: arrived {now - plan.deadline_s:.1f} s after the deadline "
                                  f"of round {plan.round_idx}", LATE)
        if robot_id in self.answers and robot_id not in self.carried:
            return Verdict(False, f"duplicate answer from {robot_id!r} for round {plan.round_idx} "
                                  f"({plan.stage})", DUPLICATE)
        return ACCEPT

    def accept(self, robot_id: str, answer: Any) -> None:
        """Record an answer that passed :meth:`check` (and any content validation)."""
        self.answers[robot_id] = answer
        self.carried.discard(robot_id)

    def reject(self, robot_id: str, reason: str, code: str = "") -> Verdict:
        """Record a rejection (counted in the round report)."""
        self.rejected += 1
        # Bounded: the first reason per participant is what the report shows; junk ids from
        # unknown senders and repeats leave only the count.
        if robot_id in self.plan.participants and all(r != robot_id for r, _ in self.rejections):
            self.rejections.append((robot_id, reason))
        return Verdict(False, reason, code)

    def decision(self, now: float) -> Decision:
        """Proceed when everyone answered, or at the deadline with a quorum; else abandon/wait."""
        plan = self.plan
        answered = tuple(r for r in plan.participants if r in self.answers)
        missing = tuple(r for r in plan.participants if r not in self.answers)
        if not missing:
            return Decision("proceed", answered)
        if now <= plan.deadline_s:
            return Decision("wait", answered, missing)
        if len(answered) >= plan.quorum:
            return Decision("proceed", answered, missing,
                            f"deadline passed: {len(missing)} straggler(s) dropped: {', '.join(missing)}")
        return Decision("abandon", answered, missing,
                        f"below quorum: {len(answered)} of {plan.quorum} required answers by the deadline")


# ------------------------------------------------------------------- coordinator

class StrategyLike(Protocol):
    """The part of fed_ros.core.strategy.Strategy the coordinator uses."""

    name: str

    def initialize(self, initial: Mapping[str, np.ndarray], robot_ids: Sequence[str]) -> None: ...
    def configure_round(self, round_idx: int, robot_ids: Sequence[str]) -> dict[str, RobotInstruction]: ...
    def needs_descriptors(self, round_idx: int) -> set[str]: ...
    def cluster_models(self) -> dict[int, Mapping[str, np.ndarray]]: ...
    def aggregate_round(self, round_idx: int, updates: list, descriptors: dict) -> Any: ...
    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]: ...
    def load_state(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True)
class RoundSettings:
    """Round timing and quorum (from the server parameters)."""

    algorithm: str
    rounds: int
    quorum_fraction: float = 0.75
    min_quorum: int = 1
    round_timeout_s: float = 600.0
    max_attempts: int = 3
    max_samples: int = 1_000_000
    evaluate_every: int = 0  # rounds between closed-loop evaluations (0 = never)
    eval_timeout_s: float = 600.0
    eval_episodes: int = 2  # episodes per task a robot runs in an EVALUATE stage

    def __post_init__(self) -> None:
        if self.evaluate_every < 0:
            raise ValueError(f"evaluate_every must be >= 0, got {self.evaluate_every}")
        if self.eval_timeout_s <= 0:
            raise ValueError(f"eval_timeout_s must be > 0, got {self.eval_timeout_s}")
        if self.eval_episodes < 1:
            raise ValueError(f"eval_episodes must be >= 1, got {self.eval_episodes}")
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")
        if self.round_timeout_s <= 0:
            raise ValueError(f"round_timeout_s must be > 0, got {self.round_timeout_s}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        quorum_for(1, self.quorum_fraction, self.min_quorum)  # validates both


@dataclass
class RobotOutcome:
    """Per-robot line of a round report."""

    robot_id: str
    cluster_ids: list[int] = field(default_factory=list)
    num_samples: int = 0
    train_loss: float = float("nan")
    val_loss: float = float("nan")
    success_rate: float = float("nan")
    accepted: bool = False
    reason: str = ""


@dataclass
class RoundOutcome:
    """What happened to a round (the node turns it into a RoundReport)."""

    round_idx: int
    algorithm: str
    completed: bool
    status: str
    updates_received: int
    updates_accepted: int
    updates_rejected: int
    aggregation_seconds: float = 0.0
    robots: list[RobotOutcome] = field(default_factory=list)
    clusters: dict[int, list[str]] = field(default_factory=dict)
    cluster_update_norms: dict[int, float] = field(default_factory=dict)
    cluster_intra_similarity: dict[int, float] = field(default_factory=dict)
    diagnostics: dict[str, float] = field(default_factory=dict)


def _scalar_diagnostics(diag: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Flatten a strategy's diagnostics to name/value pairs (scalars only; arrays summarised)."""
    out: dict[str, float] = {}
    for key, value in diag.items():
        name = f"{prefix}{key}"
        if isinstance(value, (bool, np.bool_)):
            out[name] = float(value)
        elif isinstance(value, (int, float, np.integer, np.floating)):
            out[name] = float(value)
        elif isinstance(value, Mapping):
            out.update(_scalar_diagnostics(value, prefix=f"{name}."))
        elif isinstance(value, (list, tuple)) and value and all(
                isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in value):
            for i, v in enumerate(value):
                out[f"{name}[{i}]"] = float(v)
    return out


def intra_cluster_similarity(params: Mapping[str, Mapping[str, np.ndarray]], initial: Mapping[str, np.ndarray],
                             clusters: Mapping[int, Sequence[str]]) -> dict[int, float]:
    """Mean pairwise cosine similarity of members' accumulated updates (theta_k - theta_0) per cluster.

    NaN for clusters with fewer than two members that sent an update this round.
    """
    base = np.concatenate([np.asarray(v, np.float32).reshape(-1) for v in initial.values()])
    out: dict[int, float] = {}
    for cid, members in clusters.items():
        rows = [np.concatenate([np.asarray(p[k], np.float32).reshape(-1) for k in initial]) - base
                for rid in members if (p := params.get(rid)) is not None]
        if len(rows) < 2:
            out[cid] = float("nan")
            continue
        unit = np.stack(rows).astype(np.float64)
        norms = np.linalg.norm(unit, axis=1, keepdims=True)
        unit /= np.where(norms > 0, norms, 1.0)
        sims = unit @ unit.T
        k = len(rows)
        out[cid] = float((sims.sum() - np.trace(sims)) / (k * (k - 1)))
    return out


def _members(assignments: Mapping[str, Membership]) -> dict[int, list[str]]:
    clusters: dict[int, list[str]] = {}
    for rid in sorted(assignments):
        for cid, weight in assignments[rid]:
            if weight > 0:
                clusters.setdefault(int(cid), []).append(rid)
    return clusters


class RoundCoordinator:
    """Runs rounds of one strategy over a roster, committing each round to a model store.

    The node calls :meth:`start_round`, feeds :meth:`offer_update` /
    :meth:`offer_descriptor`, and calls :meth:`poll` periodically; ``poll`` returns the
    next announcement and, when a round closes, its outcome. A completed round is
    committed to the store inside ``poll``, before the caller can publish anything.
    """

    def __init__(self, strategy: StrategyLike, store: Any, settings: RoundSettings,
                 initial_model: Mapping[str, np.ndarray], roster: Roster | None = None,
                 clock=time.time) -> None:
        self.strategy = strategy
        self.store = store
        self.settings = settings
        self.initial_model = dict(initial_model)
        # `is None`, not `or`: a Roster with no robot yet has len 0 and is falsy, and an
        # allow-list roster replaced by an open one accepted any robot id (issue 13).
        self.roster = roster if roster is not None else Roster(max_samples=settings.max_samples)
        self.clock = clock
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
        self.pending_outcome: RoundOutcome | None = None  # held while its models are evaluated
        self._carry: dict[str, dict[str, Any]] = {}  # stage -> answers of this round's earlier attempts
        self._carry_round = -1
        self._initialized = False
        self._manifest = [(k, tuple(v.shape), str(v.dtype)) for k, v in self.initial_model.items()]

    # ----------------------------------------------------------- start / resume
    def resume(self) -> bool:
        """Load the last committed round from the store; True when there was one."""
        snap = self.store.load_latest()
        if snap is None:
            return False
        self.strategy.load_state(snap.strategy_arrays, snap.strategy_meta)
        self.cluster_models = {int(c): dict(m) for c, m in snap.cluster_models.items()}
        self.roster.load_json(snap.meta.get("roster", []))
        self.memberships = {r: list(m) for r, m in snap.assignments.items()}
        self.round_idx = int(snap.round_idx) + 1
        self.finished = self.round_idx >= self.settings.rounds
        self._initialized = True
        return True

    def _ensure_initialized(self, robot_ids: Sequence[str]) -> None:
        if not self._initialized:
            self.strategy.initialize(self.initial_model, list(robot_ids))
            self._initialized = True

    def start_round(self, now: float | None = None) -> RoundPlan:
        """Announce the current round (first stage) to every registered robot."""
        now = self.clock() if now is None else now
        if self.finished:
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
        kinds = set(self.strategy.needs_descriptors(self.round_idx))
        self.stages = ([DESCRIBE] if kinds else []) + ([SCORE] if "rnd" in kinds else []) + [TRAIN]
        self.descriptors = {}
        self.attempt += 1
        return self._announce(self.stages[0], participants, now)

    def _configure(self, participants: Sequence[str]) -> None:
        """The strategy's instructions for this round: memberships and round configs."""
        instructions = self.strategy.configure_round(self.round_idx, participants)
        self.memberships = {r: [(int(c), float(w)) for c, w in i.membership] for r, i in instructions.items()}
        self.configs = {r: i.config for r, i in instructions.items()}

    def _fill_cluster_models(self) -> None:
        """The strategy's current cluster models (what robots download for this round)."""
        models = self.strategy.cluster_models()
        needed = {c for m in self.memberships.values() for c, _ in m}
        missing = sorted(needed - set(models))
        if missing:
            raise ValueError(f"strategy {self.strategy.name!r} names clusters {missing} it has no model for")
        self.cluster_models = {int(c): dict(m) for c, m in models.items()}

    def _announce(self, stage: str, participants: Sequence[str], now: float) -> RoundPlan:
        s = self.settings
        plan = RoundPlan(
            round_idx=self.round_idx, stage=stage, attempt=self.attempt,
            deadline_s=now + s.round_timeout_s, algorithm=s.algorithm,
            participants=tuple(participants),
            memberships={r: self.memberships[r] for r in participants},
            quorum=quorum_for(len(participants), s.quorum_fraction, s.min_quorum),
            configs={r: self.configs[r] for r in participants if r in self.configs})
        carried = {}
        if self._carry_round == self.round_idx:
            carried = {r: a for r, a in self._carry.get(stage, {}).items() if r in plan.participants}
        self.collector = StageCollector(plan, carried)
        return plan

    def _keep_answers(self, col: StageCollector) -> None:
        """Remember a stage's valid answers for a re-announcement of the same round."""
        if self._carry_round != col.plan.round_idx:
            self._carry, self._carry_round = {}, col.plan.round_idx
        self._carry[col.plan.stage] = dict(col.answers)

    def done_plan(self, now: float) -> RoundPlan:
        """The STAGE_DONE announcement (federation finished; robots keep their models)."""
        ids = self.roster.ids
        return RoundPlan(round_idx=self.round_idx, stage=DONE, attempt=0, deadline_s=now,
                         algorithm=self.settings.algorithm, participants=tuple(ids),
                         memberships={r: self.memberships[r] for r in ids if r in self.memberships},
                         quorum=0)

    @property
    def current_plan(self) -> RoundPlan | None:
        """The announcement currently collecting answers."""
        return self.collector.plan if self.collector else None

    # ------------------------------------------------------------------ answers
    def check_update(self, robot_id: str, round_idx: int, base_round: int, now: float | None = None) -> Verdict:
        """Pre-check an update's header (before its bytes arrive); counts nothing.

        The caller records a rejection once (:meth:`record_rejection`), whichever check refused it.
        """
        now = self.clock() if now is None else now
        col = self.collector
        if col is None or col.plan.stage != TRAIN:
            stage = col.plan.stage if col else "none"
            return Verdict(False, f"no training round is open (stage {stage}); update from {robot_id!r} rejected",
                           NO_ROUND)
        return col.check(robot_id, round_idx, now, base_round=base_round)

    def record_rejection(self, robot_id: str, reason: str) -> None:
        """Count a rejection decided elsewhere (transport, validation) in the open stage's report."""
        if self.collector is not None:
            self.collector.reject(robot_id, reason)

    def offer_update(self, update: Any, now: float | None = None) -> Verdict:
        """Check and record a core ClientUpdate (robot_id, params, num_samples, base_round, ...).

        ``update.round_idx`` (attribute added by the node) names the round it answers.
        """
        now = self.clock() if now is None else now
        col = self.collector
        rid = str(update.robot_id)
        if col is None or col.plan.stage != TRAIN:
            stage = col.plan.stage if col else "none"
            return Verdict(False, f"no training round is open (stage {stage}); update from {rid!r} rejected",
                           NO_ROUND)
        # Tensors (manifest, finite values) were checked once by the transfer receiver.
        verdict = col.check(rid, int(getattr(update, "round_idx", col.plan.round_idx)), now,
                            base_round=int(update.base_round))
        if verdict.accepted and int(update.num_samples) <= 0:
            verdict = Verdict(False, f"update from {rid!r} claims {update.num_samples} samples", NUM_SAMPLES)
        if not verdict.accepted:
            return col.reject(rid, verdict.reason, verdict.code)
        if update.num_samples > self.settings.max_samples:
            update.num_samples = self.settings.max_samples  # self-reported counts are capped (V5)
        col.accept(rid, update)
        return ACCEPT

    def offer_descriptor(self, descriptor: Any, round_idx: int, now: float | None = None) -> Verdict:
        """Check and record a core ClientDescriptor answering a DESCRIBE or SCORE stage."""
        now = self.clock() if now is None else now
        col = self.collector
        rid = str(descriptor.robot_id)
        if col is None or col.plan.stage not in (DESCRIBE, SCORE):
            stage = col.plan.stage if col else "none"
            return Verdict(False, f"no descriptor stage is open (stage {stage}); descriptor from {rid!r} rejected")
        verdict = col.check(rid, int(round_idx), now)
        if not verdict.accepted:
            return col.reject(rid, verdict.reason)
        if descriptor.num_samples > self.settings.max_samples:
            descriptor.num_samples = self.settings.max_samples
        col.accept(rid, descriptor)
        return ACCEPT

    def offer_metrics(self, robot_id: str, success_rate: float, now: float | None = None) -> Verdict:
        """Record a robot's closed-loop success rate answering an EVALUATE stage."""
        now = self.clock() if now is None else now
        col = self.collector
        if col is None or col.plan.stage != EVALUATE:
            stage = col.plan.stage if col else "none"
            return Verdict(False, f"no evaluation stage is open (stage {stage}); metrics from {robot_id!r} rejected")
        verdict = col.check(robot_id, col.plan.round_idx, now)
        if verdict.accepted and not (math.isfinite(success_rate) and 0.0 <= success_rate <= 1.0):
            verdict = Verdict(False, f"success rate {success_rate!r} from {robot_id!r} is not in [0, 1]")
        if not verdict.accepted:
            return col.reject(robot_id, verdict.reason)
        col.accept(robot_id, float(success_rate))
        return ACCEPT

    # --------------------------------------------------------------------- poll
    def poll(self, now: float | None = None) -> tuple[RoundPlan | None, RoundOutcome | None]:
        """Advance the machine: (next announcement or None, closed round's outcome or None)."""
        now = self.clock() if now is None else now
        col = self.collector
        if col is None:
            return None, None
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
            self._keep_answers(col)
            for rid in decision.answered:
                prev = self.descriptors.get(rid)
                desc = col.answers[rid]
                if prev is not None and not getattr(desc, "payload", b"") and getattr(prev, "payload", b""):
                    desc.payload = prev.payload  # the SCORE answer keeps the DESCRIBE predictor
                self.descriptors[rid] = desc
            nxt = self.stages[self.stages.index(stage) + 1]
            return self._announce(nxt, decision.answered, now), None
        return self._aggregate(col, decision, now)

    def _abandon(self, col: StageCollector, decision: Decision, now: float
                 ) -> tuple[RoundPlan | None, RoundOutcome]:
        outcome = self._outcome(col, completed=False, status=f"abandoned: {decision.reason}")
        if col.plan.stage != EVALUATE:
            self._keep_answers(col)
        self.collector = None
        if self.attempt >= self.settings.max_attempts:
            self.failed_reason = f"round {self.round_idx} abandoned {self.attempt} times: {decision.reason}"
            return None, outcome
        return self.start_round(now), outcome

    def _close_evaluation(self, col: StageCollector, now: float) -> tuple[RoundPlan | None, RoundOutcome | None]:
        """Evaluation answered (or timed out): fill success rates into the held outcome, move on."""
        outcome, self.pending_outcome = self.pending_outcome, None
        self.collector = None
        if outcome is not None:
            for robot in outcome.robots:
                if robot.robot_id in col.answers:
                    robot.success_rate = float(col.answers[robot.robot_id])
        if self.finished:
            return self.done_plan(now), outcome
        return self.start_round(now), outcome

    def _evaluation_plan(self, now: float) -> RoundPlan:
        """EVALUATE announcement for the models of the (new) current round."""
        participants = self.roster.ids
        self._configure(participants)
        # The evaluation request travels in the round config like every other instruction.
        episodes = self.settings.eval_episodes
        plan = RoundPlan(round_idx=self.round_idx, stage=EVALUATE, attempt=0,
                         deadline_s=now + self.settings.eval_timeout_s, algorithm=self.settings.algorithm,
                         participants=tuple(participants),
                         memberships={r: self.memberships[r] for r in participants}, quorum=0,
                         configs={r: replace(self.configs[r], eval_episodes=episodes) for r in participants})
        self.collector = StageCollector(plan)
        return plan

    def _aggregate(self, col: StageCollector, decision: Decision, now: float
                   ) -> tuple[RoundPlan | None, RoundOutcome]:
        answered = list(decision.answered)
        if self.strategy.needs_descriptors(self.round_idx):
            # A robot whose descriptor did not arrive cannot be clustered this round.
            for rid in [r for r in answered if r not in self.descriptors]:
                answered.remove(rid)
                col.reject(rid, f"update from {rid!r} dropped: no descriptor this round")
                del col.answers[rid]
            if len(answered) < col.plan.quorum:
                return self._abandon(col, Decision("abandon", tuple(answered), decision.stragglers,
                                                   "below quorum after dropping robots without descriptors"), now)
        updates = [col.answers[r] for r in answered]
        descriptors = {r: d for r, d in self.descriptors.items() if r in answered}
        t0 = time.perf_counter()
        try:
            result = self.strategy.aggregate_round(self.round_idx, updates, descriptors)
        except ValueError as exc:
            # The strategy refused these inputs: the round is abandoned, models stay unchanged.
            return self._abandon(col, Decision("abandon", tuple(answered), decision.stragglers,
                                               f"aggregation refused: {exc}"), now)
        seconds = time.perf_counter() - t0
        # Commit point of the round: nothing about round r+1 is visible before this returns.
        self.store.commit(self.round_idx, result.cluster_models, result.assignments,
                          self.strategy.state(),
                          {"roster": self.roster.to_json(), "algorithm": self.settings.algorithm,
                           "accepted": answered, "stragglers": list(decision.stragglers)})
        old = self.cluster_models
        self.cluster_models = {int(c): dict(m) for c, m in result.cluster_models.items()}
        self.memberships = {r: list(m) for r, m in result.assignments.items()}
        status = "completed" + (f" ({decision.reason})" if decision.reason else "")
        outcome = self._outcome(col, completed=True, status=status, assignments=result.assignments)
        outcome.aggregation_seconds = seconds
        outcome.diagnostics = _scalar_diagnostics(getattr(result, "diagnostics", {}) or {})
        outcome.cluster_intra_similarity = intra_cluster_similarity(
            {u.robot_id: u.params for u in updates}, self.initial_model, outcome.clusters)
        for cid, model in self.cluster_models.items():
            if cid in old:
                outcome.cluster_update_norms[cid] = float(math.sqrt(sum(
                    float(np.sum((model[k].astype(np.float64) - old[cid][k]) ** 2)) for k in model)))
        self.collector = None
        self.round_idx += 1
        self.attempt = 0
        self.finished = self.round_idx >= self.settings.rounds
        every = self.settings.evaluate_every
        if every and (self.round_idx % every == 0 or self.finished):
            self.pending_outcome = outcome
            return self._evaluation_plan(now), None
        if self.finished:
            return self.done_plan(now), outcome
        return self.start_round(now), outcome

    def _outcome(self, col: StageCollector, completed: bool, status: str,
                 assignments: Mapping[str, Membership] | None = None) -> RoundOutcome:
        plan = col.plan
        reasons: dict[str, str] = {}
        for rid, reason in col.rejections:
            reasons.setdefault(rid, reason)
        robots = []
        assignments = assignments if assignments is not None else plan.memberships
        for rid in plan.participants:
            upd = col.answers.get(rid)
            metrics = getattr(upd, "metrics", {}) or {}
            robots.append(RobotOutcome(
                robot_id=rid, cluster_ids=[int(c) for c, _ in assignments.get(rid, [])],
                num_samples=int(getattr(upd, "num_samples", 0)),
                train_loss=float(metrics.get("train_loss", float("nan"))),
                val_loss=float(metrics.get("val_loss", float("nan"))),
                accepted=completed and rid in col.answers,
                reason=(reasons.get(rid, "") if rid not in col.answers else
                        ("" if completed else "round abandoned")) or
                       ("" if rid in col.answers else "straggler: no update by the deadline")))
        received = len(col.answers) + col.rejected
        return RoundOutcome(
            round_idx=plan.round_idx, algorithm=plan.algorithm, completed=completed, status=status,
            updates_received=received, updates_accepted=len(col.answers) if completed else 0,
            updates_rejected=col.rejected, robots=robots,
            clusters=_members(assignments))
