"""`fed-ros bench sim`: raw environment steps/s vs bridge steps/s, and demonstrations per hour.

* ``raw``: ``ArmEnv.step`` in-process, driven by the scripted expert (so the arm moves and
  makes contact like in real use), with agent-view + wrist cameras at ``--image-size`` and
  without cameras; only ``step`` calls are timed.
* ``bridge``: the same task and render settings through the ROS 2 bridge node
  (:func:`bridge_steps_per_second`, owned by the sim-bridge work); the ratio bridge/raw is
  printed next to it (target >= 0.9).
* ``demos/h``: complete scripted demonstrations (with cameras) per hour of wall time,
  including resets and episode assembly, as ``collect_demos`` produces them.

Numbers depend on the machine and its load: run on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

TASK_CHOICES = ("lift", "pick_place_can", "stack")


def raw_steps_per_second(
    task: str,
    variation: str = "default",
    cameras: bool = True,
    image_size: int = 84,
    steps: int = 200,
    seed: int = 0,
) -> float:
    """In-process ``ArmEnv.step`` rate with the scripted expert acting (resets not timed)."""
    from fed_ros.sim.envs import make_env
    from fed_ros.sim.experts import make_expert

    if steps <= 0:
        raise ValueError(f"steps must be positive, got {steps}")
    expert = make_expert(task, seed=seed)
    with make_env(task, variation, cameras=cameras, image_size=image_size, seed=seed) as env:
        obs = env.reset(seed=seed)
        expert.reset()
        for _ in range(5):  # warm-up: first steps pay for lazy initialisation
            obs, _, _ = env.step(expert.act(obs))
        elapsed, done_steps, episode = 0.0, 0, 0
        obs = env.reset(seed=seed)
        expert.reset()
        while done_steps < steps:
            action = expert.act(obs)
            started = time.perf_counter()
            obs, done, _ = env.step(action)
            elapsed += time.perf_counter() - started
            done_steps += 1
            if done:
                episode += 1
                obs = env.reset(seed=seed + episode)
                expert.reset()
    return done_steps / elapsed


# --- hook owned by the sim-bridge work (fed_ros/ros): fill in, keep the signature -------------
def bridge_steps_per_second(
    task: str,
    variation: str = "default",
    cameras: bool = True,
    image_size: int = 84,
    steps: int = 200,
    seed: int = 0,
) -> float | None:
    """Control steps/s through the ROS 2 bridge at the same settings (a bridge process over DDS).

    The bridge free-runs (control rate far above what the machine sustains) while the
    scripted expert drives it over ROS, images published; the rate comes from the stamps
    of the bridge's own episode statuses, resets excluded (as ``raw_steps_per_second``).
    """
    from fed_ros.ros.bench.bridge_benchmark import measure_bridge_steps_per_second

    return measure_bridge_steps_per_second(
        task,
        cameras=cameras,
        image_size=image_size,
        steps=steps,
        seed=seed,
        variation=variation,
        expert=True,
    )


# --- end of hook -----------------------------------------------------------------------------


def demos_per_hour(
    task: str,
    variation: str = "default",
    demos: int = 3,
    image_size: int = 84,
    cameras: bool = True,
    seed: int = 0,
) -> tuple[float, float]:
    """(demonstrations per hour, success fraction) for ``collect_demos`` with cameras."""
    from fed_ros.sim.collect import collect_demos
    from fed_ros.sim.envs import make_env

    if demos <= 0:
        raise ValueError(f"demos must be positive, got {demos}")
    # Build the env outside the timed region: a robot builds it once, then records for hours.
    with make_env(task, variation, cameras=cameras, image_size=image_size, seed=seed) as env:
        started = time.perf_counter()
        episodes = collect_demos(
            task, variation, n=demos, seed=seed, cameras=cameras, image_size=image_size, env=env
        )
        elapsed = time.perf_counter() - started
    return 3600.0 * demos / elapsed, sum(ep.success for ep in episodes) / demos


def run(
    tasks: list[str], steps: int, demos: int, image_size: int, variation: str, bridge: bool
) -> list[dict[str, Any]]:
    """Measure every task; returns one row per task."""
    rows = []
    for task in tasks:
        row: dict[str, Any] = {"task": task, "image_size": image_size, "variation": variation}
        row["raw_steps_s_cameras"] = raw_steps_per_second(task, variation, True, image_size, steps)
        row["raw_steps_s_no_cameras"] = raw_steps_per_second(
            task, variation, False, image_size, steps
        )
        row["bridge_steps_s_cameras"] = (
            bridge_steps_per_second(task, variation, True, image_size, steps) if bridge else None
        )
        b = row["bridge_steps_s_cameras"]
        row["bridge_over_raw"] = (b / row["raw_steps_s_cameras"]) if b else None
        if demos > 0:
            row["demos_per_hour"], row["demo_success"] = demos_per_hour(
                task, variation, demos, image_size
            )
        rows.append(row)
        print(_format_row(row), flush=True)
    return rows


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "n/a" if value is None else format(value, spec)


def _header() -> str:
    return (
        f"{'task':<16}{'raw cams':>10}{'raw no-cam':>12}{'bridge cams':>13}{'bridge/raw':>12}"
        f"{'demos/h':>10}{'demo ok':>9}"
    )


def _format_row(row: dict[str, Any]) -> str:
    return (
        f"{row['task']:<16}{_fmt(row['raw_steps_s_cameras']):>10}"
        f"{_fmt(row['raw_steps_s_no_cameras']):>12}"
        f"{_fmt(row['bridge_steps_s_cameras']):>13}{_fmt(row['bridge_over_raw'], '.2f'):>12}"
        f"{_fmt(row.get('demos_per_hour'), '.0f'):>10}{_fmt(row.get('demo_success'), '.0%'):>9}"
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of `fed-ros bench sim`; prints a table (steps/s), returns 0."""
    parser = argparse.ArgumentParser(prog="fed-ros bench sim", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--tasks", default=",".join(TASK_CHOICES), help=f"comma list of {TASK_CHOICES}"
    )
    parser.add_argument(
        "--steps", type=int, default=200, help="timed control steps per measurement"
    )
    parser.add_argument(
        "--demos", type=int, default=3, help="demonstrations per task for demos/h (0 skips)"
    )
    parser.add_argument("--image-size", type=int, default=84)
    parser.add_argument("--variation", default="default")
    parser.add_argument("--no-bridge", action="store_true", help="skip the ROS bridge measurement")
    parser.add_argument("--json", default="", help="write the rows to this file")
    args = parser.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TASK_CHOICES]
    if unknown or not tasks:
        parser.error(f"unknown tasks {unknown}; choose from {TASK_CHOICES}")
    if args.steps <= 0 or args.demos < 0:
        parser.error(f"--steps must be > 0 and --demos >= 0 (got {args.steps}, {args.demos})")
    print(
        f"fed-ros bench sim: {args.image_size}x{args.image_size} agentview + wrist, "
        f"variation {args.variation!r}, {args.steps} steps, {args.demos} demos per task (steps/s)"
    )
    print(_header())
    rows = run(
        tasks, args.steps, args.demos, args.image_size, args.variation, bridge=not args.no_bridge
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
