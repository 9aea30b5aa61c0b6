"""Stopping a whole fleet ends with a zero command on the real arm (issue 24, item 1):
`fed-ros up` stops the robot node first and the adapter last; under `ros2 launch` every node
gets SIGINT at once and the adapter holds the arm until the robot node is gone.

One robot (sim: false, ur5e profile, its watchdog at 30 s so it cannot mask a missing zero)
drives the recording ur5e stand-in of test_arm_stop_paths with its scripted expert.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest
import yaml

from conftest import wait_until
from fed_ros.core.arm.profile import load_profile
from support.stop_path_rig import RecordingArm
from support.arm_adapter_rig import Spun

rclpy = pytest.importorskip("rclpy")


def write_fleet(tmp_path) -> str:
    fleet = {
        "name": "stop",
        "algorithm": "fedavg",
        "rounds": 1,
        "run_dir": str(tmp_path / "run"),
        "robot_defaults": {
            "collect_demos_on_start": 3,
            "max_episode_steps": 2000,
            "register_timeout_s": 600.0,
            "torch_threads": 1,
        },
        "robots": [
            {
                "id": "robot_0",
                "task": "lift",
                "sim": False,
                "profile": "ur5e",
                "arm": {"watchdog_timeout_s": 30.0},
            }
        ],
    }
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"fleet": fleet}))
    return str(path)


def _stop_order(log_dir) -> tuple[float, float]:
    """(when the robot node sent its HOLD at shutdown, when the adapter began its shutdown stop)."""

    def stamp(path, text: str) -> float:
        lines = [line for line in path.read_text().splitlines() if text in line]
        assert lines, f"{path.name} has no line with {text!r}"
        return float(re.search(r"\[(\d+\.\d+)\]", lines[0]).group(1))

    return (
        stamp(log_dir / "robot_0__robot.log", "shutting down: HOLD sent to the arm"),
        stamp(log_dir / "robot_0__arm_adapter.log", "arm stopped: shutdown;"),
    )


def test_fed_ros_up_ctrl_c_stops_the_robot_first_and_ends_with_a_zero_command(
    tmp_path, ros_env, processes, ros_domain_id
):
    fed_ros_cli = str(Path(sys.executable).parent / "fed-ros")
    up = processes.start(
        [
            fed_ros_cli,
            "up",
            write_fleet(tmp_path),
            "--no-server",
            "--domain-id",
            str(ros_domain_id),
        ],
        ros_env,
        log_path=tmp_path / "up.log",
    )
    spun = Spun("recording_arm")
    try:
        arm = RecordingArm(spun.node, load_profile("ur5e"))
        wait_until(
            arm.moving,
            120.0,
            "the robot node's expert moving the arm",
            diagnostics=lambda: (tmp_path / "up.log").read_text()[-2000:],
        )
        mark = arm.count()
        os.killpg(up.pid, signal.SIGINT)  # Ctrl-C in the terminal: the whole foreground group
        assert up.wait(timeout=60) == 0, (tmp_path / "up.log").read_text()[-3000:]
        arm.assert_stopped(mark, gripper_at=None, stopped_by=arm.count())
        robot_last, adapter_stop = _stop_order(tmp_path / "run" / "logs")
        assert robot_last < adapter_stop, (
            "the adapter began its stop before the robot node had stopped"
        )
    finally:
        spun.close()


def test_ros2_launch_sigint_ends_with_a_zero_command(tmp_path, ros_env, processes):
    from support.ros2_launch import ROS2, _launch_available, launch_env

    if _launch_available():
        pytest.skip(_launch_available())
    launch = processes.start(
        [
            str(ROS2),
            "launch",
            "fed_ros",
            "robot.launch.py",
            f"fleet:={write_fleet(tmp_path)}",
            "robot_id:=robot_0",
        ],
        launch_env(ros_env),
        log_path=tmp_path / "launch.log",
        cwd=tmp_path,
    )
    spun = Spun("recording_arm")
    try:
        arm = RecordingArm(spun.node, load_profile("ur5e"))
        wait_until(
            arm.moving,
            120.0,
            "the robot node's expert moving the arm",
            diagnostics=lambda: (tmp_path / "launch.log").read_text()[-2000:],
        )
        mark = arm.count()
        os.kill(launch.pid, signal.SIGINT)  # launch forwards SIGINT to every node at once
        assert launch.wait(timeout=60) == 0, (tmp_path / "launch.log").read_text()[-3000:]
        arm.assert_stopped(mark, gripper_at=None, stopped_by=arm.count())
        text = (tmp_path / "launch.log").read_text()
        assert "arm stopped: shutdown: last command to the arm" in text
    finally:
        spun.close()
