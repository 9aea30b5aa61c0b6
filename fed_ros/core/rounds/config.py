"""What a robot must obey in one round: the strategy's instructions (Flower's ``FitIns.config``).

A strategy's `configure_round` returns, per robot, a `RobotInstruction`: the cluster
membership (which model(s) it starts from) and a `RoundConfig`. The announcement carries
both to every robot (``ClusterMembership.config``), and the client
(`fed_ros.learning.client.RobotClient`) obeys only the config: nothing on a robot, and
nothing in the benchmark, branches on the algorithm's name.

Optional fields (``lr``, ``local_steps``, ``eval_episodes``) left unset mean "the robot's
own setting"; everything else is decided by the strategy. Pure Python (no numpy).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

ROUND_CONFIG_VERSION = 1
DESCRIBE_KINDS = ("gaussian", "rnd")  # what a robot can compute in a DESCRIBE stage

# FedDRMan's local objective as the paper sets it (Sec. IV): L_sub and L_act on, weighted
# 0.03 / 0.005. Written only here: `TrainerConfig` (fed_ros.learning.trainer) and `FedDRManStrategy`
# default to it. A RoundConfig takes the weights but leaves both terms off by default
# (ROUND_CONFIG_DISTILLS): it is what every strategy sends, and only FedDRMan asks for distillation
# (explicitly, from these defaults).
PAPER_USE_SUB = True
PAPER_USE_ACT = True
PAPER_LAMBDA_SUB = 0.03
PAPER_LAMBDA_ACT = 0.005
ROUND_CONFIG_DISTILLS = False  # plain behaviour cloning unless the strategy switches a term on

Membership = list[tuple[int, float]]


def _number(name: str, value: Any, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"round config {name} must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ValueError(
            f"round config {name} must be {'> 0' if positive else '>= 0'}, got {value!r}"
        )
    return float(value)


def _count(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"round config {name} must be an int >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True)
class RoundConfig:
    """Everything a robot must obey this round (validated; ``to_dict``/``from_dict`` versioned).

    Attributes:
        prox_mu: FedProx proximal weight (0 = off).
        use_sub / use_act: FedDRMan distillation terms L_sub / L_act (off unless the strategy asks).
        lambda_sub / lambda_act: their weights (the paper's by default).
        local_epochs: full passes over the local data (when ``local_steps`` is unset; the
            robot's own ``train_max_steps`` may cap them).
        local_steps: exactly this many optimiser steps (None: ``local_epochs`` epochs).
        lr: learning rate (None: the robot's own ``train_lr``).
        descriptor_kind: what to compute in a DESCRIBE stage ("gaussian" or "rnd").
        pick_cluster: IFCA: evaluate every listed cluster model, train the lowest-loss one.
        eval_episodes: closed-loop episodes per task in an EVALUATE stage (None: the robot's own).
    """

    prox_mu: float = 0.0
    use_sub: bool = ROUND_CONFIG_DISTILLS
    use_act: bool = ROUND_CONFIG_DISTILLS
    lambda_sub: float = PAPER_LAMBDA_SUB
    lambda_act: float = PAPER_LAMBDA_ACT
    local_epochs: int = 1
    local_steps: int | None = None
    lr: float | None = None
    descriptor_kind: str = "gaussian"
    pick_cluster: bool = False
    eval_episodes: int | None = None
    version: int = field(default=ROUND_CONFIG_VERSION)

    def __post_init__(self) -> None:
        if self.version != ROUND_CONFIG_VERSION:
            raise ValueError(
                f"round config version {self.version!r} is not supported "
                f"(this robot understands version {ROUND_CONFIG_VERSION})"
            )
        for name in ("prox_mu", "lambda_sub", "lambda_act"):
            object.__setattr__(self, name, _number(name, getattr(self, name)))
        for name in ("use_sub", "use_act", "pick_cluster"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"round config {name} must be a bool, got {getattr(self, name)!r}")
        _count("local_epochs", self.local_epochs, 1)
        if self.local_steps is not None:
            _count("local_steps", self.local_steps, 1)
        if self.lr is not None:
            object.__setattr__(self, "lr", _number("lr", self.lr, positive=True))
        if self.eval_episodes is not None:
            _count("eval_episodes", self.eval_episodes, 1)
        if self.descriptor_kind not in DESCRIBE_KINDS:
            raise ValueError(
                f"round config descriptor_kind {self.descriptor_kind!r} not in {DESCRIBE_KINDS}"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (with ``version``)."""
        return asdict(self)

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> "RoundConfig":
        """Inverse of :meth:`to_dict`; unknown versions and unknown keys raise ValueError."""
        if not isinstance(data, Mapping):
            raise ValueError(f"round config must be a mapping, got {type(data).__name__}")
        if data.get("version") != ROUND_CONFIG_VERSION:
            raise ValueError(
                f"round config version {data.get('version')!r} is not supported "
                f"(this robot understands version {ROUND_CONFIG_VERSION})"
            )
        known = set(RoundConfig.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"round config has unknown key(s) {unknown}")
        return RoundConfig(**dict(data))


@dataclass(frozen=True)
class RobotInstruction:
    """One robot's part of a round: the cluster model(s) it starts from and its round config."""

    membership: Membership
    config: RoundConfig = field(default_factory=RoundConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.config, RoundConfig):
            raise ValueError(
                f"instruction config must be a RoundConfig, got {type(self.config).__name__}"
            )
        if not self.membership or not any(w > 0 for _, w in self.membership):
            raise ValueError(f"membership {self.membership!r} has no cluster with weight > 0")
