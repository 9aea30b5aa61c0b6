"""Exact behaviour of the round state machine (rounds, roster, round_collect), pure, no ROS.

Complements test_core_rounds.py / test_core_boundaries.py: a scripted strategy (no torch)
makes every decision of the coordinator observable: which stage follows which, who is asked,
what the strategy receives, what is committed, what the report says, and that the caller's
``now`` (ROS time) is the only clock used once it is given. Mutation score:
docs/mutation/rounds.md.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fed_ros.core.rounds import coordinator as rounds_mod
from fed_ros.core.checks.decisions import (
    ACCEPTED,
    DUPLICATE,
    Decision,
    FUTURE,
    LATE,
    NOT_PARTICIPANT,
    NO_ROUND,
    OUT_OF_RANGE,
    REGISTER,
    STALE_BASE,
    STALE_ROUND,
)
from fed_ros.core.rounds.config import RobotInstruction, RoundConfig
from fed_ros.core.rounds.roster import RobotEntry, Roster, ready_to_start
from fed_ros.core.rounds.collect import (
    DESCRIBE,
    DONE,
    EVALUATE,
    RoundPlan,
    SCORE,
    StageCollector,
    StageDecision,
    TRAIN,
)
from fed_ros.core.rounds.coordinator import RoundCoordinator
from fed_ros.core.rounds.settings import RoundSettings
from fed_ros.core.rounds.store import ModelStore
from fed_ros.core.strategies.types import ClientDescriptor, ClientUpdate, RoundResult

PROPS = settings(max_examples=100, deadline=None, database=None, derandomize=True)
ROBOTS = ("robot_0", "robot_1", "robot_2")
TIMEOUT = 10.0


# ----------------------------------------------------------------------------- helpers


class ScriptedStrategy:
    """A strategy whose every answer is scripted and every call recorded (no torch, no maths
    beyond a mean), so the coordinator's own decisions are what the tests see."""

    name = "scripted"

    def __init__(
        self,
        kinds=None,
        refuse: str | None = None,
        diagnostics=None,
        result_cluster: int = 0,
        membership=None,
        initial=(1.0, 1.0, 1.0),
    ):
        self.kinds = (
            kinds if kinds is not None else {}
        )  # round -> kinds, or callable(round, call no.)
        self.refuse = refuse
        self.diagnostics = diagnostics if diagnostics is not None else {}
        self.result_cluster = result_cluster
        self.membership = membership  # callable(robot_id) -> Membership, default [(0, 1.0)]
        self.models = {0: {"w": np.asarray(initial, np.float32)}}
        self.initialized: list[list[str]] = []
        self.configured: list[tuple[int, list[str]]] = []
        self.aggregated: list[tuple[int, list[str], dict]] = []
        self.observed: list[tuple[int, str]] = []
        self.loaded = None
        self.kind_calls = 0
        self.on_aggregate = None

    def initialize(self, initial, robot_ids):
        self.initialized.append(list(robot_ids))

    def configure_round(self, round_idx, robot_ids):
        self.configured.append((round_idx, list(robot_ids)))
        mem = self.membership or (lambda rid: [(0, 1.0)])
        # local_epochs follows the round so a wrong round index shows (and None fails).
        return {
            r: RobotInstruction(mem(r), RoundConfig(local_epochs=round_idx + 1)) for r in robot_ids
        }

    def needs_descriptors(self, round_idx):
        self.kind_calls += 1
        if callable(self.kinds):
            return set(self.kinds(round_idx, self.kind_calls))
        return set(self.kinds.get(round_idx, ()))

    def cluster_models(self):
        return self.models

    def observe(self, round_idx, update):
        self.observed.append((round_idx, update.robot_id))

    def aggregate_round(self, round_idx, updates, descriptors):
        self.aggregated.append((round_idx, [u.robot_id for u in updates], dict(descriptors)))
        if self.on_aggregate is not None:
            self.on_aggregate()
        if self.refuse:
            raise ValueError(self.refuse)
        mean = np.mean([np.asarray(u.params["w"], np.float64) for u in updates], axis=0).astype(
            np.float32
        )
        cid = self.result_cluster
        self.models = {cid: {"w": mean}}
        return RoundResult(
            {cid: {"w": mean}}, {u.robot_id: [(cid, 1.0)] for u in updates}, self.diagnostics
        )

    def state(self):
        return {"n": np.array([len(self.aggregated)], np.int64)}, {
            "aggregated": len(self.aggregated)
        }

    def load_state(self, arrays, meta):
        self.loaded = ({k: np.asarray(v).tolist() for k, v in arrays.items()}, dict(meta))


class MemoryStore:
    """A model store that keeps commits in memory and returns a given snapshot."""

    def __init__(self, snapshot=None):
        self.snapshot = snapshot
        self.commits = []

    def commit(self, round_idx, cluster_models, assignments, strategy_state, meta):
        self.commits.append((round_idx, cluster_models, assignments, strategy_state, meta))

    def load_latest(self):
        return self.snapshot


def _no(reason: str, code: str = REGISTER) -> Decision:
    """A rejection as the round machine returns it (registrations carry the REGISTER code)."""
    return Decision(False, code, reason)


def _no_clock():
    raise AssertionError("the coordinator read its own clock although the caller gave `now`")


def _settings(**kw) -> RoundSettings:
    base = dict(
        algorithm="scripted", rounds=3, quorum_fraction=0.6, round_timeout_s=TIMEOUT, max_attempts=2
    )
    base.update(kw)
    return RoundSettings(**base)


def _coord(strategy=None, store=None, robots=ROBOTS, clock=_no_clock, roster_file=None, **kw):
    coord = RoundCoordinator(
        strategy or ScriptedStrategy(),
        store if store is not None else MemoryStore(),
        _settings(**kw),
        {"w": np.zeros(3, np.float32)},
        clock=clock,
        roster_file=roster_file,
    )
    for rid in robots:
        assert coord.roster.register(rid, tasks=["lift"], num_samples=10).accepted
    return coord


def _update(
    rid: str, round_idx: int, value=1.0, n: int = 10, base: int | None = None, tag=True
) -> ClientUpdate:
    w = np.full(3, value, np.float32) if np.isscalar(value) else np.asarray(value, np.float32)
    upd = ClientUpdate(
        robot_id=rid,
        params={"w": w},
        num_samples=n,
        base_round=round_idx if base is None else base,
        metrics={"train_loss": 0.5},
    )
    if tag:
        upd.round_idx = round_idx
    return upd


def _desc(rid: str, payload: bytes = b"", kind="gaussian", n=5) -> ClientDescriptor:
    if kind == "rnd":
        return ClientDescriptor(
            robot_id=rid, kind=kind, num_samples=n, scores={}, residual_std=0.1, payload=payload
        )
    return ClientDescriptor(
        robot_id=rid,
        kind=kind,
        mean=np.zeros(2),
        variance=np.ones(2),
        num_samples=n,
        payload=payload,
    )


def _plan(n=3, quorum=2, deadline=10.0, round_idx=1, stage=TRAIN) -> RoundPlan:
    ids = tuple(f"robot_{i}" for i in range(n))
    return RoundPlan(
        round_idx=round_idx,
        stage=stage,
        attempt=1,
        deadline_s=deadline,
        algorithm="fedavg",
        participants=ids,
        memberships={r: [(0, 1.0)] for r in ids},
        quorum=quorum,
    )


def _train_all(coord, now, value=1.0, robots=None):
    plan = coord.current_plan
    for rid in robots or plan.participants:
        assert coord.offer_update(_update(rid, plan.round_idx, value), now=now) is ACCEPTED


# ================================================================ roster


@PROPS
@given(
    st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,12}", fullmatch=True),
    st.lists(st.text(min_size=1, max_size=8), max_size=4),
    st.integers(0, 2**40),
    st.booleans(),
    st.binary(max_size=40),
)
def test_robot_entry_json_round_trip_is_exact(rid, tasks, n, gpu, key):
    entry = RobotEntry(rid, tuple(tasks), n, gpu, key)
    obj = entry.to_json()
    assert obj == {
        "robot_id": rid,
        "tasks": list(tasks),
        "num_samples": n,
        "has_gpu": gpu,
        "public_key": key.hex(),
    }
    assert RobotEntry.from_json(json.loads(json.dumps(obj))) == entry


def test_robot_entry_from_json_fills_missing_fields_with_defaults():
    entry = RobotEntry.from_json({"robot_id": "robot_7"})
    assert entry == RobotEntry("robot_7", (), 0, False, b"")
    assert entry.has_gpu is False and entry.public_key == b"" and entry.tasks == ()


def test_roster_load_json_marks_entries_unseen_and_replaces_known_ones():
    roster = Roster()
    roster.register("robot_0", tasks=["old"], num_samples=1)
    roster.register("robot_0", tasks=["old"], num_samples=1)
    saved = [
        RobotEntry("robot_0", ("lift",), 9, True, b"k").to_json(),
        RobotEntry("robot_1").to_json(),
    ]
    roster.load_json(saved)
    assert roster.ids == ["robot_0", "robot_1"] and "robot_1" in roster and "robot_9" not in roster
    assert roster.get("robot_0") == RobotEntry("robot_0", ("lift",), 9, True, b"k", registrations=0)
    assert (
        roster.get("robot_1").registrations == 0
    )  # known from the store; not yet seen by this process
    assert roster.to_json() == saved


def test_default_roster_fleet_limits():
    roster = Roster()
    assert roster.register("robot_0", action_dim=4) is ACCEPTED
    verdict = roster.register("robot_1", action_dim=5)
    assert verdict == _no("action_dim 5 != fleet action_dim 4")
    roster.register("robot_2", num_samples=1_000_001)
    assert roster.get("robot_2").num_samples == 1_000_000
    roster.register("robot_3", num_samples=1_000_000)
    assert roster.get("robot_3").num_samples == 1_000_000


def test_default_roster_holds_ten_thousand_robots():
    roster = Roster()
    for i in range(10_000):
        assert roster.register(f"r{i}").accepted
    assert roster.register("r_last") == _no("fleet is full (10000 robots)")
    assert len(roster) == 10_000


def test_register_defaults_are_no_samples_no_gpu_no_key():
    roster = Roster()
    assert roster.register("robot_0") is ACCEPTED
    assert roster.get("robot_0") == RobotEntry("robot_0", (), 0, False, b"", registrations=1)


def test_first_key_is_pinned_even_after_a_keyless_registration():
    roster = Roster()
    assert roster.register("robot_0").accepted  # no key yet
    assert roster.register("robot_0", public_key=b"k" * 32).accepted  # trust on first use
    assert roster.get("robot_0").public_key == b"k" * 32
    verdict = roster.register("robot_0", public_key=b"x" * 32)
    assert verdict == _no("robot 'robot_0' re-registered with a different public key")
    assert roster.register("robot_0").accepted is False  # dropping the key is a different key too


def test_keyed_registration_pins_the_key_of_a_new_robot():
    roster = Roster()
    roster.register("robot_0", public_key=b"k" * 32)
    assert roster.get("robot_0").public_key == b"k" * 32
    assert roster.register("robot_0", public_key=b"z" * 32).accepted is False


def test_re_registration_refreshes_capabilities_and_counts():
    roster = Roster(max_samples=50)
    roster.register("robot_0", tasks=["a"], num_samples=5, has_gpu=False)
    assert roster.register("robot_0", tasks=["b", "c"], num_samples=500, has_gpu=1) is ACCEPTED
    entry = roster.get("robot_0")
    assert (entry.tasks, entry.num_samples, entry.has_gpu, entry.registrations) == (
        ("b", "c"),
        50,
        True,
        2,
    )
    assert entry.has_gpu is True
    roster.register("robot_0", has_gpu=0)
    assert roster.get("robot_0").has_gpu is False and roster.get("robot_0").registrations == 3


def test_new_robot_gpu_flag_is_a_bool():
    roster = Roster()
    roster.register("robot_0", has_gpu=1)
    roster.register("robot_1", has_gpu=True)
    assert roster.get("robot_0").has_gpu is True and roster.get("robot_1").has_gpu is True


@pytest.mark.parametrize(
    "rid", ["0robot", "_robot", "robot 0", "robot-0", "robot_0!", "", "robot_0\n", 7, None]
)
def test_bad_robot_ids_refused_with_the_rule(rid):
    verdict = Roster().register(rid)
    assert verdict == _no(f"bad robot id {rid!r} (must match ^[A-Za-z][A-Za-z0-9_]*$)")


@pytest.mark.parametrize("rid", ["r", "R", "robot_0", "Robot_9_x"])
def test_good_robot_ids_accepted(rid):
    assert Roster().register(rid) is ACCEPTED


def test_every_refusal_reason_names_the_cause():
    roster = Roster(allowed_keys={"robot_0": b"a" * 32}, max_robots=1)
    assert roster.register("robot_0", num_samples=-3) == _no("negative num_samples -3")
    assert roster.register("robot_1", public_key=b"a" * 32) == _no(
        "robot 'robot_1' is not on the allow-list"
    )
    assert roster.register("robot_0", public_key=b"b" * 32) == _no(
        "public key of 'robot_0' does not match the allow-list"
    )
    assert roster.register("robot_0", public_key=b"a" * 32) is ACCEPTED
    assert len(roster) == 1


def test_allow_listed_robot_refused_when_the_fleet_is_full():
    roster = Roster(allowed_keys={"robot_0": b"a", "robot_1": b"b"}, max_robots=1)
    assert roster.register("robot_0", public_key=b"a").accepted
    assert roster.register("robot_1", public_key=b"b") == _no("fleet is full (1 robots)")


def test_empty_allow_list_refuses_everyone():
    roster = Roster(allowed_keys={})
    assert roster.register("robot_0").accepted is False and len(roster) == 0


def test_ready_to_start_is_not_resumed_by_default():
    # Two of three expected robots, before the timeout: a fresh server keeps waiting.
    assert (
        ready_to_start(
            registered=["robot_0", "robot_1"],
            expected=ROBOTS,
            min_robots=1,
            waited_s=0.0,
            registration_timeout_s=30.0,
        )
        is False
    )


@PROPS
@given(
    st.sets(st.sampled_from(ROBOTS + ("robot_3",))),
    st.floats(0, 100),
    st.integers(1, 4),
    st.booleans(),
)
def test_ready_to_start_law(registered, waited, min_robots, with_expected):
    expected = ROBOTS if with_expected else ()
    ready = ready_to_start(
        registered=registered,
        expected=expected,
        min_robots=min_robots,
        waited_s=waited,
        registration_timeout_s=30.0,
    )
    enough = set(expected) <= registered if with_expected else len(registered) >= min_robots
    assert ready == (enough or (waited > 30.0 and len(registered) >= min_robots))


# ================================================================ round_collect


@pytest.mark.parametrize(
    "robot, round_idx, base, now, code, reason",
    [
        ("robot_9", 1, 1, 1.0, NOT_PARTICIPANT, "robot 'robot_9' is not a participant of round 1"),
        ("robot_0", 0, 0, 1.0, STALE_ROUND, "stale: answer for round 0, current round is 1"),
        ("robot_0", 2, 2, 1.0, FUTURE, "future round 2, current round is 1"),
        (
            "robot_0",
            1,
            0,
            1.0,
            STALE_BASE,
            "stale base: trained from model version 0, round 1 starts from version 1",
        ),
        ("robot_0", 1, 1, 12.5, LATE, "late: arrived 2.5 s after the deadline of round 1"),
    ],
)
def test_collector_rejection_code_and_reason_are_exact(robot, round_idx, base, now, code, reason):
    assert StageCollector(_plan()).check(robot, round_idx, now, base_round=base) == _no(
        reason, code
    )


def test_collector_duplicate_code_and_reason():
    col = StageCollector(_plan(stage=DESCRIBE))
    col.accept("robot_0", "d")
    assert col.check("robot_0", 1, 1.0) == _no(
        "duplicate answer from 'robot_0' for round 1 (describe)", DUPLICATE
    )


def test_collector_reject_without_a_code_invents_none():
    col = StageCollector(_plan())
    assert col.reject("robot_0", "why") == _no("why", "")
    assert col.reject("robot_0", "again", "late") == _no("again", "late")
    assert col.rejected == 2 and col.rejections == [("robot_0", "why")]


@PROPS
@given(st.integers(1, 6), st.data())
def test_collector_decision_law(n, data):
    """answered + stragglers partition the participants (in their order); the kind follows the
    rule."""
    plan = _plan(n=n, quorum=data.draw(st.integers(1, n)))
    col = StageCollector(plan)
    answered = tuple(r for r in plan.participants if data.draw(st.booleans()))
    for rid in answered:
        col.accept(rid, "a")
    missing = tuple(r for r in plan.participants if r not in answered)
    now = data.draw(st.sampled_from([0.0, 10.0, 10.0 + 1e-9, 50.0]))
    d = col.decision(now)
    if not missing:
        assert d == StageDecision("proceed", answered)
    elif now <= plan.deadline_s:
        assert d == StageDecision("wait", answered, missing)
    elif len(answered) >= plan.quorum:
        assert d == StageDecision(
            "proceed",
            answered,
            missing,
            f"deadline passed: {len(missing)} straggler(s) dropped: {', '.join(missing)}",
        )
    else:
        assert d == StageDecision(
            "abandon",
            answered,
            missing,
            f"below quorum: {len(answered)} of {plan.quorum} required answers by the deadline",
        )


def test_collector_names_every_dropped_straggler():
    col = StageCollector(_plan(n=4, quorum=2))
    col.accept("robot_0", "a")
    col.accept("robot_2", "a")
    assert col.decision(11.0).reason == "deadline passed: 2 straggler(s) dropped: robot_1, robot_3"


# ================================================================ rounds: settings, fresh state


def test_round_settings_eval_episodes_at_least_one():
    assert RoundSettings(algorithm="fedavg", rounds=1, eval_episodes=1).eval_episodes == 1
    with pytest.raises(ValueError, match="eval_episodes must be >= 1, got 0"):
        RoundSettings(algorithm="fedavg", rounds=1, eval_episodes=0)


def test_fresh_coordinator_has_nothing_in_progress():
    coord = _coord()
    assert coord.cluster_models == {} and coord.memberships == {}
    assert coord.finished is False and coord.failed_reason == ""
    assert coord.paused is False and coord.end_requested is False and coord.held is False
    assert coord.pending_outcome is None and coord.collector is None and coord.current_plan is None
    assert coord.round_idx == 0 and coord.attempt == 0


# ================================================================ rounds: start, stages


def test_train_only_round_announcement_is_exact():
    strategy = ScriptedStrategy()
    coord = _coord(strategy)
    plan = coord.start_round(now=100.0)
    assert plan == RoundPlan(
        round_idx=0,
        stage=TRAIN,
        attempt=1,
        deadline_s=110.0,
        algorithm="scripted",
        participants=ROBOTS,
        memberships={r: [(0, 1.0)] for r in ROBOTS},
        quorum=2,
        configs={r: RoundConfig(local_epochs=1) for r in ROBOTS},
    )
    assert strategy.initialized == [list(ROBOTS)] and strategy.configured == [(0, list(ROBOTS))]
    assert coord.stages == [TRAIN] and coord.current_plan is plan
    np.testing.assert_array_equal(coord.cluster_models[0]["w"], [1.0, 1.0, 1.0])


def test_start_round_uses_the_clock_only_without_now():
    coord = _coord(clock=lambda: 40.0)
    assert coord.start_round().deadline_s == 50.0
    assert coord.start_round(now=5.0).deadline_s == 15.0


def test_start_round_without_robots_refused():
    coord = _coord(robots=())
    with pytest.raises(ValueError, match="^cannot start a round with no registered robots$"):
        coord.start_round(now=0.0)


def test_strategy_without_membership_for_a_robot_refused():
    strategy = ScriptedStrategy()
    strategy.configure_round = lambda r, ids: {
        rid: RobotInstruction([(0, 1.0)]) for rid in ids if rid != "robot_1"
    }
    with pytest.raises(
        ValueError, match=r"strategy 'scripted' gave no membership for \['robot_1'\]"
    ):
        _coord(strategy).start_round(now=0.0)


def test_strategy_naming_a_cluster_without_a_model_refused():
    strategy = ScriptedStrategy(
        membership=lambda rid: [(7, 1.0)] if rid == "robot_2" else [(0, 1.0)]
    )
    with pytest.raises(
        ValueError, match=r"strategy 'scripted' names clusters \[7\] it has no model for"
    ):
        _coord(strategy).start_round(now=0.0)


@pytest.mark.parametrize(
    "kinds, stages",
    [
        (set(), [TRAIN]),
        ({"gaussian"}, [DESCRIBE, TRAIN]),
        ({"rnd"}, [DESCRIBE, SCORE, TRAIN]),
        ({"gaussian", "rnd"}, [DESCRIBE, SCORE, TRAIN]),
    ],
)
def test_stages_follow_the_descriptor_kinds_of_this_round(kinds, stages):
    coord = _coord(ScriptedStrategy(kinds={0: kinds}))
    assert coord.start_round(now=0.0).stage == stages[0]
    assert coord.stages == stages


def test_stages_are_asked_for_the_current_round():
    strategy = ScriptedStrategy(kinds={1: {"rnd"}})
    coord = _coord(strategy)
    coord.start_round(now=0.0)
    assert coord.stages == [TRAIN]  # round 0 needs nothing
    _train_all(coord, now=1.0)
    plan, outcome = coord.poll(now=1.0)
    assert outcome.completed and plan.stage == DESCRIBE and coord.stages == [DESCRIBE, SCORE, TRAIN]


def _describe_then_score(coord, payloads, score_payloads, now=1.0):
    """Every robot describes (DESCRIBE), then scores (SCORE); returns the TRAIN plan."""
    for rid in ROBOTS:
        assert (
            coord.offer_descriptor(
                payloads[rid](rid) if callable(payloads[rid]) else _desc(rid, payloads[rid]),
                0,
                now=now,
            )
            is ACCEPTED
        )
    plan, outcome = coord.poll(now=now)
    assert outcome is None and plan.stage == SCORE
    for rid in ROBOTS:
        ans = score_payloads[rid]
        assert (
            coord.offer_descriptor(
                ans(rid) if callable(ans) else _desc(rid, ans, kind="rnd"), 0, now=now
            )
            is ACCEPTED
        )
    plan, outcome = coord.poll(now=now)
    assert outcome is None
    return plan


def test_describe_score_train_sequence_and_the_score_answer_keeps_the_predictor():
    strategy = ScriptedStrategy(kinds={0: {"rnd"}})
    coord = _coord(strategy)
    plan = coord.start_round(now=0.0)
    assert (plan.stage, plan.deadline_s) == (DESCRIBE, 10.0)
    train = _describe_then_score(
        coord,
        {"robot_0": b"P0", "robot_1": b"P1", "robot_2": b""},
        {"robot_0": b"", "robot_1": b"Q1", "robot_2": b""},
        now=3.0,
    )
    assert (train.stage, train.round_idx, train.attempt, train.deadline_s, train.participants) == (
        TRAIN,
        0,
        1,
        13.0,
        ROBOTS,
    )
    _train_all(coord, now=4.0)
    _, outcome = coord.poll(now=4.0)
    assert outcome.completed
    ((_, ids, descs),) = strategy.aggregated
    assert ids == list(ROBOTS)
    assert {r: (d.kind, d.payload) for r, d in descs.items()} == {
        "robot_0": ("rnd", b"P0"),  # empty SCORE payload: the DESCRIBE predictor is kept
        "robot_1": ("rnd", b"Q1"),  # a SCORE payload of its own wins
        "robot_2": ("rnd", b""),
    }


def test_score_answer_of_another_shape_keeps_the_predictor():
    """Answers without a payload attribute (any descriptor-like object) are handled both ways."""
    strategy = ScriptedStrategy(kinds={0: {"rnd"}})
    coord = _coord(strategy)
    coord.start_round(now=0.0)
    bare = lambda rid: SimpleNamespace(robot_id=rid, num_samples=1)  # noqa: E731
    _describe_then_score(
        coord,
        {"robot_0": b"P0", "robot_1": bare, "robot_2": bare},
        {"robot_0": bare, "robot_1": b"", "robot_2": bare},
        now=1.0,
    )
    _train_all(coord, now=1.0)
    coord.poll(now=1.0)
    descs = strategy.aggregated[0][2]
    assert descs["robot_0"].payload == b"P0"
    assert descs["robot_1"].payload == b""
    assert not hasattr(descs["robot_2"], "payload")


def test_score_stage_asks_only_the_robots_that_described():
    strategy = ScriptedStrategy(kinds={0: {"rnd"}})
    coord = _coord(strategy)
    coord.start_round(now=0.0)
    for rid in ("robot_0", "robot_2"):
        coord.offer_descriptor(_desc(rid, b"P"), 0, now=1.0)
    assert coord.poll(now=10.0) == (None, None)
    plan, outcome = coord.poll(now=20.0)
    assert outcome is None
    assert (plan.stage, plan.participants, plan.quorum, plan.deadline_s) == (
        SCORE,
        ("robot_0", "robot_2"),
        2,
        30.0,
    )
    assert set(plan.memberships) == {"robot_0", "robot_2"}


def test_descriptor_round_completes_with_exactly_quorum_updates_and_passes_their_descriptors():
    strategy = ScriptedStrategy(kinds={0: {"gaussian"}})
    coord = _coord(strategy)
    coord.start_round(now=0.0)
    for rid in ROBOTS:
        coord.offer_descriptor(_desc(rid, rid.encode()), 0, now=1.0)
    plan, _ = coord.poll(now=1.0)
    assert plan.stage == TRAIN and plan.quorum == 2
    _train_all(coord, now=2.0, robots=("robot_0", "robot_2"))
    plan, outcome = coord.poll(now=11.5)  # robot_1 straggles; 2 = quorum
    assert outcome.completed and plan.stage == TRAIN and plan.round_idx == 1
    ((_, ids, descs),) = strategy.aggregated
    assert ids == ["robot_0", "robot_2"] and set(descs) == {"robot_0", "robot_2"}
    assert descs["robot_0"].payload == b"robot_0"


def test_abandoned_describe_attempt_re_announces_and_then_trains():
    strategy = ScriptedStrategy(kinds={0: {"gaussian"}})
    coord = _coord(strategy, max_attempts=3)
    coord.start_round(now=0.0)
    coord.offer_descriptor(_desc("robot_0", b"P"), 0, now=1.0)
    plan, outcome = coord.poll(now=10.5)
    assert outcome.completed is False and outcome.status.startswith("abandoned: below quorum")
    assert (plan.stage, plan.attempt, plan.deadline_s) == (DESCRIBE, 2, 20.5)
    assert coord.collector.answers.keys() == {"robot_0"}  # its describe answer carries over
    coord.offer_descriptor(_desc("robot_1", b"P"), 0, now=11.0)
    plan, outcome = coord.poll(now=21.0)
    assert outcome is None and (plan.stage, plan.participants) == (TRAIN, ("robot_0", "robot_1"))


# ================================================================ rounds: answers


def test_descriptor_checks_and_reasons():
    coord = _coord(ScriptedStrategy(kinds={0: {"gaussian"}}), max_samples=7)
    assert coord.offer_descriptor(_desc("robot_0"), 0, now=0.0) == _no(
        "no descriptor stage is open (stage none); descriptor from 'robot_0' rejected", NO_ROUND
    )
    coord.start_round(now=0.0)
    assert coord.offer_descriptor(_desc("robot_9"), 0, now=1.0) == _no(
        "robot 'robot_9' is not a participant of round 0", NOT_PARTICIPANT
    )
    late = coord.offer_descriptor(_desc("robot_1"), 0, now=10.5)
    assert (
        late.accepted is False
        and late.code == LATE
        and late.reason.startswith("late: arrived 0.5 s")
    )
    assert coord.offer_descriptor(_desc("robot_1"), 1, now=1.0) == _no(
        "future round 1, current round is 0", FUTURE
    )
    assert coord.offer_descriptor(_desc("robot_1"), -1, now=1.0).code == STALE_ROUND
    big = _desc("robot_0", n=8)
    assert (
        coord.offer_descriptor(big, 0, now=10.0) is ACCEPTED and big.num_samples == 7
    )  # capped; at the deadline
    exact = _desc("robot_2", n=7)
    assert coord.offer_descriptor(exact, 0, now=1.0) is ACCEPTED and exact.num_samples == 7
    dup = coord.offer_descriptor(_desc("robot_0"), 0, now=1.0)
    assert dup.accepted is False and dup.code == DUPLICATE and dup.reason.startswith("duplicate")
    assert coord.collector.rejected == 5
    assert coord.collector.rejections == [("robot_1", late.reason), ("robot_0", dup.reason)]
    assert coord.collector.answers["robot_0"] is big
    coord.poll(now=11.0)
    assert coord.current_plan.stage == TRAIN
    assert coord.offer_descriptor(_desc("robot_0"), 0, now=12.0) == _no(
        "no descriptor stage is open (stage train); descriptor from 'robot_0' rejected", NO_ROUND
    )


def test_descriptor_uses_the_clock_only_without_now():
    coord = _coord(ScriptedStrategy(kinds={0: {"gaussian"}}), clock=lambda: 50.0)
    coord.start_round(now=0.0)
    assert coord.offer_descriptor(_desc("robot_0"), 0).reason.startswith("late: arrived 40.0 s")
    assert coord.offer_descriptor(_desc("robot_0"), 0, now=1.0) is ACCEPTED


def test_update_outside_a_training_stage_rejected_with_the_stage():
    coord = _coord(ScriptedStrategy(kinds={0: {"gaussian"}}))
    assert coord.offer_update(_update("robot_0", 0), now=0.0) == _no(
        "no training round is open (stage none); update from 'robot_0' rejected", NO_ROUND
    )
    assert coord.check_update("robot_0", 0, 0, now=0.0) == _no(
        "no training round is open (stage none); update from 'robot_0' rejected", NO_ROUND
    )
    coord.start_round(now=0.0)
    assert coord.offer_update(_update("robot_1", 0), now=1.0) == _no(
        "no training round is open (stage describe); update from 'robot_1' rejected", NO_ROUND
    )
    assert coord.check_update("robot_1", 0, 0, now=1.0) == _no(
        "no training round is open (stage describe); update from 'robot_1' rejected", NO_ROUND
    )
    assert (
        coord.collector.rejected == 0
    )  # out of stage: the node records it (record_rejection), once


def test_check_update_uses_the_given_now_and_the_collector_rules():
    coord = _coord(clock=lambda: 1e9)
    coord.start_round(now=0.0)
    assert coord.check_update("robot_0", 0, 0, now=10.0) is ACCEPTED
    assert coord.check_update("robot_0", 0, 0, now=10.5).code == LATE
    assert coord.check_update("robot_0", 0, 0).code == LATE  # the clock when no now is given
    assert coord.check_update("robot_0", 0, 1, now=1.0).code == STALE_BASE
    assert coord.collector.rejected == 0 and coord.collector.answers == {}


def test_update_round_defaults_to_the_open_round_and_an_explicit_one_is_checked():
    coord = _coord()
    coord.start_round(now=0.0)
    assert coord.offer_update(_update("robot_0", 0, tag=False), now=1.0) is ACCEPTED
    future = _update("robot_1", 0)
    future.round_idx = 3
    assert coord.offer_update(future, now=1.0) == _no("future round 3, current round is 0", FUTURE)
    assert coord.offer_update(_update("robot_1", 0), now=1.0) is ACCEPTED


def test_the_strategy_observes_each_accepted_update_at_once_and_no_rejected_one():
    strategy = ScriptedStrategy()
    coord = _coord(strategy)
    assert not coord.offer_update(_update("robot_0", 0), now=0.0)  # no round open
    coord.start_round(now=0.0)
    assert coord.offer_update(_update("robot_0", 0), now=1.0) is ACCEPTED
    assert not coord.offer_update(_update("robot_0", 0), now=1.0)  # a second answer
    late = _update("robot_1", 0)
    late.round_idx = 3
    assert not coord.offer_update(late, now=1.0)
    assert strategy.observed == [(0, "robot_0")]


def test_update_checks_use_the_given_now():
    coord = _coord(clock=lambda: 1e9)
    coord.start_round(now=0.0)
    assert coord.offer_update(_update("robot_0", 0), now=10.0) is ACCEPTED
    assert coord.offer_update(_update("robot_1", 0)).code == LATE


def test_update_with_no_samples_rejection_is_exact_and_recorded():
    coord = _coord()
    coord.start_round(now=0.0)
    upd = _update("robot_0", 0)
    upd.num_samples = 0
    verdict = coord.offer_update(upd, now=1.0)
    assert verdict == _no("update from 'robot_0' claims 0 samples", "num_samples")
    assert (
        coord.collector.rejections == [("robot_0", verdict.reason)]
        and coord.collector.answers == {}
    )


def test_update_at_exactly_max_samples_kept():
    coord = _coord(max_samples=10)
    coord.start_round(now=0.0)
    upd = _update("robot_0", 0, n=10)
    assert coord.offer_update(upd, now=1.0) is ACCEPTED and upd.num_samples == 10


def test_metrics_outside_an_evaluation_stage_rejected_with_the_stage():
    coord = _coord()
    assert coord.offer_metrics("robot_0", 0.5, now=0.0) == _no(
        "no evaluation stage is open (stage none); metrics from 'robot_0' rejected", NO_ROUND
    )
    coord.start_round(now=0.0)
    assert coord.offer_metrics("robot_0", 0.5, now=0.0) == _no(
        "no evaluation stage is open (stage train); metrics from 'robot_0' rejected", NO_ROUND
    )


def _to_evaluation(coord, now=1.0):
    coord.start_round(now=0.0)
    _train_all(coord, now=now)
    plan, outcome = coord.poll(now=now)
    assert plan.stage == EVALUATE and outcome is None
    return plan


def test_evaluation_plan_is_exact_and_metrics_are_checked():
    coord = _coord(evaluate_every=1, eval_timeout_s=5.0, eval_episodes=4, clock=lambda: 1e9)
    plan = _to_evaluation(coord, now=2.0)
    assert plan == RoundPlan(
        round_idx=1,
        stage=EVALUATE,
        attempt=0,
        deadline_s=7.0,
        algorithm="scripted",
        participants=ROBOTS,
        memberships={r: [(0, 1.0)] for r in ROBOTS},
        quorum=0,
        configs={r: RoundConfig(local_epochs=2, eval_episodes=4) for r in ROBOTS},
    )
    bad = coord.offer_metrics("robot_1", math.nan, now=3.0)
    assert bad == _no("success rate nan from 'robot_1' is not in [0, 1]", OUT_OF_RANGE)
    assert coord.offer_metrics("robot_9", 0.5, now=3.0) == _no(
        "robot 'robot_9' is not a participant of round 1", NOT_PARTICIPANT
    )
    assert coord.offer_metrics("robot_0", 0.25, now=7.0) is ACCEPTED  # at the deadline, given now
    assert coord.offer_metrics("robot_2", 0.25).reason.startswith("late")  # the clock without now
    assert coord.collector.rejections == [
        ("robot_1", bad.reason),
        ("robot_2", coord.collector.rejections[1][1]),
    ]
    assert coord.collector.rejected == 3


def test_evaluation_closes_with_the_given_now_then_next_round():
    coord = _coord(evaluate_every=1, eval_timeout_s=5.0)
    _to_evaluation(coord, now=1.0)
    for rid in ROBOTS:
        coord.offer_metrics(rid, 1.0, now=2.0)
    plan, outcome = coord.poll(now=3.0)
    assert outcome.completed and [r.success_rate for r in outcome.robots] == [1.0, 1.0, 1.0]
    assert (plan.stage, plan.round_idx, plan.attempt, plan.deadline_s) == (TRAIN, 1, 1, 13.0)


def test_evaluation_interventions_are_checked_and_reach_the_report():
    """Interventions per episode (takeovers, human seconds): NaN = not reported, >= 0 kept, a
    negative or infinite value refused naming both values; the report carries them per robot."""
    coord = _coord(evaluate_every=1, eval_timeout_s=5.0)
    _to_evaluation(coord, now=1.0)
    for bad in ((-1.0, 0.0), (0.0, -0.5), (math.inf, 0.0), (0.0, math.inf)):
        verdict = coord.offer_metrics("robot_1", 1.0, now=2.0, interventions=bad)
        assert verdict == _no(
            f"interventions {bad[0]!r}/episode, {bad[1]!r} s/episode from 'robot_1' must be "
            ">= 0 (or NaN: not reported)",
            OUT_OF_RANGE,
        )
    assert coord.offer_metrics("robot_0", 0.5, now=2.0, interventions=(1.5, 4.25)) is ACCEPTED
    assert coord.offer_metrics("robot_1", 1.0, now=2.0, interventions=(0.0, 0.0)) is ACCEPTED
    assert coord.offer_metrics("robot_2", 0.0, now=2.0) is ACCEPTED  # none reported: NaN
    _, outcome = coord.poll(now=3.0)
    lines = {
        r.robot_id: (r.success_rate, r.interventions_per_episode, r.human_seconds_per_episode)
        for r in outcome.robots
    }
    assert lines["robot_0"] == (0.5, 1.5, 4.25) and lines["robot_1"] == (1.0, 0.0, 0.0)
    assert lines["robot_2"][0] == 0.0 and all(math.isnan(v) for v in lines["robot_2"][1:])


def test_after_the_last_evaluation_done_and_nothing_more():
    coord = _coord(rounds=1, evaluate_every=5, eval_timeout_s=5.0)
    _to_evaluation(coord, now=1.0)  # the final round is evaluated even off the evaluate_every grid
    plan, outcome = coord.poll(now=6.5)
    assert outcome.completed and plan.stage == DONE and plan.deadline_s == 6.5
    assert coord.collector is None and coord.current_plan is None and coord.finished
    assert coord.poll(now=100.0) == (None, None)


# ================================================================ rounds: closing a round


def test_completed_round_commit_and_report_are_exact(tmp_path):
    strategy = ScriptedStrategy(diagnostics={"loss": 2, "per": {"a": 1.5}, "skip": "text"})
    coord = _coord(strategy, store=ModelStore(tmp_path / "s"))
    coord.start_round(now=0.0)
    coord.offer_update(_update("robot_0", 0, [4.0, 5.0, 1.0]), now=1.0)
    coord.offer_update(_update("robot_2", 0, [4.0, 5.0, 1.0]), now=1.0)
    assert coord.poll(now=5.0) == (None, None)
    plan, outcome = coord.poll(now=10.5)
    assert outcome.completed is True
    assert outcome.status == "completed (deadline passed: 1 straggler(s) dropped: robot_1)"
    snap = ModelStore(tmp_path / "s").load_latest()
    assert snap.round_idx == 0
    assert snap.meta == {
        "roster": coord.roster.to_json(),
        "algorithm": "scripted",
        "accepted": ["robot_0", "robot_2"],
        "stragglers": ["robot_1"],
    }
    assert snap.strategy_meta == {"aggregated": 1}
    assert outcome.diagnostics == {"loss": 2.0, "per.a": 1.5}
    assert outcome.cluster_intra_similarity == {0: pytest.approx(1.0)}
    # initial cluster model [1, 1, 1] -> mean [4, 5, 1]: |(3, 4, 0)| = 5
    assert outcome.cluster_update_norms == {0: pytest.approx(5.0)}
    assert (plan.stage, plan.round_idx, plan.attempt, plan.deadline_s) == (TRAIN, 1, 1, 20.5)
    assert coord.attempt == 1 and coord.round_idx == 1


def test_round_without_stragglers_reports_plain_completed():
    coord = _coord()
    coord.start_round(now=0.0)
    _train_all(coord, now=1.0)
    _, outcome = coord.poll(now=1.0)
    assert outcome.status == "completed" and outcome.updates_accepted == 3


def test_outcome_clusters_come_from_the_new_assignments_and_new_clusters_have_no_norm():
    strategy = ScriptedStrategy(result_cluster=3)
    coord = _coord(strategy, rounds=1)
    coord.start_round(now=0.0)
    _train_all(coord, now=1.0)
    _, outcome = coord.poll(now=1.0)
    assert outcome.clusters == {3: list(ROBOTS)}
    assert [r.cluster_ids for r in outcome.robots] == [[3], [3], [3]]
    assert outcome.cluster_update_norms == {}  # cluster 3 did not exist before
    assert coord.memberships == {r: [(3, 1.0)] for r in ROBOTS}
    assert list(coord.cluster_models) == [3]


def test_result_without_diagnostics_reports_none():
    strategy = ScriptedStrategy()
    plain = strategy.aggregate_round
    strategy.aggregate_round = lambda *a: SimpleNamespace(
        cluster_models=plain(*a).cluster_models, assignments={r: [(0, 1.0)] for r in ROBOTS}
    )
    coord = _coord(strategy)
    coord.start_round(now=0.0)
    _train_all(coord, now=1.0)
    _, outcome = coord.poll(now=1.0)
    assert outcome.completed and outcome.diagnostics == {}


def test_aggregation_seconds_measure_the_strategy_call(monkeypatch):
    ticks = [100.0]
    monkeypatch.setattr(rounds_mod.time, "perf_counter", lambda: ticks[0])
    strategy = ScriptedStrategy()
    strategy.on_aggregate = lambda: ticks.__setitem__(0, ticks[0] + 2.5)
    coord = _coord(strategy)
    coord.start_round(now=0.0)
    _train_all(coord, now=1.0)
    _, outcome = coord.poll(now=1.0)
    assert outcome.aggregation_seconds == 2.5


def test_aggregation_refused_abandons_with_the_reason_and_commits_nothing():
    store = MemoryStore()
    coord = _coord(ScriptedStrategy(refuse="updates disagree"), store=store)
    coord.start_round(now=0.0)
    _train_all(coord, now=1.0)
    plan, outcome = coord.poll(now=2.0)
    assert (
        outcome.completed is False
        and outcome.status == "abandoned: aggregation refused: updates disagree"
    )
    assert [r.reason for r in outcome.robots] == ["round abandoned"] * 3
    assert (plan.stage, plan.round_idx, plan.attempt, plan.deadline_s) == (TRAIN, 0, 2, 12.0)
    assert store.commits == [] and coord.round_idx == 0
    _train_all(coord, now=3.0)
    plan, outcome = coord.poll(now=3.0)
    assert plan == coord.done_plan(3.0) and plan.stage == DONE
    assert coord.failed_reason == "round 0 abandoned 2 times: aggregation refused: updates disagree"


def test_robots_without_a_descriptor_are_dropped_before_aggregating():
    """A strategy that needs descriptors only by the time it aggregates: nobody described, so
    every update is dropped with a reason and the round is abandoned below quorum."""
    strategy = ScriptedStrategy(
        kinds=lambda r, call: {"gaussian"} if r == 0 and call > 1 else set()
    )
    store = MemoryStore()
    coord = _coord(strategy, store=store, max_attempts=3)
    assert coord.start_round(now=0.0).stage == TRAIN
    _train_all(coord, now=1.0)
    plan, outcome = coord.poll(now=1.0)
    assert outcome.completed is False
    assert outcome.status == "abandoned: below quorum after dropping robots without descriptors"
    assert {r.robot_id: r.reason for r in outcome.robots} == {
        rid: f"update from {rid!r} dropped: no descriptor this round" for rid in ROBOTS
    }
    assert outcome.updates_rejected == 3 and outcome.updates_accepted == 0
    assert strategy.aggregated == [] and store.commits == []
    assert (plan.round_idx, plan.attempt, plan.deadline_s) == (0, 2, 11.0)


def test_abandon_below_quorum_with_the_given_now():
    coord = _coord(max_attempts=2)
    coord.start_round(now=0.0)
    coord.offer_update(_update("robot_0", 0), now=1.0)
    plan, outcome = coord.poll(now=12.0)
    assert outcome.completed is False and outcome.status == (
        "abandoned: below quorum: 1 of 2 required answers by the deadline"
    )
    assert (plan.round_idx, plan.attempt, plan.deadline_s) == (0, 2, 22.0)
    plan, outcome = coord.poll(now=30.0)
    assert plan == RoundPlan(
        round_idx=0,
        stage=DONE,
        attempt=0,
        deadline_s=30.0,
        algorithm="scripted",
        participants=ROBOTS,
        memberships={r: [(0, 1.0)] for r in ROBOTS},
        quorum=0,
    )
    assert (
        coord.failed_reason
        == "round 0 abandoned 2 times: below quorum: 1 of 2 required answers by the deadline"
    )


@pytest.mark.parametrize("max_attempts", [1, 2, 4])
def test_max_attempts_abandons_end_the_run(max_attempts):
    coord = _coord(max_attempts=max_attempts)
    plan = coord.start_round(now=0.0)
    attempts = []
    t = 0.0
    while plan.stage != DONE:
        attempts.append(plan.attempt)
        t += 20.0
        plan, outcome = coord.poll(now=t)
        assert outcome.completed is False
    assert attempts == list(range(1, max_attempts + 1))
    assert coord.failed_reason.startswith(f"round 0 abandoned {max_attempts} times")
    assert coord.collector is None and coord.poll(now=t + 100.0) == (None, None)


@pytest.mark.parametrize("rounds", [1, 2, 3])
def test_no_round_after_the_last(rounds):
    store = MemoryStore()
    coord = _coord(store=store, rounds=rounds)
    plan = coord.start_round(now=0.0)
    seen = []
    while plan.stage != DONE:
        seen.append(plan.round_idx)
        _train_all(coord, now=1.0)
        plan, outcome = coord.poll(now=1.0)
        assert outcome.completed
    assert seen == list(range(rounds)) and [c[0] for c in store.commits] == list(range(rounds))
    assert plan.round_idx == rounds and coord.finished
    assert coord.start_round(now=2.0).stage == DONE and len(store.commits) == rounds


def test_done_plan_keeps_only_known_memberships():
    coord = _coord()
    coord.start_round(now=0.0)
    coord.roster.register("robot_3")  # registered after the announcement: no membership yet
    plan = coord.done_plan(4.0)
    assert plan == RoundPlan(
        round_idx=0,
        stage=DONE,
        attempt=0,
        deadline_s=4.0,
        algorithm="scripted",
        participants=ROBOTS + ("robot_3",),
        memberships={r: [(0, 1.0)] for r in ROBOTS},
        quorum=0,
    )


def test_held_round_is_announced_with_the_given_now():
    coord = _coord()
    coord.paused = coord.held = True
    assert coord.poll(now=1.0) == (None, None)
    coord.paused = False
    plan, outcome = coord.poll(now=7.0)
    assert outcome is None and (plan.attempt, plan.deadline_s) == (1, 17.0)


def test_end_requested_before_start_is_done_at_the_given_now():
    coord = _coord()
    coord.end_requested = True
    plan = coord.start_round(now=3.0)
    assert plan.stage == DONE and plan.deadline_s == 3.0 and coord.finished


def test_poll_reads_the_clock_only_without_now():
    ticks = [0.0]
    coord = _coord(clock=lambda: ticks[0])
    coord.start_round()
    ticks[0] = 5.0
    assert coord.poll() == (None, None)
    ticks[0] = 10.5
    plan, outcome = coord.poll()
    assert outcome.completed is False and plan.deadline_s == 20.5
    assert coord.poll(now=0.0) == (
        None,
        None,
    )  # a given now wins over the clock (here: 1e9 would close it)


# ================================================================ rounds: registration file, resume


def test_coordinator_register_passes_capabilities_and_persists_atomically(tmp_path):
    path = tmp_path / "deep" / "dir" / "roster.json"
    coord = _coord(robots=(), roster_file=path)
    assert (
        coord.register("robot_0", tasks=["lift"], num_samples=3, has_gpu=True, public_key=b"k")
        is ACCEPTED
    )
    assert coord.roster.get("robot_0") == RobotEntry("robot_0", ("lift",), 3, True, b"k")
    assert json.loads(path.read_text()) == coord.roster.to_json()
    assert sorted(p.name for p in path.parent.iterdir()) == ["roster.json"]


def test_refused_registration_writes_no_roster_file(tmp_path):
    path = tmp_path / "roster.json"
    coord = _coord(robots=(), roster_file=path)
    assert coord.register("bad id").accepted is False
    assert not path.exists()


def test_register_without_a_roster_file_keeps_it_in_memory():
    coord = _coord(robots=())
    assert coord.register("bad id").accepted is False
    assert coord.register("robot_0", tasks=["lift"]) is ACCEPTED and coord.roster.ids == ["robot_0"]


def test_resume_with_nothing_committed_and_no_roster_file():
    coord = _coord(robots=())
    assert coord.resume() is False
    assert coord.roster.ids == [] and coord.round_idx == 0


def test_resume_from_a_snapshot_restores_everything():
    strategy = ScriptedStrategy()
    snap = SimpleNamespace(
        round_idx=4,
        cluster_models={"2": {"w": np.array([9.0, 9.0, 9.0])}},
        assignments={"robot_0": [(2, 1.0)]},
        strategy_arrays={"n": np.array([5])},
        strategy_meta={"aggregated": 5},
        meta={"roster": [RobotEntry("robot_0", ("lift",)).to_json()]},
    )
    coord = _coord(strategy, store=MemoryStore(snap), robots=(), rounds=10)
    assert coord.resume() is True
    assert strategy.loaded == ({"n": [5]}, {"aggregated": 5})
    assert list(coord.cluster_models) == [2] and coord.cluster_models[2]["w"].tolist() == [
        9.0,
        9.0,
        9.0,
    ]
    assert coord.memberships == {"robot_0": [(2, 1.0)]} and coord.roster.ids == ["robot_0"]
    assert coord.round_idx == 5 and coord.finished is False
    strategy.models = {2: {"w": np.zeros(3)}}
    strategy.membership = lambda rid: [(2, 1.0)]
    plan = coord.start_round(now=0.0)
    assert strategy.initialized == []  # resumed: the strategy state is loaded, not re-initialized
    assert (plan.round_idx, plan.attempt, plan.stage) == (5, 1, TRAIN)


def test_resume_of_a_round_meta_without_roster_starts_with_an_empty_roster():
    snap = SimpleNamespace(
        round_idx=0,
        cluster_models={},
        assignments={},
        strategy_arrays={},
        strategy_meta={},
        meta={},
    )
    coord = _coord(store=MemoryStore(snap), robots=())
    assert coord.resume() is True and coord.roster.ids == [] and coord.round_idx == 1


@pytest.mark.parametrize("crash_in", [DESCRIBE, SCORE, TRAIN, EVALUATE])
def test_crash_in_any_stage_resumes_at_the_first_uncommitted_round(tmp_path, crash_in):
    """Round 0 commits; the server dies while round 1 is in `crash_in`; a new process resumes
    at round 1 (announced afresh from its first stage) with the committed models."""
    kinds = {1: {"rnd"}} if crash_in in (DESCRIBE, SCORE) else {}
    every = 1 if crash_in == EVALUATE else 0
    store_dir = tmp_path / "store"

    def fresh():
        return _coord(
            ScriptedStrategy(kinds=dict(kinds)),
            store=ModelStore(store_dir),
            rounds=3,
            evaluate_every=every,
            robots=(),
        )

    first = fresh()
    for rid in ROBOTS:
        first.register(rid)
    first.start_round(now=0.0)
    _train_all(first, now=1.0, value=[2.0, 3.0, 4.0])
    plan, _ = first.poll(now=1.0)
    if crash_in == EVALUATE:
        assert plan.stage == EVALUATE
    else:
        assert plan.round_idx == 1 and plan.stage == (DESCRIBE if crash_in != TRAIN else TRAIN)
        if crash_in == SCORE:
            for rid in ROBOTS:
                first.offer_descriptor(_desc(rid, b"P"), 1, now=2.0)
            plan, _ = first.poll(now=2.0)
            assert plan.stage == SCORE
        if crash_in == TRAIN:
            first.offer_update(
                _update("robot_0", 1, 50.0), now=2.0
            )  # in flight: lost with the process
    # --- crash: a new process, same store
    again = fresh()
    assert again.resume() is True
    assert again.round_idx == 1 and again.roster.ids == list(ROBOTS) and not again.finished
    assert again.cluster_models[0]["w"].tolist() == [2.0, 3.0, 4.0]
    plan = again.start_round(now=50.0)
    assert (plan.round_idx, plan.attempt, plan.deadline_s) == (1, 1, 60.0)
    assert plan.stage == (DESCRIBE if crash_in in (DESCRIBE, SCORE) else TRAIN)
    assert again.collector.answers == {}


# ================================================================ each update counted once


@PROPS
@given(
    st.lists(
        st.tuples(
            st.sampled_from(ROBOTS + ("robot_9",)),
            st.sampled_from([-1, 0, 1]),
            st.floats(0.0, 12.0),
        ),
        max_size=12,
    )
)
def test_each_participant_counted_at_most_once_and_every_offer_counted(offers):
    """Whatever arrives (repeats, strangers, stale / future rounds, late), a robot's update is
    accepted at most once per round, and received = accepted + rejected in the report."""
    coord = _coord(clock=_no_clock)
    coord.start_round(now=0.0)
    accepted = []
    for rid, dr, t in sorted(offers, key=lambda o: o[2]):
        verdict = coord.offer_update(
            _update(rid, 0 + dr if dr >= 0 else 0, base=0 if dr >= 0 else 1), now=t
        )
        if verdict.accepted:
            accepted.append(rid)
    assert len(accepted) == len(set(accepted))
    assert set(accepted) <= set(ROBOTS)
    plan, outcome = coord.poll(now=20.0)
    assert outcome.updates_accepted == (len(accepted) if len(accepted) >= 2 else 0)
    assert outcome.updates_received == len(offers)
    assert outcome.updates_rejected == len(offers) - len(accepted)


# --- a participant that sits a stage out and says why (issue 24: a robot waiting for
# demonstrations)


def test_a_decline_is_reported_with_its_reason_and_is_neither_an_answer_nor_a_rejection():
    coord = _coord()
    coord.start_round(now=0.0)
    why = "waiting for demonstrations (have 0 of 2)"
    assert coord.offer_decline("robot_2", why, now=1.0) is ACCEPTED
    assert (
        coord.offer_decline("robot_2", "a second reason", now=1.5) is ACCEPTED
    )  # the first one counts
    col = coord.collector
    assert col.declined == {"robot_2": why} and col.rejected == 0 and col.rejections == []
    assert "robot_2" not in col.answers
    _train_all(coord, now=2.0, robots=["robot_0", "robot_1"])
    plan, outcome = coord.poll(now=TIMEOUT + 0.5)  # at the deadline, with a quorum of 2 of 3
    assert outcome.completed and outcome.updates_rejected == 0 and outcome.updates_received == 2
    lines = {r.robot_id: (r.accepted, r.reason) for r in outcome.robots}
    assert lines == {"robot_0": (True, ""), "robot_1": (True, ""), "robot_2": (False, why)}


def test_a_decline_from_a_stranger_or_with_no_stage_open_is_refused_and_not_recorded():
    coord = _coord()
    verdict = coord.offer_decline("robot_0", "why", now=0.0)
    assert not verdict.accepted and "no stage is open" in verdict.reason
    coord.start_round(now=0.0)
    verdict = coord.offer_decline("intruder", "why", now=1.0)
    assert not verdict.accepted and verdict.code == NOT_PARTICIPANT
    late = coord.offer_decline("robot_0", "why", now=TIMEOUT + 1.0)
    assert not late.accepted and late.code == LATE
    assert coord.collector.declined == {}
