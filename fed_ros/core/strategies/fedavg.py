"""FedAvg and FedProx (server side identical; FedProx's proximal term lives in local training)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import math


from fed_ros.core.strategies.base import Strategy, _readonly
from fed_ros.core.strategies.types import ClientDescriptor, ClientUpdate, RoundResult


class FedAvgStrategy(Strategy):
    """One global model: theta^{r+1} = sum_k n_k/sum_j n_j theta_k (or a robust rule)."""

    name = "fedavg"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)

    def aggregate_round(
        self,
        round_idx: int,
        updates: list[ClientUpdate],
        descriptors: Mapping[str, ClientDescriptor] | None = None,
    ) -> RoundResult:
        """Weighted average of all updates into cluster 0."""
        prep = self._prepare(round_idx, updates)
        avg = self._average_groups(
            prep, [list(range(len(prep.robot_ids)))], references=[self._models[0]]
        )
        self._models[0] = _readonly(avg[0])
        for rid in prep.robot_ids:
            self._assign[rid] = [(0, 1.0)]
        diag = {
            "round": round_idx,
            "robots": prep.robot_ids,
            "num_samples": prep.num_samples.tolist(),
        }
        diag["prox_mu"] = self.round_config(round_idx).prox_mu
        return self._result(diag)


class FedProxStrategy(FedAvgStrategy):
    """FedProx: FedAvg on the server; robots add (mu/2)||theta - theta_global||^2 locally."""

    name = "fedprox"

    def __init__(self, *, mu: float = 1e-3, **kw: Any) -> None:
        if not math.isfinite(mu) or mu < 0:
            raise ValueError(f"FedProx mu must be finite and >= 0, got {mu!r}")
        super().__init__(**kw)
        self.mu = float(mu)

    def _config_fields(self, round_idx: int) -> dict[str, Any]:
        """Tells local training the proximal weight."""
        return {**super()._config_fields(round_idx), "prox_mu": self.mu}
