"""The server's round state machine (pure, no ROS): roster, deadlines, quorum, rejections,
abandoned rounds, commit-before-publish and resume, driven by a fake clock with the real
core strategies and model store."""

from __future__ import annotations

import numpy as np
import pytest

from fed_ros.core.rounds.store import ModelStore
from fed_ros.core.strategies.base import make_strategy
from fed_ros.core.rounds.roster import Roster
from fed_ros.core.rounds.collect import (
    DESCRIBE,
    DONE,
    EVALUATE,
    RoundPlan,
    SCORE,
    StageCollector,
    TRAIN,
    quorum_for,
)
from fed_ros.core.rounds.coordinator import RoundCoordinator
from fed_ros.core.rounds.settings import RoundSettings
from support.rounds import ROBOTS, _coordinator, _initial, _update


def _plan(participants=ROBOTS, deadline=10.0, quorum=2, round_idx=1) -> RoundPlan:
    return RoundPlan(
        round_idx=round_idx,
        stage=TRAIN,
        attempt=1,
        deadline_s=deadline,
        algorithm="fedavg",
        participants=tuple(participants),
        memberships={r: [(0, 1.0)] for r in participants},
        quorum=quorum,
    )


def test_quorum_is_ceil_fraction_bounded_by_participants():
    assert quorum_for(4, 0.75, 1) == 3
    assert quorum_for(3, 0.6, 1) == 2
    assert quorum_for(2, 0.1, 3) == 2
    with pytest.raises(ValueError, match="quorum fraction"):
        quorum_for(3, 0.0, 1)


def test_roster_pins_first_key_and_rejects_bad_ids():
    roster = Roster()
    assert roster.register("robot_0", public_key=b"k" * 32).accepted
    assert roster.register("robot_0", public_key=b"k" * 32).accepted  # restart: same key
    verdict = roster.register("robot_0", public_key=b"x" * 32)
    assert not verdict.accepted and "different public key" in verdict.reason
    assert not roster.register("0bad id").accepted
    assert "action_dim" in roster.register("robot_1", action_dim=7).reason
    assert roster.ids == ["robot_0"]


def test_roster_allow_list():
    roster = Roster(allowed_keys={"robot_0": b"a" * 32})
    assert "allow-list" in roster.register("robot_1", public_key=b"a" * 32).reason
    assert "does not match" in roster.register("robot_0", public_key=b"b" * 32).reason
    assert roster.register("robot_0", public_key=b"a" * 32).accepted


@pytest.mark.parametrize(
    "robot,round_idx,base,now,expected",
    [
        ("robot_9", 1, 1, 1.0, "not a participant"),
        ("robot_0", 0, 0, 1.0, "stale: answer for round 0"),
        ("robot_0", 2, 2, 1.0, "future round 2"),
        ("robot_0", 1, 0, 1.0, "stale base"),
        ("robot_0", 1, 1, 11.0, "late"),
    ],
)
def test_collector_rejects_with_reason(robot, round_idx, base, now, expected):
    verdict = StageCollector(_plan()).check(robot, round_idx, now, base_round=base)
    assert not verdict.accepted
    assert expected in verdict.reason


def test_collector_rejects_duplicates_and_decides():
    col = StageCollector(_plan())
    assert col.check("robot_0", 1, 1.0, 1).accepted
    col.accept("robot_0", "u0")
    assert "duplicate" in col.check("robot_0", 1, 2.0, 1).reason
    assert col.decision(5.0).kind == "wait"
    assert col.decision(11.0).kind == "abandon"  # 1 of quorum 2 by the deadline
    col.accept("robot_1", "u1")
    late = col.decision(11.0)
    assert late.kind == "proceed" and late.stragglers == ("robot_2",)
    col.accept("robot_2", "u2")
    assert col.decision(1.0).kind == "proceed"  # everyone answered: no need to wait


def test_round_commits_before_next_announcement(tmp_path):
    coord, clock = _coordinator(tmp_path)
    plan = coord.start_round()
    assert (
        plan.stage == TRAIN
        and plan.round_idx == 0
        and plan.participants == ROBOTS
        and plan.quorum == 2
    )
    for i, rid in enumerate(ROBOTS):
        assert coord.offer_update(_update(rid, float(i), 0)).accepted
    nxt, outcome = coord.poll()
    assert outcome.completed and outcome.updates_accepted == 3 and outcome.round_idx == 0
    assert nxt.round_idx == 1 and nxt.stage == TRAIN
    snap = ModelStore(tmp_path / "store").load_latest()
    assert snap is not None and snap.round_idx == 0  # committed when poll returned
    np.testing.assert_allclose(snap.cluster_models[0]["w"], 1.0)  # FedAvg of 0, 1, 2 (equal n)
    np.testing.assert_array_equal(coord.cluster_models[0]["w"], snap.cluster_models[0]["w"])
    assert [r["robot_id"] for r in snap.meta["roster"]] == list(ROBOTS)


def test_straggler_dropped_at_deadline_with_quorum(tmp_path):
    coord, clock = _coordinator(tmp_path)
    coord.start_round()
    coord.offer_update(_update("robot_0", 1.0, 0))
    coord.offer_update(_update("robot_1", 3.0, 0))
    assert coord.poll() == (None, None)  # robot_2 may still answer
    clock[0] = 10.5
    nxt, outcome = coord.poll()
    assert outcome.completed and "straggler" in outcome.status
    by_id = {r.robot_id: r for r in outcome.robots}
    assert not by_id["robot_2"].accepted and "straggler" in by_id["robot_2"].reason
    np.testing.assert_allclose(coord.cluster_models[0]["b"], 2.0)
    late = coord.offer_update(_update("robot_2", 9.0, 0))
    assert not late.accepted and "stale" in late.reason  # round 0 is closed; round 1 is open


def test_below_quorum_round_is_abandoned_and_models_unchanged(tmp_path):
    coord, clock = _coordinator(tmp_path, max_attempts=2)
    coord.start_round()
    before = {k: v.copy() for k, v in coord.cluster_models[0].items()}
    coord.offer_update(_update("robot_0", 5.0, 0))
    clock[0] = 10.5
    nxt, outcome = coord.poll()
    assert not outcome.completed and "below quorum" in outcome.status
    assert outcome.updates_accepted == 0
    assert nxt.round_idx == 0 and nxt.attempt == 2  # same round announced again
    for k in before:
        np.testing.assert_array_equal(coord.cluster_models[0][k], before[k])
    assert ModelStore(tmp_path / "store").load_latest() is None  # nothing committed
    clock[0] = 25.0
    nxt, outcome = coord.poll()
    assert nxt.stage == DONE and not outcome.completed  # robots are told it is over
    assert "abandoned 2 times" in coord.failed_reason
    assert ModelStore(tmp_path / "store").load_latest() is None


def test_bad_updates_rejected_with_reason_and_code(tmp_path):
    """Round rules reject with a code (tensor content is the transfer receiver's check,
    test_transfer.py); a rejected robot may still answer validly before the deadline."""
    coord, _ = _coordinator(tmp_path)
    coord.start_round()
    zero = _update("robot_0", 1.0, 0)
    zero.num_samples = 0
    verdict = coord.offer_update(zero)
    assert (
        not verdict.accepted
        and verdict.code == "num_samples"
        and "claims 0 samples" in verdict.reason
    )
    stale = _update("robot_1", 1.0, 0)
    stale.base_round = 3
    assert coord.offer_update(stale).code == "stale_base"
    assert coord.collector.rejections and len(coord.collector.answers) == 0
    assert coord.offer_update(_update("robot_0", 1.0, 0)).accepted
    assert coord.offer_update(_update("robot_0", 1.0, 0)).code == "duplicate"


def test_restart_resumes_from_last_commit_with_identical_models(tmp_path):
    coord, clock = _coordinator(tmp_path, rounds=3)
    coord.start_round()
    for i, rid in enumerate(ROBOTS):
        coord.offer_update(_update(rid, float(i + 1), 0))
    nxt, _ = coord.poll()
    assert nxt.round_idx == 1
    coord.offer_update(_update("robot_0", 7.0, 1))  # in flight when the server dies: lost
    # A fresh process: new strategy, new coordinator, same store, empty roster.
    settings = coord.settings
    again = RoundCoordinator(
        make_strategy("fedavg"), ModelStore(tmp_path / "store"), settings, _initial()
    )
    assert again.resume()
    assert again.round_idx == 1 and again.roster.ids == list(ROBOTS)
    plan = again.start_round(now=0.0)
    assert plan.round_idx == 1 and plan.participants == ROBOTS
    for cid, model in coord.cluster_models.items():
        for k in model:
            np.testing.assert_array_equal(again.cluster_models[cid][k], model[k])


def test_finishes_after_configured_rounds(tmp_path):
    coord, clock = _coordinator(tmp_path, rounds=1)
    coord.start_round()
    for rid in ROBOTS:
        coord.offer_update(_update(rid, 1.0, 0))
    nxt, outcome = coord.poll()
    assert outcome.completed and nxt.stage == DONE and coord.finished
    assert coord.poll() == (None, None)
    assert "no training round" in coord.offer_update(_update("robot_0", 1.0, 1)).reason


def test_descriptor_stages_precede_training_for_fedepth(tmp_path):
    coord, _ = _coordinator(tmp_path, algorithm="fedepth")
    plan = coord.start_round()
    if plan.stage == TRAIN:
        pytest.fail("fedepth needs Gaussian descriptors before aggregating")
    assert plan.stage == DESCRIBE and SCORE not in coord.stages


def test_evaluation_stage_fills_success_rates_into_the_held_report(tmp_path):
    clock = [0.0]
    settings = RoundSettings(
        algorithm="fedprox",
        rounds=2,
        quorum_fraction=0.6,
        round_timeout_s=10.0,
        evaluate_every=1,
        eval_timeout_s=5.0,
        eval_episodes=3,
    )
    coord = RoundCoordinator(
        make_strategy("fedprox", mu=0.02),
        ModelStore(tmp_path / "s"),
        settings,
        _initial(),
        clock=lambda: clock[0],
    )
    for rid in ROBOTS:
        coord.roster.register(rid)
    plan = coord.start_round()
    # Every participant is told the strategy's round config (FedProx: its mu); no evaluation yet.
    assert {r: (c.prox_mu, c.eval_episodes) for r, c in plan.configs.items()} == {
        r: (0.02, None) for r in ROBOTS
    }
    for rid in ROBOTS:
        coord.offer_update(_update(rid, 1.0, 0))
    plan, outcome = coord.poll()
    assert outcome is None  # held until the new models are evaluated
    assert plan.stage == EVALUATE and plan.round_idx == 1 and plan.quorum == 0
    assert all(
        plan.configs[r].eval_episodes == 3 for r in ROBOTS
    )  # the server's evaluation request
    assert ModelStore(tmp_path / "s").load_latest().round_idx == 0  # committed before evaluation
    assert coord.offer_metrics("robot_0", 0.5).accepted
    assert "not in [0, 1]" in coord.offer_metrics("robot_1", 1.5).reason
    assert "duplicate" in coord.offer_metrics("robot_0", 0.5).reason
    clock[0] = 6.0  # evaluation deadline: whoever answered is reported
    plan, outcome = coord.poll()
    assert plan.stage == TRAIN and plan.round_idx == 1
    rates = {r.robot_id: r.success_rate for r in outcome.robots}
    assert rates["robot_0"] == 0.5 and np.isnan(rates["robot_2"])
    assert "no evaluation stage" in coord.offer_metrics("robot_2", 1.0).reason


def test_intra_cluster_similarity_of_accumulated_updates():
    from fed_ros.core.rounds.report import intra_cluster_similarity

    init = {"w": np.zeros(2, np.float32)}
    params = {
        "a": {"w": np.array([1.0, 0.0], np.float32)},
        "b": {"w": np.array([2.0, 0.0], np.float32)},
        "c": {"w": np.array([0.0, 1.0], np.float32)},
    }
    sims = intra_cluster_similarity(params, init, {0: ["a", "b"], 1: ["a", "c"], 2: ["c"]})
    assert sims[0] == pytest.approx(1.0) and sims[1] == pytest.approx(0.0) and np.isnan(sims[2])


# ------------------------------------------------------------------ fleet boundary (issue 13)


def test_empty_allow_list_roster_is_kept_by_the_coordinator(tmp_path):
    """An allow-list roster with no robot registered yet is falsy (len 0); it must not be
    replaced."""
    settings = RoundSettings(algorithm="fedavg", rounds=1)
    roster = Roster(allowed_keys={"robot_0": b"a" * 32})
    coord = RoundCoordinator(
        make_strategy("fedavg"), ModelStore(tmp_path / "s"), settings, _initial(), roster
    )
    assert coord.roster is roster
    verdict = coord.roster.register("intruder_0", public_key=b"z" * 32)
    assert not verdict.accepted and "not on the allow-list" in verdict.reason
    assert len(coord.roster) == 0


def test_check_update_does_not_count_so_the_node_counts_each_rejection_once(tmp_path):
    """One rejected and two accepted updates: received 3, rejected 1 (was 4 / 2)."""
    coord, clock = _coordinator(tmp_path)
    coord.start_round()
    verdict = coord.check_update("robot_0", 0, base_round=7)  # stale base: rejected on the header
    assert not verdict.accepted and "stale base" in verdict.reason
    coord.record_rejection("robot_0", verdict.reason)  # what the node does with a rejection, once
    assert coord.offer_update(_update("robot_1", 1.0, 0)).accepted
    assert coord.offer_update(_update("robot_2", 2.0, 0)).accepted
    clock[0] = 10.5
    _, outcome = coord.poll()
    assert outcome.completed
    assert (outcome.updates_received, outcome.updates_accepted, outcome.updates_rejected) == (
        3,
        2,
        1,
    )


def test_abandoned_round_completes_when_re_announced(tmp_path):
    """Answers to an abandoned attempt stay valid for the re-announced round (same model version):
    the robots that answered then need not retrain, and the others' fresh answers complete it."""
    coord, clock = _coordinator(tmp_path, max_attempts=3)
    coord.start_round()
    assert coord.offer_update(_update("robot_0", 1.0, 0)).accepted
    clock[0] = 10.5
    nxt, outcome = coord.poll()
    assert not outcome.completed and nxt.round_idx == 0 and nxt.attempt == 2
    # The re-announced round: robot_0's answer carries over (the node drops its re-sent copy as a
    # known payload id), robot_1 answers now.
    assert coord.offer_update(_update("robot_1", 3.0, 0)).accepted
    clock[0] = 21.0
    nxt, outcome = coord.poll()
    assert outcome.completed, outcome.status
    assert outcome.updates_accepted == 2 and outcome.updates_rejected == 0
    np.testing.assert_allclose(
        coord.cluster_models[0]["w"], 2.0
    )  # FedAvg of robot_0 (1) and robot_1 (3)
    assert nxt.round_idx == 1 and nxt.attempt == 1


def test_re_announced_round_takes_a_fresh_answer_over_the_carried_one(tmp_path):
    """A robot that retrained after the re-announcement replaces its earlier answer (never counted
    twice)."""
    coord, clock = _coordinator(tmp_path, max_attempts=3)
    coord.start_round()
    coord.offer_update(_update("robot_0", 1.0, 0))
    clock[0] = 10.5
    coord.poll()
    assert coord.offer_update(_update("robot_0", 5.0, 0)).accepted
    assert (
        "duplicate" in coord.offer_update(_update("robot_0", 6.0, 0)).reason
    )  # this attempt: once
    coord.offer_update(_update("robot_1", 1.0, 0))
    coord.offer_update(_update("robot_2", 3.0, 0))
    _, outcome = coord.poll()
    assert outcome.completed and outcome.updates_accepted == 3
    np.testing.assert_allclose(coord.cluster_models[0]["w"], 3.0)  # (5 + 1 + 3) / 3


def test_rejections_from_unknown_senders_are_counted_but_not_kept(tmp_path):
    """A burst of junk from unknown ids grows a counter, not a list (state for unknown senders
    capped)."""
    coord, clock = _coordinator(tmp_path)
    coord.start_round()
    for i in range(1000):
        coord.record_rejection(f"junk_{i}", "not a participant")
        coord.record_rejection("robot_0", f"bad update {i}")
    assert coord.collector.rejected == 2000
    assert coord.collector.rejections == [
        ("robot_0", "bad update 0")
    ]  # first reason per participant
    clock[0] = 10.5
    _, outcome = coord.poll()
    assert outcome.updates_rejected == 2000 and outcome.updates_received == 2000


def test_roster_survives_a_restart_before_the_first_commit(tmp_path):
    # Robots register once, at start-up: a server killed before committing round 0 must
    # still know them when it restarts, or it waits for registrations forever.
    settings = RoundSettings(
        algorithm="fedavg", rounds=2, quorum_fraction=1.0, round_timeout_s=10.0
    )
    first = RoundCoordinator(
        make_strategy("fedavg"),
        ModelStore(tmp_path / "store"),
        settings,
        _initial(),
        roster_file=tmp_path / "store" / "roster.json",
    )
    for rid in ROBOTS[:2]:
        assert first.register(rid, tasks=["lift"], num_samples=10).accepted
    assert not first.register("robot 9", tasks=["lift"]).accepted  # refused ids are not persisted

    again = RoundCoordinator(
        make_strategy("fedavg"),
        ModelStore(tmp_path / "store"),
        settings,
        _initial(),
        roster_file=tmp_path / "store" / "roster.json",
    )
    assert again.resume() is False  # nothing committed yet
    assert again.roster.ids == list(ROBOTS[:2])
    plan = again.start_round(now=0.0)
    assert plan.round_idx == 0 and set(plan.participants) == set(ROBOTS[:2])


# ---------------------------------------------------------------- managed operation (rounds gate)
def test_pause_finishes_the_round_in_progress_and_holds_the_next_with_a_fresh_deadline(tmp_path):
    coord, clock = _coordinator(tmp_path, rounds=2, timeout=10.0)
    coord.start_round()
    coord.paused = True  # rounds_enabled false while round 0 collects
    for i, rid in enumerate(ROBOTS):
        assert coord.offer_update(_update(rid, float(i), 0)).accepted
    nxt, outcome = coord.poll()
    assert outcome.completed and nxt is None and coord.held  # aggregated, no round 1 announced
    assert ModelStore(tmp_path / "store").load_latest().round_idx == 0  # committed
    for t in (
        11.0,
        500.0,
        10_000.0,
    ):  # long past round 0's deadline: nothing expires, nothing starts
        clock[0] = t
        assert coord.poll() == (None, None) and coord.collector is None and coord.held
    assert "no training round" in coord.offer_update(_update("robot_0", 1.0, 1)).reason
    coord.paused = False
    nxt, outcome = coord.poll()
    assert outcome is None and nxt.stage == TRAIN and nxt.round_idx == 1 and not coord.held
    assert nxt.deadline_s == 10_010.0  # deadline from the resume, not from the end of round 0
    for rid in ROBOTS:
        coord.offer_update(_update(rid, 1.0, 1))
    nxt, outcome = coord.poll()
    assert outcome.completed and nxt.stage == DONE and coord.finished


def test_pause_holds_the_re_attempt_of_an_abandoned_round_and_round_0(tmp_path):
    coord, clock = _coordinator(tmp_path, max_attempts=2)
    coord.paused = coord.held = True  # the node starts paused: round 0 waits
    assert coord.poll() == (None, None) and coord.collector is None
    coord.paused = False
    plan, _ = coord.poll()
    assert plan.round_idx == 0 and plan.attempt == 1
    coord.paused = True
    coord.offer_update(_update("robot_0", 1.0, 0))
    clock[0] = 10.5  # below quorum at the deadline
    nxt, outcome = coord.poll()
    assert not outcome.completed and nxt is None and coord.held and not coord.failed_reason
    clock[0] = 100.0
    coord.paused = False
    nxt, _ = coord.poll()
    assert nxt.round_idx == 0 and nxt.attempt == 2 and nxt.deadline_s == 110.0


def test_pause_lets_the_round_s_evaluation_run_then_holds(tmp_path):
    settings = RoundSettings(
        algorithm="fedavg",
        rounds=3,
        quorum_fraction=0.6,
        round_timeout_s=10.0,
        evaluate_every=1,
        eval_timeout_s=5.0,
    )
    clock = [0.0]
    coord = RoundCoordinator(
        make_strategy("fedavg"),
        ModelStore(tmp_path / "s"),
        settings,
        _initial(),
        clock=lambda: clock[0],
    )
    for rid in ROBOTS:
        coord.roster.register(rid)
    coord.start_round()
    coord.paused = True
    for rid in ROBOTS:
        coord.offer_update(_update(rid, 1.0, 0))
    plan, outcome = coord.poll()
    assert plan.stage == EVALUATE and outcome is None  # part of the round in progress
    for rid in ROBOTS:
        coord.offer_metrics(rid, 1.0)
    plan, outcome = coord.poll()
    assert plan is None and outcome.completed and coord.held


def test_end_request_ends_after_the_round_in_progress(tmp_path):
    coord, clock = _coordinator(tmp_path, rounds=5)
    coord.start_round()
    coord.end_requested = True
    assert coord.poll() == (None, None)  # the round in progress keeps collecting
    for rid in ROBOTS:
        coord.offer_update(_update(rid, 1.0, 0))
    nxt, outcome = coord.poll()
    assert outcome.completed and nxt.stage == DONE and coord.finished and coord.round_idx == 1
    assert ModelStore(tmp_path / "store").load_latest().round_idx == 0
    assert coord.poll() == (None, None)


def test_end_request_while_paused_between_rounds_announces_done(tmp_path):
    coord, clock = _coordinator(tmp_path, rounds=5)
    coord.start_round()
    coord.paused = True
    for rid in ROBOTS:
        coord.offer_update(_update(rid, 1.0, 0))
    assert coord.poll()[0] is None and coord.held
    coord.end_requested = True  # the pause does not delay the end
    nxt, outcome = coord.poll()
    assert nxt.stage == DONE and outcome is None and coord.finished and not coord.held


def test_end_request_before_round_0_announces_done_at_once(tmp_path):
    coord, clock = _coordinator(tmp_path, rounds=5)
    coord.paused = coord.end_requested = coord.held = (
        True  # what the node does on end_fleet before round 0
    )
    nxt, outcome = coord.poll()
    assert nxt.stage == DONE and nxt.round_idx == 0 and outcome is None and coord.finished
