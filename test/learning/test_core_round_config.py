"""RoundConfig: validated, versioned instructions of one round (pure, no ROS, no torch)."""

from __future__ import annotations

import json

import pytest

from fed_ros.core.rounds.config import ROUND_CONFIG_VERSION, RobotInstruction, RoundConfig


def test_round_config_round_trips_through_json_with_its_version():
    cfg = RoundConfig(
        prox_mu=0.01,
        use_sub=True,
        lambda_act=0.02,
        local_steps=20,
        lr=3e-3,
        descriptor_kind="rnd",
        pick_cluster=True,
        eval_episodes=4,
    )
    data = json.loads(json.dumps(cfg.to_dict()))
    assert data["version"] == ROUND_CONFIG_VERSION
    assert RoundConfig.from_dict(data) == cfg


@pytest.mark.parametrize(
    "change,match",
    [
        ({"version": 99}, "version 99 is not supported"),
        ({"prox_mu": -0.1}, "prox_mu must be >= 0, got -0.1"),
        ({"lambda_sub": float("inf")}, "lambda_sub must be a finite number"),
        ({"lr": 0.0}, "lr must be > 0, got 0.0"),
        ({"local_epochs": 0}, "local_epochs must be an int >= 1, got 0"),
        ({"local_steps": 2.5}, "local_steps must be an int >= 1, got 2.5"),
        ({"use_sub": 1}, "use_sub must be a bool, got 1"),
        ({"descriptor_kind": "update"}, "descriptor_kind 'update'"),
        ({"eval_episodes": 0}, "eval_episodes must be an int >= 1"),
    ],
)
def test_bad_round_config_values_raise_naming_them(change, match):
    with pytest.raises(ValueError, match=match):
        RoundConfig(**change)


def test_from_dict_rejects_unknown_versions_and_keys():
    data = RoundConfig().to_dict()
    with pytest.raises(ValueError, match="version None"):
        RoundConfig.from_dict({k: v for k, v in data.items() if k != "version"})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['mu'\]"):
        RoundConfig.from_dict({**data, "mu": 0.1})


def test_instruction_needs_a_weighted_cluster():
    assert RobotInstruction([(0, 1.0)]).config == RoundConfig()
    with pytest.raises(ValueError, match="no cluster with weight > 0"):
        RobotInstruction([(0, 0.0)])
