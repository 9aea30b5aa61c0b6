"""What the fleet server's parameters mean to the core: strategy settings and round settings.

Pure functions of :class:`fed_ros.ros.configuration.fleet_params.ServerParams` (no ROS): the keyword
settings ``make_strategy`` gets, the coordinator's :class:`RoundSettings`, and which of those a live
``ros2 param set`` changes. They stand alone so the server node only wires their results in,
and the mapping from parameters to core objects is read (and changed) in one place.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fed_ros.core.rounds.liveness import LivenessSettings
from fed_ros.core.rounds.buffered import BufferSettings
from fed_ros.core.rounds.settings import RoundSettings
from fed_ros.core.strategies.base import accepted_settings
from fed_ros.ros.configuration.fleet_params import ServerParams


def strategy_settings(algorithm: str, params: ServerParams) -> dict[str, Any]:
    """make_strategy keyword settings: ``strategy.*`` parameters, plus num_clusters if accepted."""
    settings = {
        k[len("strategy.") :]: v for k, v in params.extra.items() if k.startswith("strategy.")
    }
    accepted = accepted_settings(algorithm)
    for key in ("num_clusters", "C"):
        if key in accepted and key not in settings:
            settings[key] = params.num_clusters
            break
    return settings


def round_settings(params: ServerParams) -> RoundSettings:
    """The coordinator's round timing, quorum and evaluation settings at start-up."""
    return RoundSettings(
        algorithm=params.algorithm,
        rounds=params.rounds,
        quorum_fraction=params.quorum_fraction,
        min_quorum=params.min_quorum,
        round_timeout_s=params.round_timeout_s,
        max_attempts=params.max_attempts,
        max_samples=params.max_samples,
        evaluate_every=params.evaluate_every,
        eval_timeout_s=params.eval_timeout_s,
        eval_episodes=params.eval_episodes,
        buffer=BufferSettings(
            buffer_size=params.buffer_size,
            max_staleness=params.max_staleness,
            staleness=params.staleness,
            staleness_exponent=params.staleness_exponent,
            sync_rounds=params.buffer_sync_rounds,
        ),
    )


def liveness_settings(params: ServerParams) -> LivenessSettings:
    """The heartbeat rules (deadline extensions) from the server parameters."""
    return LivenessSettings(
        heartbeat_timeout_s=params.heartbeat_timeout_s,
        max_extension_s=params.max_deadline_extension_s,
        heartbeat_step_budget=params.heartbeat_step_budget,
    )


def live_round_settings(settings: RoundSettings, params: ServerParams) -> RoundSettings:
    """``settings`` after a live parameter change: round timing and evaluation, from the next
    stage on (the algorithm, rounds and quorum stay as the server started)."""
    return dataclasses.replace(
        settings,
        round_timeout_s=params.round_timeout_s,
        evaluate_every=params.evaluate_every,
        eval_timeout_s=params.eval_timeout_s,
        eval_episodes=params.eval_episodes,
    )
