"""Demonstrations of `fed-ros bench federation`: cached scripted-expert pools, as each arm family
records them.

:class:`DemoCache` generates (once) and caches seeded expert demos per (task, variation) as
Episode ``.npz`` and hands each robot of a setting its disjoint slices; a family's arm sees
them through :func:`family_episode`: shifted to its work cell (:func:`offset_episode`,
absolute positions only) and with x/y commands negated on a mirrored mount (:func:`mirror_episode`).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from fed_ros.bench.federation.settings import Family, Setting
from fed_ros.core.data.episode import EEF_POS, Episode, OBJECT_STATE

log = logging.getLogger("fed_ros.bench.federation")


def mirror_episode(ep: Episode) -> Episode:
    """The same demo as commanded by a mirrored-mount arm (x/y end-effector deltas negated)."""
    actions = ep.actions.copy()
    actions[:, :2] *= -1.0
    return Episode(
        task=ep.task,
        instruction=ep.instruction,
        observations=ep.observations,
        actions=actions,
        variation=ep.variation,
        robot_id=ep.robot_id,
        success=ep.success,
        metadata=dict(ep.metadata, mirrored="1"),
    )


# Object-state entries holding absolute base-frame positions (fed_ros.sim.envs._object_state:
# per object position(3), quaternion(4), eef->object vector(3); pick_place_can appends the
# bin position at 10). Vectors between things do not move with a work-cell offset.
_OBJECT_POSITION_SLOTS = {"lift": (0,), "stack": (0, 10), "pick_place_can": (0, 10)}


def offset_observations(
    obs: dict[str, np.ndarray], task: str, offset: Sequence[float]
) -> dict[str, np.ndarray]:
    """Observations (one frame or a (T, ...) stack) seen from a work cell offset by ``offset`` m."""
    if task not in _OBJECT_POSITION_SLOTS:
        raise ValueError(
            f"no work-cell offset defined for task {task!r}; known: "
            f"{sorted(_OBJECT_POSITION_SLOTS)}"
        )
    off = np.asarray(offset, dtype=np.float32)
    out = dict(obs)
    out[EEF_POS] = np.asarray(obs[EEF_POS]) + off
    state = np.array(obs[OBJECT_STATE], dtype=np.float32, copy=True)
    for s in _OBJECT_POSITION_SLOTS[task]:
        state[..., s : s + 3] += off
    out[OBJECT_STATE] = state
    return out


def offset_episode(ep: Episode, offset: Sequence[float]) -> Episode:
    """The same demo recorded in a work cell offset by ``offset`` (absolute positions shifted)."""
    return Episode(
        task=ep.task,
        instruction=ep.instruction,
        observations=offset_observations(ep.observations, ep.task, offset),
        actions=ep.actions,
        variation=ep.variation,
        robot_id=ep.robot_id,
        success=ep.success,
        metadata=dict(ep.metadata, cell_offset=",".join(f"{v:g}" for v in offset)),
    )


def family_episode(ep: Episode, family: Family) -> Episode:
    """A pool demo as the family's arm records it (work-cell offset, mirrored commands)."""
    if any(family.cell_offset):
        ep = offset_episode(ep, family.cell_offset)
    return mirror_episode(ep) if family.mirrored else ep


class DemoCache:
    """Scripted-expert demos cached as Episode .npz under ``root`` (without cameras unless a
    setting asks for them: its own pool directory)."""

    def __init__(self, root: str | Path, noise_std: float = 0.05, data_seed: int = 1000) -> None:
        self.root = Path(root)
        self.noise_std = float(noise_std)
        self.data_seed = int(data_seed)
        self._mem: dict[tuple[str, str, bool], list[Episode]] = {}

    def _dir(self, task: str, variation: str, cameras: bool = False) -> Path:
        cams = "__cam84" if cameras else ""  # camera demos: two 84x84 images per step
        return (
            self.root / f"{task}__{variation}__noise{self.noise_std:g}__seed{self.data_seed}{cams}"
        )

    def pool(self, task: str, variation: str, n: int, cameras: bool = False) -> list[Episode]:
        """At least ``n`` successful demos of (task, variation), generating missing ones once."""
        key = (task, variation, cameras)
        have = self._mem.get(key)
        if have is not None and len(have) >= n:
            return have[:n]
        d = self._dir(task, variation, cameras)
        files = sorted(d.glob("demo_*.npz")) if d.is_dir() else []
        eps = [Episode.load(f) for f in files]
        ok = [e for e in eps if e.success]
        if len(ok) < n:
            from fed_ros.sim.collect import collect_demos

            # Generate in one seeded batch with headroom for expert failures; appended
            # files keep indices so reruns reproduce the same pool.
            want = n - len(ok)
            extra = max(2, int(math.ceil(want * 0.25)))
            t0 = time.perf_counter()
            new = collect_demos(
                task,
                variation,
                n=want + extra,
                seed=self.data_seed + len(eps),
                cameras=cameras,
                noise_std=self.noise_std,
            )
            d.mkdir(parents=True, exist_ok=True)
            for i, e in enumerate(new):
                e.save(d / f"demo_{len(eps) + i:05d}.npz")
            log.info(
                "collected %d %s/%s demos in %.1fs",
                len(new),
                task,
                variation,
                time.perf_counter() - t0,
            )
            eps += new
            ok = [e for e in eps if e.success]
            if len(ok) < n:
                raise RuntimeError(
                    f"scripted expert produced only {len(ok)} successful "
                    f"{task}/{variation} demos, {n} needed"
                )
        self._mem[key] = ok
        return ok[:n]

    def robot_data(self, setting: Setting) -> dict[str, list[Episode]]:
        """Each robot's demos: disjoint slices of the (task, variation) pools, mirrored as
        needed."""
        need: dict[tuple[str, str], int] = {}
        for mix in setting.robots:
            for fam_name, count in mix:
                f = setting.family(fam_name)
                need[(f.task, f.variation)] = need.get((f.task, f.variation), 0) + count
        pools = {k: self.pool(k[0], k[1], n, cameras=setting.cameras) for k, n in need.items()}
        used = {k: 0 for k in need}
        out: dict[str, list[Episode]] = {}
        for rid, mix in zip(setting.robot_ids, setting.robots):
            eps: list[Episode] = []
            for fam_name, count in mix:
                f = setting.family(fam_name)
                k = (f.task, f.variation)
                chunk = pools[k][used[k] : used[k] + count]
                used[k] += count
                eps += [family_episode(e, f) for e in chunk]
            out[rid] = eps
        return out
