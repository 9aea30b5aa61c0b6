"""Image cells of `fed-ros bench federation` (``--only image``): the cross-family fleet learned
from the two 84x84 cameras instead of the simulator's object state.

The same in-process rounds as the low-dim cells (`federation.run.run_cell`: the fleet's
strategies, the robots' `RobotClient`, seeded MuJoCo rollouts), with the image policy
(`PolicyConfig(kind="image")`, the `lite` trunk) and camera demonstrations (scripted expert,
rendered, cached under ``<out>/demos/*__cam84``). Setting ``cross_family_image`` is
``cross_family`` (normal + mirrored-mount Lift arms, C = 2) with cameras on, so its table
sits beside the low-dim one in the report. Sizes (`IMAGE_PROFILE`) fit about half an hour
on 2 cores; the CLI's size overrides (``--robots``, ``--rounds``, ...) apply to them too.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from fed_ros.bench.federation.few import FEW_IMAGE_SUFFIX, few_demos_setting
from fed_ros.bench.federation.run import CellSpec
from fed_ros.bench.federation.methods import METHODS
from fed_ros.bench.federation.settings import (
    Profile,
    Setting,
    cross_family,
    with_overrides,
)
from fed_ros.learning.configuration_fleet_encoder import FleetEncoderConfig

IMAGE_SETTING = "cross_family_image"
IMAGE_METHODS = ("feddrman", "fedavg", "local")

# Sizes: 4 robots (2 normal, 2 mirrored) x 10 camera demos, 4 rounds x 100 steps, 4 rollouts
# per (model, family) after rounds 2 and 3. Measured: 26 min 45 s wall at load 4-12 on 2 cores
# (~900 CPU s; docs/benchmark.md). The image policy is the bench's small transformer and
# head with the `lite` camera trunk (the CPU profile, fed_ros/learning) at the cameras' 84 px.
IMAGE_PROFILE = Profile(
    name="image",
    robots=4,
    demos_per_robot=10,
    rounds=4,
    local_steps=100,
    lr=3e-3,
    eval_episodes=4,
    eval_every=3,
    eval_horizon_factor=2.0,
    seeds=(0,),
    methods_cross=IMAGE_METHODS,
    methods_same=(),
    policy={"kind": "image", "image_size": 84, "image_profile": "lite"},
)


def image_profile(args: argparse.Namespace | None = None) -> Profile:
    """`IMAGE_PROFILE` with the command line's size overrides (``--robots``, ``--demos``, ...)."""
    prof = IMAGE_PROFILE
    if args is not None:
        prof = with_overrides(
            prof,
            robots=args.robots,
            rounds=args.rounds,
            local_steps=args.local_steps,
            demos_per_robot=args.demos,
            eval_episodes=args.eval_episodes,
            seeds=tuple(args.seeds) if args.seeds else None,
            methods_cross=tuple(args.methods) if args.methods else None,
        )
        backbone = getattr(args, "vision_backbone", None)
        if backbone is not None:
            # A pretrained or the fleet's encoder instead of the scratch trunk (cells keyed apart).
            prof = replace(prof, policy={**prof.policy, "vision_backbone": backbone})
        sizes = {
            "rounds": getattr(args, "encoder_rounds", None),
            "local_steps": getattr(args, "encoder_steps", None),
            "objective": getattr(args, "encoder_objective", None),
        }
        sizes = {k: v for k, v in sizes.items() if v is not None}
        if sizes:
            prof = replace(prof, fleet_encoder={**(prof.fleet_encoder or {}), **sizes})
    if prof.fleet_encoder is not None:
        FleetEncoderConfig(**prof.fleet_encoder)  # ValueError naming a bad size, before any cell
    return prof


def through_cameras(base: Setting, name: str) -> Setting:
    """``base``'s fleet, renamed ``name``, learned from the two 84x84 cameras."""
    return replace(
        base,
        name=name,
        cameras=True,
        description=base.description + "; learned from the two 84x84 cameras",
    )


def image_setting(prof: Profile) -> Setting:
    """The cross-family fleet (normal + mirrored-mount Lift arms) seen through the cameras."""
    return through_cameras(cross_family(prof), IMAGE_SETTING)


def image_cell_specs(prof: Profile) -> list[CellSpec]:
    """Every image cell, seed by seed (methods: ``prof.methods_cross``)."""
    setting = image_setting(prof)
    return [
        CellSpec(setting, METHODS[m], seed, prof) for seed in prof.seeds for m in prof.methods_cross
    ]


def few_image_profile(image_prof: Profile, prof: Profile) -> Profile:
    """The few-demos fleet's sizes (``prof``'s few fields: robots per family, demos, third
    family, rollouts, methods) on the image profile's policy, rounds and steps; evaluated every
    2 rounds, so the curve has a point mid-way and at the end (rendered rollouts dominate)."""
    return replace(
        image_prof,
        few_robots_per_family=prof.few_robots_per_family,
        few_demos_per_robot=prof.few_demos_per_robot,
        few_third_family=prof.few_third_family,
        few_eval_episodes=prof.few_eval_episodes,
        methods_few=prof.methods_few,
        eval_episodes=prof.few_eval_episodes,
        eval_every=min(2, image_prof.rounds),
    )


def few_image_setting(few: Profile) -> Setting:
    """The few-demos fleet (`few`) seen through the two cameras: its own setting
    (``few_demos_image`` / ``few_demos_can_image``), table and claims. The image policy sees
    the cameras, joints and gripper only, none of which a work-cell offset moves: from cameras
    the offset-cell family is Lift as the normal arms see it (the fleet holds two action
    mappings, Lift 6 robots and mirrored Lift 3); the can variant keeps three tasks."""
    base = few_demos_setting(few)
    return through_cameras(base, base.name + FEW_IMAGE_SUFFIX)


def few_image_cell_specs(image_prof: Profile, prof: Profile) -> list[CellSpec]:
    """Every cell of ``--only few_image``, seed by seed (methods: ``prof.methods_few``)."""
    few = few_image_profile(image_prof, prof)
    setting = few_image_setting(few)
    return [CellSpec(setting, METHODS[m], seed, few) for seed in few.seeds for m in few.methods_few]


def image_claims(g: dict[tuple[str, str], list[dict[str, Any]]]) -> list[str]:
    """One claims line: cross-family success from cameras per method (what was measured)."""
    from fed_ros.bench.federation import report as R

    got = {m: R.success_stats(g.get((IMAGE_SETTING, m), []))["mean"] for m in IMAGE_METHODS}
    if all(v is None for v in got.values()):
        return []
    parts = ", ".join(f"{m} {'n/a' if v is None else f'{100 * v:.1f}%'}" for m, v in got.items())
    return [f"- Cross-family from cameras (image policy): {parts}"]


def image_section(
    out: Path, g: dict[tuple[str, str], list[dict[str, Any]]], prof: Profile | None
) -> list[str]:
    """Report section: the image cells' table and success-vs-round plot (empty if none ran)."""
    from fed_ros.bench.federation import report as R

    if prof is None or not any(s == IMAGE_SETTING for s, _ in g):
        return []
    cells = [
        c
        for cs in g.values()
        for c in cs
        if c.get("setting") == IMAGE_SETTING and not c.get("error")
    ]
    wall = sum(c.get("wall_s", 0.0) for c in cells)
    md = [
        "",
        f"## {IMAGE_SETTING}: success rate (%) per family from cameras, mean ± std over seeds",
        "",
        f"Image policy ({prof.policy.get('image_profile', 'lite')} trunk, two "
        f"{prof.policy.get('image_size', 84)} px cameras), K={prof.robots} robots, "
        f"{prof.rounds} rounds x {prof.local_steps} local steps, {prof.demos_per_robot} camera "
        f"demos/robot, {prof.eval_episodes} rollouts per (model, family), seeds "
        f"{list(prof.seeds)}; cells' wall time {wall:.0f} s.",
        "",
        R.method_table(IMAGE_SETTING, g, prof.methods_cross),
    ]
    png = R.plot_success_vs_round(
        out / f"{IMAGE_SETTING}_success_vs_round.png", IMAGE_SETTING, g, prof.methods_cross
    )
    return md + ["", f"![success vs round]({png.name})"]
