"""The server's round settings: timing, quorum, attempts and closed-loop evaluation.

One frozen value the server builds from its parameters (``fed_ros.ros.nodes.server.config``)
and hands to the round coordinator (:mod:`fed_ros.core.rounds.coordinator`), which reads it
for every announcement and every close. It stands alone because it is the contract between
the two: every bound is checked here, once, when it is built, so a misconfigured server
fails at start-up rather than in the middle of a round.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fed_ros.core.rounds.buffered import BufferSettings
from fed_ros.core.rounds.collect import quorum_for


@dataclass(frozen=True)
class RoundSettings:
    """Round timing and quorum (from the server parameters)."""

    algorithm: str
    rounds: int
    quorum_fraction: float = 0.75
    min_quorum: int = 1
    round_timeout_s: float = 600.0
    max_attempts: int = 3
    max_samples: int = 1_000_000
    evaluate_every: int = 0  # rounds between closed-loop evaluations (0 = never)
    eval_timeout_s: float = 600.0
    eval_episodes: int = 2  # episodes per task a robot runs in an EVALUATE stage
    # Asynchronous buffered rounds (FedBuff, fed_ros.core.rounds.buffered); off by default.
    buffer: BufferSettings = field(default_factory=BufferSettings)

    def __post_init__(self) -> None:
        if self.evaluate_every < 0:
            raise ValueError(f"evaluate_every must be >= 0, got {self.evaluate_every}")
        if self.eval_timeout_s <= 0:
            raise ValueError(f"eval_timeout_s must be > 0, got {self.eval_timeout_s}")
        if self.eval_episodes < 1:
            raise ValueError(f"eval_episodes must be >= 1, got {self.eval_episodes}")
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")
        if self.round_timeout_s <= 0:
            raise ValueError(f"round_timeout_s must be > 0, got {self.round_timeout_s}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        quorum_for(1, self.quorum_fraction, self.min_quorum)  # validates both
