"""Closed-loop evaluation of a policy through a running bridge (the real path over ROS;
``fed_ros.sim.evaluate`` is the in-process fast path): seeded resets, one :class:`ArmClient`
episode after another, the same episode seeds as the in-process evaluation, so a lockstep
bridge reproduces its rollouts. It stands apart from the client because it owns a node of its
own (``spun_node``) and the evaluation's bookkeeping; the robot node drives its arm with the
client directly (:func:`fed_ros.ros.arm.driving.run_policy`).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from fed_ros.ros.arm.arm_client import ArmClient, EpisodeOutcome
from fed_ros.ros.spun_node import spun_node


def as_policy(policy: Any):
    if hasattr(policy, "act"):
        return policy
    if callable(policy):
        return policy()
    raise ValueError(f"policy must have act()/reset() or be a factory, got {policy!r}")


def evaluate_through_bridge(
    policy: Any,
    task: str,
    variation: str = "default",
    episodes: int = 10,
    seed: int = 0,
    namespace: str = "",
    cameras: bool = True,
    episode_timeout: float = 120.0,
    connect_timeout: float = 60.0,
    progress: Callable[[int, EpisodeOutcome], None] | None = None,
):
    """Evaluate ``policy`` closed loop through a running bridge; returns an ``EvalResult``.

    Episode seeds are the ones ``fed_ros.sim.evaluate.evaluate`` uses, so with a lockstep
    bridge the two paths run the same episodes.
    """
    from fed_ros.sim.collect import STREAM_EVALUATE, episode_seed
    from fed_ros.sim.evaluate import EvalResult

    if not isinstance(episodes, int) or episodes <= 0:
        raise ValueError(f"episodes must be a positive int, got {episodes!r}")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed!r}")
    policy = as_policy(policy)
    successes, lengths, seeds = [], [], []
    with spun_node("bridge_eval") as node:
        client = ArmClient(node, namespace=namespace, cameras=cameras, source="policy")
        try:
            client.wait_for_arm(connect_timeout)
            for i in range(episodes):
                reset_seed = episode_seed(seed, i, STREAM_EVALUATE)
                _, episode = client.reset(task=task, variation=variation, seed=reset_seed)
                outcome = client.run_episode(policy, episode, timeout=episode_timeout)
                successes.append(outcome.success)
                lengths.append(outcome.steps)
                seeds.append(reset_seed)
                if progress is not None:
                    progress(i, outcome)
        finally:
            client.destroy()
    return EvalResult(
        task=task,
        variation=variation,
        success_rate=float(np.mean(successes)),
        successes=successes,
        episode_lengths=lengths,
        seeds=seeds,
    )
