"""RobotClient: the robot's side of a round obeys only the round config (no ROS)."""

from __future__ import annotations

import numpy as np
import pytest

from fed_ros.core.rounds.config import RoundConfig
from fed_ros.learning.client import RobotClient, trainer_seed
from fed_ros.learning.configuration_policy import PolicyConfig
from fed_ros.learning.dataset import synthetic_episodes
from fed_ros.learning.trainer import initial_state_dict

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


@pytest.fixture(scope="module")
def client(torch_one_thread):
    return RobotClient(
        "robot_3",
        CFG,
        robot_seed=3,
        device="cpu",
        local={"lr": 1e-4, "max_steps": 50, "val_fraction": 0.0},
    )


def test_trainer_config_takes_what_the_round_config_decides(client):
    tc = client.trainer_config(
        RoundConfig(prox_mu=0.2, use_sub=True, lambda_sub=0.1, local_epochs=3), 7
    )
    assert (tc.prox_mu, tc.use_sub, tc.use_act, tc.lambda_sub, tc.epochs) == (
        0.2,
        True,
        False,
        0.1,
        3,
    )
    assert (tc.lr, tc.max_steps, tc.val_fraction) == (
        1e-4,
        50,
        0.0,
    )  # unset in the config: the robot's own
    assert tc.seed == trainer_seed(3, 7) == 3007
    tc = client.trainer_config(RoundConfig(local_steps=12, lr=3e-3), 0)
    assert (tc.lr, tc.max_steps) == (3e-3, 12) and tc.epochs >= 12


def test_a_robot_cannot_override_what_the_strategy_decides():
    with pytest.raises(ValueError, match=r"\['prox_mu', 'use_sub'\] are decided by the strategy"):
        RobotClient("robot_0", CFG, local={"use_sub": False, "prox_mu": 0.0})
    with pytest.raises(ValueError, match="batch_size"):
        RobotClient("robot_0", CFG, local={"batch_size": 0})


def test_fit_fills_normalisation_in_the_first_round_only_and_obeys_mu(client):
    demos = synthetic_episodes(2, 20, seed=0, shift=1.0)
    theta0 = initial_state_dict(CFG, seed=0)
    res = client.fit(theta0, RoundConfig(local_steps=4, lr=1e-3), demos, 0)
    norm = [k for k in theta0 if k.startswith("normalizer.")]
    assert res.num_samples > 0 and res.metrics["steps"] == 4
    assert any(
        not np.array_equal(res.params[k], theta0[k]) for k in norm
    )  # round 0: local statistics
    again = client.fit(res.params, RoundConfig(local_steps=2), demos, 1)
    assert all(
        np.array_equal(again.params[k], res.params[k]) for k in norm
    )  # later rounds keep them
    prox = client.fit(theta0, RoundConfig(local_steps=4, lr=1e-3, prox_mu=5.0), demos, 0)
    assert "loss_prox" in prox.metrics and "loss_prox" not in res.metrics
    assert any(not np.array_equal(prox.params[k], res.params[k]) for k in res.params)


def test_pick_cluster_returns_the_lowest_loss_cluster_id(client):
    demos = synthetic_episodes(2, 20, seed=0)
    good = client.fit(
        initial_state_dict(CFG, seed=0), RoundConfig(local_steps=30, lr=3e-3), demos, 0
    ).params
    assert client.pick_cluster({4: initial_state_dict(CFG, seed=1), 9: good}, demos) == 9


def test_score_needs_a_describe_first():
    fresh = RobotClient("robot_1", CFG, device="cpu")
    with pytest.raises(RuntimeError, match="DESCRIBE missed"):
        fresh.score({}, synthetic_episodes(1, 10))
    desc = fresh.describe("gaussian", synthetic_episodes(2, 10))
    assert desc.kind == "gaussian" and desc.robot_id == "robot_1" and desc.num_samples == 20


@pytest.mark.parametrize("encoding", ["float32", "float16", "int8", "int8_block"])
def test_the_placeholder_is_recognised_after_any_wire_encoding(encoding):
    """A fleet may send its cluster models float16 or int8: the initial model's placeholder
    normalisation must still be replaced by the robot's own (it was missed with float16, and
    the robots learned nothing); a model that already carries statistics is left alone."""
    from fed_ros.core.encodings import roundtrip

    cfg = PolicyConfig(kind="lowdim")
    robot = RobotClient("robot_0", cfg, robot_seed=0, device="cpu")
    episodes = synthetic_episodes(2, length=20, seed=0)
    received = roundtrip(initial_state_dict(cfg, seed=0), encoding)
    filled = robot.with_local_normalization(received, episodes)
    assert not np.allclose(filled["normalizer.eef_pos_std"], received["normalizer.eef_pos_std"])
    again = roundtrip(filled, encoding)
    assert robot.with_local_normalization(again, episodes) is again
