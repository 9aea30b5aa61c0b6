"""fed_ros's side of `make interop` (runs in .venv; tools/lerobot_interop.py runs lerobot's side).

    record OUT                  3 scripted-expert Lift demonstrations (MuJoCo, both cameras, 84 px)
    check-import SOURCE DEMOS   the episodes `fed-ros dataset import` wrote into DEMOS against the
                                SOURCE demonstrations (states, actions, task strings, pixels),
                                then one training step of the image policy on them

check-import prints one JSON line (what it measured) and exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")  # before anything imports mujoco

import numpy as np  # noqa: E402

from fed_ros.core.data import episode as ep  # noqa: E402
from fed_ros.core.data.episode import Episode  # noqa: E402


def record(out: Path) -> int:
    """Collect the source recording: 3 successful Lift demonstrations with both cameras."""
    from fed_ros.sim.collect import collect_demos, save_episodes

    episodes = collect_demos("lift", "default", 3, 0, cameras=True, image_size=84)
    if not all(e.success for e in episodes):
        print(f"record: {sum(e.success for e in episodes)} of 3 demonstrations succeeded")
        return 1
    save_episodes(episodes, out)
    print(f"record: 3 episodes, {sum(len(e) for e in episodes)} frames in {out}")
    return 0


def check_import(source: Path, demos: Path, max_mean_abs: float, max_abs: int) -> int:
    """Imported episodes equal the source (pixels within the bounds); one training step runs."""
    from fed_ros.ros.arm.driving import local_episodes

    want = [Episode.load(p) for p in sorted(source.glob("*.npz"))]
    got = local_episodes(demos)
    report: dict = {"episodes": len(got), "frames": sum(len(e) for e in got)}
    failures = []
    if len(got) != len(want):
        failures.append(f"{len(got)} episodes imported, {len(want)} recorded")
    pixel_diffs = []
    for i, (a, b) in enumerate(zip(want, got)):
        if (b.task, b.instruction) != (a.instruction, a.instruction):
            failures.append(f"episode {i}: task {b.task!r}, instruction {b.instruction!r}")
        if not np.array_equal(a.actions, b.actions):
            failures.append(f"episode {i}: actions differ")
        for key in ep.LOWDIM_KEYS:
            if not np.array_equal(a.observations[key], b.observations[key]):
                failures.append(f"episode {i}: {key} differs")
        for key in ep.IMAGE_KEYS:
            pixel_diffs.append(np.abs(a.observations[key].astype(int) - b.observations[key]))
    diff = np.concatenate([d.ravel() for d in pixel_diffs])
    report["pixel_max_abs"], report["pixel_mean_abs"] = int(diff.max()), float(diff.mean())
    if diff.max() > max_abs or diff.mean() > max_mean_abs:
        failures.append(f"pixels differ by up to {diff.max()} (mean {diff.mean():.3f})")
    report["tasks"] = sorted({e.task for e in got})
    report.update(train_step(got))
    if not np.isfinite(report["loss_bc"]):
        failures.append(f"training loss {report['loss_bc']}")
    report["failures"] = failures
    print(json.dumps(report))
    return 1 if failures else 0


def train_step(episodes: list[Episode]) -> dict:
    """One optimiser step of the image policy (both cameras, language) on ``episodes``."""
    import torch

    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.configuration_trainer import TrainerConfig
    from fed_ros.learning.trainer import initial_state_dict, train_local

    torch.set_num_threads(1)
    cfg = PolicyConfig(kind="image", image_size=84, window=2, embed_dim=32, transformer_ff=64)
    result = train_local(
        initial_state_dict(cfg, seed=0, episodes=episodes),
        episodes,
        cfg,
        TrainerConfig(max_steps=1, batch_size=8, device="cpu"),
        val_episodes=[],
    )
    return {"train_steps": int(result.metrics["steps"]), "loss_bc": result.metrics["loss_bc"]}


def main(argv: list[str]) -> int:
    """Parse the subcommand and run it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("out", type=Path)
    chk = sub.add_parser("check-import")
    chk.add_argument("source", type=Path)
    chk.add_argument("demos", type=Path)
    chk.add_argument("--max-mean-abs", type=float, default=0.0, help="mean pixel difference")
    chk.add_argument("--max-abs", type=int, default=0, help="largest pixel difference")
    args = parser.parse_args(argv)
    if args.command == "record":
        return record(args.out)
    return check_import(args.source, args.demos, args.max_mean_abs, args.max_abs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
