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
from dataclasses import dataclass
from typing import Any

from fed_ros.bench.federation import report as R
from fed_ros.bench.federation.settings import Family, Profile, Setting

SETTING = "few_demos"
# `--only few_image`: the same fleets learned from the two cameras (`image`), each
# its own setting (few_demos_image, few_demos_can_image) beside the low-dim one.
FEW_IMAGE_SUFFIX = "_image"
# Work cell of the third family, relative to the shared frame (m): normal arms whose inputs are
# shifted (another viewpoint of the same task), beside the conflicting mirrored arms.
FEW_CELL_OFFSET = (0.0, 0.06, 0.0)


@dataclass(frozen=True)
class ThirdFamily:
    """One choice of the few-demos fleet's third family, and what it changes."""

    family: Family
    setting: str  # its own setting name, so cells, tables and claims never mix
    num_clusters: int  # C for CUA/IFCA: the fleet's distinct action mappings
    description: str


# `--few-third-family`: "cell" (the default) or "can" (PickPlaceCan arms: another task, the
# issue's other example). The offset cell shares Lift's action mapping (C = 2); the can arms are
# a task of their own (C = 3: with C = 2 FedDRMan had to merge a family with another, measured
# 33 % cross-family co-clustering and 2.8 % success).
THIRD_FAMILIES = {
    "cell": ThirdFamily(
        Family("lift_cell", "lift", "default", False, FEW_CELL_OFFSET),
        SETTING,
        2,
        f"Lift in a work cell offset by {FEW_CELL_OFFSET} m",
    ),
    "can": ThirdFamily(Family("can", "pick_place_can"), f"{SETTING}_can", 3, "PickPlaceCan"),
}


def few_demos_setting(profile: Profile) -> Setting:
    """The fleet: ``few_robots_per_family`` robots of each family, ``few_demos_per_robot`` demos
    each, the third family by ``few_third_family``. C for CUA/IFCA: 2 (two action mappings)
    with the offset Lift cell, 3 with the can arms."""
    if profile.few_third_family not in THIRD_FAMILIES:
        raise ValueError(
            f"few_third_family must be one of {sorted(THIRD_FAMILIES)}, "
            f"got {profile.few_third_family!r}"
        )
    third = THIRD_FAMILIES[profile.few_third_family]
    fams = (
        Family("lift", "lift", "default", False),
        Family("lift_mirrored", "lift", "default", True),
        third.family,
    )
    per, demos = profile.few_robots_per_family, profile.few_demos_per_robot
    if per < 1 or demos < 1:
        raise ValueError(
            f"few-demos setting needs >= 1 robot per family and >= 1 demo, got {per}, {demos}"
        )
    robots = tuple(((f.name, demos),) for f in fams for _ in range(per))
    return Setting(
        third.setting,
        fams,
        robots,
        num_clusters=third.num_clusters,
        description=f"{len(robots)} robots with {demos} demos each: Lift, mirrored-mount Lift "
        f"and {third.description}",
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
    ap.add_argument(
        "--few-third-family",
        choices=sorted(THIRD_FAMILIES),
        help="few: the third family, Lift in an offset work cell (cell, default) or "
        "PickPlaceCan (can; its own setting, few_demos_can)",
    )


def few_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Profile fields the few-demos options set (None: the profile's value)."""
    return {
        "few_eval_episodes": args.eval_episodes,
        "few_robots_per_family": args.few_robots_per_family,
        "few_demos_per_robot": args.few_demos,
        "few_third_family": args.few_third_family,
    }


def few_report_settings(
    profile: Profile, cameras: bool = False
) -> list[tuple[str, tuple[str, ...]]]:
    """(setting, methods) of the few-demos tables, both third-family variants, low-dim or from
    the cameras; the report skips one not run."""
    return [(name, profile.methods_few) for name in _few_settings(cameras)]


def _few_settings(cameras: bool) -> list[str]:
    suffix = FEW_IMAGE_SUFFIX if cameras else ""
    return [t.setting + suffix for t in THIRD_FAMILIES.values()]


def few_claims(g: dict[tuple[str, str], list[dict[str, Any]]], cameras: bool = False) -> list[str]:
    """The issue's targets on each few-demos fleet that ran (low-dim, or from the cameras), from
    the cells' final success."""
    return [line for name in _few_settings(cameras) for line in _few_claims(g, name)]


def _few_claims(g: dict[tuple[str, str], list[dict[str, Any]]], setting: str) -> list[str]:
    label = "Few demos per arm" + ("" if setting == SETTING else f" ({setting})")

    def mean(m: str) -> float | None:
        return R.success_stats(g.get((setting, m), []))["mean"]

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
                f"- {label}: FedDRMan {100 * feddrman:.1f}% vs {name} "
                f"{100 * other:.1f}% ({100 * (feddrman - other):+.1f} pp; target >= "
                f"+{100 * target:.0f} pp): {'REACHED' if ok else 'NOT reached'}"
            )
    if central is not None:
        lines.append(f"- {label}: Centralized (the ceiling) {100 * central:.1f}%")
    return lines
