"""FedDRMan server step: CUA partition + per-cluster FedAvg + SRB + persistent cluster models.

Round r, participating robots k with full models theta_k:
1. v_k = vec((theta_k - theta^0)|Omega), S = cosine(v_i, v_j)      (CUA, Eq. 10)
2. {G_s} = argmax over partitions into exactly C groups              (Eq. 11-12, `cua.py`)
3. group ids are matched to the previous clusters (Hungarian on member overlap), so a
   cluster keeps its id and its persistent model theta_s across rounds
4. theta_avg,s = sum_{k in G_s} n_k/sum n_j theta_k (all groups in one GEMM)
5. Delta_s = theta_avg,s - theta_s;  SRB on eligible 2-D blocks of Delta_s   (Eq. 13-14)
6. theta_s^{r+1} = theta_s^r + Delta~_s
Robots that did not take part keep their assignment. Ablations: use_cua=False puts all
robots in one cluster (C = 1); use_srb=False skips step 5 (theta_s^{r+1} = theta_avg,s).
Local objective: the round config turns on L_sub / L_act (weights lambda_sub / lambda_act);
use_sub=False / use_act=False are the local-loss ablations.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fed_ros.core.strategies.aggregate import gram_to_cosine, update_similarity
from fed_ros.core.strategies.arrival_gram import ArrivalGram
from fed_ros.core.clustering.cua import cua_partition
from fed_ros.core.params import prefix_columns, unflatten
from fed_ros.core.strategies.prepared_round import PreparedRound
from fed_ros.core.strategies.streamed import omega_similarity
from fed_ros.core.rounds.config import (
    PAPER_LAMBDA_ACT,
    PAPER_LAMBDA_SUB,
    PAPER_USE_ACT,
    PAPER_USE_SUB,
    RobotInstruction,
    RoundConfig,
)
from fed_ros.core.clustering.srb import apply_srb, eligible_blocks
from fed_ros.core.strategies.base import Strategy, _readonly
from fed_ros.core.strategies.cluster_ids import match_cluster_ids
from fed_ros.core.strategies.types import ClientDescriptor, ClientUpdate, RoundResult

log = logging.getLogger("fed_ros.core.feddrman")


class FedDRManStrategy(Strategy):
    """FedDRMan compatibility-aware clustered spectral aggregation (see module docstring)."""

    name = "feddrman"

    def __init__(
        self,
        *,
        num_clusters: int = 1,
        beta: float = 0.9,
        use_cua: bool = True,
        use_srb: bool = True,
        omega_prefixes: Sequence[str] = ("temporal.",),
        cua_method: str = "auto",
        singleton_intra: float = 0.0,
        srb_prefixes: Sequence[str] | None = None,
        srb_min_dim: int = 2,
        srb_exclude: Sequence[str] = (),
        seed: int = 0,
        use_sub: bool = PAPER_USE_SUB,
        use_act: bool = PAPER_USE_ACT,
        lambda_sub: float = PAPER_LAMBDA_SUB,
        lambda_act: float = PAPER_LAMBDA_ACT,
        buffer_regroup_every: int = 4,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        # The robots' local objective (checked now, sent in every round config).
        self._local = RoundConfig(
            use_sub=use_sub, use_act=use_act, lambda_sub=lambda_sub, lambda_act=lambda_act
        )
        if not isinstance(num_clusters, (int, np.integer)) or num_clusters < 1:
            raise ValueError(f"num_clusters must be an int >= 1, got {num_clusters!r}")
        if not (isinstance(beta, (int, float)) and 0.0 <= beta <= 1.0):
            raise ValueError(f"beta must be in [0, 1], got {beta!r}")
        if cua_method not in ("auto", "exact", "scalable"):
            raise ValueError(f"cua_method {cua_method!r} not in ('auto', 'exact', 'scalable')")
        if isinstance(omega_prefixes, str):
            omega_prefixes = (omega_prefixes,)
        if not math.isfinite(singleton_intra):
            raise ValueError(f"singleton_intra must be finite, got {singleton_intra!r}")
        self.num_clusters = int(num_clusters)
        self.beta = float(beta)
        self.use_cua = bool(use_cua)
        self.use_srb = bool(use_srb)
        self.omega_prefixes = tuple(omega_prefixes)
        self.cua_method = cua_method
        self.singleton_intra = float(singleton_intra)
        self.srb_prefixes = tuple(srb_prefixes) if srb_prefixes else None
        self.srb_min_dim = int(srb_min_dim)
        self.srb_exclude = tuple(srb_exclude)
        self.seed = int(seed)
        if not isinstance(buffer_regroup_every, (int, np.integer)) or buffer_regroup_every < 1:
            raise ValueError(
                f"buffer_regroup_every must be an int >= 1, got {buffer_regroup_every!r}"
            )
        # Buffered rounds: CUA regroups the fleet every this many buffer aggregations, on every
        # robot's latest accumulated update (self._latest), never on one buffer's few robots.
        self.buffer_regroup_every = int(buffer_regroup_every)
        self._latest: dict[str, NDArray[Any]] = {}
        self._buffers = 0
        self._omega: NDArray[Any] | slice | None = None
        self._omega_all = False
        # CUA's Gram rows of the open round, computed as its updates are admitted (`observe`).
        self._arrivals: ArrivalGram | None = None
        self._arrivals_round = -1
        self._participants: tuple[int, int] = (-1, 0)  # (round, robots configured for it)

    def _config_fields(self, round_idx: int) -> dict[str, Any]:
        """Distillation switches and weights of the robots' local objective."""
        c = self._local
        return {
            **super()._config_fields(round_idx),
            "use_sub": c.use_sub,
            "use_act": c.use_act,
            "lambda_sub": c.lambda_sub,
            "lambda_act": c.lambda_act,
        }

    @property
    def effective_clusters(self) -> int:
        """C used for partitioning (1 when CUA is ablated)."""
        return self.num_clusters if self.use_cua else 1

    def _setup(self, robot_ids: list[str]) -> None:
        # All C persistent models start at theta^0 (one shared read-only array, no copies).
        self._models = {s: self.initial_vector for s in range(self.effective_clusters)}
        self._assign = {rid: [(0, 1.0)] for rid in robot_ids}
        self._resolve_omega()

    def _resolve_omega(self) -> None:
        cols = prefix_columns(self.manifest, self.omega_prefixes)
        empty = isinstance(cols, np.ndarray) and cols.size == 0
        self._omega_all = empty
        if empty:
            msg = (
                f"FedDRMan: no tensor matches omega_prefixes {list(self.omega_prefixes)}; "
                "CUA falls back to ALL parameters for update similarity"
            )
            warnings.warn(msg, RuntimeWarning, stacklevel=3)
            log.warning(msg)
            self._omega = slice(0, self.initial_vector.shape[0])
        else:
            self._omega = cols

    def aggregate_round(
        self,
        round_idx: int,
        updates: list[ClientUpdate],
        descriptors: Mapping[str, ClientDescriptor] | None = None,
    ) -> RoundResult:
        """CUA -> per-cluster FedAvg -> SRB -> persistent cluster models (ids stable across
        rounds)."""
        prep = self._prepare(round_idx, updates)
        K = len(prep.robot_ids)
        C = self.effective_clusters
        if K < C:
            raise ValueError(f"FedDRMan round {round_idx}: K={K} updates < num_clusters C={C}")
        diag: dict[str, Any] = {
            "round": round_idx,
            "robots": prep.robot_ids,
            "num_clusters": C,
            "omega": "all" if self._omega_all else list(self.omega_prefixes),
        }
        if C > 1:
            # Accumulated update from the common initialisation, restricted to Omega (K x |Omega|).
            try:
                S = self._similarity(prep, round_idx)
            except ValueError as exc:
                bad = prep.first_nonfinite()
                raise ValueError(
                    f"update of {prep.robot_ids[bad]!r} holds NaN/Inf values"
                    if bad >= 0
                    else str(exc)
                ) from None
            res = cua_partition(
                S, C, method=self.cua_method, singleton_intra=self.singleton_intra, seed=self.seed
            )
            groups = res.groups()
            diag.update(
                {
                    "similarity": S.round(6).tolist(),
                    "partition": res.labels.tolist(),
                    "objective": res.objective,
                    "cua_method": res.method,
                }
            )
        else:
            groups = [list(range(K))]
        previous = {rid: self._assign[rid][0][0] for rid in prep.robot_ids if rid in self._assign}
        ids = match_cluster_ids(
            [[prep.robot_ids[i] for i in g] for g in groups], previous, list(self._models)
        )
        self._commit_groups(prep, groups, ids, diag)
        return self._result(diag)

    def configure_round(
        self, round_idx: int, robot_ids: Sequence[str]
    ) -> dict[str, RobotInstruction]:
        """The base's instructions; remembers how many updates the round waits for."""
        self._participants = (round_idx, len(robot_ids))
        return super().configure_round(round_idx, robot_ids)

    def observe(self, round_idx: int, update: ClientUpdate) -> None:
        """Store the admitted update's Omega part; a worker thread computes its Gram row with the
        others (in blocks of `FLUSH_EVERY` arrivals) beside admission, so that the round's close
        pays for the last few only."""
        if self.effective_clusters <= 1 or self._omega is None:
            return
        if self._arrivals is None or self._arrivals_round != round_idx:
            origin = unflatten(self.initial_vector, self.manifest)
            expected = self._participants[1] if self._participants[0] == round_idx else 0
            if self._arrivals is not None:
                self._arrivals.close()  # an earlier round's, never aggregated
            self._arrivals = ArrivalGram(
                self.manifest,
                self._omega_names(),
                origin,
                capacity=max(expected, 64),
                expected=expected,
                background=True,
            )
            self._arrivals_round = round_idx
        try:
            self._arrivals.add(update.robot_id, update.params)
        except (KeyError, ValueError):
            pass  # a malformed update: the close computes its row itself, and refuses it there

    def _similarity(self, prep: PreparedRound, round_idx: int) -> NDArray[Any]:
        """CUA's cosine matrix of the updates' Omega parts: from the Gram rows computed as they
        arrived (`observe`) when the round has them; else streamed, reading the Omega columns
        of each update in place, block by block (the stacked path's blocks: the same S)."""
        arrivals, self._arrivals = self._arrivals, None
        if arrivals is not None:
            arrivals.close()  # its worker's blocks are done or left to gram()
        if arrivals is not None and self._arrivals_round == round_idx:
            for rid, row, params in zip(
                prep.robot_ids, arrivals.rows_for(prep.robot_ids), prep.params
            ):
                if row is None:  # admitted before a restart, or never observed
                    arrivals.add(rid, params)
            G = arrivals.gram(prep.robot_ids)
            if not np.isfinite(G).all():
                raise ValueError("update similarity overflowed")
            return gram_to_cosine(G)
        if prep.stacked is not None:
            return update_similarity(prep.stacked, self._omega, self.initial_vector)
        origin = unflatten(self.initial_vector, self.manifest)
        return omega_similarity(prep.params, self.manifest, self._omega_names(), origin)

    def _omega_names(self) -> list[str]:
        """Tensors CUA compares (all when no name matches omega_prefixes), manifest order."""
        if self._omega_all:
            return [s.name for s in self.manifest]
        return [s.name for s in self.manifest if s.name.startswith(self.omega_prefixes)]

    def _commit_groups(
        self,
        prep: Any,
        groups: Sequence[Sequence[int]],
        ids: Sequence[int],
        diag: dict[str, Any],
    ) -> None:
        """Per-cluster FedAvg -> SRB -> persistent models of clusters ``ids``; the groups'
        robots assigned to them. Clusters not in ``ids`` keep their models."""
        references = [self._models.get(cid, self.initial_vector) for cid in ids]
        avg = self._average_groups(prep, groups, references=references)  # (G, P), new buffer
        srb_info: dict[str, Any] = {}
        blocks = eligible_blocks(
            self.manifest, self.srb_prefixes, self.srb_min_dim, self.srb_exclude
        )
        for g, cid in enumerate(ids):
            theta = references[g]
            if self.use_srb and blocks:
                row = avg[g]
                row -= theta  # Delta_s, in place
                info = apply_srb(row, self.manifest, self.beta, blocks)
                row += theta  # theta_s + Delta~_s
                srb_info[str(cid)] = {name: i.to_json() for name, i in info.items()}
            self._models[cid] = _readonly(avg[g])
        for members, cid in zip(groups, ids):
            for i in members:
                self._assign[prep.robot_ids[i]] = [(cid, 1.0)]
        diag.update(
            {
                "groups": {str(cid): [prep.robot_ids[i] for i in g] for g, cid in zip(groups, ids)},
                "srb": srb_info,
                "beta": self.beta,
                "use_cua": self.use_cua,
                "use_srb": self.use_srb,
            }
        )

    def aggregate_buffer(
        self,
        round_idx: int,
        updates: list[ClientUpdate],
        descriptors: Mapping[str, ClientDescriptor] | None = None,
    ) -> RoundResult:
        """Buffered rounds (fed_ros.core.rounds.buffered): the buffer's robots are averaged (+
        SRB) within the clusters they are assigned to, the other clusters untouched; CUA
        regroups on a schedule of its own, every ``buffer_regroup_every`` buffers, over every
        robot's latest accumulated update (what CUA clusters in a synchronous round), so a
        buffer of a few robots of one cluster never splits or merges the fleet."""
        prep = self._prepare(round_idx, updates)
        for i, rid in enumerate(prep.robot_ids):
            self._latest[rid] = np.array(prep.row(i), dtype=np.float32)
        cluster_of = {rid: self._assign.get(rid, [(0, 1.0)])[0][0] for rid in prep.robot_ids}
        ids = sorted(set(cluster_of.values()))
        groups = [[i for i, r in enumerate(prep.robot_ids) if cluster_of[r] == c] for c in ids]
        diag: dict[str, Any] = {"round": round_idx, "robots": prep.robot_ids, "buffered": True}
        self._commit_groups(prep, groups, ids, diag)
        self._buffers += 1
        C = self.effective_clusters
        if C > 1 and self._buffers % self.buffer_regroup_every == 0 and len(self._latest) >= C:
            diag["regrouped"] = self._regroup_latest(C)
        return self._result(diag)

    def _regroup_latest(self, C: int) -> dict[str, list[str]]:
        """CUA over every robot's latest accumulated update: new assignments (cluster ids
        matched to the previous ones), the models unchanged until the next buffers."""
        robots = sorted(self._latest)
        S = update_similarity(
            np.stack([self._latest[r] for r in robots]), self._omega, self.initial_vector
        )
        res = cua_partition(
            S, C, method=self.cua_method, singleton_intra=self.singleton_intra, seed=self.seed
        )
        members = [[robots[i] for i in g] for g in res.groups()]
        previous = {r: self._assign[r][0][0] for r in robots if r in self._assign}
        ids = match_cluster_ids(members, previous, list(self._models))
        for group, cid in zip(members, ids):
            if cid not in self._models:
                self._models[cid] = self.initial_vector
            for rid in group:
                self._assign[rid] = [(cid, 1.0)]
        return {str(cid): group for group, cid in zip(members, ids)}

    def _extra_meta(self) -> dict[str, Any]:
        return {
            "num_clusters": self.num_clusters,
            "beta": self.beta,
            "use_cua": self.use_cua,
            "use_srb": self.use_srb,
            "omega_prefixes": list(self.omega_prefixes),
            "buffer_regroup_every": self.buffer_regroup_every,
        }

    def _load_extra(self, arrays: Mapping[str, NDArray[Any]], extra: dict[str, Any]) -> None:
        self._resolve_omega()
