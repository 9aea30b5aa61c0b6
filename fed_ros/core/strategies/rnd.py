"""RND clustered FL: federations from novelty reports (no preset count), FedAvg inside each.

Federations are (re)built from `ClientDescriptor(kind="rnd", scores={peer: s_ij},
residual_std=sigma_i)` on round 0 and then every `recluster_every` rounds (tau; 0 = once
before training). Federation ids are matched to the previous ones by member overlap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fed_ros.core.clustering import rnd
from fed_ros.core.strategies.base import Strategy, _readonly
from fed_ros.core.strategies.cluster_ids import match_cluster_ids
from fed_ros.core.strategies.types import ClientDescriptor, ClientUpdate, RoundResult


class RNDStrategy(Strategy):
    """Random-network-distillation federations + per-federation FedAvg."""

    name = "rnd"
    supports_buffered = False
    buffered_refusal = (
        "RND clusters on every robot's novelty scores of the round together; a buffer of "
        "one cluster's few updates would re-cluster the fleet from those robots alone"
    )
    descriptor_kind = "rnd"

    def __init__(
        self, *, eps: float = 1.0, recluster_every: int = 0, symmetrise: str = "mutual", **kw: Any
    ) -> None:
        super().__init__(**kw)
        if not math.isfinite(eps) or eps < 0:
            raise ValueError(f"eps must be finite and >= 0, got {eps!r}")
        if not isinstance(recluster_every, int) or recluster_every < 0:
            raise ValueError(f"recluster_every must be an int >= 0, got {recluster_every!r}")
        if symmetrise not in rnd.SYMMETRISE_MODES:
            raise ValueError(f"symmetrise {symmetrise!r} not in {rnd.SYMMETRISE_MODES}")
        self.eps = float(eps)
        self.recluster_every = recluster_every
        self.symmetrise = symmetrise
        self._clustered_round = -1

    def needs_descriptors(self, round_idx: int) -> set[str]:
        """RND reports before the first clustering and every `recluster_every` rounds after it."""
        if self._clustered_round < 0:
            return {"rnd"}
        if self.recluster_every > 0 and round_idx - self._clustered_round >= self.recluster_every:
            return {"rnd"}
        return set()

    def aggregate_round(
        self,
        round_idx: int,
        updates: list[ClientUpdate],
        descriptors: Mapping[str, ClientDescriptor] | None = None,
    ) -> RoundResult:
        """Recluster when due, then FedAvg inside each federation."""
        prep = self._prepare(round_idx, updates)
        diag: dict[str, Any] = {"round": round_idx, "robots": prep.robot_ids}
        if self.needs_descriptors(round_idx):
            descriptors = descriptors or {}
            ids = [r for r in prep.robot_ids]
            missing = [r for r in ids if r not in descriptors or descriptors[r].kind != "rnd"]
            if missing:
                raise ValueError(
                    f"RND needs an rnd descriptor from every robot; missing for {missing[0]!r}"
                )
            groups, N = rnd.rnd_federations(
                ids,
                {r: descriptors[r].scores for r in ids},
                {r: descriptors[r].residual_std for r in ids},
                self.eps,
                self.symmetrise,
            )
            previous = {r: m[0][0] for r, m in self._assign.items() if m}
            cids = match_cluster_ids(groups, previous, list(self._models))
            new_models = {}
            for cid, g in zip(cids, groups):
                new_models[cid] = self._models.get(cid, self.initial_vector)
                for r in g:
                    self._assign[r] = [(cid, 1.0)]
            self._models = new_models
            self._clustered_round = round_idx
            diag.update(
                {
                    "novelty": np.where(np.isnan(N), -1.0, N).round(6).tolist(),
                    "eps": self.eps,
                    "federations": {str(c): g for c, g in zip(cids, groups)},
                }
            )
        index = {r: k for k, r in enumerate(prep.robot_ids)}
        by_cluster: dict[int, list[int]] = {}
        for r in prep.robot_ids:
            if r not in self._assign or self._assign[r][0][0] not in self._models:
                self._assign[r] = self.route(ClientDescriptor(robot_id=r, kind="update"))
            by_cluster.setdefault(self._assign[r][0][0], []).append(index[r])
        cids = sorted(by_cluster)
        avg = self._average_groups(
            prep, [by_cluster[c] for c in cids], references=[self._models[c] for c in cids]
        )
        for slot, cid in enumerate(cids):
            self._models[cid] = _readonly(avg[slot])
        for r, mem in list(self._assign.items()):
            if mem[0][0] not in self._models:
                self._assign[r] = self.route(ClientDescriptor(robot_id=r, kind="update"))
        diag["updated_clusters"] = cids
        return self._result(diag)

    def _extra_meta(self) -> dict[str, Any]:
        return {"clustered_round": self._clustered_round, "eps": self.eps}

    def _load_extra(self, arrays: Mapping[str, NDArray[Any]], extra: dict[str, Any]) -> None:
        self._clustered_round = int(extra.get("clustered_round", -1))
