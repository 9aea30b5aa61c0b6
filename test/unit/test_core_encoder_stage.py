"""The server's fleet encoder rounds without ROS (fed_ros.core.rounds.encoder_stage): the
schedule, FedAvg by frames over every robot, hostile updates refused without touching the
committed encoder, the commit surviving a restart, and the cost report."""

from __future__ import annotations

import numpy as np
import pytest

from fed_ros.core.checks.decisions import (
    DUPLICATE,
    FUTURE,
    NOT_PARTICIPANT,
    NON_FINITE,
    NUM_SAMPLES,
    OUT_OF_RANGE,
    SCHEMA,
    STALE_ROUND,
    Limits,
)
from fed_ros.core.rounds.encoder_stage import (
    ENCODER_DIR,
    EncoderRounds,
    EncoderStage,
    encoder_due,
)
from fed_ros.core.rounds.store import ModelStore

LIMITS = Limits(max_num_samples=10_000, max_abs_value=100.0)


def _state(value: float) -> dict[str, np.ndarray]:
    return {
        "backbone.conv1.weight": np.full((4, 3, 2, 2), value, np.float32),
        "backbone.conv1.bias": np.full((4,), value, np.float32),
        "head.weight": np.full((2, 4), value, np.float32),
    }


def _metrics(cpu_s: float) -> dict[str, float]:
    return {"cpu_s": cpu_s, "loss_first": 2.0, "loss_last": 1.0}


def test_encoder_rounds_run_before_round_zero_and_every_refresh():
    assert [r for r in range(7) if encoder_due(r, 0)] == [0]
    assert [r for r in range(7) if encoder_due(r, 3)] == [0, 3, 6]
    with pytest.raises(ValueError, match="refresh_every must be >= 0, got 0, -1"):
        encoder_due(0, -1)


def test_fedavg_by_frames_over_every_robot_is_committed_and_resumed(tmp_path):
    rounds = EncoderRounds(tmp_path, _state(0.0), LIMITS)
    assert rounds.version == 0
    for rid, value, frames in (("robot_0", 1.0, 100), ("robot_1", 5.0, 300)):
        assert rounds.offer(rid, 0, _state(value), frames, _metrics(1.0), 480)
    report = rounds.commit({"before_round": 0})

    assert report.version == rounds.version == 1
    expected = _state(0.25 * 1.0 + 0.75 * 5.0)  # n_k / sum n_j
    for k, v in expected.items():
        np.testing.assert_allclose(rounds.state[k], v, rtol=1e-6)
    again = EncoderRounds(tmp_path, _state(0.0), LIMITS)  # a restarted server
    assert again.version == 1
    assert again.meta == {"before_round": 0, "averaged": ["robot_0", "robot_1"]}
    for k, v in expected.items():
        np.testing.assert_array_equal(again.state[k], rounds.state[k])


def _bad(kind: str) -> dict[str, np.ndarray]:
    state = _state(2.0)
    if kind == "shape":
        state["head.weight"] = np.zeros((4, 2), np.float32)
    elif kind == "nan":
        state["backbone.conv1.bias"][1] = np.nan
    elif kind == "huge":
        state["head.weight"][0, 0] = 1e9
    elif kind == "missing":
        del state["head.weight"]
    return state


@pytest.mark.parametrize(
    "robot, version, params, frames, code",
    [
        ("robot_1", 0, _bad("shape"), 10, SCHEMA),
        ("robot_1", 0, _bad("nan"), 10, NON_FINITE),
        ("robot_1", 0, _bad("huge"), 10, OUT_OF_RANGE),
        ("robot_1", 0, _bad("missing"), 10, SCHEMA),
        ("robot_1", 0, _state(2.0), 0, NUM_SAMPLES),
        ("robot_1", 0, _state(2.0), 10**9, NUM_SAMPLES),
        ("robot_1", 1, _state(2.0), 10, FUTURE),
        ("robot_0", 0, _state(9.0), 10, DUPLICATE),
    ],
    ids=["shape", "nan", "huge", "missing", "no-frames", "too-many-frames", "future", "dup"],
)
def test_a_hostile_encoder_update_is_refused_and_never_reaches_the_encoder(
    tmp_path, robot, version, params, frames, code
):
    rounds = EncoderRounds(tmp_path, _state(0.0), LIMITS)
    assert rounds.offer("robot_0", 0, _state(3.0), 50, _metrics(1.0), 480)

    decision = rounds.offer(robot, version, params, frames, _metrics(1.0), 480)
    assert not decision and decision.code == code, decision
    report = rounds.commit()

    assert report.refused == {robot: f"{code}: {decision.reason}"}
    assert list(report.costs) == ["robot_0"]
    committed = ModelStore(tmp_path / ENCODER_DIR).load_latest()
    for k, v in _state(3.0).items():  # only the honest robot's encoder
        np.testing.assert_array_equal(rounds.state[k], v)
        np.testing.assert_array_equal(committed.cluster_models[0][k], v)


def test_an_update_trained_from_an_older_encoder_is_stale(tmp_path):
    rounds = EncoderRounds(tmp_path, _state(0.0), LIMITS)
    rounds.offer("robot_0", 0, _state(1.0), 10, _metrics(1.0), 480)
    rounds.commit()
    decision = rounds.offer("robot_1", 0, _state(1.0), 10, _metrics(1.0), 480)
    assert decision.code == STALE_ROUND and "version 0, now 1" in decision.reason


def test_a_round_without_an_accepted_update_commits_nothing(tmp_path):
    rounds = EncoderRounds(tmp_path, _state(0.0), LIMITS)
    rounds.offer("robot_0", 0, _bad("nan"), 10, _metrics(1.0), 480)
    with pytest.raises(ValueError, match="encoder version 0: no accepted update"):
        rounds.commit()
    assert ModelStore(tmp_path / ENCODER_DIR).committed_rounds() == [0]


def test_the_report_gives_frames_cpu_and_bytes_per_robot(tmp_path):
    rounds = EncoderRounds(tmp_path, _state(0.0), LIMITS)
    down = rounds.payload_bytes()
    assert down == 4 * (4 * 3 * 2 * 2 + 4 + 2 * 4)
    rounds.offer("robot_0", 0, _state(1.0), 100, _metrics(2.0), 300)
    rounds.offer("robot_1", 0, _state(1.0), 300, _metrics(4.0), 500)
    scalars = rounds.commit().scalars()
    assert scalars == {
        "robots": 2.0,
        "frames": 400.0,
        "cpu_s_per_robot": 3.0,
        "bytes_per_robot": down + 400.0,
        "loss_first": 2.0,
        "loss_last": 1.0,
    }


def test_a_committed_encoder_of_another_shape_is_refused_at_start(tmp_path):
    EncoderRounds(tmp_path, _state(0.0), LIMITS)
    other = {"backbone.conv1.weight": np.zeros((8, 3, 2, 2), np.float32)}
    with pytest.raises(ValueError, match="does not fit the configured encoder"):
        EncoderRounds(tmp_path, other, LIMITS)


ROBOTS = ("robot_0", "robot_1")


def _stage(tmp_path, per_stage: int = 2, refresh_every: int = 2) -> EncoderStage:
    return EncoderStage(
        EncoderRounds(tmp_path, _state(0.0), LIMITS), per_stage, refresh_every, 10.0
    )


def test_a_stage_runs_its_rounds_over_every_robot_then_lets_the_policy_round_go(tmp_path):
    stage = _stage(tmp_path)
    assert stage.holds(0) and not stage.holds(1) and stage.holds(2)
    ann = stage.start(0, ROBOTS, now=0.0)
    assert (ann.version, ann.participants, ann.deadline_s) == (0, ROBOTS, 10.0)

    stage.offer("robot_0", 0, _state(1.0), 10, _metrics(1.0), 480)
    assert stage.poll(1.0) == (None, None)  # robot_1 still training
    stage.offer("robot_1", 0, _state(1.0), 10, _metrics(1.0), 480)
    ann, report = stage.poll(2.0)
    assert report.version == 1 and (ann.version, ann.participants) == (1, ROBOTS)
    assert stage.holds(0)  # one of two encoder rounds done

    stage.offer("robot_0", 1, _state(2.0), 10, _metrics(1.0), 480)
    ann, report = stage.poll(12.5)  # deadline: robot_1 is dropped, robot_0's update is used
    assert report.version == 2 and list(report.costs) == ["robot_0"]
    assert (ann.version, ann.participants) == (2, ())  # published to all, nobody trains
    assert not stage.holds(0) and not stage.holds(1) and stage.holds(2)


def test_an_encoder_round_nobody_answers_is_announced_again(tmp_path):
    stage = _stage(tmp_path)
    stage.start(0, ROBOTS, now=0.0)
    ann, report = stage.poll(10.0)
    assert report is None and (ann.version, ann.participants, ann.deadline_s) == (0, ROBOTS, 20.0)


def test_an_update_from_a_robot_not_asked_is_refused(tmp_path):
    stage = _stage(tmp_path)
    assert stage.offer("robot_0", 0, _state(1.0), 10, _metrics(1.0), 480).code == NOT_PARTICIPANT
    stage.start(0, ("robot_1",), now=0.0)
    decision = stage.offer("robot_0", 0, _state(1.0), 10, _metrics(1.0), 480)
    assert decision.code == NOT_PARTICIPANT and "'robot_0' is not asked" in decision.reason


def test_a_restarted_server_goes_on_from_the_committed_encoder_round(tmp_path):
    stage = _stage(tmp_path)
    stage.start(0, ROBOTS, now=0.0)
    for rid in ROBOTS:
        stage.offer(rid, 0, _state(1.0), 10, _metrics(1.0), 480)
    stage.poll(1.0)  # encoder round 0 of 2 committed, then the server stops

    again = _stage(tmp_path)
    assert again.holds(0)
    ann = again.start(0, ROBOTS, now=0.0)
    assert ann.version == 1
    for rid in ROBOTS:
        again.offer(rid, 1, _state(1.0), 10, _metrics(1.0), 480)
    ann, _ = again.poll(1.0)
    assert ann.participants == () and not again.holds(0)


def test_the_coordinator_holds_each_due_policy_round_until_its_encoder_stage_committed(tmp_path):
    from support.rounds import ROBOTS as FLEET, _coordinator, _update

    coord, clock = _coordinator(tmp_path, rounds=3)
    stage = _stage(tmp_path / "server", per_stage=1, refresh_every=2)
    coord.hold_before = stage.holds
    coord.held = True  # the server node lets round 0 go like this once robots registered
    assert coord.poll() == (None, None) and coord.held  # encoder first
    stage.start(coord.round_idx, FLEET, now=clock[0])
    for rid in FLEET:
        stage.offer(rid, 0, _state(1.0), 10, _metrics(1.0), 480)
    assert stage.poll(1.0)[0].participants == ()
    plan, _ = coord.poll()
    assert plan.stage == "train" and plan.round_idx == 0 and not coord.held

    for rid in FLEET:
        coord.offer_update(_update(rid, 1.0, 0))
    plan, outcome = coord.poll()  # round 1 needs no encoder round (refresh every 2)
    assert outcome.completed and plan.round_idx == 1
    for rid in FLEET:
        coord.offer_update(_update(rid, 1.0, 1))
    plan, outcome = coord.poll()
    assert outcome.completed and plan is None and coord.held  # round 2 waits for the refresh
