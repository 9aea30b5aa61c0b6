"""What guards against a replayed update without keys (docs/security.md, "Without
authentication"): no nonce memory (the replay guard exists only with ``allowed_keys_file``), but
the round rules: one answer per robot and round, and only the open round.

ROS-free: the server's key loading (fed_ros/ros/nodes/server/keys.py) and the round coordinator
with a fake clock.
"""

from __future__ import annotations

import numpy as np

from fed_ros.core.checks.decisions import DUPLICATE, STALE_ROUND
from fed_ros.core.rounds.coordinator import RoundCoordinator
from fed_ros.core.rounds.settings import RoundSettings
from fed_ros.core.rounds.store import ModelStore
from fed_ros.core.strategies.base import make_strategy
from fed_ros.core.strategies.types import ClientUpdate
from fed_ros.ros.configuration.fleet_params import ServerParams
from fed_ros.ros.rigs.scripted import make_keys
from fed_ros.ros.nodes.server.keys import load_server_keys


def test_the_replay_guard_exists_only_with_an_allow_list(tmp_path):
    open_fleet = load_server_keys(ServerParams.from_mapping({"state_dir": str(tmp_path / "a")}))
    assert open_fleet.replay_guard is None and open_fleet.allow_list is None
    make_keys(tmp_path, robots=("robot_0",))
    signed = load_server_keys(
        ServerParams.from_mapping(
            {
                "state_dir": str(tmp_path / "b"),
                "allowed_keys_file": str(tmp_path / "keys" / "allow_list.yaml"),
            }
        )
    )
    assert signed.replay_guard is not None and len(signed.replay_guard) == 0


class _Clock:
    t = 1000.0

    def __call__(self) -> float:
        return self.t


def _update(rid: str, round_idx: int) -> ClientUpdate:
    u = ClientUpdate(
        robot_id=rid,
        params={"w": np.ones(3, np.float32)},
        num_samples=10,
        base_round=round_idx,
    )
    u.round_idx = round_idx
    return u


def test_without_keys_a_replayed_update_is_refused_by_the_round_rules(tmp_path):
    clock = _Clock()
    coord = RoundCoordinator(
        make_strategy("fedavg"),
        ModelStore(tmp_path / "store"),
        RoundSettings(algorithm="fedavg", rounds=3, quorum_fraction=1.0, round_timeout_s=10.0),
        {"w": np.zeros(3, np.float32)},
        clock=clock,
    )
    for rid in ("robot_0", "robot_1"):
        assert coord.register(rid)
    coord.start_round()
    captured = _update("robot_0", 0)
    assert coord.offer_update(captured)
    again = coord.offer_update(_update("robot_0", 0))  # the same update, replayed in its round
    assert not again and again.code == DUPLICATE, again
    assert coord.offer_update(_update("robot_1", 0))
    clock.t += 1.0
    nxt, outcome = coord.poll()
    assert outcome is not None and outcome.completed
    later = coord.offer_update(_update("robot_0", 0))  # replayed once round 1 is open
    assert not later and later.code == STALE_ROUND, later
