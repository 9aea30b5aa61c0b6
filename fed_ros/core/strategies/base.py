"""Strategy interface (Flower-style: small classes over stateless functions) and its data types.

A strategy owns the cluster models of a fleet. Per round the server calls
`configure_round`: per robot a `RobotInstruction` = which cluster model(s) it starts from
and the `RoundConfig` it must obey (proximal mu, distillation switches, steps, learning
rate, descriptor kind, IFCA cluster pick; `fed_ros.core.rounds.config`). The robots train,
then `aggregate_round` turns their `ClientUpdate`s (+ `ClientDescriptor`s when
`needs_descriptors` asks for them) into new cluster models and assignments. Training
settings a fleet file imposes (``strategy.lr``, ``strategy.local_steps``,
``strategy.local_epochs``) are keyword settings of every strategy.

Membership representation: a `Membership` lists every cluster a robot must download, with
the weight of that cluster's model in the robot's starting model (weights sum to 1 over
the entries with weight > 0; `model_for` is that weighted mean). Hard strategies give one
entry ``[(cid, 1.0)]``; FeDepth gives ``[(k, 1/m) ...]`` for its m clusters; IFCA lists
all C clusters with weight 1.0 on the robot's current choice and 0.0 on the others, and
`client_selects_cluster` is True: the robot evaluates every listed model, picks
`ifca_select(losses)` and reports it in `ClientUpdate.cluster_id`.
"""

from __future__ import annotations

import logging
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fed_ros.core.strategies.aggregate import all_finite, sample_weights, weighted_rows
from fed_ros.core.strategies.streamed import robust_average, weighted_sums
from fed_ros.core.params import (
    Manifest,
    StateDict,
    flatten,
    manifest_from_json,
    manifest_of,
    manifest_to_json,
    num_params,
    unflatten,
)
from fed_ros.core.strategies.prepared_round import PreparedRound, prepare_round
from fed_ros.core.strategies.robust import RULES, aggregate_robust
from fed_ros.core.rounds.config import Membership, RobotInstruction, RoundConfig
from fed_ros.core.strategies.types import ClientDescriptor, ClientUpdate, RoundResult

log = logging.getLogger(__name__)


def _readonly(vec: NDArray[Any]) -> NDArray[Any]:
    vec.flags.writeable = False
    return vec


class Strategy(ABC):
    """Base class: keeps flat, read-only cluster models and robots' memberships."""

    name: str = "strategy"
    client_selects_cluster: bool = False
    descriptor_kind: str = "gaussian"  # what robots compute when needs_descriptors asks

    def __init__(
        self,
        *,
        robust: str = "mean",
        robust_kwargs: Mapping[str, Any] | None = None,
        local_epochs: int = 1,
        local_steps: int | None = None,
        lr: float | None = None,
        stack_updates: bool = False,
    ) -> None:
        if robust not in RULES:
            raise ValueError(f"robust rule {robust!r} not in {RULES}")
        self.robust = robust
        self.robust_kwargs = dict(robust_kwargs or {})
        # True: copy a round's K updates into one (K, P) array first (the reference path, K + 3
        # model sizes); False: read each update in place (C models + one block; the same bits).
        self.stack_updates = bool(stack_updates)
        # Local-training settings every robot is told (None: the robot's own); checked now.
        self.local_epochs, self.local_steps, self.lr = local_epochs, local_steps, lr
        RoundConfig(local_epochs=local_epochs, local_steps=local_steps, lr=lr)
        self._manifest: Manifest | None = None
        self._theta0: NDArray[Any] | None = None
        self._models: dict[int, NDArray[Any]] = {}
        self._assign: dict[str, Membership] = {}
        self._owners: list[NDArray[Any]] = []  # recent average buffers, recycled when unreferenced

    # ------------------------------------------------------------------ life cycle
    def initialize(self, initial: StateDict, robot_ids: Sequence[str]) -> None:
        """Set the common initial model theta^0 and the known robots."""
        self._manifest = manifest_of(initial)
        if not self._manifest:
            raise ValueError("initial state dict is empty")
        for rid in robot_ids:
            if not isinstance(rid, str) or not rid:
                raise ValueError(f"robot id {rid!r} is not a non-empty string")
        if len(set(robot_ids)) != len(list(robot_ids)):
            raise ValueError(f"duplicate robot ids in {list(robot_ids)}")
        theta0 = flatten(initial)
        if not np.isfinite(theta0).all():
            raise ValueError("initial model holds NaN/Inf values")
        self._theta0 = _readonly(theta0)
        self._models = {}
        self._assign = {}
        self._setup(list(robot_ids))

    def _setup(self, robot_ids: list[str]) -> None:
        """Default: one cluster 0 = theta^0, every robot in it."""
        self._models = {0: self.initial_vector}
        self._assign = {rid: [(0, 1.0)] for rid in robot_ids}

    @property
    def manifest(self) -> Manifest:
        """Manifest of the models (after initialize)."""
        if self._manifest is None:
            raise ValueError(f"{self.name}: initialize() has not been called")
        return self._manifest

    @property
    def initial_vector(self) -> NDArray[Any]:
        """The common initial model theta^0, flat (after initialize)."""
        if self._theta0 is None:
            raise ValueError(f"{self.name}: initialize() has not been called")
        return self._theta0

    def _require_init(self) -> None:
        if self._manifest is None:
            raise ValueError(f"{self.name}: initialize() has not been called")

    # ------------------------------------------------------------------ per round
    def configure_round(
        self, round_idx: int, robot_ids: Sequence[str]
    ) -> dict[str, RobotInstruction]:
        """Per participating robot: its membership (model(s) to start from) and round config."""
        self._require_init()
        config = self.round_config(round_idx)
        out = {}
        for rid in robot_ids:
            if rid not in self._assign:
                self._assign[rid] = self._new_robot(rid)
            out[rid] = RobotInstruction(list(self._assign[rid]), config)
        return out

    def _new_robot(self, robot_id: str) -> Membership:
        """Membership of a robot first seen in configure_round (default: largest cluster)."""
        return self.route(ClientDescriptor(robot_id=robot_id, kind="update"))

    def round_config(self, round_idx: int) -> RoundConfig:
        """What every robot must obey this round (subclasses add fields in `_config_fields`)."""
        return RoundConfig(**self._config_fields(round_idx))

    def _config_fields(self, round_idx: int) -> dict[str, Any]:
        """RoundConfig keyword values: training settings, descriptor kind, IFCA cluster pick."""
        return {
            "local_epochs": self.local_epochs,
            "local_steps": self.local_steps,
            "lr": self.lr,
            "descriptor_kind": self.descriptor_kind,
            "pick_cluster": self.client_selects_cluster,
        }

    def needs_descriptors(self, round_idx: int) -> set[str]:
        """Descriptor kinds the strategy needs before aggregating this round."""
        return set()

    def observe(self, round_idx: int, update: ClientUpdate) -> None:
        """An update the open round admitted, before the round closes. A strategy may start work
        here that needs no other robot's update; `aggregate_round` still receives every update
        and decides as if this had never been called (the default: nothing)."""

    @abstractmethod
    def aggregate_round(
        self,
        round_idx: int,
        updates: list[ClientUpdate],
        descriptors: Mapping[str, ClientDescriptor],
    ) -> RoundResult:
        """New cluster models and assignments from this round's updates."""

    # Whether the strategy can aggregate buffered (asynchronous) rounds, whose aggregations see
    # one cluster's few updates (fed_ros.core.rounds.buffered); why not, when it cannot.
    supports_buffered = True
    buffered_refusal = ""

    def aggregate_buffer(
        self,
        round_idx: int,
        updates: list[ClientUpdate],
        descriptors: Mapping[str, ClientDescriptor],
    ) -> RoundResult:
        """A buffered round's aggregation of one cluster's buffer (updates rebased onto their
        cluster's current model). The default is `aggregate_round`: right for strategies that
        average what they are given (FedAvg, FedProx, Local); a clustering strategy overrides
        it so that a buffer of a few robots never regroups the fleet."""
        return self.aggregate_round(round_idx, updates, descriptors)

    # ------------------------------------------------------------------ models
    def cluster_ids(self) -> list[int]:
        """Ids of the current cluster models."""
        return sorted(self._models)

    def cluster_models(self) -> dict[int, StateDict]:
        """Current cluster models as read-only state dicts (views, no copy)."""
        self._require_init()
        return {cid: unflatten(v, self.manifest) for cid, v in sorted(self._models.items())}

    def model_for(self, robot_id: str) -> StateDict:
        """Starting model of a robot: weighted mean of its clusters' models."""
        self._require_init()
        mem = self._assign.get(robot_id) or self.route(
            ClientDescriptor(robot_id=robot_id, kind="update")
        )
        return unflatten(self._mean_of(mem), self.manifest)

    def _mean_of(self, mem: Membership) -> NDArray[Any]:
        entries = [(c, w) for c, w in mem if w > 0]
        if not entries:
            raise ValueError(f"membership {mem} has no cluster with weight > 0")
        for c, _ in entries:
            if c not in self._models:
                raise ValueError(f"membership refers to unknown cluster {c}")
        if len(entries) == 1:
            return self._models[entries[0][0]]
        w = np.array([w for _, w in entries], dtype=np.float64)
        w /= w.sum()
        out = np.zeros_like(self.initial_vector)
        for (c, _), wc in zip(entries, w):
            out += np.float32(wc) * self._models[c]
        return _readonly(out)

    def route(self, descriptor: ClientDescriptor) -> Membership:
        """Membership for an unseen robot; default: the cluster with the most robots."""
        counts: dict[int, int] = {c: 0 for c in self._models}
        for mem in self._assign.values():
            for c, w in mem:
                if w > 0 and c in counts:
                    counts[c] += 1
        if not counts:
            raise ValueError(f"{self.name}: no cluster models yet")
        best = max(sorted(counts), key=lambda c: counts[c])
        return [(best, 1.0)]

    # ------------------------------------------------------------------ helpers

    def _prepare(self, round_idx: int, updates: Sequence[ClientUpdate]) -> PreparedRound:
        """Validate (manifest, sample counts, ids, rounds) and stack the updates once."""
        self._require_init()
        return prepare_round(self.name, round_idx, updates, self.manifest, stack=self.stack_updates)

    def _average_groups(
        self,
        prep: PreparedRound,
        groups: Sequence[Sequence[int]],
        references: Sequence[NDArray[Any]] | None = None,
    ) -> NDArray[Any]:
        """(G, P) averages of the given member-index groups.

        FedAvg: sample-weighted sums added in robot-id order (over the stacked array or reading
        each update in place, the same bits); otherwise the robust rule inside each group.
        """
        K, P = len(prep.robot_ids), num_params(self.manifest)
        for g, members in enumerate(groups):
            if len(members) == 0:
                raise ValueError(f"cluster group {g} is empty")
        if self.robust == "mean":
            W = np.zeros((len(groups), K), dtype=np.float64)
            for g, members in enumerate(groups):
                members = list(members)
                W[g, members] = sample_weights(
                    prep.num_samples[members], [prep.robot_ids[i] for i in members]
                )
            spare = self._spare_buffer((len(groups), P))
            if prep.stacked is not None:
                out = weighted_rows(prep.stacked, W.astype(np.float32), out=spare)
            else:
                out = weighted_sums(prep.params, W.astype(np.float32), self.manifest, out=spare)
            if not all_finite(out):
                # Weights are finite, so a non-finite average means a non-finite input.
                bad = prep.first_nonfinite()
                raise ValueError(
                    f"update of {prep.robot_ids[bad]!r} holds NaN/Inf values"
                    if bad >= 0
                    else "cluster average overflowed to Inf"
                )
            if out.base is None:  # only buffers that own their memory are recycled
                self._owners.append(out)
                del self._owners[:-3]
            return out
        out = np.empty((len(groups), P), dtype=np.float32)
        for g, members in enumerate(groups):
            members = list(members)
            kw = dict(self.robust_kwargs)
            if self.robust == "clip" and references is not None and "reference" not in kw:
                kw["reference"] = references[g]
            bad = prep.first_nonfinite(members)
            if bad >= 0:
                raise ValueError(f"update of {prep.robot_ids[members[bad]]!r} holds NaN/Inf values")
            w = sample_weights(prep.num_samples[members], [prep.robot_ids[i] for i in members])
            if prep.stacked is not None:
                out[g] = aggregate_robust(prep.stacked[members], w, self.robust, **kw)
            else:
                sds = [prep.updates[i].params for i in members]
                out[g] = robust_average(sds, w, self.manifest, self.robust, **kw)
        return out

    def _spare_buffer(self, shape: tuple[int, int]) -> NDArray[Any] | None:
        """A (G, P) buffer of an earlier round's averages that nothing references any more.

        Writing a fresh multi-MB result makes the kernel fault in and zero new pages, which at
        1M parameters costs about as much as the average itself. A buffer is recycled only when
        its reference count shows that no model, view or caller still holds it (every view of
        a row keeps the owner alive), so results handed out earlier never change.
        """
        for i in range(len(self._owners)):
            # References when unused: the list slot and getrefcount's argument (no loop variable).
            if self._owners[i].shape == shape and sys.getrefcount(self._owners[i]) == 2:
                return self._owners.pop(i)
        return None

    def _result(self, diagnostics: dict[str, Any]) -> RoundResult:
        diagnostics.setdefault("strategy", self.name)
        diagnostics.setdefault("robust", self.robust)
        return RoundResult(
            self.cluster_models(), {r: list(m) for r, m in self._assign.items()}, diagnostics
        )

    # ------------------------------------------------------------------ persistence
    def state(self) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
        """Arrays and JSON meta that fully restore the strategy (for ModelStore)."""
        self._require_init()
        arrays = {"theta0": self.initial_vector}
        for cid, vec in self._models.items():
            arrays[f"cluster/{cid}"] = vec
        arrays.update(self._extra_arrays())
        meta = {
            "name": self.name,
            "manifest": manifest_to_json(self.manifest),
            "assignments": {r: [[int(c), float(w)] for c, w in m] for r, m in self._assign.items()},
            "extra": self._extra_meta(),
        }
        return arrays, meta

    def load_state(self, arrays: Mapping[str, NDArray[Any]], meta: Mapping[str, Any]) -> None:
        """Restore from `state()` output; raises ValueError on a mismatched or malformed state."""
        if meta.get("name") != self.name:
            raise ValueError(f"state is for strategy {meta.get('name')!r}, not {self.name!r}")
        try:
            manifest = manifest_from_json(meta["manifest"])
            P = num_params(manifest)
            theta0 = np.asarray(arrays["theta0"], dtype=np.float32)
            models = {}
            for key, vec in arrays.items():
                if key.startswith("cluster/"):
                    models[int(key.split("/", 1)[1])] = np.array(vec, dtype=np.float32)
            assign = {
                str(r): [(int(c), float(w)) for c, w in m] for r, m in meta["assignments"].items()
            }
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed strategy state ({exc})") from None
        for cid, vec in list(models.items()) + [(-1, theta0)]:
            if vec.shape != (P,):
                raise ValueError(
                    f"state array for cluster {cid} has shape {vec.shape}, expected ({P},)"
                )
            if not np.isfinite(vec).all():
                raise ValueError(f"state array for cluster {cid} holds NaN/Inf values")
        self._manifest = manifest
        self._theta0 = _readonly(np.array(theta0))
        self._models = {c: _readonly(v) for c, v in models.items()}
        self._assign = assign
        self._load_extra(arrays, dict(meta.get("extra", {})))

    def _extra_arrays(self) -> dict[str, NDArray[Any]]:
        return {}

    def _extra_meta(self) -> dict[str, Any]:
        return {}

    def _load_extra(self, arrays: Mapping[str, NDArray[Any]], extra: dict[str, Any]) -> None:
        return None


STRATEGIES: dict[str, str] = {
    "local": "fed_ros.core.strategies.local:LocalStrategy",
    "fedavg": "fed_ros.core.strategies.fedavg:FedAvgStrategy",
    "fedprox": "fed_ros.core.strategies.fedavg:FedProxStrategy",
    "ifca": "fed_ros.core.strategies.ifca:IFCAStrategy",
    "feddrman": "fed_ros.core.strategies.feddrman:FedDRManStrategy",
    "fedepth": "fed_ros.core.strategies.fedepth:FeDepthStrategy",
    "rnd": "fed_ros.core.strategies.rnd:RNDStrategy",
}


def strategy_class(name: str) -> type:
    """The strategy class registered under ``name`` (ValueError naming the choices)."""
    import importlib

    key = str(name).lower()
    if key not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose from {sorted(STRATEGIES)}")
    module_name, cls_name = STRATEGIES[key].split(":")
    cls: type = getattr(importlib.import_module(module_name), cls_name)
    return cls


def accepted_settings(name: str) -> set[str]:
    """The keyword settings strategy ``name`` takes: the keyword-only arguments of every
    ``__init__`` along its class hierarchy."""
    import inspect

    accepted: set[str] = set()
    for klass in strategy_class(name).__mro__:
        if "__init__" in vars(klass) and klass is not object:
            params = inspect.signature(vars(klass)["__init__"]).parameters
            accepted |= {p for p, v in params.items() if v.kind == inspect.Parameter.KEYWORD_ONLY}
    return accepted


def make_strategy(name: str, **settings: Any) -> Strategy:
    """Build a strategy by name with keyword settings; unknown names/settings raise ValueError."""
    key = str(name).lower()
    cls = strategy_class(key)
    accepted = accepted_settings(key)
    unknown = sorted(set(settings) - accepted)
    if unknown:
        raise ValueError(
            f"strategy {key!r} does not take setting(s) {unknown}; accepted: {sorted(accepted)}"
        )
    strategy: Strategy = cls(**settings)
    return strategy
