"""What a strategy takes in and gives back (pure data, validated on construction).

:class:`ClientUpdate` (a robot's trained model for a round) and :class:`ClientDescriptor`
(what a robot reports about its data: FeDepth Gaussian, RND scores, ...) go into
:meth:`fed_ros.core.strategies.base.Strategy.aggregate_round`; :class:`RoundResult` (new cluster
models, every robot's membership, diagnostics) comes out. Re-exported by
:mod:`fed_ros.core.strategies.base`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fed_ros.core.params import StateDict
from fed_ros.core.rounds.config import Membership

DESCRIPTOR_KINDS = ("gaussian", "rnd", "update", "embedding")


@dataclass
class ClientUpdate:
    """A robot's locally trained model for one round."""

    robot_id: str
    params: StateDict
    num_samples: int
    base_round: int
    cluster_id: int = -1
    metrics: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.robot_id, str) or not self.robot_id:
            raise ValueError(f"robot_id must be a non-empty string, got {self.robot_id!r}")
        if (
            not isinstance(self.num_samples, (int, np.integer))
            or isinstance(self.num_samples, bool)
            or self.num_samples < 0
        ):
            raise ValueError(
                f"num_samples of {self.robot_id!r} is {self.num_samples!r}; must be an int >= 0"
            )
        if not isinstance(self.base_round, (int, np.integer)) or self.base_round < 0:
            raise ValueError(
                f"base_round of {self.robot_id!r} is {self.base_round!r}; must be an int >= 0"
            )
        if not isinstance(self.cluster_id, (int, np.integer)) or self.cluster_id < -1:
            raise ValueError(
                f"cluster_id of {self.robot_id!r} is {self.cluster_id!r}; must be an int >= -1"
            )
        if not isinstance(self.params, Mapping):
            raise ValueError(f"params of {self.robot_id!r} must be a state dict")


@dataclass
class ClientDescriptor:
    """What a robot reports about its data (FeDepth Gaussian, RND scores, ...)."""

    robot_id: str
    kind: str
    mean: NDArray[Any] | None = None
    variance: NDArray[Any] | None = None
    num_samples: int = 0
    scores: dict[str, float] = field(default_factory=dict)
    residual_std: float = math.nan
    payload: bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.robot_id, str) or not self.robot_id:
            raise ValueError(
                f"descriptor robot_id must be a non-empty string, got {self.robot_id!r}"
            )
        if self.kind not in DESCRIPTOR_KINDS:
            raise ValueError(f"descriptor kind {self.kind!r} not in {DESCRIPTOR_KINDS}")
        if not isinstance(self.num_samples, (int, np.integer)) or self.num_samples < 0:
            raise ValueError(
                f"descriptor num_samples of {self.robot_id!r} is {self.num_samples!r}; must be >= 0"
            )
        if self.kind == "gaussian":
            if self.mean is None or self.variance is None:
                raise ValueError(
                    f"gaussian descriptor of {self.robot_id!r} needs mean and variance"
                )
            m = np.asarray(self.mean, dtype=np.float64)
            v = np.asarray(self.variance, dtype=np.float64)
            if m.ndim != 1 or v.shape != m.shape or m.size == 0:
                raise ValueError(
                    f"gaussian descriptor of {self.robot_id!r}: mean {m.shape} / variance "
                    f"{v.shape} must be equal-length 1-D"
                )
            if not (np.isfinite(m).all() and np.isfinite(v).all()):
                raise ValueError(f"gaussian descriptor of {self.robot_id!r} holds NaN/Inf")
            if (v <= 0).any():
                raise ValueError(f"gaussian descriptor of {self.robot_id!r} has variance <= 0")
        if self.kind == "rnd":
            for peer, s in self.scores.items():
                if not isinstance(peer, str) or not math.isfinite(float(s)) or float(s) < 0:
                    raise ValueError(
                        f"rnd descriptor of {self.robot_id!r}: score for {peer!r} is {s!r}; "
                        "must be finite and >= 0"
                    )
            if not math.isfinite(float(self.residual_std)) or self.residual_std < 0:
                raise ValueError(
                    f"rnd descriptor of {self.robot_id!r}: residual_std {self.residual_std!r} "
                    "must be finite and >= 0"
                )


@dataclass
class RoundResult:
    """New cluster models, every known robot's membership, and diagnostics (JSON-friendly)."""

    cluster_models: dict[int, StateDict]
    assignments: dict[str, Membership]
    diagnostics: dict[str, Any]
