"""Asynchronous buffered rounds (FedBuff, fed_ros.core.rounds.buffered) in the real round
coordinator with the real FedAvg strategy and model store, driven by a fake clock (no ROS).

Checked: a round closes as soon as B updates are in, without the slow robot; the slow robot's
update, trained from an older model, is still taken, rebased onto the current model and
weighted by 1/sqrt(1 + staleness) (the FedBuff step: exact numbers); staleness counts the
versions of the update's own cluster; too-stale updates are refused; per-cluster buffers wait
for their own robots; the synchronous mode is unchanged.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from fed_ros.core.rounds.buffered import (
    BufferSettings,
    ModelHistory,
    SentRound,
    buffer_targets,
    next_versions,
    staleness_weight,
)
from fed_ros.core.rounds.collect import TRAIN, ready_clusters
from fed_ros.core.rounds.coordinator import RoundCoordinator
from fed_ros.core.rounds.settings import RoundSettings
from fed_ros.core.rounds.store import ModelStore
from fed_ros.core.strategies.base import make_strategy
from fed_ros.core.strategies.types import ClientUpdate

ROBOTS = ("robot_0", "robot_1", "robot_2")


def _model(value: float) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 3), value, np.float32), "b": np.full(3, value, np.float32)}


def _update(rid: str, value: float, round_idx: int, cluster: int = 0) -> ClientUpdate:
    upd = ClientUpdate(
        robot_id=rid, params=_model(value), num_samples=10, base_round=round_idx, cluster_id=cluster
    )
    upd.round_idx = round_idx
    return upd


def _coordinator(tmp_path, buffer: BufferSettings, rounds: int = 6, timeout: float = 100.0):
    clock = [0.0]
    settings = RoundSettings(
        algorithm="fedavg", rounds=rounds, round_timeout_s=timeout, buffer=buffer
    )
    coord = RoundCoordinator(
        make_strategy("fedavg"),
        ModelStore(tmp_path / "store"),
        settings,
        _model(0.0),
        clock=lambda: clock[0],
    )
    for rid in ROBOTS:
        assert coord.roster.register(rid, tasks=["lift"], num_samples=10).accepted
    return coord, clock


def test_staleness_weight_is_fedbuffs_inverse_square_root_and_settings_are_checked():
    s = BufferSettings(buffer_size=2)
    assert [staleness_weight(t, s) for t in (0, 1, 3)] == pytest.approx(
        [1.0, 1 / math.sqrt(2), 0.5]
    )
    assert staleness_weight(5, BufferSettings(buffer_size=2, staleness="constant")) == 1.0
    assert not BufferSettings().enabled and s.enabled
    with pytest.raises(ValueError, match="buffer_size must be an integer >= 0, got -1"):
        BufferSettings(buffer_size=-1)
    with pytest.raises(ValueError, match="staleness must be one of"):
        BufferSettings(staleness="hinge")
    with pytest.raises(ValueError, match="staleness_exponent"):
        BufferSettings(staleness_exponent=math.nan)
    with pytest.raises(ValueError, match="staleness must be >= 0"):
        staleness_weight(-1, s)


def test_buffer_targets_cap_b_at_each_clusters_size_and_count_by_update_cluster():
    memberships = {"a": [(0, 1.0)], "b": [(0, 0.3), (1, 0.7)], "c": [(1, 1.0)], "d": [(1, 1.0)]}
    assert buffer_targets(memberships, 2) == {0: 1, 1: 2}
    assert ready_clusters({"a": _update("a", 1, 0, 0)}, {0: 1, 1: 2}) == [0]
    assert ready_clusters({"c": _update("c", 1, 0, 1)}, {0: 1, 1: 2}) == []


def test_a_round_closes_at_b_updates_and_the_slow_robots_stale_update_is_weighted(tmp_path):
    coord, clock = _coordinator(tmp_path, BufferSettings(buffer_size=2, sync_rounds=0))
    plan = coord.start_round()
    assert plan.stage == TRAIN and plan.quorum == 1 and plan.buffer_targets == {0: 2}
    # Two fast robots answer round 0; robot_2 (slow) is still training from round 0's model.
    assert coord.offer_update(_update("robot_0", 1.0, 0)).accepted
    assert coord.poll()[0] is None  # one of two: the buffer waits
    assert coord.offer_update(_update("robot_1", 3.0, 0)).accepted
    plan, outcome = coord.poll()
    assert outcome.completed and plan.round_idx == 1  # without waiting for robot_2
    assert np.allclose(coord.cluster_models[0]["w"], 2.0)
    # Round 1: robot_0 answers from model 1 (value 2 -> 4); robot_2's update of round 0 arrives.
    assert coord.offer_update(_update("robot_0", 4.0, 1)).accepted
    late = coord.offer_update(_update("robot_2", 6.0, 0))
    assert late.accepted, late.reason
    plan, outcome = coord.poll()
    assert outcome.completed and plan.round_idx == 2
    # FedBuff's step: current 2 + mean(fresh delta 2, (6 - 0) / sqrt(2)).
    expected = 2.0 + 0.5 * (2.0 + 6.0 / math.sqrt(2))
    assert np.allclose(coord.cluster_models[0]["w"], expected)
    assert outcome.diagnostics["buffered/stale_updates"] == 1.0
    assert outcome.diagnostics["buffered/min_weight"] == pytest.approx(1 / math.sqrt(2))
    # The committed round is on disk like any other.
    assert ModelStore(tmp_path / "store").load_latest().round_idx == 1


def test_updates_older_than_max_staleness_are_refused_with_a_reason(tmp_path):
    coord, clock = _coordinator(
        tmp_path, BufferSettings(buffer_size=1, max_staleness=1, sync_rounds=0)
    )
    coord.start_round()
    for r in range(3):  # robot_0 alone moves the model three versions on
        assert coord.offer_update(_update("robot_0", float(r + 1), r)).accepted
        coord.poll()
    verdict = coord.offer_update(_update("robot_2", 9.0, 0))
    assert (
        not verdict.accepted and "stale: answer for round 0, current round is 3" in verdict.reason
    )
    verdict = coord.offer_update(_update("robot_2", 9.0, 1, cluster=0))  # base 1: too old too
    assert not verdict.accepted
    assert coord.offer_update(_update("robot_2", 9.0, 2)).accepted  # one version old


def test_a_robots_newer_update_replaces_its_waiting_one_and_a_duplicate_is_refused(tmp_path):
    coord, clock = _coordinator(tmp_path, BufferSettings(buffer_size=3, sync_rounds=0))
    coord.start_round()
    assert coord.offer_update(_update("robot_0", 1.0, 0)).accepted
    again = coord.offer_update(_update("robot_0", 1.0, 0))
    assert not again.accepted and "duplicate" in again.reason
    assert coord.poll() == (None, None)


def test_per_cluster_buffers_aggregate_the_full_cluster_and_keep_the_other_waiting(tmp_path):
    """Two clusters: cluster 1's one update waits while cluster 0 fills and closes the round;
    it is aggregated later, and cluster 0's aggregation did not age it (its own version)."""
    coord, clock = _coordinator(tmp_path, BufferSettings(buffer_size=2, sync_rounds=0))
    coord.start_round()
    # Split the fleet by hand: robots 0, 1 in cluster 0, robot 2 in cluster 1 (a copy of 0).
    coord.cluster_models[1] = {k: v.copy() for k, v in coord.cluster_models[0].items()}
    coord.memberships = {"robot_0": [(0, 1.0)], "robot_1": [(0, 1.0)], "robot_2": [(1, 1.0)]}
    coord.buffer.record(0, coord.cluster_models, coord.memberships, coord.configs)
    coord.buffer.versions = {0: 0, 1: 0}
    # Targets of 2 each (B = 2; robot_2's cluster is given a second member's target by hand).
    coord.collector.plan = replace(coord.collector.plan, buffer_targets={0: 2, 1: 2})
    assert coord.offer_update(_update("robot_2", 5.0, 0, cluster=1)).accepted
    assert coord.offer_update(_update("robot_0", 1.0, 0)).accepted
    assert coord.poll() == (None, None)
    assert coord.offer_update(_update("robot_1", 3.0, 0)).accepted
    plan, outcome = coord.poll()
    assert outcome.completed and set(outcome.clusters) >= {0}
    assert coord.buffer.waiting.keys() == {"robot_2"}
    assert outcome.diagnostics["buffered/waiting"] == 1.0
    assert coord.buffer.versions[0] == 1
    # robot_2's update is still in round 1's buffer, from round 0, for an unchanged cluster 1.
    assert "robot_2" in coord.collector.answers


def test_model_history_gives_the_start_each_robot_trained_from():
    models = {0: _model(1.0), 1: _model(3.0)}
    history = ModelHistory(keep=2)
    memberships = {"a": [(0, 1.0)], "b": [(0, 0.5), (1, 0.5)], "c": [(0, 0.5), (1, 0.5)]}
    history.record(4, SentRound(models, memberships, frozenset({"c"}), {0: 2, 1: 0}))
    assert np.allclose(history.start_model(4, "a", 0)["w"], 1.0)
    assert np.allclose(history.start_model(4, "b", 0)["w"], 2.0)  # the weighted mean it got
    assert np.allclose(history.start_model(4, "c", 1)["w"], 3.0)  # IFCA: the one it picked
    assert history.start_model(3, "a", 0) is None and history.start_model(4, "zz", 0) is None
    history.record(5, SentRound(models, memberships))
    history.record(6, SentRound(models, memberships))
    assert history.sent(4) is None and history.sent(6) is not None  # only `keep` rounds
    assert next_versions({0: 2, 1: 0}, models, {0: _model(1.0), 1: _model(4.0), 2: _model(0)}) == {
        0: 2,
        1: 1,
        2: 1,
    }


def test_synchronous_rounds_still_wait_for_everyone_and_refuse_stale_rounds(tmp_path):
    coord, clock = _coordinator(tmp_path, BufferSettings())
    plan = coord.start_round()
    assert plan.buffer_targets == {} and plan.max_staleness == 0
    assert coord.offer_update(_update("robot_0", 1.0, 0)).accepted
    assert coord.offer_update(_update("robot_1", 1.0, 0)).accepted
    assert coord.poll() == (None, None)  # robot_2 is waited for
    assert coord.offer_update(_update("robot_2", 1.0, 0)).accepted
    plan, outcome = coord.poll()
    assert plan.round_idx == 1
    late = coord.offer_update(_update("robot_2", 1.0, 0))
    assert not late.accepted and late.code == "stale_round"


def _feddrman_after_a_synchronous_round(**settings):
    """FedDRMan (C = 2) over four robots whose first round split them into two clusters (robots
    0, 1 moved one way from the initial model, robots 2, 3 the opposite way)."""
    from fed_ros.core.strategies.feddrman import FedDRManStrategy

    strategy = FedDRManStrategy(num_clusters=2, omega_prefixes=("w",), use_srb=False, **settings)
    robots = ["r0", "r1", "r2", "r3"]
    strategy.initialize(_model(0.0), robots)
    first = [_update(r, v, 0) for r, v in zip(robots, (1.0, 1.2, -1.0, -1.2))]
    first[0].params["w"][0, 0] += 0.3  # not exactly collinear
    strategy.aggregate_round(0, first, {})
    return strategy


def test_a_feddrman_buffer_averages_within_its_cluster_and_leaves_the_others_alone():
    """The failure this guards against (measured: FedDRMan 0.00 success in buffered rounds):
    CUA forced a buffer of two robots of one cluster into C = 2 groups, gave the second robot
    the other cluster's id and overwrote that cluster's model with it."""
    strategy = _feddrman_after_a_synchronous_round(buffer_regroup_every=100)
    before = {c: m["w"].copy() for c, m in strategy.cluster_models().items()}
    assign = {r: strategy._assign[r][0][0] for r in ("r0", "r1", "r2", "r3")}
    assert assign["r0"] == assign["r1"] != assign["r2"] == assign["r3"]
    c_pos, c_neg = assign["r0"], assign["r2"]
    buffer = [_update("r0", 2.0, 1), _update("r1", 3.0, 1)]
    strategy.aggregate_buffer(1, buffer, {})
    after = strategy.cluster_models()
    assert np.array_equal(after[c_neg]["w"], before[c_neg])  # the other cluster untouched
    assert np.allclose(after[c_pos]["w"], 2.5)  # the buffer's FedAvg
    assert {r: strategy._assign[r][0][0] for r in assign} == assign  # nobody regrouped


def test_feddrman_regroups_on_its_own_schedule_over_every_robots_latest_update():
    strategy = _feddrman_after_a_synchronous_round(buffer_regroup_every=2)
    c_pos = strategy._assign["r0"][0][0]
    # r1 changes family: its latest update now points the other way.
    strategy.aggregate_buffer(1, [_update("r1", -1.1, 1), _update("r0", 1.1, 1)], {})
    assert strategy._assign["r1"][0][0] == c_pos  # one buffer: no regrouping yet
    result = strategy.aggregate_buffer(2, [_update("r2", -1.0, 2), _update("r3", -1.3, 2)], {})
    assert "regrouped" in result.diagnostics
    assert strategy._assign["r1"][0][0] == strategy._assign["r2"][0][0] != c_pos
    with pytest.raises(ValueError, match="buffer_regroup_every must be an int >= 1"):
        _feddrman_after_a_synchronous_round(buffer_regroup_every=0)


@pytest.mark.parametrize("algorithm", ["fedepth", "ifca", "rnd"])
def test_strategies_that_cluster_a_whole_round_refuse_buffered_rounds(tmp_path, algorithm):
    with pytest.raises(ValueError, match=f"do not work with strategy '{algorithm}'"):
        RoundCoordinator(
            make_strategy(algorithm),
            ModelStore(tmp_path / "store"),
            RoundSettings(
                algorithm=algorithm, rounds=2, buffer=BufferSettings(buffer_size=2, sync_rounds=0)
            ),
            _model(0.0),
        )


def test_the_first_round_of_a_buffered_fleet_waits_for_every_robot(tmp_path):
    """sync_rounds (default 1): round 0 is synchronous, so a clustering strategy sees one update
    of every robot before any model moves; round 1 is buffered."""
    coord, clock = _coordinator(tmp_path, BufferSettings(buffer_size=2))
    plan = coord.start_round()
    assert plan.buffer_targets == {} and plan.quorum >= 2
    assert coord.offer_update(_update("robot_0", 1.0, 0)).accepted
    assert coord.offer_update(_update("robot_1", 3.0, 0)).accepted
    assert coord.poll() == (None, None)  # round 0 waits for robot_2
    assert coord.offer_update(_update("robot_2", 5.0, 0)).accepted
    plan, outcome = coord.poll()
    assert "buffered/updates" not in outcome.diagnostics and plan.buffer_targets == {0: 2}
    with pytest.raises(ValueError, match="sync_rounds must be an integer >= 0"):
        BufferSettings(sync_rounds=-1)
