"""`fed-ros partition`: the command line over :mod:`fed_ros.learning.demo_partition`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fed_ros.learning.demo_partition import GROUPINGS, partition_demos

DESCRIPTION = (
    "`fed-ros partition`: split a recorded demonstration set across robots (non-IID emulation)."
)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fed-ros partition", description=DESCRIPTION)
    ap.add_argument("demos", help="directory of Episode .npz files (searched recursively)")
    ap.add_argument("--robots", type=int, default=4, help="number of robots K (default 4)")
    ap.add_argument(
        "--by", choices=GROUPINGS, default="task", help="grouping the Dirichlet acts on"
    )
    ap.add_argument(
        "--alpha",
        type=float,
        default=0.5,
        help="Dirichlet concentration (small: skewed; 'inf' for IID)",
    )
    ap.add_argument("--beta", type=float, default=0.5, help="size concentration for --by quantity")
    ap.add_argument("--k", type=int, default=16, help="k-means clusters for --by embedding")
    ap.add_argument("--checkpoint", help="trained policy (.safetensors) for --by embedding")
    ap.add_argument("--policy-config", help="PolicyConfig JSON (default: stored in the checkpoint)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--include-failed", action="store_true", help="also partition failed demos")
    ap.add_argument("--fractions", action="store_true", help="print fractions instead of counts")
    ap.add_argument("--out", help="directory for robot_<i>.json manifests (default: print only)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `fed-ros partition`; returns the exit code."""
    args = _parser().parse_args(list(argv) if argv is not None else None)
    try:
        return partition_demos(
            args.demos,
            robots=args.robots,
            by=args.by,
            alpha=args.alpha,
            beta=args.beta,
            k=args.k,
            checkpoint=args.checkpoint,
            policy_config=args.policy_config,
            seed=args.seed,
            include_failed=args.include_failed,
            fractions=args.fractions,
            out=args.out,
        )
    except ValueError as exc:
        print(f"fed-ros partition: error: {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
