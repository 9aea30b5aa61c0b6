r"""Contact sheets of scenes: one tile per variation (agent view over wrist view).

    python -m fed_ros.sim.render --task stack --variations default,dim_light,random:3 \
        --out sheet.png

shows at a glance how different the robots of a fleet see their worlds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from fed_ros.core.data.episode import AGENTVIEW_IMAGE, WRIST_IMAGE
from fed_ros.sim.envs import TASKS, VARIATIONS, Variation, make_env

__all__ = ["variation_sheet", "main"]


def variation_sheet(
    task: str,
    variations: list["str | Variation"],
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


def main(argv: list[str] | None = None) -> int:
    """CLI: write a PNG contact sheet of variations for one task."""
    parser = argparse.ArgumentParser(description="render a contact sheet of scene variations")
    parser.add_argument("--task", choices=TASKS, default="lift")
    parser.add_argument(
        "--variations",
        default=",".join(VARIATIONS),
        help="comma list of preset names or random:<seed>",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--image-size", type=int, default=96)
    parser.add_argument("--columns", type=int, default=8)
    parser.add_argument("--out", required=True, help="PNG path")
    args = parser.parse_args(argv)
    names = [v.strip() for v in args.variations.split(",") if v.strip()]
    sheet = variation_sheet(args.task, names, args.seed, args.image_size, args.columns)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    plt.imsave(args.out, sheet)
    print(f"wrote {args.out} ({len(names)} variations, {sheet.shape[1]}x{sheet.shape[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
