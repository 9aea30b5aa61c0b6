"""Scripted-expert demonstrations: the command line over :mod:`fed_ros.sim.collect`.

python -m fed_ros.commands.collect --task lift --n 10 --out demos/
"""

from __future__ import annotations

import argparse
import sys

from fed_ros.sim.collect import collect_to_directory
from fed_ros.sim.envs import TASKS


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m fed_ros.commands.collect --task lift --n 10 --out demos/``."""
    parser = argparse.ArgumentParser(description="collect scripted-expert demonstrations (no ROS)")
    parser.add_argument("--task", choices=TASKS, required=True)
    parser.add_argument("--variation", default="default", help="preset name or random:<seed>")
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--noise-std", type=float, default=0.0)
    parser.add_argument("--image-size", type=int, default=84)
    parser.add_argument("--no-cameras", action="store_true")
    parser.add_argument("--robot-id", default="")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    return collect_to_directory(
        args.task,
        args.out,
        args.variation,
        args.n,
        args.seed,
        cameras=not args.no_cameras,
        noise_std=args.noise_std,
        image_size=args.image_size,
        robot_id=args.robot_id,
    )


if __name__ == "__main__":
    sys.exit(main())
