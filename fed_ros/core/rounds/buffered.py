"""Asynchronous buffered rounds (FedBuff: Nguyen et al., "Federated Learning with Buffered
Asynchronous Aggregation", AISTATS 2022), as an option of the round protocol (issue 26).

In synchronous rounds the server waits for every participant (or the deadline), so a fleet
trains at the pace of its slowest computer. With a buffer of ``B`` updates the server closes a
round as soon as ``B`` updates *of one cluster* have arrived and aggregates that cluster; the
robots never wait for each other: each trains on the newest model it holds, and an update that
arrives after its cluster moved on is still used, down-weighted by its staleness
``tau`` = how many times its cluster's model changed since the robot took it (a cluster version
counter; another cluster's aggregation does not age it). Updates of more than ``max_staleness``
versions are dropped, and the server takes updates up to ``max_staleness`` rounds per cluster
old (the round counter moves with every cluster's aggregation).

How a stale update enters the aggregation: it is *rebased* onto the cluster's current model,
``current + s(tau) * (update - start)``, where ``start`` is the model the robot trained from
(kept in :class:`ModelHistory`) and ``s`` the staleness weight (FedBuff's default
``s(tau) = 1 / sqrt(1 + tau)``; ``constant`` is the no-weighting ablation). A strategy's weighted
mean over rebased updates is then ``current + sum_i n_i s(tau_i) delta_i / sum_i n_i``: FedBuff's
server step with a server learning rate of 1, and exactly FedAvg when nothing is stale.

Clustering gets a schedule of its own: an aggregation sees one cluster's buffer, so the
coordinator calls the strategy's ``aggregate_buffer`` (`fed_ros.core.strategies.base`), not
``aggregate_round``. FedAvg, FedProx and Local average what they are given; FedDRMan averages a
buffer within its robots' clusters and runs CUA every ``buffer_regroup_every`` buffers over every
robot's latest accumulated update; FeDepth, RND and IFCA, which cluster a whole round's
descriptors or picks, refuse buffered rounds at start-up.

Pure functions and small value objects: the coordinator (:mod:`fed_ros.core.rounds.coordinator`)
and the stage collector call them; the benchmark drives the same coordinator on a virtual clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fed_ros.core.rounds.collect import RoundPlan
from fed_ros.core.rounds.config import Membership, RoundConfig
from fed_ros.core.strategies.aggregate import weighted_model

STALENESS_KINDS = ("polynomial", "constant")


@dataclass(frozen=True)
class BufferSettings:
    """``buffer_size`` B (0: synchronous rounds), the oldest usable update, the staleness weight."""

    buffer_size: int = 0
    max_staleness: int = 4
    staleness: str = "polynomial"  # s(tau) = (1 + tau) ** -exponent; "constant": s = 1
    staleness_exponent: float = 0.5  # FedBuff's 1 / sqrt(1 + tau)
    # The first rounds stay synchronous: a clustering strategy needs one update from every robot
    # before any model moves (measured: FedDRMan buffers that mixed both families before CUA had
    # seen every robot never separated them again).
    sync_rounds: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.buffer_size, int) or self.buffer_size < 0:
            raise ValueError(f"buffer_size must be an integer >= 0, got {self.buffer_size!r}")
        if not isinstance(self.max_staleness, int) or self.max_staleness < 0:
            raise ValueError(f"max_staleness must be an integer >= 0, got {self.max_staleness!r}")
        if not isinstance(self.sync_rounds, int) or self.sync_rounds < 0:
            raise ValueError(f"sync_rounds must be an integer >= 0, got {self.sync_rounds!r}")
        if self.staleness not in STALENESS_KINDS:
            raise ValueError(
                f"staleness must be one of {list(STALENESS_KINDS)}, got {self.staleness!r}"
            )
        if not (math.isfinite(self.staleness_exponent) and self.staleness_exponent >= 0):
            raise ValueError(
                f"staleness_exponent must be a finite number >= 0, got {self.staleness_exponent!r}"
            )

    @property
    def enabled(self) -> bool:
        """Whether rounds are buffered (asynchronous)."""
        return self.buffer_size > 0


def staleness_weight(tau: int, settings: BufferSettings) -> float:
    """s(tau): 1 for a fresh update, smaller the staler (ValueError below 0)."""
    if tau < 0:
        raise ValueError(f"staleness must be >= 0, got {tau}")
    if settings.staleness == "constant":
        return 1.0
    return float((1.0 + tau) ** -settings.staleness_exponent)


def primary_of(membership: Membership) -> int | None:
    """The cluster of largest positive weight (the first listed on ties), None when none."""
    positive = [(int(c), float(w)) for c, w in membership if w > 0]
    return max(positive, key=lambda m: m[1])[0] if positive else None


def buffer_targets(memberships: Mapping[str, Membership], buffer_size: int) -> dict[int, int]:
    """Updates each cluster needs before it is aggregated: B, or all of a smaller cluster's robots
    (a cluster of 2 with B = 3 would otherwise wait for its deadline every round)."""
    sizes: dict[int, int] = {}
    for membership in memberships.values():
        cid = primary_of(membership)
        if cid is not None:
            sizes[cid] = sizes.get(cid, 0) + 1
    return {cid: min(int(buffer_size), n) for cid, n in sorted(sizes.items())}


@dataclass(frozen=True)
class SentRound:
    """What one round's robots trained from: cluster models, memberships, whether they pick."""

    cluster_models: dict[int, dict[str, np.ndarray]]
    memberships: dict[str, Membership]
    picks: frozenset[str] = frozenset()  # robots told to pick one listed cluster (IFCA)
    versions: dict[int, int] = field(default_factory=dict)  # each cluster model's version


def same_model(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    """Whether two models hold the same tensors, value for value."""
    return set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)


def next_versions(
    versions: Mapping[int, int],
    old: Mapping[int, Mapping[str, np.ndarray]],
    new: Mapping[int, Mapping[str, np.ndarray]],
) -> dict[int, int]:
    """Cluster versions after a commit: one more for every cluster whose model changed (or is
    new), the same for the others."""
    out = dict(versions)
    for cid, model in new.items():
        if int(cid) not in old or not same_model(old[int(cid)], model):
            out[int(cid)] = out.get(int(cid), 0) + 1
    return out


class ModelHistory:
    """The models of the last ``keep`` announced rounds (the starts of stale updates)."""

    def __init__(self, keep: int) -> None:
        self.keep = max(1, int(keep))
        self._rounds: dict[int, SentRound] = {}

    def sent(self, round_idx: int) -> SentRound | None:
        """What round ``round_idx`` sent, when still kept."""
        return self._rounds.get(int(round_idx))

    def record(self, round_idx: int, sent: SentRound) -> None:
        """Keep round ``round_idx``'s models, forgetting rounds older than ``keep``."""
        self._rounds[int(round_idx)] = sent
        for old in [r for r in self._rounds if r <= round_idx - self.keep]:
            del self._rounds[old]

    def start_model(
        self, round_idx: int, robot_id: str, cluster_id: int
    ) -> dict[str, np.ndarray] | None:
        """The model ``robot_id`` trained from in ``round_idx`` (None when not kept): its picked
        cluster's, or the weighted mean of its membership (`weighted_model`, as the robot did)."""
        sent = self._rounds.get(int(round_idx))
        if sent is None:
            return None
        membership = sent.memberships.get(robot_id)
        if not membership:
            return None
        if robot_id in sent.picks or len([w for _, w in membership if w > 0]) == 1:
            model = sent.cluster_models.get(int(cluster_id))
            return None if model is None else model
        try:
            return weighted_model(sent.cluster_models, membership)
        except (KeyError, ValueError):
            return None


def rebase(
    update: Any, start: Mapping[str, np.ndarray], current: Mapping[str, np.ndarray], weight: float
) -> Any:
    """A copy of ``update`` whose params are ``current + weight * (params - start)``."""
    params = {
        k: (
            np.asarray(current[k], np.float32)
            + np.float32(weight) * (np.asarray(v, np.float32) - np.asarray(start[k], np.float32))
        ).astype(np.float32)
        for k, v in update.params.items()
    }
    out = replace(update, params=params)
    if hasattr(update, "round_idx"):
        out.round_idx = update.round_idx
    return out


class RoundBuffer:
    """The coordinator's buffered-round state: the models stale updates trained from, each
    cluster's model version, and the updates still waiting for their cluster's buffer to fill."""

    def __init__(self, settings: BufferSettings) -> None:
        self.settings = settings
        self.history = ModelHistory(settings.max_staleness + 1)
        self.waiting: dict[str, Any] = {}  # robot -> update of a cluster not aggregated yet
        self.versions: dict[int, int] = {}  # how often each cluster's model changed

    @property
    def enabled(self) -> bool:
        """Whether rounds are buffered."""
        return self.settings.enabled

    def buffers(self, round_idx: int) -> bool:
        """Whether round ``round_idx``'s TRAIN stage is buffered (after the synchronous ones)."""
        return self.enabled and round_idx >= self.settings.sync_rounds

    def record(
        self,
        round_idx: int,
        cluster_models: Mapping[int, dict[str, np.ndarray]],
        memberships: Mapping[str, Membership],
        configs: Mapping[str, RoundConfig],
    ) -> None:
        """What round ``round_idx`` sends (the starts of its updates, should they come late)."""
        picks = frozenset(r for r, c in configs.items() if c.pick_cluster)
        sent = SentRound(dict(cluster_models), dict(memberships), picks, dict(self.versions))
        self.history.record(round_idx, sent)

    def window(self, clusters: int) -> int:
        """Earlier rounds whose updates are still taken (0 when rounds are synchronous). Rounds
        move with every cluster's aggregation: a cluster's update may be max_staleness of its own
        versions old, so as many rounds per cluster are taken."""
        return self.settings.max_staleness * max(1, clusters) if self.enabled else 0

    def train_plan(
        self, plan: RoundPlan, clusters: int, carried: Mapping[str, Any]
    ) -> tuple[RoundPlan, dict[str, Any]]:
        """A TRAIN plan made buffered (per-cluster targets, stale rounds taken, a quorum of one),
        and the answers it starts with: the waiting updates, then the stage's carried ones."""
        window = self.window(clusters)
        self.history.keep = window + 1
        plan = replace(
            plan,
            quorum=1,
            buffer_targets=buffer_targets(plan.memberships, self.settings.buffer_size),
            max_staleness=window,
        )
        return plan, {**self.waiting, **carried}

    def take(
        self,
        round_idx: int,
        updates: list[Any],
        waiting: Mapping[str, Any],
        cluster_models: Mapping[int, Mapping[str, np.ndarray]],
    ) -> tuple[list[Any], dict[str, float]]:
        """The updates to aggregate, each stale one rebased onto its cluster's current model with
        its staleness weight; those staler than the limit, or whose start model is no longer
        known, are dropped. ``waiting`` (clusters not full) waits for a later round. Also the
        round's buffer figures (the report's diagnostics)."""
        self.waiting = dict(waiting)
        kept: list[Any] = []
        weights: list[float] = []
        staleness: list[int] = []
        dropped = 0
        for update in updates:
            cid = int(update.cluster_id)
            sent = self.history.sent(update.base_round)
            if sent is not None and cid in sent.versions:
                tau = self.versions.get(cid, 0) - sent.versions[cid]
            else:
                tau = round_idx - int(update.base_round)
            start = self.history.start_model(update.base_round, update.robot_id, cid)
            current = cluster_models.get(cid)
            if tau > self.settings.max_staleness or (
                tau > 0 and (start is None or current is None)
            ):
                dropped += 1
                continue
            weight = staleness_weight(tau, self.settings)
            kept.append(rebase(update, start, current, weight) if tau > 0 else update)
            weights.append(weight)
            staleness.append(tau)
        diag = {
            "buffered/updates": float(len(kept)),
            "buffered/stale_updates": float(sum(1 for t in staleness if t > 0)),
            "buffered/max_staleness": float(max(staleness, default=0)),
            "buffered/min_weight": float(min(weights, default=1.0)),
            "buffered/dropped_too_stale": float(dropped),
            "buffered/waiting": float(len(self.waiting)),
        }
        return kept, diag

    def committed(
        self,
        old: Mapping[int, Mapping[str, np.ndarray]],
        new: Mapping[int, Mapping[str, np.ndarray]],
    ) -> None:
        """A round committed: the clusters whose model changed move one version on."""
        self.versions = next_versions(self.versions, old, new)
