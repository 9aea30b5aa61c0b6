"""IFCA in a fleet: the server keeps C models; each robot evaluates all C on its data, picks
the argmin-loss one (`ifca_select`), trains it, and reports the choice in
`ClientUpdate.cluster_id`; the server FedAvg's each cluster over the robots that chose it.

Membership: every robot lists all C clusters (it must download them all), weight 1.0 on
its current choice (cluster 0 before any) and 0.0 on the rest; `client_selects_cluster`
is True. Cluster models start from theta^0 plus a small seeded relative perturbation for
c >= 1 (identical starts would make every argmin a tie).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fed_ros.core.params import offsets
from fed_ros.core.rounds.config import Membership
from fed_ros.core.strategies.base import Strategy, _readonly
from fed_ros.core.strategies.types import ClientDescriptor, ClientUpdate, RoundResult


def ifca_select(losses: Sequence[float]) -> int:
    """Index of the smallest loss (first on ties); raises ValueError on empty or non-finite
    losses."""
    arr = np.asarray(list(losses), dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError("ifca_select: need at least one loss")
    if not np.isfinite(arr).all():
        raise ValueError(f"ifca_select: non-finite loss in {arr.tolist()}")
    return int(np.argmin(arr))


class IFCAStrategy(Strategy):
    """Iterative Federated Clustering Algorithm (model-averaging variant)."""

    name = "ifca"
    supports_buffered = False
    buffered_refusal = (
        "each IFCA round evaluates every cluster model on every robot and re-forms all "
        "clusters from the picks of the whole round"
    )
    client_selects_cluster = True

    def __init__(
        self, *, num_clusters: int = 2, init_noise: float = 0.01, seed: int = 0, **kw: Any
    ) -> None:
        super().__init__(**kw)
        if not isinstance(num_clusters, (int, np.integer)) or num_clusters < 1:
            raise ValueError(f"num_clusters must be an int >= 1, got {num_clusters!r}")
        if not math.isfinite(init_noise) or init_noise < 0:
            raise ValueError(f"init_noise must be finite and >= 0, got {init_noise!r}")
        self.num_clusters = int(num_clusters)
        self.init_noise = float(init_noise)
        self.seed = int(seed)

    def _setup(self, robot_ids: list[str]) -> None:
        rng = np.random.default_rng(self.seed)
        self._models = {0: self.initial_vector}
        offs = offsets(self.manifest)
        for c in range(1, self.num_clusters):
            vec = self.initial_vector.copy()
            for name, (a, b) in offs.items():
                # Per-tensor relative noise keeps the perturbation scale-free across layers.
                scale = float(np.std(vec[a:b])) or 1.0
                vec[a:b] += (self.init_noise * scale * rng.standard_normal(b - a)).astype(
                    np.float32
                )
            self._models[c] = _readonly(vec)
        self._assign = {rid: self._membership(0) for rid in robot_ids}

    def _membership(self, chosen: int) -> Membership:
        return [(c, 1.0 if c == chosen else 0.0) for c in range(self.num_clusters)]

    def _new_robot(self, robot_id: str) -> Membership:
        return self._membership(0)

    def route(self, descriptor: ClientDescriptor) -> Membership:
        """Unseen robots download all models; start from cluster 0 until they choose."""
        return self._membership(0)

    def aggregate_round(
        self,
        round_idx: int,
        updates: list[ClientUpdate],
        descriptors: Mapping[str, ClientDescriptor] | None = None,
    ) -> RoundResult:
        """FedAvg per chosen cluster; clusters nobody chose keep their model."""
        prep = self._prepare(round_idx, updates)
        by_cluster: dict[int, list[int]] = {}
        for k, u in enumerate(prep.updates):
            if not 0 <= u.cluster_id < self.num_clusters:
                raise ValueError(
                    f"IFCA update of {u.robot_id!r} reports cluster_id {u.cluster_id}, "
                    f"expected 0..{self.num_clusters - 1}"
                )
            by_cluster.setdefault(int(u.cluster_id), []).append(k)
        cids = sorted(by_cluster)
        avg = self._average_groups(
            prep, [by_cluster[c] for c in cids], references=[self._models[c] for c in cids]
        )
        for g, cid in enumerate(cids):
            self._models[cid] = _readonly(avg[g])
        for u in prep.updates:
            self._assign[u.robot_id] = self._membership(int(u.cluster_id))
        diag = {
            "round": round_idx,
            "robots": prep.robot_ids,
            "choices": {u.robot_id: int(u.cluster_id) for u in prep.updates},
            "updated_clusters": cids,
            "client_selects_cluster": True,
        }
        return self._result(diag)
