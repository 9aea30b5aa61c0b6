"""The few-demonstrations fleet of `fed-ros bench federation --only few` (issue 23, item 3): the
question a lab asks, "with few demonstrations per arm, does joining the fleet help my arm?".

K = 3 x ``few_robots_per_family`` robots (default 9) with ``few_demos_per_robot`` demos each
(default 4) in three families: Lift, mirrored-mount Lift (the same observations need opposite
x/y commands: averaging with it hurts) and Lift in a work cell offset from the shared frame
(shifted inputs, the same task mapping: sharing with it helps). Methods Local, FedAvg, FedDRMan
and Centralized (the ceiling), >= 20 rollouts per (model, family) and evaluation. The claims
checked are the issue's targets: FedDRMan >= Local + 15 pp and >= FedAvg + 20 pp.
"""

from __future__ import annotations

import argparse
from typing import Any

from fed_ros.bench import federation_report as R
from fed_ros.bench.federation_settings import Family, Profile, Setting

SETTING = "few_demos"
# Work cell of the third family, relative to the shared frame (m): normal arms whose inputs are
# shifted (another viewpoint of the same task), beside the conflicting mirrored arms.
FEW_CELL_OFFSET = (0.0, 0.06, 0.0)


def few_demos_setting(profile: Profile) -> Setting:
    """The fleet: ``few_robots_per_family`` robots of each family, ``few_demos_per_robot`` demos
    each. C = 2 for CUA/IFCA: two action mappings."""
    fams = (
        Family("lift", "lift", "default", False),
        Family("lift_mirrored", "lift", "default", True),
        Family("lift_cell", "lift", "default", False, FEW_CELL_OFFSET),
    )
    per, demos = profile.few_robots_per_family, profile.few_demos_per_robot
    if per < 1 or demos < 1:
        raise ValueError(
            f"few-demos setting needs >= 1 robot per family and >= 1 demo, got {per}, {demos}"
        )
    robots = tuple(((f.name, demos),) for f in fams for _ in range(per))
    return Setting(
        SETTING,
        fams,
        robots,
        num_clusters=2,
        description=f"{len(robots)} robots with {demos} demos each: Lift, mirrored-mount Lift "
        f"and Lift in a work cell offset by {FEW_CELL_OFFSET} m",
    )


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The few-demos fleet's size options of `fed-ros bench federation`."""
    ap.add_argument(
        "--few-robots-per-family", type=int, help="few: robots per family (default 3: K = 9)"
    )
    ap.add_argument(
        "--few-demos",
        type=int,
        help="few: demonstrations per robot (default 4; --eval-episodes sets its rollouts too)",
    )


def few_claims(g: dict[tuple[str, str], list[dict[str, Any]]]) -> list[str]:
    """The issue's targets on the few-demos fleet, from the cells' final success."""

    def mean(m: str) -> float | None:
        return R.success_stats(g.get((SETTING, m), []))["mean"]

    local, fedavg, feddrman, central = (
        mean(m) for m in ("local", "fedavg", "feddrman", "centralized")
    )
    lines = []
    if feddrman is None:
        return lines
    for name, other, target in (("Local", local, 0.15), ("FedAvg", fedavg, 0.20)):
        if other is not None:
            ok = feddrman >= other + target
            lines.append(
                f"- Few demos per arm: FedDRMan {100 * feddrman:.1f}% vs {name} "
                f"{100 * other:.1f}% ({100 * (feddrman - other):+.1f} pp; target >= "
                f"+{100 * target:.0f} pp): {'REACHED' if ok else 'NOT reached'}"
            )
    if central is not None:
        lines.append(f"- Few demos per arm: Centralized (the ceiling) {100 * central:.1f}%")
    return lines
