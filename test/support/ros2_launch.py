"""The real ros2 launch (installed by ../shared/tools/ros2-launch) and the environment it runs
in."""

from __future__ import annotations

import sys
from pathlib import Path


VENV = Path(sys.prefix)


ROS2 = VENV / "bin" / "ros2"


def _launch_available() -> str:
    """'' when the real launch system is installed, else why not."""
    try:
        import launch_ros  # noqa: F401
        import ros2launch  # noqa: F401
    except ImportError:
        return (
            "the real ROS 2 launch system is not installed (make test installs it from "
            "../shared/tools/ros2-launch when that folder exists; a full ROS 2 install has it)"
        )
    if not ROS2.is_file():
        return f"no `ros2` command in {VENV / 'bin'}"
    if not (VENV / "lib" / "fed_ros" / "robot_node").is_file():
        return "fed_ros is not installed into the venv prefix (run make setup)"
    return ""


def launch_env(ros_env: dict[str, str]) -> dict[str, str]:
    """What a user has: the venv as the ament prefix; no source tree on PYTHONPATH."""
    env = {k: v for k, v in ros_env.items() if k != "PYTHONPATH"}
    env["AMENT_PREFIX_PATH"] = str(VENV)
    env["PYTHONUNBUFFERED"] = "1"
    return env
