"""FeDepth soft clustered FL: Gaussian descriptors -> Jeffreys -> threshold -> subset merging.

Clustering runs on the first round whose descriptors arrive (and every `recluster_every`
rounds when > 0). Each cluster model is the sample-weighted mean of its members' models
(all clusters in one GEMM); a robot's next model is the plain mean of the models of all
clusters it belongs to (Membership weights 1/m). tau is either given or calibrated as the
largest tau whose soft-clustering overlap ratio is <= `target_overlap` (0.2 by default);
`hard=True` cuts average-linkage disjoint clusters at that same tau. Unseen robots are routed
with their Gaussian descriptor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fed_ros.core.clustering import fedepth as fd
from fed_ros.core.rounds.config import Membership
from fed_ros.core.strategies.base import Strategy, _readonly
from fed_ros.core.strategies.cluster_ids import match_cluster_ids
from fed_ros.core.strategies.types import ClientDescriptor, ClientUpdate, RoundResult


class FeDepthStrategy(Strategy):
    """Descriptor-based soft clustering with multi-membership aggregation."""

    name = "fedepth"
    supports_buffered = False
    buffered_refusal = (
        "FeDepth clusters every robot's descriptor of the round together; a buffer of one "
        "cluster's few updates would re-cluster the fleet from those robots alone"
    )

    def __init__(
        self,
        *,
        tau: float | None = None,
        target_overlap: float = 0.2,
        hard: bool = False,
        recluster_every: int = 0,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        if tau is not None and (not math.isfinite(tau) or tau < 0):
            raise ValueError(f"tau must be finite and >= 0, got {tau!r}")
        if not 0.0 <= target_overlap <= 1.0:
            raise ValueError(f"target_overlap must be in [0, 1], got {target_overlap!r}")
        if not isinstance(recluster_every, int) or recluster_every < 0:
            raise ValueError(f"recluster_every must be an int >= 0, got {recluster_every!r}")
        self.tau_setting = tau
        self.target_overlap = float(target_overlap)
        self.hard = bool(hard)
        self.recluster_every = recluster_every
        self.tau: float | None = tau
        self._clusters: dict[int, list[str]] = {}  # cluster id -> member robot ids
        self._desc_ids: list[str] = []
        self._desc_mean: NDArray[Any] | None = None
        self._desc_var: NDArray[Any] | None = None
        self._clustered_round = -1

    def needs_descriptors(self, round_idx: int) -> set[str]:
        """Gaussian descriptors until clustered, then every `recluster_every` rounds."""
        if self._clustered_round < 0:
            return {"gaussian"}
        if self.recluster_every > 0 and round_idx - self._clustered_round >= self.recluster_every:
            return {"gaussian"}
        return set()

    def _cluster(
        self, robot_ids: list[str], descriptors: Mapping[str, ClientDescriptor]
    ) -> dict[str, Any]:
        missing = [
            r for r in robot_ids if r not in descriptors or descriptors[r].kind != "gaussian"
        ]
        if missing:
            raise ValueError(
                f"FeDepth needs a gaussian descriptor from every robot; missing for {missing[0]!r}"
            )
        dims = {np.asarray(descriptors[r].mean).shape for r in robot_ids}
        if len(dims) != 1:
            raise ValueError(f"gaussian descriptors have different dimensions {sorted(dims)}")
        means = np.stack([np.asarray(descriptors[r].mean, dtype=np.float64) for r in robot_ids])
        var = np.stack([np.asarray(descriptors[r].variance, dtype=np.float64) for r in robot_ids])
        A = fd.jeffreys_matrix(means, var)
        if self.tau_setting is None:
            # Calibrated on the soft clustering in both modes: the paper's hard ablation uses
            # the same tau (Table 3a); hard clusters alone only ever overlap 0% or 100%.
            tau, _ = fd.calibrate_tau(A, self.target_overlap)
        else:
            tau = self.tau_setting
        clusters = fd.hard_clusters(A, tau) if self.hard else fd.soft_clusters(A, tau)
        overlap = fd.overlap_ratio(clusters, len(robot_ids))
        groups = [[robot_ids[i] for i in c] for c in clusters]
        previous = {rid: m[0][0] for rid, m in self._assign.items() if m}
        ids = match_cluster_ids(groups, previous, list(self._clusters) or list(self._models))
        self.tau = float(tau)
        self._clusters = {cid: g for cid, g in zip(ids, groups)}
        self._desc_ids, self._desc_mean, self._desc_var = list(robot_ids), means, var
        return {
            "jeffreys": A.round(6).tolist(),
            "tau": float(tau),
            "overlap": overlap,
            "clusters": {str(c): g for c, g in self._clusters.items()},
        }

    def aggregate_round(
        self,
        round_idx: int,
        updates: list[ClientUpdate],
        descriptors: Mapping[str, ClientDescriptor] | None = None,
    ) -> RoundResult:
        """(Re)cluster when due, then w_k = sum_{c in k} n_c/sum n_j w_c for every cluster with
        updates."""
        prep = self._prepare(round_idx, updates)
        diag: dict[str, Any] = {"round": round_idx, "robots": prep.robot_ids}
        if self.needs_descriptors(round_idx):
            diag.update(self._cluster(prep.robot_ids, descriptors or {}))
            self._clustered_round = round_idx
            # Clusters are new: drop models of ids that no longer exist.
            self._models = {c: m for c, m in self._models.items() if c in self._clusters}
        index = {rid: k for k, rid in enumerate(prep.robot_ids)}
        cids, groups = [], []
        for cid, members in sorted(self._clusters.items()):
            g = [index[r] for r in members if r in index]
            if g:
                cids.append(cid)
                groups.append(g)
        if not groups:
            raise ValueError(f"FeDepth round {round_idx}: no update comes from a clustered robot")
        refs = [self._models.get(cid, self.initial_vector) for cid in cids]
        avg = self._average_groups(prep, groups, references=refs)
        for slot, cid in enumerate(cids):
            self._models[cid] = _readonly(avg[slot])
        for cid in self._clusters:
            self._models.setdefault(cid, self.initial_vector)
        # Robots' memberships: plain mean over all clusters they belong to.
        member_of: dict[str, list[int]] = {}
        for cid, members in sorted(self._clusters.items()):
            for r in members:
                member_of.setdefault(r, []).append(cid)
        for r, cs in member_of.items():
            self._assign[r] = [(c, 1.0 / len(cs)) for c in cs]
        # Robots absent at a reclustering may point at dropped clusters: move them to the largest.
        for r, mem in list(self._assign.items()):
            if any(c not in self._models for c, _ in mem):
                self._assign[r] = Strategy.route(self, ClientDescriptor(robot_id=r, kind="update"))
        diag.update({"tau": self.tau, "updated_clusters": cids})
        return self._result(diag)

    def route(self, descriptor: ClientDescriptor) -> Membership:
        """Unseen robot: clusters with mean Jeffreys <= tau (equal weights), else the nearest
        one."""
        if descriptor.kind != "gaussian" or self._desc_mean is None or not self._clusters:
            return super().route(descriptor)
        a = fd.jeffreys_to_each(
            descriptor.mean, descriptor.variance, self._desc_mean, self._desc_var
        )
        pos = {r: i for i, r in enumerate(self._desc_ids)}
        cids = sorted(self._clusters)
        clusters = [tuple(pos[r] for r in self._clusters[c] if r in pos) for c in cids]
        chosen = fd.route_clusters(a, clusters, float(self.tau))
        return [(cids[k], 1.0 / len(chosen)) for k in chosen]

    def _extra_arrays(self) -> dict[str, NDArray[Any]]:
        if self._desc_mean is None:
            return {}
        return {"desc_mean": self._desc_mean, "desc_var": self._desc_var}

    def _extra_meta(self) -> dict[str, Any]:
        return {
            "tau": self.tau,
            "clusters": {str(c): g for c, g in self._clusters.items()},
            "desc_ids": self._desc_ids,
            "clustered_round": self._clustered_round,
        }

    def _load_extra(self, arrays: Mapping[str, NDArray[Any]], extra: dict[str, Any]) -> None:
        self.tau = extra.get("tau")
        self._clusters = {int(c): list(g) for c, g in extra.get("clusters", {}).items()}
        self._desc_ids = list(extra.get("desc_ids", []))
        self._clustered_round = int(extra.get("clustered_round", -1))
        self._desc_mean = (
            np.asarray(arrays["desc_mean"], dtype=np.float64) if "desc_mean" in arrays else None
        )
        self._desc_var = (
            np.asarray(arrays["desc_var"], dtype=np.float64) if "desc_var" in arrays else None
        )
