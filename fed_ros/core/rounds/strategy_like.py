"""The strategy as the round coordinator drives it: the part of
``fed_ros.core.strategies.base.Strategy`` that the rounds use.

A Protocol rather than an import of ``Strategy`` so the round protocol can run any object with
these methods (the tests' recording strategies, a strategy from outside the package) and the
rounds package does not depend on the strategies' registry.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from fed_ros.core.rounds.config import RobotInstruction


class StrategyLike(Protocol):
    """The part of fed_ros.core.strategies.base.Strategy the coordinator uses."""

    name: str

    def initialize(self, initial: Mapping[str, np.ndarray], robot_ids: Sequence[str]) -> None: ...
    def configure_round(
        self, round_idx: int, robot_ids: Sequence[str]
    ) -> dict[str, RobotInstruction]: ...
    def needs_descriptors(self, round_idx: int) -> set[str]: ...
    def cluster_models(self) -> dict[int, Mapping[str, np.ndarray]]: ...
    def observe(self, round_idx: int, update: Any) -> None: ...
    def aggregate_round(self, round_idx: int, updates: list, descriptors: dict) -> Any: ...
    def aggregate_buffer(self, round_idx: int, updates: list, descriptors: dict) -> Any: ...
    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]: ...
    def load_state(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None: ...
