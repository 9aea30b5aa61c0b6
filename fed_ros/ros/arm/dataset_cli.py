"""`fed-ros dataset export|import`: a robot's demonstrations <-> a LeRobotDataset folder.

    fed-ros dataset export runs/fleet/robot_0/demos --format lerobot out/lerobot_robot_0 \
        --robot-profile panda_sim
    fed-ros dataset import out/lerobot_robot_0 --robot-profile panda_sim \
        --demo-dir runs/fleet/robot_1/demos

``--cameras mp4`` writes the cameras as lossless video files instead of PNG in the parquet;
import reads either, and any codec PyAV decodes (lerobot's AV1 included).

Export reads what the robot trains on: its ROS recordings (rosbag2/MCAP) and episode files
under the demonstration folder, successful ones only. Import writes episode files into a
robot's demonstration folder, where the robot node finds them on its next round (a robot can
start from an imported dataset). Camera and joint names go through the arm profile.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fed-ros dataset", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    exp = sub.add_parser("export", help="a demonstration folder -> a LeRobotDataset folder")
    exp.add_argument("demo_dir", type=Path)
    exp.add_argument("out", type=Path, help="new (or empty) output folder")
    exp.add_argument("--format", choices=("lerobot",), default="lerobot")
    exp.add_argument("--robot-profile", required=True, help="arm profile name or YAML path")
    exp.add_argument(
        "--fps",
        type=float,
        default=None,
        help="a whole number; default: the profile's control rate",
    )
    exp.add_argument(
        "--cameras",
        choices=("png", "mp4"),
        default="png",
        help="png: PNG in the parquet; mp4: lossless H.264 video files (both keep every pixel)",
    )
    imp = sub.add_parser("import", help="a LeRobotDataset folder -> a robot's demonstrations")
    imp.add_argument("dataset", type=Path)
    imp.add_argument("--robot-profile", required=True, help="arm profile name or YAML path")
    imp.add_argument("--demo-dir", type=Path, required=True, help="the robot's demos/ folder")
    imp.add_argument("--prefix", default=None, help="file name prefix (default: lerobot_<name>)")
    args = parser.parse_args(argv)

    from fed_ros.core.arm.profile import ProfileError, load_profile
    from fed_ros.core.data.lerobot import DatasetError, export_lerobot
    from fed_ros.core.data.lerobot_import import read_lerobot, write_episodes
    from fed_ros.core.extras import MissingExtra

    t0 = time.perf_counter()
    try:
        profile = load_profile(args.robot_profile)
        if args.action == "export":
            from fed_ros.ros.arm.driving import local_episodes

            if not args.demo_dir.is_dir():
                raise DatasetError(f"{args.demo_dir}: not a folder")
            # An export reads the robot's folder, never rearranges it: bad files are skipped.
            episodes = local_episodes(args.demo_dir, set_bad_aside=False)
            info = export_lerobot(episodes, profile, args.out, fps=args.fps, cameras=args.cameras)
            print(
                f"fed-ros dataset: exported {info['total_episodes']} episodes "
                f"({info['total_frames']} frames, {info['total_tasks']} tasks, "
                f"{sum(1 for f in info['features'] if f.startswith('observation.images.'))} "
                f"cameras) to {args.out} in {time.perf_counter() - t0:.1f} s"
            )
        else:
            episodes = read_lerobot(args.dataset, profile)
            prefix = args.prefix or f"lerobot_{args.dataset.resolve().name}"
            paths = write_episodes(episodes, args.demo_dir, prefix)
            print(
                f"fed-ros dataset: imported {len(paths)} episodes "
                f"({sum(len(e) for e in episodes)} frames) into {args.demo_dir} "
                f"in {time.perf_counter() - t0:.1f} s"
            )
    except (DatasetError, ProfileError, MissingExtra) as err:
        print(f"fed-ros dataset: {err}", file=sys.stderr)
        return 2
    return 0
