"""Local: no aggregation; every robot keeps its own model (cluster id = the robot's index)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fed_ros.core.rounds.config import Membership
from fed_ros.core.strategies.base import Strategy, _readonly
from fed_ros.core.strategies.types import ClientDescriptor, ClientUpdate, RoundResult


class LocalStrategy(Strategy):
    """Per-robot models: robot i trains on and keeps its own model (a lower baseline)."""

    name = "local"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)

    def _setup(self, robot_ids: list[str]) -> None:
        self._models = {}
        self._assign = {}
        for rid in robot_ids:
            self._assign[rid] = self._new_robot(rid)

    def _new_robot(self, robot_id: str) -> Membership:
        cid = (max(self._models) + 1) if self._models else 0
        self._models[cid] = self.initial_vector
        return [(cid, 1.0)]

    def aggregate_round(
        self,
        round_idx: int,
        updates: list[ClientUpdate],
        descriptors: Mapping[str, ClientDescriptor] | None = None,
    ) -> RoundResult:
        """Each robot's cluster model becomes its own update (copied: inputs may be reused
        buffers)."""
        prep = self._prepare(round_idx, updates)
        for k, rid in enumerate(prep.robot_ids):
            if rid not in self._assign:
                self._assign[rid] = self._new_robot(rid)
            row = prep.row(k)
            if not np.isfinite(row).all():
                raise ValueError(f"update of {rid!r} holds NaN/Inf values")
            self._models[self._assign[rid][0][0]] = _readonly(np.array(row))
        return self._result({"round": round_idx, "robots": prep.robot_ids})
