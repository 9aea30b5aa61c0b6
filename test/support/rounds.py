"""A round coordinator over a small fleet and the updates its robots send (ROS-free)."""

from __future__ import annotations

import numpy as np
from fed_ros.core.rounds.store import ModelStore
from fed_ros.core.strategies.base import make_strategy
from fed_ros.core.strategies.types import ClientUpdate
from fed_ros.core.rounds.coordinator import RoundCoordinator
from fed_ros.core.rounds.settings import RoundSettings


ROBOTS = ("robot_0", "robot_1", "robot_2")


def _initial() -> dict[str, np.ndarray]:
    return {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}


def _update(
    rid: str, value: float, round_idx: int, base: int | None = None, n: int = 10
) -> ClientUpdate:
    upd = ClientUpdate(
        robot_id=rid,
        params={"w": np.full((2, 3), value, np.float32), "b": np.full(3, value, np.float32)},
        num_samples=n,
        base_round=round_idx if base is None else base,
        metrics={"train_loss": 1.0 + value},
    )
    upd.round_idx = round_idx
    return upd


def _coordinator(tmp_path, algorithm="fedavg", rounds=3, timeout=10.0, max_attempts=2, **strategy):
    clock = [0.0]
    settings = RoundSettings(
        algorithm=algorithm,
        rounds=rounds,
        quorum_fraction=0.6,
        round_timeout_s=timeout,
        max_attempts=max_attempts,
    )
    coord = RoundCoordinator(
        make_strategy(algorithm, **strategy),
        ModelStore(tmp_path / "store"),
        settings,
        _initial(),
        clock=lambda: clock[0],
    )
    for rid in ROBOTS:
        assert coord.roster.register(rid, tasks=["lift"], num_samples=10).accepted
    return coord, clock
