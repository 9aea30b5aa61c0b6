"""Demonstration collection with the scripted experts (in-process, no ROS).

Each episode pairs the observation seen *before* a step with the action taken at that
step, so ``observations[k][t]`` and ``actions[t]`` line up as a policy sees them. Failed
episodes are kept and flagged ``success=False`` (training excludes them), never dropped.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from tqdm.auto import tqdm

from fed_ros.core.data.episode import Episode, IMAGE_KEYS, LOWDIM_KEYS
from fed_ros.sim.envs import TASKS, ArmEnv, Variation, make_env
from fed_ros.sim.experts import make_expert

__all__ = ["collect_demos", "run_episode", "episode_seed", "save_episodes", "collect_to_directory"]

# Separate seed streams so a robot's evaluation episodes never replay its training scenes.
STREAM_COLLECT = 0
STREAM_EVALUATE = 1


def episode_seed(seed: int, index: int, stream: int = STREAM_COLLECT) -> int:
    """Reset seed of episode ``index`` in a run seeded with ``seed`` (non-overlapping runs)."""
    if seed < 0 or index < 0:
        raise ValueError(f"seed and index must be non-negative, got seed={seed!r} index={index!r}")
    return int(
        np.random.SeedSequence([int(seed), int(stream), int(index)]).generate_state(1)[0] >> 1
    )


def run_episode(
    env: ArmEnv, policy, reset_seed: int, max_steps: int | None = None, record: bool = True
) -> tuple[dict[str, np.ndarray], np.ndarray, bool]:
    """Roll ``policy`` (``reset()``, ``act(obs)``) once; returns (observations, actions,
    success)."""
    limit = env.horizon if max_steps is None else int(max_steps)
    if limit <= 0:
        raise ValueError(f"max_steps must be positive, got {max_steps!r}")
    obs = env.reset(seed=reset_seed)
    policy.reset()
    keys = [k for k in (*IMAGE_KEYS, *LOWDIM_KEYS) if k in obs]
    frames: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    actions: list[np.ndarray] = []
    success = False
    instruction = env.instruction
    for _ in range(limit):
        policy_obs: dict[str, Any] = dict(obs)
        policy_obs["instruction"] = instruction
        action = env.check_action(policy.act(policy_obs))
        if record:
            for k in keys:
                frames[k].append(obs[k])
            actions.append(action.astype(np.float32))
        obs, done, success = env.step(action)
        if done:
            break
    observations = {k: np.stack(v) for k, v in frames.items()} if record else {}
    return observations, (np.stack(actions) if record else np.zeros((0, 4), np.float32)), success


def collect_demos(
    task: str,
    variation: str | Variation = "default",
    n: int = 10,
    seed: int = 0,
    cameras: bool = True,
    noise_std: float = 0.0,
    image_size: int = 84,
    robot_id: str = "",
    env: ArmEnv | None = None,
    progress: Callable[[int, Episode], None] | None = None,
) -> list[Episode]:
    """``n`` expert demonstrations of ``task`` under ``variation`` (seeded, reproducible)."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; known: {list(TASKS)}")
    if not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    own_env = env is None
    if env is None:
        env = make_env(task, variation, cameras=cameras, image_size=image_size, seed=seed)
    elif env.task != task:
        raise ValueError(f"env runs task {env.task!r} but {task!r} was requested")
    expert = make_expert(task, noise_std=noise_std, seed=seed, variation=env.variation)
    episodes: list[Episode] = []
    # A bar with an ETA in a terminal; nothing in logs and CI (tqdm's disable=None: not a TTY).
    bar = tqdm(total=n, desc=f"demonstrations {task}", unit="demo", leave=False, disable=None)
    try:
        for i in range(n):
            reset_seed = episode_seed(seed, i)
            started = time.perf_counter()
            observations, actions, success = run_episode(env, expert, reset_seed)
            episode = Episode(
                task=task,
                instruction=env.instruction,
                observations=observations,
                actions=actions,
                variation=env.variation.name,
                robot_id=robot_id,
                success=bool(success),
                metadata={
                    "source": expert.source,
                    "reset_seed": str(reset_seed),
                    "run_seed": str(seed),
                    "index": str(i),
                    "noise_std": repr(float(noise_std)),
                    "control_hz": str(env.control_hz),
                    "variation_json": json.dumps(env.variation.to_dict()),
                    "wall_s": f"{time.perf_counter() - started:.3f}",
                },
            )
            episodes.append(episode)
            bar.update(1)
            if progress is not None:
                progress(i, episode)
    finally:
        bar.close()
        if own_env:
            env.close()
    return episodes


def save_episodes(
    episodes: list[Episode], directory: str | Path, prefix: str = "demo"
) -> list[Path]:
    """Write episodes as ``<prefix>_<i>.npz`` into ``directory`` (created if missing)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    return [ep.save(out / f"{prefix}_{i:05d}.npz") for i, ep in enumerate(episodes)]


def collect_to_directory(
    task: str,
    out: str | Path,
    variation: str | Variation = "default",
    n: int = 10,
    seed: int = 0,
    cameras: bool = True,
    noise_std: float = 0.0,
    image_size: int = 84,
    robot_id: str = "",
) -> int:
    """Collect ``n`` demonstrations, printing each episode, and save them under ``out``."""

    def report(i: int, ep: Episode) -> None:
        print(f"episode {i}: {len(ep)} steps success={ep.success}", flush=True)

    episodes = collect_demos(
        task,
        variation,
        n,
        seed,
        cameras=cameras,
        noise_std=noise_std,
        image_size=image_size,
        robot_id=robot_id,
        progress=report,
    )
    paths = save_episodes(episodes, out)
    ok = sum(ep.success for ep in episodes)
    print(f"wrote {len(paths)} episodes to {out} ({ok}/{len(episodes)} successful)")
    return 0
