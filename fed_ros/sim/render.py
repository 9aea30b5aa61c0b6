r"""Contact sheets of scenes: one tile per variation (agent view over wrist view).

    python -m fed_ros.commands.render --task stack --variations default,dim_light,random:3 \
        --out sheet.png

shows at a glance how different the robots of a fleet see their worlds.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fed_ros.core.data.episode import AGENTVIEW_IMAGE, WRIST_IMAGE
from fed_ros.sim.envs import VARIATIONS, Variation, make_env

__all__ = ["variation_sheet", "write_variation_sheet"]


def variation_sheet(
    task: str,
    variations: Sequence[str | Variation],
    seed: int = 0,
    image_size: int = 96,
    columns: int = 8,
) -> np.ndarray:
    """Upright uint8 image: per variation, the agent view above the wrist view after reset(seed)."""
    if not variations:
        raise ValueError("variations must not be empty")
    if columns <= 0:
        raise ValueError(f"columns must be positive, got {columns}")
    tiles = []
    with make_env(task, variations[0], cameras=True, image_size=image_size, seed=seed) as env:
        for variation in variations:
            env.set_variation(variation)
            obs = env.reset(seed=seed)
            tiles.append(np.concatenate([obs[AGENTVIEW_IMAGE], obs[WRIST_IMAGE]], axis=0))
    blank = np.zeros_like(tiles[0])
    tiles += [blank] * (-len(tiles) % columns)
    rows = [np.concatenate(tiles[i : i + columns], axis=1) for i in range(0, len(tiles), columns)]
    return np.concatenate(rows, axis=0)


def write_variation_sheet(
    out: str | Path,
    task: str = "lift",
    variations: Sequence[str | Variation] | None = None,
    seed: int = 0,
    image_size: int = 96,
    columns: int = 8,
) -> int:
    """Write a PNG contact sheet of ``variations`` (default: every preset) for one task."""
    names = list(VARIATIONS) if variations is None else variations
    sheet = variation_sheet(task, names, seed, image_size, columns)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Path(out).parent.mkdir(parents=True, exist_ok=True)
    plt.imsave(out, sheet)
    print(f"wrote {out} ({len(names)} variations, {sheet.shape[1]}x{sheet.shape[0]})")
    return 0
