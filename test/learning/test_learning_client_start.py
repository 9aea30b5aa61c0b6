"""The robot-side round steps written once in `fed_ros.learning.client` (no ROS): where TRAIN
starts (`choose_start`), which descriptor a stage asks for, evaluation and the trainer seed."""

from __future__ import annotations

import numpy as np
import pytest

from fed_ros.core.strategies.aggregate import weighted_model
from fed_ros.core.rounds.config import RoundConfig
from fed_ros.core.rounds.collect import DESCRIBE, SCORE, TRAIN
from fed_ros.learning.client import (
    RobotClient,
    choose_start,
    evaluate_policy,
    primary_cluster,
    trainer_seed,
)
from fed_ros.learning.configuration_policy import PolicyConfig
from fed_ros.learning.dataset import synthetic_episodes

CFG = PolicyConfig(
    kind="lowdim",
    embed_dim=32,
    window=2,
    transformer_layers=1,
    transformer_heads=2,
    transformer_ff=64,
    dropout=0.0,
    text_dim=64,
    num_modes=5,
)
MODELS = {
    c: {"w": np.full(3, float(c), np.float32), "b": np.array([10.0 * c], np.float32)}
    for c in (0, 1, 2)
}
PICK = RoundConfig(pick_cluster=True)


class Calls:
    """model_of / pick stand-ins that record what they were asked."""

    def __init__(self, choice: int = 0) -> None:
        self.asked: list[list[tuple[int, float]]] = []
        self.candidates: dict | None = None
        self.choice = choice

    def model_of(self, membership):
        self.asked.append(list(membership))
        return weighted_model(MODELS, membership)

    def pick(self, candidates):
        self.candidates = dict(candidates)
        return self.choice


@pytest.mark.parametrize("config", [RoundConfig(), PICK])
def test_an_empty_membership_is_an_error_and_asks_for_no_model(config):
    calls = Calls()
    with pytest.raises(ValueError, match=r"membership \[\] has no cluster with weight > 0"):
        choose_start([], calls.model_of, config, calls.pick)
    assert calls.asked == [] and calls.candidates is None
    with pytest.raises(ValueError, match="no cluster with weight > 0"):
        primary_cluster([])


def test_a_single_cluster_starts_from_its_model():
    calls = Calls()
    start = choose_start(
        [(2, 1.0)], calls.model_of, PICK, calls.pick
    )  # one listed cluster: nothing to pick
    assert (start.cluster_id, start.picked) == (2, False) and calls.candidates is None
    assert calls.asked == [[(2, 1.0)]]
    np.testing.assert_array_equal(start.model["w"], MODELS[2]["w"])
    assert (
        start.model["w"] is not MODELS[2]["w"]
    )  # a fresh copy: training never writes the cluster model


def test_a_soft_membership_starts_from_the_weighted_mean_for_its_heaviest_cluster():
    calls = Calls()
    start = choose_start([(0, 0.25), (2, 0.75)], calls.model_of, RoundConfig(), calls.pick)
    assert (start.cluster_id, start.picked) == (2, False) and calls.candidates is None
    np.testing.assert_allclose(start.model["w"], np.full(3, 1.5, np.float32))
    np.testing.assert_allclose(start.model["b"], [15.0])
    # Ties go to the cluster listed first; zero weights do not count in the mean.
    assert (
        choose_start([(1, 0.5), (0, 0.5)], calls.model_of, RoundConfig(), calls.pick).cluster_id
        == 1
    )
    assert primary_cluster([[4, 0.0], [3, 1.0]]) == 3
    with pytest.raises(ValueError, match="no cluster with weight > 0"):
        choose_start([(0, 0.0), (1, 0.0)], calls.model_of, RoundConfig(), calls.pick)


def test_pick_cluster_evaluates_every_listed_model_and_starts_from_the_chosen_one_alone():
    calls = Calls(choice=1)
    membership = [
        (0, 1.0),
        (1, 0.0),
        (2, 0.0),
    ]  # IFCA: all clusters listed, weight on the current choice
    start = choose_start(membership, calls.model_of, PICK, calls.pick)
    assert (start.cluster_id, start.picked) == (1, True)
    assert sorted(calls.candidates) == [0, 1, 2] and calls.asked == [
        [(0, 1.0)],
        [(1, 1.0)],
        [(2, 1.0)],
    ]
    assert start.model is calls.candidates[1]
    np.testing.assert_array_equal(start.model["w"], MODELS[1]["w"])
    # Without pick_cluster the same membership starts from its weighted mean (cluster 0 here).
    plain = choose_start(membership, Calls().model_of, RoundConfig(), calls.pick)
    assert (plain.cluster_id, plain.picked) == (0, False)


def test_the_client_picks_on_its_own_episodes(monkeypatch):
    client = RobotClient("robot_0", CFG, device="cpu")
    demos = synthetic_episodes(1, 10)
    seen = {}

    def pick_cluster(candidates, episodes):
        seen.update(candidates=sorted(candidates), episodes=episodes)
        return 0

    monkeypatch.setattr(client, "pick_cluster", pick_cluster)
    start = client.choose_start([(0, 0.5), (1, 0.5)], Calls().model_of, PICK, demos)
    assert (start.cluster_id, start.picked) == (0, True)
    assert seen == {"candidates": [0, 1], "episodes": demos}


def test_stage_descriptor_answers_describe_and_score_only():
    client = RobotClient("robot_1", CFG, device="cpu")
    demos = synthetic_episodes(2, 10)
    with pytest.raises(RuntimeError, match="DESCRIBE missed"):
        client.stage_descriptor(SCORE, RoundConfig(), demos, {})
    desc = client.stage_descriptor(DESCRIBE, RoundConfig(descriptor_kind="gaussian"), demos)
    assert (desc.kind, desc.robot_id, desc.num_samples) == ("gaussian", "robot_1", 20)
    with pytest.raises(ValueError, match="asks for no descriptor"):
        client.stage_descriptor(TRAIN, RoundConfig(), demos)


def test_evaluate_runs_the_model_as_a_policy_runner():
    from fed_ros.learning.trainer import initial_state_dict

    sd = initial_state_dict(CFG, seed=0)
    runners = []
    assert evaluate_policy(
        sd, CFG, lambda r: runners.append(r) or {"lift": 0.5}, "cpu", sample=True, seed=4
    ) == {"lift": 0.5}
    assert runners[0].sample and runners[0].device.type == "cpu"
    client = RobotClient("robot_2", CFG, device="cpu")
    assert client.evaluate(sd, lambda r: {"lift": float(r.sample)}) == {"lift": 0.0}


def test_a_seed_schedule_replaces_the_fleet_trainer_seed():
    assert RobotClient("r", CFG, robot_seed=3, device="cpu").trainer_config(
        RoundConfig(), 5
    ).seed == trainer_seed(3, 5)
    scheduled = RobotClient("r", CFG, robot_seed=3, device="cpu", seed_schedule=lambda r: 100 + r)
    assert scheduled.trainer_config(RoundConfig(), 5).seed == 105
