"""Closed-loop evaluation of `fed-ros bench federation`: seeded MuJoCo rollouts of the robots'
models.

:class:`Evaluator` rolls each (model, family) pair out once (identical models are found by
digest) in cached environments, through the family's arm: :class:`OffsetCellPolicy` for a
work cell offset, :class:`MirroredPolicy` for a mirrored mount; it counts wall and CPU
seconds and every rollout's length.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, Sequence

import numpy as np

from fed_ros.bench.federation.demos import offset_observations
from fed_ros.bench.federation.settings import Family, Setting


class MirroredPolicy:
    """Closed-loop adapter of a mirrored-mount arm: policy x/y commands are negated."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def reset(self) -> None:
        """Start a new episode."""
        self.policy.reset()

    def act(self, obs: dict[str, Any]) -> np.ndarray:
        """Policy action expressed in the mirrored arm's own frame."""
        a = np.array(self.policy.act(obs), dtype=np.float32)
        a[:2] *= -1.0
        return a


class OffsetCellPolicy:
    """Closed-loop adapter of an arm in an offset work cell: observations shifted as in its
    demos."""

    def __init__(self, policy: Any, task: str, offset: Sequence[float]) -> None:
        self.policy, self.task, self.offset = policy, task, tuple(offset)

    def reset(self) -> None:
        """Start a new episode."""
        self.policy.reset()

    def act(self, obs: dict[str, Any]) -> np.ndarray:
        """Policy action for the observation expressed in the offset cell."""
        return self.policy.act(offset_observations(obs, self.task, self.offset))


def _digest(sd: dict[str, np.ndarray]) -> str:
    h = hashlib.sha1()
    for k in sorted(sd):
        h.update(k.encode())
        h.update(np.ascontiguousarray(sd[k]).tobytes())
    return h.hexdigest()


class Evaluator:
    """Seeded closed-loop evaluation; identical (model, family) pairs are rolled out once."""

    def __init__(
        self, policy_cfg: Any, episodes: int, seed: int, max_steps: dict[str, int] | None = None
    ) -> None:
        self.policy_cfg = policy_cfg
        self.episodes = int(episodes)
        self.seed = int(seed)
        self.max_steps = dict(max_steps or {})  # per family name; absent -> the task's horizon
        self.cameras = (
            policy_cfg.kind == "image"
        )  # an image policy is rolled out on rendered frames
        self._envs: dict[tuple[str, str], Any] = {}
        self.seconds = 0.0
        self.cpu_seconds = 0.0
        # (family, success, control steps) of every rollout: shows how long successful
        # rollouts take, which is what an evaluation horizon must leave room for.
        self.rollouts: list[tuple[str, bool, int]] = []

    def _env(self, task: str, variation: str) -> Any:
        key = (task, variation)
        if key not in self._envs:
            from fed_ros.sim.envs import make_env

            self._envs[key] = make_env(
                task,
                variation,
                cameras=self.cameras,
                seed=self.seed,
                image_size=self.policy_cfg.image_size,
            )
        return self._envs[key]

    def family_success(self, sd: dict[str, np.ndarray], family: Family) -> float:
        """Success rate of one model on one family (seeded rollouts, the robots'
        `evaluate_policy`)."""
        from fed_ros.learning.client import evaluate_policy
        from fed_ros.sim.evaluate import evaluate

        def rollout(runner: Any) -> Any:
            if any(family.cell_offset):
                runner = OffsetCellPolicy(runner, family.task, family.cell_offset)
            if family.mirrored:
                runner = MirroredPolicy(runner)
            return evaluate(
                runner,
                family.task,
                family.variation,
                episodes=self.episodes,
                seed=self.seed,
                cameras=self.cameras,
                env=self._env(family.task, family.variation),
                max_steps=self.max_steps.get(family.name),
            )

        t0, c0 = time.perf_counter(), time.process_time()
        res = evaluate_policy(sd, self.policy_cfg, rollout, "cpu", sample=True, seed=self.seed)
        self.seconds += time.perf_counter() - t0
        self.cpu_seconds += time.process_time() - c0
        self.rollouts += [
            (family.name, bool(ok), int(n)) for ok, n in zip(res.successes, res.episode_lengths)
        ]
        return float(res.success_rate)

    def evaluate_fleet(
        self, setting: Setting, models: dict[str, dict[str, np.ndarray]]
    ) -> dict[str, Any]:
        """Per robot: success on each family it has data of; per family: mean over robots."""
        cache: dict[tuple[str, str], float] = {}
        per_robot: dict[str, dict[str, float]] = {}
        for rid, mix in zip(setting.robot_ids, setting.robots):
            digest = _digest(models[rid])
            per_robot[rid] = {}
            for fam_name, _ in mix:
                key = (digest, fam_name)
                if key not in cache:
                    cache[key] = self.family_success(models[rid], setting.family(fam_name))
                per_robot[rid][fam_name] = cache[key]
        per_family: dict[str, float] = {}
        for f in setting.families:
            vals = [v[f.name] for v in per_robot.values() if f.name in v]
            if vals:
                per_family[f.name] = float(np.mean(vals))
        robot_means = [float(np.mean(list(v.values()))) for v in per_robot.values()]
        return {
            "per_robot": per_robot,
            "per_family": per_family,
            "mean": float(np.mean(robot_means)),
            "rollouts": len(cache) * self.episodes,
        }

    def close(self) -> None:
        """Close cached environments."""
        for env in self._envs.values():
            env.close()
        self._envs.clear()
