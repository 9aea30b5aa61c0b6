"""Contact sheet of scene variations: the command line over :mod:`fed_ros.sim.render`.

    python -m fed_ros.commands.render --task stack --variations default,dim_light,random:3 \\
        --out sheet.png
"""

from __future__ import annotations

import argparse
import sys

from fed_ros.sim.envs import TASKS, VARIATIONS
from fed_ros.sim.render import write_variation_sheet


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
    names: list[str] = [v.strip() for v in args.variations.split(",") if v.strip()]
    return write_variation_sheet(
        args.out, args.task, names, args.seed, args.image_size, args.columns
    )


if __name__ == "__main__":
    sys.exit(main())
