"""Closed-loop evaluation of a policy in-process (the fast path; the ROS path is in fed_ros.ros)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np
from tqdm.auto import tqdm

from fed_ros.sim.collect import STREAM_EVALUATE, episode_seed, run_episode
from fed_ros.sim.envs import TASKS, ArmEnv, Variation, make_env

__all__ = ["Policy", "EvalResult", "evaluate"]


class Policy(Protocol):
    """What evaluation drives: ``reset()`` per episode, ``act(obs) -> (4,)`` per step."""

    def reset(self) -> None: ...

    def act(self, obs: dict[str, Any]) -> np.ndarray: ...


@dataclass
class EvalResult:
    """Per-task outcome of seeded evaluation episodes."""

    task: str
    variation: str
    success_rate: float
    successes: list[bool]
    episode_lengths: list[int] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able summary."""
        return {
            "task": self.task,
            "variation": self.variation,
            "success_rate": self.success_rate,
            "successes": list(map(bool, self.successes)),
            "episode_lengths": self.episode_lengths,
            "seeds": self.seeds,
        }


def evaluate(
    policy: "Policy | Callable[[], Policy]",
    task: str,
    variation: str | Variation = "default",
    episodes: int = 10,
    seed: int = 0,
    cameras: bool = True,
    max_steps: int | None = None,
    image_size: int = 84,
    env: ArmEnv | None = None,
) -> EvalResult:
    """Run ``episodes`` seeded episodes; the policy's observations include ``"instruction"``.

    ``policy`` is an object with ``reset``/``act`` or a zero-argument factory returning one.
    Seeds come from a stream disjoint from demonstration collection with the same ``seed``.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; known: {list(TASKS)}")
    if not isinstance(episodes, (int, np.integer)) or episodes <= 0:
        raise ValueError(f"episodes must be a positive int, got {episodes!r}")
    if not hasattr(policy, "act"):
        if not callable(policy):
            raise ValueError(f"policy must have act()/reset() or be a factory, got {policy!r}")
        policy = policy()
    for name in ("act", "reset"):
        if not callable(getattr(policy, name, None)):
            raise ValueError(f"policy {policy!r} has no callable {name}()")
    own_env = env is None
    if env is None:
        env = make_env(task, variation, cameras=cameras, image_size=image_size, seed=seed)
    elif env.task != task:
        raise ValueError(f"env runs task {env.task!r} but {task!r} was requested")
    successes: list[bool] = []
    lengths: list[int] = []
    seeds: list[int] = []
    # A bar with an ETA in a terminal; nothing in logs and CI (tqdm's disable=None: not a TTY).
    bar = tqdm(total=int(episodes), desc=f"evaluation {task}", unit="ep", leave=False, disable=None)
    try:
        for i in range(int(episodes)):
            reset_seed = episode_seed(seed, i, STREAM_EVALUATE)
            _, _, success = run_episode(env, policy, reset_seed, max_steps=max_steps, record=False)
            successes.append(bool(success))
            lengths.append(env.steps)
            seeds.append(reset_seed)
            bar.update(1)
    finally:
        bar.close()
        if own_env:
            env.close()
    return EvalResult(
        task=task,
        variation=env.variation.name,
        success_rate=float(np.mean(successes)),
        successes=successes,
        episode_lengths=lengths,
        seeds=seeds,
    )
